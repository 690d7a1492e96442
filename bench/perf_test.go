package bench

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// perfRecorder is `perf record` attached to one process, for a diagnosis: perf's own work runs
// on the same machine, so a run with it is not a measurement.
type perfRecorder struct {
	cmd  *exec.Cmd
	data string
}

// startPerf attaches perf record (call graphs, 499 Hz) to pid, or to every CPU for pid 0,
// writing to data.
func startPerf(pid int, data string) (*perfRecorder, error) {
	target := []string{"-p", strconv.Itoa(pid)}
	if pid == 0 {
		target = []string{"-a"}
	}
	cmd := exec.Command("perf", append([]string{"record", "-F", "499", "-g", "-o", data}, target...)...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf record: %w", err)
	}
	return &perfRecorder{cmd: cmd, data: data}, nil
}

// stop ends the recording and returns the top n lines of its report by symbol, self time only:
// of the processes pids only, if any are given.
func (p *perfRecorder) stop(n int, pids ...int) (string, error) {
	p.cmd.Process.Signal(os.Interrupt)
	p.cmd.Wait()
	args := []string{"report", "-i", p.data, "--stdio", "--no-children", "--sort", "symbol", "-g", "none", "--percent-limit", "1"}
	if len(pids) > 0 {
		list := make([]string, len(pids))
		for i, pid := range pids {
			list[i] = strconv.Itoa(pid)
		}
		args = append(args, "--pid", strings.Join(list, ","), "--percentage", "relative")
	}
	out, err := exec.Command("perf", args...).Output()
	if err != nil {
		return "", fmt.Errorf("perf report: %w", err)
	}
	var top []string
	for line := range strings.Lines(string(out)) {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			top = append(top, t)
		}
	}
	return strings.Join(top[:min(len(top), n)], "\n"), nil
}
