package main

// End-to-end tests of the transactional surface (KIP-98 / KIP-447 / KIP-664 / KIP-890) with real
// clients: kafka-producer-perf-test in transactional mode, Kafka's TransactionalMessageCopier
// (the worker of tests/kafkatest/tests/core/transactions_test.py) with and without broker
// SIGKILLs, kafka-transactions.sh (TransactionsCommand) on a hanging transaction, and
// python3-confluent-kafka (librdkafka) commit/abort. Reads go through kgo/kcat with an explicit
// isolation level so that read_committed (LSO, aborted-transaction index) is checked, not assumed.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kaas-go/kaas/coord/txn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	e2eTxnClassCopier   = "org.apache.kafka.tools.TransactionalMessageCopier"
	e2eTxnClassTxns     = "org.apache.kafka.tools.TransactionsCommand"
	e2eTxnClassVerProd  = "org.apache.kafka.tools.VerifiableProducer"
	e2eTxnClassFeatures = "org.apache.kafka.tools.FeatureCommand"

	e2eTxnReadUncommitted int8 = 0
	e2eTxnReadCommitted   int8 = 1
)

// ---------------------------------------------------------------------------------------------
// Broker and small protocol helpers

// e2eTxnStartBroker starts a managed broker with the given finalized transaction.version. kaas
// takes it as a flag (finalized in ApiVersions, not persisted), so a TV1 broker is the default one
// restarted with --transaction.version=1; the reference Kafka is downgraded with kafka-features.
func e2eTxnStartBroker(t *testing.T, tv int16) e2eBroker {
	t.Helper()
	b := startE2EBroker(t)
	if tv != 2 {
		switch b := b.(type) {
		case *kaasProc:
			b.Stop(t)
			b.args = append(b.args, fmt.Sprintf("--transaction.version=%d", tv))
			b.Restart(t)
		default:
			javaTool(t, 60*time.Second, e2eTxnClassFeatures, "--bootstrap-server", b.Addr(),
				"downgrade", "--feature", fmt.Sprintf("transaction.version=%d", tv))
		}
	}
	e2eEventually(t, 30*time.Second, "finalized transaction.version", func() error {
		got, err := e2eTxnFinalizedTV(b.Addr())
		if err != nil {
			return err
		}
		if got != tv {
			return fmt.Errorf("finalized transaction.version %d, want %d", got, tv)
		}
		return nil
	})
	return b
}

// e2eTxnClient is a client seeded with addr: one broker, or several joined with commas (the
// cluster tests' 3-seed bootstrap, as the Java tools take it).
func e2eTxnClient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(addr, ",")...)}, opts...)...)
	if err != nil {
		t.Fatalf("cannot create kgo client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// e2eTxnFinalizedTV reads transaction.version from ApiVersions' FinalizedFeatures: what every
// Java 4.x client uses to pick the TV1 or TV2 protocol.
func e2eTxnFinalizedTV(addr string) (int16, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return 0, err
	}
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "transaction.version" {
			return f.MaxVersionLevel, nil
		}
	}
	return 0, nil
}

// e2eTxnListOffsets returns the latest offset per partition for an isolation level: the high
// watermark (read_uncommitted) or the last stable offset (read_committed).
func e2eTxnListOffsets(cl *kgo.Client, topic string, parts int32, iso int8) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	req.IsolationLevel = iso
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := int32(0); p < parts; p++ {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p
		rp.CurrentLeaderEpoch = -1
		rp.Timestamp = -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return nil, fmt.Errorf("ListOffsets %s-%d isolation %d: error code %d", topic, p.Partition, iso, p.ErrorCode)
			}
			out[p.Partition] = p.Offset
		}
	}
	if len(out) != int(parts) {
		return nil, fmt.Errorf("ListOffsets %s: %d partitions answered, want %d", topic, len(out), parts)
	}
	return out, nil
}

// e2eTxnWaitStable polls until LSO == HWM on every partition (no transaction left open) and
// returns the high watermarks.
func e2eTxnWaitStable(t *testing.T, cl *kgo.Client, topic string, parts int32, timeout time.Duration) map[int32]int64 {
	t.Helper()
	var hwm map[int32]int64
	e2eEventually(t, timeout, "LSO == HWM on "+topic, func() error {
		h, err := e2eTxnListOffsets(cl, topic, parts, e2eTxnReadUncommitted)
		if err != nil {
			return err
		}
		l, err := e2eTxnListOffsets(cl, topic, parts, e2eTxnReadCommitted)
		if err != nil {
			return err
		}
		for p := range h {
			if l[p] != h[p] {
				return fmt.Errorf("partition %d: LSO %d, HWM %d", p, l[p], h[p])
			}
		}
		hwm = h
		return nil
	})
	return hwm
}

type e2eTxnRec struct {
	p     int32
	o     int64
	value string
}

// e2eTxnReadAll reads every partition of topic from the start with the given isolation level
// until each partition's position reaches its high watermark. Control records are kept (and
// dropped here) so that a partition ending in a commit/abort marker is seen to be fully read.
// opts are added to the reader's client (TLS and SASL for a secured listener).
func e2eTxnReadAll(t *testing.T, addr, topic string, hwm map[int32]int64, iso int8, timeout time.Duration, opts ...kgo.Opt) []e2eTxnRec {
	t.Helper()
	level := kgo.ReadUncommitted()
	if iso == e2eTxnReadCommitted {
		level = kgo.ReadCommitted()
	}
	parts := map[int32]kgo.Offset{}
	next := map[int32]int64{}
	for p, h := range hwm {
		if h > 0 {
			parts[p] = kgo.NewOffset().AtStart()
			next[p] = 0
		}
	}
	var recs []e2eTxnRec
	if len(parts) == 0 {
		return recs
	}
	cl := e2eTxnClient(t, addr, append([]kgo.Opt{kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(level), kgo.KeepControlRecords(), kgo.FetchMaxWait(200 * time.Millisecond)}, opts...)...)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := func() bool {
		for p, h := range hwm {
			if next[p] < h {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s (isolation %d): positions %v, high watermarks %v after %s", topic, iso, next, hwm, timeout)
		}
		for _, fe := range fs.Errors() {
			t.Logf("fetch %s-%d: %v", fe.Topic, fe.Partition, fe.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 > next[r.Partition] {
				next[r.Partition] = r.Offset + 1
			}
			if r.Attrs.IsControl() {
				return
			}
			recs = append(recs, e2eTxnRec{p: r.Partition, o: r.Offset, value: string(r.Value)})
		})
	}
	return recs
}

// e2eTxnTable parses the space-aligned tables TransactionsCommand prints (a header line, then
// one line per row) into maps keyed by the header names.
func e2eTxnTable(t *testing.T, out string) []map[string]string {
	t.Helper()
	var header []string
	var rows []map[string]string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if header == nil {
			header = f
			continue
		}
		if len(f) != len(header) {
			t.Fatalf("table row %q does not match header %q", l, header)
		}
		row := map[string]string{}
		for i, h := range header {
			row[h] = f[i]
		}
		rows = append(rows, row)
	}
	if header == nil {
		t.Fatalf("no table header in output %q", out)
	}
	return rows
}

func e2eTxnTool(t *testing.T, addr string, args ...string) string {
	t.Helper()
	r := javaTool(t, 60*time.Second, e2eTxnClassTxns, append([]string{"--bootstrap-server", addr}, args...)...)
	t.Logf("kafka-transactions %s (%s):\n%s", strings.Join(args, " "), r.dur.Round(time.Millisecond), strings.TrimRight(r.stdout, "\n"))
	return r.stdout
}

// ---------------------------------------------------------------------------------------------
// 1. kafka-producer-perf-test --transactional-id

// TestTxnPerfTest commits a transaction every 100 ms while pushing 200k × 1 KiB records, then
// counts them with kcat, whose default isolation level is read_committed.
func TestTxnPerfTest(t *testing.T) {
	requireKafkaLib(t)
	kcat := e2eLookTool(t, "kcat", "apt-get install kcat")
	const (
		n          = 200_000
		partitions = 3
	)
	b := startE2EBroker(t)
	addr := b.Addr()
	topic := e2eName("txnperf")
	e2eCreateTopic(t, addr, topic, partitions)
	st := newE2EStepTimer(t)

	r := javaTool(t, 3*time.Minute, classPerfProducer, "--topic", topic, "--num-records", strconv.Itoa(n),
		"--record-size", "1024", "--throughput", "-1",
		"--transactional-id", e2eName("perf-txn"), "--transaction-duration-ms", "100",
		"--producer-props", "bootstrap.servers="+addr, "acks=all", "linger.ms=5")
	st.done("producer-perf-test (txn)")
	var summary []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if m := perfSummaryRE.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			summary = m
		}
	}
	if summary == nil {
		t.Fatalf("no summary line in producer-perf-test output:\n%s\nstderr:\n%s", e2eTruncate(r.stdout, 3000), e2eTruncate(r.stderr, 3000))
	}
	t.Logf("transactional producer-perf-test summary (%s): %s", r.dur.Round(time.Millisecond), summary[0])
	if sent, _ := strconv.Atoi(summary[1]); sent != n {
		t.Errorf("producer-perf-test: %d records sent, want %d", sent, n)
	}
	if bad := e2eErrorLines(r.stdout + r.stderr); len(bad) > 0 {
		t.Fatalf("producer-perf-test reported %d error lines, first: %q", len(bad), bad[0])
	}

	cl := e2eTxnClient(t, addr)
	hwm := e2eTxnWaitStable(t, cl, topic, partitions, 30*time.Second)
	var total int64
	for _, h := range hwm {
		total += h
	}
	// Every transaction leaves one commit marker per partition it wrote to, so the log holds more
	// offsets than records; exactly n data records must be visible.
	if total <= n {
		t.Errorf("high watermarks %v add up to %d: want more than %d (data + commit markers)", hwm, total, n)
	}
	st.done("ListOffsets LSO == HWM")

	out := e2eRunCmd(t, 2*time.Minute, "", kcat, "-b", addr, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
		"-X", "isolation.level=read_committed", "-f", "%p %o\n")
	st.done("kcat -C read_committed")
	seen := map[e2ePos]bool{}
	lines := 0
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var p int
		var o int64
		if _, err := fmt.Sscanf(l, "%d %d", &p, &o); err != nil {
			t.Fatalf("kcat printed %q", l)
		}
		lines++
		if seen[e2ePos{p, o}] {
			t.Errorf("kcat: partition %d offset %d printed twice", p, o)
		}
		seen[e2ePos{p, o}] = true
	}
	t.Logf("kcat read_committed: %d records, %d log offsets in total", lines, total)
	if lines != n || len(seen) != n {
		t.Errorf("kcat read_committed returned %d records (%d distinct offsets), want %d", lines, len(seen), n)
	}
}

// ---------------------------------------------------------------------------------------------
// 2./3. TransactionalMessageCopier

// e2eTxnSeed produces values 0..n-1 to topic with VerifiableProducer (idempotent, acks=all) and
// returns where each acknowledged value landed.
func e2eTxnSeed(t *testing.T, addr, topic string, n int) map[string]e2ePos {
	t.Helper()
	r := javaTool(t, 2*time.Minute, e2eTxnClassVerProd, "--bootstrap-server", addr, "--topic", topic,
		"--max-messages", strconv.Itoa(n), "--acks", "-1", "--throughput", "-1")
	acked := map[string]e2ePos{}
	perPart := map[int][]int64{}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var ev struct {
			Name      string `json:"name"`
			Value     string `json:"value"`
			Partition int    `json:"partition"`
			Offset    int64  `json:"offset"`
			Exception string `json:"exception"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		switch ev.Name {
		case "producer_send_success":
			if _, dup := acked[ev.Value]; dup {
				t.Fatalf("VerifiableProducer acked value %s twice", ev.Value)
			}
			acked[ev.Value] = e2ePos{ev.Partition, ev.Offset}
			perPart[ev.Partition] = append(perPart[ev.Partition], ev.Offset)
		case "producer_send_error":
			t.Fatalf("VerifiableProducer send error: %s", sc.Text())
		}
	}
	if len(acked) != n {
		t.Fatalf("VerifiableProducer acked %d values, want %d; stderr:\n%s", len(acked), n, e2eTruncate(r.stderr, 2000))
	}
	// Idempotent non-transactional data on a fresh topic: offsets per partition are 0..k-1.
	for p, offs := range perPart {
		sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
		for i, o := range offs {
			if o != int64(i) {
				t.Fatalf("seed partition %d: acked offsets not contiguous at %d (offset %d)", p, i, o)
			}
		}
	}
	t.Logf("seeded %d values into %s in %s", n, topic, r.dur.Round(time.Millisecond))
	return acked
}

// e2eTxnCopierStatus is the JSON status line TransactionalMessageCopier prints.
type e2eTxnCopierStatus struct {
	TransactionalID string `json:"transactionalId"`
	Stage           string `json:"stage"`
	TotalProcessed  int64  `json:"totalProcessed"`
	Consumed        int64  `json:"consumed"`
	Remaining       int64  `json:"remaining"`
}

// e2eTxnCopier is one copier (one input partition, one transactional id) across process
// restarts: a process that exits before reporting remaining == 0 is started again with the same
// transactional id, which fences the previous epoch and aborts whatever it left open.
type e2eTxnCopier struct {
	id   string
	args []string

	mu        sync.Mutex
	cmd       *exec.Cmd
	exited    chan struct{}
	exitErr   error
	remaining int64 // last reported (kept across restarts); -1 before the first report
	finished  bool  // the current process reported remaining == 0
	starts    int
	stderr    bytes.Buffer
	lastOut   string
}

func (c *e2eTxnCopier) start(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := exec.Command(filepath.Join(e2eRepoRoot, "bench", "kafka-tools.sh"), append([]string{"run", e2eTxnClassCopier}, c.args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.stderr.Reset()
	cmd.Stderr = &e2eTxnLockedWriter{mu: &c.mu, w: &c.stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("copier %s: %v", c.id, err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start copier %s: %v", c.id, err)
	}
	c.starts++
	c.finished = false
	c.cmd = cmd
	exited := make(chan struct{})
	c.exited = exited
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			var s e2eTxnCopierStatus
			line := sc.Text()
			c.mu.Lock()
			c.lastOut = line
			if json.Unmarshal([]byte(line), &s) == nil && s.TransactionalID != "" {
				c.remaining = s.Remaining
				if s.Remaining == 0 {
					c.finished = true
				}
			}
			c.mu.Unlock()
		}
		err := cmd.Wait()
		c.mu.Lock()
		c.exitErr = err
		c.mu.Unlock()
		close(exited)
	}()
}

// state reports whether the current process has exited, and whether it reported completion.
func (c *e2eTxnCopier) state() (exited, finished bool, remaining int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.exited:
		exited = true
	default:
	}
	return exited, c.finished, c.remaining
}

// kill SIGKILLs the copier's process group (the JVM exec'd by kafka-tools.sh) if still running.
func (c *e2eTxnCopier) kill() {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

type e2eTxnLockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w *e2eTxnLockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.w.Len() > 256*1024 {
		w.w.Reset()
	}
	return w.w.Write(b)
}

type e2eTxnCopyCfg struct {
	in, out, group string
	inParts        int32
	n              int
	bootstrap      string    // the copiers' --broker-list (one address or a comma-separated list)
	txnSize        int       // the copiers' --transaction-size (records per transaction); 0: 750
	killAt         []float64 // fractions of progress at which the broker is SIGKILLed and restarted
	bounceAt       []float64 // fractions of progress at which every copier is SIGKILLed (restarted below)
	timeout        time.Duration
	txnTimeout     time.Duration // the copiers' transaction.timeout.ms
	// chaos, when set, is called on every poll of the copy with the progress so far (0..1) and
	// does the broker failures of the test; it returns true while some are still to come, and
	// the copy is not done before it returns false. killAt needs a single broker; chaos is how
	// the cluster test kills and bounces its brokers.
	chaos func(progress float64) (pending bool)
}

// e2eTxnReapInterval is the broker's default transaction reaper period
// (transaction.abort.timed.out.transaction.cleanup.interval.ms).
const e2eTxnReapInterval = 10 * time.Second

// e2eTxnCopy runs one copier per input partition until every one reported remaining == 0 and
// exited, restarting copiers that die and bouncing the broker at the configured progress marks.
func e2eTxnCopy(t *testing.T, b e2eBroker, cfg e2eTxnCopyCfg) {
	t.Helper()
	if cfg.bootstrap == "" {
		cfg.bootstrap = b.Addr()
	}
	if cfg.txnSize == 0 {
		cfg.txnSize = 750
	}
	copiers := make([]*e2eTxnCopier, cfg.inParts)
	for p := range copiers {
		id := fmt.Sprintf("copier-%d-%s", p, cfg.group)
		copiers[p] = &e2eTxnCopier{id: id, remaining: -1, args: []string{
			"--broker-list", cfg.bootstrap, "--transactional-id", id,
			"--input-topic", cfg.in, "--input-partition", strconv.Itoa(p),
			"--output-topic", cfg.out, "--consumer-group", cfg.group,
			"--transaction-size", strconv.Itoa(cfg.txnSize), "--transaction-timeout", strconv.FormatInt(cfg.txnTimeout.Milliseconds(), 10),
			"--use-group-metadata", "--enable-random-aborts",
		}}
	}
	t.Cleanup(func() {
		for _, c := range copiers {
			c.kill()
		}
	})
	for _, c := range copiers {
		c.start(t)
	}
	const maxStarts = 12
	kills, bounces := cfg.killAt, cfg.bounceAt
	start, lastLog := time.Now(), time.Now()
	// After a copier bounce, the restarted copier's InitProducerId must fence and abort the
	// transaction the killed one left open right away (Kafka: PrepareEpochFence → abort), not
	// leave it to the coordinator's reaper after transaction.timeout.ms (40 s here).
	var bouncedAt time.Time
	var atBounce []int64
	var recovered []time.Duration
	progress := func() float64 {
		var left int64
		for _, c := range copiers {
			_, _, r := c.state()
			if r < 0 {
				return 0
			}
			left += r
		}
		return 1 - float64(left)/float64(cfg.n)
	}
	err := e2ePoll(cfg.timeout, 100*time.Millisecond, func() error {
		chaosPending := cfg.chaos != nil && cfg.chaos(progress())
		if len(kills) > 0 && progress() >= kills[0] {
			t.Logf("progress %.0f%% after %s: SIGKILL broker", 100*progress(), time.Since(start).Round(time.Millisecond))
			b.Kill(t)
			b.Restart(t)
			kills = kills[1:]
		}
		if len(bounces) > 0 && progress() >= bounces[0] {
			// A hard client bounce: the restarted copier's InitProducerId fences the old epoch
			// and aborts the transaction the killed process left open.
			t.Logf("progress %.0f%% after %s: SIGKILL every copier", 100*progress(), time.Since(start).Round(time.Millisecond))
			bouncedAt = time.Now()
			atBounce = atBounce[:0]
			for _, c := range copiers {
				c.kill()
				_, _, r := c.state()
				atBounce = append(atBounce, r)
			}
			recovered = make([]time.Duration, len(copiers))
			bounces = bounces[1:]
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			var rem []int64
			for _, c := range copiers {
				_, _, r := c.state()
				rem = append(rem, r)
			}
			t.Logf("after %s: remaining per copier %v", time.Since(start).Round(time.Second), rem)
		}
		for i, c := range recovered {
			if _, _, r := copiers[i].state(); c == 0 && r < atBounce[i] {
				recovered[i] = time.Since(bouncedAt)
			}
		}
		pending := 0
		for _, c := range copiers {
			exited, finished, _ := c.state()
			switch {
			case exited && finished:
			case exited:
				c.mu.Lock()
				t.Logf("copier %s (start #%d) exited before finishing: %v; last stdout %q; stderr tail:\n%s",
					c.id, c.starts, c.exitErr, c.lastOut, e2eTruncate(c.stderr.String(), 1500))
				starts := c.starts
				c.mu.Unlock()
				if starts >= maxStarts {
					return fmt.Errorf("copier %s did not finish in %d starts: %w", c.id, starts, errPollAbort)
				}
				c.start(t)
				pending++
			default:
				pending++
			}
		}
		if pending > 0 || len(kills) > 0 || len(bounces) > 0 || chaosPending {
			return fmt.Errorf("%d copiers still running, progress %.1f%%, %d broker kills and %d copier bounces left, more chaos to come: %v",
				pending, 100*progress(), len(kills), len(bounces), chaosPending)
		}
		return nil
	})
	if err != nil {
		for _, c := range copiers {
			c.mu.Lock()
			t.Logf("copier %s: starts %d, remaining %d, last stdout %q, stderr tail:\n%s", c.id, c.starts, c.remaining, c.lastOut, e2eTruncate(c.stderr.String(), 2000))
			c.mu.Unlock()
		}
		t.Fatalf("copy %s → %s: %v", cfg.in, cfg.out, err)
	}
	// How soon a bounced copier moves again. TransactionalMessageCopier (without --group-mode)
	// reads its position — OffsetFetch with require_stable under read_committed — BEFORE
	// initTransactions. If the kill landed between its TxnOffsetCommit and the end of EndTxn, the
	// partition still has staged offsets of the dead session, the broker answers
	// UNSTABLE_OFFSET_COMMIT (KIP-447; Apache 4.1.1 answers the same), and the fencing
	// InitProducerId is never sent: only the reaper can end that transaction. So the bound is the
	// transaction timeout plus one reaper period plus slack, not "immediately".
	bound := cfg.txnTimeout + e2eTxnReapInterval + 20*time.Second
	for i, d := range recovered {
		if d > bound {
			t.Errorf("copier %s made its first progress %s after the bounce (bound %s): its dead session's "+
				"transaction was neither fenced nor reaped", copiers[i].id, d.Round(time.Millisecond), bound)
		} else {
			t.Logf("copier %s made progress %s after the bounce", copiers[i].id, d.Round(time.Millisecond))
		}
	}
	for _, c := range copiers {
		if c.exitErr != nil {
			t.Errorf("copier %s exited with %v after reporting remaining == 0", c.id, c.exitErr)
		}
		t.Logf("copier %s finished after %d start(s)", c.id, c.starts)
	}
	t.Logf("copy of %d records done in %s", cfg.n, time.Since(start).Round(time.Millisecond))
}

// e2eTxnCheckCopy is the transactions_test.py verdict: under read_committed the output holds
// every seeded value exactly once (ordered: in input order), the group's committed offsets are
// the input end offsets, and nothing is left open (LSO == HWM, no Ongoing transaction).
func e2eTxnCheckCopy(t *testing.T, addr string, seeded map[string]e2ePos, cfg e2eTxnCopyCfg, outParts int32, ordered bool) {
	t.Helper()
	cl := e2eTxnClient(t, addr)
	hwm := e2eTxnWaitStable(t, cl, cfg.out, outParts, 30*time.Second)
	committed := e2eTxnReadAll(t, addr, cfg.out, hwm, e2eTxnReadCommitted, 90*time.Second)
	uncommitted := e2eTxnReadAll(t, addr, cfg.out, hwm, e2eTxnReadUncommitted, 90*time.Second)
	t.Logf("output %s: high watermarks %v; %d records read_committed, %d read_uncommitted (aborted copies included)",
		cfg.out, hwm, len(committed), len(uncommitted))

	count := map[string]int{}
	var dups, unknown int
	for _, r := range committed {
		if _, ok := seeded[r.value]; !ok {
			if unknown < 5 {
				t.Errorf("read_committed: value %q at %d/%d was never seeded", r.value, r.p, r.o)
			}
			unknown++
			continue
		}
		count[r.value]++
		if count[r.value] == 2 {
			if dups < 5 {
				t.Errorf("read_committed: value %s duplicated (again at partition %d offset %d)", r.value, r.p, r.o)
			}
			dups++
		}
	}
	missing := 0
	for v := range seeded {
		if count[v] == 0 {
			if missing < 5 {
				t.Errorf("read_committed: seeded value %s (input %d/%d) missing from the output", v, seeded[v].p, seeded[v].o)
			}
			missing++
		}
	}
	if dups > 0 || missing > 0 || unknown > 0 {
		t.Errorf("output: %d duplicated, %d missing, %d unknown values (of %d seeded)", dups, missing, unknown, len(seeded))
	}
	if len(uncommitted) < len(committed) {
		t.Errorf("read_uncommitted saw %d records, fewer than read_committed's %d", len(uncommitted), len(committed))
	}
	if ordered {
		// Output in offset order (one output partition, or as many as input partitions: the
		// copier writes input partition p to output partition p): each input partition's values
		// must come out in input offset order.
		sort.Slice(committed, func(i, j int) bool {
			if committed[i].p != committed[j].p {
				return committed[i].p < committed[j].p
			}
			return committed[i].o < committed[j].o
		})
		last := map[int]int64{}
		bad := 0
		for _, r := range committed {
			at, ok := seeded[r.value]
			if !ok {
				continue
			}
			if prev, seen := last[at.p]; seen && at.o <= prev && bad < 5 {
				t.Errorf("output offset %d: value %s from input %d/%d after input offset %d (order broken)", r.o, r.value, at.p, at.o, prev)
				bad++
			}
			last[at.p] = at.o
		}
	}

	// Committed offsets of the copy group (TxnOffsetCommit applied with the commit) are the
	// input end offsets.
	inEnds, err := e2eTxnListOffsets(cl, cfg.in, cfg.inParts, e2eTxnReadUncommitted)
	if err != nil {
		t.Fatalf("ListOffsets %s: %v", cfg.in, err)
	}
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, cfg.group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		t.Fatalf("OffsetFetch %s: %v", cfg.group, err)
	}
	for p := int32(0); p < cfg.inParts; p++ {
		o, ok := offs.Lookup(cfg.in, p)
		if !ok || o.At != inEnds[p] {
			t.Errorf("group %s: committed offset of %s-%d is %+v, want the input end offset %d", cfg.group, cfg.in, p, o, inEnds[p])
		}
	}

	// Nothing left open at the coordinator either.
	rows := e2eTxnTable(t, e2eTxnTool(t, addr, "list"))
	listed := 0
	for _, r := range rows {
		if !strings.HasPrefix(r["TransactionalId"], "copier-") || !strings.HasSuffix(r["TransactionalId"], cfg.group) {
			continue
		}
		listed++
		if s := r["TransactionState"]; s != "CompleteCommit" && s != "CompleteAbort" && s != "Empty" {
			t.Errorf("kafka-transactions list: %s is %s after the copy finished", r["TransactionalId"], s)
		}
	}
	if listed != int(cfg.inParts) {
		t.Errorf("kafka-transactions list shows %d of the %d copier transactional ids", listed, cfg.inParts)
	}
}

func e2eTxnCopyCase(t *testing.T, tv int16, inParts, outParts int32, n int, killAt, bounceAt []float64, timeout time.Duration) {
	requireKafkaLib(t)
	b := e2eTxnStartBroker(t, tv)
	addr := b.Addr()
	cfg := e2eTxnCopyCfg{in: e2eName("in"), out: e2eName("out"), group: e2eName("copy-grp"),
		inParts: inParts, n: n, killAt: killAt, bounceAt: bounceAt, timeout: timeout, txnTimeout: 40 * time.Second}
	if len(bounceAt) > 0 {
		// A bounced copier may wait out its dead session's transaction (see e2eTxnCopy): keep
		// that wait short.
		cfg.txnTimeout = 10 * time.Second
	}
	e2eCreateTopic(t, addr, cfg.in, inParts)
	e2eCreateTopic(t, addr, cfg.out, outParts)
	st := newE2EStepTimer(t)
	seeded := e2eTxnSeed(t, addr, cfg.in, n)
	st.done("seed (VerifiableProducer)")
	e2eTxnCopy(t, b, cfg)
	st.done("copy")
	e2eTxnCheckCopy(t, addr, seeded, cfg, outParts, inParts == 1 && outParts == 1)
	st.done("verify")
}

// TestTxnMessageCopier is transactions_test.py without failure injection: TV2 with 2 → 2
// partitions and 100k values, then TV1 with the ordered 1 → 1 variant (33,333 values, as
// kafkatest's check_order case).
func TestTxnMessageCopier(t *testing.T) {
	t.Run("tv2", func(t *testing.T) {
		e2eTxnCopyCase(t, 2, 2, 2, 100_000, nil, nil, 2*time.Minute)
	})
	t.Run("tv1-ordered", func(t *testing.T) {
		e2eTxnCopyCase(t, 1, 1, 1, 33_333, nil, nil, 2*time.Minute)
	})
}

// TestTxnMessageCopierKill9 SIGKILLs the broker at 20/40/60 % of the copy and restarts it on the
// same data dir; copiers that give up are restarted with the same transactional id, and at 50 %
// every copier is SIGKILLed and restarted (kafkatest's hard client bounce).
func TestTxnMessageCopierKill9(t *testing.T) {
	e2eTxnCopyCase(t, 2, 2, 2, 100_000, []float64{0.2, 0.4, 0.6}, []float64{0.5}, 4*time.Minute)
}

// ---------------------------------------------------------------------------------------------
// 4. kafka-transactions.sh

// e2eTxnForgetTransactionalID makes the coordinator lose a transactional id while the broker is
// down — the situation find-hanging exists for (a partition holds an open transaction no
// coordinator will ever finish). kaas: drop the entry from its slot file; Apache Kafka: drop the
// __transaction_state partition that holds it.
func e2eTxnForgetTransactionalID(t *testing.T, b e2eBroker, tid string) {
	t.Helper()
	b.Stop(t)
	switch b := b.(type) {
	case *kaasProc:
		var dataDir string
		for _, a := range b.args {
			if v, ok := strings.CutPrefix(a, "--data.dir="); ok {
				dataDir = v
			}
		}
		path := filepath.Join(dataDir, "__cluster", txn.StateDir, txn.SlotFileName(txn.SlotFor(tid)))
		e2eDropSlotEntry(t, path, tid)
	case *refKafka:
		// Kafka's partitionFor: Utils.abs(String.hashCode) % transaction.state.log.num.partitions.
		var h int32
		for _, r := range tid {
			h = 31*h + int32(r)
		}
		if h == -1<<31 {
			h = 0
		} else if h < 0 {
			h = -h
		}
		dir := filepath.Join(b.dir, "logs", fmt.Sprintf("__transaction_state-%d", h%50))
		if err := os.RemoveAll(dir); err != nil {
			t.Fatalf("cannot remove %s: %v", dir, err)
		}
	default:
		t.Fatalf("unknown broker type %T", b)
	}
	b.Restart(t)
}

// TestTxnToolsFlows drives list, describe, describe-producers, find-hanging and abort against a
// transaction left open by an abandoned producer.
func TestTxnToolsFlows(t *testing.T) {
	requireKafkaLib(t)
	b := startE2EBroker(t)
	addr := b.Addr()
	topic := e2eName("txntools")
	e2eCreateTopic(t, addr, topic, 2)
	st := newE2EStepTimer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	adm := kadm.NewClient(e2eTxnClient(t, addr))
	brokers, err := adm.ListBrokers(ctx)
	if err != nil || len(brokers) != 1 {
		t.Fatalf("ListBrokers: %v %v", brokers, err)
	}
	brokerID := strconv.Itoa(int(brokers[0].NodeID))

	// The abandoned producer: a transaction timeout far above the test's length so that the
	// coordinator's reaper never aborts it; records stamped 10 minutes in the past, because
	// find-hanging measures a transaction's age from the producer's last record timestamp
	// (DescribeProducers LastTimestamp) and its smallest threshold is one minute.
	hungID := e2eName("tools-hung")
	hung := e2eTxnClient(t, addr, kgo.TransactionalID(hungID), kgo.TransactionTimeout(10*time.Minute),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := hung.BeginTransaction(); err != nil {
		t.Fatalf("BeginTransaction: %v", err)
	}
	oldTs := time.Now().Add(-10 * time.Minute).Truncate(time.Millisecond)
	var hungRecs []*kgo.Record
	for i := 0; i < 3; i++ {
		hungRecs = append(hungRecs, &kgo.Record{Partition: 0, Value: []byte(fmt.Sprintf("hung-%d", i)), Timestamp: oldTs})
	}
	if err := hung.ProduceSync(ctx, hungRecs...).FirstErr(); err != nil {
		t.Fatalf("produce in the abandoned transaction: %v", err)
	}
	startOffset := hungRecs[0].Offset
	hungPID := hungRecs[0].ProducerID

	// A well-behaved producer commits after the abandoned one started: its records sit above the
	// LSO, invisible to read_committed readers until the hanging transaction ends.
	okID := e2eName("tools-ok")
	ok := e2eTxnClient(t, addr, kgo.TransactionalID(okID), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	okVals := e2eCommitOnPartition0(t, ctx, ok, "ok-", 5)
	st.done("abandoned + committed producers")

	cl := e2eTxnClient(t, addr)
	var hwm0 int64
	e2eEventually(t, 10*time.Second, "LSO pinned at the abandoned transaction", func() error {
		h, err := e2eTxnListOffsets(cl, topic, 2, e2eTxnReadUncommitted)
		if err != nil {
			return err
		}
		l, err := e2eTxnListOffsets(cl, topic, 2, e2eTxnReadCommitted)
		if err != nil {
			return err
		}
		// 3 hung records, 5 committed ones and their commit marker.
		if l[0] != startOffset || h[0] != startOffset+9 {
			return fmt.Errorf("partition 0: LSO %d HWM %d, want LSO %d HWM %d", l[0], h[0], startOffset, startOffset+9)
		}
		hwm0 = h[0]
		return nil
	})

	// list: both ids, the abandoned one Ongoing.
	rows := e2eTxnTable(t, e2eTxnTool(t, addr, "list"))
	states := map[string]map[string]string{}
	for _, r := range rows {
		states[r["TransactionalId"]] = r
	}
	if r := states[hungID]; r == nil || r["TransactionState"] != "Ongoing" || r["ProducerId"] != strconv.FormatInt(hungPID, 10) {
		t.Errorf("list: %s row %v, want Ongoing with producer id %d", hungID, r, hungPID)
	}
	if r := states[okID]; r == nil || r["TransactionState"] != "CompleteCommit" {
		t.Errorf("list: %s row %v, want CompleteCommit", okID, r)
	}
	st.done("list")

	// describe: the coordinator's view of the abandoned transaction.
	rows = e2eTxnTable(t, e2eTxnTool(t, addr, "describe", "--transactional-id", hungID))
	if len(rows) != 1 {
		t.Fatalf("describe: %d rows", len(rows))
	}
	d := rows[0]
	if d["TransactionState"] != "Ongoing" || d["ProducerId"] != strconv.FormatInt(hungPID, 10) ||
		d["TransactionTimeoutMs"] != "600000" || !strings.Contains(","+d["TopicPartitions"]+",", ","+topic+"-0,") {
		t.Errorf("describe %s: %v, want Ongoing, producer %d, timeout 600000, partitions containing %s-0", hungID, d, hungPID, topic)
	}
	st.done("describe")

	// describe-producers: the partition's view (start offset, last timestamp).
	rows = e2eTxnTable(t, e2eTxnTool(t, addr, "describe-producers", "--topic", topic, "--partition", "0"))
	var sawHung bool
	for _, r := range rows {
		if r["ProducerId"] == strconv.FormatInt(hungPID, 10) {
			sawHung = true
			if r["CurrentTransactionStartOffset"] != strconv.FormatInt(startOffset, 10) || r["LastTimestamp"] != strconv.FormatInt(oldTs.UnixMilli(), 10) {
				t.Errorf("describe-producers: %v, want CurrentTransactionStartOffset %d LastTimestamp %d", r, startOffset, oldTs.UnixMilli())
			}
		} else if !e2eTxnNoOpenTxn(r["CurrentTransactionStartOffset"]) {
			t.Errorf("describe-producers: producer %s has an open transaction: %v", r["ProducerId"], r)
		}
	}
	if !sawHung || len(rows) != 2 {
		t.Errorf("describe-producers: %d rows, abandoned producer %d present: %v", len(rows), hungPID, sawHung)
	}
	st.done("describe-producers")

	// find-hanging: old enough, but the coordinator still tracks it (it will write the markers
	// when the transaction ends or times out), so by Kafka's definition it is not hanging.
	findHanging := func() []map[string]string {
		t.Helper()
		return e2eTxnTable(t, e2eTxnTool(t, addr, "find-hanging", "--broker-id", brokerID, "--max-transaction-timeout", "1"))
	}
	if rows := findHanging(); len(rows) != 0 {
		t.Errorf("find-hanging listed a transaction its coordinator still tracks: %v", rows)
	}
	st.done("find-hanging (tracked)")

	// Now the coordinator forgets it: the partition's transaction hangs for good.
	hung.Close()
	e2eTxnForgetTransactionalID(t, b, hungID)
	st.done("coordinator loses the id")
	rows = findHanging()
	if len(rows) != 1 || rows[0]["Topic"] != topic || rows[0]["Partition"] != "0" ||
		rows[0]["ProducerId"] != strconv.FormatInt(hungPID, 10) || rows[0]["StartOffset"] != strconv.FormatInt(startOffset, 10) {
		t.Fatalf("find-hanging: %v, want the transaction of producer %d at %s-0 offset %d", rows, hungPID, topic, startOffset)
	}
	st.done("find-hanging (hanging)")

	out := e2eTxnTool(t, addr, "abort", "--topic", topic, "--partition", "0", "--start-offset", strconv.FormatInt(startOffset, 10))
	_ = out
	st.done("abort")

	// The abort marker lands at the old HWM; LSO catches up with the new HWM.
	hwm := e2eTxnWaitStable(t, cl, topic, 2, 15*time.Second)
	if hwm[0] != hwm0+1 {
		t.Errorf("partition 0 HWM %d after abort, want %d (one abort marker)", hwm[0], hwm0+1)
	}
	committed := e2eTxnReadAll(t, addr, topic, hwm, e2eTxnReadCommitted, 30*time.Second)
	var got []string
	for _, r := range committed {
		got = append(got, r.value)
	}
	if strings.Join(got, ",") != strings.Join(okVals, ",") {
		t.Errorf("read_committed after abort: %q, want %q", got, okVals)
	}
	uncommitted := e2eTxnReadAll(t, addr, topic, hwm, e2eTxnReadUncommitted, 30*time.Second)
	if len(uncommitted) != 8 {
		t.Errorf("read_uncommitted after abort: %d records, want 8", len(uncommitted))
	}
	if rows := findHanging(); len(rows) != 0 {
		t.Errorf("find-hanging after abort: %v", rows)
	}
	for _, r := range e2eTxnTable(t, e2eTxnTool(t, addr, "describe-producers", "--topic", topic, "--partition", "0")) {
		if !e2eTxnNoOpenTxn(r["CurrentTransactionStartOffset"]) {
			t.Errorf("describe-producers after abort: %v still open", r)
		}
	}
	st.done("verify")
}

// ---------------------------------------------------------------------------------------------
// 5. python3-confluent-kafka

// e2eTxnPy commits nc records, aborts na (delivered before the abort, so they are in the log),
// commits nc more, then reads both partitions with each isolation level. Output lines:
// "<isolation> <partition> <offset> <value>".
const e2eTxnPy = `
import sys, time
from confluent_kafka import Producer, Consumer, TopicPartition, OFFSET_BEGINNING, KafkaError
addr, topic, tid, nc, na = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
errors = []
def report(err, msg):
    if err is not None:
        errors.append(str(err))
p = Producer({"bootstrap.servers": addr, "transactional.id": tid, "transaction.timeout.ms": 60000, "linger.ms": 5})
p.init_transactions(30)
def txn(prefix, n, commit):
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, partition=i % 2, value=("%s-%d" % (prefix, i)).encode(), on_delivery=report)
    if p.flush(30):
        sys.exit("flush timed out")
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)
txn("commit1", nc, True)
txn("abort", na, False)
txn("commit2", nc, True)
if errors:
    sys.exit("delivery errors: %r" % errors[:5])
for iso in ("read_committed", "read_uncommitted"):
    c = Consumer({"bootstrap.servers": addr, "group.id": "e2e-py-txn-unused", "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": iso})
    c.assign([TopicPartition(topic, i, OFFSET_BEGINNING) for i in range(2)])
    eof = set()
    deadline = time.time() + 30
    while len(eof) < 2:
        if time.time() > deadline:
            sys.exit("%s consume timed out; eof on %r" % (iso, sorted(eof)))
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
                continue
            sys.exit("consume error: %s" % m.error())
        print("%s %d %d %s" % (iso, m.partition(), m.offset(), m.value().decode()))
    c.close()
`

// TestTxnPythonConfluent: librdkafka's transactional producer (TV1 protocol: AddPartitionsToTxn,
// EndTxn ≤ v3) and its read_committed / read_uncommitted consumers.
func TestTxnPythonConfluent(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("%s missing (apt-get install python3-confluent-kafka): %v", py, err)
	}
	addr := startE2EBroker(t).Addr()
	topic := e2eName("pytxn")
	e2eCreateTopic(t, addr, topic, 2)
	const nc, na = 200, 100
	out := e2eRunCmd(t, 90*time.Second, "", py, "-c", e2eTxnPy, addr, topic, e2eName("py-txn"), strconv.Itoa(nc), strconv.Itoa(na))
	seen := map[string]map[string]int{"read_committed": {}, "read_uncommitted": {}}
	pos := map[string]map[e2ePos]bool{"read_committed": {}, "read_uncommitted": {}}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || seen[f[0]] == nil {
			t.Fatalf("unexpected output line %q", l)
		}
		p, _ := strconv.Atoi(f[1])
		o, _ := strconv.ParseInt(f[2], 10, 64)
		if pos[f[0]][e2ePos{p, o}] {
			t.Errorf("%s: partition %d offset %d returned twice", f[0], p, o)
		}
		pos[f[0]][e2ePos{p, o}] = true
		seen[f[0]][f[3]]++
	}
	want := func(iso string, prefixes ...string) {
		t.Helper()
		n := 0
		for _, pre := range prefixes {
			c := nc
			if pre == "abort" {
				c = na
			}
			for i := 0; i < c; i++ {
				v := fmt.Sprintf("%s-%d", pre, i)
				if seen[iso][v] != 1 {
					t.Errorf("%s: value %s seen %d times, want once", iso, v, seen[iso][v])
				}
			}
			n += c
		}
		if len(seen[iso]) != n {
			t.Errorf("%s: %d distinct values, want %d", iso, len(seen[iso]), n)
		}
	}
	want("read_committed", "commit1", "commit2")
	want("read_uncommitted", "commit1", "abort", "commit2")
	t.Logf("read_committed %d records, read_uncommitted %d", len(pos["read_committed"]), len(pos["read_uncommitted"]))
}

// e2eTxnNoOpenTxn: describe-producers prints an absent CurrentTransactionStartOffset as "None"
// (Java's OptionalLong), older tools as -1.
func e2eTxnNoOpenTxn(v string) bool { return v == "None" || v == "-1" }

// e2eDropSlotEntry removes transactional id tid from the coordinator slot file at path (the
// broker is stopped): the transaction's partitions keep it open with no coordinator that knows
// it, which is how a hanging transaction is made for kafka-transactions find-hanging / abort.
func e2eDropSlotEntry(t *testing.T, path, tid string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("cannot read coordinator slot file: %v", err)
	}
	var doc map[string]json.RawMessage
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("slot file %s: %v", path, err)
	}
	if err := json.Unmarshal(doc["entries"], &entries); err != nil {
		t.Fatalf("slot file %s entries: %v", path, err)
	}
	if _, ok := entries[tid]; !ok {
		t.Fatalf("slot file %s has no entry %q: %s", path, tid, raw)
	}
	delete(entries, tid)
	doc["entries"], _ = json.Marshal(entries)
	raw, _ = json.Marshal(doc)
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatalf("cannot rewrite %s: %v", path, err)
	}
}

// e2eCommitOnPartition0 commits one transaction of n records prefix0..prefix<n-1> on partition 0
// of cl's default topic and returns their values.
func e2eCommitOnPartition0(t *testing.T, ctx context.Context, cl *kgo.Client, prefix string, n int) []string {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("BeginTransaction: %v", err)
	}
	var vals []string
	for i := 0; i < n; i++ {
		v := fmt.Sprintf("%s%d", prefix, i)
		vals = append(vals, v)
		if err := cl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return vals
}
