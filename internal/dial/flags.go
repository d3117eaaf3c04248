package dial

import (
	"flag"
	"log/slog"
	"slices"

	"github.com/weirlb/weir/internal/tlsconfig"
)

// Flags are how a daemon (an agent, a speaker) reaches weir-server: the
// replicas, TLS and, for an agent, its node token. A daemon sets who it
// is, registers the flags, and once they are parsed loads TLS and dials.
type Flags struct {
	// Who names the daemon in the help ("agent", "speaker"), and is the
	// use its certificate is loaded for.
	Who string
	// Moves ends --server's help: how the daemon goes from one replica
	// to the next, after "is on one at a time".
	Moves string
	// CertRole, when set, is the role --cert-file's help asks for.
	CertRole string
	// NodeToken adds --node-token-file.
	NodeToken bool

	Servers                   string // --server
	Insecure                  bool   // --insecure
	CAFile, CertFile, KeyFile string
	NodeTokenFile             string
}

// Register adds --server, --insecure, --ca-file, --cert-file, --key-file
// and, with NodeToken, --node-token-file to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Servers, "server", "127.0.0.1:7443", "comma-separated HOST:PORT of weir-server's replicas (a DNS name counts as all its addresses); the "+f.Who+" is on one at a time"+f.Moves)
	fs.BoolVar(&f.Insecure, "insecure", false, "talk to the server in plain text (lab and demo only)")
	fs.StringVar(&f.CAFile, "ca-file", "", "CA that signed the server's certificate")
	role := ""
	if f.CertRole != "" {
		role = ", role " + f.CertRole
	}
	fs.StringVar(&f.CertFile, "cert-file", "", "this "+f.Who+"'s client certificate (PEM"+role+")")
	fs.StringVar(&f.KeyFile, "key-file", "", "this "+f.Who+"'s private key (PEM)")
	if f.NodeToken {
		fs.StringVar(&f.NodeTokenFile, "node-token-file", "", "a service-account token naming this node (a projected token volume with the server's --agent-token-audience), sent with every call: on the agents' shared certificate, the server then lets this agent act for its own node only")
	}
}

// TLS loads the certificate files (reloaded when they change), or is nil
// with --insecure.
func (f *Flags) TLS(log *slog.Logger) (*tlsconfig.Source, error) {
	if f.Insecure {
		return nil, nil
	}
	return tlsconfig.Load(tlsconfig.Files{CA: f.CAFile, Cert: f.CertFile, Key: f.KeyFile}, tlsconfig.Options{Use: f.Who, Log: log})
}

// Dial connects to the replicas over tls (TLS's, nil for plain text),
// sending the node token when one is named.
func (f *Flags) Dial(tls *tlsconfig.Source, opts ...Option) (*Servers, error) {
	if f.NodeTokenFile != "" {
		opts = append(slices.Clip(opts), WithNodeToken(f.NodeTokenFile))
	}
	return NewServers(f.Servers, tls, opts...)
}
