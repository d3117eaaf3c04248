package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

func TestProbesAnswerBesideMetrics(t *testing.T) {
	var ready atomic.Bool
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metrics") })
	srv := httptest.NewServer(withProbes(metrics, ready.Load))
	defer srv.Close()
	status := func(path string) int {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		ready bool
		path  string
		want  int
	}{
		{false, "/readyz", http.StatusServiceUnavailable},
		{false, "/livez", http.StatusOK},
		{false, "/metrics", http.StatusOK},
		{true, "/readyz", http.StatusOK},
	} {
		ready.Store(tc.ready)
		if got := status(tc.path); got != tc.want {
			t.Errorf("ready=%v GET %s: %d, want %d", tc.ready, tc.path, got, tc.want)
		}
	}
}
