package server_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/servertest"
	"github.com/weirlb/weir/test/kubeapi"
)

// TestNoAgentGetsAClusterNotListedYet: a server whose Kubernetes source
// has not listed the cluster (here it may not list Services: an RBAC rule
// a chart upgrade dropped; the same holds while a big cluster is being
// listed) holds part of the state at best, nothing on an emptyDir. It
// serves it to no agent, not even to one that accepts a stale state, as
// that part would take away the rules of every service not listed; it is
// NOT_SERVING, and its registry and status calls are refused. Once it
// may list them, the agent's first state has the cluster's services.
func TestNoAgentGetsAClusterNotListedYet(t *testing.T) {
	c, kc, _ := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := accountKubeconfig(t, ctx, c, kc, "weir", rbacv1.PolicyRule{
		APIGroups: []string{""}, Resources: []string{"nodes", "namespaces"}, Verbs: []string{"get", "list", "watch"},
	}, rbacv1.PolicyRule{
		APIGroups: []string{"discovery.k8s.io", "networking.k8s.io"}, Resources: []string{"endpointslices", "servicecidrs"}, Verbs: []string{"get", "list", "watch"},
	}, rbacv1.PolicyRule{
		APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "update", "patch"},
	})
	ts := servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: kubeconfig, Namespace: "default", Classes: kubernetes.Classes{Default: true}}
	})

	// Long enough for the source to list all it may and for the informer
	// to be refused Services a few times.
	time.Sleep(3 * time.Second)
	for _, stale := range []bool{false, true} {
		stream, err := ts.Agents.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "n1", AcceptStale: stale}}}); err != nil {
			t.Fatal(err)
		}
		msg, err := stream.Recv()
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "has not listed the cluster") {
			t.Fatalf("an agent (accept_stale %v) of a server that has not listed Services got %v, %v; want Unavailable: not listed", stale, msg, err)
		}
	}
	if h, err := healthpb.NewHealthClient(ts.Conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health before the cluster is listed: %v, %v; want NOT_SERVING", h, err)
	}
	if _, err := ts.Registry.ListServices(ctx, &weirv1.ListServicesRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("listing services before the cluster is listed: %v; want Unavailable", err)
	}

	// The missing rule comes back: the informer's next try lists.
	grant(t, ctx, kc, "weir", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}})
	eventually(t, time.Minute, func() error {
		stream, err := ts.Agents.Sync(ctx)
		if err != nil {
			return err
		}
		defer stream.CloseSend()
		if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "n1"}}}); err != nil {
			return err
		}
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		for _, s := range msg.GetUpserts() {
			if s.GetNamespace() == "default" && s.GetName() == "web" {
				return nil
			}
		}
		t.Fatalf("the first state after listing lacks default/web: %v", msg)
		return nil
	})
	if h, err := healthpb.NewHealthClient(ts.Conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health once the cluster is listed: %v, %v; want SERVING", h, err)
	}
}

// accountKubeconfig makes service account name in default with a
// ClusterRole of rules (named after it) bound to it, and returns a
// kubeconfig of c with its token.
func accountKubeconfig(t *testing.T, ctx context.Context, c *kubeapi.Cluster, kc clientset.Interface, name string, rules ...rbacv1.PolicyRule) string {
	t.Helper()
	if _, err := kc.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grant(t, ctx, kc, name, rules...)
	tr, err := kc.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubeapi.WriteKubeconfig(path, c.Host, c.CAFile, tr.Status.Token); err != nil {
		t.Fatal(err)
	}
	return path
}

// grant binds a new ClusterRole of rules to service account default/name.
func grant(t *testing.T, ctx context.Context, kc clientset.Interface, name string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	role, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"}, Rules: rules}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
