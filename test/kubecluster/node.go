package kubecluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weirlb/weir/test/lab"
)

// cgroupRoot is where the v1 hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// node is one kubelet node: its containerd and kubelet, in the lab node's
// network namespace, sharing a private mount namespace.
type node struct {
	*lab.Node
	dir        string
	cgroup     string // under every hierarchy: the node's processes, containers included
	socket     string // containerd's
	containerd *lab.Process
	kubelet    *lab.Process
	kubeProxy  *lab.Process // when the cluster runs kube-proxy
}

// startNode starts the node's containerd, imports the images and starts
// its kubelet.
func (c *Cluster) startNode(ctx context.Context, ln *lab.Node, images []Image) (*node, error) {
	n := &node{Node: ln, dir: filepath.Join(c.Dir, ln.Name), cgroup: c.Lab.Prefix + "-" + ln.Name}
	n.socket = filepath.Join(n.dir, "containerd.sock")
	for _, d := range []string{"cni", "ipam", "kubelet", "pod-logs", "containerd"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("kubecluster: %w", err)
		}
	}
	if err := n.makeCgroups(); err != nil {
		return nil, err
	}
	if err := n.writeConfigs(c); err != nil {
		return nil, err
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	// For Kubernetes' own specs the node has its own host name, its name,
	// as a machine has: pods on the host's network see it (their UTS
	// namespace is containerd's).
	// ip netns exec gives /sys a sysfs of the node's namespace, which hides
	// the cgroup hierarchies: mount them again, then the node's private
	// folders, and join the node's cgroup.
	script := "set -e\n"
	uts := []string{}
	if c.upstream {
		script += "hostname " + ln.Name + "\n"
		uts = append(uts, "--uts")
	}
	script += mounts + n.joinCgroup() +
		"for d in /run/containerd /var/lib/cni /var/log/containers /var/log/pods /var/run/netns /var/lib/kubelet; do\n" +
		"  mkdir -p $d; mount -t tmpfs weir-lab $d\ndone\n" +
		"exec containerd --config " + filepath.Join(n.dir, "containerd.toml") + "\n"
	if n.containerd, err = ln.Start("unshare", append(append([]string{"--mount"}, uts...), "--propagation", "private", "sh", "-c", script)...); err != nil {
		return nil, err
	}
	if err := poll(ctx, time.Minute, func() bool {
		_, err := os.Stat(n.socket)
		return err == nil || n.containerd.Exited()
	}); err != nil || n.containerd.Exited() {
		return nil, fmt.Errorf("kubecluster: %s: containerd did not start: %v\n%s", ln.Name, err, n.containerd.Log())
	}
	for _, im := range images {
		if out, err := exec.CommandContext(ctx, "ctr", "--address", n.socket, "-n", "k8s.io", "images", "import", im.Archive).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("kubecluster: %s: import %s: %w: %s", ln.Name, im.Ref, err, out)
		}
	}
	kube, err := kubeBinary(ctx)
	if err != nil {
		return nil, err
	}
	// The kubelet joins containerd's mount namespace: the volumes it
	// mounts are the ones containerd gives the containers.
	n.kubelet, err = ln.Start("nsenter", "--mount=/proc/"+strconv.Itoa(n.containerd.Cmd.Process.Pid)+"/ns/mnt", "--",
		"sh", "-c", n.joinCgroup()+"exec "+kube+" kubelet"+
			" --config="+filepath.Join(n.dir, "kubelet.yaml")+
			" --kubeconfig="+c.Kubeconfig+
			" --root-dir="+filepath.Join(n.dir, "kubelet")+
			" --hostname-override="+ln.Name+
			" --node-ip="+ln.IPv4.String())
	if err != nil {
		return nil, err
	}
	if c.kubeProxy {
		if n.kubeProxy, err = ln.Start("sh", "-c", n.joinCgroup()+"exec "+kube+" kube-proxy --config="+filepath.Join(n.dir, "kube-proxy.yaml")); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// joinCgroup is a shell line moving the shell into the node's runtime
// cgroup, so every process it starts is found by stop.
func (n *node) joinCgroup() string {
	return "echo $$ > " + filepath.Join(cgroupRoot, "pids", n.cgroup, "runtime", "cgroup.procs") + "\n"
}

// hierarchies lists the v1 hierarchies' folders.
func hierarchies() ([]string, error) {
	entries, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "unified" {
			dirs = append(dirs, filepath.Join(cgroupRoot, e.Name()))
		}
	}
	return dirs, nil
}

// makeCgroups makes the node's cgroup under every hierarchy (the kubelet's
// cgroupRoot) and its runtime child under pids.
func (n *node) makeCgroups() error {
	dirs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range dirs {
		d := filepath.Join(h, n.cgroup)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("kubecluster: %w", err)
		}
		if filepath.Base(h) == "cpuset" {
			// A cpuset takes no task until it has CPUs and memory nodes.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return fmt.Errorf("kubecluster: %w", err)
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("kubecluster: %w", err)
				}
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(cgroupRoot, "pids", n.cgroup, "runtime"), 0o755); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	return nil
}

// cgroupMounts is the shell lines that mount this host's cgroup
// hierarchies again (a tmpfs at /sys/fs/cgroup, then each hierarchy with
// its controllers), read from /proc/self/mounts.
func cgroupMounts() (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("kubecluster: %w", err)
	}
	defer f.Close()
	generic := map[string]bool{"rw": true, "ro": true, "nosuid": true, "nodev": true, "noexec": true, "relatime": true}
	lines := "mount -t tmpfs -o mode=755 cgroup " + cgroupRoot + "\n"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[1], cgroupRoot+"/") {
			continue
		}
		var opts []string
		for o := range strings.SplitSeq(fields[3], ",") {
			if !generic[o] {
				opts = append(opts, o)
			}
		}
		switch fields[2] {
		case "cgroup":
			if len(opts) == 1 && strings.HasPrefix(opts[0], "name=") {
				opts = append([]string{"none"}, opts...)
			}
			lines += fmt.Sprintf("mkdir -p %s; mount -t cgroup -o %s cgroup %s\n", fields[1], strings.Join(opts, ","), fields[1])
		case "cgroup2":
			lines += fmt.Sprintf("mkdir -p %s; mount -t cgroup2 cgroup2 %s\n", fields[1], fields[1])
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("kubecluster: %w", err)
	}
	return lines, nil
}

// stop stops the kubelet and containerd, kills whatever is left in the
// node's cgroup (containers, shims) and removes the cgroups and the
// runtime's data.
func (n *node) stop() error {
	var errs []error
	for _, p := range []*lab.Process{n.kubeProxy, n.kubelet, n.containerd} {
		if p != nil {
			errs = append(errs, p.Stop())
		}
	}
	errs = append(errs, n.killCgroup(10*time.Second))
	dirs, err := hierarchies()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	// The kubelet makes the node's cgroup in the v2 hierarchy too, where
	// one is mounted (unified): gone with the others.
	for _, h := range append(dirs, filepath.Join(cgroupRoot, "unified")) {
		errs = append(errs, removeCgroupTree(filepath.Join(h, n.cgroup)))
	}
	// Images and root filesystems: hundreds of MB a node. Logs stay.
	errs = append(errs, os.RemoveAll(filepath.Join(n.dir, "containerd")), os.RemoveAll(filepath.Join(n.dir, "kubelet")))
	return errors.Join(errs...)
}

// killCgroup sends SIGKILL to every process in the node's pids cgroup
// tree until none is left.
func (n *node) killCgroup(within time.Duration) error {
	root := filepath.Join(cgroupRoot, "pids", n.cgroup)
	deadline := time.Now().Add(within)
	for {
		pids := cgroupPids(root)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubecluster: %s: processes %v survive SIGKILL", n.Name, pids)
		}
		for _, pid := range pids {
			if pid != os.Getpid() {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupPids lists the processes in a cgroup folder and its children.
func cgroupPids(dir string) []int {
	var pids []int
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// removeCgroupTree removes a cgroup folder and its children, deepest
// first (a cgroup is removed with rmdir once it is empty).
func removeCgroupTree(dir string) error {
	var dirs []string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("kubecluster: rmdir %s: %w", dirs[i], err))
		}
	}
	return errors.Join(errs...)
}
