package datapath

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"github.com/weirlb/weir/datapath/internal/nfwire"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// TestSetsOverNetlinkMatchNft: the table, sets and maps a full sync creates
// over netlink (every set of both families' tables, and picks' sets of
// every kind) are what nft creates for the same declarations, attribute by
// attribute and byte by byte, user data included, so that nft lists them,
// and parses rules naming them, as its own; and an existing set of the
// same shape is left as it is, as nft leaves it.
func TestSetsOverNetlinkMatchNft(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	ctx := context.Background()
	const comment = tableComment
	decls := func(f family) []setDecl {
		decls := slices.Clone(declared[f.index])
		for _, k := range frontendKinds {
			for _, p := range []pick{k.pick(TCP, 1), k.pick(SCTP, 0)} {
				decls = append(decls, p.decl(f))
			}
		}
		return decls
	}
	byNft := map[string]dumped{}
	for _, f := range families {
		nft, err := knftables.New(f.nft, TableName)
		if err != nil {
			t.Fatal(err)
		}
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{Comment: knftables.PtrTo(comment)})
		tx.Add(&knftables.Chain{Name: "pick_a"})
		for _, d := range decls(*f) {
			tx.Add(d.object(genA))
		}
		if err := nft.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
		maps.Copy(byNft, dumpTable(t, f))
	}
	removeTables(t)

	conn, err := nfwire.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range 2 { // the second time over what the first made
		b := newBatch()
		for _, f := range families {
			b.NewTable(f.wire, comment)
			b.NewChain(f.wire, "pick_a")
			for _, d := range decls(*f) {
				s, err := d.wire(genA)
				if err != nil {
					t.Fatal(err)
				}
				b.NewSet(f.wire, s)
			}
		}
		if err := conn.Commit(b); err != nil {
			t.Fatal(err)
		}
		byNetlink := map[string]dumped{}
		for _, f := range families {
			maps.Copy(byNetlink, dumpTable(t, f))
		}
		if len(byNft) < 2*len(tableSets(ipv4, genA)) {
			t.Fatalf("only %d objects dumped", len(byNft))
		}
		if diff := cmp.Diff(byNft, byNetlink); diff != "" {
			t.Fatalf("what the kernel holds (-made by nft +made over netlink):\n%s", diff)
		}
	}
	// nft reads them as its own: a rule naming a typeof map parses.
	for _, f := range families {
		nft, err := knftables.New(f.nft, TableName)
		if err != nil {
			t.Fatal(err)
		}
		tx := nft.NewTransaction()
		for _, pc := range pickChains(*f, 0x4000, genA, map[pick]int{ipKind.pick(TCP, 1): 1}) {
			tx.Add(pc.chain)
			writeChain(tx, pc, genA)
		}
		if err := nft.Run(ctx, tx); err != nil {
			t.Fatalf("%s: a pick chain naming the sets made over netlink: %v", f, err)
		}
	}
}

// dumped is an object as the kernel dumps it: its attributes by type,
// without those that name where it is (its table, handle, use count).
type dumped map[uint16]string

// dumpTable dumps f's table, its sets and its chains, by kind and name.
func dumpTable(t *testing.T, f *family) map[string]dumped {
	t.Helper()
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	out := map[string]dumped{}
	for _, k := range []struct {
		kind         string
		msg          uint16
		name         uint16
		placeAttrs   []uint16
		filterByName bool
	}{
		{"table", unix.NFT_MSG_GETTABLE, unix.NFTA_TABLE_NAME, []uint16{unix.NFTA_TABLE_USE, 4 /* handle */}, false},
		// A set's handle, its backend (19) and its element count (20).
		{"set", unix.NFT_MSG_GETSET, unix.NFTA_SET_NAME, []uint16{unix.NFTA_SET_TABLE, 16, 19, 20}, true},
		{"chain", unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_NAME, []uint16{unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_HANDLE, unix.NFTA_CHAIN_USE}, false},
	} {
		req := []byte{unix.NFPROTO_IPV4, unix.NFNETLINK_V0, 0, 0}
		if f.is6 {
			req[0] = unix.NFPROTO_IPV6
		}
		if k.filterByName {
			ae := netlink.NewAttributeEncoder()
			ae.String(unix.NFTA_SET_TABLE, TableName)
			attrs, err := ae.Encode()
			if err != nil {
				t.Fatal(err)
			}
			req = append(req, attrs...)
		}
		msgs, err := conn.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | k.msg), Flags: netlink.Request | netlink.Dump},
			Data:   req,
		})
		if err != nil {
			t.Fatalf("dumping %s %ss: %v", f, k.kind, err)
		}
		for _, m := range msgs {
			ad, err := netlink.NewAttributeDecoder(m.Data[4:])
			if err != nil {
				t.Fatal(err)
			}
			d := dumped{}
			var name string
			for ad.Next() {
				switch {
				case ad.Type() == k.name:
					name = ad.String()
				case slices.Contains(k.placeAttrs, ad.Type()):
				default:
					d[ad.Type()] = fmt.Sprintf("%x", ad.Bytes())
				}
			}
			if k.kind == "table" && name != TableName {
				continue
			}
			out[fmt.Sprintf("%s %s %s", f, k.kind, name)] = d
		}
	}
	return out
}

// TestSetsWithoutANetlinkFormAreRefused: a declaration the netlink form
// does not cover (an option nft would encode differently) is an error,
// never a set made differently from nft's. A type, an expression or a
// flag with no netlink form cannot be declared: fields and flags are
// typed.
func TestSetsWithoutANetlinkFormAreRefused(t *testing.T) {
	addr := addrType(ipv4)
	for _, d := range []setDecl{
		{name: "s", key: []field{addr}, timeout: time.Minute},
		{name: "s", key: []field{addr}, comment: "c"},
		{name: "m", key: []field{addr}, verdict: true, comment: "c"},
		{name: "m", key: []field{daddr(ipv4)}, value: []field{protocolDport(TCP)}, timeout: time.Minute},
	} {
		if _, err := d.wire(genA); err == nil {
			t.Errorf("%#v: no error", d)
		}
	}
}
