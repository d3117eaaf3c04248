package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
	"github.com/weirlb/weir/test/weirlab"
)

// TestCertificatesRotateUnderTraffic: the server's and the agents'
// certificates, short-lived, are reissued in place by `weir-server certs
// rotate` while a client connects through the load-balancer IP every
// 10 ms. No process restarts and no connection fails; every process takes
// its new files (its expiry metric says so), the agents' streams stay on
// their old certificates until those end (a reload drops nothing), and
// within seconds of the end every stream is on a new one, through which a
// later change reaches both kernels.
func TestCertificatesRotateUnderTraffic(t *testing.T) {
	const life = 40 * time.Second
	c := startClusterWith(t, func(c *weirlab.Cluster) { c.CertValidity = life })
	ctx := context.Background()
	oldEnd := certEnd(t, filepath.Join(c.CertDir, "server.crt"))
	for _, n := range c.Nodes {
		if end := certEnd(t, filepath.Join(c.CertDir, n.Name+".crt")); end.Before(oldEnd) {
			oldEnd = end
		}
	}
	createWeb(t, c)
	dst := netip.AddrPortFrom(lbIP, 80)
	eventually(t, "the load-balancer IP answers", func() error {
		_, err := weirlab.Get(ctx, c.Client, dst)
		return err
	})
	if left := time.Until(oldEnd); left < 15*time.Second {
		t.Fatalf("the lab took %v to start: its %v certificates have %v left, too little to rotate them before they end", life-left, life, left)
	}
	done := keepConnecting(c.Client, dst)

	out, err := exec.CommandContext(ctx, c.Bin.Server, "certs", "rotate", "--dir", c.CertDir, "--within", "1h").CombinedOutput()
	if err != nil {
		t.Fatalf("certs rotate: %v\n%s", err, out)
	}
	for _, name := range []string{"server", "node1", "node2"} {
		if !strings.Contains(string(out), "/"+name+".crt") {
			t.Errorf("certs rotate did not reissue %s:\n%s", name, out)
		}
	}
	if strings.Contains(string(out), "admin") {
		t.Errorf("certs rotate reissued admin's year-long certificate:\n%s", out)
	}
	newEnd := certEnd(t, filepath.Join(c.CertDir, "server.crt"))

	// Every process takes its new files, as its metric shows.
	for _, m := range []struct {
		ns   *lab.Netns
		url  string
		use  string
		proc string
	}{
		{c.Control, "http://127.0.0.1:7444/metrics", "server", "server"},
		{c.Nodes[0].Netns, "http://127.0.0.1:10249/metrics", "agent", "node1's agent"},
		{c.Nodes[1].Netns, "http://127.0.0.1:10249/metrics", "agent", "node2's agent"},
	} {
		wait.For(t, 30*time.Second, m.proc+" takes its new certificate", func() error {
			a, err := httpGet(t, m.ns, m.url)
			if err != nil {
				return err
			}
			got, err := metricValue(a.body, fmt.Sprintf(`weir_certificate_expiry_timestamp_seconds{file="%s",kind="certificate",use="%s"}`, certFile(c, m.use, m.proc), m.use))
			if err != nil {
				return err
			}
			if got < float64(time.Now().Add(300*24*time.Hour).Unix()) {
				return fmt.Errorf("its certificate ends at %v", time.Unix(int64(got), 0))
			}
			return nil
		})
	}

	// Reloading drops no stream: until the old certificates end, the
	// agents stay on them.
	status := weirv1.NewStatusServiceClient(c.Conn)
	streamEnds := func() map[string]time.Time {
		r, err := status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ends := map[string]time.Time{}
		for _, n := range r.GetNodes() {
			if n.GetConnected() {
				ends[n.GetName()] = n.GetCertificateNotAfter().AsTime()
			}
		}
		return ends
	}
	time.Sleep(time.Until(oldEnd.Add(-3 * time.Second)))
	for _, n := range c.Nodes {
		if got := streamEnds()[n.Name]; got.After(oldEnd.Add(time.Minute)) {
			t.Errorf("%s's stream moved to its new certificate before the old one ended: a reload dropped it", n.Name)
		}
	}
	// Past their end, every stream is on a new certificate.
	time.Sleep(time.Until(oldEnd.Add(5 * time.Second)))
	ends := streamEnds()
	for _, n := range c.Nodes {
		if got := ends[n.Name]; got.Before(newEnd.Add(-time.Hour)) {
			t.Errorf("%s's stream, 5s after its certificate ended: on a certificate ending %v (connected: %v)", n.Name, got, !got.IsZero())
		}
	}
	// And streams carry changes: node2's pod leaves the service.
	r, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: endpointSlices("web", c.Nodes[0].Pods)[0]})
	if err != nil {
		t.Fatal(err)
	}
	waitEveryNodeProgrammed(t, c, "a change after the rotation", r.GetEndpointSlice().GetMetadata().GetRevision())
	failures, total := done()
	t.Logf("%d of %d connections failed across the rotation", failures, total)
	if failures != 0 || total < 1000 {
		t.Errorf("%d of %d connections failed across the rotation; want 0 of at least 1000", failures, total)
	}
	if log := c.Server.Log(); !strings.Contains(log, "certificates reloaded") {
		t.Errorf("the server's log does not say it reloaded its certificate:\n%s", log)
	}
	// The operator's view: describe node says when the stream's
	// certificate ends.
	desc, err := c.Lbctl(ctx, "describe", "node", "node1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "Certificate Expires:   in " + strconv.Itoa(int(time.Until(newEnd).Hours()/24)) + "d"; !strings.Contains(desc, want) {
		t.Errorf("describe node node1: no %q:\n%s", want, desc)
	}
}

func certEnd(t *testing.T, file string) time.Time {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(file, strings.TrimSuffix(file, ".crt")+".key")
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf.NotAfter
}

// certFile is the certificate file a process was started with.
func certFile(c *weirlab.Cluster, use, proc string) string {
	if use == "server" {
		return filepath.Join(c.CertDir, "server.crt")
	}
	return filepath.Join(c.CertDir, strings.TrimSuffix(proc, "'s agent")+".crt")
}

// metricValue reads one sample, named with its labels in Prometheus'
// order (sorted), from a text exposition.
func metricValue(exposition, sample string) (float64, error) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(exposition)
	if m == nil {
		return math.NaN(), fmt.Errorf("no sample %s", sample)
	}
	return strconv.ParseFloat(m[1], 64)
}
