package datapath

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

// Session affinity (ClientIP) follows kube-proxy: every endpoint of an
// affinity service port has a set of the clients it served recently; a
// new connection from a client in one of those sets goes to that endpoint,
// any other picks one at random and records the client. These chains and
// sets exist only for affinity service ports, so the flat layout stays flat
// for the rest. The sets belong to the endpoint, not to a frontend: a
// client keeps its endpoint across every frontend of the service port, and
// loses it when the endpoint goes.

// ownedObject is a chain or set that belongs to one service.
type ownedObject struct {
	family *family
	name   string
	set    *knftables.Set // a set, or else a chain with rules
	rules  []string
}

// definition renders the object so that two versions compare equal only
// when they program the same thing.
func (o ownedObject) definition() string {
	if o.set != nil {
		return fmt.Sprintf("set %s %v %v", o.set.Type, o.set.Flags, *o.set.Timeout)
	}
	return "chain\n" + strings.Join(o.rules, "\n")
}

func (o ownedObject) id() objID { return objID{o.family, o.name} }

type objID struct {
	family *family
	name   string
}

// create returns what a transaction adds to create o (empty, for a chain:
// the rules come separately, once every chain exists).
func (o ownedObject) create() knftables.Object {
	if o.set != nil {
		return o.set
	}
	return &knftables.Chain{Name: o.name}
}

func port(p uint16) string { return strconv.Itoa(int(p)) }

func shortHash(parts ...string) string { return fmt.Sprintf("%08x", hash32(parts...)) }

func hash32(parts ...string) uint32 {
	h := fnv.New32a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum32()
}

// affinityChain names the chain that picks, with affinity, among the local
// endpoints of service port id, or all its endpoints.
func affinityChain(id uint32, local bool) string {
	which := "cluster"
	if local {
		which = "local"
	}
	return fmt.Sprintf("affinity_%08x_%s", id, which)
}

// affinity builds the chains and sets of one affinity service port.
type affinity struct {
	f       *family
	id      uint32 // names the service port
	proto   Protocol
	timeout time.Duration
	mark    uint32
	objs    map[string]ownedObject
}

func newAffinity(f *family, svc *Service, sp ServicePort, mark uint32) *affinity {
	return &affinity{
		f: f,
		// The timeout is part of the name: a set's timeout cannot change
		// in place, so a new timeout makes new sets.
		id:      hash32(svc.Key.String(), sp.Name, sp.Protocol.String(), port(sp.Port), svc.SessionAffinityTimeout.String()),
		proto:   sp.Protocol,
		timeout: svc.SessionAffinityTimeout,
		mark:    mark,
		objs:    map[string]ownedObject{},
	}
}

// chainFor makes the chain that picks among eps with affinity, the local
// endpoints or all, and returns the frontends map's value that goes to it.
func (a *affinity) chainFor(local bool, eps []Endpoint) fields {
	chain := affinityChain(a.id, local)
	var rules, picks []string
	for i, ep := range eps {
		set, epChain := a.endpoint(ep)
		rules = append(rules, a.f.ip+" saddr @"+set+" goto "+epChain)
		picks = append(picks, strconv.Itoa(i)+" : goto "+epChain)
	}
	// " , " and not ", ": knftables.Fake reads "goto X," as chain "X,".
	rules = append(rules, "numgen random mod "+strconv.Itoa(len(eps))+" vmap { "+strings.Join(picks, " , ")+" }")
	a.objs[chain] = ownedObject{family: a.f, name: chain, rules: rules}
	var ref fields
	ref.affinityRef(a.id, local)
	return ref
}

// endpoint makes the set and the DNAT chain of one endpoint.
func (a *affinity) endpoint(ep Endpoint) (set, chain string) {
	eid := shortHash(ep.AddrPort().String())
	set = fmt.Sprintf("affinity_%08x_%s", a.id, eid)
	chain = set + "_dnat"
	timeout := a.timeout
	a.objs[set] = ownedObject{family: a.f, name: set, set: &knftables.Set{
		Name: set, Type: a.f.addrType, Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: &timeout,
	}}
	a.objs[chain] = ownedObject{family: a.f, name: chain, rules: []string{
		"update @" + set + " { " + a.f.ip + " saddr }",
		knftables.Concat("meta l4proto", a.proto.String(), "meta mark set meta mark |", fmt.Sprintf("%#x", a.mark),
			"dnat", a.f.ip, "to", ep.AddrPort().String()),
	}}
	return set, chain
}

// objects lists what the service port owns, sets first.
func (a *affinity) objects() []ownedObject {
	out := make([]ownedObject, 0, len(a.objs))
	for _, o := range a.objs {
		out = append(out, o)
	}
	slices.SortFunc(out, func(x, y ownedObject) int {
		if (x.set == nil) != (y.set == nil) {
			if x.set != nil {
				return -1
			}
			return 1
		}
		return strings.Compare(x.name, y.name)
	})
	return out
}
