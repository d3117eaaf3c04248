package kubecluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
)

// StartForTest starts a cluster and closes it when the test ends. The
// logs are kept in the cluster's Dir when the test fails and removed when
// it passes.
func StartForTest(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	start := time.Now()
	c, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster of %d nodes up in %v (prefix %s, logs in %s)", cfg.Nodes, time.Since(start).Round(time.Millisecond), c.Prefix, c.Dir)
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close the cluster: %v", err)
		}
		if !t.Failed() {
			os.RemoveAll(c.Dir)
		}
	})
	return c
}

// ApplyEcho creates (or replaces) a Deployment of echo pods labelled
// app=NAME, spread over the nodes, each ready while its GET /readyz
// answers 200 (see test/cmd/echo).
func ApplyEcho(t testing.TB, c *Cluster, ns, name string, replicas int32, nodeSelector map[string]string) {
	t.Helper()
	ctx := t.Context()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  nodeSelector,
					TerminationGracePeriodSeconds: ptr(int64(2)),
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: corev1.LabelHostname,
						WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector:     &metav1.LabelSelector{MatchLabels: labels},
					}},
					Containers: []corev1.Container{{
						Name:            "echo",
						Image:           EchoImage,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"-name=$(POD_NAME)", "-listen=:8080"},
						Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
							FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"},
						}}},
						Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
						// A request, as a served workload has: a pod
						// without one is BestEffort (cgroup cpu.shares 2),
						// which any busy pod on a loaded node starves for
						// seconds, seen here as answers seconds late
						// while the agent pod starts.
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU:    resource.MustParse("100m"),
							corev1.ResourceMemory: resource.MustParse("16Mi"),
						}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
								Path: "/readyz", Port: intstr.FromInt32(8080),
							}},
							PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1, TimeoutSeconds: 1,
						},
					}},
				},
			},
		},
	}
	deployments := c.Kube.AppsV1().Deployments(ns)
	if _, err := deployments.Create(ctx, d, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = deployments.Update(ctx, d, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

// WaitPodsReady waits until exactly want pods match selector in ns and all
// are Ready, and returns them.
func WaitPodsReady(t testing.TB, c *Cluster, ns, selector string, want int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	wait.For(t, 3*time.Minute, fmt.Sprintf("%d ready pods %s in %s", want, selector, ns), func() error {
		list, err := c.Kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		var states []string
		ready := 0
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && PodReady(&p) {
				ready++
			}
			states = append(states, p.Name+":"+string(p.Status.Phase))
		}
		if ready != want || len(list.Items) != want {
			return fmt.Errorf("%d of %d ready: %s", ready, len(list.Items), strings.Join(states, " "))
		}
		pods = list.Items
		return nil
	})
	return pods
}

// PodReady reports whether the pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }

// PodNetns names the network namespace of a running pod (its first
// container's) as a lab namespace, for traffic from the pod itself.
func PodNetns(t testing.TB, c *Cluster, pod *corev1.Pod) *lab.Netns {
	t.Helper()
	var pid int
	for _, dir := range c.podCgroups(pod) {
		if pids := cgroupPids(dir); len(pids) > 0 {
			pid = pids[0]
			break
		}
	}
	if pid == 0 {
		t.Fatalf("no process of pod %s found in its node's cgroups", pod.Name)
	}
	ns, err := c.Lab.Attach(t.Context(), "pod-"+pod.Name[len(pod.Name)-5:], pid)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// KillContainer sends SIGKILL to every process of one container of a
// running pod, as a crash or the kernel's OOM killer would: its kubelet
// restarts it. It returns the processes killed.
func KillContainer(t testing.TB, c *Cluster, pod *corev1.Pod, container string) []int {
	t.Helper()
	var id string
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			_, id, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if id == "" {
		t.Fatalf("pod %s has no running container %q", pod.Name, container)
	}
	var killed []int
	for _, dir := range c.podCgroups(pod) {
		if filepath.Base(dir) != id {
			continue
		}
		for _, pid := range cgroupPids(dir) {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				killed = append(killed, pid)
			}
		}
	}
	if len(killed) == 0 {
		t.Fatalf("no process of container %s of pod %s found in its node's cgroups", container, pod.Name)
	}
	return killed
}

// podCgroups lists the pids cgroups of a pod on its node, the pod's own
// first. cgroupfs lays them out as <node cgroup>/kubepods/[<qos>/]
// pod<uid>/<container id>.
func (c *Cluster) podCgroups(pod *corev1.Pod) []string {
	var dirs []string
	for _, n := range c.nodes {
		if n.Name != pod.Spec.NodeName {
			continue
		}
		filepath.WalkDir(filepath.Join(cgroupRoot, "pids", n.cgroup), func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && strings.Contains(path+"/", "/pod"+string(pod.UID)+"/") {
				dirs = append(dirs, path)
			}
			return nil
		})
	}
	return dirs
}
