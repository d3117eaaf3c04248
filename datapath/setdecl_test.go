package datapath

import (
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/sets.golden from the current code")

// goldenPicks are pick sets of every kind and protocol, with and without
// endpoints.
func goldenPicks() []pick {
	var out []pick
	for _, k := range frontendKinds {
		for _, p := range protocols {
			for _, n := range []int{0, 1, 7} {
				out = append(out, k.pick(p, n))
			}
		}
	}
	return out
}

// renderSets is every form of every set of both families' tables, in both
// generations: the nft text, the netlink message's bytes and the element
// layout.
func renderSets(t *testing.T) string {
	t.Helper()
	var sb strings.Builder
	for _, f := range families {
		for _, g := range []generation{genA, genB} {
			tx := knftables.NewFake(f.nft, TableName).NewTransaction()
			b := newBatch()
			b.NewTable(f.wire, tableComment)
			add := func(d setDecl) {
				tx.Add(d.object(g))
				s, err := d.wire(g)
				if err != nil {
					t.Fatal(err)
				}
				b.NewSet(f.wire, s)
			}
			for _, d := range declared[f.index] {
				add(d)
			}
			for _, p := range goldenPicks() {
				add(p.decl(*f))
			}
			fmt.Fprintf(&sb, "# %s generation %s: nft\n%s", f, g, tx.String())
			fmt.Fprintf(&sb, "# %s generation %s: netlink\n", f, g)
			for typ, msg := range b.Messages() {
				fmt.Fprintf(&sb, "%#x %s\n", typ, hex.EncodeToString(msg))
			}
		}
		fmt.Fprintf(&sb, "# %s: element layout\n", f)
		for id := range setNames {
			fo := formats[f.index][id]
			fmt.Fprintf(&sb, "%s key %v value %v verdict %v interval %v\n", setID(id), fo.key, fo.value, fo.verdict, fo.interval)
		}
	}
	return sb.String()
}

// TestSetFormsAsBefore: every form of every set (the nft text, the netlink
// message and the element layout) is what the table has always been made
// of, byte for byte: testdata/sets.golden was written by the code that
// rendered each form from the nft text.
func TestSetFormsAsBefore(t *testing.T) {
	got := renderSets(t)
	const path = "testdata/sets.golden"
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("set forms (-before +now):\n%s", diff)
	}
}
