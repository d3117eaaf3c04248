package agentsync

// Leases: the edge of the L2 leases (the decisions are l2owner's).

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weirlb/weir/internal/recv"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/auth"
	"github.com/weirlb/weir/server/l2owner"
)

// maxLeasesPerAsk bounds the leases one ask may list (Weir's).
const maxLeasesPerAsk = 65536

// Leases implements AgentService.Leases: the first ask names the node,
// which opens its lease stream; then every ask is answered, and a nudge
// asks the agent to ask again, until either side ends the stream.
func (h *Hub) Leases(stream weirv1.AgentService_LeasesServer) error {
	first, err := h.admitLeases(stream)
	if err != nil {
		return err
	}
	ctx := stream.Context()
	owner, err := h.cfg.L2.Open(first.GetNodeName(), auth.SharedAgent(ctx))
	switch {
	case errors.Is(err, l2owner.ErrNotLeading):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, l2owner.ErrNodeHasItsOwn):
		return status.Errorf(codes.PermissionDenied, "node_name: %v", err)
	case err != nil:
		return err
	}
	defer owner.Close()
	ls := &leaseStream{stream: stream, owner: owner, node: first.GetNodeName(), ttl: durationpb.New(h.cfg.L2.TTL())}
	// The stream's context ends when this returns: the pump with it.
	asks, ended := recv.Pump(ctx, stream.Recv, 16)
	if err := ls.answer(first); err != nil {
		return err
	}
	return ls.serve(ctx, asks, ended)
}

// admitLeases reads the stream's first ask and checks that it names a
// registered node the caller speaks for.
func (h *Hub) admitLeases(stream weirv1.AgentService_LeasesServer) (*weirv1.LeasesRequest, error) {
	if h.cfg.L2 == nil {
		return nil, status.Error(codes.Unimplemented, "this server answers no L2 leases")
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	node := first.GetNodeName()
	if node == "" {
		return nil, status.Error(codes.InvalidArgument, "node_name: the first ask must name the node")
	}
	if err := authorizeNode(stream.Context(), node); err != nil {
		return nil, err
	}
	if err := h.registered("node_name", node); err != nil {
		return nil, err
	}
	return first, nil
}

// leaseStream is one node's Leases stream and its lease owner's side.
type leaseStream struct {
	stream weirv1.AgentService_LeasesServer
	owner  *l2owner.Stream
	node   string
	ttl    *durationpb.Duration
}

// serve answers the asks and passes on the owner's nudges until the
// stream ends, the owner ends it (leadership lost, a newer stream) or ctx
// ends.
func (ls *leaseStream) serve(ctx context.Context, asks <-chan *weirv1.LeasesRequest, ended <-chan error) error {
	for {
		select {
		case ask := <-asks:
			if err := ls.answer(ask); err != nil {
				return err
			}
		case <-ls.owner.Nudged():
			if err := ls.stream.Send(&weirv1.LeasesResponse{Ttl: ls.ttl, Nudge: ls.owner.NudgeNumber()}); err != nil {
				return err
			}
		case <-ls.owner.Done():
			return status.Error(codes.Unavailable, "the server no longer decides the L2 owners")
		case err := <-ended:
			return ls.answerLast(asks, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// answerLast answers what the agent sent before its stream ended, then
// returns how it ended: its last ask may give everything up (a stopping
// agent). The pump passes every ask on before the end.
func (ls *leaseStream) answerLast(asks <-chan *weirv1.LeasesRequest, ended error) error {
	for {
		select {
		case ask := <-asks:
			if err := ls.answer(ask); err != nil {
				return err
			}
		default:
			return ended
		}
	}
}

// answer answers one ask: the leases the node now holds, or, when it
// stops, those it answers for until their next owners can take them.
func (ls *leaseStream) answer(ask *weirv1.LeasesRequest) error {
	asked, err := askedOf(ls.node, ask)
	if err != nil {
		return err
	}
	out := &weirv1.LeasesResponse{Sequence: ask.GetSequence(), Ttl: ls.ttl}
	grants := ls.owner.Ask
	if ask.GetStopping() {
		grants = ls.owner.Stop
	}
	for _, g := range grants(asked) {
		out.Leases = append(out.Leases, &weirv1.L2Lease{Address: g.Addr.String(), Epoch: g.Epoch})
	}
	return ls.stream.Send(out)
}

// askedOf reads an ask of node's stream (InvalidArgument naming the
// field it cannot read). A stopping ask's lapsed leases are not read: the
// agent gives everything up.
func askedOf(node string, ask *weirv1.LeasesRequest) (l2owner.Asked, error) {
	var asked l2owner.Asked
	if n := ask.GetNodeName(); n != "" && n != node {
		return asked, status.Errorf(codes.InvalidArgument, "node_name: %q on a stream of %q", n, node)
	}
	var err error
	if asked.Held, err = leasesOf("held", ask.GetHeld()); err != nil {
		return asked, err
	}
	if asked.Released, err = leasesOf("released", ask.GetReleased()); err != nil {
		return asked, err
	}
	if asked.Refused, err = refusedOf(ask.GetRefused()); err != nil {
		return asked, err
	}
	asked.Nudged = ask.GetNudged()
	if a := ask.GetAnswerable(); a != nil {
		asked.HasAnswerable = true
		if asked.Answerable, err = addressesOf("answerable.addresses", a.GetAddresses()); err != nil {
			return asked, err
		}
	}
	if !ask.GetStopping() {
		asked.Lapsed, err = leasesOf("lapsed", ask.GetLapsed())
	}
	return asked, err
}

// refusedOf reads the addresses an ask says the node cannot answer for,
// and why (nil when none).
func refusedOf(in []*weirv1.L2Refusal) (map[netip.Addr]string, error) {
	if len(in) > maxLeasesPerAsk {
		return nil, status.Errorf(codes.InvalidArgument, "refused: %d addresses; at most %d", len(in), maxLeasesPerAsk)
	}
	var refused map[netip.Addr]string
	for i, r := range in {
		a, err := netip.ParseAddr(r.GetAddress())
		if err != nil || a.Zone() != "" {
			return nil, status.Errorf(codes.InvalidArgument, "refused[%d].address: %q is not an IP address", i, r.GetAddress())
		}
		if refused == nil {
			refused = map[netip.Addr]string{}
		}
		refused[a] = truncate(r.GetReason())
	}
	return refused, nil
}

// addressesOf reads a list of addresses of an ask's field.
func addressesOf(field string, in []string) ([]netip.Addr, error) {
	if len(in) > maxLeasesPerAsk {
		return nil, status.Errorf(codes.InvalidArgument, "%s: %d addresses; at most %d", field, len(in), maxLeasesPerAsk)
	}
	out := make([]netip.Addr, 0, len(in))
	for i, s := range in {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, status.Errorf(codes.InvalidArgument, "%s[%d]: %q is not an IP address", field, i, s)
		}
		out = append(out, a)
	}
	return out, nil
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
