// Package testproc runs the real programs tests start (etcd, an apiserver)
// as children in their own process groups that die with the test binary,
// and finds free loopback ports for them.
package testproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Process is a child running in its own process group, logging to a file.
type Process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when cmd.Wait returns
	err  error         // cmd.Wait's result
}

// Start starts path with args in its own process group, logging to
// dir/NAME.log; it dies with the test binary.
func Start(dir, name, path string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("testproc: %w", err)
	}
	defer f.Close() // the child keeps its own descriptor
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own group, so Close can signal everything the process started.
		Setpgid: true,
		// Die with the test binary: a `go test` timeout exits without
		// running Close.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testproc: start %s: %w", name, err)
	}
	p := &Process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// WaitFor polls ok until it returns true, failing early if the process
// exits or ctx ends. Errors carry the tail of the process's log.
func (p *Process) WaitFor(ctx context.Context, ok func() bool) error {
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-p.done:
			return fmt.Errorf("testproc: %s exited during startup: %v\n%s", p.name, p.err, p.Tail())
		case <-ctx.Done():
			return fmt.Errorf("testproc: %s not ready after %v: %w\n%s", p.name, time.Since(start).Round(time.Millisecond), ctx.Err(), p.Tail())
		case <-tick.C:
		}
	}
	return nil
}

// Stop sends SIGTERM to the process group, waits up to grace for the
// process to exit, then sends SIGKILL to the group in any case, to catch
// children that outlived it.
func (p *Process) Stop(grace time.Duration) error {
	pgid := p.cmd.Process.Pid // Setpgid made them equal
	if err := signalGroup(pgid, syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	if err := signalGroup(pgid, syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

func signalGroup(pgid int, sig syscall.Signal) error {
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("testproc: signal %v to process group %d: %w", sig, pgid, err)
	}
	return nil
}

// Tail returns the end of the process's log for error messages.
func (p *Process) Tail() string {
	const max = 4096
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(%s log unavailable: %v)", p.name, err)
	}
	if len(b) > max {
		b = b[len(b)-max:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return fmt.Sprintf("--- tail of the %s log ---\n%s", p.name, b)
}

// Kill sends SIGKILL to the process group and waits for the process: a
// crash, with no chance to clean up.
func (p *Process) Kill() {
	signalGroup(p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Pid is the process's ID (and its group's).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1. Another process
// could take one before it is used; that is rare enough for tests.
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		// Keep each listener open until all are chosen, so they differ.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testproc: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
