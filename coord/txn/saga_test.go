package txn

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// begin runs InitProducerId and an add of parts (and, if grp is set, the group) for tid.
func (tc *testCoord) begin(t testing.TB, tid string, grp string, parts ...TopicPartitions) (int64, int16) {
	t.Helper()
	r := tc.init(t, tid, 60_000)
	if a, err := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: tid, ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch, Partitions: parts, Version: 3}, d)
	}); err != nil || a.Code != 0 {
		t.Fatalf("add %s: %+v %v", tid, a, err)
	}
	if grp != "" {
		if a, err := call(t, func(d func(AddOffsetsResult, error)) {
			tc.AddOffsets(AddOffsetsParams{TransactionalID: tid, ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch, Group: grp, Version: 3}, d)
		}); err != nil || a.Code != 0 {
			t.Fatalf("add offsets %s: %+v %v", tid, a, err)
		}
	}
	return r.ProducerID, r.ProducerEpoch
}

type endAnswer struct {
	res EndTxnResult
	err error
}

// endAsync submits EndTxn(commit) v3 and returns where its final answer arrives.
func (tc *testCoord) endAsync(tid string, pid int64, epoch int16, commit bool) chan endAnswer {
	ch := make(chan endAnswer, 1)
	tc.EndTxn(EndTxnParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Commit: commit, Version: 3},
		func(res EndTxnResult, err error) { ch <- endAnswer{res, err} })
	return ch
}

func waitAnswer(t testing.TB, ch chan endAnswer) endAnswer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("EndTxn did not answer")
		return endAnswer{}
	}
}

func noAnswerYet(t testing.TB, tc *testCoord, ch chan endAnswer, what string) {
	t.Helper()
	tc.barrier(t)
	select {
	case a := <-ch:
		t.Fatalf("EndTxn answered %s: %+v", what, a)
	default:
	}
}

// TestSagaBatchesAndOrdersCompletion: transactions ending in one worker batch share one Fence
// and one WriteMarkers call (markers grouped per partition); EndTxn answers only after the
// markers, then the groups, then Complete* are durable; the completed transaction keeps its
// start time.
func TestSagaBatchesAndOrdersCompletion(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), nil)
	ids := []string{"b-1", "b-2", "b-3"}
	type prod struct {
		pid   int64
		epoch int16
	}
	prods := map[string]prod{}
	for i, id := range ids {
		grp := ""
		if i == 1 {
			grp = "g"
		}
		pid, epoch := tc.begin(t, id, grp, TopicPartitions{Topic: "x", Partitions: []int32{1, 0}}, TopicPartitions{Topic: "a", Partitions: []int32{int32(i)}})
		prods[id] = prod{pid, epoch}
	}
	tc.barrier(t)
	callsBefore := tc.parts.calls0()
	release := tc.block("b-1")
	var answers []chan endAnswer
	for _, id := range ids {
		answers = append(answers, tc.endAsync(id, prods[id].pid, prods[id].epoch, true))
	}
	release()
	call1 := tc.parts.nextCall(t)
	tc.barrier(t)
	if n := tc.parts.calls0() - callsBefore; len(tc.parts.calls) != 0 || n != 1 {
		t.Fatalf("one batch made %d marker calls", n)
	}
	if len(call1.reqs) != 9 {
		t.Fatalf("%d markers, want 9: %+v", len(call1.reqs), call1.reqs)
	}
	for i := 1; i < len(call1.reqs); i++ {
		a, b := call1.reqs[i-1], call1.reqs[i]
		if a.Topic > b.Topic || (a.Topic == b.Topic && a.Partition > b.Partition) {
			t.Fatalf("markers not grouped per partition: %+v", call1.reqs)
		}
	}
	for _, a := range answers {
		noAnswerYet(t, tc, a, "before its markers were durable")
	}
	call1.answer(codec.CodeNone)
	// b-1 and b-3 complete; b-2 waits for its group.
	for _, i := range []int{0, 2} {
		if a := waitAnswer(t, answers[i]); a.err != nil || a.res.Code != 0 {
			t.Fatalf("%s: %+v", ids[i], a)
		}
	}
	g := tc.parts.nextGroup(t)
	if g.group != "g" || !g.commit || g.pid != prods["b-2"].pid {
		t.Fatalf("group completion: %+v", g)
	}
	noAnswerYet(t, tc, answers[1], "before its group was completed")
	if d := tc.describe(t, "b-2"); d.State != "PrepareCommit" {
		t.Fatalf("Complete* before the group: %+v", d)
	}
	g.done(nil)
	if a := waitAnswer(t, answers[1]); a.err != nil || a.res.Code != 0 {
		t.Fatalf("b-2: %+v", a)
	}
	for _, id := range ids {
		if d := tc.describe(t, id); d.State != "CompleteCommit" || d.StartTimeMs != t0.UnixMilli() {
			t.Fatalf("%s after commit: %+v", id, d)
		}
	}
}

// TestSagaDeletedTopicDropsThatMarkerOnly: UNKNOWN_TOPIC_OR_PARTITION drops that marker; the
// rest of the transaction commits.
func TestSagaDeletedTopicDropsThatMarkerOnly(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), nil)
	pid, epoch := tc.begin(t, "del", "", TopicPartitions{Topic: "gone", Partitions: []int32{0}}, TopicPartitions{Topic: "kept", Partitions: []int32{0}})
	ans := tc.endAsync("del", pid, epoch, true)
	c := tc.parts.nextCall(t)
	res := make([]MarkerResult, len(c.reqs))
	for i, r := range c.reqs {
		if r.Topic == "gone" {
			res[i].Code = codec.CodeUnknownTopicOrPartition
		}
	}
	c.done(res)
	if a := waitAnswer(t, ans); a.err != nil || a.res.Code != 0 {
		t.Fatalf("EndTxn: %+v", a)
	}
	if d := tc.describe(t, "del"); d.State != "CompleteCommit" {
		t.Fatalf("after commit: %+v", d)
	}
}

// TestSagaGroupFailureKeepsPrepared: a group completion error answers 15 and leaves the
// transaction prepared and re-drivable (pending released).
func TestSagaGroupFailureKeepsPrepared(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), nil)
	tc.parts.autoMarkers.Store(true)
	pid, epoch := tc.begin(t, "gf", "grp", TopicPartitions{Topic: "t", Partitions: []int32{0}})
	ans := tc.endAsync("gf", pid, epoch, false)
	tc.parts.nextGroup(t).done(errors.New("offsets log on fire"))
	if a := waitAnswer(t, ans); a.err != nil || a.res.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("EndTxn after a group failure: %+v", a)
	}
	var e *Entry
	tc.Snapshot("gf", func(x *Entry, _ error) { e = x })
	tc.barrier(t)
	if e == nil || e.State != PrepareAbort || e.Pending() {
		t.Fatalf("after a group failure: %+v", e)
	}
	// The retry in the same direction re-drives (51 now) and the transaction completes.
	tc.parts.autoGroups.Store(true)
	if a := waitAnswer(t, tc.endAsync("gf", pid, epoch, false)); a.res.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("retry: %+v", a)
	}
	waitFor(t, "abort completed", func() bool { return tc.describe(t, "gf").State == "CompleteAbort" })
}

// TestReleaseWaitsForSagasAndLoadReplays: a release answers client ops 16 at once, lets the saga
// in flight finish, then checkpoints; a load answers 14 while it runs, takes the epoch it is given
// (never lower than the persisted one) and re-drives what is prepared.
func TestReleaseWaitsForSagasAndLoadReplays(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, nil)
	ids := sameSlotIDs("rel-", 2)
	slot := SlotFor(ids[0])
	pid, epoch := tc.begin(t, ids[0], "", tps("t", 0)...)
	pid2, _ := tc.begin(t, ids[1], "", tps("t", 1)...)
	ans := tc.endAsync(ids[0], pid, epoch, true)
	held := tc.parts.nextCall(t)

	released := make(chan error, 1)
	tc.ReleaseSlot(slot, func(err error) { released <- err })
	tc.barrier(t)
	select {
	case err := <-released:
		t.Fatalf("released with a saga in flight: %v", err)
	default:
	}
	if _, err := call(t, func(d func(DescribeResult, error)) { tc.Describe(ids[1], d) }); ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("op during release: %v", err)
	}
	held.answer(codec.CodeNone)
	if a := waitAnswer(t, ans); a.err != nil || a.res.Code != 0 {
		t.Fatalf("EndTxn across the release: %+v", a)
	}
	select {
	case err := <-released:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("release did not finish")
	}
	if tc.Owns(ids[0]) {
		t.Fatal("Owns after release")
	}
	ls, err := readSlot(filepath.Join(dir, StateDir), slot)
	if err != nil || ls.entries[ids[0]] == nil || ls.entries[ids[0]].State != CompleteCommit || ls.entries[ids[1]].State != Ongoing {
		t.Fatalf("slot file after release: %+v %v", ls, err)
	}
	// Prepare ids[1] on disk behind the coordinator's back, as a crashed owner would leave it.
	ls.entries[ids[1]].State = PrepareAbort
	if err := writeSlotFile(dir, slot, ls); err != nil {
		t.Fatal(err)
	}

	// Load, with the slot file write parked: ops answer 14 meanwhile.
	gate := make(chan struct{})
	slotTmp := SlotFileName(slot) + ".tmp"
	tc.fs.setFail(func(path string) error {
		if strings.HasSuffix(path, slotTmp) {
			<-gate
		}
		return nil
	})
	loaded := make(chan error, 1)
	tc.LoadSlot(slot, 7, func(err error) { loaded <- err })
	waitFor(t, "loading", func() bool {
		_, err := call(t, func(d func(DescribeResult, error)) { tc.Describe(ids[0], d) })
		return ErrorCode(err) == codec.CodeCoordinatorLoadInProgress
	})
	close(gate)
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	tc.fs.setFail(nil)
	if d := tc.describe(t, ids[0]); d.State != "CompleteCommit" {
		t.Fatalf("after load: %+v", d)
	}
	// The prepared one is re-driven with the given epoch.
	c := tc.parts.nextCall(t)
	if len(c.reqs) != 1 || c.reqs[0].TransactionalID != ids[1] || c.reqs[0].CoordinatorEpoch != 7 || c.reqs[0].Commit || c.reqs[0].ProducerID != pid2 {
		t.Fatalf("re-drive after load: %+v", c.reqs)
	}
	c.answer(codec.CodeNone)
	waitFor(t, "re-drive completed", func() bool { return tc.describe(t, ids[1]).State == "CompleteAbort" })

	// A later load with a lower epoch keeps the persisted one.
	if err, _ := call(t, func(d func(error, error)) { tc.ReleaseSlot(slot, func(err error) { d(err, nil) }) }); err != nil {
		t.Fatal(err)
	}
	if err, _ := call(t, func(d func(error, error)) { tc.LoadSlot(slot, 3, func(err error) { d(err, nil) }) }); err != nil {
		t.Fatal(err)
	}
	if ls, _ := readSlot(filepath.Join(dir, StateDir), slot); ls.coordinatorEpoch != 7 {
		t.Fatalf("epoch after a load at a lower epoch: %d", ls.coordinatorEpoch)
	}
}

// writeSlotFile rewrites a slot file from a loaded slot (tests only).
func writeSlotFile(dir string, slot int, ls loadedSlot) error {
	var buf bytes.Buffer
	if err := encodeSlot(&buf, ls.coordinatorEpoch, ls.seq, ls.entries); err != nil {
		return err
	}
	return writeSlotFiles(OSFileSystem{}, filepath.Join(dir, StateDir), []string{SlotFileName(slot)}, [][]byte{buf.Bytes()})[0]
}

// TestReleaseReloadUnderTraffic: producers of one slot run transactions back to back (retrying
// 14 / 16 as a client does) while the slot is released and reloaded over and over; every EndTxn
// that was acknowledged is in the state afterwards (TV2 bumps the epoch once per acknowledged
// EndTxn), in memory and after a restart.
func TestReleaseReloadUnderTraffic(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, func(c *Config) { c.CheckpointInterval = time.Millisecond })
	tc.parts.auto()
	ids := sameSlotIDs("tr-", 6)
	slot := SlotFor(ids[0])
	var stop atomic.Bool
	var seen14, seen16 atomic.Int64
	retry := func(code int16, err error) bool {
		switch c := ErrorCode(err); {
		case err != nil && c == codec.CodeCoordinatorLoadInProgress:
			seen14.Add(1)
			return true
		case err != nil && c == codec.CodeNotCoordinator:
			seen16.Add(1)
			return true
		case err != nil:
			t.Errorf("unexpected error: %v", err)
		}
		return false
	}
	acked := make([]int, len(ids))
	pids := make([]int64, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		r := tc.init(t, id, 60_000)
		pids[i] = r.ProducerID
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid, epoch := r.ProducerID, r.ProducerEpoch
			for !stop.Load() {
				for {
					a, err := call(t, func(d func(AddPartitionsResult, error)) {
						tc.AddPartitions(AddPartitionsParams{TransactionalID: id, ProducerID: pid, ProducerEpoch: epoch, Partitions: tps("t", int32(i)), Version: 5, Implicit: true}, d)
					})
					if retry(a.Code, err) {
						continue
					}
					if a.Code != 0 {
						t.Errorf("add %s: %+v", id, a)
						return
					}
					break
				}
				for {
					e, err := call(t, func(d func(EndTxnResult, error)) {
						tc.EndTxn(EndTxnParams{TransactionalID: id, ProducerID: pid, ProducerEpoch: epoch, Commit: true, Version: 5}, d)
					})
					if retry(e.Code, err) {
						continue
					}
					if e.Code != 0 {
						t.Errorf("end %s: %+v", id, e)
						return
					}
					acked[i]++
					pid, epoch = e.ProducerID, e.ProducerEpoch
					break
				}
			}
		}()
	}
	for round := 0; round < 20; round++ {
		if err, _ := call(t, func(d func(error, error)) { tc.ReleaseSlot(slot, func(err error) { d(err, nil) }) }); err != nil {
			t.Fatal(err)
		}
		if err, _ := call(t, func(d func(error, error)) { tc.LoadSlot(slot, int32(round+2), func(err error) { d(err, nil) }) }); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if seen16.Load() == 0 {
		t.Errorf("no operation met a released slot (16)")
	}
	check := func(stage string, tc *testCoord) {
		for i, id := range ids {
			d := tc.describe(t, id)
			if d.State != "CompleteCommit" || d.ProducerID != pids[i] || int(d.ProducerEpoch) != acked[i] {
				t.Fatalf("%s: %s is %+v after %d acknowledged commits", stage, id, d, acked[i])
			}
		}
	}
	check("in memory", tc)
	t.Logf("acknowledged commits %v; answers 14: %d, 16: %d", acked, seen14.Load(), seen16.Load())
	tc.Close()
	tc2, _ := startCoord(t, dir, nil)
	check("after restart", tc2)
}

// TestTransactionalIDExpiration: Empty / Complete* entries idle for transactional.id.expiration.ms
// are removed by the reaper with a journal delete record: gone from memory, from the slot files
// after the checkpoint, and after a restart; open and recently used ones stay.
func TestTransactionalIDExpiration(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, func(c *Config) { c.IDExpiration = time.Minute })
	tc.parts.auto()
	const n = 200
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("exp-%d", i)
		switch i % 2 {
		case 0: // Empty
			tc.init(t, id, 600_000)
		case 1: // CompleteCommit
			pid, epoch := tc.begin(t, id, "", tps("t", 0)...)
			if a := waitAnswer(t, tc.endAsync(id, pid, epoch, true)); a.res.Code != 0 {
				t.Fatalf("end: %+v", a)
			}
		}
	}
	open := "exp-open"
	r := tc.init(t, open, 600_000)
	if a, err := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: open, ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch, Partitions: tps("t", 1), Version: 3}, d)
	}); err != nil || a.Code != 0 {
		t.Fatalf("add: %+v %v", a, err)
	}
	tc.Close()
	before := slotFilesSize(t, dir)

	tc, _ = startCoord(t, dir, func(c *Config) { c.IDExpiration = time.Minute })
	tc.advance(50 * time.Second)
	recent := "exp-recent"
	tc.init(t, recent, 600_000)
	tc.advance(20 * time.Second)
	if n, _ := call(t, func(d func(int, error)) { tc.ReapNow(func(n int) { d(n, nil) }) }); n != 0 {
		t.Fatalf("expiration started %d sagas", n)
	}
	for i := 0; i < n; i++ {
		if d := tc.describe(t, fmt.Sprintf("exp-%d", i)); d.Code != codec.CodeTransactionalIDNotFound {
			t.Fatalf("exp-%d not expired: %+v", i, d)
		}
	}
	for _, id := range []string{open, recent} {
		if d := tc.describe(t, id); d.Code != 0 {
			t.Fatalf("%s expired: %+v", id, d)
		}
	}
	entries := 0
	tc.barrier(t)
	tc.Close()
	for _, w := range tc.workers {
		for _, ss := range w.slots {
			entries += len(ss.entries)
		}
	}
	if entries != 2 {
		t.Fatalf("%d entries in memory after expiration, want 2", entries)
	}
	if after := slotFilesSize(t, dir); after*4 > before {
		t.Fatalf("slot files %d bytes after expiration, %d before", after, before)
	}
	tc2, _ := startCoord(t, dir, nil)
	if d := tc2.describe(t, "exp-1"); d.Code != codec.CodeTransactionalIDNotFound {
		t.Fatalf("expired id back after restart: %+v", d)
	}
	if d := tc2.describe(t, open); d.State != "Ongoing" {
		t.Fatalf("open id after restart: %+v", d)
	}
}

func slotFilesSize(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, StateDir))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "slot-") && !strings.HasPrefix(e.Name(), "journal-") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(e.Name(), "journal-") {
			t.Fatalf("journal %s left by a clean close", e.Name())
		}
		n += fi.Size()
	}
	return n
}

// TestTransactionalIDTooLong: Apache caps transactional.id at Short.MAX_VALUE bytes; longer ids
// are INVALID_REQUEST on every coordinator path and never reach the state.
func TestTransactionalIDTooLong(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), nil)
	long := strings.Repeat("x", MaxTransactionalIDLen+1)
	r, err := call(t, func(d func(InitProducerIDResult, error)) {
		tc.InitProducerID(InitProducerIDParams{TransactionalID: long, TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
	})
	if err != nil || r.Code != codec.CodeInvalidRequest {
		t.Fatalf("InitProducerId: %+v %v", r, err)
	}
	if a, _ := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: long, Partitions: tps("t", 0), Version: 3}, d)
	}); a.Code != codec.CodeInvalidRequest {
		t.Fatalf("AddPartitions: %+v", a)
	}
	if a, _ := call(t, func(d func(AddOffsetsResult, error)) {
		tc.AddOffsets(AddOffsetsParams{TransactionalID: long, Group: "g", Version: 3}, d)
	}); a.Code != codec.CodeInvalidRequest {
		t.Fatalf("AddOffsets: %+v", a)
	}
	if e, _ := call(t, func(d func(EndTxnResult, error)) {
		tc.EndTxn(EndTxnParams{TransactionalID: long, Commit: true, Version: 5}, d)
	}); e.Code != codec.CodeInvalidRequest {
		t.Fatalf("EndTxn: %+v", e)
	}
	for _, v := range []int16{3, 5} {
		if c, _ := call(t, func(d func(int16, error)) {
			tc.TxnOffsetCommitCheck(TxnOffsetCommitParams{TransactionalID: long, Group: "g", Version: v}, func(c int16) { d(c, nil) })
		}); c != codec.CodeInvalidRequest {
			t.Fatalf("TxnOffsetCommit v%d: %d", v, c)
		}
	}
	if d := tc.describe(t, long); d.Code != codec.CodeTransactionalIDNotFound {
		t.Fatalf("a too long id reached the state: %+v", d)
	}
	// The longest legal id works.
	tc.init(t, strings.Repeat("y", MaxTransactionalIDLen), 1000)
}

// A worker queue at its bound refuses client operations with ErrBusy (answered 15, counted)
// instead of growing without limit; once there is room they are served again.
func TestWorkerQueueBound(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), nil)
	prev := MaxWorkerQueue
	MaxWorkerQueue = 0 // every client op finds the queue "full"
	t.Cleanup(func() { MaxWorkerQueue = prev })
	before := workerQueueRejected.Get()
	_, err := call(t, func(d func(InitProducerIDResult, error)) {
		tc.InitProducerID(InitProducerIDParams{TransactionalID: "busy", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
	})
	if !errors.Is(err, ErrBusy) || ErrorCode(err) != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("full queue: err %v (code %d), want ErrBusy / 15", err, ErrorCode(err))
	}
	if got := workerQueueRejected.Get(); got != before+1 {
		t.Fatalf("rejections counted %d, want %d", got, before+1)
	}
	MaxWorkerQueue = prev
	tc.init(t, "busy", 1000)
}
