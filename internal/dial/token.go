package dial

import (
	"context"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
)

// WithNodeToken sends, with every call, the node token in file (a
// projected service-account token the kubelet renews): the server binds an
// agent on the agents' shared certificate to the node the token names.
// The file is read at every call, so a renewed token is used at once.
func WithNodeToken(file string) Option {
	return func(s *Servers) {
		s.opts = append(s.opts, grpc.WithPerRPCCredentials(nodeToken(file)))
	}
}

type nodeToken string

func (f nodeToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("the node token: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return nil, fmt.Errorf("the node token: %s is empty", string(f))
	}
	return map[string]string{"authorization": "Bearer " + token}, nil
}

// RequireTransportSecurity: a token is sent over TLS only.
func (nodeToken) RequireTransportSecurity() bool { return true }
