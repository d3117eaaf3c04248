package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/servertest"
	"github.com/weirlb/weir/server/store"
	"github.com/weirlb/weir/test/wait"
)

// TestOverlappingPoolsTheOlderWinsOnEveryReplica: two pools over the same
// addresses got into the cluster (an admission webhook failing open lets
// them). Every server holds the one made first and refuses the other,
// saying so in both pools' Accepted conditions, whatever it held before:
// one starting on an empty store (a pod's emptyDir), one restarted with
// its store, one whose store holds the younger pool, two at once. The
// names are chosen both ways round, so neither the order the informer
// lists them in nor a tie broken by name can pass for the rule.
func TestOverlappingPoolsTheOlderWinsOnEveryReplica(t *testing.T) {
	setDuring(t, &kubernetes.RetryPeriod, 200*time.Millisecond)
	c, _, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	kube := func(cfg *server.Config) {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default", Classes: kubernetes.Classes{Default: true}}
	}
	for _, tc := range []struct{ older, younger string }{{"zz-old", "aa-new"}, {"aa-old", "zz-new"}} {
		t.Run(tc.older+" first", func(t *testing.T) {
			older := createPool(t, ctx, dyn, tc.older, "203.0.113.0/28")
			// Creation times are whole seconds: the younger is made in a later one.
			time.Sleep(1100 * time.Millisecond)
			younger := createPool(t, ctx, dyn, tc.younger, "203.0.113.8/29")
			t.Cleanup(func() {
				for _, name := range []string{tc.older, tc.younger} {
					dyn.Resource(v1alpha1.AddressPools).Delete(context.Background(), name, metav1.DeleteOptions{})
				}
			})
			holdsTheOlder := func(ts *servertest.Server) func() error {
				return func() error { return olderHeld(ctx, dyn, ts, older, younger) }
			}

			dir := t.TempDir()
			empty := servertest.Start(t, dir, kube)
			eventually(t, 30*time.Second, holdsTheOlder(empty))
			empty.Stop()

			restarted := servertest.Start(t, dir, kube)
			eventually(t, 30*time.Second, holdsTheOlder(restarted))
			restarted.Stop()

			// A store that holds the younger pool, as a server that took it
			// kept it.
			seeded := t.TempDir()
			seedPool(t, seeded, younger, "203.0.113.8/29")
			kept := servertest.Start(t, seeded, kube)
			eventually(t, 30*time.Second, holdsTheOlder(kept))
			kept.Stop()

			one, two := servertest.Start(t, t.TempDir(), kube), servertest.Start(t, t.TempDir(), kube)
			eventually(t, 30*time.Second, func() error {
				if err := olderHeld(ctx, dyn, one, older, younger); err != nil {
					return fmt.Errorf("replica one: %w", err)
				}
				return olderHeld(ctx, dyn, two, older, younger)
			})
		})
	}
}

// TestServicesAskingOneAddressTheOldestGetsIt: LoadBalancer Services
// ask for the same address of a pool; every server, on an empty store or
// its own kept, gives it to the one made first (names both ways round, as
// above) and none to the others. The younger are many, so that a server
// which assigned before it had listed them all (the younger listed first)
// would be caught giving the address to one of them.
func TestServicesAskingOneAddressTheOldestGetsIt(t *testing.T) {
	c, kc, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	kube := func(cfg *server.Config) {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default", Classes: kubernetes.Classes{Default: true}}
	}
	createPool(t, ctx, dyn, "lb", "198.51.100.0/28")
	for _, tc := range []struct{ older, younger string }{{"zz-old", "aa-new"}, {"aa-old", "zz-new"}} {
		t.Run(tc.older+" first", func(t *testing.T) {
			younger := make([]string, 200)
			for i := range younger {
				younger[i] = fmt.Sprintf("%s-%03d", tc.younger, i)
			}
			names := append([]string{tc.older}, younger...)
			create := func(name string) error {
				_, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kubernetes.AnnotationLoadBalancerIPs: "198.51.100.5"}},
					Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}},
				}, metav1.CreateOptions{})
				return err
			}
			if err := create(tc.older); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1100 * time.Millisecond) // the younger in a later second
			var g errgroup.Group
			g.SetLimit(8)
			for _, name := range younger {
				g.Go(func() error { return create(name) })
			}
			if err := g.Wait(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				var g errgroup.Group
				g.SetLimit(8)
				for _, name := range names {
					g.Go(func() error {
						return kc.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{})
					})
				}
				g.Wait()
			})
			olderHasIt := func() error {
				list, err := kc.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				seen := 0
				for _, s := range list.Items {
					name := s.Name
					if !slices.Contains(names, name) {
						continue
					}
					seen++
					var got []string
					for _, in := range s.Status.LoadBalancer.Ingress {
						got = append(got, in.IP)
					}
					want := "[]"
					if name == tc.older {
						want = "[198.51.100.5]"
					}
					if fmt.Sprint(got) != want {
						return fmt.Errorf("service %s has %v; want %s", name, got, want)
					}
				}
				if seen != len(names) {
					return fmt.Errorf("%d of the %d services listed", seen, len(names))
				}
				return nil
			}
			dir := t.TempDir()
			for _, what := range []string{"an empty store", "its store kept"} {
				ts := servertest.Start(t, dir, kube)
				wait.For(t, 30*time.Second, what, olderHasIt)
				ts.Stop()
			}
		})
	}
}

// createPool makes a weir.dev address pool and returns it as the
// apiserver stored it.
func createPool(t *testing.T, ctx context.Context, dyn dynamic.Interface, name, addresses string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": v1alpha1.AddressPoolKind,
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"addresses": []any{addresses}},
	}}
	got, err := dyn.Resource(v1alpha1.AddressPools).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// seedPool stores pool (the cluster's, with its creation time) in a new
// server's data folder.
func seedPool(t *testing.T, dir string, pool *unstructured.Unstructured, addresses string) {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg, err := registry.Open(st)
	if err != nil {
		t.Fatal(err)
	}
	rg, err := model.ParseAddressRange(addresses)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: pool.GetName(), Source: model.SourceKubernetes,
		CreateTime: pool.GetCreationTimestamp().UTC()}, Ranges: []model.AddressRange{rg}}); err != nil {
		t.Fatal(err)
	}
}

// olderHeld says how ts differs from holding older and refusing younger,
// in its registry and in the pools' Accepted conditions.
func olderHeld(ctx context.Context, dyn dynamic.Interface, ts *servertest.Server, older, younger *unstructured.Unstructured) error {
	resp, err := ts.Registry.ListAddressPools(ctx, &weirv1.ListAddressPoolsRequest{})
	if err != nil {
		return err
	}
	var held []string
	for _, p := range resp.GetAddressPools() {
		held = append(held, p.GetMetadata().GetName())
	}
	if !slices.Equal(held, []string{older.GetName()}) {
		return fmt.Errorf("the registry holds %v; want %s alone, not %s", held, older.GetName(), younger.GetName())
	}
	for _, want := range []struct {
		pool           *unstructured.Unstructured
		status, reason string
	}{{older, "True", ""}, {younger, "False", "overlaps pool " + older.GetName()}} {
		u, err := dyn.Resource(v1alpha1.AddressPools).Get(ctx, want.pool.GetName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		status, message := acceptedOf(u)
		if status != want.status || !strings.Contains(message, want.reason) {
			return fmt.Errorf("%s's Accepted: %s %q; want %s %q", u.GetName(), status, message, want.status, want.reason)
		}
	}
	return nil
}

// acceptedOf is an object's Accepted condition.
func acceptedOf(u *unstructured.Unstructured) (status, message string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m := c.(map[string]any); m["type"] == kubernetes.ConditionAccepted {
			return m["status"].(string), m["message"].(string)
		}
	}
	return "", ""
}
