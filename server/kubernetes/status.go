package kubernetes

import (
	"context"
	"log/slog"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"

	"github.com/weirlb/weir/server/model"
)

// StatusWriter writes the addresses Weir assigned to a Kubernetes service
// back into its status.loadBalancer.ingress; the informer then brings them
// into the registry.
type StatusWriter struct {
	Client clientset.Interface
	Log    *slog.Logger
}

// WriteStatus sets the service's ingress addresses; a reason is logged.
func (w StatusWriter) WriteStatus(ctx context.Context, svc *model.Service, ips []netip.Addr, reason, message string) error {
	if reason != "" {
		w.Log.Warn("no load-balancer address for a Kubernetes service", "service", svc.Key(), "reason", reason, "message", message)
	}
	cur, err := w.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var ingress []corev1.LoadBalancerIngress
	for _, ip := range ips {
		ingress = append(ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	cur.Status.LoadBalancer.Ingress = ingress
	_, err = w.Client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	return err
}
