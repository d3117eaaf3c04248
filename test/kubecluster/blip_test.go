package kubecluster_test

import (
	"testing"
	"time"
)

func TestWithinOneBlip(t *testing.T) {
	at := time.Date(2026, 11, 28, 2, 27, 45, 0, time.UTC)
	f := func(ms int) failure { return failure{at: at.Add(time.Duration(ms) * time.Millisecond), msg: "timeout"} }
	for _, tc := range []struct {
		what   string
		failed []failure
		ok     bool
	}{
		{"none", nil, true},
		{"one", []failure{f(0)}, true},
		{"two in one moment, either order", []failure{f(20), f(0)}, true},
		{"two moments", []failure{f(0), f(2000)}, false},
		{"three", []failure{f(0), f(10), f(20)}, false},
	} {
		if err := withinOneBlip(tc.failed); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.what, err, tc.ok)
		}
	}
}
