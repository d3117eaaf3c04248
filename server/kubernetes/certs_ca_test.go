package kubernetes_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/kubernetes"
)

// TestSecretsAreIssuedFromALiveCAOnly: on a real apiserver, a weir-ca
// Secret whose CA has expired makes no certificate Secret, and the error
// names the CA's Secret and its end; a CA ending in 10 days makes
// certificates that end with it (not a year later) and verify.
func TestSecretsAreIssuedFromALiveCAOnly(t *testing.T) {
	_, kc := startCluster(t)
	ctx := context.Background()
	const day = 24 * time.Hour
	past := time.Now().Add(-400 * day)
	for _, tc := range []struct {
		ns string
		ca []certs.Option
	}{
		{"expired-ca", []certs.Option{certs.Clock(func() time.Time { return past }), certs.ValidFor(365 * day)}},
		{"ending-ca", []certs.Option{certs.ValidFor(10 * day)}},
	} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if err := certs.InitCA(dir, tc.ca...); err != nil {
			t.Fatal(err)
		}
		data := map[string][]byte{}
		for _, f := range []string{"ca.crt", "ca.key"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatal(err)
			}
			data[f] = b
		}
		if _, err := kc.CoreV1().Secrets(tc.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kubernetes.SecretCA}, Data: data}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	secretCert := func(ns, name, key string) *x509.Certificate {
		t.Helper()
		s, err := kc.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(s.Data[key])
		if b == nil {
			t.Fatalf("%s/%s: no PEM in %s", ns, name, key)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	end := past.Add(365 * day).UTC().Format(time.RFC3339)
	made, err := kubernetes.BootstrapSecrets(ctx, kc, "expired-ca", nil, nil)
	if len(made) != 0 || err == nil || !strings.Contains(err.Error(), kubernetes.SecretCA) || !strings.Contains(err.Error(), "expired at "+end) {
		t.Errorf("from an expired CA: made %v, %v; want nothing made and an error naming %s and its end %s", made, err, kubernetes.SecretCA, end)
	}
	list, err := kc.CoreV1().Secrets("expired-ca").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Errorf("the namespace of the expired CA holds %d Secrets (%v); want weir-ca alone", len(list.Items), err)
	}

	var capped []certs.Capped
	if _, err := kubernetes.BootstrapSecrets(ctx, kc, "ending-ca", nil, nil, certs.OnCapped(func(c certs.Capped) { capped = append(capped, c) })); err != nil {
		t.Fatal(err)
	}
	ca := secretCert("ending-ca", kubernetes.SecretCA, "ca.crt")
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, name := range []string{kubernetes.SecretServer, kubernetes.SecretAgent, kubernetes.SecretAdmin, kubernetes.SecretWebhook} {
		c := secretCert("ending-ca", name, "tls.crt")
		if c.NotAfter.After(ca.NotAfter) {
			t.Errorf("%s ends at %v, after its CA (%v)", name, c.NotAfter, ca.NotAfter)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if len(capped) != 4 {
		t.Errorf("told of %d certificates cut at the CA's end; want 4", len(capped))
	}
}
