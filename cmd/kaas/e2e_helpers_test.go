package main

// End-to-end harness: builds the kaas binary once, runs brokers as subprocesses on free loopback
// ports with temporary data dirs, and drives real clients against them (Apache Kafka's Java
// tools via bench/kafka-tools.sh, kcat, Debian's python3-confluent-kafka, franz-go).
//
// Environment knobs (all optional):
//
//	KAAS_E2E_BROKER=kaas|kafka  which broker the harness starts and kills: our binary (default) or
//	                            the reference Apache Kafka 4.x KRaft broker from bench/.kafka-lib
//	                            (bench/kafka-tools.sh ref-start). "kafka" validates the harness itself.
//	KAAS_E2E_BOOTSTRAP=h:p      use an already running broker for every test that does not need
//	                            to crash it; the kill -9 test still starts its own managed broker.
//	KAAS_E2E_CONSUME=both|assign|group
//	                            how the perf test reads its records back: per-partition assign
//	                            (needs no group coordinator), a consumer group, or both (default).
//	KAAS_E2E_PERF_RECORDS=N     record count of the perf test (default 1000000).
//	KAAS_E2E_LOG_DIR=dir        keep broker logs there instead of the test temp dir.
//	KAAS_E2E_BIN=path           run this kaas binary instead of building ./cmd/kaas (e.g. one
//	                            built with `go build -race`, or a release build).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	// repoRoot is the module root (two levels above cmd/kaas).
	e2eRepoRoot string
	// kaasBin is the binary built by TestMain; kaasBuildErr is set when that build failed, so
	// that tests needing the binary fail with the compiler output instead of something obscure.
	e2eKaasBin      string
	e2eKaasBuildErr error
)

func TestMain(m *testing.M) {
	os.Exit(e2eRunMain(m))
}

func e2eRunMain(m *testing.M) int {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: cannot get working dir: %v\n", err)
		return 1
	}
	e2eRepoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))

	binDir, err := os.MkdirTemp("", "kaas-e2e-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: cannot create temp dir: %v\n", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	if bin := os.Getenv("KAAS_E2E_BIN"); bin != "" && e2eBrokerKind() == "kaas" {
		if e2eKaasBin, err = filepath.Abs(bin); err == nil {
			_, err = os.Stat(e2eKaasBin)
		}
		if err != nil {
			e2eKaasBuildErr = fmt.Errorf("KAAS_E2E_BIN=%s: %w", bin, err)
		}
	} else if e2eBrokerKind() == "kaas" {
		e2eKaasBin = filepath.Join(binDir, "kaas")
		start := time.Now()
		cmd := exec.Command("go", "build", "-o", e2eKaasBin, "./cmd/kaas")
		cmd.Dir = e2eRepoRoot
		out, err := cmd.CombinedOutput()
		if err != nil {
			e2eKaasBuildErr = fmt.Errorf("cannot build ./cmd/kaas: %w\n%s", err, out)
			fmt.Fprintf(os.Stderr, "e2e: %v\n", e2eKaasBuildErr)
		} else {
			fmt.Fprintf(os.Stderr, "e2e: built %s in %s\n", e2eKaasBin, time.Since(start).Round(time.Millisecond))
		}
	}
	return m.Run()
}

func e2eBrokerKind() string {
	switch k := os.Getenv("KAAS_E2E_BROKER"); k {
	case "", "kaas":
		return "kaas"
	default:
		return k
	}
}

func e2eEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q is not a positive integer", name, v)
	}
	return n
}

// eventually polls cond every 50 ms until it returns nil or the deadline passes; the last error
// is reported. This is how tests wait for state: never a bare sleep.
func e2eEventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := e2ePoll(timeout, 50*time.Millisecond, cond); err != nil {
		t.Fatalf("%s: not reached within %s: %v", what, timeout, err)
	}
}

// errPollAbort, wrapped into a condition's error, ends e2ePoll at once (e.g. the process being
// waited for has exited, so waiting longer cannot help).
var errPollAbort = errors.New("giving up")

func e2ePoll(timeout, every time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if errors.Is(err, errPollAbort) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(every)
	}
}

// e2eFreePort hands out a loopback port for a process the harness starts (and restarts on the
// same address). It picks below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range): a port the kernel handed out for :0 and that was
// closed again is the next candidate for some outgoing connection's local port (a broker's
// etcd or peer client), and a fresh-clone CI run lost exactly that race (the broker's bind
// failed with EADDRINUSE). Below the range only explicit binds compete, and this process
// remembers what it handed out.
func e2eFreePort(t *testing.T) int {
	t.Helper()
	e2ePorts.mu.Lock()
	defer e2ePorts.mu.Unlock()
	if e2ePorts.used == nil {
		e2ePorts.used = make(map[int]bool)
		e2ePorts.lo, e2ePorts.hi = 20000, ephemeralPortLow()
		e2ePorts.next = e2ePorts.lo + int(time.Now().UnixNano()%int64(max(1, e2ePorts.hi-e2ePorts.lo)))
	}
	if span := e2ePorts.hi - e2ePorts.lo; span >= 1000 {
		for i := 0; i < span; i++ {
			p := e2ePorts.lo + (e2ePorts.next-e2ePorts.lo+i)%span
			if e2ePorts.used[p] {
				continue
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				continue // taken by someone else: try the next one
			}
			_ = l.Close()
			e2ePorts.used[p] = true
			e2ePorts.next = p + 1
			return p
		}
	}
	// No room below the ephemeral range (an unusual sysctl): let the kernel choose.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("cannot reserve a loopback port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var e2ePorts struct {
	mu           sync.Mutex
	used         map[int]bool
	lo, hi, next int
}

// ephemeralPortLow is the first port of the kernel's ephemeral range (32768 when unreadable).
func ephemeralPortLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// uniqueName gives topics names that do not collide with earlier runs on a long-lived broker
// (KAAS_E2E_BOOTSTRAP).
func e2eName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000_000)
}

// ---------------------------------------------------------------------------------------------
// Brokers

// broker is a broker the harness can crash and bring back on the same data dir.
type e2eBroker interface {
	Addr() string
	// Kill sends SIGKILL and waits for the process to be gone.
	Kill(t *testing.T)
	// Stop sends SIGTERM and waits for a clean exit.
	Stop(t *testing.T)
	// Restart starts the broker again on the same ports and data dir and waits until ready.
	Restart(t *testing.T)
}

// bootstrapFor returns the address tests that only need "a broker" should talk to: the external
// one from KAAS_E2E_BOOTSTRAP, or a fresh managed broker stopped at test end.
func e2eBootstrap(t *testing.T) string {
	t.Helper()
	if addr := os.Getenv("KAAS_E2E_BOOTSTRAP"); addr != "" {
		t.Logf("using external broker %s (KAAS_E2E_BOOTSTRAP)", addr)
		return addr
	}
	return startE2EBroker(t).Addr()
}

// startBroker starts a managed broker of kind KAAS_E2E_BROKER; it is stopped in t.Cleanup.
func startE2EBroker(t *testing.T) e2eBroker {
	t.Helper()
	switch k := e2eBrokerKind(); k {
	case "kaas":
		return startKaas(t)
	case "kafka":
		return startRefKafka(t)
	default:
		t.Fatalf("KAAS_E2E_BROKER=%q: want kaas or kafka", k)
		return nil
	}
}

func e2eLogDir(t *testing.T) string {
	if d := os.Getenv("KAAS_E2E_LOG_DIR"); d != "" {
		d = filepath.Join(d, strings.ReplaceAll(t.Name(), "/", "_"))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("cannot create log dir: %v", err)
		}
		return d
	}
	return t.TempDir()
}

// kaasProc is one kaas broker subprocess plus what is needed to restart it identically.
type kaasProc struct {
	args    []string
	addr    string
	metrics string
	logPath string
	starts  int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	err    error         // exit status, valid once exited is closed
}

// e2eExtraKaasArgs are appended to every kaas command line (set by a test for its duration;
// the e2e tests do not run in parallel).
var e2eExtraKaasArgs []string

// e2eKaasListeners, when set by a test, builds the listeners value from the PLAINTEXT address
// the harness picked (which stays the address Addr returns), to add SSL / SASL listeners.
var e2eKaasListeners func(plain string) string

func startKaas(t *testing.T) *kaasProc {
	t.Helper()
	if e2eKaasBuildErr != nil {
		t.Fatalf("kaas binary unavailable: %v", e2eKaasBuildErr)
	}
	if e2eKaasBin == "" {
		t.Fatalf("kaas binary was not built (KAAS_E2E_BROKER=%s)", e2eBrokerKind())
	}
	dir := t.TempDir()
	p := &kaasProc{
		addr:    fmt.Sprintf("127.0.0.1:%d", e2eFreePort(t)),
		metrics: fmt.Sprintf("127.0.0.1:%d", e2eFreePort(t)),
		logPath: filepath.Join(e2eLogDir(t), "kaas.log"),
	}
	listeners := p.addr
	if e2eKaasListeners != nil {
		listeners = e2eKaasListeners(p.addr)
	}
	p.args = []string{
		"--listeners=" + listeners,
		"--data.dir=" + filepath.Join(dir, "data"),
		"--metrics.addr=" + p.metrics,
		"--broker.id=0",
		"--auto.create.topics.enable=true",
		"--num.partitions=1",
		"--log.level=info",
		// As on the reference broker: the 3 s default only slows group tests down.
		"--group.initial.rebalance.delay.ms=0",
	}
	p.args = append(p.args, e2eExtraKaasArgs...)
	t.Cleanup(func() {
		p.mu.Lock()
		running, exited := p.cmd != nil, p.exited
		p.mu.Unlock()
		if running {
			select {
			case <-exited:
				// Died on its own (startup failure or crash); any test step that depended on it
				// has already failed, so only report it when nothing else did.
				if !t.Failed() {
					t.Errorf("kaas %s exited before the test ended: %v", p.addr, p.exitErr())
				}
			default:
				p.Stop(t)
			}
		}
		if t.Failed() {
			p.dumpLog(t)
		}
	})
	p.Restart(t)
	return p
}

func (p *kaasProc) Addr() string { return p.addr }

// Restart launches the binary (first start or after Kill/Stop) and waits for /healthz.
func (p *kaasProc) Restart(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		t.Fatalf("kaas %s: Restart while still running", p.addr)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		t.Fatalf("cannot open broker log: %v", err)
	}
	p.starts++
	fmt.Fprintf(logf, "\n===== e2e: start #%d %s %s\n", p.starts, e2eKaasBin, strings.Join(p.args, " "))
	cmd := exec.Command(e2eKaasBin, p.args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		p.mu.Unlock()
		t.Fatalf("cannot start kaas: %v", err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()

	url := "http://" + p.metrics + "/healthz"
	client := &http.Client{Timeout: time.Second}
	err = e2ePoll(30*time.Second, 20*time.Millisecond, func() error {
		select {
		case <-exited:
			return fmt.Errorf("broker exited during startup (%v): %w", p.exitErr(), errPollAbort)
		default:
		}
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	})
	if err != nil {
		p.dumpLog(t)
		t.Fatalf("kaas on %s not healthy: %v", p.addr, err)
	}
	t.Logf("kaas start #%d on %s ready in %s", p.starts, p.addr, time.Since(start).Round(time.Millisecond))
}

func (p *kaasProc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *kaasProc) signal(t *testing.T, sig syscall.Signal, wait time.Duration) error {
	t.Helper()
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		t.Fatalf("kaas %s: not running", p.addr)
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(wait):
		_ = cmd.Process.Kill()
		<-exited
		p.mu.Lock()
		p.cmd = nil
		p.mu.Unlock()
		return fmt.Errorf("kaas %s did not exit within %s of %v; killed", p.addr, wait, sig)
	}
	p.mu.Lock()
	p.cmd = nil
	p.mu.Unlock()
	return nil
}

func (p *kaasProc) Kill(t *testing.T) {
	t.Helper()
	if err := p.signal(t, syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// Stop is a clean shutdown: SIGTERM must make the broker exit 0 within 15 s.
func (p *kaasProc) Stop(t *testing.T) {
	t.Helper()
	if err := p.signal(t, syscall.SIGTERM, 15*time.Second); err != nil {
		t.Error(err)
		return
	}
	if err := p.exitErr(); err != nil {
		t.Errorf("kaas %s exited uncleanly after SIGTERM: %v", p.addr, err)
	}
}

func (p *kaasProc) dumpLog(t *testing.T) {
	t.Helper()
	t.Logf("last lines of %s:\n%s", p.logPath, e2eTailFile(p.logPath, 60))
}

func e2eTailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// refKafka is the reference Apache Kafka KRaft broker, driven through bench/kafka-tools.sh so
// that the same code path people use by hand is the one validated here.
type refKafka struct {
	dir   string
	port  int
	cport int
}

func startRefKafka(t *testing.T) *refKafka {
	t.Helper()
	requireKafkaLib(t)
	r := &refKafka{dir: filepath.Join(e2eLogDir(t), "kafka-ref"), port: e2eFreePort(t), cport: e2eFreePort(t)}
	t.Cleanup(func() {
		// Always: a Restart that failed half-way may have left a broker behind (ref-stop is a
		// no-op when nothing runs).
		r.Stop(t)
		if t.Failed() {
			t.Logf("last lines of %s/kafka.out:\n%s", r.dir, e2eTailFile(filepath.Join(r.dir, "kafka.out"), 40))
		}
	})
	r.Restart(t)
	return r
}

func (r *refKafka) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

func (r *refKafka) script(t *testing.T, timeout time.Duration, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e2eRepoRoot, "bench", "kafka-tools.sh"), args...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("KAFKA_REF_CONTROLLER_PORT=%d", r.cport))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kafka-tools.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (r *refKafka) Restart(t *testing.T) {
	t.Helper()
	start := time.Now()
	r.script(t, 120*time.Second, "ref-start", strconv.Itoa(r.port), r.dir)
	t.Logf("Apache Kafka on %s ready in %s", r.Addr(), time.Since(start).Round(time.Millisecond))
}

func (r *refKafka) Kill(t *testing.T) {
	t.Helper()
	r.script(t, 60*time.Second, "ref-kill", r.dir)
}

func (r *refKafka) Stop(t *testing.T) {
	t.Helper()
	r.script(t, 90*time.Second, "ref-stop", r.dir)
}

// ---------------------------------------------------------------------------------------------
// Apache Kafka Java tools

func kafkaLibDir() string { return filepath.Join(e2eRepoRoot, "bench", ".kafka-lib") }

// requireKafkaLib fails (never skips) when the Java tools have not been fetched.
func requireKafkaLib(t *testing.T) {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(kafkaLibDir(), "kafka-tools-*.jar"))
	if len(m) == 0 {
		t.Fatalf("Apache Kafka Java tools missing in %s: run bench/kafka-tools.sh fetch (or make tools)", kafkaLibDir())
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Fatalf("java not on PATH (need Java 17+ for the Kafka tools): %v", err)
	}
}

type toolRun struct {
	stdout, stderr string
	dur            time.Duration
}

// javaTool runs `bench/kafka-tools.sh run <main> args...` and fails the test on a non-zero exit
// or timeout. stdout and stderr are returned whole; use javaToolStream for large outputs.
func javaTool(t *testing.T, timeout time.Duration, main string, args ...string) toolRun {
	t.Helper()
	var out bytes.Buffer
	errOut, dur, err := javaToolStream(timeout, &out, main, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", e2eShortClass(main), strings.Join(args, " "), err,
			e2eTruncate(out.String(), 4000), e2eTruncate(errOut, 4000))
	}
	return toolRun{stdout: out.String(), stderr: errOut, dur: dur}
}

// javaToolStream runs a Java tool with stdout going to w; stderr is collected and returned.
func javaToolStream(timeout time.Duration, w io.Writer, main string, args ...string) (string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e2eRepoRoot, "bench", "kafka-tools.sh"), append([]string{"run", main}, args...)...)
	var errBuf bytes.Buffer
	cmd.Stdout = w
	cmd.Stderr = &errBuf
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	dur := time.Since(start)
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %s: %w", timeout, err)
	}
	return errBuf.String(), dur, err
}

func e2eShortClass(main string) string { return main[strings.LastIndex(main, ".")+1:] }

func e2eTruncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// errorLines returns the lines of s that report an exception or an ERROR log entry.
func e2eErrorLines(s string) []string {
	var bad []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "Exception") || strings.Contains(l, " ERROR ") || strings.HasPrefix(l, "ERROR") {
			bad = append(bad, l)
		}
	}
	return bad
}

// lookTool finds an external client or fails with an install hint.
func e2eLookTool(t *testing.T, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found (%s): %v", name, hint, err)
	}
	return p
}

// runCmd runs a command with stdin, bounded by timeout, and fails the test on error.
func e2eRunCmd(t *testing.T, timeout time.Duration, stdin string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("timed out after %s: %w", timeout, err)
		}
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(name), strings.Join(args, " "), err,
			e2eTruncate(out.String(), 4000), e2eTruncate(errb.String(), 4000))
	}
	if s := errb.String(); strings.TrimSpace(s) != "" {
		t.Logf("%s stderr:\n%s", filepath.Base(name), e2eTruncate(s, 2000))
	}
	return out.String()
}

// stepTimer logs how long each named step of a test took, for the report and for spotting
// regressions in CI logs.
type e2eStepTimer struct {
	t     *testing.T
	start time.Time
}

func newE2EStepTimer(t *testing.T) *e2eStepTimer { return &e2eStepTimer{t: t, start: time.Now()} }

func (s *e2eStepTimer) done(step string) {
	s.t.Helper()
	s.t.Logf("step %-28s %8s", step, time.Since(s.start).Round(time.Millisecond))
	s.start = time.Now()
}
