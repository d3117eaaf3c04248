package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"golang.org/x/sys/unix"
)

// Thread is an OS thread that has joined a namespace for good, to make many
// sockets there one after another. Do switches a thread in and out for each
// call, and a call waiting on a connect holds its thread meanwhile: a
// thousand connections dialed at once through Do are a thousand threads.
type Thread struct {
	run chan func()
}

// Thread starts a thread in the namespace. Close ends it (the thread is
// never handed back to Go's pool: it dies with its goroutine).
func (n *Netns) Thread() (*Thread, error) {
	t := &Thread{run: make(chan func())}
	joined := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Never the main thread: Go never ends it, and a namespace it
			// joins is the whole process's in /proc/PID/ns/net, where
			// `ip netns pids` finds the test itself (and the lab's Close
			// kills it). Another goroutine takes the job while this one
			// holds the main thread, so it cannot run there.
			locked := make(chan struct{})
			go func() {
				runtime.LockOSThread()
				close(locked)
				t.serve(n, joined)
			}()
			<-locked
			runtime.UnlockOSThread()
			return
		}
		t.serve(n, joined)
	}()
	if err := <-joined; err != nil {
		return nil, fmt.Errorf("lab: a thread in %s: %w", n.Name, err)
	}
	return t, nil
}

// serve joins n on the calling goroutine's locked thread, says so on
// joined, and runs what Do hands it until Close.
func (t *Thread) serve(n *Netns, joined chan<- error) {
	fd, err := unix.Open(n.path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
	}
	joined <- err
	if err != nil {
		return
	}
	for fn := range t.run {
		fn()
	}
}

// Do runs fn on the thread and waits for it. Sockets fn creates are in
// the namespace; goroutines it starts are not.
func (t *Thread) Do(fn func()) {
	done := make(chan struct{})
	t.run <- func() { fn(); close(done) }
	<-done
}

// DialFrom dials TCP to to from the local address from (port 0: any),
// inside the namespace.
func (t *Thread) DialFrom(ctx context.Context, from netip.Addr, to netip.AddrPort) (c net.Conn, err error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
	t.Do(func() { c, err = d.DialContext(ctx, "tcp", to.String()) })
	return c, err
}

// Close ends the thread; Do must not be called after it.
func (t *Thread) Close() { close(t.run) }
