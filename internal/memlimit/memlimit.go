// Package memlimit keeps a daemon's Go heap below the memory limit of the
// cgroup it runs in (a pod's container, a systemd unit's MemoryMax=).
//
// Go lets its heap grow to twice what is live before collecting, and does
// not know the limit the kernel enforces: an agent whose state takes 230
// MiB at 100,000 services could reach 460 MiB and more during a full sync,
// and be killed under the chart's 512 MiB limit while collecting would
// have kept it well below. With a soft limit the runtime collects more
// often as the heap nears it, instead.
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Share is the part of the cgroup's limit the Go runtime is given; the
// rest is for what it does not count: the nft processes the agent starts
// in the same cgroup (about 10 MiB at 100,000 services), and the kernel's
// socket buffers charged to the cgroup.
const Share = 0.85

// Apply sets the runtime's soft memory limit to Share of the cgroup's,
// unless GOMEMLIMIT is set (the operator's choice stands) or the cgroup
// has no limit. It returns the limit set, 0 for none, and logs it.
func Apply(log *slog.Logger) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		log.Info("Go's memory limit is GOMEMLIMIT's", "bytes", debug.SetMemoryLimit(-1))
		return 0
	}
	limit, err := OfCgroup("/")
	if err != nil {
		log.Debug("the cgroup's memory limit could not be read; the heap is left to GOGC", "error", err)
		return 0
	}
	if limit == 0 {
		return 0
	}
	soft := int64(float64(limit) * Share)
	debug.SetMemoryLimit(soft)
	log.Info("the Go heap is kept under the cgroup's memory limit", "cgroup_limit_bytes", limit, "go_limit_bytes", soft)
	return soft
}

// OfCgroup is the memory limit of the process's cgroup, the smallest of
// its own and its parents' (0: none), read from the files under root ("/"
// but in tests): /proc/self/cgroup names the cgroup, /proc/self/mountinfo
// where its hierarchy is mounted. cgroup v2 and v1's memory controller
// are both read.
func OfCgroup(root string) (int64, error) {
	cgroups, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, err
	}
	mounts, err := os.ReadFile(filepath.Join(root, "proc/self/mountinfo"))
	if err != nil {
		return 0, err
	}
	// v1's memory controller when there is one (v2 then has no memory
	// controller: hybrid hierarchies), else v2.
	for _, v1 := range []bool{true, false} {
		path, ok := cgroupPath(cgroups, v1)
		if !ok {
			continue
		}
		mountRoot, mountPoint, ok := mountOf(mounts, v1)
		if !ok {
			continue
		}
		rel, err := filepath.Rel(mountRoot, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // the cgroup is outside the mount (another namespace's view)
		}
		file := "memory.max"
		if v1 {
			file = "memory.limit_in_bytes"
		}
		return smallestLimit(filepath.Join(root, mountPoint), rel, file)
	}
	return 0, errors.New("no memory cgroup found")
}

// cgroupPath is the process's cgroup in v1's memory hierarchy or in v2's,
// from /proc/self/cgroup ("hierarchy:controllers:path" lines; v2's line
// is "0::path").
func cgroupPath(cgroups []byte, v1 bool) (string, bool) {
	for line := range strings.Lines(string(cgroups)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v1 && contains(parts[1], "memory") || !v1 && parts[0] == "0" && parts[1] == "" {
			return parts[2], true
		}
	}
	return "", false
}

// mountOf is where the hierarchy is mounted, from /proc/self/mountinfo:
// the mount's root within the hierarchy and its mount point.
func mountOf(mounts []byte, v1 bool) (root, point string, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(mounts))
	for sc.Scan() {
		// "id parent major:minor root point options [tags] - type source super-options"
		pre, post, found := strings.Cut(sc.Text(), " - ")
		if !found {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		if v1 && g[0] == "cgroup" && contains(g[2], "memory") || !v1 && g[0] == "cgroup2" {
			return unescape(f[3]), unescape(f[4]), true
		}
	}
	return "", "", false
}

// smallestLimit walks from the cgroup rel up to the mount point, reading
// each level's limit file: the smallest limit set, 0 for none.
func smallestLimit(mountPoint, rel, file string) (int64, error) {
	var limit int64
	read := false
	for dir := rel; ; dir = filepath.Dir(dir) {
		b, err := os.ReadFile(filepath.Join(mountPoint, dir, file))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// A level without the controller, or the hierarchy's root
			// (which has no v2 limit file).
		case err != nil:
			return 0, err
		default:
			read = true
			v := strings.TrimSpace(string(b))
			if v == "max" {
				break
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", filepath.Join(mountPoint, dir, file), err)
			}
			// v1 writes "no limit" as the largest page-aligned value.
			if n > 0 && n < math.MaxInt64/2 && (limit == 0 || n < limit) {
				limit = n
			}
		}
		if dir == "." || dir == "/" {
			break
		}
	}
	if !read {
		return 0, fmt.Errorf("no %s under %s", file, filepath.Join(mountPoint, rel))
	}
	return limit, nil
}

func contains(list, item string) bool {
	for s := range strings.SplitSeq(list, ",") {
		if s == item {
			return true
		}
	}
	return false
}

// unescape undoes mountinfo's octal escapes (a space is \040).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
