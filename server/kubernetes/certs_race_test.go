package kubernetes_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"

	"github.com/weirlb/weir/server/kubernetes"
)

// TestReplicasBootstrapTheSameCA: on a real apiserver, three server
// replicas starting at once each bootstrap the certificate Secrets (their
// init containers do): every run succeeds, each Secret is made by one of
// them, and every certificate verifies against the CA that weir-ca holds,
// whoever lost the race to make it.
func TestReplicasBootstrapTheSameCA(t *testing.T) {
	_, kc := startCluster(t)
	ctx := context.Background()
	const replicas = 3
	for round := range 4 {
		ns := fmt.Sprintf("race-%d", round)
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		made := make([][]string, replicas)
		errs := make([]error, replicas)
		start := make(chan struct{})
		for i := range replicas {
			wg.Go(func() {
				<-start
				made[i], errs[i] = kubernetes.BootstrapSecrets(ctx, kc, ns, nil, nil)
			})
		}
		close(start)
		wg.Wait()
		var all []string
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s: replica %d: %v", ns, i, err)
			}
			all = append(all, made[i]...)
		}
		slices.Sort(all)
		want := []string{kubernetes.SecretAdmin, kubernetes.SecretAgent, kubernetes.SecretCA, kubernetes.SecretServer, kubernetes.SecretWebhook}
		slices.Sort(want)
		if !slices.Equal(all, want) {
			t.Errorf("%s: the replicas made %v together; want each Secret once, %v", ns, all, want)
		}
		checkSignedByWeirCA(t, kc, ns)
	}
}

// checkSignedByWeirCA fails unless every certificate Secret of ns
// carries weir-ca's certificate as ca.crt and a certificate that CA
// signed.
func checkSignedByWeirCA(t *testing.T, kc clientset.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	ca, err := kc.CoreV1().Secrets(ns).Get(ctx, kubernetes.SecretCA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.Data["ca.crt"]) {
		t.Fatalf("%s/%s holds no CA certificate", ns, kubernetes.SecretCA)
	}
	for _, name := range []string{kubernetes.SecretServer, kubernetes.SecretAgent, kubernetes.SecretAdmin, kubernetes.SecretWebhook} {
		s, err := kc.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s/%s: %v", ns, name, err)
			continue
		}
		b, _ := pem.Decode(s.Data["tls.crt"])
		if b == nil {
			t.Errorf("%s/%s: no certificate", ns, name)
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("%s/%s is not signed by the CA of %s: %v", ns, name, kubernetes.SecretCA, err)
		}
		if string(s.Data["ca.crt"]) != string(ca.Data["ca.crt"]) {
			t.Errorf("%s/%s carries a ca.crt that is not %s's", ns, name, kubernetes.SecretCA)
		}
	}
}
