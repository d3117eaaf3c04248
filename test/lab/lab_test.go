package lab

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type echoReply struct {
	Pod    string `json:"pod"`
	Remote string `json:"remote"`
	Local  string `json:"local"`
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{Nodes: 0},
		{Nodes: 2, PodsPerNode: []int{1}},
		{Nodes: 1, PodsPerNode: []int{-1}},
		{Nodes: 1, Prefix: "bad/name"},
	} {
		if l, err := New(t.Context(), cfg); err == nil {
			l.Close()
			t.Errorf("New(%+v) succeeded, want error", cfg)
		}
	}
}

func TestLab(t *testing.T) {
	SkipUnlessPrivileged(t)
	echo := buildEcho(t)
	ctx := t.Context()

	start := time.Now()
	l, err := New(ctx, Config{Nodes: 2, PodsPerNode: []int{2, 1}, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("New took %v (prefix %s)", time.Since(start), l.Prefix)
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})

	node1, node2 := l.Nodes[0], l.Nodes[1]
	n1p1, n2p1 := node1.Pods[0], node2.Pods[0]
	var procs []*Process
	for _, s := range []struct {
		ns   *Netns
		name string
	}{{node1.Netns, node1.Name}, {n1p1.Netns, n1p1.Name}, {n2p1.Netns, n2p1.Name}} {
		p, err := s.ns.Start(echo, "-name", s.name, "-listen", ":8080")
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("log of %s:\n%s", p.LogPath, p.Log())
			}
		})
	}

	client := l.Client.HTTPClient(2 * time.Second)
	t.Run("client to node", func(t *testing.T) {
		for _, a := range []netip.Addr{node1.IPv4, node1.IPv6} {
			r := get(t, client, a)
			if r.Pod != node1.Name || addrOf(t, r.Remote) != clientAddr(a) {
				t.Errorf("GET %v = %+v, want pod %s from %v", a, r, node1.Name, clientAddr(a))
			}
		}
	})
	t.Run("client to pod", func(t *testing.T) {
		for _, a := range []netip.Addr{n2p1.IPv4, n2p1.IPv6} {
			r := get(t, client, a)
			if r.Pod != n2p1.Name || addrOf(t, r.Remote) != clientAddr(a) {
				t.Errorf("GET %v = %+v, want pod %s from %v", a, r, n2p1.Name, clientAddr(a))
			}
		}
	})
	t.Run("pod to pod", func(t *testing.T) {
		c := n1p1.HTTPClient(2 * time.Second)
		for _, pair := range [][2]netip.Addr{{n2p1.IPv4, n1p1.IPv4}, {n2p1.IPv6, n1p1.IPv6}} {
			r := get(t, c, pair[0])
			if r.Pod != n2p1.Name || addrOf(t, r.Remote) != pair[1] {
				t.Errorf("GET %v = %+v, want pod %s from %v", pair[0], r, n2p1.Name, pair[1])
			}
		}
	})
	t.Run("pod to pod UDP", func(t *testing.T) {
		n1p2 := node1.Pods[1]
		conn, err := n1p2.DialContext(ctx, "udp", netip.AddrPortFrom(n2p1.IPv4, 8080).String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		var r echoReply
		if err := json.NewDecoder(conn).Decode(&r); err != nil {
			t.Fatal(err)
		}
		if r.Pod != n2p1.Name || addrOf(t, r.Remote) != n1p2.IPv4 {
			t.Errorf("UDP reply %+v, want pod %s from %v", r, n2p1.Name, n1p2.IPv4)
		}
	})
	t.Run("prefix collision", func(t *testing.T) {
		// A second lab with the same prefix must fail without deleting the
		// first lab's namespaces.
		if l2, err := New(ctx, Config{Prefix: l.Prefix, Nodes: 1, Dir: t.TempDir()}); err == nil {
			l2.Close()
			t.Fatal("New with a used prefix succeeded")
		}
		if _, err := l.Router.Run(ctx, "true"); err != nil {
			t.Fatalf("router gone after failed New: %v", err)
		}
	})

	start = time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(start))
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, l.Prefix+"-") {
			t.Errorf("namespace left after Close: %s", line)
		}
	}
	for _, p := range procs {
		if err := syscall.Kill(p.Cmd.Process.Pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after Close (kill 0: %v)", p.Cmd.Process.Pid, err)
		}
	}
	if _, err := l.Client.Start(echo); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func buildEcho(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "echo")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/weirlb/weir/test/cmd/echo").CombinedOutput()
	if err != nil {
		t.Fatalf("go build echo: %v: %s", err, out)
	}
	return bin
}

// get GETs http://a:8080/, retrying briefly while the server starts.
func get(t *testing.T, c *http.Client, a netip.Addr) echoReply {
	t.Helper()
	url := "http://" + netip.AddrPortFrom(a, 8080).String() + "/"
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := tryGet(c, url)
		if err == nil {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tryGet(c *http.Client, url string) (echoReply, error) {
	var r echoReply
	resp, err := c.Get(url)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/json" {
		return r, errors.New("unexpected response " + resp.Status + " " + ct)
	}
	return r, json.NewDecoder(resp.Body).Decode(&r)
}

func addrOf(t *testing.T, hostport string) netip.Addr {
	t.Helper()
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		t.Fatalf("bad address %q: %v", hostport, err)
	}
	return ap.Addr().Unmap()
}

func clientAddr(dst netip.Addr) netip.Addr {
	if dst.Is4() {
		return ClientIPv4
	}
	return ClientIPv6
}
