package lbtier

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// A report the server did not take is sent again, so the server never
// keeps showing a state the speaker has left; a newer status replaces it.
func TestAFailedReportIsSentAgain(t *testing.T) {
	var mu sync.Mutex
	var delivered []string
	failures := 2
	s := &Speaker{report: make(chan *weirv1.SpeakerStatus, 1)}
	s.cfg.Report = func(st *weirv1.SpeakerStatus) error {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return errors.New("server away")
		}
		delivered = append(delivered, st.GetName())
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.reporter(ctx)
	s.report <- &weirv1.SpeakerStatus{Name: "node2 unreachable"}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(delivered)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a report that failed twice was never delivered")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(delivered) != 1 || delivered[0] != "node2 unreachable" {
		t.Errorf("delivered %v", delivered)
	}
}
