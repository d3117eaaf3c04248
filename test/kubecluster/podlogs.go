package kubecluster

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// keepPodLogs copies, every second until ctx ends, what the containers
// wrote into the kubelets' log folders to Dir/pod-logs/<node>/, so a
// failed test still has the logs of pods already deleted (the kubelet
// removes a pod's logs with it).
func (c *Cluster) keepPodLogs(ctx context.Context) {
	offsets := map[string]int64{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		for _, n := range c.nodes {
			src := filepath.Join(n.dir, "pod-logs")
			dst := filepath.Join(c.Dir, "pod-logs", n.Name)
			filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
					return nil
				}
				rel, _ := filepath.Rel(src, path)
				// <namespace>_<pod>_<uid>/<container>/<restart>.log
				parts := strings.Split(rel, string(filepath.Separator))
				if len(parts) != 3 {
					return nil
				}
				pod := parts[0]
				if i := strings.LastIndexByte(pod, '_'); i > 0 {
					pod = pod[:i]
				}
				out := filepath.Join(dst, pod+"_"+parts[1]+"_"+parts[2])
				offsets[path] = appendFrom(path, out, offsets[path])
				return nil
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// appendFrom appends what src holds past offset to dst and returns the new
// offset.
func appendFrom(src, dst string, offset int64) int64 {
	in, err := os.Open(src)
	if err != nil {
		return offset
	}
	defer in.Close()
	if _, err := in.Seek(offset, io.SeekStart); err != nil {
		return offset
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return offset
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return offset
	}
	defer out.Close()
	n, _ := io.Copy(out, in)
	return offset + n
}
