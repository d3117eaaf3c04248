// Package etcdcluster runs a real etcd cluster of one or more members on
// loopback for tests: members can be killed and restarted, and
// everything is removed by Close.
package etcdcluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/weirlb/weir/test/testproc"
)

// Member is one etcd process.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	dir       string
	bin       string
	cluster   string   // --initial-cluster
	tls       []string // the client TLS flags, if clients must use TLS
	proc      *testproc.Process
}

// TLS makes members serve clients over TLS with certFile and keyFile, and
// require client certificates signed by caFile.
type TLS struct{ CAFile, CertFile, KeyFile string }

// Cluster is N members on 127.0.0.1.
type Cluster struct {
	Members []*Member
	Dir     string
}

// Start starts n members under a new temporary directory and returns once
// every member is healthy. The caller must call Close.
func Start(ctx context.Context, n int) (*Cluster, error) { return StartTLS(ctx, n, nil) }

// StartTLS is Start with clients on TLS (peers stay in plain text, on
// loopback).
func StartTLS(ctx context.Context, n int, tls *TLS) (_ *Cluster, err error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "weir-etcd-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	ports, err := testproc.FreePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var initial []string
	for i := range n {
		scheme := "http"
		if tls != nil {
			scheme = "https"
		}
		m := &Member{
			Name:      "m" + strconv.Itoa(i),
			ClientURL: scheme + "://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			PeerURL:   "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
			dir:       dir,
			bin:       bin,
		}
		if tls != nil {
			m.tls = []string{"--cert-file=" + tls.CertFile, "--key-file=" + tls.KeyFile, "--trusted-ca-file=" + tls.CAFile, "--client-cert-auth"}
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range c.Members {
		m.cluster = strings.Join(initial, ",")
		if err := m.start("new"); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, m := range c.Members {
		if err := m.waitHealthy(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// waitHealthy waits for the member to answer: /health, or with TLS (where
// /health needs a client certificate) its client port.
func (m *Member) waitHealthy(ctx context.Context) error {
	if m.tls == nil {
		return m.proc.WaitFor(ctx, func() bool { return Healthy(ctx, m.ClientURL) })
	}
	return m.proc.WaitFor(ctx, func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(m.ClientURL, "https://"), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (m *Member) start(state string) error {
	p, err := testproc.Start(m.dir, m.Name, m.bin, append([]string{
		"--name=" + m.Name,
		"--data-dir=" + m.DataDir(),
		"--listen-client-urls=" + m.ClientURL,
		"--advertise-client-urls=" + m.ClientURL,
		"--listen-peer-urls=" + m.PeerURL,
		"--initial-advertise-peer-urls=" + m.PeerURL,
		"--initial-cluster=" + m.cluster,
		"--initial-cluster-state=" + state,
		"--initial-cluster-token=weir-test",
		// Fast elections: a lab on loopback, not a WAN.
		"--heartbeat-interval=50",
		"--election-timeout=500",
		"--logger=zap",
	}, m.tls...)...)
	if err != nil {
		return err
	}
	m.proc = p
	return nil
}

// Kill stops the member with SIGKILL.
func (m *Member) Kill() { m.proc.Kill() }

// Restart starts a killed member again on its data.
func (m *Member) Restart(ctx context.Context) error {
	if !m.proc.Exited() {
		return fmt.Errorf("etcd member %s is running", m.Name)
	}
	if err := m.start("existing"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return m.waitHealthy(ctx)
}

// DataDir is the member's --data-dir: copied while the member is
// stopped, it is a backup; copied back, a restore that keeps the
// cluster's identity.
func (m *Member) DataDir() string { return filepath.Join(m.dir, m.Name) }

// Pid is the member's process ID.
func (m *Member) Pid() int { return m.proc.Pid() }

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// Close stops every member and removes the directory.
func (c *Cluster) Close() error {
	for _, m := range c.Members {
		if m.proc != nil && !m.proc.Exited() {
			m.proc.Stop(5 * time.Second)
		}
	}
	return os.RemoveAll(c.Dir)
}
