// Command lbctl is the operator's command line for Weir. It reads, applies
// and deletes the services, endpoint slices and nodes that weir-server
// keeps, watches them change, and tells what the agents actually do, in
// the manner of kubectl:
//
//	lbctl apply -f web.yaml
//	lbctl get services -o wide --watch
//	lbctl describe service default/web
//	lbctl status
//	lbctl node drain node1
//
// Where the server is and how to reach it comes from flags, then the
// environment (WEIR_SERVER, WEIR_INSECURE), then the current context of
// the config file (see config.go), then the defaults.
//
// Exit codes: 0 success, 1 a rejected request, bad input or (status)
// something wrong on the appliance, 2 a usage error, 3 the server could
// not be reached, 4 a write (--wait) that some connected node or speaker does not
// forward in time.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	// Ctrl-C ends a watch through the context: a normal end, exit 0.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	a := &app{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, now: time.Now}
	code := a.run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// app is one invocation: its streams, clock, flags and connection. Tests
// build one with their own buffers and clock.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	now            func() time.Time // renders AGE and "ago"

	flags       *pflag.FlagSet // the global flags, to tell which were given
	server      string
	insecure    bool
	tls         tlsconfig.Files
	timeout     time.Duration
	configFile  string // --config
	contextName string // --context
	namespace   string // -n of get, describe, apply and delete

	started bool     // a command's own code ran: earlier failures are usage errors
	addrs   []string // the server addresses of --server, in the order tried
	conn    *grpc.ClientConn
	creds   credentials.TransportCredentials
}

// run executes one command line and returns the process exit code.
func (a *app) run(ctx context.Context, args []string) int {
	root := a.rootCmd()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
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
		Short: "Operate a Weir appliance: its services, endpoints and nodes, and what its agents do",
		// Errors are printed once, by run, as one line; usage is for --help.
		SilenceUsage:     true,
		SilenceErrors:    true,
		PersistentPreRun: func(*cobra.Command, []string) { a.started = true },
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)

	f := root.PersistentFlags()
	a.flags = f
	f.StringVar(&a.server, "server", "", "HOST:PORT of weir-server, or of its replicas, comma-separated: lbctl uses the first that answers (default: env WEIR_SERVER, the context's, or "+defaultServer+")")
	f.BoolVar(&a.insecure, "insecure", false, "talk plain text, not TLS (default: env WEIR_INSECURE=1, or the context's)")
	f.StringVar(&a.tls.CA, "ca-file", "", "CA that signed the server's certificate (PEM; default: the context's, or the system roots)")
	f.StringVar(&a.tls.Cert, "cert-file", "", "client certificate for mTLS (PEM; default: the context's)")
	f.StringVar(&a.tls.Key, "key-file", "", "client private key for mTLS (PEM; default: the context's)")
	f.DurationVar(&a.timeout, "timeout", 10*time.Second, "limit for each call to the server (not for watches)")
	f.StringVar(&a.configFile, "config", "", "config file of contexts (default: env LBCTL_CONFIG, or "+defaultConfigHint+")")
	f.StringVar(&a.contextName, "context", "", "the config file's context to use (default: its current-context)")
	_ = root.RegisterFlagCompletionFunc("context", a.completeContexts)

	root.AddCommand(a.getCmd(), a.describeCmd(), a.applyCmd(), a.deleteCmd(), a.statusCmd(),
		a.nodeCmd(), a.configCmd(), a.convertCmd(), a.versionCmd())
	return root
}

func (a *app) versionCmd() *cobra.Command {
	var clientOnly bool
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print lbctl's version and whether the server answers",
		Long: `Print lbctl's version and whether the server answers.

-o json and -o yaml print one document: client (version) and, unless
--client, server (address, health and the server's own GetServerInfo).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			doc := map[string]any{"client": map[string]string{"version": version}}
			if output == "table" {
				fmt.Fprintf(a.stdout, "Client: %s\n", version)
			}
			if !clientOnly {
				health, err := a.health(cmd.Context())
				if err != nil {
					return err
				}
				var info *weirv1.GetServerInfoResponse
				if _, st, err := a.clients(); err == nil {
					info, _ = st.GetServerInfo(cmd.Context(), &weirv1.GetServerInfoRequest{})
				}
				if warn := skewWarning(version, info.GetVersion()); warn != "" {
					fmt.Fprintln(a.stderr, warn)
				}
				if output == "table" {
					fmt.Fprintf(a.stdout, "Server: %s (%s)\n", a.server, health)
					if info != nil {
						fmt.Fprintf(a.stdout, "Server Version: %s\n", cmp.Or(info.GetVersion(), "<none>"))
					}
					return nil
				}
				server := map[string]any{"address": a.server, "health": health.String()}
				if info != nil {
					b, err := marshal.Marshal(info)
					if err != nil {
						return err
					}
					server["info"] = json.RawMessage(b)
				}
				doc["server"] = server
			}
			if output == "table" {
				return nil
			}
			b, err := json.MarshalIndent(doc, "", "  ")
			if err != nil {
				return err
			}
			return a.printDocument(b, output)
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print the client version only")
	addOutputFlag(cmd, &output)
	return cmd
}

// skewWarning warns when lbctl and the server are further apart than the
// skew policy allows (one minor version, docs/operations.md); versions
// that are not releases (dev builds, commits) are not compared.
func skewWarning(client, server string) string {
	c, okc := minorOf(client)
	s, oks := minorOf(server)
	if !okc || !oks || (c[0] == s[0] && c[1]-s[1] <= 1 && s[1]-c[1] <= 1) {
		return ""
	}
	return fmt.Sprintf("WARNING: lbctl %s and the server's %s are more than one minor version apart: the API may differ (docs/operations.md, Versions and skew)", client, server)
}

// minorOf reads the major and minor numbers of a release version, vX.Y.Z
// (with anything after Z: v0.2.0-3-gabcdef).
func minorOf(v string) ([2]int, bool) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if !strings.HasPrefix(v, "v") || len(parts) < 3 {
		return [2]int{}, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return [2]int{major, minor}, err1 == nil && err2 == nil
}

// checkOutput refuses an -o that addOutputFlag's commands do not print.
func checkOutput(output string) error {
	if output != "table" && output != "json" && output != "yaml" {
		return usageErrorf("--output %q: want table, json or yaml", output)
	}
	return nil
}

// addOutputFlag adds -o table|json|yaml to a command that prints one
// document.
func addOutputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "table", "output format: table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
}

// health asks the gRPC health service, which answers without touching the
// registry: a cheap "is anyone there".
func (a *app) health(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := a.dial()
	if err != nil {
		return 0, err
	}
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return resp.GetStatus(), err
}

// dial connects once per invocation, where resolveConnection says.
// grpc.NewClient connects lazily, so an unreachable server shows up as the
// first call's error.
//
// With several addresses (replicas), gRPC's pick_first connects to the
// first that answers, from a random one so that operators spread over the
// replicas. A call is sent only once connected, so none is ever sent twice.
func (a *app) dial() (*grpc.ClientConn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	if a.timeout <= 0 {
		return nil, usageErrorf("--timeout must be positive")
	}
	if err := a.resolveConnection(); err != nil {
		return nil, err
	}
	addrs, err := dial.ParseList(a.server)
	if err != nil {
		return nil, usageErrorf("--server %q: %v", a.server, err)
	}
	creds := insecure.NewCredentials()
	if !a.insecure {
		cfg, err := tlsconfig.Client(a.tls)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	start := rand.N(len(addrs))
	a.addrs = slices.Concat(addrs[start:], addrs[:start])
	a.creds = creds
	if err := a.connect(); err != nil {
		return nil, err
	}
	return a.conn, nil
}

// connect makes the connection to the servers at a.addrs, the first
// preferred.
func (a *app) connect() error {
	servers := manual.NewBuilderWithScheme("weir")
	var state resolver.State
	for _, addr := range a.addrs {
		// ServerName: the server's certificate is checked against the
		// address's own host, as when it is the dial target.
		state.Addresses = append(state.Addresses, resolver.Address{Addr: addr, ServerName: addr})
	}
	servers.InitialState(state)
	conn, err := grpc.NewClient(servers.Scheme()+":///weir-server", grpc.WithResolvers(servers), grpc.WithTransportCredentials(a.creds),
		grpc.WithUnaryInterceptor(a.intercept), grpc.WithStreamInterceptor(a.interceptStream))
	if err != nil {
		return usageErrorf("--server %q: %v", a.server, err)
	}
	a.conn = conn
	return nil
}

// nextReplica moves to the next server address: the one in use refused
// as not current (its store is out of reach, or it fell behind).
func (a *app) nextReplica() error {
	a.conn.Close()
	a.addrs = append(a.addrs[1:], a.addrs[0])
	return a.connect()
}

func (a *app) client() (client, error) {
	c, _, err := a.clients()
	return c, err
}

// clients are the registry's client and the status service's.
func (a *app) clients() (client, weirv1.StatusServiceClient, error) {
	conn, err := a.dial()
	if err != nil {
		return nil, nil, err
	}
	return weirv1.NewRegistryServiceClient(conn), weirv1.NewStatusServiceClient(conn), nil
}

// intercept bounds every call by --timeout, and WaitProgrammed by the wait
// it asks for on top.
func (a *app) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	limit := a.timeout
	if w, ok := req.(*weirv1.WaitProgrammedRequest); ok {
		limit += w.GetTimeout().AsDuration()
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// a.conn, not cc: an earlier call may have moved to another replica.
	err := invoke(ctx, method, req, reply, a.conn, opts...)
	// A replica that is not current refuses before doing anything: the
	// same call goes to the next, once to each.
	for moved := 1; dial.IsNotCurrent(err) && moved < len(a.addrs); moved++ {
		if cerr := a.nextReplica(); cerr != nil {
			return cerr
		}
		err = invoke(ctx, method, req, reply, a.conn, opts...)
	}
	return a.reachable(a.conn, err)
}

// interceptStream is intercept for watches, without the time limit: a
// watch lasts until Ctrl-C.
func (a *app) interceptStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, a.reachable(cc, err)
	}
	return &clientStream{s, func(err error) error { return a.reachable(cc, err) }}, nil
}

// clientStream passes a stream's errors through reachable.
type clientStream struct {
	grpc.ClientStream
	check func(error) error
}

func (s *clientStream) RecvMsg(m any) error { return s.check(s.ClientStream.RecvMsg(m)) }

// reachable turns "nothing answers at that address" into one error that
// the exit code and the hint key on.
func (a *app) reachable(cc *grpc.ClientConn, err error) error {
	if dial.IsNotCurrent(err) {
		return fmt.Errorf("no replica at %s is current, so none answers (the last said: %s)", strings.Join(a.addrs, ", "), status.Convert(err).Message())
	}
	switch status.Code(err) {
	case codes.Unavailable:
		return a.unreachable(err)
	case codes.DeadlineExceeded:
		// Only a deadline spent waiting for a connection means unreachable;
		// a connected server that answers slowly is a different problem.
		if cc.GetState() != connectivity.Ready {
			return a.unreachable(err)
		}
	}
	return err
}

func (a *app) unreachable(err error) error {
	e := &unreachableError{addrs: a.addrs, cause: status.Convert(err).Message(), plainText: a.insecure, clientCert: a.tls.Cert != ""}
	if !e.plainText && droppedAfterHandshake(e.cause) && tlsProblem(e.cause, e.addrs) == "" {
		// The cause was the last address's.
		e.probe, e.probeCause = probeTLS(a.addrs[len(a.addrs)-1], a.tls)
	}
	return e
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
	addrs      []string // every address tried
	cause      string   // the last address's failure
	plainText  bool     // --insecure
	clientCert bool     // a client certificate was given
	// probe is what a second connection found when the server closed one
	// after the TLS handshake (probeTLS), probeCause its error.
	probe, probeCause string
}

func (e *unreachableError) Error() string {
	at := "at " + e.addrs[0]
	if len(e.addrs) > 1 {
		at = "at any of " + strings.Join(e.addrs, ", ")
	}
	// A TLS mismatch also looks like an unreachable server; say what failed.
	if p := tlsProblem(e.cause, e.addrs); p != "" {
		return fmt.Sprintf("cannot reach the server %s: %s", at, p)
	}
	if _, tlsErr, ok := strings.Cut(e.cause, "authentication handshake failed: "); ok {
		return fmt.Sprintf("cannot reach the server %s: TLS handshake failed: %s (check --ca-file, --cert-file and --key-file, or --insecure for a plain-text server)",
			at, strings.TrimSuffix(tlsErr, `"`))
	}
	if !e.plainText && droppedAfterHandshake(e.cause) {
		switch e.probe {
		case probeGone:
			return fmt.Sprintf("cannot reach the server %s: it closed the connection and is not answering now (stopped, or restarting?)", at)
		case probeAnswers:
			return fmt.Sprintf("cannot reach the server %s: it closed the connection (restarting, or at one of its limits), and answers again now: run the command again", at)
		case probeClosed:
			if e.clientCert {
				return fmt.Sprintf("cannot reach the server %s: it closes connections from this client certificate after the TLS handshake without a TLS error: it holds as many of its connections as one caller may (weir-server --api-connections-per-caller), or it is shutting down", at)
			}
		case probeTLSError:
			if p := tlsProblem(e.probeCause, e.addrs); p != "" {
				return fmt.Sprintf("cannot reach the server %s: %s", at, p)
			}
			return fmt.Sprintf("cannot reach the server %s: TLS failed: %s", at, e.probeCause)
		}
		// The server verifies the client certificate after the handshake
		// (TLS 1.3) and closes the connection when it refuses it; its
		// alert may not be read before the write that finds it closed.
		if !e.clientCert {
			return fmt.Sprintf("cannot reach the server %s: the server requires a client certificate (it closed the connection after the TLS handshake): give --cert-file and --key-file (or a context with them)", at)
		}
		return fmt.Sprintf("cannot reach the server %s: the server does not trust the client certificate (--cert-file), or it expired (it closed the connection after the TLS handshake)", at)
	}
	if e.plainText && strings.Contains(e.cause, "server preface") {
		return fmt.Sprintf("cannot reach the server %s: no plain-text gRPC answer (if it serves TLS, drop --insecure and WEIR_INSECURE)", at)
	}
	return fmt.Sprintf("cannot reach the server %s (is weir-server running? set --server, WEIR_SERVER or a context)", at)
}

// tlsProblem says in an operator's words what TLS failure cause reports,
// or "" when it is none it knows. With TLS 1.3 a server's refusal of the
// client certificate arrives as an alert after the handshake, so it reads
// like a broken connection unless named.
func tlsProblem(cause string, addrs []string) string {
	var hosts []string
	for _, addr := range addrs {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		hosts = append(hosts, host)
	}
	switch {
	case strings.Contains(cause, "tls: certificate required"):
		return "the server requires a client certificate: give --cert-file and --key-file (or a context with them)"
	case strings.Contains(cause, "remote error: tls: expired certificate"):
		return "the server refused the client certificate (--cert-file) as expired: issue a new one (weir-server certs issue)"
	case strings.Contains(cause, "remote error: tls: unknown certificate authority"), strings.Contains(cause, "remote error: tls: bad certificate"):
		return "the server does not trust the client certificate (--cert-file): it is not signed by the CA the server trusts (--client-ca-file)"
	case strings.Contains(cause, "x509: certificate signed by unknown authority"):
		return "the server's certificate is not signed by the CA in --ca-file"
	case strings.Contains(cause, "x509: certificate has expired"):
		return "the server's certificate has expired (or this machine's clock is wrong)"
	case strings.Contains(cause, "x509: certificate is valid for"), strings.Contains(cause, "x509: certificate is not valid for any names"):
		return "the server's certificate is not for " + strings.Join(hosts, " or ") + ": connect by a name or address it was issued for (weir-server certs init --hosts)"
	}
	return ""
}

// droppedAfterHandshake reports whether cause is a connection the server
// closed right after a TLS handshake that succeeded.
func droppedAfterHandshake(cause string) bool {
	for _, s := range []string{"broken pipe", "connection reset by peer", "EOF", "connection closed before server preface received"} {
		if strings.Contains(cause, s) {
			return true
		}
	}
	return false
}

// exitCode maps an error to the process exit code.
func exitCode(err error) int {
	var unreachable *unreachableError
	var usage *usageError
	var notProgrammed *notProgrammedError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &unreachable):
		return 3
	case errors.As(err, &usage):
		return 2
	case errors.As(err, &notProgrammed):
		return 4
	case errors.As(err, new(*droppedError)):
		return exitDropped
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
	case codes.PermissionDenied:
		// The server names the caller, its role and the roles needed.
		return errors.New("permission denied: " + msg)
	case codes.Unauthenticated:
		return fmt.Errorf("not authenticated: %s (give --cert-file and --key-file, or a context with them)", msg)
	}
	return fmt.Errorf("%s (%s)", msg, st.Code())
}

// explain is plain, with kubectl's words for a resource that is not there.
func explain(k *kind, ref string, err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%s %s not found", k.singular, ref)
	}
	return plain(k, err)
}
