// Command lbctl is the operator's command line for Weir. It reads, applies
// and deletes the services, endpoint slices and nodes that weir-server
// keeps, through the server's gRPC registry API, in the manner of kubectl:
//
//	lbctl apply -f web.yaml
//	lbctl get services -o wide
//	lbctl delete service web
//
// Exit codes: 0 success, 1 a rejected request or bad input, 2 a usage
// error, 3 the server could not be reached.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	a := &app{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, now: time.Now}
	os.Exit(a.run(os.Args[1:]))
}

// app is one invocation: its streams, clock, flags and connection. Tests
// build one with their own buffers and clock.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	now            func() time.Time // renders AGE

	server    string
	insecure  bool
	tls       tlsconfig.Files
	timeout   time.Duration
	namespace string // -n of get, apply and delete

	started bool // a command's own code ran: earlier failures are usage errors
	conn    *grpc.ClientConn
}

// run executes one command line and returns the process exit code.
func (a *app) run(args []string) int {
	root := a.rootCmd()
	root.SetArgs(args)
	err := root.Execute()
	if a.conn != nil {
		a.conn.Close()
	}
	if err == nil {
		return 0
	}
	if !a.started {
		// Cobra failed before any command ran: a bad flag, argument count or
		// command name.
		err = &usageError{err}
	}
	fmt.Fprintln(a.stderr, "lbctl:", plain(nil, err))
	return exitCode(err)
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "lbctl",
		Short: "Operate a Weir server: get, apply and delete services, endpoint slices and nodes",
		// Errors are printed once, by run, as one line; usage is for --help.
		SilenceUsage:     true,
		SilenceErrors:    true,
		PersistentPreRun: func(*cobra.Command, []string) { a.started = true },
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)

	server := os.Getenv("WEIR_SERVER")
	if server == "" {
		server = "127.0.0.1:7443"
	}
	f := root.PersistentFlags()
	f.StringVar(&a.server, "server", server, "address of weir-server; env WEIR_SERVER")
	f.BoolVar(&a.insecure, "insecure", os.Getenv("WEIR_INSECURE") == "1", "talk plain text, not TLS; env WEIR_INSECURE=1")
	f.StringVar(&a.tls.CA, "ca-file", "", "CA that signed the server's certificate (PEM; default: the system roots)")
	f.StringVar(&a.tls.Cert, "cert-file", "", "client certificate for mTLS (PEM)")
	f.StringVar(&a.tls.Key, "key-file", "", "client private key for mTLS (PEM)")
	f.DurationVar(&a.timeout, "timeout", 10*time.Second, "limit for each call to the server")

	root.AddCommand(a.getCmd(), a.applyCmd(), a.deleteCmd(), a.versionCmd())
	return root
}

func (a *app) versionCmd() *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print lbctl's version and whether the server answers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(a.stdout, "Client: %s\n", version)
			if clientOnly {
				return nil
			}
			conn, err := a.dial()
			if err != nil {
				return err
			}
			// The health service answers without touching the registry: a
			// cheap "is anyone there".
			resp, err := healthpb.NewHealthClient(conn).Check(cmd.Context(), &healthpb.HealthCheckRequest{})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "Server: %s (%s)\n", a.server, resp.GetStatus())
			return nil
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print the client version only")
	return cmd
}

// dial connects once per invocation. grpc.NewClient connects lazily, so
// an unreachable server shows up as the first call's error.
func (a *app) dial() (*grpc.ClientConn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	if a.timeout <= 0 {
		return nil, usageErrorf("--timeout must be positive")
	}
	creds := insecure.NewCredentials()
	if a.insecure {
		if a.tls != (tlsconfig.Files{}) {
			return nil, usageErrorf("--insecure (or WEIR_INSECURE=1) does not go with --ca-file, --cert-file or --key-file")
		}
	} else {
		cfg, err := tlsconfig.Client(a.tls)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(a.server, grpc.WithTransportCredentials(creds), grpc.WithUnaryInterceptor(a.intercept))
	if err != nil {
		return nil, usageErrorf("--server %q: %v", a.server, err)
	}
	a.conn = conn
	return conn, nil
}

func (a *app) client() (client, error) {
	conn, err := a.dial()
	if err != nil {
		return nil, err
	}
	return weirv1.NewRegistryServiceClient(conn), nil
}

// intercept bounds every call by --timeout and turns "nothing answers at
// that address" into one error that the exit code and the hint key on.
func (a *app) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	err := invoke(ctx, method, req, reply, cc, opts...)
	switch status.Code(err) {
	case codes.Unavailable:
		return &unreachableError{addr: a.server, cause: status.Convert(err).Message(), plainText: a.insecure}
	case codes.DeadlineExceeded:
		// Only a deadline spent waiting for a connection means unreachable;
		// a connected server that answers slowly is a different problem.
		if cc.GetState() != connectivity.Ready {
			return &unreachableError{addr: a.server, cause: status.Convert(err).Message(), plainText: a.insecure}
		}
	}
	return err
}

// usageError is a command line lbctl cannot run: exit code 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// unreachableError is a server that did not answer: exit code 3.
type unreachableError struct {
	addr, cause string
	plainText   bool // --insecure
}

func (e *unreachableError) Error() string {
	// A TLS mismatch also looks like an unreachable server; say what failed.
	if _, tlsErr, ok := strings.Cut(e.cause, "authentication handshake failed: "); ok {
		return fmt.Sprintf("cannot reach the server at %s: TLS handshake failed: %s (check --ca-file, --cert-file and --key-file, or --insecure for a plain-text server)",
			e.addr, strings.TrimSuffix(tlsErr, `"`))
	}
	if e.plainText && strings.Contains(e.cause, "server preface") {
		return fmt.Sprintf("cannot reach the server at %s: no plain-text gRPC answer (if it serves TLS, drop --insecure and WEIR_INSECURE)", e.addr)
	}
	return fmt.Sprintf("cannot reach the server at %s (is weir-server running? set --server or WEIR_SERVER)", e.addr)
}

// exitCode maps an error to the process exit code.
func exitCode(err error) int {
	var unreachable *unreachableError
	var usage *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &unreachable):
		return 3
	case errors.As(err, &usage):
		return 2
	}
	return 1
}

// plain turns a gRPC status into its message alone. Field paths in
// InvalidArgument messages start with the request field ("service."); it
// is cut when k is known, so that paths read as in the user's document.
func plain(k *kind, err error) error {
	var unreachable *unreachableError
	if err == nil || errors.As(err, &unreachable) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	if k != nil {
		msg = strings.TrimPrefix(msg, k.field+".")
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.Aborted, codes.FailedPrecondition:
		return errors.New(msg)
	}
	return fmt.Errorf("%s (%s)", msg, st.Code())
}
