package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Netns is a named network namespace (/run/netns/<Name>) of a lab.
type Netns struct {
	Name string
	lab  *Lab
}

func (n *Netns) path() string { return filepath.Join("/run/netns", n.Name) }

func (n *Netns) String() string { return n.Name }

// Run runs name with args inside the namespace and returns its combined
// output. The error includes the output.
func (n *Netns) Run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	// Don't hang on grandchildren that keep the output pipe open.
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %s %s: %w: %s", n.Name, name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Start starts a long-lived process inside the namespace, in its own process
// group, with stdout and stderr going to a log file in the lab's Dir. The
// lab stops it on Close.
func (n *Netns) Start(name string, args ...string) (*Process, error) {
	l := n.lab
	// Hold the lock across Start so Close cannot miss the process.
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("lab: Start %s in %s: lab is closed", name, n.Name)
	}
	l.seq++
	logPath := filepath.Join(l.Dir, fmt.Sprintf("%s-%s-%d.log", n.Name, filepath.Base(name), l.seq))
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer f.Close() // the child has its own copy

	// ip netns exec execs name in place, so the PID is the process itself.
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("lab: start %s in %s: %w", name, n.Name, err)
	}
	p := &Process{Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	l.procs = append(l.procs, p)
	return p, nil
}

// Do runs fn on an OS thread that has joined the namespace. Only that thread
// switches: fn must not hand work that depends on the namespace to other
// goroutines. Sockets created by fn stay in the namespace and may be used
// from anywhere afterwards.
func (n *Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	// A fresh goroutine, so that if switching back fails we can return with
	// the thread still locked: the runtime then destroys the thread instead
	// of reusing it in the wrong namespace.
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("lab: open current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(n.path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("lab: open netns %s: %w", n.Name, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("lab: enter netns %s: %w", n.Name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("lab: leave netns %s: %w", n.Name, err))
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// DialContext dials from inside the namespace. The host in addr must be an
// IP literal: name resolution and Happy Eyeballs would run on other threads.
func (n *Netns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return nil, fmt.Errorf("lab: dial %s from %s: host must be an IP literal", addr, n.Name)
	}
	var c net.Conn
	err = n.Do(func() error {
		d := net.Dialer{FallbackDelay: -1}
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil && c != nil {
		c.Close()
		c = nil
	}
	return c, err
}

// HTTPClient returns a client whose connections originate in the namespace.
// Keep-alives are off, so every request is a new connection and therefore a
// new load-balancing (DNAT) decision.
func (n *Netns) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:       n.DialContext,
			DisableKeepAlives: true,
		},
	}
}

// sysctls writes /proc/sys/<key> = value for each entry, inside the namespace
// (net sysctls are resolved against the writing thread's namespace). Keys
// the kernel lacks are skipped if optional is set.
func (n *Netns) sysctls(kv map[string]string, optional bool) error {
	return n.Do(func() error {
		for k, v := range kv {
			f, err := os.OpenFile(filepath.Join("/proc/sys", k), os.O_WRONLY, 0)
			if err == nil {
				_, err = f.WriteString(v)
				err = errors.Join(err, f.Close())
			}
			if err != nil && !(optional && errors.Is(err, os.ErrNotExist)) {
				return fmt.Errorf("lab: sysctl %s in %s: %w", k, n.Name, err)
			}
		}
		return nil
	})
}

// ipBatch runs `ip -batch` inside the namespace; one process per namespace
// keeps setup fast.
func (n *Netns) ipBatch(ctx context.Context, cmds []string) error {
	if len(cmds) == 0 {
		return nil
	}
	cmd := exec.CommandContext(ctx, "ip", "-n", n.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("lab: ip -n %s -batch: %w: %s\ncommands:\n%s", n.Name, err, out, strings.Join(cmds, "\n"))
	}
	return nil
}
