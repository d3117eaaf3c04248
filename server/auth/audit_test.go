package auth_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/auth"
)

// TestAuditNamesEveryResourceOfALargeApply: an Apply of 80 resources, one
// of them a pool among 79 nodes, leaves a line for the batch and one for
// each resource it wrote, the pool's as plain as if it were alone; each
// line is bounded, however many resources the batch carries.
func TestAuditNamesEveryResourceOfALargeApply(t *testing.T) {
	dir, addr, auditLines := auditedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := weirv1.NewRegistryServiceClient(dial(t, addr, dir, "alice"))
	pool := func(addrs string) *weirv1.ApplyResource {
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_AddressPool{AddressPool: &weirv1.AddressPool{
			Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{addrs}}}}
	}
	apply := &weirv1.ApplyRequest{}
	var want []string
	for i := range 80 {
		if i == 57 {
			apply.Resources = append(apply.Resources, pool("203.0.113.0/28"))
			want = append(want, "kind=addresspool resource=public verb=created")
			continue
		}
		name := fmt.Sprintf("node-with-a-long-name-for-the-line-%02d", i)
		apply.Resources = append(apply.Resources, &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_Node{Node: node(name)}})
		want = append(want, "kind=node resource="+name+" verb=created")
	}
	resp, err := admin.Apply(ctx, apply)
	if err != nil {
		t.Fatal(err)
	}
	revision := fmt.Sprintf("revision=%d", resp.GetRevision())
	lines := auditLines()
	if len(lines) != 81 {
		t.Fatalf("%d audit lines, want 81 (the batch, then each resource):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, w := range []string{`who="alice (admin)"`, "method=weir.v1.RegistryService/Apply", "result=OK", "resources=80", revision} {
		if !strings.Contains(lines[0], w) {
			t.Errorf("the batch's line %q lacks %q", lines[0], w)
		}
	}
	for i, w := range want {
		l := lines[i+1]
		if !strings.Contains(l, w) || !strings.Contains(l, `who="alice (admin)"`) || !strings.Contains(l, revision) {
			t.Errorf("line %d %q; want %q, who and %s", i+1, l, w, revision)
		}
	}
	for _, l := range lines {
		if len(l) > 2*auth.MaxAuditValue+512 {
			t.Errorf("an audit line of %d bytes: %.300s...", len(l), l)
		}
	}

	// The pool changed among the same 79 nodes: replaced, by name. A dry
	// run writes nothing, and names nothing but the batch.
	apply.Resources[57] = pool("203.0.113.0/27")
	apply.ValidateOnly = true
	if _, err := admin.Apply(ctx, apply); err != nil {
		t.Fatal(err)
	}
	if lines := auditLines(); len(lines) != 1 || !strings.Contains(lines[0], "dry_run=true") || !strings.Contains(lines[0], "resources=80") {
		t.Errorf("a dry run's lines:\n%s\nwant one, the batch's", strings.Join(lines, "\n"))
	}
	apply.ValidateOnly = false
	if _, err := admin.Apply(ctx, apply); err != nil {
		t.Fatal(err)
	}
	lines = auditLines()
	if len(lines) != 81 || !strings.Contains(lines[58], "kind=addresspool resource=public verb=replaced") {
		t.Errorf("%d lines; want 81, the 58th naming the pool replaced:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}
