package draintimeout

import (
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{
		{0, true},
		{time.Second, true},
		{10 * time.Minute, true},
		{Max, true},
		{-time.Second, false},
		{500 * time.Millisecond, false},
		{1500 * time.Millisecond, false},
		{time.Nanosecond, false},
		{Max + time.Second, false},
	} {
		if err := Check(tc.d); (err == nil) != tc.ok {
			t.Errorf("Check(%v) = %v, want ok %v", tc.d, err, tc.ok)
		}
	}
}
