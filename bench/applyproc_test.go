package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// envBin names a pgreorder binary built beforehand (go build ./cmd/pgreorder): the benchmarks
// that start pgreorder run it instead of building one, so that they run where there is no go
// command (a test binary made with go test -c, on a benchmark machine; bench/offline).
const envBin = "PGREORDER_BENCH_BIN"

// buildPgreorder builds the module's ./cmd/pgreorder into dir and returns the binary's path, or
// returns PGREORDER_BENCH_BIN's binary without building. The benchmarks run from the package
// folder, bench/, one below the module root.
func buildPgreorder(dir string) (string, error) {
	if bin := os.Getenv(envBin); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			return "", fmt.Errorf("%s=%s: %v", envBin, bin, err)
		}
		if fi, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("%s=%s: %v", envBin, bin, err)
		} else if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s: not an executable file (build one with go build -o PATH ./cmd/pgreorder)", envBin, bin)
		}
		return abs, nil
	}
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("building pgreorder: no go.mod in %s (run the benchmarks from the bench folder, as go test does)", root)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building pgreorder: %v (the go command must be on PATH, or %s name a pgreorder binary)", err, envBin)
	}
	bin := filepath.Join(dir, "pgreorder")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/pgreorder")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/pgreorder: %v\n%s", err, out)
	}
	return bin, nil
}

// process is a running `pgreorder apply`: its output goes to a log file, quoted when it fails.
type process struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once waited for
	err     error         // Wait's result, set before exited is closed
	stopped bool          // stop sent the signal: exiting is expected

	name       string         // in messages: "pgreorder apply" unless set
	stopSignal syscall.Signal // what stop sends: SIGTERM unless set
}

// startProcess starts bin with args in dir, its output into logPath, env added to this process's
// environment.
func startProcess(bin string, args []string, dir, logPath string, env []string) (*process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Killed if this process dies (a benchmark timeout), as pgtest does with its servers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &process{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// failed returns an error, with the end of the process's output, once it exited on its own.
func (p *process) failed(context.Context) error {
	select {
	case <-p.exited:
		status := "exit status 0"
		if p.err != nil {
			status = p.err.Error()
		}
		return fmt.Errorf("%s exited (%s):\n%s", p.label(), status, p.tail())
	default:
		return nil
	}
}

// stop sends SIGTERM and waits for the process to exit (a minute, then SIGKILL). An exit
// status other than 0 is reported with the process's output.
func (p *process) stop(ctx context.Context) error {
	select {
	case <-p.exited:
		return p.failed(ctx)
	default:
	}
	p.stopped = true
	sig := p.stopSignal
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not exit within a minute of %v; killed:\n%s", p.label(), sig, p.tail())
	}
	if p.err != nil {
		return fmt.Errorf("%s, stopped with %v: %v:\n%s", p.label(), sig, p.err, p.tail())
	}
	return nil
}

// tail returns the last lines of the process's output.
func (p *process) tail() string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	data = bytes.TrimSpace(data)
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	if len(data) == 0 {
		return "(no output)"
	}
	return string(data)
}

func (p *process) label() string {
	if p.name != "" {
		return p.name
	}
	return "pgreorder apply"
}
