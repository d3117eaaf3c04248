package main

import (
	"cmp"
	"context"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func (a *app) describePool(ctx context.Context, c client, _ weirv1.StatusServiceClient, o object, output string) (string, error) {
	pool := o.(*weirv1.AddressPool)
	services, err := listServices(ctx, c, &weirv1.ListServicesRequest{})
	if err != nil {
		return "", err
	}
	holders := poolHolders(pool, services)
	if output != "table" {
		var docs []proto.Message
		for _, h := range holders {
			if !slices.Contains(docs, proto.Message(h.service)) { // a service with two of the pool's addresses
				docs = append(docs, h.service)
			}
		}
		k, _ := kindFor("pool")
		return describeDocument(k, o, map[string]any{"services": docs}, output)
	}

	var b strings.Builder
	kv := slices.Concat(a.metaFields(o), poolFields(pool, holders))
	alloc := pool.GetServiceAllocation()
	if alloc == nil {
		kv = append(kv, "Service Allocation", "<none> (every service, after the scoped pools)")
	}
	fields(&b, "", kv...)
	if alloc != nil {
		allocationFields(&b, alloc)
	}
	b.WriteString("\n")
	// Each way the pool is announced, with the nodes it selects: an L2
	// pool announced over BGP too has both.
	if l2 := pool.GetL2Advertisement(); l2 != nil {
		l2Fields(&b, l2)
	}
	if mode := poolMode(pool); mode != "l2" {
		if mode == "l2+bgp" {
			b.WriteString("\n")
		}
		section(&b, "BGP advertisements", []string{"NODE SELECTOR", "SERVICE SELECTOR", "PEERS", "COMMUNITIES", "LOCAL PREF", "AGGREGATION", "MAX NODES"},
			advertisementRows(pool))
	}
	var rows [][]string
	for _, h := range holders {
		m := h.service.GetMetadata()
		rows = append(rows, []string{h.address.String(), m.GetNamespace() + "/" + m.GetName()})
	}
	b.WriteString("\n")
	section(&b, "Addresses in use", []string{"ADDRESS", "SERVICE"}, rows)
	return b.String(), nil
}

// poolFields are a pool's addresses, how they are given out and how many
// services hold.
func poolFields(pool *weirv1.AddressPool, holders []holder) []string {
	autoAssign := "yes"
	if pool.GetManualOnly() {
		autoAssign = "no (only to services that ask for the pool or one of its addresses)"
	}
	return []string{
		"Addresses", list(pool.GetAddresses()),
		"Mode", poolMode(pool),
		"Auto-Assign", autoAssign,
		"Avoid Buggy IPs", yesNo(pool.GetAvoidBuggyIps()),
		"In Use", inUse(pool, holders),
	}
}

// allocationFields are the services a scoped pool serves, and its
// priority among the pools.
func allocationFields(b *strings.Builder, alloc *weirv1.ServiceAllocation) {
	priority := "<none> (after the pools with one)"
	if p := alloc.GetPriority(); p != 0 {
		priority = strconv.Itoa(int(p))
	}
	namespaces := "all"
	if len(alloc.GetNamespaces()) > 0 {
		namespaces = list(alloc.GetNamespaces())
	}
	b.WriteString("Service Allocation:\n")
	fields(b, "  ", "Priority", priority,
		"Namespaces", namespaces,
		"Namespace Selector", selector(alloc.GetNamespaceSelector()),
		"Service Selector", selector(alloc.GetServiceSelector()))
}

// l2Fields are where and for which services the nodes answer an L2
// pool's addresses.
func l2Fields(b *strings.Builder, l2 *weirv1.L2Advertisement) {
	interfaces := "<every interface whose subnet holds the address>"
	if len(l2.GetInterfaces()) > 0 {
		interfaces = list(l2.GetInterfaces())
	}
	b.WriteString("L2 Advertisement:\n")
	fields(b, "  ", "Interfaces", interfaces,
		"Node Selector", selector(l2.GetNodeSelector()),
		"Service Selector", selector(l2.GetServiceSelector()))
}

// advertisementRows are a BGP pool's advertisements, one row each: its
// several, or else its one (which, when not set, is every field's
// default: every node and service, every peer).
func advertisementRows(pool *weirv1.AddressPool) [][]string {
	advs := pool.GetBgpAdvertisements()
	if len(advs) == 0 {
		advs = []*weirv1.BgpAdvertisement{pool.GetBgpAdvertisement()}
	}
	var rows [][]string
	for _, adv := range advs {
		peers, localPref, maxNodes := "all", "<none>", "all"
		if len(adv.GetPeers()) > 0 {
			peers = list(adv.GetPeers())
		}
		if lp := adv.GetLocalPreference(); lp != 0 {
			localPref = strconv.FormatUint(uint64(lp), 10)
		}
		if n := adv.GetMaxAnnouncingNodes(); n != 0 {
			maxNodes = strconv.FormatUint(uint64(n), 10)
		}
		rows = append(rows, []string{selector(adv.GetNodeSelector()), selector(adv.GetServiceSelector()), peers, list(adv.GetCommunities()), localPref,
			fmt.Sprintf("/%d,/%d", cmp.Or(adv.GetAggregationLength(), 32), cmp.Or(adv.GetAggregationLengthV6(), 128)), maxNodes})
	}
	return rows
}

// selector is a label selector where empty selects everything.
func selector(m map[string]string) string {
	if len(m) == 0 {
		return "all"
	}
	return labels(m)
}

// holder is one service holding one address of a pool.
type holder struct {
	address netip.Addr
	service *weirv1.Service
}

// poolHolders are the LoadBalancer services holding addresses of pool,
// by address, as the server's pool metrics count them.
func poolHolders(pool *weirv1.AddressPool, services []*weirv1.Service) []holder {
	var out []holder
	for _, svc := range services {
		if svc.GetSpec().GetType() != weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER {
			continue
		}
		for _, ip := range svc.GetStatus().GetLoadBalancerIps() {
			if addr, err := netip.ParseAddr(ip); err == nil && inPool(pool, addr) {
				out = append(out, holder{addr, svc})
			}
		}
	}
	slices.SortStableFunc(out, func(x, y holder) int { return x.address.Compare(y.address) })
	return out
}

func inPool(pool *weirv1.AddressPool, addr netip.Addr) bool {
	for _, r := range pool.GetAddresses() {
		if first, last, ok := addressRange(r); ok && first.Is4() == addr.Is4() && first.Compare(addr) <= 0 && addr.Compare(last) <= 0 {
			return true
		}
	}
	return false
}

// inUse is, per address family of the pool, the addresses services hold
// (an address shared by several services counts once) of those the pool
// gives out: "IPv4 2 of 14, IPv6 0 of at least 2^63". Counted, never
// listed: an IPv6 pool may be a /64.
func inUse(pool *weirv1.AddressPool, holders []holder) string {
	size := map[bool]*big.Int{true: new(big.Int), false: new(big.Int)} // by Is4
	for _, r := range pool.GetAddresses() {
		first, last, ok := addressRange(r)
		if !ok {
			continue
		}
		size[first.Is4()].Add(size[first.Is4()], rangeSize(first, last, pool.GetAvoidBuggyIps()))
	}
	held := map[netip.Addr]bool{}
	for _, h := range holders {
		held[h.address] = true
	}
	var out []string
	for _, is4 := range []bool{true, false} {
		if size[is4].Sign() == 0 {
			continue
		}
		n := 0
		for addr := range held {
			if addr.Is4() == is4 {
				n++
			}
		}
		family := "IPv6"
		if is4 {
			family = "IPv4"
		}
		out = append(out, fmt.Sprintf("%s %d of %s", family, n, count(size[is4])))
	}
	return orNone(strings.Join(out, ", "))
}

// count is n, or "at least 2^63" beyond what the server's pool metrics
// count.
func count(n *big.Int) string {
	if !n.IsInt64() {
		return "at least 2^63"
	}
	return n.String()
}
