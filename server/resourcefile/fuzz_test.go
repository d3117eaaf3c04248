package resourcefile

import (
	"os"
	"testing"
)

// FuzzParse: a resources file parses to resources that each pass their own
// checks, or to an error; never a panic.
func FuzzParse(f *testing.F) {
	f.Add(rack)
	if b, err := os.ReadFile("../../deploy/examples/rack.yaml"); err == nil {
		f.Add(string(b))
	}
	f.Add("kind: AddressPool\nmetadata: {name: v6}\naddresses: [2001:db8::/120]\nbgp_advertisement: {aggregation_length_v6: 64, communities: [\"64500:1\"]}\n")
	f.Fuzz(func(t *testing.T, data string) {
		r, err := Parse("fuzz.yaml", []byte(data))
		if err != nil {
			return
		}
		for _, p := range r.Pools {
			if err := p.Validate(); err != nil {
				t.Fatalf("parsed a pool its own check refuses: %v", err)
			}
		}
		for _, p := range r.Peers {
			if err := p.Validate(); err != nil {
				t.Fatalf("parsed a peer its own check refuses: %v", err)
			}
		}
	})
}
