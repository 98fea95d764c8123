package txn

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kaas-go/kaas/codec"
)

var t0 = time.UnixMilli(1_700_000_000_000)

// seqAlloc hands out start+1, start+2, ...
func seqAlloc(start int64) AllocPID {
	n := start
	return func() (int64, error) { n++; return n, nil }
}

func failAlloc() (int64, error) { return 0, errors.New("allocator down") }

// mk builds an entry in a given state; partitions/groups are added for open states.
func mk(state State, pid int64, epoch int16) *Entry {
	e := &Entry{TransactionalID: "tx", ProducerID: pid, ProducerEpoch: epoch, LastProducerID: NoProducerID,
		LastProducerEpoch: NoProducerEpoch, NextProducerID: NoProducerID, State: state, TimeoutMs: 60_000,
		LastUpdateMs: t0.UnixMilli(), TxnVersion: 1, CoordinatorEpoch: 3}
	if state.IsOpen() {
		e.TxnStartMs = t0.UnixMilli()
		e.Partitions = map[string][]int32{"t": {0, 2}}
		e.Groups = []string{"g"}
	}
	return e
}

func withPending(e *Entry) *Entry { e.pending = true; return e }

func tps(topic string, ps ...int32) []TopicPartitions {
	return []TopicPartitions{{Topic: topic, Partitions: ps}}
}

func TestKafkaCodesMatchKerr(t *testing.T) {
	for code, want := range map[int16]error{
		codec.CodeInvalidTxnState: kerr.InvalidTxnState, codec.CodeInvalidProducerIDMapping: kerr.InvalidProducerIDMapping,
		codec.CodeProducerFenced: kerr.ProducerFenced, codec.CodeConcurrentTransactions: kerr.ConcurrentTransactions,
		codec.CodeInvalidTransactionTimeout: kerr.InvalidTransactionTimeout, codec.CodeInvalidProducerEpoch: kerr.InvalidProducerEpoch,
		codec.CodeTransactionAbortable: kerr.TransactionAbortable, codec.CodeTransactionalIDNotFound: kerr.TransactionalIDNotFound,
	} {
		if got := kerr.ErrorForCode(code); got != want {
			t.Errorf("code %d is %v, want %v", code, got, want)
		}
	}
}

func TestStateNamesAndTransitions(t *testing.T) {
	names := []string{"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "PrepareEpochFence", "Dead"}
	for i, n := range names {
		if got := State(i).String(); got != n {
			t.Errorf("State(%d) = %q, want %q", i, got, n)
		}
		if s, ok := ParseState(n); !ok || s != State(i) {
			t.Errorf("ParseState(%q) = %v %v", n, s, ok)
		}
	}
	legal := map[[2]State]bool{}
	for _, p := range [][2]State{
		{Empty, Empty}, {CompleteCommit, Empty}, {CompleteAbort, Empty},
		{Empty, Ongoing}, {Ongoing, Ongoing}, {CompleteCommit, Ongoing}, {CompleteAbort, Ongoing},
		{Ongoing, PrepareCommit},
		{Ongoing, PrepareAbort}, {PrepareEpochFence, PrepareAbort}, {Empty, PrepareAbort}, {CompleteCommit, PrepareAbort}, {CompleteAbort, PrepareAbort},
		{PrepareCommit, CompleteCommit}, {PrepareAbort, CompleteAbort},
		{Ongoing, PrepareEpochFence},
		{Empty, Dead}, {CompleteCommit, Dead}, {CompleteAbort, Dead},
	} {
		legal[p] = true
	}
	for from := Empty; from <= Dead; from++ {
		for to := Empty; to <= Dead; to++ {
			want := legal[[2]State{from, to}]
			if got := validTransition(from, to); got != want {
				t.Errorf("validTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
			func() {
				defer func() {
					r := recover()
					if (r != nil) == want {
						t.Errorf("mustTransition(%s, %s) panicked=%v, legal=%v", from, to, r != nil, want)
					}
				}()
				mustTransition(from, to)
			}()
		}
	}
}

// ---------------------------------------------------------------------------------------------
// InitProducerId

func TestInitProducerIDErrors(t *testing.T) {
	cases := []struct {
		name string
		e    *Entry
		p    InitProducerIDParams
		want int16
	}{
		{"empty id", nil, InitProducerIDParams{TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, codec.CodeInvalidRequest},
		{"zero timeout", nil, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 0, ProducerID: -1, Version: 4}, codec.CodeInvalidTransactionTimeout},
		{"negative timeout", nil, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: -5, ProducerID: -1, Version: 4}, codec.CodeInvalidTransactionTimeout},
		{"timeout above max", nil, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 900_001, ProducerID: -1, Version: 4}, codec.CodeInvalidTransactionTimeout},
		{"timeout above configured max", nil, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 2000, MaxTimeoutMs: 1000, ProducerID: -1, Version: 4}, codec.CodeInvalidTransactionTimeout},
		{"prepare commit", mk(PrepareCommit, 7, 3), InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, codec.CodeConcurrentTransactions},
		{"prepare abort", mk(PrepareAbort, 7, 3), InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, codec.CodeConcurrentTransactions},
		{"pending", withPending(mk(PrepareAbort, 7, 3)), InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 99, ProducerEpoch: 0, Version: 4}, codec.CodeConcurrentTransactions},
		{"kip360 wrong pid", mk(Empty, 7, 3), InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 8, ProducerEpoch: 3, Version: 4}, codec.CodeProducerFenced},
		{"kip360 wrong pid v3", mk(Empty, 7, 3), InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 8, ProducerEpoch: 3, Version: 3}, codec.CodeInvalidProducerEpoch},
		{"kip360 stale epoch", mk(Empty, 7, 3), InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 1, Version: 4}, codec.CodeProducerFenced},
		{"kip360 stale epoch v3", mk(CompleteCommit, 7, 3), InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 1, Version: 3}, codec.CodeInvalidProducerEpoch},
		{"kip360 future epoch", mk(Empty, 7, 3), InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 9, Version: 5}, codec.CodeProducerFenced},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			next, res := InitProducerID(c.e, c.p, t0, seqAlloc(100))
			if res.Code != c.want {
				t.Fatalf("code = %d, want %d", res.Code, c.want)
			}
			if next != c.e || !res.Action.IsZero() || res.ProducerID != -1 || res.ProducerEpoch != -1 {
				t.Fatalf("error changed state: next=%p e=%p action=%+v res=%+v", next, c.e, res.Action, res)
			}
		})
	}
	if _, res := InitProducerID(nil, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: -1}, t0, failAlloc); res.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("allocator failure: code %d", res.Code)
	}
}

func TestInitProducerIDFirstAndRejoin(t *testing.T) {
	p := InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 60_000, ProducerID: -1, ProducerEpoch: -1, Version: 4}
	e, res := InitProducerID(nil, p, t0, seqAlloc(100))
	if res.Code != 0 || res.ProducerID != 101 || res.ProducerEpoch != 0 || e.State != Empty || e.TimeoutMs != 60_000 || !res.Action.IsZero() {
		t.Fatalf("first call: %+v %+v", res, e)
	}
	// A KIP-360 caller that has no entry yet (UNKNOWN_PRODUCER_ID recovery) is accepted too.
	if _, r := InitProducerID(nil, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1, ProducerID: 55, ProducerEpoch: 9, Version: 4}, t0, seqAlloc(100)); r.Code != 0 || r.ProducerEpoch != 0 {
		t.Fatalf("first call with expected pid: %+v", r)
	}
	for _, from := range []State{Empty, CompleteCommit, CompleteAbort} {
		cur := mk(from, 7, 3)
		cur.Partitions, cur.Groups, cur.TxnStartMs = nil, nil, 0
		next, r := InitProducerID(cur, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 5000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, t0.Add(time.Second), seqAlloc(100))
		if r.Code != 0 || r.ProducerID != 7 || r.ProducerEpoch != 4 || next.State != Empty || next.LastProducerEpoch != -1 || next.TimeoutMs != 5000 {
			t.Fatalf("rejoin from %s: %+v %+v", from, r, next)
		}
		if f := r.Action.Fence; f == nil || *f != (Fence{ProducerID: 7, OldEpoch: 3, NewEpoch: 4}) || r.Action.Markers != nil {
			t.Fatalf("rejoin from %s: fence %+v", from, r.Action)
		}
		if cur.ProducerEpoch != 3 || cur.State != from {
			t.Fatalf("input mutated: %+v", cur)
		}
	}
}

func TestInitProducerIDKIP360(t *testing.T) {
	cur := mk(Empty, 7, 3)
	cur.LastProducerEpoch = 2
	// Current epoch: bump, remember it for retry detection.
	next, r := InitProducerID(cur, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 3, Version: 4}, t0, seqAlloc(100))
	if r.Code != 0 || r.ProducerEpoch != 4 || next.LastProducerEpoch != 3 {
		t.Fatalf("expected current: %+v %+v", r, next)
	}
	// Retry of that successful call (lost response): same answer, no bump, no write.
	again, r2 := InitProducerID(next, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 3, Version: 4}, t0, seqAlloc(100))
	if r2.Code != 0 || r2.ProducerID != 7 || r2.ProducerEpoch != 4 || again != next || !r2.Action.IsZero() {
		t.Fatalf("retry: %+v", r2)
	}
	// After a bump without an expected epoch (a new producer), the old epoch is no retry.
	fresh, _ := InitProducerID(next, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, t0, seqAlloc(100))
	if _, r3 := InitProducerID(fresh, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 4, Version: 4}, t0, seqAlloc(100)); r3.Code != codec.CodeProducerFenced {
		t.Fatalf("zombie after new producer: %+v", r3)
	}
}

func TestInitProducerIDEpochExhaustion(t *testing.T) {
	cur := mk(CompleteCommit, 7, 32766)
	cur.Partitions, cur.Groups, cur.TxnStartMs = nil, nil, 0
	next, r := InitProducerID(cur, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 32766, Version: 4}, t0, seqAlloc(100))
	if r.Code != 0 || r.ProducerID != 101 || r.ProducerEpoch != 0 || next.LastProducerID != 7 || next.LastProducerEpoch != 32766 || next.State != Empty {
		t.Fatalf("rotation: %+v %+v", r, next)
	}
	if f := r.Action.Fence; f == nil || *f != (Fence{ProducerID: 7, OldEpoch: 32766, NewEpoch: 32767}) {
		t.Fatalf("rotation must retire the old id: %+v", r.Action)
	}
	// Retry carrying (old id, exhausted epoch) gets the rotated id again without a bump.
	again, r2 := InitProducerID(next, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 32766, Version: 4}, t0, seqAlloc(200))
	if r2.Code != 0 || r2.ProducerID != 101 || r2.ProducerEpoch != 0 || again != next {
		t.Fatalf("retry on overflow: %+v", r2)
	}
	// Old id with a non-exhausted epoch is a zombie.
	if _, r3 := InitProducerID(next, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 5, Version: 4}, t0, seqAlloc(200)); r3.Code != codec.CodeProducerFenced {
		t.Fatalf("old id, low epoch: %+v", r3)
	}
	// Without an expected pair the rotation happens too, and forgets the last epoch.
	n2, r4 := InitProducerID(cur, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, t0, seqAlloc(300))
	if r4.Code != 0 || r4.ProducerID != 301 || n2.LastProducerEpoch != -1 {
		t.Fatalf("rotation without expected: %+v %+v", r4, n2)
	}
	// Exhausted with an expected epoch other than the current one: only the last epoch is a retry.
	ex := mk(Empty, 7, 32766)
	ex.Partitions, ex.Groups, ex.LastProducerEpoch = nil, nil, 32765
	if n, r := InitProducerID(ex, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 32765, Version: 4}, t0, seqAlloc(0)); r.Code != 0 || r.ProducerEpoch != 32766 || n != ex {
		t.Fatalf("exhausted retry: %+v", r)
	}
	if _, r := InitProducerID(ex, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: 7, ProducerEpoch: 100, Version: 4}, t0, seqAlloc(0)); r.Code != codec.CodeProducerFenced {
		t.Fatalf("exhausted zombie: %+v", r)
	}
	if _, r := InitProducerID(cur, InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, t0, failAlloc); r.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("rotation alloc failure: %+v", r)
	}
}

// A rejoin during Ongoing fences and aborts the old session's transaction (its partitions
// and groups), answers 51, and the retry after completion gets a clean Empty entry.
func TestInitProducerIDRejoinDuringOngoing(t *testing.T) {
	cur := mk(Ongoing, 7, 3)
	cur.LastProducerEpoch = 2
	p := InitProducerIDParams{TransactionalID: "tx", TimeoutMs: 1000, ProducerID: -1, ProducerEpoch: -1, Version: 4}
	next, r := InitProducerID(cur, p, t0.Add(time.Second), seqAlloc(100))
	if r.Code != codec.CodeConcurrentTransactions || r.ProducerID != -1 {
		t.Fatalf("rejoin during ongoing: %+v", r)
	}
	if next.State != PrepareAbort || next.ProducerEpoch != 4 || next.LastProducerEpoch != -1 || !next.pending ||
		!slices.Equal(next.Partitions["t"], []int32{0, 2}) || !slices.Equal(next.Groups, []string{"g"}) {
		t.Fatalf("fenced entry: %+v", next)
	}
	if f := r.Action.Fence; f == nil || *f != (Fence{ProducerID: 7, OldEpoch: 3, NewEpoch: 4}) {
		t.Fatalf("fence: %+v", r.Action.Fence)
	}
	m := r.Action.Markers
	if m == nil || m.Commit || m.ProducerID != 7 || m.ProducerEpoch != 4 || m.CoordinatorEpoch != 3 ||
		len(m.Partitions) != 1 || !slices.Equal(m.Groups, []string{"g"}) {
		t.Fatalf("abort markers: %+v", m)
	}
	// The retried InitProducerId keeps answering 51 while the abort is in flight.
	if _, r := InitProducerID(next, p, t0, seqAlloc(100)); r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("retry during abort: %+v", r)
	}
	// A new-session AddPartitions cannot mix into the aborting transaction.
	if _, r := AddPartitions(next, AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 4, Partitions: tps("u", 1), Version: 3}, t0); r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("add during fence abort: %+v", r)
	}
	done, cr := Complete(next, CompleteParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 4, Commit: false}, t0)
	if cr.Code != 0 || done.State != CompleteAbort || !slices.Equal(cr.Groups, []string{"g"}) {
		t.Fatalf("complete abort: %+v %+v", cr, done)
	}
	fresh, r2 := InitProducerID(done, p, t0.Add(2*time.Second), seqAlloc(100))
	if r2.Code != 0 || r2.ProducerEpoch != 5 || fresh.State != Empty || len(fresh.Partitions) != 0 || len(fresh.Groups) != 0 || fresh.TxnStartMs != 0 {
		t.Fatalf("retry after abort: %+v %+v", r2, fresh)
	}
	// The new session's transaction starts its own clock.
	ongoing, _ := AddPartitions(fresh, AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 5, Partitions: tps("u", 1), Version: 3}, t0.Add(3*time.Second))
	if ongoing.TxnStartMs != t0.Add(3*time.Second).UnixMilli() || len(ongoing.Partitions) != 1 || ongoing.Groups != nil {
		t.Fatalf("new session txn: %+v", ongoing)
	}
}

// ---------------------------------------------------------------------------------------------
// AddPartitionsToTxn / implicit add / AddOffsetsToTxn / verification

func TestAddPartitionsErrors(t *testing.T) {
	cases := []struct {
		name string
		e    *Entry
		p    AddPartitionsParams
		want int16
	}{
		{"empty id", mk(Empty, 7, 3), AddPartitionsParams{ProducerID: 7, ProducerEpoch: 3, Version: 3}, codec.CodeInvalidRequest},
		{"unknown id", nil, AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Version: 3}, codec.CodeInvalidProducerIDMapping},
		{"pid mismatch", mk(Ongoing, 7, 3), AddPartitionsParams{TransactionalID: "tx", ProducerID: 8, ProducerEpoch: 3, Version: 3}, codec.CodeInvalidProducerIDMapping},
		{"epoch mismatch v2", mk(Ongoing, 7, 3), AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 2, Version: 2}, codec.CodeProducerFenced},
		{"epoch mismatch v1", mk(Ongoing, 7, 3), AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 2, Version: 1}, codec.CodeInvalidProducerEpoch},
		{"epoch mismatch v0", mk(Ongoing, 7, 3), AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 4, Version: 0}, codec.CodeInvalidProducerEpoch},
		{"prepare commit", mk(PrepareCommit, 7, 3), AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Version: 3}, codec.CodeConcurrentTransactions},
		{"prepare abort", mk(PrepareAbort, 7, 3), AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Version: 3}, codec.CodeConcurrentTransactions},
		{"implicit epoch mismatch any version", mk(Ongoing, 7, 3), AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 2, Version: 0, Implicit: true}, codec.CodeProducerFenced},
		// TV2: the producer already holds the next epoch while the previous markers are in flight.
		{"implicit pending next epoch", withPending(mk(PrepareCommit, 7, 4)), AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 4, Version: 5, Implicit: true}, codec.CodeConcurrentTransactions},
		{"implicit pending before pid", withPending(mk(PrepareCommit, 7, 4)), AddPartitionsParams{TransactionalID: "tx", ProducerID: 9, ProducerEpoch: 0, Version: 5, Implicit: true}, codec.CodeConcurrentTransactions},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.p.Partitions = []TopicPartitions{{Topic: "a", Partitions: []int32{1, 0}}, {Topic: "b", Partitions: []int32{5}}}
			next, res := AddPartitions(c.e, c.p, t0)
			if res.Code != c.want || next != c.e || len(res.Results) != 3 {
				t.Fatalf("res = %+v, want %d and no change", res, c.want)
			}
			for _, pr := range res.Results {
				if pr.Code != c.want {
					t.Fatalf("partition result %+v, want %d repeated", pr, c.want)
				}
			}
		})
	}
	// After a TV2 rotation the producer continues with the next id before completion.
	rot := withPending(mk(PrepareCommit, 7, 32767))
	rot.NextProducerID = 101
	rot.pending = false
	if _, r := AddPartitions(rot, AddPartitionsParams{TransactionalID: "tx", ProducerID: 101, ProducerEpoch: 0, Version: 5, Implicit: true, Partitions: tps("a", 0)}, t0); r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("implicit add with next pid: %+v", r)
	}
}

func TestAddPartitionsTransitions(t *testing.T) {
	for _, from := range []State{Empty, CompleteCommit, CompleteAbort} {
		cur := mk(from, 7, 3)
		cur.TxnStartMs = 0
		now := t0.Add(5 * time.Second)
		next, r := AddPartitions(cur, AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Version: 3,
			Partitions: []TopicPartitions{{Topic: "b", Partitions: []int32{3, 1, 3}}, {Topic: "a", Partitions: []int32{0}}}}, now)
		if r.Code != 0 || next.State != Ongoing || next.TxnStartMs != now.UnixMilli() || next.TxnVersion != 1 ||
			!slices.Equal(next.Partitions["b"], []int32{1, 3}) || !slices.Equal(next.Partitions["a"], []int32{0}) {
			t.Fatalf("add from %s: %+v %+v", from, r, next)
		}
		for _, pr := range r.Results {
			if pr.Code != 0 {
				t.Fatalf("partition %+v", pr)
			}
		}
		// Subset of an Ongoing transaction: no change at all (no slot write).
		same, r2 := AddPartitions(next, AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Version: 3, Partitions: tps("b", 3)}, now.Add(time.Second))
		if r2.Code != 0 || same != next {
			t.Fatalf("subset re-add changed the entry")
		}
		// Union keeps the clock.
		more, _ := AddPartitions(next, AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Version: 3, Partitions: tps("b", 2)}, now.Add(time.Minute))
		if !slices.Equal(more.Partitions["b"], []int32{1, 2, 3}) || more.TxnStartMs != now.UnixMilli() || !slices.Equal(next.Partitions["b"], []int32{1, 3}) {
			t.Fatalf("union: %+v (prev %+v)", more.Partitions, next.Partitions)
		}
	}
	// TV2 implicit add from Complete starts a new transaction with version 2.
	cur := mk(CompleteCommit, 7, 4)
	next, r := AddPartitions(cur, AddPartitionsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 4, Version: 5, Implicit: true, Partitions: tps("a", 0)}, t0)
	if r.Code != 0 || next.State != Ongoing || next.TxnVersion != 2 || len(next.Groups) != 0 {
		t.Fatalf("implicit add: %+v %+v", r, next)
	}
}

func TestVerify(t *testing.T) {
	ongoing := mk(Ongoing, 7, 3) // t: 0, 2
	parts := []TopicPartitions{{Topic: "t", Partitions: []int32{0, 1}}}
	cases := []struct {
		name      string
		e         *Entry
		p         VerifyParams
		top       int16
		perPart   []int16
		abortable bool
	}{
		{"in txn / not in txn", ongoing, VerifyParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3}, 0, []int16{0, codec.CodeInvalidTxnState}, false},
		{"abortable", ongoing, VerifyParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3}, 0, []int16{0, codec.CodeTransactionAbortable}, true},
		{"empty state", mk(Empty, 7, 3), VerifyParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3}, 0, []int16{codec.CodeInvalidTxnState, codec.CodeInvalidTxnState}, false},
		{"unknown", nil, VerifyParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3}, codec.CodeInvalidProducerIDMapping, nil, false},
		{"pid", ongoing, VerifyParams{TransactionalID: "tx", ProducerID: 8, ProducerEpoch: 3}, codec.CodeInvalidProducerIDMapping, nil, false},
		{"epoch", ongoing, VerifyParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 2}, codec.CodeProducerFenced, nil, false},
		{"prepare", mk(PrepareCommit, 7, 3), VerifyParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3}, codec.CodeConcurrentTransactions, nil, false},
		{"empty id", ongoing, VerifyParams{ProducerID: 7, ProducerEpoch: 3}, codec.CodeInvalidRequest, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.p.Partitions, c.p.Abortable = parts, c.abortable
			r := Verify(c.e, c.p)
			if r.Code != c.top {
				t.Fatalf("top = %d, want %d", r.Code, c.top)
			}
			want := c.perPart
			if want == nil {
				want = []int16{c.top, c.top}
			}
			for i, pr := range r.Results {
				if pr.Code != want[i] {
					t.Fatalf("partition %d = %d, want %d", pr.Partition, pr.Code, want[i])
				}
			}
		})
	}
}

func TestAddOffsets(t *testing.T) {
	cur := mk(Empty, 7, 3)
	next, r := AddOffsets(cur, AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Group: "g2", Version: 3}, t0)
	if r.Code != 0 || next.State != Ongoing || next.TxnStartMs != t0.UnixMilli() || !slices.Equal(next.Groups, []string{"g2"}) || len(next.Partitions) != 0 {
		t.Fatalf("add offsets from empty: %+v %+v", r, next)
	}
	n2, _ := AddOffsets(next, AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Group: "a", Version: 3}, t0)
	if !slices.Equal(n2.Groups, []string{"a", "g2"}) {
		t.Fatalf("groups not sorted: %v", n2.Groups)
	}
	if same, r := AddOffsets(n2, AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Group: "a", Version: 3}, t0); same != n2 || r.Code != 0 {
		t.Fatalf("re-add changed entry")
	}
	im, _ := AddOffsets(mk(CompleteAbort, 7, 3), AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Group: "g", Version: 5, Implicit: true}, t0)
	if im.TxnVersion != 2 || im.State != Ongoing {
		t.Fatalf("implicit group add: %+v", im)
	}
	for _, c := range []struct {
		e    *Entry
		p    AddOffsetsParams
		want int16
	}{
		{nil, AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Group: "g", Version: 3}, codec.CodeInvalidProducerIDMapping},
		{mk(Ongoing, 7, 3), AddOffsetsParams{TransactionalID: "tx", ProducerID: 1, ProducerEpoch: 3, Group: "g", Version: 3}, codec.CodeInvalidProducerIDMapping},
		{mk(Ongoing, 7, 3), AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 1, Group: "g", Version: 2}, codec.CodeProducerFenced},
		{mk(Ongoing, 7, 3), AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 1, Group: "g", Version: 1}, codec.CodeInvalidProducerEpoch},
		{mk(PrepareAbort, 7, 3), AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Group: "g", Version: 3}, codec.CodeConcurrentTransactions},
		{mk(Ongoing, 7, 3), AddOffsetsParams{ProducerID: 7, ProducerEpoch: 3, Group: "g", Version: 3}, codec.CodeInvalidRequest},
	} {
		if n, r := AddOffsets(c.e, c.p, t0); r.Code != c.want || n != c.e {
			t.Errorf("%+v: code %d, want %d", c.p, r.Code, c.want)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// EndTxn

func TestEndTxnV1(t *testing.T) {
	type want struct {
		code    int16
		state   State // expected state of the returned entry
		markers bool
	}
	cases := []struct {
		name   string
		e      *Entry
		commit bool
		pid    int64
		epoch  int16
		ver    int16
		want   want
	}{
		{"ongoing commit", mk(Ongoing, 7, 3), true, 7, 3, 3, want{0, PrepareCommit, true}},
		{"ongoing abort", mk(Ongoing, 7, 3), false, 7, 3, 4, want{0, PrepareAbort, true}},
		{"prepare commit + commit (redrive)", mk(PrepareCommit, 7, 3), true, 7, 3, 3, want{codec.CodeConcurrentTransactions, PrepareCommit, true}},
		{"prepare commit + commit in flight", withPending(mk(PrepareCommit, 7, 3)), true, 7, 3, 3, want{codec.CodeConcurrentTransactions, PrepareCommit, false}},
		{"prepare commit + abort", mk(PrepareCommit, 7, 3), false, 7, 3, 3, want{codec.CodeInvalidTxnState, PrepareCommit, false}},
		{"prepare abort + abort", mk(PrepareAbort, 7, 3), false, 7, 3, 3, want{codec.CodeConcurrentTransactions, PrepareAbort, true}},
		{"prepare abort + commit", mk(PrepareAbort, 7, 3), true, 7, 3, 3, want{codec.CodeInvalidTxnState, PrepareAbort, false}},
		{"complete commit + commit", mk(CompleteCommit, 7, 3), true, 7, 3, 3, want{0, CompleteCommit, false}},
		{"complete commit + abort", mk(CompleteCommit, 7, 3), false, 7, 3, 3, want{codec.CodeInvalidTxnState, CompleteCommit, false}},
		{"complete abort + abort", mk(CompleteAbort, 7, 3), false, 7, 3, 3, want{0, CompleteAbort, false}},
		{"complete abort + commit", mk(CompleteAbort, 7, 3), true, 7, 3, 3, want{codec.CodeInvalidTxnState, CompleteAbort, false}},
		{"empty commit", mk(Empty, 7, 3), true, 7, 3, 3, want{codec.CodeInvalidTxnState, Empty, false}},
		{"empty abort", mk(Empty, 7, 3), false, 7, 3, 3, want{codec.CodeInvalidTxnState, Empty, false}},
		{"epoch mismatch", mk(Ongoing, 7, 3), true, 7, 2, 3, want{codec.CodeProducerFenced, Ongoing, false}},
		{"epoch mismatch retry epoch is no retry in TV1", mk(CompleteCommit, 7, 4), true, 7, 3, 4, want{codec.CodeProducerFenced, CompleteCommit, false}},
		{"epoch mismatch v1", mk(Ongoing, 7, 3), true, 7, 2, 1, want{codec.CodeInvalidProducerEpoch, Ongoing, false}},
		{"pid mismatch", mk(Ongoing, 7, 3), true, 8, 3, 3, want{codec.CodeInvalidProducerIDMapping, Ongoing, false}},
		{"epoch checked before pending", withPending(mk(PrepareCommit, 7, 3)), true, 7, 2, 3, want{codec.CodeProducerFenced, PrepareCommit, false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			next, r := EndTxn(c.e, EndTxnParams{TransactionalID: "tx", ProducerID: c.pid, ProducerEpoch: c.epoch, Commit: c.commit, Version: c.ver}, t0, seqAlloc(100))
			if r.Code != c.want.code || next.State != c.want.state || (r.Action.Markers != nil) != c.want.markers {
				t.Fatalf("got code %d state %s markers %v, want %+v", r.Code, next.State, r.Action.Markers != nil, c.want)
			}
			if r.Action.Fence != nil || r.ProducerID != -1 || r.ProducerEpoch != -1 {
				t.Fatalf("TV1 must not bump or return ids: %+v", r)
			}
			if c.want.markers {
				m := r.Action.Markers
				if m.ProducerEpoch != 3 || m.Commit != (next.State == PrepareCommit) || !next.pending || len(m.Partitions) != 1 || len(m.Groups) != 1 {
					t.Fatalf("markers %+v pending %v", m, next.pending)
				}
				if next.ProducerEpoch != c.e.ProducerEpoch {
					t.Fatalf("TV1 bumped the epoch")
				}
			} else if next != c.e {
				t.Fatalf("non-transition changed the entry")
			}
		})
	}
	if _, r := EndTxn(nil, EndTxnParams{TransactionalID: "tx", ProducerID: 7, Version: 3}, t0, seqAlloc(0)); r.Code != codec.CodeInvalidProducerIDMapping {
		t.Fatalf("unknown id: %+v", r)
	}
	if _, r := EndTxn(mk(Ongoing, 7, 3), EndTxnParams{ProducerID: 7, ProducerEpoch: 3, Version: 3}, t0, seqAlloc(0)); r.Code != codec.CodeInvalidRequest {
		t.Fatalf("empty id: %+v", r)
	}
}

// TestEndTxnV2Table is the KIP-890 part 2 truth table (TransactionCoordinator.scala) plus the
// Ongoing / Prepare rows and KAFKA-20785.
func TestEndTxnV2Table(t *testing.T) {
	const (
		PF   = codec.CodeProducerFenced
		ITS  = codec.CodeInvalidTxnState
		NONE = codec.CodeNone
		CT   = codec.CodeConcurrentTransactions
		EB   = int16(-100) // ok with epoch bump (a new prepare)
	)
	// stored epoch is 5; Retry sends 4, Current sends 5.
	cases := []struct {
		state        State
		abortRetry   int16
		abortCurrent int16
		commitRetry  int16
		commitCurr   int16
	}{
		{Empty, PF, EB, PF, ITS},
		{CompleteAbort, NONE, EB, PF /* KAFKA-20785; Apache's table: ITS */, ITS},
		{CompleteCommit, ITS, EB, NONE, ITS},
		{Ongoing, PF, EB, PF, EB},
		{PrepareAbort, CT, PF, PF /* KAFKA-20785 */, PF},
		{PrepareCommit, ITS, PF, CT, PF},
	}
	for _, c := range cases {
		for _, col := range []struct {
			name   string
			commit bool
			epoch  int16
			want   int16
		}{
			{"abort/retry", false, 4, c.abortRetry}, {"abort/current", false, 5, c.abortCurrent},
			{"commit/retry", true, 4, c.commitRetry}, {"commit/current", true, 5, c.commitCurr},
		} {
			t.Run(c.state.String()+"/"+col.name, func(t *testing.T) {
				cur := mk(c.state, 7, 5)
				if c.state == Empty || c.state.IsComplete() {
					cur.Partitions, cur.Groups, cur.TxnStartMs = nil, nil, 0
				}
				next, r := EndTxn(cur, EndTxnParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: col.epoch, Commit: col.commit, Version: 5}, t0.Add(time.Second), seqAlloc(100))
				if col.want == EB {
					wantState := PrepareAbort
					if col.commit {
						wantState = PrepareCommit
					}
					if r.Code != 0 || next.State != wantState || next.ProducerEpoch != 6 || next.LastProducerEpoch != 5 ||
						r.ProducerID != 7 || r.ProducerEpoch != 6 || !next.pending || next.TxnVersion != 2 {
						t.Fatalf("want epoch bump prepare, got %+v %+v", r, next)
					}
					if f := r.Action.Fence; f == nil || *f != (Fence{ProducerID: 7, OldEpoch: 5, NewEpoch: 6}) {
						t.Fatalf("fence %+v", r.Action.Fence)
					}
					if m := r.Action.Markers; m == nil || m.ProducerEpoch != 6 || m.Commit != col.commit {
						t.Fatalf("markers must carry the bumped epoch: %+v", m)
					}
					if c.state != Ongoing && (len(next.Partitions) != 0 || next.TxnStartMs != t0.Add(time.Second).UnixMilli()) {
						t.Fatalf("empty abort: %+v", next)
					}
					if c.state == Ongoing && len(r.Action.Markers.Partitions) != 1 {
						t.Fatalf("ongoing prepare lost its partitions")
					}
					return
				}
				if r.Code != col.want {
					t.Fatalf("code = %d, want %d", r.Code, col.want)
				}
				if col.want == NONE {
					if r.ProducerID != 7 || r.ProducerEpoch != 5 || next != cur {
						t.Fatalf("retry must answer the current id/epoch without change: %+v", r)
					}
					return
				}
				if r.ProducerID != -1 || r.ProducerEpoch != -1 {
					t.Fatalf("error must carry -1 ids: %+v", r)
				}
				if col.want == CT {
					// Not in flight: the retry re-drives the markers at the stored epoch.
					if m := r.Action.Markers; m == nil || m.ProducerEpoch != 5 || !next.pending || next.State != c.state {
						t.Fatalf("redrive: %+v", r.Action)
					}
					return
				}
				if next != cur || !r.Action.IsZero() {
					t.Fatalf("error changed state")
				}
			})
		}
	}
}

func TestEndTxnV2Ordering(t *testing.T) {
	// KAFKA-18464: a pending transition answers 51 before the pid and epoch are looked at (the
	// producer already holds its next epoch, maybe its next id).
	pend := withPending(mk(PrepareCommit, 7, 6))
	for _, p := range []EndTxnParams{{ProducerID: 7, ProducerEpoch: 6}, {ProducerID: 101, ProducerEpoch: 0}, {ProducerID: 7, ProducerEpoch: 1}} {
		p.TransactionalID, p.Version, p.Commit = "tx", 5, false
		if next, r := EndTxn(pend, p, t0, seqAlloc(0)); r.Code != codec.CodeConcurrentTransactions || next != pend || !r.Action.IsZero() {
			t.Fatalf("%+v: %+v", p, r)
		}
	}
	if _, r := EndTxn(mk(Ongoing, 7, 6), EndTxnParams{TransactionalID: "tx", ProducerID: 8, ProducerEpoch: 6, Version: 5}, t0, seqAlloc(0)); r.Code != codec.CodeInvalidProducerIDMapping {
		t.Fatalf("pid mismatch: %+v", r)
	}
	if _, r := EndTxn(nil, EndTxnParams{TransactionalID: "tx", ProducerID: 8, ProducerEpoch: 6, Version: 5}, t0, seqAlloc(0)); r.Code != codec.CodeInvalidProducerIDMapping {
		t.Fatalf("unknown: %+v", r)
	}
	if _, r := EndTxn(mk(Ongoing, 7, 32766), EndTxnParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 32766, Commit: true, Version: 5}, t0, failAlloc); r.Code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("alloc failure at exhaustion: %+v", r)
	}
}

// KAFKA-20785: the reaper aborted (epoch bump) while the producer was committing; its commit at
// the pre-abort epoch is PRODUCER_FENCED in every phase of the abort.
func TestEndTxnV2CommitRacingTimeoutAbort(t *testing.T) {
	cur := mk(Ongoing, 7, 5)
	cur.TimeoutMs = 1000
	aborting, act, ok := ReaperAbort(cur, t0.Add(2*time.Second), seqAlloc(0))
	if !ok || aborting.ProducerEpoch != 6 {
		t.Fatalf("reaper: %+v", act)
	}
	commit := EndTxnParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 5, Commit: true, Version: 5}
	if _, r := EndTxn(aborting, commit, t0, seqAlloc(0)); r.Code != codec.CodeConcurrentTransactions {
		t.Fatalf("while markers in flight: %+v", r)
	}
	released := aborting.clone()
	released.pending = false
	if _, r := EndTxn(released, commit, t0, seqAlloc(0)); r.Code != codec.CodeProducerFenced {
		t.Fatalf("prepared abort: %+v", r)
	}
	done, _ := Complete(aborting, CompleteParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 6}, t0)
	if _, r := EndTxn(done, commit, t0, seqAlloc(0)); r.Code != codec.CodeProducerFenced {
		t.Fatalf("completed abort: %+v", r)
	}
}

// Epoch exhaustion under TV2: the prepare bumps to Short.MaxValue with the next id allocated, the
// markers carry (old id, MaxValue), completion switches to (new id, 0), and a retry of the
// EndTxn that lost its response is recognised (retryOnOverflow).
func TestEndTxnV2EpochExhaustion(t *testing.T) {
	cur := mk(Ongoing, 7, 32766)
	next, r := EndTxn(cur, EndTxnParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 32766, Commit: true, Version: 5}, t0, seqAlloc(100))
	if r.Code != 0 || r.ProducerID != 101 || r.ProducerEpoch != 0 || next.ProducerID != 7 || next.ProducerEpoch != 32767 || next.NextProducerID != 101 {
		t.Fatalf("prepare at exhaustion: %+v %+v", r, next)
	}
	if m := r.Action.Markers; m.ProducerID != 7 || m.ProducerEpoch != 32767 {
		t.Fatalf("markers: %+v", m)
	}
	done, cr := Complete(next, CompleteParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 32767, Commit: true}, t0)
	if cr.Code != 0 || done.ProducerID != 101 || done.ProducerEpoch != 0 || done.LastProducerID != 7 || done.LastProducerEpoch != 32766 || done.NextProducerID != -1 {
		t.Fatalf("complete rotation: %+v %+v", cr, done)
	}
	retry := EndTxnParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 32766, Commit: true, Version: 5}
	if same, r := EndTxn(done, retry, t0, seqAlloc(200)); r.Code != 0 || r.ProducerID != 101 || r.ProducerEpoch != 0 || same != done {
		t.Fatalf("retry on overflow: %+v", r)
	}
	retry.Commit = false
	if _, r := EndTxn(done, retry, t0, seqAlloc(200)); r.Code != codec.CodeInvalidTxnState {
		t.Fatalf("abort retry vs complete commit: %+v", r)
	}
	// The new id carries on normally.
	on, _ := AddPartitions(done, AddPartitionsParams{TransactionalID: "tx", ProducerID: 101, ProducerEpoch: 0, Version: 5, Implicit: true, Partitions: tps("a", 1)}, t0)
	if _, r := EndTxn(on, EndTxnParams{TransactionalID: "tx", ProducerID: 101, ProducerEpoch: 0, Commit: true, Version: 5}, t0, seqAlloc(300)); r.Code != 0 || r.ProducerID != 101 || r.ProducerEpoch != 1 {
		t.Fatalf("next txn on rotated id: %+v", r)
	}
}

// ---------------------------------------------------------------------------------------------
// Complete, reaper, hanging, describe/list

func TestComplete(t *testing.T) {
	for _, commit := range []bool{true, false} {
		st := PrepareAbort
		if commit {
			st = PrepareCommit
		}
		cur := withPending(mk(st, 7, 3))
		cur.Groups = []string{"a", "b"}
		next, r := Complete(cur, CompleteParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Commit: commit}, t0.Add(time.Minute))
		wantState := CompleteAbort
		if commit {
			wantState = CompleteCommit
		}
		if r.Code != 0 || r.Commit != commit || !slices.Equal(r.Groups, []string{"a", "b"}) || next.State != wantState ||
			next.Partitions != nil || next.Groups != nil || next.TxnStartMs != cur.TxnStartMs || cur.TxnStartMs == 0 || next.pending || next.ProducerEpoch != 3 {
			t.Fatalf("complete commit=%v: %+v %+v", commit, r, next)
		}
		if len(cur.Groups) != 2 || cur.State != st {
			t.Fatalf("input mutated")
		}
	}
	for _, c := range []struct {
		e    *Entry
		p    CompleteParams
		want int16
	}{
		{nil, CompleteParams{ProducerID: 7, ProducerEpoch: 3, Commit: true}, codec.CodeInvalidProducerIDMapping},
		{mk(PrepareCommit, 7, 3), CompleteParams{ProducerID: 8, ProducerEpoch: 3, Commit: true}, codec.CodeInvalidProducerIDMapping},
		{mk(PrepareCommit, 7, 3), CompleteParams{ProducerID: 7, ProducerEpoch: 2, Commit: true}, codec.CodeProducerFenced},
		{mk(PrepareCommit, 7, 3), CompleteParams{ProducerID: 7, ProducerEpoch: 3, Commit: false}, codec.CodeInvalidTxnState},
		{mk(CompleteCommit, 7, 3), CompleteParams{ProducerID: 7, ProducerEpoch: 3, Commit: true}, codec.CodeInvalidTxnState},
		{mk(Ongoing, 7, 3), CompleteParams{ProducerID: 7, ProducerEpoch: 3, Commit: true}, codec.CodeInvalidTxnState},
	} {
		if n, r := Complete(c.e, c.p, t0); r.Code != c.want || n != c.e {
			t.Errorf("%+v: code %d want %d", c.p, r.Code, c.want)
		}
	}
}

func TestReaperAbort(t *testing.T) {
	cur := mk(Ongoing, 7, 3)
	cur.TimeoutMs = 1000
	if n, _, ok := ReaperAbort(cur, t0.Add(999*time.Millisecond), seqAlloc(0)); ok || n != cur {
		t.Fatalf("aborted before the deadline")
	}
	next, act, ok := ReaperAbort(cur, t0.Add(time.Second), seqAlloc(0))
	if !ok || next.State != PrepareAbort || next.ProducerEpoch != 4 || !next.pending ||
		!slices.Equal(next.Partitions["t"], []int32{0, 2}) || !slices.Equal(next.Groups, []string{"g"}) {
		t.Fatalf("reaper abort: %+v", next)
	}
	if act.Fence == nil || *act.Fence != (Fence{ProducerID: 7, OldEpoch: 3, NewEpoch: 4}) || act.Markers == nil || act.Markers.Commit || act.Markers.ProducerEpoch != 4 {
		t.Fatalf("reaper action must fence: %+v", act)
	}
	// In flight or not Ongoing: nothing to do.
	if _, _, ok := ReaperAbort(next, t0.Add(time.Hour), seqAlloc(0)); ok {
		t.Fatalf("reaped a prepared txn")
	}
	if _, _, ok := ReaperAbort(nil, t0, seqAlloc(0)); ok {
		t.Fatalf("reaped nil")
	}

	// An offsets-only transaction is aborted and completed too.
	off := mk(Empty, 7, 3)
	off, _ = AddOffsets(off, AddOffsetsParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 3, Group: "g", Version: 3}, t0)
	off.TimeoutMs = 10
	aborted, act, ok := ReaperAbort(off, t0.Add(time.Second), seqAlloc(0))
	if !ok || act.Markers == nil || len(act.Markers.Partitions) != 0 || !slices.Equal(act.Markers.Groups, []string{"g"}) {
		t.Fatalf("offset-only reaper abort: %+v", act)
	}
	done, cr := Complete(aborted, CompleteParams{TransactionalID: "tx", ProducerID: act.Markers.ProducerID, ProducerEpoch: act.Markers.ProducerEpoch}, t0)
	if cr.Code != 0 || done.State != CompleteAbort || !slices.Equal(cr.Groups, []string{"g"}) {
		t.Fatalf("offset-only complete: %+v", cr)
	}

	// Exhaustion: the fence reaches 32767 and the id rotates on completion; never epoch 0 on the
	// same id.
	hi := mk(Ongoing, 7, 32766)
	hi.TimeoutMs = 1
	n, act, ok := ReaperAbort(hi, t0.Add(time.Second), seqAlloc(100))
	if !ok || n.ProducerEpoch != 32767 || n.NextProducerID != 101 || act.Fence.NewEpoch != 32767 {
		t.Fatalf("exhausted reaper abort: %+v %+v", n, act)
	}
	d, _ := Complete(n, CompleteParams{TransactionalID: "tx", ProducerID: 7, ProducerEpoch: 32767}, t0)
	if d.ProducerID != 101 || d.ProducerEpoch != 0 || d.LastProducerID != 7 {
		t.Fatalf("rotation after exhausted abort: %+v", d)
	}
	top := mk(Ongoing, 7, 32767) // cannot happen by construction; still must not wrap
	top.TimeoutMs = 1
	n, act, ok = ReaperAbort(top, t0.Add(time.Second), seqAlloc(100))
	if !ok || n.ProducerEpoch != 32767 || n.NextProducerID != 101 {
		t.Fatalf("abort at max epoch: %+v %+v", n, act)
	}
	if _, _, ok := ReaperAbort(top, t0.Add(time.Second), failAlloc); ok {
		t.Fatalf("abort at max epoch without an id must wait")
	}
}

func TestHanging(t *testing.T) {
	cur := mk(PrepareCommit, 7, 3)
	cur.TimeoutMs = 1000
	if _, h := Hanging(cur, t0.Add(time.Second)); h {
		t.Fatalf("hanging at exactly the timeout")
	}
	if d, h := Hanging(cur, t0.Add(3*time.Second)); !h || d != 3*time.Second {
		t.Fatalf("hanging: %v %v", d, h)
	}
	if _, h := Hanging(mk(CompleteCommit, 7, 3), t0.Add(time.Hour)); h {
		t.Fatalf("complete txn reported hanging")
	}
}

func TestDescribeAndListFilter(t *testing.T) {
	if d := Describe("nope", nil); d.Code != codec.CodeTransactionalIDNotFound {
		t.Fatalf("unknown: %+v", d)
	}
	d := Describe("tx", mk(Ongoing, 7, 3))
	if d.Code != 0 || d.State != "Ongoing" || d.ProducerID != 7 || d.ProducerEpoch != 3 || d.StartTimeMs != t0.UnixMilli() ||
		len(d.Topics) != 1 || !slices.Equal(d.Topics[0].Partitions, []int32{0, 2}) || d.TimeoutMs != 60_000 {
		t.Fatalf("describe: %+v", d)
	}
	if d := Describe("tx", mk(Empty, 7, 3)); d.State != "Empty" || d.StartTimeMs != -1 {
		t.Fatalf("describe empty: %+v", d)
	}
	now := t0.Add(10 * time.Second)
	cases := []struct {
		f    ListFilter
		e    *Entry
		want bool
	}{
		{ListFilter{DurationMs: -1}, mk(Empty, 7, 3), true},
		{ListFilter{DurationMs: -1}, mk(Dead, 7, 3), false},
		{ListFilter{States: []string{"Ongoing"}, DurationMs: -1}, mk(Ongoing, 7, 3), true},
		{ListFilter{States: []string{"Ongoing"}, DurationMs: -1}, mk(Empty, 7, 3), false},
		{ListFilter{ProducerIDs: []int64{7}, DurationMs: -1}, mk(Empty, 7, 3), true},
		{ListFilter{ProducerIDs: []int64{8}, DurationMs: -1}, mk(Empty, 7, 3), false},
		{ListFilter{DurationMs: 5_000}, mk(Ongoing, 7, 3), true},
		{ListFilter{DurationMs: 10_000}, mk(Ongoing, 7, 3), false},
	}
	for i, c := range cases {
		if got := c.f.Match(c.e, now); got != c.want {
			t.Errorf("case %d: Match = %v, want %v", i, got, c.want)
		}
	}
	if u := (ListFilter{States: []string{"Ongoing", "Bogus"}}).UnknownStates(); !slices.Equal(u, []string{"Bogus"}) {
		t.Fatalf("unknown states: %v", u)
	}
}
