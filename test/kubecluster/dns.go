package kubecluster

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The cluster DNS (Config.DNS): test/cmd/clusterdns behind the kube-dns
// Service, at the address kubelets give pods as their nameserver.
const (
	DNSImage   = "weir.test/clusterdns:lab"
	DNSService = "10.96.0.10"
)

// startDNS runs the cluster DNS in kube-system: a ServiceAccount that may
// read Services and EndpointSlices, one pod and the kube-dns Service. The
// pod reaches the apiserver at its own address, not through the
// kubernetes Service: the cluster may have no service proxy yet. Its
// Service answers once one runs.
func (c *Cluster) startDNS(ctx context.Context) error {
	const ns, name = metav1.NamespaceSystem, "kube-dns"
	labels := map[string]string{"k8s-app": name}
	if _, err := c.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubecluster: DNS: %w", err)
	}
	if _, err := c.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "weir-lab:" + name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubecluster: DNS: %w", err)
	}
	if _, err := c.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "weir-lab:" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "weir-lab:" + name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubecluster: DNS: %w", err)
	}
	replicas := int32(1)
	api := c.APIServer
	if _, err := c.Kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: name,
					DNSPolicy:          corev1.DNSDefault,
					Containers: []corev1.Container{{
						Name:            "dns",
						Image:           DNSImage,
						ImagePullPolicy: corev1.PullNever,
						Env: []corev1.EnvVar{
							{Name: "KUBERNETES_SERVICE_HOST", Value: api.Addr().String()},
							{Name: "KUBERNETES_SERVICE_PORT", Value: fmt.Sprint(api.Port())},
						},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
						},
					}},
				},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubecluster: DNS: %w", err)
	}
	if _, err := c.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector:  labels,
			ClusterIP: DNSService,
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolTCP},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubecluster: DNS: %w", err)
	}
	return poll(ctx, 2*time.Minute, func() bool {
		pods, err := c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=" + name})
		return err == nil && len(pods.Items) == 1 && PodReady(&pods.Items[0])
	})
}
