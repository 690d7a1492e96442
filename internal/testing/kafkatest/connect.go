package kafkatest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ConnectLib returns the folder of Kafka Connect's jars (the worker, its API, the JSON converter;
// .ci/kafka/connect.pom.xml) that .ci/install-kafka puts beside the broker's:
// /opt/pgreorder/kafka/VERSION/connect, or PGREORDER_KAFKA_CONNECT_LIB.
func ConnectLib() string {
	if d := os.Getenv("PGREORDER_KAFKA_CONNECT_LIB"); d != "" {
		return d
	}
	return filepath.Join(filepath.Dir(Lib()), "connect")
}

// CheckConnect skips t when no Kafka Connect worker can start here (fails it with
// PGREORDER_REQUIRE_KAFKA=1).
func CheckConnect(t testing.TB) {
	t.Helper()
	Check(t)
	if m, _ := filepath.Glob(filepath.Join(ConnectLib(), "connect-runtime-*.jar")); len(m) == 0 {
		msg := "no Kafka Connect worker in " + ConnectLib()
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%s (%s=1); %s", msg, EnvRequire, HowToInstall)
		}
		t.Skipf("%s; %s", msg, HowToInstall)
	}
}

// ConnectOptions configures StartConnect.
type ConnectOptions struct {
	// ClassPath is the worker's class path: jar files, or folders written as DIR/* (default
	// ConnectLib()/*).
	ClassPath []string
	// PluginPath is the worker's plugin.path, if any.
	PluginPath string
	// Worker holds worker properties besides bootstrap.servers, the REST listener, the offsets
	// file and the plugin path (the converters: key.converter, value.converter, ...).
	Worker map[string]string
	// Connectors are the connectors' properties, each with its "name" and "connector.class".
	Connectors []map[string]string
}

// Connect is a Kafka Connect worker in standalone mode, in a process of its own.
type Connect struct {
	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartConnect starts a standalone Kafka Connect worker for cluster c, with the connectors of
// opts, and waits until its REST interface answers. It is stopped at the end of the test.
func StartConnect(t testing.TB, c *Cluster, opts ConnectOptions) *Connect {
	t.Helper()
	k, err := startConnect(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

func startConnect(c *Cluster, opts ConnectOptions) (_ *Connect, err error) {
	dir, err := os.MkdirTemp("/tmp", "pgreorder-connect-*")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	k := &Connect{dir: dir, port: ports[0]}
	defer func() {
		if err != nil {
			k.Stop()
		}
	}()
	worker := map[string]string{
		"bootstrap.servers":            c.Seeds(),
		"listeners":                    fmt.Sprintf("http://127.0.0.1:%d", k.port),
		"offset.storage.file.filename": filepath.Join(dir, "connect.offsets"),
		"offset.flush.interval.ms":     "1000",
		"key.converter":                "org.apache.kafka.connect.json.JsonConverter",
		"value.converter":              "org.apache.kafka.connect.json.JsonConverter",
	}
	if opts.PluginPath != "" {
		worker["plugin.path"] = opts.PluginPath
	}
	maps.Copy(worker, opts.Worker)
	args := []string{filepath.Join(dir, "worker.properties")}
	if err := writeProperties(args[0], worker); err != nil {
		return nil, err
	}
	for i, p := range opts.Connectors {
		path := filepath.Join(dir, fmt.Sprintf("connector-%d.properties", i))
		if err := writeProperties(path, p); err != nil {
			return nil, err
		}
		args = append(args, path)
	}
	// INFO to the log file (properties: the worker has no YAML parser), but for the REST server's
	// line per request: Status is polled.
	log4j := "appender.out.type = Console\nappender.out.name = STDOUT\nappender.out.layout.type = PatternLayout\n" +
		"appender.out.layout.pattern = [%d] %p %m (%c)%n\nrootLogger.level = INFO\nrootLogger.appenderRef.out.ref = STDOUT\n" +
		"logger.rest.name = org.apache.kafka.connect.runtime.rest.RestServer\nlogger.rest.level = WARN\n"
	if err := os.WriteFile(filepath.Join(dir, "log4j2.properties"), []byte(log4j), 0o600); err != nil {
		return nil, err
	}
	cp := opts.ClassPath
	if len(cp) == 0 {
		cp = []string{filepath.Join(ConnectLib(), "*")}
	}
	jvm := []string{"-Xms128m", "-Xmx1g", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(dir, "log4j2.properties"),
		"-cp", strings.Join(cp, ":"), "org.apache.kafka.connect.cli.ConnectStandalone"}
	log, err := os.OpenFile(filepath.Join(dir, "connect.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command("java", append(jvm, args...)...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	k.mu.Lock()
	k.cmd, k.done = cmd, done
	k.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		if _, err := k.get(ctx, "/"); err == nil {
			return k, nil
		}
		select {
		case <-done:
			return nil, fmt.Errorf("kafkatest: Kafka Connect exited: %s", k.LogTail())
		case <-ctx.Done():
			return nil, fmt.Errorf("kafkatest: Kafka Connect's REST interface did not answer: %s", k.LogTail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func writeProperties(path string, p map[string]string) error {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(p)) {
		// Properties escapes: a backslash, and ':' and '=' in keys, would need them; none of ours
		// have them in keys, and values only need backslashes doubled.
		fmt.Fprintf(&b, "%s=%s\n", k, strings.ReplaceAll(p[k], `\`, `\\`))
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

func (k *Connect) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(k.port)+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return body, nil
}

// ConnectorStatus is what the worker says of a connector and its tasks.
type ConnectorStatus struct {
	Connector struct {
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"connector"`
	Tasks []struct {
		ID    int    `json:"id"`
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"tasks"`
}

// Status returns the status of connector name.
func (k *Connect) Status(ctx context.Context, name string) (ConnectorStatus, error) {
	var st ConnectorStatus
	body, err := k.get(ctx, "/connectors/"+name+"/status")
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(body, &st)
	return st, err
}

// Failed returns an error once the worker exited or connector name or one of its tasks failed.
func (k *Connect) Failed(ctx context.Context, name string) error {
	if k.exited() {
		return fmt.Errorf("kafkatest: Kafka Connect exited: %s", k.LogTail())
	}
	st, err := k.Status(ctx, name)
	if err != nil {
		return nil // not known yet
	}
	if st.Connector.State == "FAILED" {
		return fmt.Errorf("kafkatest: connector %s failed: %s", name, st.Connector.Trace)
	}
	for _, t := range st.Tasks {
		if t.State == "FAILED" {
			return fmt.Errorf("kafkatest: task %d of connector %s failed: %s", t.ID, name, t.Trace)
		}
	}
	return nil
}

// WaitRunning waits until connector name and every one of its tasks (at least one) run.
func (k *Connect) WaitRunning(ctx context.Context, name string) error {
	for {
		if err := k.Failed(ctx, name); err != nil {
			return err
		}
		if st, err := k.Status(ctx, name); err == nil && st.Connector.State == "RUNNING" && len(st.Tasks) > 0 {
			running := true
			for _, t := range st.Tasks {
				running = running && t.State == "RUNNING"
			}
			if running {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkatest: connector %s not running: %w\n%s", name, context.Cause(ctx), k.LogTail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (k *Connect) exited() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done == nil {
		return true
	}
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// Log returns the worker's log.
func (k *Connect) Log() string {
	out, _ := os.ReadFile(filepath.Join(k.dir, "connect.log"))
	return string(out)
}

// LogTail returns the end of the worker's log.
func (k *Connect) LogTail() string { return tail([]byte(k.Log())) }

// Stop kills the worker and removes its folder. It is safe to call twice.
func (k *Connect) Stop() {
	k.mu.Lock()
	cmd, done := k.cmd, k.done
	k.cmd, k.done = nil, nil
	k.mu.Unlock()
	if cmd != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	if k.dir != "" {
		os.RemoveAll(k.dir)
		k.dir = ""
	}
}
