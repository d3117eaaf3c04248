package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"

	"github.com/weirlb/weir/server/certs"
)

// The Secrets the manifests mount, and the CA they are issued from.
const (
	SecretCA     = "weir-ca"         // ca.crt, ca.key
	SecretServer = "weir-server-tls" // ca.crt, tls.crt, tls.key
	SecretAgent  = "weir-agent-tls"  // ca.crt, tls.crt, tls.key: the fleet certificate (certs.FleetAgentName)
	SecretAdmin  = "weir-admin-tls"  // ca.crt, tls.crt, tls.key: lbctl's, role admin
	// SecretWebhook is the admission webhook's certificate, for the
	// Service weir-webhook.
	SecretWebhook = "weir-webhook-tls" // ca.crt, tls.crt, tls.key
	// WebhookConfiguration is the ValidatingWebhookConfiguration that
	// sends weir.dev objects to the server; its caBundle is the webhook
	// Secret's ca.crt.
	WebhookConfiguration = "weir.dev"
)

// BootstrapSecrets makes, in namespace, each of the Secrets above that is
// missing: the CA first (or the one weir-ca holds), then the server's
// certificate for the Service weir-server's in-cluster names, localhost
// (kubectl port-forward) and extra hosts, the agents' fleet certificate
// and an admin certificate for lbctl. The certificates' Secrets are of
// type kubernetes.io/tls, with the keys cert-manager writes. A Secret that
// exists is never changed, so running it again (each server pod's start)
// changes nothing, and certificates made by hand or by cert-manager are
// kept. Runs at once (replicas starting together) agree: each Secret is
// made by the one whose create wins, and a run that loses weir-ca's
// issues from the winner's CA, so every certificate verifies against
// weir-ca. The Secrets made name owner, when given, as their owner: the
// garbage collector deletes them with it (an uninstall). It returns the
// names of the Secrets it made. Certificates are issued as certs issues
// them (opts), from a valid CA only and to end no later than it.
func BootstrapSecrets(ctx context.Context, client clientset.Interface, namespace string, extraHosts []string, owner *metav1.OwnerReference, opts ...certs.Option) ([]string, error) {
	missing, err := missingSecrets(ctx, client, namespace)
	if err != nil {
		return nil, err
	}
	if len(missing) == 0 {
		return nil, caBundle(ctx, client, namespace)
	}
	dir, err := os.MkdirTemp("", "weir-certs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	secrets := secretMaker{client: client, namespace: namespace, owner: owner}
	var made []string
	madeCA, err := secrets.loadCA(ctx, dir)
	if err != nil {
		return nil, err
	}
	if madeCA {
		made = append(made, SecretCA)
	}
	for _, s := range issuedSecrets(dir, namespace, extraHosts, opts) {
		if !missing[s.secret] {
			continue
		}
		if err := s.make(); err != nil {
			return made, fmt.Errorf("the Secret %s/%s from the CA of %s: %w", namespace, s.secret, SecretCA, err)
		}
		data, err := files(dir, s.files)
		if err != nil {
			return made, err
		}
		created, err := secrets.create(ctx, s.secret, corev1.SecretTypeTLS, data)
		if err != nil {
			return made, err
		}
		// Not created: another run made it meanwhile, from the same CA.
		if created {
			made = append(made, s.secret)
		}
	}
	return made, caBundle(ctx, client, namespace)
}

// ServiceAccountOwner is the owner reference of the ServiceAccount
// namespace/name, for BootstrapSecrets.
func ServiceAccountOwner(ctx context.Context, client clientset.Interface, namespace, name string) (*metav1.OwnerReference, error) {
	sa, err := client.CoreV1().ServiceAccounts(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the ServiceAccount %s/%s that owns the certificate Secrets: %w", namespace, name, err)
	}
	return &metav1.OwnerReference{APIVersion: "v1", Kind: "ServiceAccount", Name: sa.Name, UID: sa.UID}, nil
}

// missingSecrets are the certificates' Secrets namespace lacks.
func missingSecrets(ctx context.Context, client clientset.Interface, namespace string) (map[string]bool, error) {
	missing := map[string]bool{}
	for _, name := range []string{SecretServer, SecretAgent, SecretAdmin, SecretWebhook} {
		_, err := client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			missing[name] = true
		case err != nil:
			return nil, err
		}
	}
	return missing, nil
}

// loadCA writes the CA that weir-ca holds into dir or, without that
// Secret, makes a new CA there and the Secret, and says so. When another
// run makes weir-ca first, its CA replaces the one made here.
func (m secretMaker) loadCA(ctx context.Context, dir string) (bool, error) {
	ca, err := m.client.CoreV1().Secrets(m.namespace).Get(ctx, SecretCA, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		made, makeErr := m.makeCA(ctx, dir)
		if made || makeErr != nil {
			return made, makeErr
		}
		// Another run made weir-ca first: its CA signs, not this one.
		ca, err = m.client.CoreV1().Secrets(m.namespace).Get(ctx, SecretCA, metav1.GetOptions{})
	}
	if err != nil {
		return false, err
	}
	for _, f := range []string{"ca.crt", "ca.key"} {
		if len(ca.Data[f]) == 0 {
			return false, fmt.Errorf("the Secret %s/%s has no %s", m.namespace, SecretCA, f)
		}
		if err := os.WriteFile(filepath.Join(dir, f), ca.Data[f], 0o600); err != nil {
			return false, err
		}
	}
	return false, nil
}

// makeCA makes a new CA in dir and, unless another run made one first,
// the Secret weir-ca of it; it reports whether it did.
func (m secretMaker) makeCA(ctx context.Context, dir string) (bool, error) {
	if err := certs.InitCA(dir); err != nil {
		return false, err
	}
	data, err := files(dir, map[string]string{"ca.crt": "ca.crt", "ca.key": "ca.key"})
	if err != nil {
		return false, err
	}
	return m.create(ctx, SecretCA, corev1.SecretTypeOpaque, data)
}

// issuedSecret is a certificate's Secret: how to issue it from the CA in
// dir, and the files that make its data.
type issuedSecret struct {
	secret string
	make   func() error
	files  map[string]string // key in the Secret: file in dir
}

// issuedSecrets are the certificates' Secrets, in the order they are
// made: the server's, the agents', the admin's and the webhook's.
func issuedSecrets(dir, namespace string, extraHosts []string, opts []certs.Option) []issuedSecret {
	return []issuedSecret{
		{SecretServer, func() error {
			hosts := []string{"weir-server", "weir-server." + namespace, "weir-server." + namespace + ".svc", "weir-server." + namespace + ".svc.cluster.local",
				"localhost", "127.0.0.1", "::1"}
			return certs.IssueServer(dir, append(hosts, extraHosts...), opts...)
		}, map[string]string{"ca.crt": "ca.crt", "tls.crt": "server.crt", "tls.key": "server.key"}},
		{SecretAgent, func() error { return certs.IssueClient(dir, certs.FleetAgentName, certs.RoleAgent, opts...) },
			map[string]string{"ca.crt": "ca.crt", "tls.crt": certs.FleetAgentName + ".crt", "tls.key": certs.FleetAgentName + ".key"}},
		{SecretAdmin, func() error { return certs.IssueClient(dir, "admin", certs.RoleAdmin, opts...) },
			map[string]string{"ca.crt": "ca.crt", "tls.crt": "admin.crt", "tls.key": "admin.key"}},
		{SecretWebhook, func() error {
			// A server certificate too: its own folder, not to replace
			// the gRPC server's.
			wdir := filepath.Join(dir, "webhook")
			if err := os.Mkdir(wdir, 0o700); err != nil {
				return err
			}
			for _, f := range []string{"ca.crt", "ca.key"} {
				if err := os.Link(filepath.Join(dir, f), filepath.Join(wdir, f)); err != nil {
					return err
				}
			}
			return certs.IssueServer(wdir, []string{"weir-webhook." + namespace + ".svc", "weir-webhook." + namespace + ".svc.cluster.local"}, opts...)
		}, map[string]string{"ca.crt": "ca.crt", "tls.crt": "webhook/server.crt", "tls.key": "webhook/server.key"}},
	}
}

// caBundle makes the ValidatingWebhookConfiguration trust the webhook
// Secret's CA, where it does not yet; without the configuration (the
// Secrets made outside the manifests) there is nothing to do.
func caBundle(ctx context.Context, client clientset.Interface, namespace string) error {
	sec, err := client.CoreV1().Secrets(namespace).Get(ctx, SecretWebhook, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ca := sec.Data["ca.crt"]
	if len(ca) == 0 {
		return fmt.Errorf("the Secret %s/%s has no ca.crt for the webhook's caBundle", namespace, SecretWebhook)
	}
	vwcs := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	// Replicas starting together write the same bundle: the one that
	// loses a write reads it again and finds nothing left to do.
	return retryOnConflict(func() error {
		vwc, err := vwcs.Get(ctx, WebhookConfiguration, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		changed := false
		for i := range vwc.Webhooks {
			if cc := &vwc.Webhooks[i].ClientConfig; cc.Service != nil && cc.Service.Namespace == namespace && !bytes.Equal(cc.CABundle, ca) {
				cc.CABundle, changed = ca, true
			}
		}
		if changed {
			_, err = vwcs.Update(ctx, vwc, metav1.UpdateOptions{})
		}
		return err
	})
}

// files reads dir's files into a Secret's data.
func files(dir string, names map[string]string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for key, file := range names {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return nil, err
		}
		out[key] = b
	}
	return out, nil
}

// secretMaker makes the Secrets of namespace, owned by owner (nil:
// none).
type secretMaker struct {
	client    clientset.Interface
	namespace string
	owner     *metav1.OwnerReference
}

// create makes a Secret, and reports whether it did: one made meanwhile
// by another run is kept, and is no error.
func (m secretMaker) create(ctx context.Context, name string, typ corev1.SecretType, data map[string][]byte) (bool, error) {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "weir"}},
		Type:       typ,
		Data:       data,
	}
	if m.owner != nil {
		s.OwnerReferences = []metav1.OwnerReference{*m.owner}
	}
	_, err := m.client.CoreV1().Secrets(m.namespace).Create(ctx, s, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("creating the Secret %s/%s: %w", m.namespace, name, err)
	}
	return true, nil
}
