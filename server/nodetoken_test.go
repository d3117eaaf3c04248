package server_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"

	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/servertest"
)

// An agent on the shared certificate that presents its pod's
// service-account token (the DaemonSet's projected volume) acts for the
// node the token names and for no other, as kube-apiserver's
// NodeRestriction binds a kubelet; without a token, with a token for
// another audience or of another service account, it is refused. Against a
// real apiserver: its TokenReview decides.
func TestAnAgentActsForTheNodeItsTokenNames(t *testing.T) {
	c, kc, _ := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, sa := range []string{"weir-agent", "other"} {
		if _, err := kc.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"node1", "node2"} {
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dir := servertest.PKI(t)
	ts := servertest.Start(t, t.TempDir(), servertest.TLS(t, dir), func(cfg *server.Config) {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default"}
		cfg.SharedAgentCertificateNeedsToken = true
	})
	admin := weirv1.NewRegistryServiceClient(servertest.Dial(t, ts.Addr, dir, "alice"))
	eventually(t, 15*time.Second, func() error {
		_, err := admin.GetNode(ctx, &weirv1.GetNodeRequest{Name: "node2"})
		return err
	})

	node1Token := podToken(t, ctx, kc, "weir-agent", "agent-1", "node1", kubernetes.DefaultAgentTokenAudience)
	agent := func(token string) weirv1.AgentServiceClient {
		t.Helper()
		src, err := tlsconfig.Load(tlsconfig.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, certs.FleetAgentName+".crt"), Key: filepath.Join(dir, certs.FleetAgentName+".key")}, tlsconfig.Options{Use: "agent"})
		if err != nil {
			t.Fatal(err)
		}
		var opts []dial.Option
		if token != "" {
			file := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
				t.Fatal(err)
			}
			opts = append(opts, dial.WithNodeToken(file))
		}
		conn, err := dial.NewServers(ts.Addr, src, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return weirv1.NewAgentServiceClient(conn)
	}
	sync := func(a weirv1.AgentServiceClient, node string) error {
		s, err := a.Sync(ctx)
		if err != nil {
			return err
		}
		// A Send after the server ended the stream fails with io.EOF; the
		// status it ended it with comes from Recv, as for an agent.
		if err := s.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: node}}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = s.Recv()
		return err
	}

	node1 := agent(node1Token)
	if err := sync(node1, "node1"); err != nil {
		t.Fatalf("the agent on node1 with its token, streaming node1: %v", err)
	}
	if err := sync(node1, "node2"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the agent on node1 with its token, streaming node2: got %v, want PermissionDenied", err)
	}
	if _, err := openLeases(ctx, node1, "node2"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the agent on node1 with its token, opening node2's lease stream: got %v, want PermissionDenied", err)
	}
	for _, tc := range []struct {
		what, token string
	}{
		{"no token", ""},
		{"a token for the API server's audience", podToken(t, ctx, kc, "weir-agent", "agent-2", "node2", "")},
		{"a token of another service account", podToken(t, ctx, kc, "other", "intruder", "node2", kubernetes.DefaultAgentTokenAudience)},
		{"no token at all, but garbage", "not-a-token"},
	} {
		if err := sync(agent(tc.token), "node2"); status.Code(err) != codes.Unauthenticated {
			t.Errorf("the shared certificate with %s: got %v, want Unauthenticated", tc.what, err)
		}
	}
}

// podToken makes a pod of account on node and returns a token of account
// bound to it, for audience ("" for the API server's).
func podToken(t *testing.T, ctx context.Context, kc clientset.Interface, account, pod, node, audience string) string {
	t.Helper()
	p, err := kc.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: account, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "agent", Image: "weir/weir-agent:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	tr, err := kc.CoreV1().ServiceAccounts("default").CreateToken(ctx, account, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
