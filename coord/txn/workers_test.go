package txn

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kaas-go/kaas/codec"
)

// ---------------------------------------------------------------------------------------------
// helpers

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// call runs an async coordinator method synchronously.
func call[R any](t testing.TB, f func(done func(R, error))) (R, error) {
	t.Helper()
	type out struct {
		r   R
		err error
	}
	ch := make(chan out, 1)
	f(func(r R, err error) { ch <- out{r, err} })
	select {
	case o := <-ch:
		return o.r, o.err
	case <-time.After(5 * time.Second):
		t.Fatalf("operation did not complete")
		panic("unreachable")
	}
}

type atomicAlloc struct{ n atomic.Int64 }

func (a *atomicAlloc) alloc() (int64, error) { return a.n.Add(1) + 1000, nil }

// countingFS wraps the OS file system, counts writes per slot file, records the maximum number
// of concurrent writers of any one file, counts journal appends and syncs, and can inject
// failures into slot writes, journal operations, renames and removes.
type countingFS struct {
	OSFileSystem
	mu          sync.Mutex
	writes      map[string]int
	inflight    map[string]int
	maxInflight int
	failWrite   func(path string) error
	// failJournal is asked before every write, datasync and sync on a journal generation that
	// is in use (after its creation fsync); op is "write", "datasync" or "sync".
	failJournal func(op string) error
	failRemove  func(path string) error
	onRename    func(from, to string)
	jwrites     int
	jsyncs      int
}

func (f *countingFS) CreateJournal(path string) (JournalFile, error) {
	jf, err := f.OSFileSystem.CreateJournal(path)
	if err != nil {
		return nil, err
	}
	return &countingJournal{JournalFile: jf, fs: f}, nil
}

func (f *countingFS) Remove(path string) error {
	f.mu.Lock()
	fail := f.failRemove
	f.mu.Unlock()
	if fail != nil {
		if err := fail(path); err != nil {
			return err
		}
	}
	return f.OSFileSystem.Remove(path)
}

func (f *countingFS) Rename(from, to string) error {
	err := f.OSFileSystem.Rename(from, to)
	f.mu.Lock()
	hook := f.onRename
	f.mu.Unlock()
	if err == nil && hook != nil {
		hook(from, to)
	}
	return err
}

func (f *countingFS) setFailJournal(fn func(op string) error) {
	f.mu.Lock()
	f.failJournal = fn
	f.mu.Unlock()
}

// journalSyncs is the number of successful journal batch syncs so far.
func (f *countingFS) journalSyncs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.jsyncs
}

type countingJournal struct {
	JournalFile
	fs    *countingFS
	inUse bool // the creation fsync happened: later writes are batches or repairs
}

func (j *countingJournal) hook(op string) error {
	if !j.inUse {
		return nil
	}
	j.fs.mu.Lock()
	fail := j.fs.failJournal
	j.fs.mu.Unlock()
	if fail != nil {
		return fail(op)
	}
	return nil
}

func (j *countingJournal) WriteAt(b []byte, off int64) (int, error) {
	if err := j.hook("write"); err != nil {
		return 0, err
	}
	n, err := j.JournalFile.WriteAt(b, off)
	if err == nil && j.inUse {
		j.fs.mu.Lock()
		j.fs.jwrites++
		j.fs.mu.Unlock()
	}
	return n, err
}

func (j *countingJournal) Datasync() error {
	if err := j.hook("datasync"); err != nil {
		return err
	}
	err := j.JournalFile.Datasync()
	if err == nil {
		j.fs.mu.Lock()
		j.fs.jsyncs++
		j.fs.mu.Unlock()
	}
	return err
}

func (j *countingJournal) Sync() error {
	if err := j.hook("sync"); err != nil {
		return err
	}
	err := j.JournalFile.Sync()
	j.inUse = true
	return err
}

func newCountingFS() *countingFS {
	return &countingFS{writes: map[string]int{}, inflight: map[string]int{}}
}

func (f *countingFS) WriteTemp(path string, data []byte) error {
	f.mu.Lock()
	f.inflight[path]++
	if f.inflight[path] > f.maxInflight {
		f.maxInflight = f.inflight[path]
	}
	fail := f.failWrite
	f.mu.Unlock()
	var err error
	if fail != nil {
		err = fail(path)
	}
	if err == nil {
		err = f.OSFileSystem.WriteTemp(path, data)
	}
	f.mu.Lock()
	f.inflight[path]--
	if err == nil {
		f.writes[path]++
	}
	f.mu.Unlock()
	return err
}

func (f *countingFS) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.writes {
		n += w
	}
	return n
}

func (f *countingFS) setFail(fn func(string) error) {
	f.mu.Lock()
	f.failWrite = fn
	f.mu.Unlock()
}

type testCoord struct {
	*Coordinator
	fs    *countingFS
	dir   string
	parts *fakeParts
	held  []*markerCall // marker writes taken by heldActions, not answered yet
	clock *atomic.Int64 // unix ms
}

// startCoord starts a coordinator on dir with fake partitions and groups (holding every marker
// write and group completion until the test answers it) and returns the re-drives the start
// dispatched, reassembled from their marker writes.
func startCoord(t testing.TB, dir string, mod func(*Config)) (*testCoord, []Action) {
	t.Helper()
	tc := &testCoord{fs: newCountingFS(), dir: dir, parts: newFakeParts(), clock: &atomic.Int64{}}
	tc.clock.Store(t0.UnixMilli())
	alloc := &atomicAlloc{}
	cfg := Config{
		ClusterDir: dir, AllocPID: alloc.alloc, FS: tc.fs,
		Now:            func() time.Time { return time.UnixMilli(tc.clock.Load()) },
		ReaperInterval: time.Hour,
		Partitions:     tc.parts,
		Groups:         tc.parts,
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	tc.Coordinator = c
	t.Cleanup(c.Close)
	tc.barrier(t)
	return tc, tc.heldActions()
}

func (tc *testCoord) advance(d time.Duration) { tc.clock.Add(d.Milliseconds()) }

func (tc *testCoord) init(t testing.TB, tid string, timeoutMs int32) InitProducerIDResult {
	t.Helper()
	r, err := call(t, func(d func(InitProducerIDResult, error)) {
		tc.InitProducerID(InitProducerIDParams{TransactionalID: tid, TimeoutMs: timeoutMs, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
	})
	if err != nil || r.Code != 0 {
		t.Fatalf("init %s: %+v %v", tid, r, err)
	}
	return r
}

func (tc *testCoord) describe(t testing.TB, tid string) DescribeResult {
	t.Helper()
	d, err := call(t, func(done func(DescribeResult, error)) { tc.Describe(tid, done) })
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// block parks tid's worker until the returned func is called, so the next submissions land in
// one batch.
func (tc *testCoord) block(tid string) (release func()) {
	entered, gate := make(chan struct{}), make(chan struct{})
	tc.submit(tid, func(e *Entry, _ time.Time) (*Entry, any) {
		close(entered)
		<-gate
		return e, nil
	}, nil)
	<-entered
	return func() { close(gate) }
}

// sameSlotIDs returns n transactional ids that all hash to one slot.
func sameSlotIDs(prefix string, n int) []string {
	var ids []string
	slot := SlotFor(prefix + "0")
	for i := 0; len(ids) < n; i++ {
		if id := fmt.Sprintf("%s%d", prefix, i); SlotFor(id) == slot {
			ids = append(ids, id)
		}
	}
	return ids
}

// ---------------------------------------------------------------------------------------------
// store

func TestFNV1a32(t *testing.T) {
	for s, want := range map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968} {
		if got := fnv1a32(s); got != want {
			t.Errorf("fnv1a32(%q) = %#x, want %#x", s, got, want)
		}
	}
	if SlotFor("foobar") != int(uint32(0xbf9cf968)%50) {
		t.Fatalf("SlotFor")
	}
}

func TestSlotFileRoundTripAndEpochBump(t *testing.T) {
	dir := t.TempDir()
	tc, acts := startCoord(t, dir, nil)
	if len(acts) != 0 {
		t.Fatalf("fresh dir returned actions: %+v", acts)
	}
	r := tc.init(t, "rt", 30_000)
	add, err := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: "rt", ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch, Version: 3,
			Partitions: []TopicPartitions{{Topic: "b", Partitions: []int32{2, 1}}, {Topic: "a", Partitions: []int32{0}}}}, d)
	})
	if err != nil || add.Code != 0 {
		t.Fatal(add, err)
	}
	if _, err := call(t, func(d func(AddOffsetsResult, error)) {
		tc.AddOffsets(AddOffsetsParams{TransactionalID: "rt", ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch, Group: "grp", Version: 3}, d)
	}); err != nil {
		t.Fatal(err)
	}
	tc.Close()

	path := filepath.Join(dir, StateDir, SlotFileName(SlotFor("rt")))
	ls, err := readSlot(filepath.Join(dir, StateDir), SlotFor("rt"))
	if err != nil {
		t.Fatal(err)
	}
	e := ls.entries["rt"]
	if ls.coordinatorEpoch != 1 || e == nil || e.State != Ongoing || e.ProducerID != r.ProducerID || e.TimeoutMs != 30_000 ||
		!slices.Equal(e.Partitions["b"], []int32{1, 2}) || !slices.Equal(e.Groups, []string{"grp"}) || e.CoordinatorEpoch != 1 ||
		e.TxnStartMs != t0.UnixMilli() {
		t.Fatalf("persisted slot: epoch %d entry %+v", ls.coordinatorEpoch, e)
	}
	raw, _ := os.ReadFile(path)
	for _, field := range []string{`"version":1`, `"coordinatorEpoch":1`, `"state":"Ongoing"`, `"transactionalId":"rt"`} {
		if !strings.Contains(string(raw), field) {
			t.Fatalf("slot file lacks %s: %s", field, raw)
		}
	}

	tc2, _ := startCoord(t, dir, nil)
	d := tc2.describe(t, "rt")
	if d.State != "Ongoing" || d.ProducerID != r.ProducerID || len(d.Topics) != 2 {
		t.Fatalf("reloaded: %+v", d)
	}
	tc2.Close()
	ls2, _ := readSlot(filepath.Join(dir, StateDir), SlotFor("rt"))
	if ls2.coordinatorEpoch != 2 || ls2.entries["rt"].CoordinatorEpoch != 2 {
		t.Fatalf("coordinator epoch not bumped and persisted on load: %d", ls2.coordinatorEpoch)
	}
}

func TestSlotFileCorruption(t *testing.T) {
	write := func(t *testing.T, slot int, body string) string {
		dir := t.TempDir()
		sd := filepath.Join(dir, StateDir)
		if err := os.MkdirAll(sd, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(sd, SlotFileName(slot))
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	tryStart := func(dir string) error {
		c, err := New(Config{ClusterDir: dir, AllocPID: (&atomicAlloc{}).alloc, Partitions: newFakeParts()})
		if err != nil {
			return err
		}
		err = c.Start()
		c.Close()
		return err
	}
	good := func(tid string) string {
		return fmt.Sprintf(`{"version":1,"coordinatorEpoch":4,"entries":{%q:{"transactionalId":%q,"producerId":5,"producerEpoch":0,"lastProducerId":-1,"lastProducerEpoch":-1,"nextProducerId":-1,"state":"Empty","timeoutMs":1000,"txnStartMs":0,"lastUpdateMs":1,"txnVersion":1,"coordinatorEpoch":4}}}`, tid, tid)
	}
	other := "x"
	for SlotFor(other) == SlotFor("tx") {
		other += "x"
	}
	cases := []struct {
		name, body, want string
		slot             int
	}{
		{"garbage", "\x00not json", "cannot parse", 7},
		{"truncated", `{"version":1,"coordinatorEpoch":1,"entries":{`, "cannot parse", 7},
		{"unknown version", `{"version":2,"coordinatorEpoch":1,"entries":{}}`, "unsupported version 2", 7},
		{"missing version", `{"coordinatorEpoch":1,"entries":{}}`, "unsupported version missing", 7},
		{"unknown state", strings.Replace(good("tx"), `"Empty"`, `"Limbo"`, 1), "unknown transaction state", SlotFor("tx")},
		{"wrong slot", good(other), "belongs to slot", SlotFor("tx")},
		{"key mismatch", strings.Replace(good("tx"), `"transactionalId":"tx"`, `"transactionalId":"ty"`, 1), "holds transactionalId", SlotFor("tx")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := write(t, c.slot, c.body)
			err := tryStart(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), SlotFileName(c.slot)) {
				t.Fatalf("err = %v, want %q naming %s", err, c.want, SlotFileName(c.slot))
			}
		})
	}
	t.Run("tmp leftovers ignored", func(t *testing.T) {
		dir := write(t, SlotFor("tx"), good("tx"))
		if err := os.WriteFile(filepath.Join(dir, StateDir, SlotFileName(SlotFor("tx"))+".tmp"), []byte("garbage"), 0o644); err != nil {
			t.Fatal(err)
		}
		tc, _ := startCoord(t, dir, nil)
		if d := tc.describe(t, "tx"); d.State != "Empty" || d.ProducerID != 5 {
			t.Fatalf("entry beside tmp leftover: %+v", d)
		}
		tc.Close()
		ls, err := readSlot(filepath.Join(dir, StateDir), SlotFor("tx"))
		if err != nil || ls.coordinatorEpoch != 5 {
			t.Fatalf("epoch after load: %v %d", err, ls.coordinatorEpoch)
		}
	})
}

// ---------------------------------------------------------------------------------------------
// worker pool

// TestSingleWriterAndGroupCommit drives many producers through full transactions concurrently
// (under -race), with checkpoints running all the time, and checks that no slot file ever had
// two writers at once and that batches coalesced (fewer journal syncs than state-changing
// operations).
func TestSingleWriterAndGroupCommit(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), func(c *Config) {
		c.Workers = 5
		c.CheckpointBytes = 2 << 10
		c.CheckpointInterval = time.Millisecond
	})
	tc.parts.auto()
	const producers, cycles = 64, 8
	var ops atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for i := 0; i < producers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tid := fmt.Sprintf("p-%d", i)
			r, err := call(t, func(d func(InitProducerIDResult, error)) {
				tc.InitProducerID(InitProducerIDParams{TransactionalID: tid, TimeoutMs: 60_000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
			})
			if err != nil || r.Code != 0 {
				errs <- fmt.Errorf("init %s: %+v %v", tid, r, err)
				return
			}
			ops.Add(1)
			pid, epoch := r.ProducerID, r.ProducerEpoch
			for c := 0; c < cycles; c++ {
				a, err := call(t, func(d func(AddPartitionsResult, error)) {
					tc.AddPartitions(AddPartitionsParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Partitions: tps("t", int32(c%3)), Version: 5, Implicit: true}, d)
				})
				if err != nil || a.Code != 0 {
					errs <- fmt.Errorf("add %s: %+v %v", tid, a, err)
					return
				}
				// The whole saga: prepare, markers (the fake answers at once), complete.
				e, err := call(t, func(d func(EndTxnResult, error)) {
					tc.EndTxn(EndTxnParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Commit: true, Version: 5}, d)
				})
				if err != nil || e.Code != 0 || !e.Action.IsZero() {
					errs <- fmt.Errorf("end %s: %+v %v", tid, e, err)
					return
				}
				if d := tc.describe(t, tid); d.State != "CompleteCommit" {
					errs <- fmt.Errorf("after end %s: %+v", tid, d)
					return
				}
				pid, epoch = e.ProducerID, e.ProducerEpoch
				ops.Add(3)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	syncs := tc.fs.journalSyncs()
	waitFor(t, "a checkpoint", func() bool { return tc.fs.total() > 0 })
	tc.fs.mu.Lock()
	maxInflight := tc.fs.maxInflight
	tc.fs.mu.Unlock()
	if maxInflight != 1 {
		t.Fatalf("a slot file had %d concurrent writers", maxInflight)
	}
	if int64(syncs) >= ops.Load() {
		t.Fatalf("no group commit: %d journal syncs for %d state changes", syncs, ops.Load())
	}
	t.Logf("%d state changes, %d journal syncs, %d checkpoint slot writes", ops.Load(), syncs, tc.fs.total())
	for i := 0; i < producers; i++ {
		if d := tc.describe(t, fmt.Sprintf("p-%d", i)); d.State != "CompleteCommit" || d.ProducerEpoch != cycles {
			t.Fatalf("p-%d: %+v", i, d)
		}
	}
}

// TestBatchIsOneJournalSync checks the group commit deterministically: ops queued while the
// worker is busy form one batch; later ops see earlier ops' effects; the batch is one journal
// write and one sync whatever the number of changes; callbacks run only after the sync; no slot
// file is written on the way.
func TestBatchIsOneJournalSync(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), func(c *Config) { c.Workers = 1 })
	ids := sameSlotIDs("same-", 10)
	pids := map[string]int64{}
	for _, id := range ids {
		pids[id] = tc.init(t, id, 60_000).ProducerID
	}
	before, slotWrites := tc.fs.journalSyncs(), tc.fs.total()
	tc.fs.mu.Lock()
	writesBefore := tc.fs.jwrites
	tc.fs.mu.Unlock()
	release := tc.block(ids[0])
	var wg sync.WaitGroup
	var got sync.Map
	for _, id := range ids {
		wg.Add(2)
		tc.AddPartitions(AddPartitionsParams{TransactionalID: id, ProducerID: pids[id], ProducerEpoch: 0, Partitions: tps("t", 1), Version: 3},
			func(r AddPartitionsResult, err error) {
				defer wg.Done()
				if err != nil || r.Code != 0 {
					t.Errorf("add %s: %+v %v", id, r, err)
				}
			})
		// Queued behind the add in the same batch: sees the partition.
		tc.Verify(VerifyParams{TransactionalID: id, ProducerID: pids[id], ProducerEpoch: 0, Partitions: tps("t", 1)},
			func(r VerifyResult, err error) {
				defer wg.Done()
				got.Store(id, r)
				if tc.fs.journalSyncs() == before {
					t.Errorf("callback before the journal sync")
				}
			})
	}
	release()
	wg.Wait()
	tc.fs.mu.Lock()
	writes := tc.fs.jwrites - writesBefore
	tc.fs.mu.Unlock()
	if n := tc.fs.journalSyncs() - before; n != 1 || writes != 1 {
		t.Fatalf("%d journal syncs and %d writes for one batch of %d changes, want 1 and 1", n, writes, len(ids))
	}
	if tc.fs.total() != slotWrites {
		t.Fatalf("slot files written on the commit path")
	}
	for _, id := range ids {
		r, _ := got.Load(id)
		if vr := r.(VerifyResult); vr.Code != 0 || vr.Results[0].Code != 0 {
			t.Fatalf("verify %s after add in same batch: %+v", id, vr)
		}
	}
}

// TestWriteFailureRollsBack: a failed journal write or sync fails every op of the batch (on every
// slot) with an error that maps to COORDINATOR_NOT_AVAILABLE, rolls the in-memory state back to
// what is durable, and later batches work again. A failed repair keeps failing batches.
func TestWriteFailureRollsBack(t *testing.T) {
	for _, failOp := range []string{"write", "datasync"} {
		t.Run(failOp, func(t *testing.T) {
			dir := t.TempDir()
			tc, _ := startCoord(t, dir, func(c *Config) { c.Workers = 1 })
			ids := sameSlotIDs("rb-", 2)
			a, b := ids[0], ids[1]
			pa, pb := tc.init(t, a, 60_000).ProducerID, tc.init(t, b, 60_000).ProducerID
			if _, err := call(t, func(d func(AddPartitionsResult, error)) {
				tc.AddPartitions(AddPartitionsParams{TransactionalID: a, ProducerID: pa, ProducerEpoch: 0, Partitions: tps("t", 0), Version: 3}, d)
			}); err != nil {
				t.Fatal(err)
			}
			otherSlot := "o"
			for SlotFor(otherSlot) == SlotFor(a) {
				otherSlot += "o"
			}
			po := tc.init(t, otherSlot, 60_000).ProducerID

			injected := errors.New("disk on fire")
			var failRepair atomic.Bool
			tc.fs.setFailJournal(func(op string) error {
				if op == failOp || (failRepair.Load() && op == "sync") {
					return injected
				}
				return nil
			})
			failRepair.Store(true)
			batch := func() (addErr, verErr, endErr, otherErr error) {
				release := tc.block(a)
				var wg sync.WaitGroup
				wg.Add(4)
				tc.AddPartitions(AddPartitionsParams{TransactionalID: a, ProducerID: pa, ProducerEpoch: 0, Partitions: tps("t", 9), Version: 3},
					func(_ AddPartitionsResult, err error) { addErr = err; wg.Done() })
				tc.Verify(VerifyParams{TransactionalID: a, ProducerID: pa, ProducerEpoch: 0, Partitions: tps("t", 9)},
					func(_ VerifyResult, err error) { verErr = err; wg.Done() })
				tc.EndTxn(EndTxnParams{TransactionalID: b, ProducerID: pb, ProducerEpoch: 0, Commit: false, Version: 5},
					func(_ EndTxnResult, err error) { endErr = err; wg.Done() })
				tc.AddPartitions(AddPartitionsParams{TransactionalID: otherSlot, ProducerID: po, ProducerEpoch: 0, Partitions: tps("t", 1), Version: 3},
					func(_ AddPartitionsResult, err error) { otherErr = err; wg.Done() })
				release()
				wg.Wait()
				return
			}
			checkRolledBack := func(stage string) {
				t.Helper()
				if d := tc.describe(t, a); d.State != "Ongoing" || len(d.Topics) != 1 || !slices.Equal(d.Topics[0].Partitions, []int32{0}) {
					t.Fatalf("%s: a not rolled back: %+v", stage, d)
				}
				if d := tc.describe(t, b); d.State != "Empty" || d.ProducerEpoch != 0 {
					t.Fatalf("%s: b not rolled back: %+v", stage, d)
				}
				if d := tc.describe(t, otherSlot); d.State != "Empty" {
					t.Fatalf("%s: other slot not rolled back: %+v", stage, d)
				}
			}
			// The write (or sync) fails and so does the repair: the whole batch fails.
			addErr, verErr, endErr, otherErr := batch()
			for name, err := range map[string]error{"add": addErr, "verify": verErr, "end": endErr, "other slot": otherErr} {
				if !errors.Is(err, injected) || ErrorCode(err) != codec.CodeCoordinatorNotAvailable {
					t.Fatalf("%s in the failed batch: %v", name, err)
				}
			}
			checkRolledBack("after failure")
			// The device heals for the repair only: the first batch after it repairs, then fails
			// again on the injected op.
			failRepair.Store(false)
			if addErr, _, _, _ := batch(); !errors.Is(addErr, injected) {
				t.Fatalf("second failing batch: %v", addErr)
			}
			checkRolledBack("after second failure")
			tc.fs.setFailJournal(nil)
			r, err := call(t, func(d func(AddPartitionsResult, error)) {
				tc.AddPartitions(AddPartitionsParams{TransactionalID: a, ProducerID: pa, ProducerEpoch: 0, Partitions: tps("t", 9), Version: 3}, d)
			})
			if err != nil || r.Code != 0 {
				t.Fatalf("retry after heal: %+v %v", r, err)
			}
			if d := tc.describe(t, a); !slices.Equal(d.Topics[0].Partitions, []int32{0, 9}) {
				t.Fatalf("after heal: %+v", d)
			}
			// Nothing of the failed batches comes back after a crash: the repair zeroed them.
			tc.Coordinator.crash()
			tc2, _ := startCoord(t, dir, func(c *Config) { c.Workers = 1 })
			if d := tc2.describe(t, a); d.State != "Ongoing" || !slices.Equal(d.Topics[0].Partitions, []int32{0, 9}) {
				t.Fatalf("a after restart: %+v", d)
			}
			if d := tc2.describe(t, b); d.State != "Empty" || d.ProducerEpoch != 0 {
				t.Fatalf("b after restart: %+v", d)
			}
			if d := tc2.describe(t, otherSlot); d.State != "Empty" {
				t.Fatalf("other slot after restart: %+v", d)
			}
		})
	}
}

func TestReaperAbortsAndCompletes(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	tc, _ := startCoord(t, t.TempDir(), func(c *Config) {
		c.ReaperInterval = 5 * time.Millisecond
		c.Logger = zap.New(core)
	})
	// Offset-only transaction: the reaper must complete it too (its group is the only thing to do).
	r := tc.init(t, "reap", 1000)
	if _, err := call(t, func(d func(AddOffsetsResult, error)) {
		tc.AddOffsets(AddOffsetsParams{TransactionalID: "reap", ProducerID: r.ProducerID, ProducerEpoch: 0, Group: "g1", Version: 3}, d)
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-tc.parts.groups:
		t.Fatalf("reaped before the timeout: %+v", g)
	case <-time.After(30 * time.Millisecond):
	}
	tc.advance(1500 * time.Millisecond)
	// The reaper fences the zombie and aborts: no partition, so the saga goes straight to the
	// group, whose staged offsets are discarded.
	var fence FenceRequest
	select {
	case fence = <-tc.parts.fences:
	case <-time.After(5 * time.Second):
		t.Fatal("reaper did not fence the timed-out transaction")
	}
	if fence.ProducerID != r.ProducerID || fence.Epoch != 1 {
		t.Fatalf("reaper fence: %+v", fence)
	}
	g := tc.parts.nextGroup(t)
	if g.group != "g1" || g.commit || g.pid != r.ProducerID || g.epoch != 1 {
		t.Fatalf("reaper group completion: %+v", g)
	}
	// The zombie is fenced at the coordinator too.
	if a, _ := call(t, func(d func(AddOffsetsResult, error)) {
		tc.AddOffsets(AddOffsetsParams{TransactionalID: "reap", ProducerID: r.ProducerID, ProducerEpoch: 0, Group: "g1", Version: 3}, d)
	}); a.Code != codec.CodeProducerFenced {
		t.Fatalf("zombie add after reaper: %+v", a)
	}
	// Prepared and in flight for longer than the timeout: reported as hanging, not re-driven.
	tc.advance(5 * time.Second)
	waitFor(t, "hanging warning", func() bool {
		return logs.FilterMessage("transaction open longer than its timeout").FilterField(zap.String("transactionalId", "reap")).Len() > 0
	})
	if len(tc.parts.groups) != 0 || len(tc.parts.calls) != 0 {
		t.Fatalf("in-flight dispatch re-driven")
	}
	if d := tc.describe(t, "reap"); d.State != "PrepareAbort" {
		t.Fatalf("before the group completed: %+v", d)
	}
	g.done(nil)
	waitFor(t, "abort completed", func() bool { return tc.describe(t, "reap").State == "CompleteAbort" })
	// The completed transaction still reports when it started.
	if d := tc.describe(t, "reap"); d.StartTimeMs != t0.UnixMilli() {
		t.Fatalf("start time after completion: %+v", d)
	}
}

// TestMarkersFailedRedrives: a marker write that fails answers EndTxn with the retriable 15 and
// leaves the transaction prepared; the reaper re-drives it, a client retry while that is in
// flight answers 51, and after another failure a client retry re-drives it too.
func TestMarkersFailedRedrives(t *testing.T) {
	tc, _ := startCoord(t, t.TempDir(), nil)
	r := tc.init(t, "md", 60_000)
	if _, err := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: "md", ProducerID: r.ProducerID, ProducerEpoch: 0, Partitions: tps("t", 0), Version: 3}, d)
	}); err != nil {
		t.Fatal(err)
	}
	end := EndTxnParams{TransactionalID: "md", ProducerID: r.ProducerID, ProducerEpoch: 0, Commit: true, Version: 3}
	answered := make(chan EndTxnResult, 1)
	tc.EndTxn(end, func(res EndTxnResult, err error) {
		if err != nil {
			t.Error(err)
		}
		answered <- res
	})
	first := tc.parts.nextCall(t)
	if len(first.reqs) != 1 || first.reqs[0] != (MarkerRequest{TransactionalID: "md", Topic: "t", Partition: 0, ProducerID: r.ProducerID,
		ProducerEpoch: 0, Commit: true, CoordinatorEpoch: 1, TxnVersion: 1, PrepareSeq: 3}) {
		// PrepareSeq 3: the slot's third journal record (init, add, prepare) made it prepared.
		t.Fatalf("markers: %+v", first.reqs)
	}
	// In flight: retries answer 51 and do not hand the markers out twice.
	if e2, _ := call(t, func(d func(EndTxnResult, error)) { tc.EndTxn(end, d) }); e2.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("retry in flight: %+v", e2)
	}
	tc.barrier(t)
	if len(tc.parts.calls) != 0 {
		t.Fatal("markers handed out twice")
	}
	first.answer(codec.CodeNotLeaderForPartition)
	if res := <-answered; res.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("EndTxn after a failed marker: %+v", res)
	}
	if d := tc.describe(t, "md"); d.State != "PrepareCommit" {
		t.Fatalf("after a failed marker: %+v", d)
	}
	// The reaper's reconcile re-drives it ...
	n, _ := call(t, func(d func(int, error)) { tc.ReapNow(func(n int) { d(n, nil) }) })
	if n != 1 {
		t.Fatalf("reconcile started %d sagas", n)
	}
	again := tc.parts.nextCall(t)
	if len(again.reqs) != 1 || !again.reqs[0].Commit || again.reqs[0].PrepareSeq != 3 {
		t.Fatalf("reconcile markers: %+v", again.reqs)
	}
	// ... and after another failure, so does a client retry (answered 51, the saga completes).
	again.answer(codec.CodeKafkaStorageError)
	waitFor(t, "pending released", func() bool {
		var p bool
		tc.Snapshot("md", func(e *Entry, _ error) { p = e.Pending() })
		tc.barrier(t)
		return !p
	})
	if e3, _ := call(t, func(d func(EndTxnResult, error)) { tc.EndTxn(end, d) }); e3.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("client retry after failure: %+v", e3)
	}
	tc.parts.nextCall(t).answer(codec.CodeNone)
	waitFor(t, "commit completed", func() bool { return tc.describe(t, "md").State == "CompleteCommit" })
	if e4, _ := call(t, func(d func(EndTxnResult, error)) { tc.EndTxn(end, d) }); e4.Code != 0 {
		t.Fatalf("retry after completion: %+v", e4)
	}
}

// TestLoadAfterCrash: a prepared transaction survives a restart; Start re-drives it (fence to its
// epoch, markers with the coordinator epoch bumped) and completes it once the markers land.
func TestLoadAfterCrash(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, nil)
	r := tc.init(t, "crash", 60_000)
	if _, err := call(t, func(d func(AddPartitionsResult, error)) {
		tc.AddPartitions(AddPartitionsParams{TransactionalID: "crash", ProducerID: r.ProducerID, ProducerEpoch: 0, Partitions: tps("t", 3), Version: 3}, d)
	}); err != nil {
		t.Fatal(err)
	}
	tc.EndTxn(EndTxnParams{TransactionalID: "crash", ProducerID: r.ProducerID, ProducerEpoch: 0, Commit: true, Version: 5},
		func(EndTxnResult, error) {})
	if c := tc.parts.nextCall(t); c.reqs[0].CoordinatorEpoch != 1 {
		t.Fatalf("markers: %+v", c.reqs)
	}
	tc.Close() // crash: markers never completed

	tc2, acts := startCoord(t, dir, nil)
	if len(acts) != 1 {
		t.Fatalf("start re-drove %d transactions", len(acts))
	}
	a := acts[0]
	if a.TransactionalID != "crash" || a.Markers == nil || !a.Markers.Commit || a.Markers.ProducerEpoch != 1 ||
		a.Markers.CoordinatorEpoch != 2 || a.Fence == nil || a.Fence.NewEpoch != 1 || len(a.Markers.Partitions) != 1 {
		t.Fatalf("reconcile action: %+v %+v", a, a.Markers)
	}
	// The reconcile owns the dispatch: client retries wait.
	if e2, _ := call(t, func(d func(EndTxnResult, error)) {
		tc2.EndTxn(EndTxnParams{TransactionalID: "crash", ProducerID: r.ProducerID, ProducerEpoch: 0, Commit: true, Version: 5}, d)
	}); e2.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("retry during reconcile: %+v", e2)
	}
	tc2.held[0].answer(codec.CodeNone)
	waitFor(t, "reconcile completed", func() bool { return tc2.describe(t, "crash").State == "CompleteCommit" })
	// The client's retry of the lost EndTxn v5 response is recognised.
	if e3, _ := call(t, func(d func(EndTxnResult, error)) {
		tc2.EndTxn(EndTxnParams{TransactionalID: "crash", ProducerID: r.ProducerID, ProducerEpoch: 0, Commit: true, Version: 5}, d)
	}); e3.Code != 0 || e3.ProducerEpoch != 1 {
		t.Fatalf("retry after completion: %+v", e3)
	}
	tc2.Close()
	_, acts3 := startCoord(t, dir, nil)
	if len(acts3) != 0 {
		t.Fatalf("completed txn returned again: %+v", acts3)
	}
	ls, _ := readSlot(filepath.Join(dir, StateDir), SlotFor("crash"))
	if ls.coordinatorEpoch != 3 {
		t.Fatalf("coordinator epoch %d after three starts", ls.coordinatorEpoch)
	}
}

func TestOwnershipClosedAndList(t *testing.T) {
	notMine := SlotFor("not-mine")
	tc, _ := startCoord(t, t.TempDir(), func(c *Config) { c.OwnsSlot = func(s int) bool { return s != notMine } })
	if tc.Owns("not-mine") {
		t.Fatal("Owns")
	}
	_, err := call(t, func(d func(InitProducerIDResult, error)) {
		tc.InitProducerID(InitProducerIDParams{TransactionalID: "not-mine", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
	})
	if !errors.Is(err, ErrNotCoordinator) || ErrorCode(err) != codec.CodeNotCoordinator {
		t.Fatalf("unowned slot: %v", err)
	}
	for i := 0; i < 12; i++ {
		id := fmt.Sprintf("l-%d", i)
		if SlotFor(id) == notMine {
			continue
		}
		r := tc.init(t, id, 60_000)
		if i%2 == 0 {
			if _, err := call(t, func(d func(AddPartitionsResult, error)) {
				tc.AddPartitions(AddPartitionsParams{TransactionalID: id, ProducerID: r.ProducerID, ProducerEpoch: 0, Partitions: tps("t", 0), Version: 3}, d)
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	type lres struct {
		txns    []ListedTxn
		unknown []string
	}
	l, err := call(t, func(d func(lres, error)) {
		tc.List(ListFilter{States: []string{"Ongoing", "Nope"}, DurationMs: -1}, func(tx []ListedTxn, u []string, err error) { d(lres{tx, u}, err) })
	})
	if err != nil || !slices.Equal(l.unknown, []string{"Nope"}) {
		t.Fatalf("list: %+v %v", l, err)
	}
	want := 0
	for i := 0; i < 12; i += 2 {
		if SlotFor(fmt.Sprintf("l-%d", i)) != notMine {
			want++
		}
	}
	if len(l.txns) != want {
		t.Fatalf("listed %d ongoing, want %d: %+v", len(l.txns), want, l.txns)
	}
	for _, x := range l.txns {
		if x.State != "Ongoing" {
			t.Fatalf("filter leaked %+v", x)
		}
	}
	tc.Close()
	_, err = call(t, func(d func(InitProducerIDResult, error)) {
		tc.InitProducerID(InitProducerIDParams{TransactionalID: "l-1", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
	})
	if !errors.Is(err, ErrClosed) || ErrorCode(err) != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("after close: %v", err)
	}
}

// crash stops the coordinator the way kill -9 would leave its files: no final checkpoint, the
// journal stays as written (the page cache survives, as it does when only the process dies).
func (c *Coordinator) crash() {
	c.crashed.Store(true)
	c.Close()
}
