package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	clientset "k8s.io/client-go/kubernetes"

	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/kubernetes"
)

const certsUsage = `usage: weir-server certs init --dir DIR --hosts NAME,IP,...
       weir-server certs server --dir DIR --hosts NAME,IP,...
       weir-server certs issue --dir DIR --name NAME --role admin|viewer|agent|speaker [--force]
       weir-server certs rotate --dir DIR [--within 720h]
       weir-server certs check-expiration --dir DIR
       weir-server certs kubernetes [--namespace NS] [--hosts NAME,IP,...] [--kubeconfig FILE]
                                    [--owner-service-account NAME] [--wait-mounted DIR,...]`

// certsCommand issues certificates: "init" makes a CA and the server's
// certificate, "issue" a client's, "rotate" renews what ends soon and
// "check-expiration" shows when each ends. Warnings go to stderr.
func certsCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(certsUsage)
	}
	f, err := parseCertsFlags(args, stderr)
	if f == nil || err != nil {
		return err // on -help, the usage is printed
	}
	hs := f.hostList()
	// Every certificate issued here ends no later than its CA; one cut
	// short says so.
	warnCapped := certs.OnCapped(func(c certs.Capped) { fmt.Fprintln(stderr, "warning:", c) })
	opts := []certs.Option{certs.ValidFor(*f.validFor), warnCapped}
	switch args[0] {
	case "init":
		return initCerts(*f.dir, hs, opts, stdout)
	case "server":
		return serverCert(*f.dir, hs, opts, stdout)
	case "issue":
		return issueCert(*f.dir, *f.name, *f.role, *f.force, opts, stdout)
	case "rotate":
		return rotate(*f.dir, *f.within, *f.validFor, opts, stdout, stderr)
	case "check-expiration":
		return checkExpiration(*f.dir, stdout)
	case "kubernetes":
		return kubernetesSecrets(f, hs, warnCapped, stdout)
	default:
		return errors.New(certsUsage)
	}
}

// certsFlags are the flags of "certs": each subcommand reads the ones it
// needs.
type certsFlags struct {
	dir, hosts, name, role, namespace, kubeconfig *string
	owner, waitMounted                            *string
	force                                         *bool
	validFor, within                              *time.Duration
}

// parseCertsFlags reads the flags after the subcommand args[0], and
// checks the durations; it returns nil, nil on -help.
func parseCertsFlags(args []string, stderr io.Writer) (*certsFlags, error) {
	fs := flag.NewFlagSet("certs "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &certsFlags{
		dir:         fs.String("dir", "/etc/weir/tls", "folder of the CA and the certificates"),
		hosts:       fs.String("hosts", "", "comma-separated names and addresses the server answers on (init, server; kubernetes: besides the Service weir-server's in-cluster names)"),
		name:        fs.String("name", "", "the client's identity: a node name for an agent (issue)"),
		role:        fs.String("role", "", "admin, viewer, agent or speaker (issue)"),
		force:       fs.Bool("force", false, "replace the name's existing certificate and key (issue)"),
		namespace:   fs.String("namespace", "weir-system", "the namespace of the Secrets (kubernetes)"),
		kubeconfig:  fs.String("kubeconfig", "", "the cluster's kubeconfig; empty: the in-cluster config (kubernetes)"),
		owner:       fs.String("owner-service-account", "", "the ServiceAccount of --namespace that owns the Secrets made: deleting it (an uninstall) deletes them (kubernetes)"),
		waitMounted: fs.String("wait-mounted", "", "comma-separated folders of the pod's Secret volumes to wait for, until each holds ca.crt, tls.crt and tls.key (kubernetes)"),
		validFor:    fs.Duration("valid-for", 365*24*time.Hour, "how long the certificates issued are valid, never past the CA's end (server, issue, rotate)"),
		within:      fs.Duration("within", 30*24*time.Hour, "reissue the certificates that expire within this time (rotate; 0: only those expired)"),
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil
		}
		return nil, err
	}
	if *f.validFor < time.Minute {
		return nil, fmt.Errorf("--valid-for %v: at least a minute (a certificate that ends at once cuts off whoever uses it)", *f.validFor)
	}
	if *f.within < 0 {
		return nil, fmt.Errorf("--within %v: 0 or more", *f.within)
	}
	return f, nil
}

// hostList is --hosts as a list, blanks left out.
func (f *certsFlags) hostList() []string {
	var hs []string
	for _, h := range strings.Split(*f.hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	return hs
}

// initCerts makes a CA and the server's certificate.
func initCerts(dir string, hosts []string, opts []certs.Option, stdout io.Writer) error {
	if err := certs.InitCA(dir); err != nil {
		return err
	}
	if err := certs.IssueServer(dir, hosts, opts...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s/ca.crt, ca.key, server.crt, server.key\n", dir)
	return nil
}

// serverCert issues a new server certificate from the existing CA: for
// more addresses (replicas), or a rotation. Clients keep trusting it.
func serverCert(dir string, hosts []string, opts []certs.Option, stdout io.Writer) error {
	if err := certs.IssueServer(dir, hosts, opts...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s/server.crt, server.key\n", dir)
	return nil
}

// issueCert issues a client's certificate; force replaces one the name
// has already.
func issueCert(dir, name, role string, force bool, opts []certs.Option, stdout io.Writer) error {
	issue := certs.IssueClient
	if force {
		issue = certs.ReissueClient
	}
	if err := issue(dir, name, role, opts...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s/%s.crt and %s.key (role %s)\n", dir, name, name, role)
	return nil
}

// kubernetesSecrets makes the Secrets the manifests mount, once (the
// server pods' init container), then waits for the pod's volumes of them.
func kubernetesSecrets(f *certsFlags, hosts []string, warnCapped certs.Option, stdout io.Writer) error {
	rc, err := kubernetes.RestConfig(*f.kubeconfig)
	if err != nil {
		return err
	}
	client, err := clientset.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	namespace := *f.namespace
	var owner *metav1.OwnerReference
	if *f.owner != "" {
		if owner, err = kubernetes.ServiceAccountOwner(ctx, client, namespace, *f.owner); err != nil {
			return err
		}
	}
	made, err := kubernetes.BootstrapSecrets(ctx, client, namespace, hosts, owner, warnCapped)
	for _, m := range made {
		fmt.Fprintf(stdout, "made Secret %s/%s\n", namespace, m)
	}
	if err != nil {
		return err
	}
	if len(made) == 0 {
		fmt.Fprintf(stdout, "the Secrets of %s are there already: nothing changed\n", namespace)
	}
	var dirs []string
	for _, d := range strings.Split(*f.waitMounted, ",") {
		if d = strings.TrimSpace(d); d != "" {
			dirs = append(dirs, d)
		}
	}
	return waitMounted(dirs, mountWait, time.Second, stdout)
}

// mountWait bounds how long the init container waits for the kubelet to
// fill the pod's Secret volumes; past it, the container fails and the
// kubelet starts it again.
const mountWait = 5 * time.Minute

// waitMounted waits until each folder holds a certificate, its key and
// its CA. A pod's optional Secret volume whose Secret appears after the
// pod started is filled at the kubelet's next sync of the pod (about a
// minute): the server's container, started after this one, then finds
// its files.
func waitMounted(dirs []string, timeout, every time.Duration, stdout io.Writer) error {
	deadline := time.Now().Add(timeout)
	for _, dir := range dirs {
		said := false
		for {
			missing := ""
			for _, f := range []string{"ca.crt", "tls.crt", "tls.key"} {
				if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
					missing = f
					break
				}
			}
			if missing == "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s has no %s after %v: is its Secret volume the Secret made?", dir, missing, timeout)
			}
			if !said {
				fmt.Fprintf(stdout, "waiting for the kubelet to fill %s\n", dir)
				said = true
			}
			time.Sleep(every)
		}
	}
	return nil
}

// rotate reissues in place, with its names and role, every certificate
// the CA signed that is due: the processes that use them take the new
// files within tlsconfig.ReloadPeriod, without a restart. It says how
// long the CA has left, which no rotation extends.
func rotate(dir string, within, validFor time.Duration, opts []certs.Option, stdout, stderr io.Writer) error {
	if validFor <= within {
		return fmt.Errorf("--valid-for %v is not longer than --within %v: every certificate renewed would be due again at the next rotation", validFor, within)
	}
	r, err := certs.Rotate(dir, within, opts...)
	for _, n := range r.Reissued {
		fmt.Fprintf(stdout, "reissued %s/%s.crt and %s.key\n", dir, n, n)
	}
	for _, c := range r.EndWithCA {
		fmt.Fprintf(stderr, "warning: %s is due but not renewed: it ends with its CA, at %s, and no renewal can end later\n", c.File, c.NotAfter.UTC().Format(time.RFC3339))
	}
	if ca := r.CA; ca.File != "" {
		left := time.Until(ca.NotAfter)
		fmt.Fprintf(stdout, "the CA %s ends at %s (residual time %s)\n", ca.File, ca.NotAfter.UTC().Format(time.RFC3339), residual(left))
		if left > 0 && left <= within {
			fmt.Fprintf(stderr, "warning: the CA %s ends at %s, within --within %v: rotate does not renew a CA, and no certificate outlives the CA that signs it; make a new CA and move every certificate to it before then (docs/operations.md, CA rotation)\n",
				ca.File, ca.NotAfter.UTC().Format(time.RFC3339), within)
		}
	}
	if err != nil {
		return err
	}
	if len(r.Reissued) == 0 && len(r.EndWithCA) == 0 {
		fmt.Fprintf(stdout, "no certificate in %s expires within %v: nothing changed\n", dir, within)
	}
	return nil
}

// checkExpiration prints, as kubeadm's "certs check-expiration" does,
// when every certificate of dir ends and how long it has left, then the
// CA; a file it cannot read is listed after, and fails the command.
func checkExpiration(dir string, stdout io.Writer) error {
	f, err := certs.ReadFolder(dir)
	if err != nil {
		return err
	}
	now := time.Now()
	tw := tabwriter.NewWriter(stdout, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "CERTIFICATE\tCOMMON NAME\tROLE\tEXPIRES\tRESIDUAL TIME\tCERTIFICATE AUTHORITY")
	var outlive []certs.Certificate
	for _, c := range f.Certificates {
		ca := "ca"
		if c.OtherCA {
			ca = "another CA"
		} else if c.NotAfter.After(f.CA.NotAfter) {
			outlive = append(outlive, c)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, c.CommonName, orNone(c.Role), expires(c.NotAfter), residual(c.NotAfter.Sub(now)), ca)
	}
	fmt.Fprintln(tw, "\nCERTIFICATE AUTHORITY\tEXPIRES\tRESIDUAL TIME")
	fmt.Fprintf(tw, "%s\t%s\t%s\n", f.CA.Name, expires(f.CA.NotAfter), residual(f.CA.NotAfter.Sub(now)))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range outlive {
		fmt.Fprintf(stdout, "\n%s ends after its CA: nothing verifies it past %s\n", c.Name, expires(f.CA.NotAfter))
	}
	if len(f.Failed) == 0 {
		return nil
	}
	errs := make([]error, len(f.Failed))
	for i, fe := range f.Failed {
		errs[i] = fe
	}
	return fmt.Errorf("certificate files of %s not read (%d):\n%w", dir, len(errs), errors.Join(errs...))
}

// expires is how kubeadm writes a certificate's end.
func expires(t time.Time) string { return t.UTC().Format("Jan 02, 2006 15:04 MST") }

// residual is the time left, in kubeadm's short form (364d, 9y).
func residual(d time.Duration) string {
	if d <= 0 {
		return "expired"
	}
	return duration.ShortHumanDuration(d)
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
