package notify

import "sync"

// Kick wakes one loop that does all its work on waking: kicks made while
// the loop works fold into one more round, never into a lost one. The
// zero Kick is ready to use; Kick never blocks.
type Kick struct {
	once sync.Once
	ch   chan struct{}
}

func (k *Kick) c() chan struct{} {
	k.once.Do(func() { k.ch = make(chan struct{}, 1) })
	return k.ch
}

// Kick asks for one more round of the loop.
func (k *Kick) Kick() {
	select {
	case k.c() <- struct{}{}:
	default:
	}
}

// C is received from once per round asked for since the last receive.
func (k *Kick) C() <-chan struct{} { return k.c() }
