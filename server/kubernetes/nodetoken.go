package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
)

// AgentTokens say which service-account tokens are node tokens: those of
// the agents' DaemonSet, issued for Audience.
type AgentTokens struct {
	// Audience is the token's audience (the agents' projected token
	// volume's); DefaultAgentTokenAudience when empty. A token for
	// another audience (the API server's own) is refused, so that the
	// server never accepts a token it could replay, nor one that could be
	// replayed to the API server.
	Audience string
	// ServiceAccount is "namespace/name" of the agents' service account;
	// "<the server's namespace>/weir-agent" when empty.
	ServiceAccount string
}

// DefaultAgentTokenAudience is the audience of the agents' node tokens.
const DefaultAgentTokenAudience = "weir.dev/agent"

// extraNodeName is the extra field that names the node in the review of a
// service-account token bound to a pod.
const extraNodeName = "authentication.kubernetes.io/node-name"

// NodeTokens reviews the agents' node tokens with the API server
// (TokenReview), as kube-apiserver's NodeRestriction binds a kubelet to
// its node: a token of the agents' service account, bound to a pod,
// names the pod's node, and the agent presenting it acts for that node
// alone.
type NodeTokens struct {
	client   clientset.Interface
	audience string
	account  string // the service account's user name
}

// NewNodeTokens reviews tokens through client; namespace is the server's,
// the agents' service account's by default.
func NewNodeTokens(client clientset.Interface, cfg AgentTokens, namespace string) *NodeTokens {
	ns, name := namespace, "weir-agent"
	if a, b, ok := strings.Cut(cfg.ServiceAccount, "/"); ok {
		ns, name = a, b
	}
	audience := cfg.Audience
	if audience == "" {
		audience = DefaultAgentTokenAudience
	}
	return &NodeTokens{client: client, audience: audience, account: "system:serviceaccount:" + ns + ":" + name}
}

// ReviewNodeToken implements auth.NodeTokenReviewer.
func (n *NodeTokens) ReviewNodeToken(ctx context.Context, token string) (string, error) {
	r, err := n.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{n.audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("reviewing it: %w", err)
	}
	st := r.Status
	switch {
	case !st.Authenticated:
		return "", fmt.Errorf("the API server does not accept it: %s", st.Error)
	case !slices.Contains(st.Audiences, n.audience):
		return "", fmt.Errorf("it is not for the audience %q", n.audience)
	case st.User.Username != n.account:
		return "", fmt.Errorf("it is %s's, not the agents' service account's (%s)", st.User.Username, n.account)
	}
	node := one(st.User.Extra[extraNodeName])
	if node == "" {
		// Kubernetes 1.30 and later name the node in a token bound to a
		// pod (a projected volume's).
		return "", errors.New("it names no node: it must be a projected token of a pod (Kubernetes 1.30 or later)")
	}
	return node, nil
}

// one is the only value of an extra field, or "".
func one(values authnv1.ExtraValue) string {
	if len(values) != 1 {
		return ""
	}
	return values[0]
}
