package kubernetes_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/servertest"
)

// TestSecretsAreBootstrappedOnce: on a real apiserver, the certificate
// Secrets the manifests mount are made from one CA, with the names agents
// and lbctl reach the server by; a server serving with them lets the admin
// certificate write and not the agents'; a second run changes nothing, a
// Secret made by hand (or by cert-manager) is kept, a lost one is made
// again from the same CA.
func TestSecretsAreBootstrappedOnce(t *testing.T) {
	_, kc := startCluster(t)
	ctx := context.Background()
	const ns = "weir-system"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The admin certificate is the operator's own.
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kubernetes.SecretAdmin}, Data: map[string][]byte{"tls.crt": []byte("mine")}}
	// (Opaque: a kubernetes.io/tls Secret must hold a key too.)
	if _, err := kc.CoreV1().Secrets(ns).Create(ctx, mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The webhook's configuration, as the manifests ship it: no caBundle.
	path := kubernetes.AdmissionPath
	none := admissionregistrationv1.SideEffectClassNone
	if _, err := kc.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: kubernetes.WebhookConfiguration},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "validate.weir.dev", SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: "weir-webhook", Path: &path}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	made, err := kubernetes.BootstrapSecrets(ctx, kc, ns, []string{"weir.example.internal", "192.0.2.2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{kubernetes.SecretCA, kubernetes.SecretServer, kubernetes.SecretAgent, kubernetes.SecretWebhook}; !slices.Equal(made, want) {
		t.Errorf("made %v, want %v", made, want)
	}
	get := func(name string) *corev1.Secret {
		s, err := kc.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cert := func(pemBytes []byte) *x509.Certificate {
		b, _ := pem.Decode(pemBytes)
		if b == nil {
			t.Fatal("no PEM block")
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert(get(kubernetes.SecretCA).Data["ca.crt"]))
	webhook := get(kubernetes.SecretWebhook)
	if _, err := cert(webhook.Data["tls.crt"]).Verify(x509.VerifyOptions{Roots: roots, DNSName: "weir-webhook.weir-system.svc"}); err != nil {
		t.Errorf("the webhook's certificate for weir-webhook.weir-system.svc: %v", err)
	}
	vwc, err := kc.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, kubernetes.WebhookConfiguration, metav1.GetOptions{})
	if err != nil || string(vwc.Webhooks[0].ClientConfig.CABundle) != string(webhook.Data["ca.crt"]) {
		t.Errorf("the webhook configuration's caBundle is not the webhook's CA: %v", err)
	}
	server := get(kubernetes.SecretServer)
	for _, host := range []string{"weir-server.weir-system.svc", "weir-server", "localhost", "weir.example.internal", "192.0.2.2"} {
		if _, err := cert(server.Data["tls.crt"]).Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
			t.Errorf("the server's certificate for %s: %v", host, err)
		}
	}
	agent := get(kubernetes.SecretAgent)
	ac := cert(agent.Data["tls.crt"])
	if _, err := ac.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil ||
		ac.Subject.CommonName != certs.FleetAgentName || !slices.Contains(ac.Subject.Organization, certs.RolePrefix+certs.RoleAgent) {
		t.Errorf("the agents' certificate: %v, subject %v", err, ac.Subject)
	}
	if len(agent.Data["tls.key"]) == 0 || len(server.Data["tls.key"]) == 0 || string(agent.Data["ca.crt"]) != string(server.Data["ca.crt"]) {
		t.Error("a key is missing, or the Secrets carry different CAs")
	}
	if server.Type != corev1.SecretTypeTLS || agent.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret types %s and %s; want %s, as cert-manager makes them", server.Type, agent.Type, corev1.SecretTypeTLS)
	}
	if got := get(kubernetes.SecretAdmin); string(got.Data["tls.crt"]) != "mine" {
		t.Error("the operator's own admin Secret was replaced")
	}

	// The server serves with its Secret; lbctl's certificate may write,
	// the agents' may not.
	dir := t.TempDir()
	for file, data := range map[string][]byte{
		"ca.crt": server.Data["ca.crt"], "server.crt": server.Data["tls.crt"], "server.key": server.Data["tls.key"],
		"agent.crt": agent.Data["tls.crt"], "agent.key": agent.Data["tls.key"],
	} {
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ts := servertest.Start(t, t.TempDir(), servertest.TLS(t, dir))
	pool := &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/28"}}
	asAgent := weirv1.NewRegistryServiceClient(servertest.Dial(t, ts.Addr, dir, "agent"))
	if _, err := asAgent.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: pool}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the agents' certificate writes a pool: %v; want PermissionDenied", err)
	}
	if err := kc.CoreV1().Secrets(ns).Delete(ctx, kubernetes.SecretAdmin, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if made, err := kubernetes.BootstrapSecrets(ctx, kc, ns, nil, nil); err != nil || !slices.Equal(made, []string{kubernetes.SecretAdmin}) {
		t.Fatalf("with the operator's admin Secret gone: made %v, %v", made, err)
	}
	adminSecret := get(kubernetes.SecretAdmin)
	for file, data := range map[string][]byte{"admin.crt": adminSecret.Data["tls.crt"], "admin.key": adminSecret.Data["tls.key"]} {
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	asAdmin := weirv1.NewRegistryServiceClient(servertest.Dial(t, ts.Addr, dir, "admin"))
	if _, err := asAdmin.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: pool}); err != nil {
		t.Errorf("the admin certificate cannot write a pool: %v", err)
	}

	before := map[string]string{}
	for _, n := range made {
		before[n] = get(n).ResourceVersion
	}
	again, err := kubernetes.BootstrapSecrets(ctx, kc, ns, nil, nil)
	if err != nil || len(again) != 0 {
		t.Errorf("second run made %v, %v; want nothing", again, err)
	}
	for n, rv := range before {
		if got := get(n).ResourceVersion; got != rv {
			t.Errorf("the second run changed %s", n)
		}
	}
	// A lost Secret is made again from the same CA.
	if err := kc.CoreV1().Secrets(ns).Delete(ctx, kubernetes.SecretAgent, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if made, err := kubernetes.BootstrapSecrets(ctx, kc, ns, nil, nil); err != nil || !slices.Equal(made, []string{kubernetes.SecretAgent}) {
		t.Fatalf("after losing the agents' Secret: made %v, %v", made, err)
	}
	if _, err := cert(get(kubernetes.SecretAgent).Data["tls.crt"]).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the agents' new certificate is not from the same CA: %v", err)
	}
}
