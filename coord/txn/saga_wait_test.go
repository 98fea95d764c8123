package txn

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// assertConcurrent checks that every operation that could start the producer's next transaction
// (or fence it) answers CONCURRENT_TRANSACTIONS while tid's prepared transaction is in flight, so
// nothing overtakes its markers.
func assertConcurrent(t *testing.T, tc *testCoord, tid string, pid int64, epoch int16) {
	t.Helper()
	if r, err := call(t, func(d func(EndTxnResult, error)) {
		tc.EndTxn(EndTxnParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Commit: true, Version: 3}, d)
	}); err != nil || r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("retried EndTxn while the markers are in flight: %+v %v, want 51", r, err)
	}
	if r, err := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Partitions: tps("t", 5), Version: 3}, d)
	}); err != nil || r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("AddPartitionsToTxn while the markers are in flight: %+v %v, want 51", r, err)
	}
	if r, err := call(t, func(d func(AddOffsetsResult, error)) {
		tc.AddOffsets(AddOffsetsParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Group: "g", Version: 3}, d)
	}); err != nil || r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("AddOffsetsToTxn while the markers are in flight: %+v %v, want 51", r, err)
	}
	if r, err := call(t, func(d func(VerifyResult, error)) {
		tc.Verify(VerifyParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Partitions: tps("t", 0), Abortable: true}, d)
	}); err != nil || r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("KIP-890 verification while the markers are in flight: %+v %v, want 51", r, err)
	}
	if r, err := call(t, func(d func(InitProducerIDResult, error)) {
		tc.InitProducerID(InitProducerIDParams{TransactionalID: tid, TimeoutMs: 60_000, ProducerID: pid, ProducerEpoch: epoch, Version: 4}, d)
	}); err != nil || r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("InitProducerId while the markers are in flight: %+v %v, want 51", r, err)
	}
}

// TestEndTxnAnswers15AfterMarkerWaitAndSagaGoesOn: markers still not done after
// EndTxnMarkerWait: EndTxn answers COORDINATOR_NOT_AVAILABLE once, the markers stay in flight,
// every operation that could start or fence the next transaction answers 51 meanwhile, and once
// the markers land Complete* is written, the first waiter hears nothing more, and a retried
// EndTxn answers NONE.
func TestEndTxnAnswers15AfterMarkerWaitAndSagaGoesOn(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), func(c *Config) { c.EndTxnMarkerWait = 50 * time.Millisecond })
	pid, epoch := tc.begin(t, "w", "", tps("t", 0, 1)...)
	expired := mEndTxnWaitExpired.Get()
	ans := tc.endAsync("w", pid, epoch, true)
	held := tc.parts.nextCall(t)
	if a := waitAnswer(t, ans); a.err != nil || a.res.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("EndTxn with its markers held past the wait: %+v, want 15", a)
	}
	if n := mEndTxnWaitExpired.Get() - expired; n != 1 {
		t.Fatalf("wait expirations counted: %d, want 1", n)
	}
	if d := tc.describe(t, "w"); d.State != "PrepareCommit" {
		t.Fatalf("after EndTxn answered 15: %+v, want PrepareCommit", d)
	}
	assertConcurrent(t, tc, "w", pid, epoch)
	tc.barrier(t)
	if len(tc.parts.calls) != 0 {
		t.Fatal("the markers were handed out again while the first dispatch is in flight")
	}

	held.answer(codec.CodeNone)
	waitFor(t, "Complete* after the markers landed", func() bool { return tc.describe(t, "w").State == "CompleteCommit" })
	tc.barrier(t)
	select {
	case a := <-ans:
		t.Fatalf("EndTxn waiter answered a second time: %+v", a)
	default:
	}
	if r, err := call(t, func(d func(EndTxnResult, error)) {
		tc.EndTxn(EndTxnParams{TransactionalID: "w", ProducerID: pid, ProducerEpoch: epoch, Commit: true, Version: 3}, d)
	}); err != nil || r.Code != codec.CodeNone {
		t.Fatalf("retried EndTxn after Complete*: %+v %v, want NONE", r, err)
	}
	// The next transaction starts normally.
	if r, err := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: "w", ProducerID: pid, ProducerEpoch: epoch, Partitions: tps("t", 0), Version: 3}, d)
	}); err != nil || r.Code != codec.CodeNone {
		t.Fatalf("next transaction: %+v %v", r, err)
	}
}

// TestEndTxnWaitTimerStoppedOnCompletion: an EndTxn whose saga completes before the wait gets
// NONE once and its timer never fires (only the later, stuck one is counted).
func TestEndTxnWaitTimerStoppedOnCompletion(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), func(c *Config) { c.EndTxnMarkerWait = 100 * time.Millisecond })
	expired := mEndTxnWaitExpired.Get()
	pid, epoch := tc.begin(t, "fast", "", tps("t", 0)...)
	ans := tc.endAsync("fast", pid, epoch, true)
	tc.parts.nextCall(t).answer(codec.CodeNone)
	if a := waitAnswer(t, ans); a.err != nil || a.res.Code != codec.CodeNone {
		t.Fatalf("EndTxn completing in time: %+v", a)
	}
	// A second, stuck transaction started after the first: its timer is due after the first's.
	pid2, epoch2 := tc.begin(t, "slow", "", tps("t", 1)...)
	ans2 := tc.endAsync("slow", pid2, epoch2, true)
	held := tc.parts.nextCall(t)
	if a := waitAnswer(t, ans2); a.res.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("stuck EndTxn: %+v, want 15", a)
	}
	if n := mEndTxnWaitExpired.Get() - expired; n != 1 {
		t.Fatalf("wait expirations: %d, want 1 (the completed EndTxn's timer fired too)", n)
	}
	select {
	case a := <-ans:
		t.Fatalf("completed EndTxn answered again: %+v", a)
	default:
	}
	held.answer(codec.CodeNone)
}

// TestStaleSlotUnloadedOn52: in cluster mode a TRANSACTION_COORDINATOR_FENCED answer to a marker
// makes the slot stale: it is unloaded without waiting for its other saga in flight, its ops
// answer NOT_COORDINATOR, the reaper and that saga's completion do nothing with it, a load at the
// stale epoch is refused, the release the agent then asks for succeeds, and a load at a newer
// epoch serves it again from the checkpoint and re-drives the prepared transactions with their
// prepare sequence.
func TestStaleSlotUnloadedOn52(t *testing.T) {
	dir := t.TempDir()
	tc, _ := clusterCoord(t, dir, 1, "a", func(c *Config) { c.EndTxnMarkerWait = time.Minute })
	ids := sameSlotIDs("stale-", 2)
	slot := SlotFor(ids[0])
	if err := tc.load(t, slot, 3); err != nil {
		t.Fatal(err)
	}
	pid0, e0 := tc.begin(t, ids[0], "", tps("t", 0)...)
	pid1, e1 := tc.begin(t, ids[1], "", tps("t", 1)...)
	ans0 := tc.endAsync(ids[0], pid0, e0, true)
	held0 := tc.parts.nextCall(t)
	ans1 := tc.endAsync(ids[1], pid1, e1, true)
	held1 := tc.parts.nextCall(t)
	seq1 := held1.reqs[0].PrepareSeq
	if seq1 == 0 || held0.reqs[0].PrepareSeq == 0 || seq1 == held0.reqs[0].PrepareSeq {
		t.Fatalf("prepare sequences %d and %d: want distinct and set", held0.reqs[0].PrepareSeq, seq1)
	}
	stale := mStaleSlots.Get()
	held1.answer(codec.CodeTransactionCoordinatorFenced)
	if a := waitAnswer(t, ans1); a.res.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("EndTxn whose marker got 52: %+v, want 15", a)
	}
	waitFor(t, "the slot unloaded", func() bool { return !tc.Owns(ids[0]) && tc.status[slot].Load() == int32(slotUnloaded) })
	if n := mStaleSlots.Get() - stale; n != 1 {
		t.Fatalf("stale slots counted: %d", n)
	}
	if _, err := call(t, func(d func(DescribeResult, error)) { tc.Describe(ids[0], d) }); ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("op on the stale slot: %v, want NOT_COORDINATOR", err)
	}
	if n, _ := call(t, func(d func(int, error)) { tc.ReapNow(func(n int) { d(n, nil) }) }); n != 0 {
		t.Fatalf("reaper started %d sagas on the stale slot", n)
	}
	// The other saga's markers land late: nothing is completed from the stale holder.
	held0.answer(codec.CodeNone)
	if a := waitAnswer(t, ans0); a.res.Code == codec.CodeNone {
		t.Fatalf("EndTxn of the stale slot completed: %+v", a)
	}
	tc.barrier(t)
	if len(tc.parts.calls) != 0 {
		t.Fatal("markers dispatched from the stale slot")
	}
	if err := tc.load(t, slot, 3); !errors.Is(err, ErrSlotFenced) {
		t.Fatalf("reload at the stale epoch: %v, want ErrSlotFenced", err)
	}
	if err := tc.release(t, slot); err != nil {
		t.Fatalf("release of the stale slot: %v", err)
	}
	ls, err := readSlotPath(filepath.Join(dir, StateDir, SlotCheckpointName(slot, 3)), slot)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if e := ls.entries[id]; e == nil || e.State != PrepareCommit || e.PrepareSeq == 0 {
			t.Fatalf("checkpoint of the stale slot, %s: %+v", id, e)
		}
	}

	// Assigned here again at a newer epoch: served, both prepared transactions re-driven.
	if err := tc.load(t, slot, 5); err != nil {
		t.Fatal(err)
	}
	got := map[string]MarkerRequest{}
	for len(got) < 2 {
		for _, r := range tc.parts.nextCall(t).reqs {
			got[r.TransactionalID] = r
		}
	}
	if r := got[ids[1]]; r.CoordinatorEpoch != 5 || r.PrepareSeq != seq1 {
		t.Fatalf("re-driven marker after the reload: %+v, want coordinator epoch 5 and prepare seq %d", r, seq1)
	}
}

// TestSingleBroker52KeepsSlot: a single broker never unloads a slot on 52; the saga just fails
// and the entry stays prepared and served.
func TestSingleBroker52KeepsSlot(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), nil)
	pid, epoch := tc.begin(t, "single", "", tps("t", 0)...)
	ans := tc.endAsync("single", pid, epoch, true)
	tc.parts.nextCall(t).answer(codec.CodeTransactionCoordinatorFenced)
	if a := waitAnswer(t, ans); a.res.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("EndTxn: %+v", a)
	}
	if d := tc.describe(t, "single"); d.State != "PrepareCommit" || !tc.Owns("single") {
		t.Fatalf("after 52 on a single broker: %+v, owned %v", d, tc.Owns("single"))
	}
}

// TestPrepareSeqSurvivesRestart: a prepared entry's PrepareSeq comes back identical from the
// journal (crash: replay derives it from the record's seq) and from the slot file (clean close),
// and the next prepare of the same producer gets a larger one.
func TestPrepareSeqSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, nil)
	pid, epoch := tc.begin(t, "ps", "", tps("t", 0)...)
	tc.endAsync("ps", pid, epoch, true)
	seq := tc.parts.nextCall(t).reqs[0].PrepareSeq
	if seq == 0 {
		t.Fatal("no prepare seq on the marker")
	}
	tc.crash()
	tc, acts := startCoord(t, dir, nil)
	if len(acts) != 1 || len(tc.held) != 1 || tc.held[0].reqs[0].PrepareSeq != seq {
		t.Fatalf("re-drive after a crash (journal replay): %+v, want prepare seq %d", tc.held, seq)
	}
	tc.Close()
	tc, _ = startCoord(t, dir, nil)
	if len(tc.held) != 1 || tc.held[0].reqs[0].PrepareSeq != seq {
		t.Fatalf("re-drive after a clean close (slot file): %+v, want prepare seq %d", tc.held, seq)
	}
	tc.held[0].answer(codec.CodeNone)
	waitFor(t, "completed", func() bool { return tc.describe(t, "ps").State == "CompleteCommit" })
	if _, err := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: "ps", ProducerID: pid, ProducerEpoch: epoch, Partitions: tps("t", 0), Version: 3}, d)
	}); err != nil {
		t.Fatal(err)
	}
	tc.endAsync("ps", pid, epoch, false)
	if next := tc.parts.nextCall(t).reqs[0].PrepareSeq; next <= seq {
		t.Fatalf("next prepare seq %d, want above %d", next, seq)
	}
}

// TestStaleSlotCheckpointFailureKeepsItUnserved: if the stale slot's checkpoint cannot be
// written, the slot is still never served again; the agent's release fails (and is retried by
// the agent) until the checkpoint can be written, and then unloads it.
func TestStaleSlotCheckpointFailureKeepsItUnserved(t *testing.T) {
	dir := t.TempDir()
	tc, _ := clusterCoord(t, dir, 1, "a", nil)
	slot := SlotFor("stale-ck")
	if err := tc.load(t, slot, 3); err != nil {
		t.Fatal(err)
	}
	pid, epoch := tc.begin(t, "stale-ck", "", tps("t", 0)...)
	ckpt := SlotCheckpointName(slot, 3)
	tc.fs.setFail(func(path string) error {
		if filepath.Base(path) == ckpt+".tmp" || filepath.Base(path) == ckpt {
			return errors.New("injected slot file write failure")
		}
		return nil
	})
	ans := tc.endAsync("stale-ck", pid, epoch, true)
	tc.parts.nextCall(t).answer(codec.CodeTransactionCoordinatorFenced)
	if a := waitAnswer(t, ans); a.res.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("EndTxn: %+v", a)
	}
	waitFor(t, "the slot stops being served", func() bool { return !tc.Owns("stale-ck") })
	tc.barrier(t)
	if st := slotStatus(tc.status[slot].Load()); st != slotReleasing {
		t.Fatalf("stale slot with a failed checkpoint: status %d, want releasing", st)
	}
	if _, err := call(t, func(d func(DescribeResult, error)) { tc.Describe("stale-ck", d) }); ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("op on the stale slot: %v", err)
	}
	if err := tc.release(t, slot); err == nil {
		t.Fatal("release succeeded although the checkpoint cannot be written")
	}
	if tc.Owns("stale-ck") || slotStatus(tc.status[slot].Load()) != slotReleasing {
		t.Fatal("stale slot served again after a failed release")
	}
	tc.fs.setFail(nil)
	if err := tc.release(t, slot); err != nil {
		t.Fatalf("release once the checkpoint can be written: %v", err)
	}
	if st := slotStatus(tc.status[slot].Load()); st != slotUnloaded {
		t.Fatalf("status after the release: %d, want unloaded", st)
	}
	ls, err := readSlotPath(filepath.Join(dir, StateDir, ckpt), slot)
	if err != nil || ls.entries["stale-ck"] == nil || ls.entries["stale-ck"].State != PrepareCommit {
		t.Fatalf("checkpoint after the release: %+v %v", ls, err)
	}
}

// TestEndTxnV5AnswersAfterWaitThenRetrySucceeds: under TV2 the retry carries the epoch the
// client sent (the prepare bumped the stored one): 51 while the markers are pending, then NONE
// with the producer's next epoch once Complete* is durable.
func TestEndTxnV5AnswersAfterWaitThenRetrySucceeds(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), func(c *Config) { c.EndTxnMarkerWait = 50 * time.Millisecond })
	pid, epoch := tc.begin(t, "v5w", "", tps("t", 0)...)
	end := EndTxnParams{TransactionalID: "v5w", ProducerID: pid, ProducerEpoch: epoch, Commit: true, Version: 5}
	ans := make(chan endAnswer, 2)
	tc.EndTxn(end, func(res EndTxnResult, err error) { ans <- endAnswer{res, err} })
	held := tc.parts.nextCall(t)
	if a := waitAnswer(t, ans); a.err != nil || a.res.Code != codec.CodeCoordinatorNotAvailable || a.res.ProducerEpoch != NoProducerEpoch {
		t.Fatalf("EndTxn v5 past the wait: %+v, want 15 without a next epoch", a)
	}
	if r, err := call(t, func(d func(EndTxnResult, error)) { tc.EndTxn(end, d) }); err != nil || r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("retry while pending: %+v %v, want 51", r, err)
	}
	held.answer(codec.CodeNone)
	waitFor(t, "Complete*", func() bool { return tc.describe(t, "v5w").State == "CompleteCommit" })
	r, err := call(t, func(d func(EndTxnResult, error)) { tc.EndTxn(end, d) })
	if err != nil || r.Code != codec.CodeNone || r.ProducerID != pid || r.ProducerEpoch != epoch+1 {
		t.Fatalf("retry after Complete*: %+v %v, want NONE with epoch %d", r, err, epoch+1)
	}
	tc.barrier(t)
	if len(ans) != 0 {
		t.Fatalf("first waiter answered twice: %+v", <-ans)
	}
}

// TestEndTxnWaitAfterCloseAnswersNothing: a waiter whose markers are still out when the
// coordinator closes is not answered by its timer afterwards (the server it would answer
// through is gone too).
func TestEndTxnWaitAfterCloseAnswersNothing(t *testing.T) {
	const wait = 30 * time.Millisecond
	tc, _ := startCoord(t, t.TempDir(), func(c *Config) { c.EndTxnMarkerWait = wait })
	pid, epoch := tc.begin(t, "closed", "", tps("t", 0)...)
	ans := tc.endAsync("closed", pid, epoch, true)
	tc.parts.nextCall(t) // held: never answered
	tc.Close()
	// Well past the wait: the timer has fired by now.
	<-time.After(10 * wait)
	select {
	case a := <-ans:
		t.Fatalf("EndTxn answered after Close: %+v", a)
	default:
	}
}
