package kubernetes

import (
	"slices"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEndpointHintsAreCopied: the EndpointSlice controller's hints are
// what the agents' topology follows, zones and nodes both.
func TestEndpointHintsAreCopied(t *testing.T) {
	node, zone := "node1", "a"
	s := endpointSlice(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.11"}, NodeName: &node, Zone: &zone,
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "a"}}, ForNodes: []discoveryv1.ForNode{{Name: "node1"}, {Name: "node2"}}}}},
	})
	if s == nil || len(s.Endpoints) != 1 {
		t.Fatalf("converted %+v", s)
	}
	e := s.Endpoints[0]
	if !slices.Equal(e.HintZones, []string{"a"}) || !slices.Equal(e.HintNodes, []string{"node1", "node2"}) {
		t.Errorf("hints: zones %v nodes %v", e.HintZones, e.HintNodes)
	}
}
