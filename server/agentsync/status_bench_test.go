package agentsync

import (
	"fmt"
	"testing"

	"github.com/weirlb/weir/server/observed"
)

// What reading every node's status costs at one status change, with 500
// nodes, two of which report 10,000 services each: Status copies the
// reports, Progress does not; Applying (what a wait for a version asks at
// every status change) reads them in place.
//
//	go test ./server/agentsync -run '^$' -bench StatusRead
func BenchmarkStatusRead(b *testing.B) {
	h := &Hub{nodes: map[string]*nodeRecord{}}
	for i := range 500 {
		n := &observed.Node{Node: fmt.Sprintf("node-%d", i), Connected: true, AppliedVersion: 7, SentVersion: 7}
		if i < 2 {
			n.Services = map[string]observed.Service{}
			for k := range 10000 {
				n.Services[fmt.Sprintf("bench/svc-%d", k)] = observed.Service{}
			}
		}
		h.nodes[n.Node] = &nodeRecord{status: n}
	}
	b.Run("Status", func(b *testing.B) {
		for b.Loop() {
			if len(h.Status()) != 500 {
				b.Fatal("nodes missing")
			}
		}
	})
	b.Run("Progress", func(b *testing.B) {
		for b.Loop() {
			if len(h.Progress()) != 500 {
				b.Fatal("nodes missing")
			}
		}
	})
	b.Run("Applying", func(b *testing.B) {
		for b.Loop() {
			if h.Applying(7) {
				b.Fatal("a node applying")
			}
		}
	})
}
