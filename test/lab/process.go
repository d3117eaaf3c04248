package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
const stopGrace = 3 * time.Second

// Process is a long-lived process started with Netns.Start.
type Process struct {
	Cmd     *exec.Cmd
	LogPath string

	done chan struct{} // closed once Cmd.Wait returned
	err  error         // result of Cmd.Wait
}

// Stop sends SIGTERM to the process group, waits up to 3 s, then sends
// SIGKILL. It is idempotent and returns nil once the process is gone.
func (p *Process) Stop() error {
	if p.exited() {
		return nil
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
		return p.Kill()
	}
}

// Kill sends SIGKILL to the process group at once, like a crash, and waits
// for the process to exit.
func (p *Process) Kill() error {
	if p.exited() {
		return nil
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

// Wait waits for the process to exit and returns its exit error.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// Log returns the contents of the process's log file.
func (p *Process) Log() string {
	if p == nil {
		return "(not started)"
	}
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(log unavailable: %v)", err)
	}
	return string(b)
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool { return p.exited() }

func (p *Process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) error { return p.signal(sig) }

// signal signals the whole group (Setpgid made pgid == pid), so children
// die with the process.
func (p *Process) signal(sig syscall.Signal) error {
	err := syscall.Kill(-p.Cmd.Process.Pid, sig)
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("lab: signal %v to process group %d: %w", sig, p.Cmd.Process.Pid, err)
	}
	return nil
}
