package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// The 4-byte ASNs of a fabric's rack (RFC 6996's private range), wider
// than an int32: the router's and the nodes'.
const (
	wideRouterASN = 4200000100
	wideNodeASN   = 4200000001
)

// TestFourByteASNsAndLargeCommunitiesReachTheRouter: node speakers in AS
// 4200000001, given their peer through the API, establish sessions with a
// router in AS 4200000100, and the router's RIB holds the pool's address
// with AS path 4200000001 and both the standard and the large community
// the pool names, with FRR and with BIRD.
func TestFourByteASNsAndLargeCommunitiesReachTheRouter(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) {
			// A later --bgp-asn wins over the lab's default.
			wide := func(*lab.Node) []string { return []string{"--bgp-asn", fmt.Sprint(wideNodeASN)} }
			var c *weirlab.Cluster
			var r bgpRouter
			var attributes func(ctx context.Context, prefix string) (string, error)
			if impl == "FRR" {
				var f *frr.Router
				c, f = startBGPClusterWith(t, wide, frr.Config{ASN: wideRouterASN, RouterID: lab.RouterLANv4.String(), PeerASN: wideNodeASN,
					ListenRanges: []string{"192.0.2.0/24"}})
				r, attributes = f, func(ctx context.Context, prefix string) (string, error) { return frrAttributes(ctx, f, prefix) }
			} else {
				requireBIRD(t)
				c = startSpeakingCluster(t, wide)
				b := startBIRD(t, c, bird.Config{ASN: wideRouterASN, RouterID: lab.RouterLANv4.String(), ListenRanges4: []string{"192.0.2.0/24"}, PeerASN: wideNodeASN})
				r, attributes = b, func(ctx context.Context, prefix string) (string, error) { return birdAttributes(ctx, b, prefix) }
			}
			ctx := context.Background()
			if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
				Metadata: &weirv1.ObjectMeta{Name: "rack-tor"}, Address: lab.RouterLANv4.String(), Asn: wideRouterASN, MyAsn: wideNodeASN}}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
				Metadata: &weirv1.ObjectMeta{Name: "rack"}, Addresses: []string{"203.0.113.88/29"},
				BgpAdvertisement: &weirv1.BgpAdvertisement{Communities: []string{"64512:100", "large:4200000001:1:4294967295"}}}}); err != nil {
				t.Fatal(err)
			}
			createService(t, c, lbService("wide", 30120, []string{"10.96.0.90"}, []string{"203.0.113.90"}), c.Pods())
			waitNextHops(t, r, "203.0.113.90", c.Nodes[0].IPv4.String(), c.Nodes[1].IPv4.String())
			want := fmt.Sprintf("as path %d; communities 64512:100; large communities 4200000001:1:4294967295", wideNodeASN)
			eventually(t, "the router's paths carry the nodes' AS and both communities", func() error {
				got, err := attributes(ctx, "203.0.113.90/32")
				if err != nil {
					return err
				}
				if got != want+"\n"+want {
					return fmt.Errorf("the router's two paths:\n%s\nwant each %q\n%s", got, want, r.Describe(ctx, "203.0.113.90"))
				}
				return nil
			})
		})
	}
}

// frrAttributes is, per path FRR has for prefix, its AS path and
// communities, one line each.
func frrAttributes(ctx context.Context, r *frr.Router, prefix string) (string, error) {
	out, err := r.Vtysh(ctx, "show bgp ipv4 unicast "+prefix+" json")
	if err != nil {
		return "", err
	}
	type text struct {
		String string `json:"string"`
	}
	var route struct {
		Paths []struct {
			ASPath         text `json:"aspath"`
			Community      text `json:"community"`
			LargeCommunity text `json:"largeCommunity"`
		} `json:"paths"`
	}
	if err := json.Unmarshal([]byte(out), &route); err != nil {
		return "", fmt.Errorf("%w: %s", err, out)
	}
	var lines []string
	for _, p := range route.Paths {
		lines = append(lines, fmt.Sprintf("as path %s; communities %s; large communities %s", p.ASPath.String, p.Community.String, p.LargeCommunity.String))
	}
	return strings.Join(lines, "\n"), nil
}

// birdAttributes is frrAttributes' counterpart for BIRD, read from
// "show route all": BIRD writes (64512,100) and (4200000001, 1, 2).
func birdAttributes(ctx context.Context, r *bird.Router, prefix string) (string, error) {
	out, err := r.Birdc(ctx, "show route "+prefix+" all")
	if err != nil && strings.Contains(err.Error(), "Network not found") {
		return "", nil // birdc fails on a prefix with no paths
	}
	if err != nil {
		return "", err
	}
	var lines []string
	path := map[string]string{}
	flush := func() {
		if len(path) > 0 {
			lines = append(lines, fmt.Sprintf("as path %s; communities %s; large communities %s", path["BGP.as_path"], path["BGP.community"], path["BGP.large_community"]))
		}
		path = map[string]string{}
	}
	unbracket := strings.NewReplacer("(", "", ")", "", ", ", ":", ",", ":")
	for _, line := range strings.Split(out, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ": ")
		switch {
		case ok && name == "BGP.origin":
			flush() // each path's attributes start with its origin
			path[name] = value
		case ok && strings.HasPrefix(name, "BGP."):
			path[name] = unbracket.Replace(strings.TrimSpace(value))
		}
	}
	flush()
	return strings.Join(lines, "\n"), nil
}
