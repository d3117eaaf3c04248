package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// poolFixture is two nodes, a BGP pool scoped to some services with two
// advertisements, IPv4 and an IPv6 /64, an L2 pool, a pool with the one
// advertisement of the previous release, and two LoadBalancer
// services the BGP pool gives addresses to (api one of each family).
const poolFixture = `kind: Node
metadata: {name: node1, labels: {rack: r1}}
addresses: [192.0.2.11]
---
kind: Node
metadata: {name: node2, labels: {rack: r2}}
addresses: [192.0.2.12]
---
kind: AddressPool
metadata: {name: public, labels: {tier: edge}}
addresses: [203.0.113.0/28, "2001:db8:113::/64"]
avoid_buggy_ips: true
service_allocation:
  priority: 1
  namespaces: [default]
  service_selector: {expose: public}
bgp_advertisements:
- service_selector: {env: prod}
  communities: ["64512:1", "large:64512:1:2"]
  local_preference: 200
  peers: [tor-a]
- node_selector: {rack: r1}
  communities: [no-export]
  aggregation_length: 28
---
kind: AddressPool
metadata: {name: lan}
addresses: [192.0.2.200-192.0.2.209]
manual_only: true
l2_advertisement:
  interfaces: [eth0]
  node_selector: {rack: r2}
---
kind: AddressPool
metadata: {name: legacy}
addresses: [198.51.100.0/29]
bgp_advertisement: {peers: [tor-b], local_preference: 50, aggregation_length_v6: 120, max_announcing_nodes: 3}
---
kind: Service
metadata: {name: web, labels: {expose: public, env: prod}}
spec:
  type: SERVICE_TYPE_LOAD_BALANCER
  cluster_ips: [10.96.0.30]
  ports: [{name: http, port: 80, node_port: 30081}]
---
kind: Service
metadata: {name: api, labels: {expose: public}}
spec:
  type: SERVICE_TYPE_LOAD_BALANCER
  cluster_ips: [10.96.0.31, "fd00:96::31"]
  ports: [{name: http, port: 443, node_port: 30443}]
`

// TestDescribePool: a pool's page names every advertisement with its
// selectors and attributes, the services holding its addresses, and
// counts them per family without listing a /64.
func TestDescribePool(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(poolFixture, "apply", "-f", "-")
	e.addresses("default/web", 1)
	e.addresses("default/api", 2)
	for _, args := range [][]string{{"describe", "pool", "public"}, {"describe", "addresspool", "public"}} {
		golden(t, strings.Join(args, " "), e.mustLbctl("", args...), `
Name:              public
Labels:            tier=edge
Source:            native
Created:           0s ago
Addresses:         203.0.113.0-203.0.113.15,2001:db8:113::-2001:db8:113:0:ffff:ffff:ffff:ffff
Mode:              bgp
Auto-Assign:       yes
Avoid Buggy IPs:   yes
In Use:            IPv4 2 of 15, IPv6 1 of at least 2^63
Service Allocation:
  Priority:             1
  Namespaces:           default
  Namespace Selector:   all
  Service Selector:     expose=public

BGP advertisements:
  NODE SELECTOR   SERVICE SELECTOR   PEERS   COMMUNITIES               LOCAL PREF   AGGREGATION   MAX NODES
  all             env=prod           tor-a   64512:1,large:64512:1:2   200          /32,/128      all
  rack=r1         all                all     no-export                 <none>       /28,/128      all

Addresses in use:
  ADDRESS          SERVICE
  203.0.113.1      default/web
  203.0.113.2      default/api
  2001:db8:113::   default/api
`)
	}
	golden(t, "describe pool lan", e.mustLbctl("", "describe", "pool", "lan"), `
Name:                 lan
Labels:               <none>
Source:               native
Created:              0s ago
Addresses:            192.0.2.200-192.0.2.209
Mode:                 l2
Auto-Assign:          no (only to services that ask for the pool or one of its addresses)
Avoid Buggy IPs:      no
In Use:               IPv4 0 of 10
Service Allocation:   <none> (every service, after the scoped pools)

L2 Advertisement:
  Interfaces:         eth0
  Node Selector:      rack=r2
  Service Selector:   all

Addresses in use:  <none>
`)
	// An L2 pool announced over BGP too shows both ways, each with the
	// nodes it selects.
	e.mustLbctl(`kind: AddressPool
metadata: {name: lan-routed}
addresses: [192.0.2.210-192.0.2.219]
l2_advertisement:
  node_selector: {rack: r2}
bgp_advertisements:
- node_selector: {rack: r1}
  peers: [tor-a]
`, "apply", "-f", "-")
	golden(t, "describe pool lan-routed", e.mustLbctl("", "describe", "pool", "lan-routed"), `
Name:                 lan-routed
Labels:               <none>
Source:               native
Created:              0s ago
Addresses:            192.0.2.210-192.0.2.219
Mode:                 l2+bgp
Auto-Assign:          yes
Avoid Buggy IPs:      no
In Use:               IPv4 0 of 10
Service Allocation:   <none> (every service, after the scoped pools)

L2 Advertisement:
  Interfaces:         <every interface whose subnet holds the address>
  Node Selector:      rack=r2
  Service Selector:   all

BGP advertisements:
  NODE SELECTOR   SERVICE SELECTOR   PEERS   COMMUNITIES   LOCAL PREF   AGGREGATION   MAX NODES
  rack=r1         all                tor-a   <none>        <none>       /32,/128      all

Addresses in use:  <none>
`)
	// The one advertisement of a pool is for every node and service.
	want := "  NODE SELECTOR   SERVICE SELECTOR   PEERS   COMMUNITIES   LOCAL PREF   AGGREGATION   MAX NODES\n" +
		"  all             all                tor-b   <none>        50           /32,/120      3\n"
	if out := e.mustLbctl("", "describe", "pool", "legacy"); !strings.Contains(out, want) {
		t.Errorf("describe pool legacy: want its advertisement\n%s\ngot\n%s", want, out)
	}

	var doc struct {
		Pool struct {
			Kind              string            `json:"kind"`
			BgpAdvertisements []json.RawMessage `json:"bgp_advertisements"`
		} `json:"addresspool"`
		Services []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Status struct {
				LoadBalancerIPs []string `json:"load_balancer_ips"`
			} `json:"status"`
		} `json:"services"`
	}
	out := e.mustLbctl("", "describe", "pool", "public", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("describe pool -o json does not parse: %v\n%s", err, out)
	}
	var held []string
	for _, s := range doc.Services {
		held = append(held, s.Metadata.Name+" "+strings.Join(s.Status.LoadBalancerIPs, ","))
	}
	// By the first address each holds, each service once.
	if want := []string{"web 203.0.113.1", "api 203.0.113.2,2001:db8:113::"}; doc.Pool.Kind != "AddressPool" || len(doc.Pool.BgpAdvertisements) != 2 || !slices.Equal(held, want) {
		t.Errorf("describe pool -o json: pool %+v, services %q, want %q\n%s", doc.Pool, held, want, out)
	}
}

// addresses waits until the service NAMESPACE/NAME holds n load-balancer
// IPs: the server assigns them after the write.
func (e *env) addresses(svc string, n int) {
	e.t.Helper()
	ns, name, _ := strings.Cut(svc, "/")
	var got []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		r, err := e.registry.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: ns, Name: name})
		if err != nil {
			e.t.Fatal(err)
		}
		if got = r.GetService().GetStatus().GetLoadBalancerIps(); len(got) == n {
			return
		}
	}
	e.t.Fatalf("service %s holds %q, want %d addresses", svc, got, n)
}
