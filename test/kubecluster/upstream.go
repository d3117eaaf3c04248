package kubecluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/weirlb/weir/test/kubeapi"
)

// Spec is one of Kubernetes' e2e specs: its full text, as the suite
// names it, and where it is written.
type Spec struct {
	Name     string // "[sig-network] Services should serve a basic endpoint from pods [Conformance]"
	Location string // "k8s.io/kubernetes@v1.36.3/test/e2e/network/service.go:733"
}

// SpecResult is what one run of a spec gave.
type SpecResult struct {
	Spec
	State    string // passed, failed, skipped, timedout, panicked, interrupted
	Failure  string // the failure's message, when it failed
	Duration time.Duration
}

// Passed says whether the spec passed.
func (r SpecResult) Passed() bool { return r.State == "passed" }

// UpstreamSpecs lists the network e2e specs (see kubeapi.E2E) whose name
// matches focus and not skip (regular expressions; skip may be empty).
func UpstreamSpecs(ctx context.Context, focus, skip string) ([]Spec, error) {
	focusRE, err := regexp.Compile(focus)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: focus: %w", err)
	}
	var skipRE *regexp.Regexp
	if skip != "" {
		if skipRE, err = regexp.Compile(skip); err != nil {
			return nil, fmt.Errorf("kubecluster: skip: %w", err)
		}
	}
	bin, err := kubeapi.E2E(ctx, nil)
	if err != nil {
		return nil, err
	}
	out, err := runOutput(ctx, bin, "--list-tests")
	if err != nil {
		return nil, err
	}
	var specs []Spec
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		// "    k8s.io/kubernetes@v1.36.3/test/e2e/network/service.go:733: [sig-network] Services ..."
		line := strings.TrimSpace(sc.Text())
		loc, name, ok := strings.Cut(line, ": ")
		if !ok || !strings.Contains(loc, ".go:") {
			continue
		}
		if !focusRE.MatchString(name) || (skipRE != nil && skipRE.MatchString(name)) || seen[name] {
			continue
		}
		seen[name] = true
		specs = append(specs, Spec{Name: name, Location: loc})
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name })
	return specs, nil
}

// RunUpstream runs specs against the cluster from its control host (as a
// client outside the cluster runs them), shards of them at once, each
// shard one e2e.test process with its own share of the specs, and returns
// every spec's result. Logs and reports go to dir. A spec that no report
// names (its shard was killed, say) is reported as "not run".
func (c *Cluster) RunUpstream(ctx context.Context, dir string, specs []Spec, shards int) ([]SpecResult, error) {
	bin, err := kubeapi.E2E(ctx, nil)
	if err != nil {
		return nil, err
	}
	kube, err := kubeBinary(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	// The tests run kubectl (exec, logs): the Kubernetes binary under
	// that name.
	kubectl := filepath.Join(dir, "kubectl")
	os.Remove(kubectl)
	if err := os.Symlink(kube, kubectl); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	if shards < 1 {
		shards = 1
	}
	parts := make([][]Spec, shards)
	for i, s := range specs {
		parts[i%shards] = append(parts[i%shards], s)
	}
	var (
		mu      sync.Mutex
		results = map[string]SpecResult{}
		errs    []error
		wg      sync.WaitGroup
	)
	for i, part := range parts {
		if len(part) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := c.runShard(ctx, bin, kubectl, dir, i, part)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			// A shard's report names every spec of the suite, those of
			// the other shards as skipped.
			mine := map[string]bool{}
			for _, s := range part {
				mine[s.Name] = true
			}
			for _, r := range got {
				if mine[r.Name] {
					results[r.Name] = r
				}
			}
		}()
	}
	wg.Wait()
	out := make([]SpecResult, 0, len(specs))
	for _, s := range specs {
		r, ok := results[s.Name]
		if !ok {
			r = SpecResult{Spec: s, State: "not run"}
		}
		r.Location = s.Location
		out = append(out, r)
	}
	if len(errs) > 0 && len(results) == 0 {
		return out, fmt.Errorf("kubecluster: no e2e shard reported: %v", errs)
	}
	return out, nil
}

// runShard runs one e2e.test process for specs, chosen by their file and
// line, and reads its JSON report.
func (c *Cluster) runShard(ctx context.Context, bin, kubectl, dir string, shard int, specs []Spec) ([]SpecResult, error) {
	report := filepath.Join(dir, fmt.Sprintf("shard%d.json", shard))
	args := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--kubectl-path=" + kubectl,
		"--provider=local",
		"--ginkgo.json-report=" + report,
		"--ginkgo.no-color",
		"--ginkgo.timeout=3h",
		"--ginkgo.v",
	}
	locs := map[string]bool{}
	for _, s := range specs {
		// A location is a file and a line: ginkgo's focus-file takes a
		// regular expression for the file.
		file, line, _ := strings.Cut(s.Location[strings.LastIndex(s.Location, "/")+1:], ":")
		loc := regexp.QuoteMeta("/"+file) + ":" + line
		if !locs[loc] {
			locs[loc] = true
			args = append(args, "--ginkgo.focus-file="+loc)
		}
	}
	// Specs of one line (a table's entries) run together; the focus on
	// their names keeps any other spec of that line out. Ginkgo matches
	// it against the suite's name, a space and the spec's.
	var names []string
	for _, s := range specs {
		names = append(names, regexp.QuoteMeta(s.Name))
	}
	args = append(args, "--ginkgo.focus= ("+strings.Join(names, "|")+")$")
	p, err := c.Control.Start(bin, args...)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	var runErr error
	select {
	case runErr = <-done:
	case <-ctx.Done():
		p.Stop()
		runErr = ctx.Err()
	}
	// The whole log stays with the reports.
	if b, err := os.ReadFile(p.LogPath); err == nil {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("shard%d.log", shard)), b, 0o644)
	}
	results, err := readReport(report)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: e2e shard %d (%v): %w", shard, runErr, err)
	}
	return results, nil
}

// readReport reads the specs' results from ginkgo's JSON report.
func readReport(path string) ([]SpecResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var reports []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeType            string
			LeafNodeText            string
			State                   string
			RunTime                 time.Duration
			Failure                 *struct{ Message string }
		}
	}
	if err := json.Unmarshal(b, &reports); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []SpecResult
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != "It" {
				continue
			}
			res := SpecResult{
				Spec:     Spec{Name: strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")},
				State:    s.State,
				Duration: s.RunTime,
			}
			if s.Failure != nil {
				res.Failure = s.Failure.Message
			}
			out = append(out, res)
		}
	}
	return out, nil
}

// runOutput runs a program of this host and returns its standard output.
func runOutput(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("kubecluster: %s %s: %w", filepath.Base(name), strings.Join(args, " "), err)
	}
	return string(out), nil
}
