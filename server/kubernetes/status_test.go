package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"

	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/model"
)

// TestAStatusWriteCutByItsContextIsAnError: a leader that stops (its
// lease lost, SIGTERM) while writing a service's status gets the write's
// error back, never a success with nothing written (which recorded an
// Event about no service and crashed the server).
func TestAStatusWriteCutByItsContextIsAnError(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}
	kc := fake.NewClientset(svc)
	kc.PrependReactor("get", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		// What the client's rate limiter says once the context ended.
		return true, nil, fmt.Errorf("client rate limiter Wait returned an error: %w", context.Canceled)
	})
	w := kubernetes.StatusWriter{Client: kc, Events: events.NewFakeRecorder(10), Log: slog.New(slog.DiscardHandler)}
	m := &model.Service{Meta: model.Meta{Namespace: "default", Name: "web"}}
	for _, tc := range []struct {
		name   string
		ips    []netip.Addr
		reason string
	}{
		{"assigned", []netip.Addr{netip.MustParseAddr("198.51.100.5")}, ""},
		{"refused", nil, "AddressTaken"},
	} {
		err := w.WriteStatus(context.Background(), m, tc.ips, tc.reason, "198.51.100.5 is assigned to default/other")
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s: WriteStatus returned %v; want the context's error", tc.name, err)
		}
	}
}
