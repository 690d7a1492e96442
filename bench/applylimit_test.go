package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// The catch-up's limit: PostgreSQL's own pg_recvlogical (the installation's, else another's)
// reading the backlog from a pgoutput
// slot into /dev/null, applying nothing. A subscriber's catch-up cannot be shorter than the time
// the publisher takes to decode and send the backlog, which this measures.

// recvLogical is pg_recvlogical, from the bin folder of the pair's installation.
type recvLogical struct{}

func (recvLogical) name() string { return "limit" }

func (recvLogical) supports(int) error { return nil }

// readsOnly marks a contender that applies nothing: the catch-up does not wait for the marker
// on the subscriber nor compare the tables.
func (recvLogical) readsOnly() {}

// binary returns the pair's installation's pg_recvlogical, or when that installation has none
// (a server-only package), the one of the newest other installation, else the one on PATH (client
// tools without a server, as on a benchmark machine): the replication protocol and the plugin
// options are the server's, whichever client sends them.
func (recvLogical) binary(p *pair) (bin, libDir string, err error) {
	bin = filepath.Join(p.install.BinDir, "pg_recvlogical")
	if _, err = os.Stat(bin); err == nil {
		return bin, p.install.LibDir, nil
	}
	installs := pgtest.AllInstalls() // PGREORDER_PG_VERSIONS may leave out the one that has it
	for i := len(installs) - 1; i >= 0; i-- {
		other := filepath.Join(installs[i].BinDir, "pg_recvlogical")
		if _, serr := os.Stat(other); serr == nil {
			return other, installs[i].LibDir, nil
		}
	}
	if other, perr := exec.LookPath("pg_recvlogical"); perr == nil {
		return other, "", nil
	}
	return "", "", fmt.Errorf("limit: no pg_recvlogical in %s, in another installation or on PATH: %w", p.install.BinDir, err)
}

// probe skips the limit when no pg_recvlogical is installed, and logs the one it uses.
func (l recvLogical) probe(p *pair) error {
	bin, _, err := l.binary(p)
	if err == nil && filepath.Dir(bin) != p.install.BinDir {
		p.tb.Logf("limit: %s has no pg_recvlogical; using %s", p.install.BinDir, bin)
	}
	return err
}

// pgoutputOptions are the plugin options of the limit, those of PostgreSQL's subscriber of the
// same major: protocol 4 with streaming = parallel on 16 and later, 3 with streaming on before.
func pgoutputOptions(major int) []string {
	proto, streaming := "3", "on"
	if major >= 16 {
		proto, streaming = "4", "parallel"
	}
	return []string{"-o", "proto_version=" + proto, "-o", "publication_names=pub", "-o", "streaming=" + streaming}
}

func (l recvLogical) start(ctx context.Context, r *run) (applying, error) {
	bin, libDir, err := l.binary(r.p)
	if err != nil {
		return nil, err
	}
	if r.first {
		if err := pgtest.Exec(ctx, r.p.pubAdmin(benchDB),
			fmt.Sprintf("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", quoteLiteral(r.slot))); err != nil {
			return nil, err
		}
	}
	args := []string{"-d", r.p.pubSource(), "--slot", r.slot, "--start", "-f", "/dev/null", "--no-loop"}
	args = append(args, pgoutputOptions(r.p.major())...)
	if r.endpos != "" && !r.first {
		args = append(args, "--endpos", r.endpos)
	}
	logPath := filepath.Join(r.p.tmp, fmt.Sprintf("%s-limit.log", r.slot))
	var env []string
	if libDir != "" {
		env = []string{"LD_LIBRARY_PATH=" + libDir}
	}
	pr, err := startProcess(bin, args, r.p.tmp, logPath, env)
	if err != nil {
		return nil, err
	}
	pr.stopSignal = syscall.SIGINT // pg_recvlogical's clean stop
	pr.name = "pg_recvlogical"
	r.first = false
	return recvApplying{pr}, nil
}

func (recvLogical) drop(ctx context.Context, r *run) error { return dropSlot(ctx, r.p, r.slot) }

// recvApplying is a running pg_recvlogical: reaching --endpos, it exits with status 0, which is
// not a failure.
type recvApplying struct{ *process }

func (a recvApplying) failed(ctx context.Context) error {
	select {
	case <-a.exited:
		if a.err == nil {
			return nil
		}
	default:
		return nil
	}
	return a.process.failed(ctx)
}

// done says whether pg_recvlogical exited with status 0: it reached its end position.
func (a recvApplying) done() bool {
	select {
	case <-a.exited:
		return a.err == nil
	default:
		return false
	}
}

func (a recvApplying) stop(ctx context.Context) error {
	select {
	case <-a.exited:
		if a.err == nil {
			return nil
		}
	default:
	}
	return a.process.stop(ctx)
}

// ---------------------------------------------------------------------------------------------
// CPU time, from /proc

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on every Linux this runs on).
const clockTick = 10 * time.Millisecond

// procTimes reads /proc/PID/stat: ppid, utime + stime, and cutime + cstime (the children the
// process has waited for).
func procTimes(pid int) (ppid int, self, children time.Duration, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields follow its last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	n := make([]int64, 15)
	for _, k := range []int{1, 11, 12, 13, 14} {
		if n[k], err = strconv.ParseInt(f[k], 10, 64); err != nil {
			return 0, 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return int(n[1]), time.Duration(n[11]+n[12]) * clockTick, time.Duration(n[13]+n[14]) * clockTick, nil
}

// serverCPU returns the CPU time a server has used: its postmaster's, the children it has waited
// for (backends, workers that exited), and its live children's. A child waited for between the
// reads would count twice (live, then waited for) or not at all: the postmaster is read before
// and after the children, and the whole read made again when its children's total moved.
func serverCPU(postmaster int) (time.Duration, error) {
	for {
		_, self, waited, err := procTimes(postmaster)
		if err != nil {
			return 0, err
		}
		live, err := childrenCPU(postmaster)
		if err != nil {
			return 0, err
		}
		_, self2, waited2, err := procTimes(postmaster)
		if err != nil {
			return 0, err
		}
		if waited2 == waited {
			return max(self, self2) + waited + live, nil
		}
	}
}

// childrenCPU sums utime + stime of the live processes whose parent is pid.
func childrenCPU(pid int) (time.Duration, error) {
	var sum time.Duration
	err := eachChild(pid, func(_ int, self time.Duration) { sum += self })
	return sum, err
}

// children returns the live processes whose parent is pid.
func children(pid int) ([]int, error) {
	var pids []int
	err := eachChild(pid, func(child int, _ time.Duration) { pids = append(pids, child) })
	return pids, err
}

// eachChild calls f with each live process whose parent is pid, and its utime + stime.
func eachChild(pid int, f func(child int, self time.Duration)) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, self, _, err := procTimes(child)
		if err != nil || ppid != pid {
			continue // gone meanwhile, or not a child
		}
		f(child, self)
	}
	return nil
}

// postmasterPID returns the PID of the postmaster of the server at connString: the parent of
// the backend serving a connection, read while the connection is open (a closed one's backend
// may be gone).
func postmasterPID(ctx context.Context, connString string) (int, error) {
	conn, err := pgconn.Connect(ctx, connString)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ppid, _, _, err := procTimes(int(conn.PID()))
	return ppid, err
}

// cpu returns the CPU time the process has used so far (all its threads).
func (p *process) cpu() (time.Duration, error) {
	_, self, _, err := procTimes(p.cmd.Process.Pid)
	if err != nil {
		// It exited: its rusage.
		select {
		case <-p.exited:
			if st := p.cmd.ProcessState; st != nil {
				return st.UserTime() + st.SystemTime(), nil
			}
		default:
		}
	}
	return self, err
}

// peakRSS returns the process's peak resident set size so far (VmHWM), in bytes; after it
// exited, its rusage's maximum.
func (p *process) peakRSS() (int64, error) {
	n, err := procHWM(p.cmd.Process.Pid)
	if err != nil {
		// Exiting (a zombie has no VmHWM) or exited: its rusage, once waited for.
		select {
		case <-p.exited:
			if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				return ru.Maxrss << 10, nil // kB on Linux
			}
		case <-time.After(5 * time.Second):
		}
	}
	return n, err
}

// probeFlag returns an error when bin's apply command does not know flag.
func probeFlag(bin, flag string, args ...string) error {
	out, _ := exec.Command(bin, append([]string{"apply", flag}, append(args, "-h")...)...).CombinedOutput()
	if strings.Contains(string(out), "flag provided but not defined") {
		return fmt.Errorf("this pgreorder apply has no %s flag: %s", flag, strings.TrimSpace(firstLine(string(out))))
	}
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
