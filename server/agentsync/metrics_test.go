package agentsync

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// TestAScrapeOfManyNodesEnds: the nodes' series are more than the
// registry's channel holds, and another of the hub's metrics takes the
// hub's lock. A scrape that sent the series while holding that lock
// waited for ever, and every agent's answers with it (seen with 500
// agents in test/bench/endtoend).
func TestAScrapeOfManyNodesEnds(t *testing.T) {
	metrics := prometheus.NewRegistry()
	h := New(registrytest.Open(t), Config{Metrics: metrics})
	h.mu.Lock()
	for i := range 2000 {
		node := fmt.Sprintf("node-%d", i)
		h.nodeLocked(node).status = &observed.Node{Node: node, Connected: true}
	}
	h.mu.Unlock()
	for range 20 {
		done := make(chan error, 1)
		go func() {
			families, err := metrics.Gather()
			if err == nil && len(families) == 0 {
				err = fmt.Errorf("no metrics")
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a scrape of 2,000 nodes' series has not ended in 10 s")
		}
		if !h.mu.TryLock() {
			t.Fatal("the hub's lock is still held after the scrape")
		}
		h.mu.Unlock()
	}
}
