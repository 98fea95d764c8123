package storage

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// txnAppend appends a transactional batch through the KIP-890 path (guard unless ongoing) and
// waits for durability.
func txnAppend(t testing.TB, p *Partition, pid int64, epoch int16, seq int32, n int) AppendResult {
	t.Helper()
	g, ongoing := p.VerificationGuard(pid, epoch)
	if ongoing {
		g = 0
	}
	r := p.AppendTxn(makeBatch(t, tb{pid: pid, epoch: epoch, seq: seq, n: n, txn: true}), 0, g)
	if r.Code != codec.CodeNone {
		t.Fatalf("txn append pid %d epoch %d seq %d: code %d", pid, epoch, seq, r.Code)
	}
	if err := syncWait(p, r.LastOffset+1); err != nil {
		t.Fatal(err)
	}
	return r
}

// mustMarker writes a marker and waits for durability.
func mustMarker(t testing.TB, p *Partition, pid int64, epoch int16, commit bool, coordEpoch int32) AppendResult {
	t.Helper()
	r := p.AppendMarker(pid, epoch, commit, coordEpoch, 1000)
	if r.Code != codec.CodeNone {
		t.Fatalf("marker pid %d epoch %d: code %d", pid, epoch, r.Code)
	}
	if r.BaseOffset != r.LastOffset {
		t.Fatalf("marker spans %d..%d", r.BaseOffset, r.LastOffset)
	}
	if err := syncWait(p, r.LastOffset+1); err != nil {
		t.Fatal(err)
	}
	return r
}

func wantCode(t testing.TB, what string, r AppendResult, code int16) {
	t.Helper()
	if r.Code != code {
		t.Fatalf("%s: code %d, want %d (%+v)", what, r.Code, code, r)
	}
}

func TestLSOInterleavedTransactions(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	lso := func(want int64) {
		t.Helper()
		if got := p.LastStableOffset(); got != want {
			t.Fatalf("LSO %d, want %d (HWM %d)", got, want, p.HighWatermark())
		}
	}
	mustAppend(t, p, makeBatch(t, tb{}), 0) // 0
	lso(1)
	txnAppend(t, p, 1, 0, 0, 1) // 1: pid 1 opens
	lso(1)
	txnAppend(t, p, 2, 0, 0, 2) // 2-3: pid 2 opens
	txnAppend(t, p, 1, 0, 1, 1) // 4
	mustAppend(t, p, makeBatch(t, tb{}), 0)
	lso(1)
	if got := p.OpenTransactions(); len(got) != 2 || got[0].ProducerID != 1 || got[0].FirstOffset != 1 || got[1].FirstOffset != 2 {
		t.Fatalf("open %+v", got)
	}
	mustMarker(t, p, 1, 0, true, 0) // 6: pid 1 commits
	lso(2)
	txnAppend(t, p, 3, 0, 0, 1)      // 7: pid 3 opens
	mustMarker(t, p, 2, 0, false, 0) // 8: pid 2 aborts
	lso(7)
	if got := p.AbortedTransactions(0, 100); !reflect.DeepEqual(got, []AbortedTxn{{2, 2, 8}}) {
		t.Fatalf("aborted %+v", got)
	}
	for _, pi := range p.Producers() {
		want := int64(-1)
		if pi.ProducerID == 3 {
			want = 7
		}
		if pi.CurrentTxnStartOffset != want {
			t.Fatalf("producer %+v: txn start want %d", pi, want)
		}
		if pi.ProducerID != 3 && pi.CoordinatorEpoch != 0 {
			t.Fatalf("producer %+v: coordinator epoch", pi)
		}
	}
	mustMarker(t, p, 3, 0, true, 0) // 9
	lso(10)
	if p.LastStableOffset() != p.HighWatermark() || len(p.OpenTransactions()) != 0 {
		t.Fatal("no open transaction: LSO must be the HWM")
	}
	// A commit never creates an aborted range.
	if got := p.AbortedTransactions(0, 100); len(got) != 1 {
		t.Fatalf("aborted %+v", got)
	}
}

func TestLSOWaitsForDurableMarker(t *testing.T) {
	ffs := &faultFS{}
	s := openStore(t, "", func(c *Config) { c.FS = ffs })
	defer s.Close()
	p := newPartition(t, s, nil)
	txnAppend(t, p, 1, 0, 0, 3) // 0-2
	gate := make(chan struct{})
	ffs.set(func(f *faultFS) { f.gate = gate })
	opened := false
	open := func() {
		if !opened {
			opened = true
			ffs.set(func(f *faultFS) { f.gate = nil })
			close(gate)
		}
	}
	// Opened before s.Close on every path: Close waits for the gated flusher.
	defer open()
	r := p.AppendMarker(1, 0, true, 0, 1000) // 3, not yet durable
	wantCode(t, "marker", r, codec.CodeNone)
	txnAppend2 := p.AppendTxn(makeBatch(t, tb{pid: 2, epoch: 0, seq: 0, txn: true}), 0, mustGuard(t, p, 2, 0)) // 4
	wantCode(t, "pid 2", txnAppend2, codec.CodeNone)
	if len(p.OpenTransactions()) != 1 {
		t.Fatalf("pid 1 must be closed in producer state: %+v", p.OpenTransactions())
	}
	if lso, hwm := p.LastStableOffset(), p.HighWatermark(); lso != 0 || hwm > 3 {
		t.Fatalf("LSO %d HWM %d: the LSO moved past a transaction whose marker is not durable", lso, hwm)
	}
	open()
	if err := syncWait(p, 5); err != nil {
		t.Fatal(err)
	}
	if lso := p.LastStableOffset(); lso != 4 || lso > p.HighWatermark() {
		t.Fatalf("after fsync: LSO %d, want 4 (pid 2 still open)", lso)
	}
}

func mustGuard(t testing.TB, p *Partition, pid int64, epoch int16) uint64 {
	t.Helper()
	g, ongoing := p.VerificationGuard(pid, epoch)
	if ongoing || g == 0 {
		t.Fatalf("guard for pid %d: %d ongoing %v", pid, g, ongoing)
	}
	return g
}

func TestAbortedTransactionsOverlap(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	txnAppend(t, p, 1, 0, 0, 5)      // 0-4
	txnAppend(t, p, 2, 0, 0, 1)      // 5
	txnAppend(t, p, 1, 0, 5, 1)      // 6
	mustMarker(t, p, 1, 0, false, 0) // 7 abort {1,0,7}
	mustMarker(t, p, 2, 0, true, 0)  // 8
	txnAppend(t, p, 3, 0, 0, 2)      // 9-10
	mustMarker(t, p, 3, 0, false, 0) // 11 abort {3,9,11}
	txnAppend(t, p, 4, 0, 0, 1)      // 12
	mustMarker(t, p, 4, 0, false, 0) // 13 abort {4,12,13}
	// Two overlapping aborts whose marker order differs from their start order.
	txnAppend(t, p, 5, 0, 0, 1)      // 14
	txnAppend(t, p, 6, 0, 0, 1)      // 15
	mustMarker(t, p, 6, 0, false, 0) // 16 abort {6,15,16}
	mustMarker(t, p, 5, 0, false, 0) // 17 abort {5,14,17}
	a1, a3, a4, a5, a6 := AbortedTxn{1, 0, 7}, AbortedTxn{3, 9, 11}, AbortedTxn{4, 12, 13}, AbortedTxn{5, 14, 17}, AbortedTxn{6, 15, 16}
	cases := []struct {
		from, upper int64
		want        []AbortedTxn
	}{
		{3, 100, []AbortedTxn{a1, a3, a4, a5, a6}}, // fetch inside pid 1's txn: a start filter would miss it
		{7, 8, []AbortedTxn{a1}},                   // fetch at the marker itself
		{8, 12, []AbortedTxn{a3}},                  // upper bound cuts pid 4 (first 12 is not < 12)
		{8, 13, []AbortedTxn{a3, a4}},
		{0, 1, []AbortedTxn{a1}},
		{14, 18, []AbortedTxn{a5, a6}}, // sorted by first offset, not by marker
		{16, 17, []AbortedTxn{a5, a6}},
		{17, 18, []AbortedTxn{a5}},
		{18, 30, nil},
	}
	for _, c := range cases {
		if got := p.AbortedTransactions(c.from, c.upper); !reflect.DeepEqual(got, c.want) {
			t.Errorf("AbortedTransactions(%d, %d) = %+v, want %+v", c.from, c.upper, got, c.want)
		}
	}
}

func TestMarkersFenceZombies(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	txnAppend(t, p, 7, 1, 0, 1)      // 0: epoch 1 opens
	mustMarker(t, p, 7, 2, false, 0) // 1: reaper abort with a bumped epoch
	// The zombie (epoch 1) keeps producing: 47 on every path, and no transaction is opened.
	g, ongoing := p.VerificationGuard(7, 1)
	if ongoing {
		t.Fatal("aborted transaction still ongoing")
	}
	wantCode(t, "zombie txn data with guard", p.AppendTxn(makeBatch(t, tb{pid: 7, epoch: 1, seq: 1, txn: true}), 0, g), codec.CodeInvalidProducerEpoch)
	wantCode(t, "zombie txn data", p.Append(makeBatch(t, tb{pid: 7, epoch: 1, seq: 1, txn: true}), 0), codec.CodeInvalidProducerEpoch)
	wantCode(t, "zombie plain data", p.Append(makeBatch(t, tb{pid: 7, epoch: 1, seq: 1}), 0), codec.CodeInvalidProducerEpoch)
	wantCode(t, "zombie marker", p.AppendMarker(7, 1, true, 0, 0), codec.CodeInvalidProducerEpoch)
	if len(p.OpenTransactions()) != 0 || p.LastStableOffset() != p.HighWatermark() || p.LogEndOffset() != 2 {
		t.Fatalf("zombie left a trace: open %+v LSO %d HWM %d LEO %d", p.OpenTransactions(), p.LastStableOffset(), p.HighWatermark(), p.LogEndOffset())
	}
	if got := p.AbortedTransactions(0, 10); !reflect.DeepEqual(got, []AbortedTxn{{7, 0, 1}}) {
		t.Fatalf("aborted %+v", got)
	}
	// The new epoch starts from sequence 0 (window reset by the bump).
	wantCode(t, "new epoch seq 5", p.AppendTxn(makeBatch(t, tb{pid: 7, epoch: 2, seq: 5, txn: true}), 0, mustGuard(t, p, 7, 2)), codec.CodeOutOfOrderSequenceNumber)
	txnAppend(t, p, 7, 2, 0, 1)
	if ep, _, _, _ := p.ProducerState(7); ep != 2 {
		t.Fatalf("epoch %d", ep)
	}
}

func TestMarkerCoordinatorEpochFencing(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	txnAppend(t, p, 1, 0, 0, 1)
	mustMarker(t, p, 1, 0, true, 5)
	txnAppend(t, p, 1, 0, 1, 1)
	wantCode(t, "old coordinator", p.AppendMarker(1, 0, false, 4, 0), codec.CodeTransactionCoordinatorFenced)
	if len(p.OpenTransactions()) != 1 {
		t.Fatal("a fenced marker closed the transaction")
	}
	if pi := p.Producers(); pi[0].CoordinatorEpoch != 5 || pi[0].CurrentTxnStartOffset != 2 {
		t.Fatalf("%+v", pi)
	}
	mustMarker(t, p, 1, 0, false, 6)
	if pi := p.Producers(); pi[0].CoordinatorEpoch != 6 || pi[0].CurrentTxnStartOffset != -1 {
		t.Fatalf("%+v", pi)
	}
	// Epoch is checked before the coordinator epoch, as in Apache.
	wantCode(t, "old epoch and coordinator", p.AppendMarker(1, -1, false, 1, 0), codec.CodeInvalidProducerEpoch)
}

func TestMarkerWithoutOngoingTxn(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	mustMarker(t, p, 9, 0, false, 0) // unknown producer (kafka-transactions abort, coordinator retry)
	txnAppend(t, p, 9, 0, 0, 1)
	mustMarker(t, p, 9, 0, false, 0)
	mustMarker(t, p, 9, 0, false, 0) // retry after the transaction was closed: not written again
	if p.LogEndOffset() != 3 {
		t.Fatalf("LEO %d: every marker but the resend is written", p.LogEndOffset())
	}
	if got := p.AbortedTransactions(0, 10); !reflect.DeepEqual(got, []AbortedTxn{{9, 1, 2}}) {
		t.Fatalf("aborted %+v: only the marker that closed data may create an entry", got)
	}
	if p.LastStableOffset() != 3 {
		t.Fatalf("LSO %d", p.LastStableOffset())
	}
}

func TestVerificationGuard(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	txn := func(epoch int16, seq int32) codec.Batch {
		return makeBatch(t, tb{pid: 3, epoch: epoch, seq: seq, txn: true})
	}

	g1 := mustGuard(t, p, 3, 0)
	if g, _ := p.VerificationGuard(3, 0); g != g1 {
		t.Fatalf("concurrent verifications must share the guard: %d vs %d", g, g1)
	}
	wantCode(t, "plain append of a first txn batch", p.Append(txn(0, 0), 0), codec.CodeInvalidTxnState)
	wantCode(t, "unknown guard", p.AppendTxn(txn(0, 0), 0, g1+12345), codec.CodeInvalidTxnState)
	wantCode(t, "guard for another epoch", p.AppendTxn(txn(1, 0), 0, g1), codec.CodeInvalidTxnState)
	wantCode(t, "first batch", p.AppendTxn(txn(0, 0), 0, g1), codec.CodeNone)
	if g, ongoing := p.VerificationGuard(3, 0); !ongoing || g != 0 {
		t.Fatalf("ongoing transaction needs no guard: %d %v", g, ongoing)
	}
	wantCode(t, "later batch, no guard", p.Append(txn(0, 1), 0), codec.CodeNone)
	mustMarker(t, p, 3, 0, true, 0)

	// ABA: verified, then a marker (abort of that transaction), then the stale "ok" arrives.
	g2 := mustGuard(t, p, 3, 0)
	if g2 == g1 {
		t.Fatal("guard reused")
	}
	mustMarker(t, p, 3, 0, false, 0)
	wantCode(t, "guard cleared by marker", p.AppendTxn(txn(0, 2), 0, g2), codec.CodeInvalidTxnState)

	// A fence clears the guard too (partition and store level).
	g3 := mustGuard(t, p, 3, 0)
	p.FenceProducer(3, 0)
	wantCode(t, "guard cleared by fence", p.AppendTxn(txn(0, 2), 0, g3), codec.CodeInvalidTxnState)
	g4 := mustGuard(t, p, 3, 1)
	s.FenceProducer(3, 1)
	wantCode(t, "guard cleared by store fence", p.AppendTxn(txn(1, 0), 0, g4), codec.CodeInvalidTxnState)

	// Stale epoch: 47 before the guard check (KAFKA-19690), with or without a guard.
	s.FenceProducer(3, 2)
	g5, _ := p.VerificationGuard(3, 1)
	wantCode(t, "stale epoch with guard", p.AppendTxn(txn(1, 0), 0, g5), codec.CodeInvalidProducerEpoch)
	wantCode(t, "stale epoch without guard", p.AppendTxn(txn(1, 0), 0, 0), codec.CodeInvalidProducerEpoch)
	if len(p.OpenTransactions()) != 0 {
		t.Fatal("rejected batches opened a transaction")
	}
	// Guard memory is bounded.
	for pid := int64(100); pid < 100+2*maxGuardsPerPartition; pid++ {
		p.VerificationGuard(pid, 0)
	}
	p.mu.Lock()
	n := len(p.producers.guards)
	p.mu.Unlock()
	if n > maxGuardsPerPartition {
		t.Fatalf("%d guards", n)
	}
}

func TestNonTransactionalBatchDuringTxn(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	txnAppend(t, p, 4, 0, 0, 1)
	wantCode(t, "plain batch during txn", p.Append(makeBatch(t, tb{pid: 4, epoch: 0, seq: 1}), 0), codec.CodeInvalidTxnState)
	// A new epoch whose guard was issued while the old transaction is still open never merges
	// into it.
	g := mustGuard(t, p, 4, 1)
	wantCode(t, "other epoch into open txn", p.AppendTxn(makeBatch(t, tb{pid: 4, epoch: 1, seq: 0, txn: true}), 0, g), codec.CodeInvalidTxnState)
	mustMarker(t, p, 4, 0, true, 0)
	mustAppend(t, p, makeBatch(t, tb{pid: 4, epoch: 0, seq: 1}), 0)
	if len(p.OpenTransactions()) != 0 || p.LastStableOffset() != p.HighWatermark() {
		t.Fatal("plain batch opened a transaction")
	}
}

func TestStoreFenceReachesPartitionsWithoutState(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	a, err := s.CreateTopic("a", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateTopic("b", 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	pa, pb := a.Partition(0), b.Partition(1)
	mustAppend(t, pa, makeBatch(t, tb{pid: 9, epoch: 1, seq: 0}), 0)
	s.FenceProducer(9, 3)
	wantCode(t, "fenced partition with state", pa.Append(makeBatch(t, tb{pid: 9, epoch: 1, seq: 1}), 0), codec.CodeInvalidProducerEpoch)
	wantCode(t, "fenced partition without state", pb.Append(makeBatch(t, tb{pid: 9, epoch: 2, seq: 0}), 0), codec.CodeInvalidProducerEpoch)
	wantCode(t, "marker on partition without state", pb.AppendMarker(9, 2, false, 0, 0), codec.CodeInvalidProducerEpoch)
	if len(b.Partition(0).Producers()) != 0 {
		t.Fatal("store fence created state on a partition that never saw the producer")
	}
	c, err := s.CreateTopic("c", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "partition created after the fence", c.Partition(0).Append(makeBatch(t, tb{pid: 9, epoch: 2, seq: 0}), 0), codec.CodeInvalidProducerEpoch)
	mustAppend(t, pb, makeBatch(t, tb{pid: 9, epoch: 3, seq: 0}), 0)
	mustAppend(t, pa, makeBatch(t, tb{pid: 9, epoch: 3, seq: 0}), 0)
	// The memory is FIFO-bounded.
	var f fenceMemory
	for pid := int64(0); pid < fenceMemoryMax+10; pid++ {
		f.remember(pid, 1)
	}
	if _, ok := f.get(0); ok || len(f.m) != fenceMemoryMax {
		t.Fatalf("fence memory holds %d", len(f.m))
	}
	if e, ok := f.get(fenceMemoryMax + 9); !ok || e != 1 {
		t.Fatal("newest fence forgotten")
	}
}

func TestTxnStateRebuiltAfterFsyncFailure(t *testing.T) {
	ffs := &faultFS{}
	s := openStore(t, "", func(c *Config) { c.FS = ffs })
	defer s.Close()
	if s.wal != nil {
		ffs.match = "/" + walDirName + "/" // the acks' sync (see TestFsyncFailureDiscards...)
	}
	p := newPartition(t, s, nil)
	txnAppend(t, p, 1, 0, 0, 2) // 0-1
	ffs.set(func(f *faultFS) { f.syncErr = syscall.EIO })
	r := p.AppendMarker(1, 0, false, 0, 0) // 2: discarded by the fsync failure
	wantCode(t, "marker", r, codec.CodeNone)
	if err := syncWait(p, r.LastOffset+1); err == nil {
		t.Fatal("sync succeeded")
	}
	if p.LastStableOffset() != 0 {
		t.Fatalf("LSO %d past a transaction whose marker is not durable", p.LastStableOffset())
	}
	ffs.set(func(f *faultFS) { f.syncErr = nil })
	waitWALContinues(t, s)
	// The next append repairs first: the discarded marker is gone, so the transaction is open
	// again and the retried marker closes it.
	r2 := mustMarker(t, p, 1, 0, false, 0)
	if r2.BaseOffset <= r.BaseOffset {
		t.Fatalf("offset reused: %d", r2.BaseOffset)
	}
	if got := p.AbortedTransactions(0, 100); !reflect.DeepEqual(got, []AbortedTxn{{1, 0, r2.BaseOffset}}) {
		t.Fatalf("aborted %+v: want only the durable marker", got)
	}
	if p.LastStableOffset() != p.HighWatermark() {
		t.Fatal("LSO")
	}
}

// ---- recovery ----

// txnView is everything the transaction state exposes.
type txnView struct {
	HWM, LSO, LogStart int64
	Open               []OpenTxn
	Aborted            []AbortedTxn
	Producers          []ProducerInfo
}

func viewOf(p *Partition) txnView {
	return txnView{HWM: p.HighWatermark(), LSO: p.LastStableOffset(), LogStart: p.LogStartOffset(),
		Open: p.OpenTransactions(), Aborted: p.AbortedTransactions(0, math.MaxInt64), Producers: p.Producers()}
}

// txnModel is an independent model of what the partition must report.
type txnModel struct {
	open    map[int64]int64 // pid → first offset
	aborted []AbortedTxn
}

// runTxnWorkload drives several producers with interleaved transactions across many segment
// rolls. pid 1 opens a transaction first and never ends it.
func runTxnWorkload(t *testing.T, p *Partition, steps int) *txnModel {
	m := &txnModel{open: map[int64]int64{}}
	type prod struct {
		epoch int16
		seq   int32
	}
	prods := map[int64]*prod{}
	for pid := int64(1); pid <= 5; pid++ {
		prods[pid] = &prod{}
	}
	data := func(pid int64, n int) {
		pr := prods[pid]
		r := txnAppend(t, p, pid, pr.epoch, pr.seq, n)
		pr.seq += int32(n)
		if _, ok := m.open[pid]; !ok {
			m.open[pid] = r.BaseOffset
		}
	}
	data(1, 2)
	rng := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < steps; i++ {
		pid := int64(2 + rng.IntN(4))
		pr := prods[pid]
		switch x := rng.IntN(10); {
		case x == 0:
			mustAppend(t, p, makeBatch(t, tb{n: 2, value: 40}), 0) // plain, no producer id
		case x < 7:
			data(pid, 1+rng.IntN(3))
		default: // also for producers without an open transaction (written, no entry)
			commit := rng.IntN(2) == 0
			epoch := pr.epoch
			if rng.IntN(4) == 0 { // coordinator bumped the epoch (reaper abort / TV2)
				epoch++
			}
			r := mustMarker(t, p, pid, epoch, commit, 0)
			if epoch != pr.epoch {
				pr.epoch, pr.seq = epoch, 0
			}
			if first, ok := m.open[pid]; ok {
				if !commit {
					m.aborted = append(m.aborted, AbortedTxn{pid, first, r.BaseOffset})
				}
				delete(m.open, pid)
			}
		}
	}
	return m
}

// check compares the partition with the model.
func (m *txnModel) check(t *testing.T, p *Partition) {
	t.Helper()
	ls := p.LogStartOffset()
	lso := p.HighWatermark()
	var open []int64
	for pid, first := range m.open {
		lso = min(lso, first)
		open = append(open, pid)
	}
	lso = max(lso, ls)
	if got := p.LastStableOffset(); got != lso {
		t.Fatalf("LSO %d, model %d", got, lso)
	}
	got := p.OpenTransactions()
	if len(got) != len(open) {
		t.Fatalf("open %+v, model %v", got, m.open)
	}
	for _, o := range got {
		if m.open[o.ProducerID] != o.FirstOffset {
			t.Fatalf("open %+v, model %v", got, m.open)
		}
	}
	var want []AbortedTxn
	for _, a := range m.aborted {
		if a.LastOffset >= ls {
			want = append(want, a)
		}
	}
	sort.Slice(want, func(i, j int) bool { return want[i].FirstOffset < want[j].FirstOffset })
	if got := p.AbortedTransactions(0, math.MaxInt64); !reflect.DeepEqual(got, want) {
		t.Fatalf("aborted:\n got %+v\nwant %+v", got, want)
	}
	// Overlap rule against a brute-force filter, on a grid of fetch ranges.
	hwm := p.HighWatermark()
	for from := ls; from <= hwm; from += 7 {
		for upper := from + 1; upper <= hwm+1; upper += 13 {
			var w []AbortedTxn
			for _, a := range want {
				if a.LastOffset >= from && a.FirstOffset < upper {
					w = append(w, a)
				}
			}
			if got := p.AbortedTransactions(from, upper); !reflect.DeepEqual(got, w) {
				t.Fatalf("AbortedTransactions(%d, %d) = %+v, want %+v", from, upper, got, w)
			}
		}
	}
}

func filesWith(t *testing.T, dir, ext string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ext) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out
}

func TestTxnRecovery(t *testing.T) {
	setup := func(t *testing.T) (string, *Store, *Partition, *txnModel) {
		dir := t.TempDir()
		s := openStore(t, dir)
		p := newPartition(t, s, map[string]string{"segment.bytes": "1024"})
		m := runTxnWorkload(t, p, 250)
		if n := len(*p.segs.Load()); n < 5 {
			t.Fatalf("only %d segments", n)
		}
		if len(m.aborted) < 5 || len(m.open) < 2 {
			t.Fatalf("workload too tame: %d aborts, %d open", len(m.aborted), len(m.open))
		}
		m.check(t, p)
		return dir, s, p, m
	}
	reopen := func(t *testing.T, dir string) (*Store, *Partition) {
		s := openStore(t, dir)
		t.Cleanup(func() { s.Close() })
		return s, s.Topic("t").Partition(0)
	}
	partDir := func(dir string) string { return filepath.Join(dir, "topics", "t", "0") }

	cases := map[string]func(t *testing.T, dir string){
		"kill -9":             func(*testing.T, string) {},
		"no snapshots":        func(t *testing.T, dir string) { removeAll(t, filesWith(t, partDir(dir), ".snapshot")) },
		"newest snapshot bad": func(t *testing.T, dir string) { flipByte(t, last(filesWith(t, partDir(dir), ".snapshot")), 30) },
		"txnindex corrupt, missing, truncated": func(t *testing.T, dir string) {
			var withEntries []string
			for _, f := range filesWith(t, partDir(dir), ".txnindex") {
				if st, _ := os.Stat(f); st.Size() > 12 {
					withEntries = append(withEntries, f)
				}
			}
			if len(withEntries) < 3 {
				t.Fatalf("only %d .txnindex files with entries", len(withEntries))
			}
			flipByte(t, withEntries[0], 20)
			removeAll(t, withEntries[1:2])
			if err := os.Truncate(withEntries[2], 10); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dir, s, p, m := setup(t)
			before := viewOf(p)
			crash(s)
			damage(t, dir)
			_, p = reopen(t, dir)
			if after := viewOf(p); !reflect.DeepEqual(before, after) {
				t.Fatalf("state changed across the crash:\nbefore %+v\nafter  %+v", before, after)
			}
			m.check(t, p)
			// Every closed segment has a valid .txnindex again.
			segs := *p.segs.Load()
			for i, seg := range segs[:len(segs)-1] {
				buf, err := os.ReadFile(seg.path(".txnindex"))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := decodeTxnIndex(buf, seg.base, segs[i+1].base); err != nil {
					t.Fatalf("segment %d: %v", seg.base, err)
				}
			}
			// The pinned transaction is finished by the coordinator's reconcile pass.
			r := mustMarker(t, p, 1, 0, false, 0)
			m.aborted = append(m.aborted, AbortedTxn{1, m.open[1], r.BaseOffset})
			delete(m.open, 1)
			m.check(t, p)
		})
	}

	t.Run("clean close", func(t *testing.T) {
		dir, s, p, m := setup(t)
		// End inside a segment with an abort in the active segment (covered by the snapshot tail).
		first := txnAppend(t, p, 50, 0, 0, 1).BaseOffset
		r := mustMarker(t, p, 50, 0, false, 0)
		m.aborted = append(m.aborted, AbortedTxn{50, first, r.BaseOffset})
		before := viewOf(p)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		_, p = reopen(t, dir)
		if after := viewOf(p); !reflect.DeepEqual(before, after) {
			t.Fatalf("state changed across close:\nbefore %+v\nafter  %+v", before, after)
		}
		m.check(t, p)
		// And a crash right after the reopen (no new snapshot) still has the tail.
		crash(p.topic.store)
		_, p = reopen(t, dir)
		if after := viewOf(p); !reflect.DeepEqual(before, after) {
			t.Fatalf("state changed across close + crash:\nbefore %+v\nafter  %+v", before, after)
		}
	})

	t.Run("retention then kill -9", func(t *testing.T) {
		dir, s, p, m := setup(t)
		rb := "4096"
		if err := s.AlterTopicConfig("t", map[string]*string{"retention.bytes": &rb}); err != nil {
			t.Fatal(err)
		}
		// Retention by bytes; "now" is near the batches' timestamps so that
		// producer.id.expiration.ms (in memory until the next snapshot) removes nothing.
		s.RunRetention(time.UnixMilli(2000))
		ls := p.LogStartOffset()
		if ls == 0 {
			t.Fatal("retention removed nothing")
		}
		if m.open[1] >= ls || p.LastStableOffset() != ls {
			t.Fatalf("pid 1's transaction started before the log start: LSO %d, log start %d", p.LastStableOffset(), ls)
		}
		if n := len(filesWith(t, partDir(dir), ".txnindex")); n != len(*p.segs.Load())-1 {
			t.Fatalf("%d .txnindex files for %d closed segments", n, len(*p.segs.Load())-1)
		}
		m.check(t, p)
		before := viewOf(p)
		for _, a := range before.Aborted {
			if a.LastOffset < ls {
				t.Fatalf("aborted entry %+v below log start %d", a, ls)
			}
		}
		crash(s)
		_, p = reopen(t, dir)
		if after := viewOf(p); !reflect.DeepEqual(before, after) {
			t.Fatalf("state changed across the crash:\nbefore %+v\nafter  %+v", before, after)
		}
		m.check(t, p)
	})
}

func removeAll(t *testing.T, files []string) {
	t.Helper()
	for _, f := range files {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
}

func flipByte(t *testing.T, file string, at int64) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var one [1]byte
	if _, err := f.ReadAt(one[:], at); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0x40
	if _, err := f.WriteAt(one[:], at); err != nil {
		t.Fatal(err)
	}
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

func TestSnapshotCarriesTransactions(t *testing.T) {
	ps := newProducerState()
	b := makeBatch(t, tb{pid: 3, epoch: 2, seq: 0, txn: true, ts: 55})
	b.SetBaseOffset(10)
	ps.record(b)
	m := codec.Batch(codec.AppendControlBatch(nil, 4, 1, false, 9, 0))
	m.SetBaseOffset(11)
	ps.record(m)
	tail := []AbortedTxn{{4, 2, 8}, {5, 3, 9}}
	buf := ps.encode(12, tail)
	got, off, err := decodeProducerSnapshot(buf)
	if err != nil || off != 12 {
		t.Fatal(err, off)
	}
	if e := got.m[3]; e.txn == nil || e.txn.first != 10 || e.txn.epoch != 2 || e.txn.startTs != 55 || e.coordEpoch != -1 {
		t.Fatalf("%+v", e)
	}
	if e := got.m[4]; e.txn != nil || e.coordEpoch != 9 || e.epoch != 1 {
		t.Fatalf("%+v", e)
	}
	if !reflect.DeepEqual(got.snapTail, tail) {
		t.Fatalf("tail %+v", got.snapTail)
	}
	for i := range buf {
		bad := append([]byte(nil), buf...)
		bad[i] ^= 1
		if _, _, err := decodeProducerSnapshot(bad); err == nil {
			t.Fatalf("flip at %d not detected", i)
		}
	}
}

func TestTxnIndexCodec(t *testing.T) {
	ents := []AbortedTxn{{1, 100, 105}, {2, 90, 110}, {1, 111, 119}}
	buf := encodeTxnIndex(ents)
	got, err := decodeTxnIndex(buf, 100, 120)
	if err != nil || !reflect.DeepEqual(got, ents) {
		t.Fatal(err, got)
	}
	for _, bad := range []struct {
		name       string
		base, next int64
	}{{"marker before base", 106, 120}, {"marker at next", 100, 119}} {
		if _, err := decodeTxnIndex(buf, bad.base, bad.next); err == nil {
			t.Fatal(bad.name)
		}
	}
	if _, err := decodeTxnIndex(encodeTxnIndex([]AbortedTxn{{1, 100, 110}, {2, 100, 105}}), 100, 120); err == nil {
		t.Fatal("unsorted accepted")
	}
	if got, err := decodeTxnIndex(encodeTxnIndex(nil), 5, 5); err != nil || len(got) != 0 {
		t.Fatal("empty", err)
	}
}

// FenceProducer visits only the partitions holding state (an entry or a guard) for the producer,
// found through the store's pid index; the index follows state as it is created, reloaded and
// closed, and a partition without state still rejects the fenced epoch.
func TestFenceProducerVisitsOnlyPartitionsWithState(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	top, err := s.CreateTopic("many", 50, nil)
	if err != nil {
		t.Fatal(err)
	}
	p3, p7, p9 := top.Partition(3), top.Partition(7), top.Partition(9)
	mustAppend(t, p3, makeBatch(t, tb{pid: 5, epoch: 0, seq: 0}), 0)
	mustAppend(t, p7, makeBatch(t, tb{pid: 5, epoch: 0, seq: 0}), 0)
	if _, ongoing := p9.VerificationGuard(5, 0); ongoing {
		t.Fatal("no transaction is ongoing")
	}
	if got := len(s.pids.partitions(5)); got != 3 {
		t.Fatalf("pid 5 indexed on %d partitions, want 3", got)
	}
	before := fencePartitionsTotal.Get()
	s.FenceProducer(5, 1)
	if got := fencePartitionsTotal.Get() - before; got != 3 {
		t.Fatalf("fence visited %d partitions, want 3", got)
	}
	for _, p := range []*Partition{p3, p7} {
		if ep, _, _, _ := p.ProducerState(5); ep != 1 {
			t.Fatalf("partition %d: epoch %d after fence, want 1", p.ID(), ep)
		}
		wantCode(t, "old epoch on a fenced partition", p.Append(makeBatch(t, tb{pid: 5, epoch: 0, seq: 1}), 0), codec.CodeInvalidProducerEpoch)
	}
	// A partition that never saw pid 5 rejects the old epoch through the store's fence memory.
	wantCode(t, "old epoch on a partition without state", top.Partition(20).Append(makeBatch(t, tb{pid: 5, epoch: 0, seq: 0}), 0), codec.CodeInvalidProducerEpoch)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := s.pids.len(); n != 0 {
		t.Fatalf("%d pids indexed after close", n)
	}
	// Reopened: the state loaded from snapshots is indexed again (p9's fence turned its guard
	// into an entry at epoch 1).
	s = openStore(t, dir)
	defer s.Close()
	if got := len(s.pids.partitions(5)); got != 3 {
		t.Fatalf("pid 5 indexed on %d partitions after reopen, want 3", got)
	}
}

// The aborted-transaction scan bound (maxSpan) shrinks when a long transaction's entry leaves
// the index with its segment (retention moves the log start past its marker).
func TestAbortedScanBoundShrinksWhenLongTxnLeavesIndex(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, map[string]string{"segment.ms": "1000", "retention.ms": "10000"})
	// Old segment (wall clock 0, timestamps 0): a long transaction of pid 1, aborted.
	txnAppend(t, p, 1, 0, 0, 1)
	for i := 0; i < 40; i++ {
		mustAppend(t, p, makeBatch(t, tb{ts: 0}), 0)
	}
	long := p.AppendMarker(1, 0, false, 0, 0)
	if long.Code != codec.CodeNone || syncWait(p, long.LastOffset+1) != nil {
		t.Fatal("long abort marker failed")
	}
	// New segment (the roll at wall clock 5000), recent timestamps: a short aborted transaction.
	mustAppend(t, p, makeBatch(t, tb{ts: 20_000}), 5000)
	short := txnAppend(t, p, 2, 0, 0, 1)
	sm := mustMarker(t, p, 2, 0, false, 0)
	if got, want := p.txn.maxSpan, long.LastOffset; got != want {
		t.Fatalf("maxSpan %d before retention, want %d", got, want)
	}
	s.RunRetention(time.UnixMilli(25_000))
	if p.LogStartOffset() <= long.LastOffset {
		t.Fatalf("retention kept the long transaction's segment (log start %d)", p.LogStartOffset())
	}
	if got, want := p.txn.maxSpan, sm.LastOffset-short.BaseOffset; got != want {
		t.Fatalf("maxSpan %d after the long transaction left the index, want %d", got, want)
	}
	ab := p.AbortedTransactions(p.LogStartOffset(), p.HighWatermark())
	if len(ab) != 1 || ab[0].ProducerID != 2 {
		t.Fatalf("aborted after retention: %+v", ab)
	}
}

// producer.id.expiration.ms: idempotent state idle that long is removed (also for a producer
// whose data retention already deleted), not while the producer has an open transaction; the
// snapshot written afterwards no longer carries it.
func TestProducerIDExpirationRemovesIdleState(t *testing.T) {
	dir := t.TempDir()
	cfg := func(c *Config) { c.ProducerIDExpiration = 10 * time.Second }
	s := openStore(t, dir, cfg)
	p := newPartition(t, s, map[string]string{"segment.ms": "1000", "retention.ms": "1000"})
	// Old segment (wall clock 0): pid 1 idempotent, pid 2 opens a transaction.
	mustAppend(t, p, makeBatch(t, tb{pid: 1, epoch: 0, seq: 0, ts: 0}), 0)
	txnAppend(t, p, 2, 0, 0, 1)
	// New segment (roll at wall clock 5000): pid 3, recent.
	mustAppend(t, p, makeBatch(t, tb{pid: 3, epoch: 0, seq: 0, ts: 15_000}), 15_000)

	// Retention deletes pid 1's data; its state stays (idle 5 s < 10 s).
	s.RunRetention(time.UnixMilli(5_000))
	if p.LogStartOffset() == 0 {
		t.Fatal("retention kept the old segment")
	}
	if _, _, _, ok := p.ProducerState(1); !ok {
		t.Fatal("state of pid 1 expired early")
	}
	s.RunRetention(time.UnixMilli(20_000))
	if _, _, _, ok := p.ProducerState(1); ok {
		t.Fatal("pid 1 idle for 20 s (data below the log start) kept")
	}
	if _, _, _, ok := p.ProducerState(2); !ok {
		t.Fatal("pid 2 with an open transaction expired")
	}
	if _, _, _, ok := p.ProducerState(3); !ok {
		t.Fatal("pid 3 idle for 5 s expired")
	}
	if len(s.pids.partitions(1)) != 0 {
		t.Fatal("expired pid still in the fence index")
	}
	// pid 1 starts over at sequence 0 (its window is gone).
	mustAppend(t, p, makeBatch(t, tb{pid: 1, epoch: 0, seq: 0, ts: 20_000}), 20_000)
	s.RunRetention(time.UnixMilli(40_000)) // everything idle; pid 2's transaction still open
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, cfg)
	defer s.Close()
	infos := s.Topic("t").Partition(0).Producers()
	if len(infos) != 1 || infos[0].ProducerID != 2 {
		t.Fatalf("producers after expiration and restart: %+v", infos)
	}
}

// TestResentMarkerIsNotWrittenTwice guards the resend path of cross-broker markers: a
// coordinator that lost the answer to a marker sends it again; the partition must not write a
// second control batch, must keep the LSO at the high watermark, must answer the retry only once
// the first copy is durable, and must still write a marker that differs (a newer coordinator
// epoch, or a newer producer epoch).
func TestResentMarkerIsNotWrittenTwice(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	txnAppend(t, p, 7, 0, 0, 2) // 0-1
	first := p.AppendMarker(7, 0, true, 3, 1000)
	wantCode(t, "marker", first, codec.CodeNone)
	// The resend arrives before the first copy is durable: it is answered with the log end,
	// and its Sync waits for the first copy.
	again := p.AppendMarker(7, 0, true, 3, 1001)
	wantCode(t, "resent marker", again, codec.CodeNone)
	if !again.Duplicate || again.LastOffset != first.LastOffset {
		t.Fatalf("resent marker %+v, want a duplicate at offset %d", again, first.LastOffset)
	}
	if err := syncWait(p, again.LastOffset+1); err != nil {
		t.Fatal(err)
	}
	if p.HighWatermark() < first.LastOffset+1 {
		t.Fatalf("resent marker answered before the first copy is durable: HWM %d", p.HighWatermark())
	}
	if leo := p.LogEndOffset(); leo != 3 {
		t.Fatalf("log end %d after a marker and its resend, want 3 (one control batch)", leo)
	}
	if lso, hwm := p.LastStableOffset(), p.HighWatermark(); lso != hwm {
		t.Fatalf("LSO %d, HWM %d after the resend", lso, hwm)
	}
	// An ABORT resend of an aborted transaction adds no second aborted-index entry either.
	txnAppend(t, p, 8, 0, 0, 1) // 3
	mustMarker(t, p, 8, 0, false, 3)
	mustMarker(t, p, 8, 0, false, 3)
	if got := p.AbortedTransactions(0, p.HighWatermark()); len(got) != 1 || got[0].ProducerID != 8 {
		t.Fatalf("aborted index %+v, want one entry for producer 8", got)
	}
	if leo := p.LogEndOffset(); leo != 5 {
		t.Fatalf("log end %d, want 5", leo)
	}
	// A newer coordinator (a slot successor re-driving) or a bumped producer epoch (a fence) is
	// not a resend: it is written and records its epochs.
	if r := mustMarker(t, p, 7, 0, true, 4); r.Duplicate || r.LastOffset != 5 {
		t.Fatalf("marker from a newer coordinator epoch %+v, want written at 5", r)
	}
	if r := mustMarker(t, p, 7, 1, false, 4); r.Duplicate || r.LastOffset != 6 {
		t.Fatalf("marker at a bumped producer epoch %+v, want written at 6", r)
	}
	wantCode(t, "marker from the older coordinator", p.AppendMarker(7, 1, false, 3, 1002), codec.CodeTransactionCoordinatorFenced)
	if lso, hwm := p.LastStableOffset(), p.HighWatermark(); lso != hwm || hwm != 7 {
		t.Fatalf("LSO %d, HWM %d, want both 7", lso, hwm)
	}
}
