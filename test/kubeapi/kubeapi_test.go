package kubeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCluster talks to a real apiserver with only net/http, then checks
// that Close leaves no process and no directory behind.
func TestCluster(t *testing.T) {
	SkipUnlessAvailable(t)
	// The first run builds the apiserver, which takes minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()

	start := time.Now()
	c, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Logf("Start took %v; apiserver at %s", time.Since(start).Round(time.Millisecond), c.Host)
	pids := []int{c.etcd.Pid(), c.apiserver.Pid()}

	client, err := c.HTTPClient()
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path string, body any, wantStatus int) map[string]any {
		t.Helper()
		var r io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			r = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, c.Host+path, r)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+c.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, wantStatus, data)
		}
		var out map[string]any
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
		return out
	}

	call("POST", "/api/v1/namespaces", map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": "weir-test"},
	}, http.StatusCreated)

	const clusterIP = "10.96.7.7"
	call("POST", "/api/v1/namespaces/default/services", map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": "web"},
		"spec": map[string]any{
			"clusterIP": clusterIP,
			"selector":  map[string]any{"app": "web"},
			"ports": []any{map[string]any{
				"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080,
			}},
		},
	}, http.StatusCreated)

	svc := call("GET", "/api/v1/namespaces/default/services/web", nil, http.StatusOK)
	spec, _ := svc["spec"].(map[string]any)
	if got := spec["clusterIP"]; got != clusterIP {
		t.Errorf("clusterIP = %v, want %s", got, clusterIP)
	}
	ports, _ := spec["ports"].([]any)
	if len(ports) != 1 || ports[0].(map[string]any)["port"] != 80.0 {
		t.Errorf("ports = %v, want one port 80", spec["ports"])
	}
	call("GET", "/api/v1/namespaces/weir-test", nil, http.StatusOK)

	kc, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"server: " + c.Host, "token: " + c.Token, "certificate-authority-data: "} {
		if !strings.Contains(string(kc), want) {
			t.Errorf("kubeconfig lacks %q", want)
		}
	}
	t.Logf("RSS: etcd %s, apiserver %s", rss(pids[0]), rss(pids[1]))

	start = time.Now()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	t.Logf("Close took %v", time.Since(start).Round(time.Millisecond))
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after Close (kill 0: %v)", pid, err)
		}
		if left := groupMembers(t, pid); len(left) > 0 {
			t.Errorf("process group %d still has processes %v after Close", pid, left)
		}
	}
	if _, err := os.Stat(c.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir %s still exists after Close: %v", c.Dir, err)
	}
}

// groupMembers returns the PIDs of processes in process group pgid.
func groupMembers(t *testing.T, pgid int) []int {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the process exited meanwhile
		}
		// Fields after "(comm)": state ppid pgrp ...; comm may hold spaces.
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// rss returns the VmRSS line of a process, for the log.
func rss(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return err.Error()
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
