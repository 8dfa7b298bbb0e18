// Package proc runs the repository's commands as child processes for the
// multi-process tools (internal/tools/chaos, internal/tools/bench): it builds the
// commands, finds free loopback ports, starts, awaits and stops long-running
// processes, and runs one-shot tools such as migrate and billingctl.
package proc

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build builds the four commands (server, stripesim, billingctl, migrate)
// of the module at repoDir into dir.
func Build(ctx context.Context, repoDir, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "./cmd/server", "./cmd/stripesim", "./cmd/billingctl", "./cmd/migrate")
	cmd.Dir = repoDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w: %s", err, out)
	}
	return nil
}

// Commands builds the four commands of the module at repoDir, as Build
// does, into the checkout's .tmp/bin-tools, and returns that directory.
// Every tool and test of one checkout shares it: go build leaves binaries
// that are up to date alone, so only the first build after a change links
// (a few seconds each). Builds are serialized by a lock file; a build
// replaces a binary by a new file, so a process running the old one is
// not disturbed.
func Commands(ctx context.Context, repoDir string) (string, error) {
	dir := filepath.Join(repoDir, ".tmp", "bin-tools")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("error locking %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing unlocks too
	if err := Build(ctx, repoDir, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Proc is one long-running process, restartable with the same command and
// environment; its output is appended to a log file. Set the exported
// fields, then Start it.
type Proc struct {
	Name    string
	Bin     string
	Args    []string
	Env     []string // added to this process's own environment
	LogPath string
	Ready   string // URL answering 200 once the process is up; empty: none

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts the process in its own process group, killed with the
// calling process if that one dies.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group (a kill reaches all of it), and killed with the
	// run if the run itself dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// Pid returns the process id of the latest start, or 0 before the first.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL (no chance to clean up, like a crashed host) and waits.
func (p *Proc) Kill() {
	p.signal(syscall.SIGKILL, 10*time.Second)
}

// Stop sends SIGTERM and waits, killing after timeout.
func (p *Proc) Stop(timeout time.Duration) {
	p.signal(syscall.SIGTERM, timeout)
	p.signal(syscall.SIGKILL, 10*time.Second)
}

func (p *Proc) signal(sig syscall.Signal, wait time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || done == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-done:
	case <-time.After(wait):
	}
}

// WaitReady polls the Ready URL until it answers 200.
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration) error {
	if p.Ready == "" {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !p.Running() {
			return fmt.Errorf("%s exited during start; see %s", p.Name, p.LogPath)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Ready, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after %s; see %s", p.Name, timeout, p.LogPath)
}

// RunTool runs bin to completion with env added to this process's
// environment, and returns its combined output.
func RunTool(ctx context.Context, bin string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %v: %w: %s", filepath.Base(bin), args, err, out)
	}
	return string(out), nil
}

// ModuleRoot returns the root directory of the Go module the current
// directory belongs to (go env GOMOD), where Build finds the commands.
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module (go env GOMOD: %q): run from inside the Tally repository", gomod)
	}
	return filepath.Dir(gomod), nil
}
