package txn

import (
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kaas-go/kaas/codec"
)

// clusterCoord starts a cluster-mode coordinator (broker id, incarnation inc) on dir: it owns
// nothing until LoadSlot. Its log is observed (the load reports what it replayed).
func clusterCoord(t *testing.T, dir string, id int32, inc string, mod func(*Config)) (*testCoord, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	tc, acts := startCoord(t, dir, func(c *Config) {
		c.BrokerID, c.Incarnation, c.Logger = id, inc, zap.New(core)
		if mod != nil {
			mod(c)
		}
	})
	if len(acts) != 0 {
		t.Fatalf("cluster-mode Start re-drove %+v: it must own nothing before LoadSlot", acts)
	}
	return tc, logs
}

func (tc *testCoord) load(t *testing.T, slot int, epoch int32) error {
	t.Helper()
	err, _ := call(t, func(d func(error, error)) { tc.LoadSlot(slot, epoch, func(err error) { d(err, nil) }) })
	return err
}

func (tc *testCoord) release(t *testing.T, slot int) error {
	t.Helper()
	err, _ := call(t, func(d func(error, error)) { tc.ReleaseSlot(slot, func(err error) { d(err, nil) }) })
	return err
}

// lastLoad returns the journalRecordsReplayed and otherEpochRecordsIgnored fields of the last
// "transaction slot loaded" log line.
func lastLoad(t *testing.T, logs *observer.ObservedLogs) (replayed, ignored int64) {
	t.Helper()
	ls := logs.FilterMessage("transaction slot loaded").All()
	if len(ls) == 0 {
		t.Fatal("no slot load logged")
	}
	m := ls[len(ls)-1].ContextMap()
	return m["journalRecordsReplayed"].(int64), m["otherEpochRecordsIgnored"].(int64)
}

func hasFile(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// TestClusterSlotGracefulMove: a slot released at epoch 1 and loaded by another incarnation at
// epoch 2 carries every transaction over from the release checkpoint alone (no journal record is
// replayed: the ones of epoch 1 are all covered), the checkpoints are epoch-named, the superseded
// one is gone, journals carry broker and incarnation, and the old holder answers 16 and lists
// nothing of the slot.
func TestClusterSlotGracefulMove(t *testing.T) {
	dir := t.TempDir()
	a, _ := clusterCoord(t, dir, 1, "a1", nil)
	b, blogs := clusterCoord(t, dir, 2, "b1", nil)
	a.parts.auto()
	b.parts.auto()
	ids := sameSlotIDs("mv-", 2)
	slot := SlotFor(ids[0])
	if _, err := call(t, func(d func(DescribeResult, error)) { a.Describe(ids[0], d) }); ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("before any load: %v", err)
	}
	if err := a.load(t, slot, 1); err != nil {
		t.Fatal(err)
	}
	pid, epoch := a.begin(t, ids[0], "", tps("t", 0)...)
	if r := waitAnswer(t, a.endAsync(ids[0], pid, epoch, true)); r.err != nil || r.res.Code != 0 {
		t.Fatalf("commit: %+v", r)
	}
	a.begin(t, ids[1], "", tps("t", 1)...)
	names := stateFiles(t, dir)
	if !hasFile(names, SlotCheckpointName(slot, 1)) || hasFile(names, SlotFileName(slot)) {
		t.Fatalf("checkpoint of the load at epoch 1 missing or legacy-named: %v", names)
	}
	journals := 0
	for _, n := range names {
		if strings.HasPrefix(n, "journal-") {
			if !strings.HasPrefix(n, "journal-b1-ia1-w0-") && !strings.HasPrefix(n, "journal-b2-ib1-w0-") {
				t.Fatalf("journal name without broker and incarnation: %s", n)
			}
			journals++
		}
	}
	if journals < 2 {
		t.Fatalf("journals: %v", names)
	}

	if err := a.release(t, slot); err != nil {
		t.Fatal(err)
	}
	if err := b.load(t, slot, 2); err != nil {
		t.Fatal(err)
	}
	if replayed, _ := lastLoad(t, blogs); replayed != 0 {
		t.Fatalf("a graceful move replayed %d journal records; the release checkpoint covers them all", replayed)
	}
	if d := b.describe(t, ids[0]); d.State != "CompleteCommit" {
		t.Fatalf("moved committed: %+v", d)
	}
	if d := b.describe(t, ids[1]); d.State != "Ongoing" || len(d.Topics) != 1 {
		t.Fatalf("moved ongoing: %+v", d)
	}
	names = stateFiles(t, dir)
	if !hasFile(names, SlotCheckpointName(slot, 2)) || hasFile(names, SlotCheckpointName(slot, 1)) {
		t.Fatalf("after the move: want only the epoch-2 checkpoint: %v", names)
	}
	// Ownership gating: the old holder answers 16 and lists nothing; the new one lists both.
	if _, err := call(t, func(d func(DescribeResult, error)) { a.Describe(ids[1], d) }); ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("old holder: %v", err)
	}
	list := func(tc *testCoord) []ListedTxn {
		t.Helper()
		ch := make(chan []ListedTxn, 1)
		tc.List(ListFilter{DurationMs: -1}, func(l []ListedTxn, _ []string, err error) {
			if err != nil {
				t.Error(err)
			}
			ch <- l
		})
		return <-ch
	}
	if l := list(a); len(l) != 0 {
		t.Fatalf("old holder lists %+v", l)
	}
	if l := list(b); len(l) != 2 {
		t.Fatalf("new holder lists %+v", l)
	}
	// The reaper of the old holder acts on nothing (its slot is gone); the new one's would.
	a.advance(2 * time.Minute)
	if n, _ := call(t, func(d func(int, error)) { a.ReapNow(func(n int) { d(n, nil) }) }); n != 0 {
		t.Fatalf("old holder's reaper started %d sagas", n)
	}
	// A load at an epoch older than the newest checkpoint is a stale assignment.
	if err := a.load(t, slot, 1); !errors.Is(err, ErrSlotFenced) {
		t.Fatalf("stale load: %v", err)
	}
}

// TestClusterSlotCrashMove: the holder at epoch 1 crashes with one transaction committed, one
// Ongoing and one prepared whose markers are in flight; the load at epoch 2 by another
// incarnation replays its synced records of epoch 1, re-drives the prepared one with coordinator
// epoch 2, and afterwards the crashed incarnation's journals are collected by RemoveDeadJournals
// (not before: until then they hold the only copy).
func TestClusterSlotCrashMove(t *testing.T) {
	dir := t.TempDir()
	a, _ := clusterCoord(t, dir, 1, "a1", nil)
	b, blogs := clusterCoord(t, dir, 2, "b1", nil)
	b.parts.auto()
	ids := sameSlotIDs("cr-", 3)
	slot := SlotFor(ids[0])
	if err := a.load(t, slot, 1); err != nil {
		t.Fatal(err)
	}
	pid0, ep0 := a.begin(t, ids[0], "", tps("t", 0)...)
	ans := a.endAsync(ids[0], pid0, ep0, true)
	a.parts.nextCall(t).answer(codec.CodeNone)
	if r := waitAnswer(t, ans); r.err != nil || r.res.Code != 0 {
		t.Fatalf("commit: %+v", r)
	}
	a.begin(t, ids[1], "", tps("t", 1)...)
	pid2, ep2 := a.begin(t, ids[2], "", tps("t", 2)...)
	held := a.endAsync(ids[2], pid2, ep2, false)
	a.parts.nextCall(t) // PrepareAbort durable, markers in flight: never answered
	noAnswerYet(t, a, held, "with its markers in flight")

	a.crash()
	// Before a successor covers them, only generations without records (the prepared next
	// one) may go: the others hold the only copy of acknowledged state.
	if _, err := RemoveDeadJournals(dir, 1, "a1"); err != nil {
		t.Fatal(err)
	}
	var left int
	for _, n := range stateFiles(t, dir) {
		if strings.HasPrefix(n, "journal-b1-ia1-") {
			left++
		}
	}
	if left == 0 {
		t.Fatal("RemoveDeadJournals deleted a crashed incarnation's records before any load covered them")
	}
	if err := b.load(t, slot, 2); err != nil {
		t.Fatal(err)
	}
	if replayed, _ := lastLoad(t, blogs); replayed == 0 {
		t.Fatal("the crash load replayed nothing")
	}
	if d := b.describe(t, ids[0]); d.State != "CompleteCommit" {
		t.Fatalf("committed after crash: %+v", d)
	}
	if d := b.describe(t, ids[1]); d.State != "Ongoing" {
		t.Fatalf("ongoing after crash: %+v", d)
	}
	waitFor(t, "prepared abort re-driven", func() bool { return b.describe(t, ids[2]).State == "CompleteAbort" })
	for _, m := range b.parts.writtenMarkers() {
		if m.TransactionalID == ids[2] && (m.CoordinatorEpoch != 2 || m.Commit) {
			t.Fatalf("re-driven marker: %+v", m)
		}
	}
	var a1 int
	for _, n := range stateFiles(t, dir) {
		if strings.HasPrefix(n, "journal-b1-ia1-") {
			a1++
		}
	}
	if a1 == 0 {
		t.Fatal("the crashed incarnation left no journal")
	}
	n, err := RemoveDeadJournals(dir, 1, "a1")
	if err != nil || n != a1 {
		t.Fatalf("RemoveDeadJournals removed %d of %d: %v", n, a1, err)
	}
	for _, n := range stateFiles(t, dir) {
		if strings.HasPrefix(n, "journal-b1-ia1-") {
			t.Fatalf("left %s", n)
		}
	}
	if _, err := RemoveDeadJournals(dir, 1, ""); err == nil {
		t.Fatal("RemoveDeadJournals accepted a single-mode (empty) incarnation")
	}
}

// TestClusterSlotZombieIgnored: the holder at epoch 1 keeps running after the slot moved to
// epoch 2 without a release (a zombie past its lease whose Rule P check has not fired); what it
// journals afterwards at epoch 1 is ignored by the load at epoch 3, which continues from the
// epoch-2 holder's records only.
func TestClusterSlotZombieIgnored(t *testing.T) {
	dir := t.TempDir()
	a, _ := clusterCoord(t, dir, 1, "a1", nil)
	b, _ := clusterCoord(t, dir, 2, "b1", nil)
	c, clogs := clusterCoord(t, dir, 3, "c1", nil)
	for _, tc := range []*testCoord{a, b, c} {
		tc.parts.auto()
	}
	ids := sameSlotIDs("zo-", 3)
	slot := SlotFor(ids[0])
	if err := a.load(t, slot, 1); err != nil {
		t.Fatal(err)
	}
	pid, epoch := a.begin(t, ids[0], "", tps("t", 0)...)
	if err := b.load(t, slot, 2); err != nil {
		t.Fatal(err)
	}
	// The zombie goes on at epoch 1: a new producer, and the commit of ids[0].
	a.begin(t, ids[1], "", tps("t", 1)...)
	if r := waitAnswer(t, a.endAsync(ids[0], pid, epoch, true)); r.err != nil || r.res.Code != 0 {
		t.Fatalf("zombie commit: %+v", r)
	}
	// The real holder at epoch 2 aborts ids[0] and starts ids[2], then crashes.
	if r := waitAnswer(t, b.endAsync(ids[0], pid, epoch, false)); r.err != nil || r.res.Code != 0 {
		t.Fatalf("abort at epoch 2: %+v", r)
	}
	b.begin(t, ids[2], "", tps("t", 2)...)
	b.crash()

	if err := c.load(t, slot, 3); err != nil {
		t.Fatal(err)
	}
	replayed, ignored := lastLoad(t, clogs)
	if replayed == 0 || ignored == 0 {
		t.Fatalf("load at epoch 3: replayed %d, ignored %d; want the epoch-2 records replayed and the zombie's ignored", replayed, ignored)
	}
	if d := c.describe(t, ids[0]); d.State != "CompleteAbort" {
		t.Fatalf("ids[0] after the zombie's commit: %+v (want the epoch-2 holder's abort)", d)
	}
	if d := c.describe(t, ids[1]); d.State != "" && d.Code != codec.CodeTransactionalIDNotFound {
		t.Fatalf("the zombie's producer is known: %+v", d)
	}
	if d := c.describe(t, ids[2]); d.State != "Ongoing" {
		t.Fatalf("ids[2]: %+v", d)
	}
}

// TestClusterPublishFalseAnswersNothing: once Publish says no (the lease deadline passed), the
// durable change is not answered: the op gets NOT_COORDINATOR, no marker leaves, and the
// coordinator stays stopped (the latch) even if Publish would say yes again.
func TestClusterPublishFalseAnswersNothing(t *testing.T) {
	dir := t.TempDir()
	var pub atomic.Bool
	pub.Store(true)
	a, _ := clusterCoord(t, dir, 1, "a1", func(c *Config) { c.Publish = pub.Load })
	a.parts.auto()
	ids := sameSlotIDs("pub-", 2)
	slot := SlotFor(ids[0])
	if err := a.load(t, slot, 1); err != nil {
		t.Fatal(err)
	}
	pid, epoch := a.begin(t, ids[0], "", tps("t", 0)...)
	calls := a.parts.calls0()
	pub.Store(false)
	r := waitAnswer(t, a.endAsync(ids[0], pid, epoch, true))
	if ErrorCode(r.err) != codec.CodeNotCoordinator && r.res.Code != codec.CodeNotCoordinator {
		t.Fatalf("EndTxn past the deadline: %+v", r)
	}
	if n := a.parts.calls0(); n != calls {
		t.Fatalf("%d marker writes after the deadline", n-calls)
	}
	pub.Store(true)
	if _, err := call(t, func(d func(InitProducerIDResult, error)) {
		a.InitProducerID(InitProducerIDParams{TransactionalID: ids[1], TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
	}); ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("InitProducerId after the latch: %v", err)
	}
	if _, err := call(t, func(d func(DescribeResult, error)) { a.Describe(ids[0], d) }); ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("Describe after the latch: %v", err)
	}
	if err := a.load(t, SlotFor("other-slot-id"), 1); ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("LoadSlot after the latch: %v", err)
	}
}

// TestClusterLegacySlotFileReadAtItsEpoch: a single-broker slot-N.json is the starting
// checkpoint of a cluster load at its stored coordinatorEpoch (a stale assignment below it is
// refused), and the epoch-named checkpoint replaces it.
func TestClusterLegacySlotFileReadAtItsEpoch(t *testing.T) {
	dir := t.TempDir()
	single, _ := startCoord(t, dir, nil)
	single.parts.auto()
	const tid = "legacy-id"
	slot := SlotFor(tid)
	single.begin(t, tid, "", tps("t", 0)...)
	single.Close() // leaves exactly the slot files, slot-N.json at coordinatorEpoch 1
	ls, err := readSlot(filepath.Join(dir, StateDir), slot)
	if err != nil || !ls.exists || ls.coordinatorEpoch != 1 {
		t.Fatalf("legacy slot file: %+v %v", ls, err)
	}
	ls.coordinatorEpoch = 4
	if err := writeSlotFile(dir, slot, ls); err != nil {
		t.Fatal(err)
	}
	c, _ := clusterCoord(t, dir, 1, "c1", nil)
	if err := c.load(t, slot, 3); !errors.Is(err, ErrSlotFenced) {
		t.Fatalf("load below the legacy file's epoch: %v", err)
	}
	if err := c.load(t, slot, 5); err != nil {
		t.Fatal(err)
	}
	if d := c.describe(t, tid); d.State != "Ongoing" {
		t.Fatalf("legacy entry: %+v", d)
	}
	names := stateFiles(t, dir)
	if !hasFile(names, SlotCheckpointName(slot, 5)) || hasFile(names, SlotFileName(slot)) {
		t.Fatalf("files after the load: %v", names)
	}
}

func TestClusterFileNames(t *testing.T) {
	id := journalID{broker: 3, inc: "7f3a", worker: 2, gen: 9}
	name := journalName(id)
	if name != "journal-b3-i7f3a-w2-00000000000000000009.log" {
		t.Fatalf("cluster journal name %s", name)
	}
	if got, ok := parseJournalName(name); !ok || got != id {
		t.Fatalf("parse %s: %+v %v", name, got, ok)
	}
	for _, bad := range []string{"journal-b3-i-w2-00000000000000000009.log", "journal-b3-i7f-3a-w2-00000000000000000009.log",
		"journal-b3-ix_y-w2-00000000000000000009.log"} {
		if _, ok := parseJournalName(bad); ok {
			t.Errorf("parsed %s", bad)
		}
	}
	if n := SlotCheckpointName(7, 12); n != "slot-7-e12.json" {
		t.Fatalf("checkpoint name %s", n)
	}
	for name, want := range map[string][3]int{"slot-7-e12.json": {7, 12, 0}, "slot-7.json": {7, 0, 1}} {
		s, e, legacy, ok := parseSlotFileName(name)
		if !ok || s != want[0] || int(e) != want[1] || legacy != (want[2] == 1) {
			t.Errorf("parse %s: %d %d %v %v", name, s, e, legacy, ok)
		}
	}
	for _, bad := range []string{"slot-7-e012.json", "slot-50-e1.json", "slot-7-e1.json.tmp", "slot-x.json"} {
		if _, _, _, ok := parseSlotFileName(bad); ok {
			t.Errorf("parsed %s", bad)
		}
	}
	if _, err := New(Config{ClusterDir: t.TempDir(), AllocPID: (&atomicAlloc{}).alloc, Partitions: newFakeParts(), Incarnation: "a-b"}); err == nil {
		t.Fatal("New accepted an incarnation with a separator")
	}
}

// TestClusterReaperAbortNeedsPublish: a timed-out transaction's PrepareAbort that becomes
// durable after the lease deadline starts no abort (no fence, no marker): the successor, which
// may already see the transaction Ongoing, decides.
func TestClusterReaperAbortNeedsPublish(t *testing.T) {
	dir := t.TempDir()
	var pub atomic.Bool
	pub.Store(true)
	a, _ := clusterCoord(t, dir, 1, "a1", func(c *Config) { c.Publish = pub.Load })
	a.parts.auto()
	const tid = "reap-pub"
	if err := a.load(t, SlotFor(tid), 1); err != nil {
		t.Fatal(err)
	}
	r := a.init(t, tid, 1000)
	if res, err := call(t, func(d func(AddPartitionsResult, error)) {
		a.AddPartitions(AddPartitionsParams{TransactionalID: tid, ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch,
			Partitions: tps("t", 0), Version: 3}, d)
	}); err != nil || res.Code != 0 {
		t.Fatalf("add: %+v %v", res, err)
	}
	calls := a.parts.calls0()
	a.advance(time.Minute)
	pub.Store(false)
	if n, _ := call(t, func(d func(int, error)) { a.ReapNow(func(n int) { d(n, nil) }) }); n != 0 {
		t.Fatalf("reaper started %d sagas past the deadline", n)
	}
	a.barrier(t)
	if got := a.parts.calls0(); got != calls {
		t.Fatalf("%d marker writes past the deadline", got-calls)
	}
	for len(a.parts.fences) > 0 {
		if fr := <-a.parts.fences; fr.ProducerID == r.ProducerID && fr.Epoch > r.ProducerEpoch {
			t.Fatalf("fence past the deadline: %+v", fr)
		}
	}
}
