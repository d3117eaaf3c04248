package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/server/certs"
)

// NodeTokenReviewer tells which node a node token was issued for (in
// Kubernetes: a service-account token bound to an agent's pod, which names
// the pod's node), or why it is not a node token.
type NodeTokenReviewer interface {
	ReviewNodeToken(ctx context.Context, token string) (node string, err error)
}

// Options say how callers are authenticated beyond their certificates.
type Options struct {
	// NodeTokens, when not nil, binds a caller on the agents' shared
	// certificate that presents a node token (gRPC metadata
	// "authorization: Bearer TOKEN") to the node the token names: it then
	// acts for that node alone, as an agent on the node's own certificate
	// does.
	NodeTokens NodeTokenReviewer
	// SharedNeedsToken refuses the agents' shared certificate without a
	// node token. Without it, such a caller may act for any node (as
	// before node tokens), which is deprecated.
	SharedNeedsToken bool
}

// nodeTokenCacheTime is how long a token's review is reused: an agent
// opens two streams at each reconnection, and a rack's agents reconnect
// together after a server restart.
const nodeTokenCacheTime = time.Minute

// nodeTokenCacheSize bounds the reviews kept (tokens differ per pod, and
// change as the kubelet renews them).
const nodeTokenCacheSize = 4096

// reviewsAtOnce bounds the reviews under way, so that a flood of
// tokens from one caller costs the API server a bounded load.
const reviewsAtOnce = 8

// nodeTokens reviews tokens through a reviewer, reusing a token's
// accepted review for nodeTokenCacheTime.
type nodeTokens struct {
	reviewer NodeTokenReviewer
	slots    chan struct{}
	now      func() time.Time

	mu     sync.Mutex // guards cached
	cached map[[sha256.Size]byte]reviewed
}

type reviewed struct {
	node  string
	until time.Time
}

func newNodeTokens(r NodeTokenReviewer) *nodeTokens {
	return &nodeTokens{reviewer: r, slots: make(chan struct{}, reviewsAtOnce), now: time.Now, cached: map[[sha256.Size]byte]reviewed{}}
}

func (n *nodeTokens) review(ctx context.Context, token string) (string, error) {
	key := sha256.Sum256([]byte(token))
	now := n.now()
	n.mu.Lock()
	if r, ok := n.cached[key]; ok && now.Before(r.until) {
		n.mu.Unlock()
		return r.node, nil
	}
	n.mu.Unlock()
	select {
	case n.slots <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	node, err := n.reviewer.ReviewNodeToken(ctx, token)
	<-n.slots
	if err != nil {
		return "", err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.cached) >= nodeTokenCacheSize {
		for k, r := range n.cached {
			if !now.Before(r.until) || len(n.cached) >= nodeTokenCacheSize {
				delete(n.cached, k)
			}
		}
	}
	n.cached[key] = reviewed{node: node, until: now.Add(nodeTokenCacheTime)}
	return node, nil
}

// ErrNoNodeToken: the call carries no node token.
var ErrNoNodeToken = errors.New("no node token")

// bearer is the token of ctx's "authorization: Bearer" metadata.
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get("authorization")
	if len(values) == 0 {
		return "", ErrNoNodeToken
	}
	token, ok := strings.CutPrefix(values[0], "Bearer ")
	if len(values) > 1 || !ok || token == "" {
		return "", errors.New("the authorization metadata must be one \"Bearer TOKEN\"")
	}
	return token, nil
}

// bindShared decides who a caller on the agents' shared certificate is:
// the node its token names, or (deprecated, unless refused) any node.
func (o Options) bindShared(ctx context.Context, tokens *nodeTokens, id Identity) (Identity, error) {
	token, err := bearer(ctx)
	switch {
	case errors.Is(err, ErrNoNodeToken) && !o.SharedNeedsToken:
		return id, nil
	case errors.Is(err, ErrNoNodeToken):
		return id, status.Errorf(codes.Unauthenticated, "the agents' shared certificate %q needs the node's token (weir-agent --node-token-file)", certs.FleetAgentName)
	case err != nil:
		return id, status.Error(codes.Unauthenticated, err.Error())
	case tokens == nil:
		return id, status.Error(codes.Unauthenticated, "this server reviews no node tokens (it reads no Kubernetes cluster)")
	}
	node, err := tokens.review(ctx, token)
	if err != nil {
		if ctx.Err() != nil {
			return id, status.FromContextError(ctx.Err()).Err()
		}
		return id, status.Error(codes.Unauthenticated, fmt.Sprintf("the node token: %v", err))
	}
	return Identity{Name: node, Role: certs.RoleAgent, NodeToken: true}, nil
}
