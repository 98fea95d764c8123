package main

// End-to-end tests of the consumer-group coordinator (issue 3) driven by Apache Kafka's own
// tools: kafka-console-consumer with --group, kafka-consumer-groups (ConsumerGroupCommand) and
// kafka-consumer-perf-test (ConsumerPerformance). Both run unchanged against the reference
// broker with KAAS_E2E_BROKER=kafka, which is how the expected outputs below were validated.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	e2eGroupsClassCommand  = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
	e2eGroupsClassConsumer = "org.apache.kafka.tools.ConsumerPerformance"
)

// e2eGroupsCLI runs kafka-consumer-groups against addr. ConsumerGroupCommand prints some errors
// ("Error: Consumer group 'x' does not exist.") and still exits 0, so callers that expect
// success also check e2eGroupsNoError.
func e2eGroupsCLI(t *testing.T, addr string, args ...string) toolRun {
	t.Helper()
	return javaTool(t, 90*time.Second, e2eGroupsClassCommand, append([]string{"--bootstrap-server", addr}, args...)...)
}

func e2eGroupsNoError(t *testing.T, what string, r toolRun) {
	t.Helper()
	for _, s := range []string{r.stdout, r.stderr} {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "Error:") || strings.Contains(l, "Exception") {
				t.Fatalf("%s: unexpected error line %q\nstdout:\n%s\nstderr:\n%s", what, l,
					e2eTruncate(r.stdout, 3000), e2eTruncate(r.stderr, 3000))
			}
		}
	}
}

// e2eGroupsRow is one line of a ConsumerGroupCommand table, keyed by its column header.
type e2eGroupsRow map[string]string

// e2eGroupsTable parses the whitespace-separated table whose header line starts with "GROUP"
// and contains every one of cols (the offsets table of --describe, the --members table, the
// NEW-OFFSET table of --reset-offsets). Header names in these tables hold no spaces, and nor do
// the values, so strings.Fields lines them up. A "-" cell stays "-".
func e2eGroupsTable(t *testing.T, out string, cols ...string) []e2eGroupsRow {
	t.Helper()
	var header []string
	var rows []e2eGroupsRow
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			if header != nil {
				break // end of this table (rows follow the header directly)
			}
			continue
		}
		if header == nil {
			if f[0] == "GROUP" && e2eGroupsHasAll(f, cols) {
				header = f
			}
			continue
		}
		if len(f) != len(header) {
			t.Fatalf("table row %q has %d cells, header %q has %d", l, len(f), strings.Join(header, " "), len(header))
		}
		row := e2eGroupsRow{}
		for i, h := range header {
			row[h] = f[i]
		}
		rows = append(rows, row)
	}
	if header == nil {
		t.Fatalf("no table with columns %v in output:\n%s", cols, e2eTruncate(out, 3000))
	}
	return rows
}

func e2eGroupsHasAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// e2eGroupsOffsets reduces the --describe offsets table to partition → row, checking every row
// names group and topic.
func e2eGroupsOffsets(t *testing.T, out, group, topic string) map[int32]e2eGroupsRow {
	t.Helper()
	rows := e2eGroupsTable(t, out, "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID")
	m := map[int32]e2eGroupsRow{}
	for _, r := range rows {
		if r["GROUP"] != group || r["TOPIC"] != topic {
			t.Fatalf("describe row for %s/%s, want %s/%s: %v", r["GROUP"], r["TOPIC"], group, topic, r)
		}
		p, err := strconv.ParseInt(r["PARTITION"], 10, 32)
		if err != nil {
			t.Fatalf("describe row with partition %q: %v", r["PARTITION"], r)
		}
		m[int32(p)] = r
	}
	return m
}

// e2eGroupsCheckOffsets asserts that the committed offset of every partition is want[p], that
// LOG-END-OFFSET is ends[p] and that LAG is their difference, as the tool computes it.
func e2eGroupsCheckOffsets(t *testing.T, what string, got map[int32]e2eGroupsRow, want, ends map[int32]int64) {
	t.Helper()
	if len(got) != len(ends) {
		t.Fatalf("%s: describe shows %d partitions, want %d: %v", what, len(got), len(ends), got)
	}
	for p, end := range ends {
		r, ok := got[p]
		if !ok {
			t.Fatalf("%s: partition %d missing from describe: %v", what, p, got)
		}
		wantRow := map[string]string{
			"CURRENT-OFFSET": strconv.FormatInt(want[p], 10),
			"LOG-END-OFFSET": strconv.FormatInt(end, 10),
			"LAG":            strconv.FormatInt(end-want[p], 10),
		}
		for col, v := range wantRow {
			if r[col] != v {
				t.Errorf("%s: partition %d %s = %q, want %q (row %v)", what, p, col, r[col], v, r)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// e2eGroupsStateRE matches a --describe --state row: "g1  127.0.0.1:9092  (0)  range  Stable  1".
// COORDINATOR (ID) holds a space, hence a regexp rather than e2eGroupsTable.
var e2eGroupsStateRE = regexp.MustCompile(`^(\S+)\s+(\S+)\s+\((\d+)\)\s+(\S+)\s+(\S+)\s+(\d+)\s*$`)

type e2eGroupsState struct {
	coordinator, strategy, state string
	members                      int
}

func e2eGroupsDescribeState(t *testing.T, addr, group string) e2eGroupsState {
	t.Helper()
	r := e2eGroupsCLI(t, addr, "--describe", "--group", group, "--state")
	e2eGroupsNoError(t, "describe --state", r)
	for _, l := range strings.Split(r.stdout, "\n") {
		if m := e2eGroupsStateRE.FindStringSubmatch(strings.TrimSpace(l)); m != nil && m[1] == group {
			n, _ := strconv.Atoi(m[6])
			return e2eGroupsState{coordinator: m[2], strategy: m[4], state: m[5], members: n}
		}
	}
	t.Fatalf("describe --state: no row for %s in:\n%s", group, e2eTruncate(r.stdout, 3000))
	return e2eGroupsState{}
}

func e2eGroupsListed(t *testing.T, addr string) map[string]bool {
	t.Helper()
	r := e2eGroupsCLI(t, addr, "--list")
	e2eGroupsNoError(t, "--list", r)
	m := map[string]bool{}
	for _, l := range strings.Split(r.stdout, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			m[l] = true
		}
	}
	return m
}

// e2eGroupsConsume runs a console consumer in group that must print exactly n records and exit,
// committing its position on close (enable.auto.commit is on by default and close commits).
func e2eGroupsConsume(t *testing.T, addr, topic, group string, n int) {
	t.Helper()
	r := javaTool(t, 2*time.Minute, classConsole, "--bootstrap-server", addr, "--topic", topic, "--group", group,
		"--from-beginning", "--max-messages", strconv.Itoa(n), "--timeout-ms", "30000")
	if got := consoleProcessed(t, r.stderr); got != int64(n) {
		t.Fatalf("console consumer in %s processed %d records, want %d\nstderr:\n%s", group, got, n, e2eTruncate(r.stderr, 3000))
	}
	if lines := strings.Count(r.stdout, "\n"); lines != n {
		t.Fatalf("console consumer in %s printed %d lines, want %d", group, lines, n)
	}
}

// TestGroupsCLI walks one group through the life kafka-consumer-groups can see: committed by a
// console consumer, described while empty and while a member is active, reset to earliest and
// to latest, consumed again from the reset position, and deleted.
func TestGroupsCLI(t *testing.T) {
	requireKafkaLib(t)
	addr := e2eBootstrap(t)
	topic := e2eName("grp-cli")
	group := e2eName("g1")
	const partitions, perPartition = 3, 40
	st := newE2EStepTimer(t)

	e2eCreateTopic(t, addr, topic, partitions)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatalf("cannot create kgo client: %v", err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := 0; i < partitions*perPartition; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Value: []byte(fmt.Sprintf("v%04d", i))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("cannot produce %d records: %v", len(recs), err)
	}
	ends := map[int32]int64{}
	zeros := map[int32]int64{}
	for p := int32(0); p < partitions; p++ {
		ends[p], zeros[p] = perPartition, 0
	}
	n := partitions * perPartition
	st.done("produce")

	e2eGroupsConsume(t, addr, topic, group, n)
	st.done("console-consumer --group")

	if !e2eGroupsListed(t, addr)[group] {
		t.Fatalf("--list does not show %s after its consumer committed", group)
	}
	st.done("--list")

	// Inactive group: committed offsets equal the end offsets, LAG 0, and no consumer owns a
	// partition, which the tool prints as "-" after "Consumer group 'x' has no active members."
	r := e2eGroupsCLI(t, addr, "--describe", "--group", group)
	e2eGroupsNoError(t, "--describe (inactive)", r)
	offs := e2eGroupsOffsets(t, r.stdout, group, topic)
	e2eGroupsCheckOffsets(t, "describe (inactive)", offs, ends, ends)
	for p, row := range offs {
		if row["CONSUMER-ID"] != "-" {
			t.Errorf("inactive group: partition %d owned by %q", p, row["CONSUMER-ID"])
		}
	}
	if !strings.Contains(r.stdout+r.stderr, "has no active members") {
		t.Errorf("describe of an empty group does not say it has no active members:\n%s", r.stdout+r.stderr)
	}
	if s := e2eGroupsDescribeState(t, addr, group); s.state != "Empty" || s.members != 0 {
		t.Errorf("describe --state of the inactive group: %+v, want Empty with 0 members", s)
	}
	members := e2eGroupsTable(t, e2eGroupsCLI(t, addr, "--describe", "--group", group, "--members").stdout,
		"CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS")
	if len(members) != 0 {
		t.Errorf("describe --members of the inactive group lists %d members: %v", len(members), members)
	}
	st.done("describe (inactive)")

	t.Run("active", func(t *testing.T) { e2eGroupsActive(t, addr, topic, group, partitions, ends) })
	if t.Failed() {
		t.FailNow()
	}

	// --reset-offsets needs the group inactive (the member left on close above).
	reset := func(how string, want map[int32]int64) {
		t.Helper()
		r := e2eGroupsCLI(t, addr, "--reset-offsets", how, "--execute", "--topic", topic, "--group", group)
		e2eGroupsNoError(t, "--reset-offsets "+how, r)
		rows := e2eGroupsTable(t, r.stdout, "TOPIC", "PARTITION", "NEW-OFFSET")
		if len(rows) != partitions {
			t.Fatalf("--reset-offsets %s printed %d rows, want %d:\n%s", how, len(rows), partitions, r.stdout)
		}
		for _, row := range rows {
			p, _ := strconv.ParseInt(row["PARTITION"], 10, 32)
			if row["NEW-OFFSET"] != strconv.FormatInt(want[int32(p)], 10) {
				t.Errorf("--reset-offsets %s: partition %d NEW-OFFSET %s, want %d", how, p, row["NEW-OFFSET"], want[int32(p)])
			}
		}
		d := e2eGroupsCLI(t, addr, "--describe", "--group", group)
		e2eGroupsNoError(t, "--describe after reset "+how, d)
		e2eGroupsCheckOffsets(t, "describe after --reset-offsets "+how, e2eGroupsOffsets(t, d.stdout, group, topic), want, ends)
	}
	reset("--to-earliest", zeros)
	st.done("reset --to-earliest")
	reset("--to-latest", ends)
	st.done("reset --to-latest")

	// A reset is only worth something if consumers honour it: rewind once more and read
	// everything again through the group (--from-beginning only applies without a commit).
	reset("--to-earliest", zeros)
	e2eGroupsConsume(t, addr, topic, group, n)
	d := e2eGroupsCLI(t, addr, "--describe", "--group", group)
	e2eGroupsCheckOffsets(t, "describe after re-consuming", e2eGroupsOffsets(t, d.stdout, group, topic), ends, ends)
	st.done("reset + re-consume")

	r = e2eGroupsCLI(t, addr, "--delete", "--group", group)
	e2eGroupsNoError(t, "--delete", r)
	if want := fmt.Sprintf("Deletion of requested consumer groups ('%s') was successful.", group); !strings.Contains(r.stdout, want) {
		t.Fatalf("--delete output lacks %q:\n%s\nstderr:\n%s", want, r.stdout, e2eTruncate(r.stderr, 2000))
	}
	if e2eGroupsListed(t, addr)[group] {
		t.Fatalf("--list still shows %s after --delete", group)
	}
	// Describing it again: DescribeGroups v0-5 answer an unknown group as Dead without error,
	// which the tool prints as "does not exist" (kaas serves v0-5); v6 (KIP-1043, Kafka 4.x)
	// answers GROUP_ID_NOT_FOUND, which it prints as GroupIdNotFoundException.
	r = e2eGroupsCLI(t, addr, "--describe", "--group", group)
	v5 := fmt.Sprintf("Consumer group '%s' does not exist.", group)
	v6 := fmt.Sprintf("GroupIdNotFoundException: Group %s not found.", group)
	if out := r.stdout + r.stderr; !strings.Contains(out, v5) && !strings.Contains(out, v6) {
		t.Errorf("describe of the deleted group says neither %q nor %q:\nstdout:\n%s\nstderr:\n%s", v5, v6,
			r.stdout, e2eTruncate(r.stderr, 2000))
	}
	st.done("--delete")
}

// e2eGroupsActive runs a console consumer in group in the background (no --max-messages) until
// kafka-consumer-groups sees it own every partition, checks --describe, --members and --state
// and that --reset-offsets is refused while it is there, then stops it with SIGTERM, the way
// Ctrl-C ends it, so that it commits and leaves the group.
func e2eGroupsActive(t *testing.T, addr, topic, group string, partitions int, ends map[int32]int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e2eRepoRoot, "bench", "kafka-tools.sh"), "run", classConsole,
		"--bootstrap-server", addr, "--topic", topic, "--group", group)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start background console consumer: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			// A JVM ended by SIGTERM runs its shutdown hooks (the console consumer's closes the
			// consumer, committing and leaving the group) and then exits 128+15.
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() == 128+int(syscall.SIGTERM) {
				return nil
			}
			return err
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("console consumer did not exit within 30 s of SIGTERM")
		}
	}
	defer func() { _ = stop() }()

	var offs map[int32]e2eGroupsRow
	e2eEventually(t, 60*time.Second, "describe shows the background consumer owning every partition", func() error {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("background consumer exited early (%v): %s: %w", err, e2eTruncate(errOut.String(), 2000), errPollAbort)
		default:
		}
		r := e2eGroupsCLI(t, addr, "--describe", "--group", group)
		if strings.Contains(r.stdout+r.stderr, "has no active members") {
			return fmt.Errorf("no active members yet")
		}
		offs = e2eGroupsOffsets(t, r.stdout, group, topic)
		for p := int32(0); p < int32(partitions); p++ {
			if id := offs[p]["CONSUMER-ID"]; id == "" || id == "-" {
				return fmt.Errorf("partition %d not owned yet: %v", p, offs)
			}
		}
		return nil
	})
	e2eGroupsCheckOffsets(t, "describe (active)", offs, ends, ends)
	member := offs[0]["CONSUMER-ID"]
	for p, row := range offs {
		if row["CONSUMER-ID"] != member || row["CLIENT-ID"] != "console-consumer" || row["HOST"] == "-" {
			t.Errorf("active describe, partition %d: want owner %s with client id console-consumer and a host: %v", p, member, row)
		}
	}

	mr := e2eGroupsCLI(t, addr, "--describe", "--group", group, "--members")
	e2eGroupsNoError(t, "describe --members", mr)
	members := e2eGroupsTable(t, mr.stdout, "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS")
	if len(members) != 1 || members[0]["CONSUMER-ID"] != member || members[0]["#PARTITIONS"] != strconv.Itoa(partitions) {
		t.Errorf("describe --members: %v, want one member %s with %d partitions", members, member, partitions)
	}
	s := e2eGroupsDescribeState(t, addr, group)
	if s.state != "Stable" || s.members != 1 || s.strategy == "-" || s.coordinator == "" {
		t.Errorf("describe --state of the active group: %+v, want Stable, 1 member, a strategy and a coordinator", s)
	}

	// Kafka refuses to move offsets under a live member; the tool reports the group's state.
	rr := e2eGroupsCLI(t, addr, "--reset-offsets", "--to-earliest", "--execute", "--topic", topic, "--group", group)
	if !strings.Contains(rr.stdout+rr.stderr, "can only be reset if the group '"+group+"' is inactive") {
		t.Errorf("--reset-offsets on an active group was not refused:\nstdout:\n%s\nstderr:\n%s", rr.stdout, e2eTruncate(rr.stderr, 2000))
	}

	if err := stop(); err != nil {
		t.Fatalf("background console consumer: %v\nstderr:\n%s", err, e2eTruncate(errOut.String(), 3000))
	}
	// It started at the committed offsets, which were the end offsets: nothing to print.
	if got := consoleProcessed(t, errOut.String()); got != 0 {
		t.Errorf("background consumer processed %d records, want 0 (it must start from the committed end offsets)", got)
	}
	e2eEventually(t, 30*time.Second, "group empty after its member left", func() error {
		if s := e2eGroupsDescribeState(t, addr, group); s.state != "Empty" || s.members != 0 {
			return fmt.Errorf("state %+v", s)
		}
		return nil
	})
}

// TestConsumerPerfTest is kafka-consumer-perf-test reading 1M × 1 KiB records through a consumer
// group (classic protocol): the join, the sync and the fetches all have to work at volume.
func TestConsumerPerfTest(t *testing.T) {
	requireKafkaLib(t)
	n := e2eEnvInt(t, "KAAS_E2E_PERF_RECORDS", 1_000_000)
	const partitions = 6
	addr := e2eBootstrap(t)
	topic := e2eName("cperf")
	group := e2eName("perf-grp")
	st := newE2EStepTimer(t)

	javaTool(t, 60*time.Second, classTopics, "--bootstrap-server", addr, "--create", "--topic", topic,
		"--partitions", strconv.Itoa(partitions), "--replication-factor", "1")
	r := javaTool(t, 5*time.Minute, classPerfProducer, "--topic", topic, "--num-records", strconv.Itoa(n),
		"--record-size", "1024", "--throughput", "-1", "--producer-props", "bootstrap.servers="+addr, "acks=all")
	var summary []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if m := perfSummaryRE.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			summary = m
		}
	}
	if summary == nil || summary[1] != strconv.Itoa(n) {
		t.Fatalf("producer-perf-test did not send %d records:\n%s\nstderr:\n%s", n, e2eTruncate(r.stdout, 2000), e2eTruncate(r.stderr, 2000))
	}
	t.Logf("producer-perf-test: %s", summary[0])
	st.done("producer-perf-test")

	c := javaTool(t, 5*time.Minute, e2eGroupsClassConsumer, "--bootstrap-server", addr, "--topic", topic,
		"--messages", strconv.Itoa(n), "--group", group, "--timeout", "60000")
	st.done("consumer-perf-test")
	res := e2eGroupsPerfCSV(t, c.stdout)
	t.Logf("consumer-perf-test (%s wall): %s MB in %s ms fetch, %s MB/s, %s records/s, rebalance %s ms",
		c.dur.Round(time.Millisecond), res["data.consumed.in.MB"], res["fetch.time.ms"], res["MB.sec"],
		res["nMsg.sec"], res["rebalance.time.ms"])
	if got := res["data.consumed.in.nMsg"]; got != strconv.Itoa(n) {
		t.Fatalf("consumer-perf-test consumed %s records, want %d\nstdout:\n%s\nstderr:\n%s", got, n,
			e2eTruncate(c.stdout, 2000), e2eTruncate(c.stderr, 3000))
	}
	if bad := e2eErrorLines(c.stdout + c.stderr); len(bad) > 0 {
		t.Errorf("consumer-perf-test reported %d error lines, first: %q", len(bad), bad[0])
	}
	// The tool joined the group through the coordinator: a rebalance time was measured and the
	// group is known to the broker afterwards.
	if ms, err := strconv.ParseInt(res["rebalance.time.ms"], 10, 64); err != nil || ms < 0 {
		t.Errorf("rebalance.time.ms = %q, want a non-negative integer", res["rebalance.time.ms"])
	}
	if !e2eGroupsListed(t, addr)[group] {
		t.Errorf("--list does not show %s after consumer-perf-test", group)
	}
}

// e2eGroupsPerfCSV maps ConsumerPerformance's header line ("start.time, end.time,
// data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms,
// fetch.MB.sec, fetch.nMsg.sec") onto its single data line.
func e2eGroupsPerfCSV(t *testing.T, out string) map[string]string {
	t.Helper()
	var header []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimSpace(l), ",")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if header == nil {
			if f[0] == "start.time" {
				header = f
			}
			continue
		}
		if len(f) != len(header) {
			continue
		}
		m := map[string]string{}
		for i, h := range header {
			m[h] = f[i]
		}
		return m
	}
	t.Fatalf("no CSV header + data line in consumer-perf-test output:\n%s", e2eTruncate(out, 3000))
	return nil
}
