package bgpnumbers

import "testing"

func TestValidateASN(t *testing.T) {
	for _, a := range []uint32{1, 64512, 65535, 65536, 4200000000, 4294967295} {
		if err := ValidateASN(a); err != nil {
			t.Errorf("%d: %v", a, err)
		}
	}
	for _, a := range []uint32{0, 23456} {
		if err := ValidateASN(a); err == nil {
			t.Errorf("%d accepted", a)
		}
	}
}
