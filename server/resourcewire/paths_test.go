package resourcewire

import (
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
)

// TestEndpointSliceErrorsNameTheField: a bad address or node name is
// named by its whole path, though paths are written only for errors.
func TestEndpointSliceErrorsNameTheField(t *testing.T) {
	slice := func(mutate func(*weirv1.EndpointSlice)) *weirv1.EndpointSlice {
		s := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "shop", Name: "web-1"}, ServiceName: "web",
			Endpoints: []*weirv1.Endpoint{{Addresses: []string{"10.244.1.11"}, NodeName: "node1"}, {Addresses: []string{"10.244.1.12", "10.244.1.13"}, NodeName: "node2"}}}
		mutate(s)
		return s
	}
	for _, tc := range []struct {
		name   string
		mutate func(*weirv1.EndpointSlice)
		field  string
	}{
		{"not an address", func(s *weirv1.EndpointSlice) { s.Endpoints[1].Addresses[1] = "10.244.1" }, "endpoints[1].addresses[1]"},
		{"loopback", func(s *weirv1.EndpointSlice) { s.Endpoints[1].Addresses[0] = "127.0.0.1" }, "endpoints[1].addresses[0]"},
		{"two families", func(s *weirv1.EndpointSlice) { s.Endpoints[1].Addresses[1] = "fd00::13" }, "endpoints[1].addresses[1]"},
		{"a node name", func(s *weirv1.EndpointSlice) { s.Endpoints[0].NodeName = "Node_1" }, "endpoints[0].node_name"},
		{"no addresses", func(s *weirv1.EndpointSlice) { s.Endpoints[1].Addresses = nil }, "endpoints[1].addresses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := EndpointSliceFromProto(slice(tc.mutate))
			if err == nil {
				err = s.Validate()
			}
			fe, ok := model.AsFieldError(err)
			if !ok || fe.Field != tc.field {
				t.Errorf("error %v, want one for %s", err, tc.field)
			}
		})
	}
	s, err := EndpointSliceFromProto(slice(func(*weirv1.EndpointSlice) {}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err != nil {
		t.Errorf("a good slice: %v", err)
	}
}
