// Package envelope is a simulated agent's codec for its Sync stream: of
// each SyncResponse it decodes only the envelope (version, full, more,
// history), so that hundreds of simulated agents in one process cost the
// machine their transport and not the decoding every real agent does on
// its own node.
package envelope

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// Codec is gRPC's proto codec, but a SyncResponse is decoded whole only
// with Decode. Size is the size of the last message received: one Codec
// per stream.
type Codec struct {
	Decode bool
	Size   int
}

func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	raw := data.Materialize()
	c.Size = len(raw)
	msg := v.(*weirv1.SyncResponse)
	if c.Decode {
		return proto.Unmarshal(raw, msg)
	}
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return protowire.ParseError(n)
		}
		raw = raw[n:]
		switch {
		case typ == protowire.VarintType && (num == 1 || num == 2 || num == 6):
			x, n := protowire.ConsumeVarint(raw)
			if n < 0 {
				return protowire.ParseError(n)
			}
			switch num {
			case 1:
				msg.Version = x
			case 2:
				msg.Full = x != 0
			case 6:
				msg.More = x != 0
			}
		case typ == protowire.BytesType && num == 7:
			b, n := protowire.ConsumeBytes(raw)
			if n < 0 {
				return protowire.ParseError(n)
			}
			msg.History = string(b)
		}
		n = protowire.ConsumeFieldValue(num, typ, raw)
		if n < 0 {
			return protowire.ParseError(n)
		}
		raw = raw[n:]
	}
	return nil
}

// Name is "proto": the server sees an ordinary client.
func (c *Codec) Name() string { return "proto" }
