package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/servertest"
	"github.com/weirlb/weir/server/webhook"
	"github.com/weirlb/weir/server/webhook/webhooktest"
)

// TestAdmissionWebhookAnswersOnlyTheAPIServer: kube-apiserver, given an
// AdmissionConfiguration whose kubeconfig presents a client certificate
// for the webhook's host, reaches the webhook served as weir-server
// serves it with --webhook-client-ca-file and --webhook-client-names, and
// a pool overlapping another is refused with the server's message. A
// caller without that certificate, or with another the CA signed, is
// refused at TLS and learns nothing of the registry. Slow large bodies,
// from callers without the certificate and even with it, hold a bounded
// part of the server's heap, and the apiserver is answered after them.
func TestAdmissionWebhookAnswersOnlyTheAPIServer(t *testing.T) {
	// The webhook's address first: the apiserver's kubeconfig names it.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	dir := t.TempDir()
	serving, clients := filepath.Join(dir, "serving"), filepath.Join(dir, "clients")
	for _, d := range []string{serving, clients} {
		if err := certs.InitCA(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := certs.IssueServer(serving, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kube-apiserver", "someone-else"} {
		if err := certs.IssueClient(clients, name, certs.RoleViewer); err != nil {
			t.Fatal(err)
		}
	}
	// As docs/operations.md tells an operator: a kubeconfig whose user is
	// named after the webhook's host (its Service's DNS name in a
	// cluster), and an AdmissionConfiguration that points at it.
	webhookKubeconfig, admissionConfig := filepath.Join(dir, "webhook-kubeconfig.yaml"), filepath.Join(dir, "admission.yaml")
	writeFile(t, webhookKubeconfig, fmt.Sprintf("apiVersion: v1\nkind: Config\nusers:\n- name: %q\n  user:\n    client-certificate: %s\n    client-key: %s\n",
		lis.Addr().String(), filepath.Join(clients, "kube-apiserver.crt"), filepath.Join(clients, "kube-apiserver.key")))
	writeFile(t, admissionConfig, "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: ValidatingAdmissionWebhook\n  configuration:\n"+
		"    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: "+webhookKubeconfig+"\n")
	c, kc, dyn := startKube(t, "--admission-control-config-file="+admissionConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	ts := servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default"}
	})

	src, err := tlsconfig.Load(tlsconfig.Files{Cert: filepath.Join(serving, "server.crt"), Key: filepath.Join(serving, "server.key"), CA: filepath.Join(clients, "ca.crt")}, tlsconfig.Options{Use: "webhook"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(kubernetes.AdmissionPath, ts.Server.Admission())
	wh, err := webhook.New(mux, webhook.Config{TLS: src, ClientNames: []string{"kube-apiserver"}})
	if err != nil {
		t.Fatal(err)
	}
	serveCtx, stopServing := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- wh.Serve(serveCtx, lis) }()
	defer func() {
		stopServing()
		if err := <-served; err != nil {
			t.Errorf("the webhook: %v", err)
		}
	}()
	servingCA, err := os.ReadFile(filepath.Join(serving, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	registerWebhook(t, ctx, kc, lis.Addr().String(), servingCA)

	create := func(doc string, dryRun bool) error {
		return createDoc(t, ctx, dyn, v1alpha1.AddressPools, doc, dryRun)
	}
	const overlap, want = "apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: overlap\nspec:\n  addresses: [203.0.113.8-203.0.113.20]\n",
		"spec.addresses[0]: 203.0.113.8-203.0.113.20 overlaps pool public"
	// The apiserver learns of the webhook within a moment: the first pool
	// passes once it is answered (failurePolicy Fail).
	eventually(t, 30*time.Second, func() error {
		return create("apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: public\nspec:\n  addresses: [203.0.113.0/28]\n", false)
	})
	eventually(t, 15*time.Second, func() error {
		_, err := ts.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "public"})
		return err
	})
	refused := func() error {
		if err := create(overlap, true); err == nil || !strings.Contains(err.Error(), want) {
			return fmt.Errorf("a pool overlapping another: %v; want a refusal with %q", err, want)
		}
		return nil
	}
	eventually(t, 15*time.Second, refused)

	// Another caller, on the same address, is refused at TLS whatever it
	// sends: no certificate, or one the CA signed for another name.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(servingCA)
	someone, err := tls.LoadX509KeyPair(filepath.Join(clients, "someone-else.crt"), filepath.Join(clients, "someone-else.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		want  string
	}{
		{"no certificate", nil, "certificate required"},
		{"another name the CA signed", []tls.Certificate{someone}, "bad certificate"},
	} {
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: tc.certs}}}
		resp, err := client.Post("https://"+lis.Addr().String()+kubernetes.AdmissionPath, "application/json", strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","kind":{"group":"weir.dev","version":"v1alpha1","kind":"WeirAddressPool"},"object":{"metadata":{"name":"probe"},"spec":{"addresses":["203.0.113.8/29"]}}}}`))
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: answered %s; want the handshake refused", tc.name, resp.Status)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want the handshake refused (%s)", tc.name, err, tc.want)
		}
		client.CloseIdleConnections()
	}

	// Slow large bodies: from callers without the certificate (each
	// refused at once), then with the apiserver's own (bounded as any).
	apiserver, err := tls.LoadX509KeyPair(filepath.Join(clients, "kube-apiserver.crt"), filepath.Join(clients, "kube-apiserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	attack := webhooktest.SlowBodies{Addr: lis.Addr().String(), Path: kubernetes.AdmissionPath,
		Conns: 150, Sources: 30, BodyBytes: 4 << 20, Chunk: 8 << 10, Every: 125 * time.Millisecond,
		TLS: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, For: 10 * time.Second}
	// Without the certificate every connection is refused once its
	// handshake ends: the server reads nothing of its review.
	out := attack.Run()
	t.Logf("without the certificate: %v", out)
	if out.ClosedByServer != int64(attack.Conns) || out.Longest > time.Second || out.HeapPeak > out.HeapBefore+8<<20 {
		t.Errorf("without the certificate: %v; want every connection refused within a second, the heap grown by less than 8 MiB", out)
	}
	attack.TLS.Certificates, attack.For = []tls.Certificate{apiserver}, 30*time.Second
	out = attack.Run()
	t.Logf("with the apiserver's certificate: %v", out)
	if err := out.Bounded(webhook.DefaultMaxConnections, 2*kubernetes.MaxReviewBytes, webhook.ReadTimeout+2*time.Second); err != nil {
		t.Errorf("with the apiserver's certificate: %v", err)
	}
	eventually(t, 30*time.Second, refused)
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
