// Package kafkatest gives tests throwaway Apache Kafka brokers (KRaft, no ZooKeeper), started
// from the jars .ci/install-kafka puts in /opt/pgreorder/kafka/VERSION/lib (PGREORDER_KAFKA_LIB
// names another folder). It is for tests only: shipped code never links it.
//
// Shared(t) gives the test binary's single-node broker (combined broker and controller, started
// on first use, stopped by pgtest.Main, which the package's TestMain calls); Start(t, n) starts a
// cluster of its own of n nodes, stopped at the end of the test; StartWith adds SASL and TLS
// listeners and an authorizer (Options). A Broker is killed (SIGKILL)
// and restarted on the same ports and data on demand. Without the jars or a java command these
// skip the test with a message that says how to install them; with PGREORDER_REQUIRE_KAFKA=1
// they fail it instead (CI sets it). As root, brokers run as the unprivileged user of
// PostgreSQL's test servers.
package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

const (
	// Version is the Kafka version .ci/install-kafka installs.
	Version = "4.4.0"
	// EnvRequire, set to "1", turns every "no broker installed" skip into a test failure, and a
	// broker that does not start is a failure anyway.
	EnvRequire = "PGREORDER_REQUIRE_KAFKA"
	// EnvLib names the folder of the broker's jars.
	EnvLib = "PGREORDER_KAFKA_LIB"
	// HowToInstall says how to get a broker.
	HowToInstall = "install one with `sudo bash .ci/install-kafka` (needs a JDK 17 and Maven), or set " + EnvLib + " to a folder of Kafka's jars"
)

// Lib returns the folder of the broker's jars.
func Lib() string {
	if d := os.Getenv(EnvLib); d != "" {
		return d
	}
	return filepath.Join("/opt/pgreorder/kafka", Version, "lib")
}

// available returns why no broker can start here, or "".
func available() string {
	if _, err := exec.LookPath("java"); err != nil {
		return "no java command"
	}
	if _, err := os.Stat(filepath.Join(Lib(), "kafka_2.13-"+Version+".jar")); err != nil {
		if m, _ := filepath.Glob(filepath.Join(Lib(), "kafka_2.13-*.jar")); len(m) == 0 {
			return "no Kafka broker in " + Lib()
		}
	}
	return ""
}

// Check skips t when no broker can start here (fails it with PGREORDER_REQUIRE_KAFKA=1).
func Check(t testing.TB) {
	t.Helper()
	if why := available(); why != "" {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%s (%s=1); %s", why, EnvRequire, HowToInstall)
		}
		t.Skipf("%s; %s", why, HowToInstall)
	}
}

// Options configures StartWith. The zero value starts what Start starts: a PLAINTEXT listener,
// no authorizer.
type Options struct {
	// Users, when not empty, adds a SASL_PLAINTEXT listener (Broker.SASLPort, Cluster.SASLAddrs)
	// taking PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, with these users and passwords (SCRAM
	// credentials of both hashes, written when the storage is formatted). Names and passwords
	// are letters, digits, '-' and '_'.
	Users map[string]string
	// TLS adds an SSL listener (Broker.TLSPort, Cluster.TLSAddrs) whose certificate, for
	// 127.0.0.1 and localhost, a CA made for the cluster signs (Cluster.CAFile).
	TLS bool
	// SuperUsers, when not nil, turns on the StandardAuthorizer: these users (and the
	// PLAINTEXT listener's User:ANONYMOUS, which the brokers and the tests' admin clients use)
	// may do everything; every other user only what ACLs allow (none at first).
	SuperUsers []string
}

// Broker is one node of a throwaway cluster: a broker and a KRaft controller in one process.
type Broker struct {
	ID       int
	Port     int // the client listener, on 127.0.0.1
	SASLPort int // the SASL_PLAINTEXT listener (Options.Users), or 0
	TLSPort  int // the SSL listener (Options.TLS), or 0
	dir      string
	cred     *syscall.Credential
	c        *Cluster

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Addr returns the broker's client address, host:port.
func (b *Broker) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)) }

// Cluster is a set of brokers started together.
type Cluster struct {
	Brokers []*Broker
	// CAFile is the PEM file of the CA that signs the SSL listeners' certificates (Options.TLS).
	CAFile string
	dir    string
}

// SASLAddrs returns every broker's SASL_PLAINTEXT address (Options.Users).
func (c *Cluster) SASLAddrs() []string {
	var a []string
	for _, b := range c.Brokers {
		a = append(a, net.JoinHostPort("127.0.0.1", strconv.Itoa(b.SASLPort)))
	}
	return a
}

// TLSAddrs returns every broker's SSL address (Options.TLS).
func (c *Cluster) TLSAddrs() []string {
	var a []string
	for _, b := range c.Brokers {
		a = append(a, net.JoinHostPort("127.0.0.1", strconv.Itoa(b.TLSPort)))
	}
	return a
}

// Addrs returns every broker's address, for kgo.SeedBrokers.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Brokers))
	for i, b := range c.Brokers {
		a[i] = b.Addr()
	}
	return a
}

// Seeds returns the addresses joined by commas, as the pgreorder command takes them.
func (c *Cluster) Seeds() string { return strings.Join(c.Addrs(), ",") }

var (
	sharedOnce sync.Once
	shared     *Cluster
	sharedErr  error
)

// Shared returns the test binary's single-node broker, starting it on first use. Tests share it:
// give each its own topic prefix and transactional ids. The package's TestMain must call
// pgtest.Main, which stops it.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	Check(t)
	sharedOnce.Do(func() {
		shared, sharedErr = start(1, Options{})
		if sharedErr == nil {
			pgtest.OnStop(func() { shared.Stop() })
		}
	})
	if sharedErr != nil {
		t.Fatalf("kafkatest: starting the shared broker: %v", sharedErr)
	}
	return shared
}

// Start starts a cluster of n nodes for t alone, stopped at its end.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartWith(t, n, Options{})
}

// StartWith starts a cluster of n nodes with the listeners and authorizer of opts, for t alone,
// stopped at its end.
func StartWith(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	Check(t)
	c, err := start(n, opts)
	if err != nil {
		t.Fatalf("kafkatest: starting %d brokers: %v", n, err)
	}
	t.Cleanup(c.Stop)
	return c
}

var safeName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func start(n int, opts Options) (_ *Cluster, err error) {
	for u, p := range opts.Users {
		if !safeName.MatchString(u) || !safeName.MatchString(p) {
			return nil, fmt.Errorf("kafkatest: user %q or its password has characters other than letters, digits, '-' and '_'", u)
		}
	}
	cred, err := brokerCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("/tmp", "pgreorder-kafka-*") // TMPDIR may be under /root
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	ports, err := freePorts(4 * n)
	if err != nil {
		return nil, err
	}
	var serverPEM []byte
	if opts.TLS {
		ca, server, err := newCA()
		if err != nil {
			return nil, err
		}
		c.CAFile = filepath.Join(dir, "ca.pem")
		if err := os.WriteFile(c.CAFile, ca, 0o644); err != nil {
			return nil, err
		}
		serverPEM = server
	}
	var voters []string
	for i := range n {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, ports[2*i+1]))
	}
	rf := min(n, 3)
	for i := range n {
		b := &Broker{ID: i + 1, Port: ports[2*i], dir: filepath.Join(dir, strconv.Itoa(i+1)), cred: cred, c: c}
		if err := os.MkdirAll(b.dir, 0o700); err != nil {
			return nil, err
		}
		listeners := []string{fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", b.Port)}
		var extra strings.Builder
		if len(opts.Users) > 0 {
			b.SASLPort = ports[2*n+2*i]
			listeners = append(listeners, fmt.Sprintf("SASL_PLAINTEXT://127.0.0.1:%d", b.SASLPort))
			extra.WriteString("sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512\n")
			extra.WriteString("listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required")
			for _, u := range slices.Sorted(maps.Keys(opts.Users)) {
				fmt.Fprintf(&extra, ` user_%s="%s"`, u, opts.Users[u])
			}
			extra.WriteString(";\n")
			for _, m := range []string{"scram-sha-256", "scram-sha-512"} {
				fmt.Fprintf(&extra, "listener.name.sasl_plaintext.%s.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n", m)
			}
		}
		if opts.TLS {
			b.TLSPort = ports[2*n+2*i+1]
			listeners = append(listeners, fmt.Sprintf("SSL://127.0.0.1:%d", b.TLSPort))
			if err := os.WriteFile(filepath.Join(b.dir, "server.pem"), serverPEM, 0o600); err != nil {
				return nil, err
			}
			fmt.Fprintf(&extra, "listener.name.ssl.ssl.keystore.type=PEM\nlistener.name.ssl.ssl.keystore.location=%s\n", filepath.Join(b.dir, "server.pem"))
		}
		if opts.SuperUsers != nil {
			supers := []string{"User:ANONYMOUS"}
			for _, u := range opts.SuperUsers {
				supers = append(supers, "User:"+u)
			}
			fmt.Fprintf(&extra, "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\nsuper.users=%s\nallow.everyone.if.no.acl.found=false\n",
				strings.Join(supers, ";"))
		}
		props := fmt.Sprintf(`process.roles=broker,controller
node.id=%d
controller.quorum.voters=%s
listeners=%s,CONTROLLER://127.0.0.1:%d
advertised.listeners=%s
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL
inter.broker.listener.name=PLAINTEXT
log.dirs=%s
auto.create.topics.enable=false
num.partitions=1
offsets.topic.replication.factor=%d
offsets.topic.num.partitions=2
transaction.state.log.replication.factor=%d
transaction.state.log.min.isr=%d
transaction.state.log.num.partitions=2
min.insync.replicas=%d
default.replication.factor=%d
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
background.threads=2
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=2097152
transaction.remove.expired.transaction.cleanup.interval.ms=5000
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=300
controller.quorum.election.timeout.ms=500
controller.quorum.fetch.timeout.ms=1000
replica.lag.time.max.ms=5000
%s`, b.ID, strings.Join(voters, ","), strings.Join(listeners, ","), ports[2*i+1], strings.Join(listeners, ","), filepath.Join(b.dir, "data"),
			rf, rf, min(rf, 2), min(rf, 2), rf, extra.String())
		if err := os.WriteFile(filepath.Join(b.dir, "server.properties"), []byte(props), 0o600); err != nil {
			return nil, err
		}
		const log4j = "Configuration:\n  Appenders:\n    Console:\n      name: OUT\n      PatternLayout:\n        pattern: \"[%d] %p %m (%c)%n\"\n" +
			"  Loggers:\n    Root:\n      level: WARN\n      AppenderRef:\n        - ref: OUT\n"
		if err := os.WriteFile(filepath.Join(b.dir, "log4j2.yaml"), []byte(log4j), 0o600); err != nil {
			return nil, err
		}
		c.Brokers = append(c.Brokers, b)
	}
	if cred != nil {
		if err := chownTree(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	// One cluster id for every node, formatted in parallel.
	clusterID := "rZ1PJHBgQB2yQpsYNR5VJg" // a UUID in base64, as StorageTool random-uuid prints
	errs := make(chan error, n)
	format := []string{"format", "-t", clusterID}
	for _, u := range slices.Sorted(maps.Keys(opts.Users)) {
		for _, m := range []string{"SCRAM-SHA-256", "SCRAM-SHA-512"} {
			format = append(format, "--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", m, u, opts.Users[u]))
		}
	}
	for _, b := range c.Brokers {
		go func() {
			out, err := b.java("kafka.tools.StorageTool", append(format, "-c", filepath.Join(b.dir, "server.properties"))...).CombinedOutput()
			if err != nil {
				err = fmt.Errorf("formatting broker %d: %v: %s", b.ID, err, tail(out))
			}
			errs <- err
		}()
	}
	for range n {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return nil, err
	}
	for _, b := range c.Brokers {
		if err := b.launch(); err != nil {
			return nil, err
		}
	}
	// Three JVMs starting on a loaded two-core machine took over 90 seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// WaitReady waits until every broker answers and lists every broker, unfenced, in its metadata.
//
// Each broker is asked directly, each time: a broker killed a moment ago stays in the others'
// metadata until its session times out, and kadm's BrokerMetadata answers from the client's list
// of brokers once it has one (a client that first saw some of them keeps that list for minutes).
func (c *Cluster) WaitReady(ctx context.Context) error {
	var seeds []*kgo.Broker
	for _, b := range c.Brokers {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
		if err != nil {
			return err
		}
		defer cl.Close()
		seeds = append(seeds, cl.SeedBrokers()[0])
	}
	var lastErr error
	listed := make([]int, len(c.Brokers))
	for {
		ready := true
		for i, sb := range seeds {
			req := kmsg.NewPtrMetadataRequest()
			req.Topics = []kmsg.MetadataRequestTopic{} // brokers only
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := sb.Request(rctx, req)
			cancel()
			if err != nil {
				lastErr, listed[i], ready = err, 0, false
				continue
			}
			m := resp.(*kmsg.MetadataResponse)
			listed[i] = len(m.Brokers)
			ready = ready && len(m.Brokers) == len(c.Brokers) && m.ControllerID >= 0
		}
		if ready {
			return nil
		}
		for _, b := range c.Brokers {
			if b.exited() {
				return fmt.Errorf("broker %d exited: %s", b.ID, b.logTail())
			}
		}
		select {
		case <-ctx.Done():
			var tails []string
			for _, b := range c.Brokers {
				tails = append(tails, fmt.Sprintf("broker %d: %s", b.ID, b.logTail()))
			}
			return fmt.Errorf("brokers not ready (last error: %v; brokers each lists: %v of %d):\n%s", lastErr, listed, len(c.Brokers), strings.Join(tails, "\n"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (b *Broker) java(class string, args ...string) *exec.Cmd {
	a := []string{"-Xmx256m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
		"-Djava.awt.headless=true", "-Dlog4j2.configurationFile=" + filepath.Join(b.dir, "log4j2.yaml"),
		"-cp", filepath.Join(Lib(), "*"), class}
	cmd := exec.Command("java", append(a, args...)...)
	cmd.Dir = b.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	return cmd
}

// launch starts the broker's process.
func (b *Broker) launch() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		return errors.New("kafkatest: broker already running")
	}
	log, err := os.OpenFile(filepath.Join(b.dir, "broker.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := b.java("kafka.Kafka", filepath.Join(b.dir, "server.properties"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	log.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	b.cmd, b.done = cmd, done
	return nil
}

func (b *Broker) exited() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done == nil {
		return true
	}
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// Kill kills the broker with SIGKILL and waits for it to be gone.
func (b *Broker) Kill() {
	b.mu.Lock()
	cmd, done := b.cmd, b.done
	b.cmd, b.done = nil, nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Restart starts a killed broker again, on its ports and data, and waits for the cluster to be
// ready.
func (b *Broker) Restart(ctx context.Context) error {
	if err := b.launch(); err != nil {
		return err
	}
	return b.c.WaitReady(ctx)
}

// Stop kills every broker and removes the cluster's folder. It is safe to call twice.
func (c *Cluster) Stop() {
	for _, b := range c.Brokers {
		b.Kill()
	}
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}

func (b *Broker) logTail() string {
	out, _ := os.ReadFile(filepath.Join(b.dir, "broker.log"))
	return tail(out)
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 6000 {
		s = "..." + s[len(s)-6000:]
	}
	return s
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// brokerCredential returns nil when not root, else the ids of pgtest.ServerUser, creating that
// user if needed: the broker runs unprivileged, as PostgreSQL's test servers do.
func brokerCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(pgtest.ServerUser)
	if err != nil {
		out, uerr := exec.Command("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
			"--shell", "/usr/sbin/nologin", pgtest.ServerUser).CombinedOutput()
		if u, err = user.Lookup(pgtest.ServerUser); err != nil {
			return nil, fmt.Errorf("running as root and cannot create user %q: %v: %s", pgtest.ServerUser, uerr, out)
		}
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q has non-numeric ids", pgtest.ServerUser)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

func chownTree(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
