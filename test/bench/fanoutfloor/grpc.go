package fanoutfloor

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
)

// MeasureGRPC is Measure over gRPC: one bidirectional stream per agent,
// each on a connection of its own, as the agents' Sync streams. A change is
// encoded once (a grpc.PreparedMsg, as the hub sends it) and sent on every
// stream; each agent answers with 15 bytes. The messages are raw bytes (a
// codec that copies nothing and decodes nothing), so the figure is what
// gRPC's HTTP/2 transport alone adds to the bare sockets' floor.
func MeasureGRPC(ctx context.Context, n, changes, size int, withTLS bool) (Result, error) {
	res := Result{Agents: n, Changes: changes, Size: size, TLS: withTLS, GRPC: true}
	serverCreds, clientCreds := insecure.NewCredentials(), insecure.NewCredentials()
	if withTLS {
		s, c, err := selfSigned()
		if err != nil {
			return res, err
		}
		serverCreds, clientCreds = credentials.NewTLS(s), credentials.NewTLS(c)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	f := &floorService{streams: make(chan *floorStream, n), answered: make(chan struct{}, n)}
	srv := grpc.NewServer(grpc.Creds(serverCreds), grpc.ForceServerCodecV2(rawCodec{}))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "weir.bench.FanOutFloor",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Sync", ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error { return f.serve(ss) }}},
	}, f)
	go srv.Serve(ln)
	defer srv.Stop()
	stop := context.AfterFunc(ctx, srv.Stop) // everything below ends with the server
	defer stop()

	received := make([][]time.Time, n)
	var agents sync.WaitGroup
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(clientCreds),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		if err != nil {
			return res, err
		}
		conns = append(conns, conn)
		stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/weir.bench.FanOutFloor/Sync")
		if err != nil {
			return res, err
		}
		// The stream reaches the server with its first message: an
		// agent's hello.
		hello := []byte("hello")
		if err := stream.SendMsg(&hello); err != nil {
			return res, err
		}
		agents.Add(1)
		go func() {
			defer agents.Done()
			answer := make([]byte, 15)
			for range changes {
				var got []byte
				if err := stream.RecvMsg(&got); err != nil {
					return
				}
				received[i] = append(received[i], time.Now())
				if len(got) != size {
					return
				}
				if err := stream.SendMsg(&answer); err != nil {
					return
				}
			}
		}()
	}
	streams := make([]*floorStream, 0, n)
	for range n {
		select {
		case s := <-f.streams:
			streams = append(streams, s)
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}

	delta := make([]byte, size)
	starts, err := res.run(ctx, n, changes, f.answered, func() error {
		prepared := &grpc.PreparedMsg{}
		if err := prepared.Encode(streams[0].ss, &delta); err != nil {
			return err
		}
		for _, s := range streams {
			s.out <- prepared
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	for _, s := range streams {
		close(s.out)
	}
	agents.Wait()
	res.summarize(starts, received)
	return res, nil
}

// floorService is the server's side: each stream sends what its out
// channel brings, as a session sends its agent's steps, while a second
// goroutine reads the answers, as the hub reads acknowledgements.
type floorService struct {
	streams  chan *floorStream
	answered chan struct{}
}

type floorStream struct {
	ss  grpc.ServerStream
	out chan *grpc.PreparedMsg
}

func (f *floorService) serve(ss grpc.ServerStream) error {
	var hello []byte
	if err := ss.RecvMsg(&hello); err != nil {
		return err
	}
	s := &floorStream{ss: ss, out: make(chan *grpc.PreparedMsg, 1)}
	go func() {
		for {
			var answer []byte
			if err := ss.RecvMsg(&answer); err != nil {
				return
			}
			f.answered <- struct{}{}
		}
	}()
	f.streams <- s
	for m := range s.out {
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
	return nil
}

// rawCodec sends a *[]byte as it is and receives into one, copying once.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("fanoutfloor: cannot send %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("fanoutfloor: cannot receive into %T", v)
	}
	*b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "weir-bench-raw" }
