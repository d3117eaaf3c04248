package memlimit

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

// fakeRoot lays out files under a temporary root: path -> content.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for path, content := range files {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	v2Mounts = "25 1 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
	// As this project's VM: v1 controllers, and an unused v2 hierarchy.
	v1Mounts = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
		"32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
		"35 31 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"40 31 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	v1Unlimited = "9223372036854771712\n"
)

func TestLimitOfTheCgroup(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
	}{{
		name: "v2, a systemd unit's MemoryMax",
		files: map[string]string{
			"proc/self/cgroup":                                         "0::/system.slice/weir-agent.service\n",
			"proc/self/mountinfo":                                      v2Mounts,
			"sys/fs/cgroup/system.slice/memory.max":                    "max\n",
			"sys/fs/cgroup/system.slice/weir-agent.service/memory.max": "536870912\n",
		},
		want: 512 << 20,
	}, {
		name: "v2, a container in its own cgroup namespace",
		files: map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"proc/self/mountinfo":      "1200 1100 0:23 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n",
			"sys/fs/cgroup/memory.max": "1073741824\n",
		},
		want: 1 << 30,
	}, {
		name: "v2, the parent's limit is the smaller",
		files: map[string]string{
			"proc/self/cgroup":                           "0::/kubepods/pod1/ctr\n",
			"proc/self/mountinfo":                        v2Mounts,
			"sys/fs/cgroup/kubepods/pod1/memory.max":     "268435456\n",
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "536870912\n",
		},
		want: 256 << 20,
	}, {
		name: "v2, no limit",
		files: map[string]string{
			"proc/self/cgroup":                    "0::/user.slice\n",
			"proc/self/mountinfo":                 v2Mounts,
			"sys/fs/cgroup/user.slice/memory.max": "max\n",
		},
		want: 0,
	}, {
		name: "v1 memory controller beside an empty v2 hierarchy",
		files: map[string]string{
			"proc/self/cgroup":                                           "4:memory:/process_api/abc\n1:cpu:/\n0::/\n",
			"proc/self/mountinfo":                                        v1Mounts,
			"sys/fs/cgroup/memory/memory.limit_in_bytes":                 v1Unlimited,
			"sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":     v1Unlimited,
			"sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": "314572800\n",
		},
		want: 300 << 20,
	}, {
		name: "v1, unlimited",
		files: map[string]string{
			"proc/self/cgroup":                                           "4:memory:/process_api/abc\n0::/\n",
			"proc/self/mountinfo":                                        v1Mounts,
			"sys/fs/cgroup/memory/memory.limit_in_bytes":                 v1Unlimited,
			"sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": v1Unlimited,
		},
		want: 0,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := OfCgroup(fakeRoot(t, tc.files))
			if err != nil || got != tc.want {
				t.Errorf("limit %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestNoCgroupIsAnError(t *testing.T) {
	root := fakeRoot(t, map[string]string{"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"})
	if limit, err := OfCgroup(root); err == nil {
		t.Errorf("limit %d without a cgroup file system, and no error", limit)
	}
}

// helperEnv makes the test binary report the runtime's memory limit after
// Apply, as a daemon sets it at its start.
const helperEnv = "WEIR_MEMLIMIT_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		Apply(slog.New(slog.NewTextHandler(io.Discard, nil)))
		fmt.Println(debug.SetMemoryLimit(-1))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestAProcessInALimitedCgroupKeepsItsHeapUnderIt: a process started in a
// real cgroup limited to 300 MiB runs its Go heap under 85 % of it, and
// GOMEMLIMIT, when set, stands.
func TestAProcessInALimitedCgroupKeepsItsHeapUnderIt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a cgroup (run as root, as CI does)")
	}
	dir, file := newCgroup(t)
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.Itoa(300<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(env ...string) int64 {
		t.Helper()
		// The shell joins the cgroup, then becomes the test binary.
		cmd := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2"`, "sh", dir, self)
		cmd.Env = append(os.Environ(), append(env, helperEnv+"=1")...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the helper: %v", err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			t.Fatalf("the helper printed %q", out)
		}
		return n
	}
	if got, want := run(), int64(float64(300<<20)*Share); got != want {
		t.Errorf("Go's memory limit in a cgroup of 300 MiB: %d, want %d", got, want)
	}
	if got := run("GOMEMLIMIT=100MiB"); got != 100<<20 {
		t.Errorf("with GOMEMLIMIT=100MiB: %d, want %d", got, 100<<20)
	}
}

// newCgroup makes a memory cgroup at the root of this machine's memory
// hierarchy (v1's memory controller, or v2), removed at the end; it
// returns its directory and the name of its limit file.
func newCgroup(t *testing.T) (dir, limitFile string) {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("weir-memlimit-test-%d", os.Getpid())
	for _, v1 := range []bool{true, false} {
		_, point, ok := mountOf(mounts, v1)
		if !ok {
			continue
		}
		limitFile = "memory.max"
		if v1 {
			limitFile = "memory.limit_in_bytes"
		} else if ctl, _ := os.ReadFile(filepath.Join(point, "cgroup.subtree_control")); !contains(strings.Join(strings.Fields(string(ctl)), ","), "memory") {
			continue // v2 without its memory controller enabled below the root
		}
		dir = filepath.Join(point, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := os.Remove(dir); err != nil {
				t.Errorf("removing the test's cgroup: %v", err)
			}
		})
		return dir, limitFile
	}
	t.Fatal("this machine has no memory cgroup to make one in")
	return "", ""
}
