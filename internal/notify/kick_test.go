package notify

import (
	"testing"
	"time"
)

// Kicks made before the loop looks fold into one round; a kick made after
// the loop took its round asks for another.
func TestKickFoldsAndIsNeverLost(t *testing.T) {
	var k Kick
	for range 5 {
		k.Kick()
	}
	select {
	case <-k.C():
	default:
		t.Fatal("five kicks asked for no round")
	}
	select {
	case <-k.C():
		t.Fatal("five kicks before one round asked for two")
	default:
	}
	k.Kick()
	select {
	case <-k.C():
	case <-time.After(time.Second):
		t.Fatal("a kick after a round was lost")
	}
}
