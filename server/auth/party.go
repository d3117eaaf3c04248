package auth

import (
	"context"
	"net"

	"google.golang.org/grpc/peer"

	"github.com/weirlb/weir/server/certs"
)

// Party is whom the per-caller bounds count: the certificate's identity,
// and for the agents' shared certificate, which every node's agent may
// hold, the identity at each address. In plain text it is the caller's
// address.
func Party(ctx context.Context) string {
	if id, ok := FromContext(ctx); ok && id.NodeToken {
		return id.Name + " (agent, by its node token)"
	}
	who := Caller(ctx)
	p, ok := peer.FromContext(ctx)
	if !ok {
		return who
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return who
	}
	if id, ok := certIdentity(p); !ok {
		return "unauthenticated " + host
	} else if id.Name == certs.FleetAgentName {
		return who + " at " + host
	}
	return who
}

// SharedAgent reports whether ctx's caller holds the agents' shared
// certificate without a node token, and so may speak for any node: such a
// caller never displaces an agent bound to its node (by its own
// certificate or its node token).
func SharedAgent(ctx context.Context) bool {
	id, ok := FromContext(ctx)
	return ok && id.Name == certs.FleetAgentName
}
