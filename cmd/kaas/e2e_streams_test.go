package main

// End-to-end tests with a real Kafka Streams 4.1 application (cmd/kaas/testdata/streams-app,
// StreamsCount.java): processing.guarantee=exactly_once_v2, groupByKey().count() in a persistent
// RocksDB store, Long counts to an output topic. This is the heaviest user of the transactional
// surface: transactional producers per stream thread (KIP-447), TxnOffsetCommit with the group
// metadata, a compacted changelog topic it creates itself, and restoration from that changelog
// with read_committed. Because the record cache is off, every input record yields one output
// record, so exactly-once is checked exactly: the committed output of every key must be the
// sequence 1, 2, ..., n, whatever failures happened in between (a double count would show up as
// a value repeated or out of order, a lost count as a gap or a short sequence).

import (
	"bufio"
	"context"
	"fmt"
	"io"
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

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	e2eStreamsKeys  = 200
	e2eStreamsParts = 4
)

var (
	e2eStreamsBuildOnce sync.Once
	e2eStreamsBuildErr  error
)

func e2eStreamsAppDir() string {
	return filepath.Join(e2eRepoRoot, "cmd", "kaas", "testdata", "streams-app")
}

// e2eStreamsBuild builds the application once per test run (build.sh is a no-op when its
// target/ matches the sources; Maven caches the jars in ~/.m2).
func e2eStreamsBuild(t *testing.T) {
	t.Helper()
	e2eStreamsBuildOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(e2eStreamsAppDir(), "build.sh"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			e2eStreamsBuildErr = fmt.Errorf("cannot build the Kafka Streams app: %w\n%s", err, out)
		}
	})
	if e2eStreamsBuildErr != nil {
		t.Fatal(e2eStreamsBuildErr)
	}
}

// e2eStreamsApp is one StreamsCount JVM, restartable with the same arguments.
type e2eStreamsApp struct {
	args    []string
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
	state  string // last KafkaStreams state printed by the app
	starts int
}

func newE2EStreamsApp(t *testing.T, bootstrap, appID, in, out, stateDir string, extra ...string) *e2eStreamsApp {
	t.Helper()
	e2eStreamsBuild(t)
	dir := e2eStreamsAppDir()
	a := &e2eStreamsApp{logPath: filepath.Join(e2eLogDir(t), "streams-app.log")}
	a.args = append([]string{"-Xmx384m", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
		"-Dlog4j2.configurationFile=" + filepath.Join(e2eRepoRoot, "bench", "java", "log4j2-tools.properties"),
		"-cp", filepath.Join(dir, "target", "classes") + string(os.PathListSeparator) + filepath.Join(dir, "target", "lib", "*"),
		"StreamsCount", bootstrap, appID, in, out, stateDir}, extra...)
	t.Cleanup(func() {
		a.kill()
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", a.logPath, e2eTailFile(a.logPath, 80))
		}
	})
	return a
}

func (a *e2eStreamsApp) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("cannot open the streams app log: %v", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.starts++
	fmt.Fprintf(logf, "\n===== e2e: start #%d\n", a.starts)
	cmd := exec.Command("java", a.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		t.Fatalf("streams app: %v", err)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("cannot start the streams app: %v", err)
	}
	exited := make(chan struct{})
	a.cmd, a.exited, a.state, a.err = cmd, exited, "", nil
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if f := strings.Fields(line); len(f) == 3 && f[0] == "STATE" {
				a.mu.Lock()
				a.state = f[2]
				a.mu.Unlock()
			}
		}
		err := cmd.Wait()
		logf.Close()
		a.mu.Lock()
		a.err = err
		a.mu.Unlock()
		close(exited)
	}()
}

// check fails the poll at once when the app died or went to ERROR: waiting cannot help then.
func (a *e2eStreamsApp) check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.exited:
		return fmt.Errorf("streams app exited (%v): %w", a.err, errPollAbort)
	default:
	}
	if a.state == "ERROR" {
		return fmt.Errorf("streams app in state ERROR: %w", errPollAbort)
	}
	return nil
}

// stop is a clean shutdown: SIGTERM runs KafkaStreams.close, which commits or aborts the open
// transactions and writes the local checkpoint.
func (a *e2eStreamsApp) stop(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	cmd, exited := a.cmd, a.exited
	a.mu.Unlock()
	if cmd == nil {
		t.Fatal("streams app not running")
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		a.kill()
		t.Fatal("streams app did not exit within 60 s of SIGTERM")
	}
	a.mu.Lock()
	a.cmd = nil
	a.mu.Unlock()
}

func (a *e2eStreamsApp) kill() {
	a.mu.Lock()
	cmd, exited := a.cmd, a.exited
	a.cmd = nil
	a.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// e2eStreamsChangelogName is the changelog topic Streams creates for the app's "counts" store.
func e2eStreamsChangelogName(appID string) string { return appID + "-counts-changelog" }

// e2eStreamsKey names key i of the workload.
func e2eStreamsKey(i int) string { return fmt.Sprintf("k%03d", i) }

// e2eStreamsProduce writes records [from, to) of every key, interleaved across keys so that
// every partition and every key advances together.
func e2eStreamsProduce(t *testing.T, cl *kgo.Client, topic string, from, to int) {
	t.Helper()
	recs := make([]*kgo.Record, 0, e2eStreamsKeys*(to-from))
	for j := from; j < to; j++ {
		for i := 0; i < e2eStreamsKeys; i++ {
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(e2eStreamsKey(i)), Value: []byte(strconv.Itoa(j))})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("cannot produce records %d..%d of every key to %s: %v", from, to, topic, err)
	}
}

type e2eStreamsRec struct {
	p     int32
	o     int64
	key   string
	value []byte
}

// e2eStreamsRead reads every partition of topic from its start up to the given end offsets
// (LSO for read_committed, HWM otherwise), returning the data records. bootstrap is one broker
// or several joined with commas (a cluster's seeds): the reader follows leadership moves, with
// the cluster tests' short metadata age so a move costs 100 ms rather than kgo's 5 s.
func e2eStreamsRead(bootstrap, topic string, end map[int32]int64, committed bool, timeout time.Duration) ([]e2eStreamsRec, error) {
	parts := map[int32]kgo.Offset{}
	next := map[int32]int64{}
	for p, e := range end {
		if e > 0 {
			parts[p] = kgo.NewOffset().AtStart()
		}
	}
	if len(parts) == 0 {
		return nil, nil
	}
	level := kgo.ReadUncommitted()
	if committed {
		level = kgo.ReadCommitted()
	}
	cl, err := kgo.NewClient(append(e2eClusterClientOpts(strings.Split(bootstrap, ",")...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(level), kgo.KeepControlRecords(), kgo.FetchMaxWait(200*time.Millisecond))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var recs []e2eStreamsRec
	for {
		done := true
		for p, e := range end {
			if next[p] < e {
				done = false
			}
		}
		if done {
			return recs, nil
		}
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reading %s: positions %v, end offsets %v after %s", topic, next, end, timeout)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 > next[r.Partition] {
				next[r.Partition] = r.Offset + 1
			}
			if !r.Attrs.IsControl() {
				recs = append(recs, e2eStreamsRec{p: r.Partition, o: r.Offset, key: string(r.Key), value: r.Value})
			}
		})
	}
}

// e2eStreamsCounts reads the committed output: the sequence of counts of every key in offset
// order (a key lives in one partition, so that is the order the app wrote them).
func e2eStreamsCounts(cl *kgo.Client, bootstrap, topic string) (map[string][]int64, error) {
	lso, err := e2eTxnListOffsets(cl, topic, e2eStreamsParts, e2eTxnReadCommitted)
	if err != nil {
		return nil, err
	}
	recs, err := e2eStreamsRead(bootstrap, topic, lso, true, 30*time.Second)
	if err != nil {
		return nil, err
	}
	seq := map[string][]int64{}
	for _, r := range recs {
		if len(r.value) != 8 {
			return nil, fmt.Errorf("%s-%d@%d: value of %d bytes, want an 8-byte Long", topic, r.p, r.o, len(r.value))
		}
		var v int64
		for _, b := range r.value {
			v = v<<8 | int64(b)
		}
		seq[r.key] = append(seq[r.key], v)
	}
	return seq, nil
}

// e2eStreamsWaitCounts polls until the committed last count of every key is want.
func e2eStreamsWaitCounts(t *testing.T, app *e2eStreamsApp, cl *kgo.Client, bootstrap, topic string, want int64, timeout time.Duration) {
	t.Helper()
	e2eEventually(t, timeout, fmt.Sprintf("committed count %d for all %d keys", want, e2eStreamsKeys), func() error {
		if err := app.check(); err != nil {
			return err
		}
		seq, err := e2eStreamsCounts(cl, bootstrap, topic)
		if err != nil {
			return err
		}
		short := 0
		for i := 0; i < e2eStreamsKeys; i++ {
			s := seq[e2eStreamsKey(i)]
			if len(s) == 0 || s[len(s)-1] != want {
				short++
			}
		}
		if short > 0 {
			return fmt.Errorf("%d keys not at %d yet", short, want)
		}
		return nil
	})
}

// e2eStreamsCheckExact asserts exactly-once on the committed output: every key's counts are
// 1, 2, ..., want in order, each value once. The read is retried on errors (a partition between
// owners right after a broker came or went answers NOT_LEADER for a moment), never on content.
func e2eStreamsCheckExact(t *testing.T, cl *kgo.Client, bootstrap, topic string, want int64) {
	t.Helper()
	e2eTxnWaitStable(t, cl, topic, e2eStreamsParts, 60*time.Second)
	var seq map[string][]int64
	e2eEventually(t, 60*time.Second, "the committed output of "+topic, func() error {
		var err error
		seq, err = e2eStreamsCounts(cl, bootstrap, topic)
		return err
	})
	if len(seq) != e2eStreamsKeys {
		t.Errorf("output has %d keys, want %d", len(seq), e2eStreamsKeys)
	}
	bad := 0
	for i := 0; i < e2eStreamsKeys; i++ {
		k := e2eStreamsKey(i)
		s := seq[k]
		ok := int64(len(s)) == want
		for j := 0; ok && j < len(s); j++ {
			ok = s[j] == int64(j+1)
		}
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("key %s: committed counts %v, want 1..%d each once in order", k, e2eStreamsTrim(s), want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d keys have a wrong committed count sequence", bad, e2eStreamsKeys)
	}
}

func e2eStreamsTrim(s []int64) string {
	if len(s) <= 20 {
		return fmt.Sprint(s)
	}
	return fmt.Sprintf("%v … %v (%d values)", s[:10], s[len(s)-10:], len(s))
}

// e2eStreamsSetup starts a broker and creates the input and output topics.
func e2eStreamsSetup(t *testing.T, prefix string) (b e2eBroker, cl *kgo.Client, in, out, appID string) {
	t.Helper()
	b = startE2EBroker(t)
	cl = e2eTxnClient(t, b.Addr(), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RequiredAcks(kgo.AllISRAcks()))
	in, out, appID = e2eName(prefix+"-in"), e2eName(prefix+"-out"), e2eName(prefix+"-app")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	for _, topic := range []string{in, out} {
		if _, err := adm.CreateTopic(ctx, e2eStreamsParts, 1, nil, topic); err != nil {
			t.Fatalf("cannot create topic %s: %v", topic, err)
		}
	}
	return b, cl, in, out, appID
}

// TestStreamsEOSCount: 200 keys × 100 records through the EOS count application; the committed
// output has each count of each key exactly once, in order.
func TestStreamsEOSCount(t *testing.T) {
	st := newE2EStepTimer(t)
	b, cl, in, out, appID := e2eStreamsSetup(t, "streams-count")
	const n = 100
	e2eStreamsProduce(t, cl, in, 0, n)
	st.done("produce")
	app := newE2EStreamsApp(t, b.Addr(), appID, in, out, t.TempDir())
	app.start(t)
	e2eStreamsWaitCounts(t, app, cl, b.Addr(), out, n, 120*time.Second)
	st.done("count")
	app.stop(t)
	e2eStreamsCheckExact(t, cl, b.Addr(), out, n)
}

// TestStreamsEOSRepartitionPurgedWithDeleteRecords: the count application re-keys its input
// (kaas.repartition=true), so Streams creates <app>-counts-repartition and, every
// repartition.purge.interval.ms, deletes what its committed offsets have consumed with
// DeleteRecords (Streams' own admin client, KIP-204): every repartition partition's log start
// moves past 0 while the app runs, and the output still counts every record exactly once.
func TestStreamsEOSRepartitionPurgedWithDeleteRecords(t *testing.T) {
	st := newE2EStepTimer(t)
	b, cl, in, out, appID := e2eStreamsSetup(t, "streams-repart")
	const rounds, per = 4, 25
	app := newE2EStreamsApp(t, b.Addr(), appID, in, out, t.TempDir(),
		"kaas.repartition=true", "repartition.purge.interval.ms=500")
	app.start(t)
	for r := 0; r < rounds; r++ {
		e2eStreamsProduce(t, cl, in, r*per, (r+1)*per)
		e2eStreamsWaitCounts(t, app, cl, b.Addr(), out, int64((r+1)*per), 120*time.Second)
	}
	st.done("count through the repartition topic")
	repart := appID + "-counts-repartition"
	adm := kadm.NewClient(cl)
	e2eEventually(t, 60*time.Second, "Streams purged "+repart, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		starts, err := adm.ListStartOffsets(ctx, repart)
		if err != nil {
			return err
		}
		ends, err := adm.ListEndOffsets(ctx, repart)
		if err != nil {
			return err
		}
		if len(ends) == 0 || len(ends[repart]) == 0 {
			return fmt.Errorf("%s has no partitions yet", repart)
		}
		for p, e := range ends[repart] {
			s, ok := starts.Lookup(repart, p)
			if e.Err != nil || !ok || s.Err != nil {
				return fmt.Errorf("partition %d: end %+v start %+v", p, e, s)
			}
			if e.Offset > 0 && s.Offset == 0 {
				return fmt.Errorf("partition %d: log start still 0 with %d records written", p, e.Offset)
			}
		}
		t.Logf("%s: starts %v, ends %v", repart, e2eOffsetsOf(starts, repart), e2eOffsetsOf(ends, repart))
		return nil
	})
	st.done("purge seen")
	app.stop(t)
	e2eStreamsCheckExact(t, cl, b.Addr(), out, rounds*per)
}

// e2eOffsetsOf is a topic's offsets by partition, for logs.
func e2eOffsetsOf(l kadm.ListedOffsets, topic string) map[int32]int64 {
	out := map[int32]int64{}
	for p, o := range l[topic] {
		out[p] = o.Offset
	}
	return out
}

// TestStreamsEOSCountBrokerKill9 is the same workload produced in four rounds, with the broker
// SIGKILLed and restarted on the same data dir twice while the application is processing (its
// transactions open). Streams' clients retry through the outage; whatever was in flight is
// aborted or fenced, and the committed output must still count every record exactly once.
func TestStreamsEOSCountBrokerKill9(t *testing.T) {
	st := newE2EStepTimer(t)
	b, cl, in, out, appID := e2eStreamsSetup(t, "streams-kill")
	const rounds, per = 4, 25
	app := newE2EStreamsApp(t, b.Addr(), appID, in, out, t.TempDir())
	app.start(t)
	for r := 0; r < rounds; r++ {
		before := e2eStreamsOutputOffsets(t, cl, out)
		e2eStreamsProduce(t, cl, in, r*per, (r+1)*per)
		if r == 1 || r == 2 {
			where := e2eStreamsMidRound(t, app, cl, out, before, "round "+strconv.Itoa(r))
			t.Logf("round %d: kill -9 with %s", r, where)
			b.Kill(t)
			b.Restart(t)
			st.done(fmt.Sprintf("kill -9 #%d", r))
		}
	}
	e2eStreamsWaitCounts(t, app, cl, b.Addr(), out, rounds*per, 150*time.Second)
	st.done("count")
	app.stop(t)
	e2eStreamsCheckExact(t, cl, b.Addr(), out, rounds*per)
}

// e2eStreamsOutputOffsets lists the output's high watermarks, retried: a just-created topic may
// not be known to every part of the broker yet (UNKNOWN_TOPIC_OR_PARTITION for a moment on
// Apache Kafka), and a partition between owners answers NOT_LEADER for a moment in a cluster.
func e2eStreamsOutputOffsets(t *testing.T, cl *kgo.Client, out string) map[int32]int64 {
	t.Helper()
	var hwm map[int32]int64
	e2eEventually(t, 30*time.Second, "output offsets of "+out, func() error {
		var err error
		hwm, err = e2eTxnListOffsets(cl, out, e2eStreamsParts, e2eTxnReadUncommitted)
		return err
	})
	return hwm
}

// e2eStreamsMidRound returns once the app is in the middle of processing a round: it has
// written some of it (an output high watermark moved past before). Then, best effort for a few
// seconds, it catches a moment with a transaction open on the output (LSO behind the high
// watermark), the case exactly-once is about. It describes the moment for the test's log, so
// the log says where a failure injected right after it landed.
func e2eStreamsMidRound(t *testing.T, app *e2eStreamsApp, cl *kgo.Client, out string, before map[int32]int64, what string) string {
	t.Helper()
	e2eEventually(t, 90*time.Second, "the app writing "+what, func() error {
		if err := app.check(); err != nil {
			return err
		}
		now, err := e2eTxnListOffsets(cl, out, e2eStreamsParts, e2eTxnReadUncommitted)
		if err != nil {
			return err
		}
		for p := range now {
			if now[p] > before[p] {
				return nil
			}
		}
		return fmt.Errorf("output high watermarks %v, before the round %v", now, before)
	})
	var lso, hwm map[int32]int64
	open := e2ePoll(5*time.Second, 10*time.Millisecond, func() error {
		var err error
		if hwm, err = e2eTxnListOffsets(cl, out, e2eStreamsParts, e2eTxnReadUncommitted); err != nil {
			return err
		}
		if lso, err = e2eTxnListOffsets(cl, out, e2eStreamsParts, e2eTxnReadCommitted); err != nil {
			return err
		}
		for p := range hwm {
			if lso[p] < hwm[p] {
				return nil
			}
		}
		return fmt.Errorf("no open transaction")
	}) == nil
	return fmt.Sprintf("output LSO %v, HWM %v before the round %v (transaction open: %v)", lso, hwm, before, open)
}

// e2eStreamsChangelog reads the whole changelog (read_uncommitted, up to the high watermarks)
// and returns, per partition, the data records kept and the distinct keys among them. The
// store's changelog partition is its input partition and compaction keeps every key's latest
// value, so keys[p] × the records per key written is what partition p received.
func e2eStreamsChangelog(cl *kgo.Client, bootstrap, changelog string) (kept, keys map[int32]int, err error) {
	hwm, err := e2eTxnListOffsets(cl, changelog, e2eStreamsParts, e2eTxnReadUncommitted)
	if err != nil {
		return nil, nil, err
	}
	recs, err := e2eStreamsRead(bootstrap, changelog, hwm, false, 30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	kept, keys = map[int32]int{}, map[int32]int{}
	seen := map[string]bool{}
	for _, r := range recs {
		kept[r.p]++
		if !seen[r.key] {
			seen[r.key] = true
			keys[r.p]++
		}
	}
	return kept, keys, nil
}

// e2eStreamsCheckCompact asserts that DescribeConfigs of the changelog shows
// cleanup.policy=compact (Streams creates it so).
func e2eStreamsCheckCompact(t *testing.T, cl *kgo.Client, changelog string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfgs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, changelog)
	if err != nil {
		t.Fatalf("cannot describe %s: %v", changelog, err)
	}
	v, err := cfgs.On(changelog, nil)
	if err != nil {
		t.Fatalf("describe %s: %v", changelog, err)
	}
	policy := "(absent)"
	for _, c := range v.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil {
			policy = *c.Value
		}
	}
	if policy != "compact" {
		t.Fatalf("%s: cleanup.policy %s, want compact (created so by Streams)", changelog, policy)
	}
}

// e2eStreamsMetric reads one counter from the broker's /metrics.
func e2eStreamsMetric(addr, name string) (float64, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(body), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("metric %s not exported", name)
}

// TestStreamsChangelogCompactedRestore: the count store's changelog (created by Streams with
// cleanup.policy=compact, here with 100 ms segments and an eager cleaner) is compacted by the
// broker after the first half of the workload; the app then loses its local state (state dir
// wiped) and restores the store from the compacted, transactional changelog before processing
// the second half. A wrong restore (a lost or stale latest value of a key, an aborted record
// that survived cleaning) would show as a count sequence that does not continue 51, 52, ...
func TestStreamsChangelogCompactedRestore(t *testing.T) {
	if e2eBrokerKind() == "kaas" {
		e2eExtraKaasArgs = []string{"--log.cleaner.backoff.ms=100"}
		defer func() { e2eExtraKaasArgs = nil }()
	}
	st := newE2EStepTimer(t)
	b, cl, in, out, appID := e2eStreamsSetup(t, "streams-restore")
	const half = 50
	stateDir := t.TempDir()
	app := newE2EStreamsApp(t, b.Addr(), appID, in, out, stateDir,
		// StreamsConfig's topic. prefix applies to the internal topics Streams creates.
		"topic.segment.ms=100", "topic.min.cleanable.dirty.ratio=0.01", "topic.min.compaction.lag.ms=0")
	// The first half goes in two chunks, the second produced once the first is counted, so
	// that the changelog records of the first chunk sit in rolled (cleanable) segments whatever
	// the speed of the machine: all but the latest of each key must go.
	app.start(t)
	e2eStreamsProduce(t, cl, in, 0, half/2)
	e2eStreamsWaitCounts(t, app, cl, b.Addr(), out, half/2, 120*time.Second)
	e2eStreamsProduce(t, cl, in, half/2, half)
	e2eStreamsWaitCounts(t, app, cl, b.Addr(), out, half, 120*time.Second)
	st.done("count first half")
	app.stop(t)

	changelog := e2eStreamsChangelogName(appID)
	e2eStreamsCheckCompact(t, cl, changelog)
	written := int64(e2eStreamsKeys * half) // one changelog record per input record (no cache)
	var kept int
	e2eEventually(t, 60*time.Second, "changelog "+changelog+" compacted", func() error {
		perPart, _, err := e2eStreamsChangelog(cl, b.Addr(), changelog)
		if err != nil {
			return err
		}
		kept = 0
		for _, n := range perPart {
			kept += n
		}
		// The first chunk's superseded values alone are 3/8 of what was written.
		if int64(kept) >= written*3/4 {
			return fmt.Errorf("%d records in the changelog, %d written", kept, written)
		}
		return nil
	})
	t.Logf("changelog %s: %d records kept of %d written", changelog, kept, written)
	if kp, ok := b.(*kaasProc); ok {
		if n, err := e2eStreamsMetric(kp.metrics, "kaas_cleaner_cleans_total"); err != nil || n == 0 {
			t.Errorf("kaas_cleaner_cleans_total = %v (%v), want > 0", n, err)
		}
	}
	st.done("compaction")

	// The cleaner is not paused for the restore: it keeps cleaning the changelog from the
	// restart on, while the app restores and writes the second half's changelog records.
	var cleansBefore float64
	kp, isKaas := b.(*kaasProc)
	if isKaas {
		cleansBefore, _ = e2eStreamsMetric(kp.metrics, "kaas_cleaner_cleans_total")
	}
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	app.start(t)
	e2eStreamsProduce(t, cl, in, half, 2*half)
	e2eStreamsWaitCounts(t, app, cl, b.Addr(), out, 2*half, 120*time.Second)
	st.done("restore + second half")
	if isKaas {
		e2eEventually(t, 60*time.Second, "a clean of the changelog while the app runs", func() error {
			n, err := e2eStreamsMetric(kp.metrics, "kaas_cleaner_cleans_total")
			if err != nil {
				return err
			}
			if n <= cleansBefore {
				return fmt.Errorf("kaas_cleaner_cleans_total still %v", n)
			}
			return nil
		})
	}
	app.stop(t)
	e2eStreamsCheckExact(t, cl, b.Addr(), out, 2*half)
}
