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

// startPerf attaches perf record (call graphs, 499 Hz) to pid, writing to data.
func startPerf(pid int, data string) (*perfRecorder, error) {
	cmd := exec.Command("perf", "record", "-F", "499", "-g", "-o", data, "-p", strconv.Itoa(pid))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf record: %w", err)
	}
	return &perfRecorder{cmd: cmd, data: data}, nil
}

// stop ends the recording and returns the top n lines of its report by symbol, self time only.
func (p *perfRecorder) stop(n int) (string, error) {
	p.cmd.Process.Signal(os.Interrupt)
	p.cmd.Wait()
	out, err := exec.Command("perf", "report", "-i", p.data, "--stdio", "--no-children", "--sort", "symbol", "-g", "none",
		"--percent-limit", "1").Output()
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
