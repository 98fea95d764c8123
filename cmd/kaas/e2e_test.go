package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	classTopics       = "org.apache.kafka.tools.TopicCommand"
	classPerfProducer = "org.apache.kafka.tools.ProducerPerformance"
	classConsole      = "org.apache.kafka.tools.consumer.ConsoleConsumer"
	classOffsets      = "org.apache.kafka.tools.GetOffsetShell"
	// kafka-configs is still the Scala kafka.admin.ConfigCommand in 4.1 (it moved to
	// org.apache.kafka.tools later); bump together with bench/java/pom.xml.
	classConfigs = "kafka.admin.ConfigCommand"
)

// perfSummaryRE matches ProducerPerformance's final line, the only one carrying percentiles:
// "1000000 records sent, 42115.9 records/sec (41.13 MB/sec), 499.80 ms avg latency,
// 1557.00 ms max latency, 363 ms 50th, 1273 ms 95th, 1420 ms 99th, 1462 ms 99.9th."
var perfSummaryRE = regexp.MustCompile(`^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ` +
	`([\d.]+) ms avg latency, ([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\.$`)

// TestPerfTestIdempotentAcksAll pushes 1M × 1 KiB records through kafka-producer-perf-test with
// acks=all and idempotence (the Java default since 3.0, set explicitly here), then reads every
// record back with kafka-console-consumer and checks each (partition, offset) exactly once.
func TestPerfTestIdempotentAcksAll(t *testing.T) {
	requireKafkaLib(t)
	n := e2eEnvInt(t, "KAAS_E2E_PERF_RECORDS", 1_000_000)
	const partitions = 6
	addr := e2eBootstrap(t)
	topic := e2eName("perf")
	st := newE2EStepTimer(t)

	javaTool(t, 60*time.Second, classTopics, "--bootstrap-server", addr, "--create", "--topic", topic,
		"--partitions", strconv.Itoa(partitions), "--replication-factor", "1")
	st.done("kafka-topics --create")

	r := javaTool(t, 5*time.Minute, classPerfProducer, "--topic", topic, "--num-records", strconv.Itoa(n),
		"--record-size", "1024", "--throughput", "-1",
		"--producer-props", "bootstrap.servers="+addr, "acks=all", "enable.idempotence=true")
	st.done("producer-perf-test")
	var summary []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if m := perfSummaryRE.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			summary = m
		}
	}
	if summary == nil {
		t.Fatalf("no final summary line in producer-perf-test output:\n%s\nstderr:\n%s", e2eTruncate(r.stdout, 3000), e2eTruncate(r.stderr, 3000))
	}
	t.Logf("producer-perf-test summary (%s): %s", r.dur.Round(time.Millisecond), summary[0])
	if sent, _ := strconv.Atoi(summary[1]); sent != n {
		t.Errorf("producer-perf-test: %d records sent, want %d", sent, n)
	}
	// ProducerPerformance counts only successful sends and prints a stack trace per failed one.
	if bad := e2eErrorLines(r.stdout + r.stderr); len(bad) > 0 {
		t.Errorf("producer-perf-test reported %d error lines, first: %q", len(bad), bad[0])
	}
	if t.Failed() {
		t.FailNow()
	}

	// End offsets via ListOffsets (GetOffsetShell, no group involved). With an idempotent
	// producer and a fresh topic they must add up to exactly n: a duplicate would make it more.
	ends := endOffsetsJava(t, addr, topic)
	st.done("GetOffsetShell")
	if len(ends) != partitions {
		t.Fatalf("GetOffsetShell shows %d partitions, want %d: %v", len(ends), partitions, ends)
	}
	var total int64
	for _, e := range ends {
		total += e
	}
	if total != int64(n) {
		t.Fatalf("end offsets %v add up to %d, want %d", ends, total, n)
	}
	t.Logf("end offsets per partition: %v", ends)

	mode := os.Getenv("KAAS_E2E_CONSUME")
	if mode == "" {
		mode = "both"
	}
	if mode != "both" && mode != "assign" && mode != "group" {
		t.Fatalf("KAAS_E2E_CONSUME=%q: want both, assign or group", mode)
	}
	if mode == "both" || mode == "assign" {
		t.Run("console-consumer-assign", func(t *testing.T) {
			consumeAssigned(t, addr, topic, ends)
		})
	}
	if mode == "both" || mode == "group" {
		t.Run("console-consumer-group", func(t *testing.T) {
			consumeGroup(t, addr, topic, ends, n)
		})
	}
}

// endOffsetsJava returns the latest offset of each partition as Java's GetOffsetShell sees it.
func endOffsetsJava(t *testing.T, addr, topic string) map[int32]int64 {
	t.Helper()
	r := javaTool(t, 60*time.Second, classOffsets, "--bootstrap-server", addr, "--topic", topic, "--time", "-1")
	ends := map[int32]int64{}
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		f := strings.Split(strings.TrimSpace(l), ":")
		if len(f) != 3 || f[0] != topic {
			t.Fatalf("GetOffsetShell: unexpected line %q", l)
		}
		p, err1 := strconv.ParseInt(f[1], 10, 32)
		o, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("GetOffsetShell: unexpected line %q", l)
		}
		ends[int32(p)] = o
	}
	return ends
}

// offsetTally records which (partition, offset) pairs a console consumer printed, from lines
// "Partition:P\tOffset:O" (print.partition/print.offset on, print.value off: 1 GiB of values
// would only slow the pipe down).
type offsetTally struct {
	mu      sync.Mutex
	seen    map[int32][]bool
	count   int64
	dups    int64
	outside int64
	bad     []string
}

func newOffsetTally(ends map[int32]int64) *offsetTally {
	ot := &offsetTally{seen: map[int32][]bool{}}
	for p, e := range ends {
		ot.seen[p] = make([]bool, e)
	}
	return ot
}

// writer returns an io.Writer for one consumer process's stdout; each process needs its own so
// that partial lines from concurrent processes never interleave.
func (ot *offsetTally) writer() io.Writer { return &tallyWriter{ot: ot} }

type tallyWriter struct {
	ot      *offsetTally
	partial []byte
}

func (w *tallyWriter) Write(b []byte) (int, error) {
	n := len(b)
	if len(w.partial) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			w.partial = append(w.partial, b...)
			return n, nil
		}
		w.partial = append(w.partial, b[:i]...)
		w.ot.line(w.partial)
		w.partial = w.partial[:0]
		b = b[i+1:]
	}
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		w.ot.line(b[:i])
		b = b[i+1:]
	}
	w.partial = append(w.partial, b...)
	return n, nil
}

// parseConsoleLine parses "Partition:P\tOffset:O" without regexp: it runs a million times.
func parseConsoleLine(l []byte) (p int32, o int64, ok bool) {
	rest, found := bytes.CutPrefix(l, []byte("Partition:"))
	if !found {
		return 0, 0, false
	}
	ps, offs, found := bytes.Cut(rest, []byte("\tOffset:"))
	if !found {
		return 0, 0, false
	}
	pp, err1 := strconv.ParseInt(string(ps), 10, 32)
	oo, err2 := strconv.ParseInt(string(offs), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return int32(pp), oo, true
}

func (ot *offsetTally) line(l []byte) {
	p, o, ok := parseConsoleLine(l)
	ot.mu.Lock()
	defer ot.mu.Unlock()
	if !ok {
		if len(ot.bad) < 5 {
			ot.bad = append(ot.bad, string(l))
		}
		return
	}
	ot.count++
	s, ok := ot.seen[p]
	if !ok || o >= int64(len(s)) {
		ot.outside++
		return
	}
	if s[o] {
		ot.dups++
	}
	s[o] = true
}

// check asserts every offset below each end offset was printed exactly once.
func (ot *offsetTally) check(t *testing.T, parts []int32) {
	t.Helper()
	ot.mu.Lock()
	defer ot.mu.Unlock()
	if len(ot.bad) > 0 {
		t.Errorf("console consumer printed unexpected lines, first: %q", ot.bad)
	}
	if ot.dups > 0 || ot.outside > 0 {
		t.Errorf("console consumer: %d duplicate (partition, offset) pairs, %d beyond the end offsets", ot.dups, ot.outside)
	}
	for _, p := range parts {
		missing := 0
		first := int64(-1)
		for o, ok := range ot.seen[p] {
			if !ok {
				if first < 0 {
					first = int64(o)
				}
				missing++
			}
		}
		if missing > 0 {
			t.Errorf("partition %d: %d of %d offsets never consumed (first %d)", p, missing, len(ot.seen[p]), first)
		}
	}
}

var processedRE = regexp.MustCompile(`Processed a total of (\d+) messages`)

func consoleProcessed(t *testing.T, stderr string) int64 {
	t.Helper()
	m := processedRE.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("console consumer did not print its total; stderr:\n%s", e2eTruncate(stderr, 3000))
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

var consoleFormat = []string{"--property", "print.value=false", "--property", "print.partition=true", "--property", "print.offset=true"}

// consumeAssigned reads each partition with its own console consumer (--partition N --offset
// earliest → KafkaConsumer.assign + seekToBeginning): needs Metadata, ListOffsets and Fetch
// only, no group coordinator. Two consumers run at a time (2-core CI machines).
func consumeAssigned(t *testing.T, addr, topic string, ends map[int32]int64) {
	start := time.Now()
	ot := newOffsetTally(ends)
	parts := e2eSortedParts(ends)
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for _, p := range parts {
		if ends[p] == 0 {
			continue
		}
		wg.Add(1)
		go func(p int32) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			args := append([]string{"--bootstrap-server", addr, "--topic", topic,
				"--partition", strconv.Itoa(int(p)), "--offset", "earliest",
				"--max-messages", strconv.FormatInt(ends[p], 10), "--timeout-ms", "30000"}, consoleFormat...)
			stderr, dur, err := javaToolStream(3*time.Minute, ot.writer(), classConsole, args...)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, fmt.Sprintf("partition %d: %v\n%s", p, err, e2eTruncate(stderr, 2000)))
				return
			}
			if m := processedRE.FindStringSubmatch(stderr); m == nil || m[1] != strconv.FormatInt(ends[p], 10) {
				failures = append(failures, fmt.Sprintf("partition %d: want %d processed; stderr:\n%s", p, ends[p], e2eTruncate(stderr, 2000)))
			}
			if bad := e2eErrorLines(stderr); len(bad) > 0 {
				failures = append(failures, fmt.Sprintf("partition %d: error output: %q", p, bad[0]))
			}
			t.Logf("partition %d: %d records in %s", p, ends[p], dur.Round(time.Millisecond))
		}(p)
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	ot.check(t, parts)
	t.Logf("assign-mode console consumers read %d records in %s", ot.count, time.Since(start).Round(time.Millisecond))
}

// consumeGroup reads the whole topic with one console consumer in a consumer group
// (FindCoordinator, JoinGroup/SyncGroup, OffsetFetch, Fetch, OffsetCommit on close).
func consumeGroup(t *testing.T, addr, topic string, ends map[int32]int64, n int) {
	ot := newOffsetTally(ends)
	args := append([]string{"--bootstrap-server", addr, "--topic", topic, "--group", e2eName("e2e-console"),
		"--from-beginning", "--max-messages", strconv.Itoa(n), "--timeout-ms", "30000"}, consoleFormat...)
	stderr, dur, err := javaToolStream(4*time.Minute, ot.writer(), classConsole, args...)
	if err != nil {
		t.Fatalf("console consumer (group): %v\n%s", err, e2eTruncate(stderr, 3000))
	}
	if got := consoleProcessed(t, stderr); got != int64(n) {
		t.Errorf("console consumer (group) processed %d, want %d", got, n)
	}
	if bad := e2eErrorLines(stderr); len(bad) > 0 {
		t.Errorf("console consumer (group) error output: %q", bad[0])
	}
	ot.check(t, e2eSortedParts(ends))
	t.Logf("group-mode console consumer read %d records in %s", ot.count, dur.Round(time.Millisecond))
}

func e2eSortedParts(m map[int32]int64) []int32 {
	var ps []int32
	for p := range m {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}

// TestTopicsCLI drives kafka-topics and kafka-configs through a topic's life cycle.
func TestTopicsCLI(t *testing.T) {
	requireKafkaLib(t)
	addr := e2eBootstrap(t)
	topic := e2eName("cli")
	bs := []string{"--bootstrap-server", addr}
	st := newE2EStepTimer(t)
	topics := func(args ...string) toolRun {
		t.Helper()
		return javaTool(t, 60*time.Second, classTopics, append(append([]string{}, bs...), args...)...)
	}
	// describe polls until the expected partition count shows: CreatePartitions is acknowledged
	// before every broker's metadata cache has the new partitions (KRaft propagates it).
	describeUntil := func(want int) {
		t.Helper()
		var last string
		e2eEventually(t, 30*time.Second, fmt.Sprintf("kafka-topics --describe shows %d partitions", want), func() error {
			last = topics("--describe", "--topic", topic).stdout
			if !strings.Contains(last, fmt.Sprintf("PartitionCount: %d\t", want)) {
				return fmt.Errorf("output:\n%s", last)
			}
			for p := 0; p < want; p++ {
				if !strings.Contains(last, fmt.Sprintf("Partition: %d\t", p)) {
					return fmt.Errorf("partition %d missing from:\n%s", p, last)
				}
			}
			return nil
		})
		t.Logf("describe:\n%s", strings.TrimSpace(last))
	}

	out := topics("--create", "--topic", topic, "--partitions", "3", "--replication-factor", "1").stdout
	if !strings.Contains(out, "Created topic "+topic) {
		t.Fatalf("kafka-topics --create: unexpected output %q", out)
	}
	st.done("create")
	describeUntil(3)
	st.done("describe (3)")

	topics("--alter", "--topic", topic, "--partitions", "5")
	st.done("alter --partitions 5")
	describeUntil(5)
	st.done("describe (5)")

	cfg := func(args ...string) toolRun {
		t.Helper()
		return javaTool(t, 60*time.Second, classConfigs, append(append([]string{}, bs...),
			append([]string{"--entity-type", "topics", "--entity-name", topic}, args...)...)...)
	}
	out = cfg("--alter", "--add-config", "retention.ms=3600000").stdout
	if !strings.Contains(out, "Completed updating config") {
		t.Errorf("kafka-configs --alter: unexpected output %q", out)
	}
	st.done("configs --alter")
	e2eEventually(t, 30*time.Second, "kafka-configs --describe shows retention.ms", func() error {
		out = cfg("--describe").stdout
		if !strings.Contains(out, "retention.ms=3600000") {
			return fmt.Errorf("output:\n%s", out)
		}
		return nil
	})
	t.Logf("configs --describe:\n%s", strings.TrimSpace(out))
	st.done("configs --describe")

	if out = topics("--list").stdout; !e2eContainsLine(out, topic) {
		t.Fatalf("kafka-topics --list does not show %s:\n%s", topic, out)
	}
	st.done("list (present)")
	topics("--delete", "--topic", topic)
	st.done("delete")
	// Deletion is asynchronous in Kafka (metadata propagates), so poll the listing.
	e2eEventually(t, 30*time.Second, "kafka-topics --list without "+topic, func() error {
		if out := topics("--list").stdout; e2eContainsLine(out, topic) {
			return fmt.Errorf("still listed:\n%s", out)
		}
		return nil
	})
	st.done("list (gone)")
}

func e2eContainsLine(s, line string) bool {
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

func e2eAdmin(t *testing.T, addr string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatalf("cannot create kgo client: %v", err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// createTopic creates a topic with kadm and waits until its metadata shows every partition
// with a leader.
func e2eCreateTopic(t *testing.T, addr, topic string, partitions int32) {
	t.Helper()
	adm := e2eAdmin(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("cannot create topic %s: %v", topic, err)
	}
	e2eEventually(t, 30*time.Second, "metadata of "+topic, func() error {
		md, err := adm.Metadata(ctx, topic)
		if err != nil {
			return err
		}
		td, ok := md.Topics[topic]
		if !ok || td.Err != nil || len(td.Partitions) != int(partitions) {
			return fmt.Errorf("topic %s not ready: %+v", topic, td)
		}
		for _, p := range td.Partitions {
			if p.Err != nil || p.Leader < 0 {
				return fmt.Errorf("partition %d not ready: %v", p.Partition, p.Err)
			}
		}
		return nil
	})
}

// TestKcatOrPythonRoundTrip round-trips records through the librdkafka-based clients of Debian:
// kcat (librdkafka 2.0.2) and python3-confluent-kafka (with /usr/bin/python3).
func TestKcatOrPythonRoundTrip(t *testing.T) {
	addr := e2eBootstrap(t)

	t.Run("kcat", func(t *testing.T) {
		kcat := e2eLookTool(t, "kcat", "apt-get install kcat")
		topic := e2eName("kcat")
		e2eCreateTopic(t, addr, topic, 1)
		const n = 2000
		var in strings.Builder
		want := make([]string, n)
		for i := range want {
			// Non-ASCII and tabs check that bytes pass through untouched.
			want[i] = fmt.Sprintf("kcat-%05d\tvalüe ✓ %d", i, i*i)
			in.WriteString(want[i] + "\n")
		}
		st := newE2EStepTimer(t)
		e2eRunCmd(t, 60*time.Second, in.String(), kcat, "-b", addr, "-P", "-t", topic,
			"-X", "enable.idempotence=true", "-X", "acks=all")
		st.done("kcat -P")
		out := e2eRunCmd(t, 60*time.Second, "", kcat, "-b", addr, "-C", "-t", topic, "-o", "beginning",
			"-c", strconv.Itoa(n), "-e", "-q", "-f", "%o\t%s\n")
		st.done("kcat -C")
		got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(got) != n {
			t.Fatalf("kcat -C returned %d lines, want %d; tail:\n%s", len(got), n, e2eTruncate(out, 500))
		}
		for i, l := range got {
			if w := fmt.Sprintf("%d\t%s", i, want[i]); l != w {
				t.Fatalf("record %d: got %q, want %q", i, l, w)
			}
		}
	})

	t.Run("python-confluent-kafka", func(t *testing.T) {
		py := "/usr/bin/python3"
		if _, err := os.Stat(py); err != nil {
			t.Fatalf("%s missing (apt-get install python3-confluent-kafka): %v", py, err)
		}
		topic := e2eName("py")
		e2eCreateTopic(t, addr, topic, 3)
		const n = 3000
		st := newE2EStepTimer(t)
		out := e2eRunCmd(t, 90*time.Second, "", py, "-c", pyRoundTrip, addr, topic, strconv.Itoa(n), "3")
		st.done("python produce+consume")
		checkPyRoundTrip(t, out, n)
	})
}

// pyRoundTrip produces n keyed records idempotently with acks=all, printing each delivery
// report, then reads all partitions back with assign() (no group needed) until EOF on each.
// Output lines: "D <partition> <offset> <value>" and "C <partition> <offset> <key> <value>".
const pyRoundTrip = `
import sys
from confluent_kafka import Producer, Consumer, TopicPartition, OFFSET_BEGINNING, KafkaError
addr, topic, n, parts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
errors = []
def report(err, msg):
    if err is not None:
        errors.append(str(err))
    else:
        print("D %d %d %s" % (msg.partition(), msg.offset(), msg.value().decode()))
p = Producer({"bootstrap.servers": addr, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
for i in range(n):
    p.produce(topic, key=("key-%d" % (i % 17)).encode(), value=("py-%06d" % i).encode(), on_delivery=report)
    p.poll(0)
left = p.flush(60)
if left or errors:
    sys.exit("produce failed: %d undelivered, errors %r" % (left, errors[:5]))
# group.id is mandatory for the Consumer class; with assign() and no commits it is never used
# to join a group.
c = Consumer({"bootstrap.servers": addr, "group.id": "e2e-py-unused", "enable.auto.commit": False,
              "enable.partition.eof": True, "auto.offset.reset": "earliest"})
c.assign([TopicPartition(topic, i, OFFSET_BEGINNING) for i in range(parts)])
eof = set()
import time
deadline = time.time() + 30
while len(eof) < parts:
    if time.time() > deadline:
        sys.exit("consume timed out; eof on %r" % sorted(eof))
    m = c.poll(1.0)
    if m is None:
        continue
    if m.error():
        if m.error().code() == KafkaError._PARTITION_EOF:
            eof.add(m.partition())
            continue
        sys.exit("consume error: %s" % m.error())
    print("C %d %d %s %s" % (m.partition(), m.offset(), m.key().decode(), m.value().decode()))
c.close()
`

func checkPyRoundTrip(t *testing.T, out string, n int) {
	t.Helper()
	delivered := map[string]e2ePos{}
	consumed := map[e2ePos]string{}
	consumedVals := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 4 && f[0] == "D":
			p, _ := strconv.Atoi(f[1])
			o, _ := strconv.ParseInt(f[2], 10, 64)
			if _, dup := delivered[f[3]]; dup {
				t.Errorf("value %s delivered twice", f[3])
			}
			delivered[f[3]] = e2ePos{p, o}
		case len(f) == 5 && f[0] == "C":
			p, _ := strconv.Atoi(f[1])
			o, _ := strconv.ParseInt(f[2], 10, 64)
			i, err := strconv.Atoi(strings.TrimPrefix(f[4], "py-"))
			if err != nil || f[3] != fmt.Sprintf("key-%d", i%17) {
				t.Errorf("consumed record with wrong key/value: %q", sc.Text())
			}
			consumed[e2ePos{p, o}] = f[4]
			consumedVals[f[4]]++
		default:
			t.Errorf("unexpected output line %q", sc.Text())
		}
	}
	if len(delivered) != n {
		t.Errorf("%d delivery reports, want %d", len(delivered), n)
	}
	if len(consumedVals) != n || len(consumed) != n {
		t.Errorf("consumed %d distinct values at %d offsets, want %d", len(consumedVals), len(consumed), n)
	}
	for v, c := range consumedVals {
		if c != 1 {
			t.Errorf("value %s consumed %d times", v, c)
		}
	}
	for v, at := range delivered {
		if got := consumed[at]; got != v {
			t.Errorf("delivered %s at partition %d offset %d, consumed %q there", v, at.p, at.o, got)
		}
	}
	// Per partition, offsets follow produce order.
	last := map[int]int{}
	for _, at := range sortedE2EPos(consumed) {
		i, _ := strconv.Atoi(strings.TrimPrefix(consumed[at], "py-"))
		if prev, ok := last[at.p]; ok && i <= prev {
			t.Errorf("partition %d offset %d: value %d after %d (out of produce order)", at.p, at.o, i, prev)
		}
		last[at.p] = i
	}
}

// pv is a (partition, offset) position.
type e2ePos struct {
	p int
	o int64
}

func sortedE2EPos(m map[e2ePos]string) []e2ePos {
	ks := make([]e2ePos, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].p != ks[j].p {
			return ks[i].p < ks[j].p
		}
		return ks[i].o < ks[j].o
	})
	return ks
}

// TestCrashKill9AcksAll SIGKILLs the broker several times under an idempotent acks=all
// producer and then checks that no acknowledged record was lost, moved, reordered or duplicated:
// an ack for acks=all promises the record is durable at that offset (KIP-98 idempotence keeps
// retries across the restarts from writing it twice).
func TestCrashKill9AcksAll(t *testing.T) {
	t.Run("default", e2eCrashKill9AcksAll)
	if e2eBrokerKind() != "kaas" {
		return // log.preallocate is a kaas setting; the reference-broker mode runs the default
	}
	// log.preallocate: flushes are fdatasyncs into a pre-zeroed tail, which recovery must cut.
	t.Run("preallocate", func(t *testing.T) {
		e2eExtraKaasArgs = []string{"--log.preallocate=true"}
		t.Cleanup(func() { e2eExtraKaasArgs = nil })
		e2eCrashKill9AcksAll(t)
	})
	// log.wal.enable=false: acks come from per-partition segment fsyncs instead of the shared
	// write-ahead log (the default runs above use the WAL).
	t.Run("wal-off", func(t *testing.T) {
		e2eExtraKaasArgs = []string{"--log.wal.enable=false"}
		t.Cleanup(func() { e2eExtraKaasArgs = nil })
		e2eCrashKill9AcksAll(t)
	})
}

func e2eCrashKill9AcksAll(t *testing.T) {
	const (
		partitions   = 3
		kills        = 4
		maxRecords   = 600_000
		rate         = 40_000                  // records/s: spreads a fast broker's kills over several seconds
		progressStep = 2_000                   // acks needed after each (re)start before the next kill ...
		killEvery    = 1500 * time.Millisecond // ... and this much producing time
		killPhase    = 60 * time.Second
	)
	b := startE2EBroker(t) // always a managed broker: it gets killed
	topic := e2eName("crash")
	e2eCreateTopic(t, b.Addr(), topic, partitions)

	type ack struct {
		v      int
		p      int32
		offset int64
	}
	var (
		mu       sync.Mutex
		acked    []ack
		ackedN   atomic.Int64
		failedN  atomic.Int64
		firstErr []string
	)
	prod, err := kgo.NewClient(
		kgo.SeedBrokers(b.Addr()),
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), // default, spelled out: the property under test
		kgo.RecordDeliveryTimeout(2*time.Minute),
		kgo.RetryTimeout(2*time.Minute),
		kgo.MaxBufferedRecords(5_000),
		kgo.ProducerLinger(2*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("cannot create producer: %v", err)
	}
	defer prod.Close()

	prodCtx, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	var produced atomic.Int64
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		paceStart := time.Now()
		for i := 0; i < maxRecords && prodCtx.Err() == nil; i++ {
			if i%1000 == 0 { // rate limit (pacing, not waiting for state)
				if ahead := time.Duration(i)*time.Second/rate - time.Since(paceStart); ahead > 0 {
					time.Sleep(ahead)
				}
			}
			r := &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i%61)), Value: []byte(strconv.Itoa(i))}
			v := i
			produced.Add(1)
			prod.Produce(prodCtx, r, func(r *kgo.Record, err error) {
				if err != nil {
					failedN.Add(1)
					mu.Lock()
					if len(firstErr) < 5 {
						firstErr = append(firstErr, fmt.Sprintf("value %d: %v", v, err))
					}
					mu.Unlock()
					return
				}
				mu.Lock()
				acked = append(acked, ack{v, r.Partition, r.Offset})
				mu.Unlock()
				ackedN.Add(1)
			})
		}
	}()

	// waitProgress polls until the producer got progressStep more acks and ran for killEvery
	// since the last (re)start, so every kill lands while records are in flight.
	waitProgress := func(what string) {
		t.Helper()
		from, since := ackedN.Load(), time.Now()
		e2eEventually(t, 45*time.Second, what, func() error {
			if got := ackedN.Load(); got < from+progressStep || time.Since(since) < killEvery {
				return fmt.Errorf("%d acks since %d (failed %d)", got-from, from, failedN.Load())
			}
			return nil
		})
	}

	start := time.Now()
	done := 0
	for k := 1; k <= kills; k++ {
		waitProgress(fmt.Sprintf("producer progress before kill %d", k))
		if k > 3 && time.Since(start) > killPhase {
			break // at least 3 kills; the rest only while within the time budget
		}
		before := ackedN.Load()
		b.Kill(t)
		t.Logf("kill -9 #%d at %s, %d acked so far", k, time.Since(start).Round(time.Millisecond), before)
		b.Restart(t)
		done++
	}
	waitProgress("producer progress after the last restart")
	stopProducing()
	<-prodDone
	flushCtx, cancelFlush := context.WithTimeout(context.Background(), 2*time.Minute)
	// Records buffered when prodCtx was cancelled fail with context.Canceled; Flush waits for
	// everything else.
	if err := prod.Flush(flushCtx); err != nil {
		t.Errorf("flush: %v", err)
	}
	cancelFlush()
	mu.Lock()
	acks := append([]ack(nil), acked...)
	errs := append([]string(nil), firstErr...)
	mu.Unlock()
	t.Logf("%d kills in %s; produced %d, acked %d, failed %d (first errors: %q)",
		done, time.Since(start).Round(time.Millisecond), produced.Load(), len(acks), failedN.Load(), errs)
	if done < 3 {
		t.Fatalf("only %d kills happened, want at least 3", done)
	}

	// Read everything back from offset 0 up to the high watermark.
	adm := e2eAdmin(t, b.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("cannot list end offsets: %v", err)
	}
	hwm := map[int32]int64{}
	offsets := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset of partition %d: %v", o.Partition, o.Err)
		}
		hwm[o.Partition] = o.Offset
		offsets[o.Partition] = kgo.NewOffset().AtStart()
	})
	if len(hwm) != partitions {
		t.Fatalf("end offsets for %d partitions, want %d", len(hwm), partitions)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatalf("cannot create consumer: %v", err)
	}
	defer cons.Close()
	got := map[int32]map[int64]int{}
	next := map[int32]int64{}
	for p := range hwm {
		got[p] = map[int64]int{}
	}
	reached := func() bool {
		for p, h := range hwm {
			if next[p] < h {
				return false
			}
		}
		return true
	}
	for !reached() {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read back timed out: next offsets %v, high watermarks %v", next, hwm)
		}
		fs.EachError(func(topic string, p int32, err error) {
			t.Fatalf("fetch %s/%d: %v", topic, p, err)
		})
		fs.EachRecord(func(r *kgo.Record) {
			v, err := strconv.Atoi(string(r.Value))
			if err != nil {
				t.Fatalf("partition %d offset %d: bad value %q", r.Partition, r.Offset, r.Value)
			}
			if _, dup := got[r.Partition][r.Offset]; dup {
				t.Fatalf("partition %d offset %d returned twice", r.Partition, r.Offset)
			}
			got[r.Partition][r.Offset] = v
			if r.Offset+1 > next[r.Partition] {
				next[r.Partition] = r.Offset + 1
			}
		})
	}

	// Values strictly increase with the offset inside each partition (produce order), and no
	// value appears twice anywhere.
	where := map[int]string{}
	total := 0
	for p, m := range got {
		offs := make([]int64, 0, len(m))
		for o := range m {
			offs = append(offs, o)
		}
		sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
		prev := -1
		for _, o := range offs {
			v := m[o]
			if v <= prev {
				t.Errorf("partition %d offset %d: value %d after %d (reordered or duplicated)", p, o, v, prev)
			}
			prev = v
			if w, dup := where[v]; dup {
				t.Errorf("value %d stored twice: %s and %d/%d", v, w, p, o)
			}
			where[v] = fmt.Sprintf("%d/%d", p, o)
		}
		total += len(m)
	}
	lost := 0
	for _, a := range acks {
		v, ok := got[a.p][a.offset]
		if !ok || v != a.v {
			if lost < 10 {
				t.Errorf("acked value %d at partition %d offset %d: read back %d (present %v)", a.v, a.p, a.offset, v, ok)
			}
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acked records lost or moved", lost, len(acks))
	}
	t.Logf("read back %d records (high watermarks %v); %d acked, %d present without an ack (allowed: ack lost in a crash)",
		total, hwm, len(acks), total-len(acks))
}
