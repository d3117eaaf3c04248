package agentsync

// Leases: the edge of the L2 leases (the decisions are l2owner's).

import (
	"errors"
	"fmt"
	"net/netip"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/auth"
	"github.com/weirlb/weir/server/l2owner"
)

// maxLeasesPerAsk bounds the leases one ask may list (Weir's).
const maxLeasesPerAsk = 65536

// Leases implements AgentService.Leases.
func (h *Hub) Leases(stream weirv1.AgentService_LeasesServer) error {
	ctx := stream.Context()
	if h.cfg.L2 == nil {
		return status.Error(codes.Unimplemented, "this server answers no L2 leases")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	node := first.GetNodeName()
	if node == "" {
		return status.Error(codes.InvalidArgument, "node_name: the first ask must name the node")
	}
	if err := authorizeNode(ctx, node); err != nil {
		return err
	}
	if err := h.registered("node_name", node); err != nil {
		return err
	}
	s, err := h.cfg.L2.Open(node, auth.SharedAgent(ctx))
	switch {
	case errors.Is(err, l2owner.ErrNotLeading):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, l2owner.ErrNodeHasItsOwn):
		return status.Errorf(codes.PermissionDenied, "node_name: %v", err)
	}
	if err != nil {
		return err
	}
	defer s.Close()
	asks, recvErr := make(chan *weirv1.LeasesRequest, 16), make(chan error, 1)
	go func() {
		for {
			ask, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case asks <- ask:
			case <-ctx.Done():
				return
			}
		}
	}()
	ttl := durationpb.New(h.cfg.L2.TTL())
	answer := func(ask *weirv1.LeasesRequest) error {
		if n := ask.GetNodeName(); n != "" && n != node {
			return status.Errorf(codes.InvalidArgument, "node_name: %q on a stream of %q", n, node)
		}
		held, err := leasesOf("held", ask.GetHeld())
		if err != nil {
			return err
		}
		released, err := leasesOf("released", ask.GetReleased())
		if err != nil {
			return err
		}
		if len(ask.GetRefused()) > maxLeasesPerAsk {
			return status.Errorf(codes.InvalidArgument, "refused: %d addresses; at most %d", len(ask.GetRefused()), maxLeasesPerAsk)
		}
		var refused map[netip.Addr]string
		for i, r := range ask.GetRefused() {
			a, err := netip.ParseAddr(r.GetAddress())
			if err != nil || a.Zone() != "" {
				return status.Errorf(codes.InvalidArgument, "refused[%d].address: %q is not an IP address", i, r.GetAddress())
			}
			if refused == nil {
				refused = map[netip.Addr]string{}
			}
			refused[a] = truncate(r.GetReason())
		}
		out := &weirv1.LeasesResponse{Sequence: ask.GetSequence(), Ttl: ttl}
		if ask.GetStopping() {
			s.Stop(released)
			return stream.Send(out)
		}
		lapsed, err := leasesOf("lapsed", ask.GetLapsed())
		if err != nil {
			return err
		}
		for _, g := range s.Ask(l2owner.Asked{Held: held, Released: released, Lapsed: lapsed, Refused: refused}) {
			out.Leases = append(out.Leases, &weirv1.L2Lease{Address: g.Addr.String(), Epoch: g.Epoch})
		}
		return stream.Send(out)
	}
	if err := answer(first); err != nil {
		return err
	}
	for {
		select {
		case ask := <-asks:
			if err := answer(ask); err != nil {
				return err
			}
		case <-s.Nudged():
			if err := stream.Send(&weirv1.LeasesResponse{Ttl: ttl}); err != nil {
				return err
			}
		case <-s.Done():
			return status.Error(codes.Unavailable, "the server no longer decides the L2 owners")
		case err := <-recvErr:
			// What the agent sent before it closed is answered first: its
			// last ask may give everything up (a stopping agent).
			for {
				select {
				case ask := <-asks:
					if err := answer(ask); err != nil {
						return err
					}
					continue
				default:
				}
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// leasesOf reads the leases of an ask's field.
func leasesOf(field string, in []*weirv1.L2Lease) ([]l2owner.Held, error) {
	if len(in) > maxLeasesPerAsk {
		return nil, status.Errorf(codes.InvalidArgument, "%s: %d leases; at most %d", field, len(in), maxLeasesPerAsk)
	}
	out := make([]l2owner.Held, 0, len(in))
	for i, l := range in {
		a, err := netip.ParseAddr(l.GetAddress())
		if err != nil || a.Zone() != "" {
			return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("%s[%d].address: %q is not an IP address", field, i, l.GetAddress()))
		}
		out = append(out, l2owner.Held{Addr: a, Epoch: l.GetEpoch()})
	}
	return out, nil
}
