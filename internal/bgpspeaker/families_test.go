package bgpspeaker

import (
	"testing"

	api "github.com/osrg/gobgp/v3/api"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestRemoteFamiliesAreWhatTheRouterOffered: a family counts as carried
// only when the router's OPEN offered it, whatever this side enabled.
func TestRemoteFamiliesAreWhatTheRouterOffered(t *testing.T) {
	mp := func(afi api.Family_Afi, safi api.Family_Safi) *anypb.Any {
		a, err := anypb.New(&api.MultiProtocolCapability{Family: &api.Family{Afi: afi, Safi: safi}})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	other, _ := anypb.New(&api.RouteRefreshCapability{})
	for _, tc := range []struct {
		name     string
		caps     []*anypb.Any
		ipv4, v6 bool
	}{
		{"IPv6 only", []*anypb.Any{other, mp(api.Family_AFI_IP6, api.Family_SAFI_UNICAST)}, false, true},
		{"both", []*anypb.Any{mp(api.Family_AFI_IP, api.Family_SAFI_UNICAST), mp(api.Family_AFI_IP6, api.Family_SAFI_UNICAST)}, true, true},
		{"no multiprotocol capability: IPv4 unicast", []*anypb.Any{other}, true, false},
		{"IPv4 flowspec is not unicast", []*anypb.Any{mp(api.Family_AFI_IP, api.Family_SAFI_FLOW_SPEC_UNICAST)}, false, false},
	} {
		got := remoteFamilies(tc.caps)
		if got[api.Family_AFI_IP] != tc.ipv4 || got[api.Family_AFI_IP6] != tc.v6 {
			t.Errorf("%s: ipv4 %v ipv6 %v, want %v %v", tc.name, got[api.Family_AFI_IP], got[api.Family_AFI_IP6], tc.ipv4, tc.v6)
		}
	}
}
