package group

import (
	"errors"
	"sync"
	"testing"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func (h *harness) txnCommit(tc TxnCommit, verify func(done func(int16)), offs ...storage.GroupOffset) int16 {
	h.t.Helper()
	ch := make(chan int16, 1)
	h.c.TxnOffsetCommit(tc, offs, verify, func(code int16) { ch <- code })
	return recv(h.t, ch, "TxnOffsetCommit")
}

func (h *harness) completeTxn(group string, pid int64, commit bool) error {
	h.t.Helper()
	ch := make(chan error, 1)
	h.c.CompleteTxnOffsets(group, pid, commit, func(err error) { ch <- err })
	return recv(h.t, ch, "CompleteTxnOffsets")
}

// fetch1 fetches one partition's offset and code.
func (h *harness) fetch1(group, topic string, p int32, requireStable bool) FetchedOffset {
	h.t.Helper()
	code, got := h.c.FetchOffsets(group, []storage.GroupPartition{gp(topic, p)}, requireStable)
	wantCode(h.t, "fetch", code, 0)
	return got[0]
}

func simpleTxn(group string, pid int64, epoch int16) TxnCommit {
	return TxnCommit{Commit: Commit{Group: group, Generation: -1}, ProducerID: pid, ProducerEpoch: epoch}
}

func off(topic string, p int32, o int64) storage.GroupOffset {
	return storage.GroupOffset{Topic: topic, Partition: p, Offset: o, LeaderEpoch: -1}
}

// require_stable answers UNSTABLE_OFFSET_COMMIT per partition while offsets are staged, plain
// fetches keep answering the committed offset, and the commit clears it and makes them visible.
func TestTxnOffsetCommitRequireStableThenCommit(t *testing.T) {
	h := newHarness(t)
	wantCode(t, "plain commit", h.commit(Commit{Group: "g", Generation: -1}, off("t", 0, 3)), 0)
	wantCode(t, "txn commit", h.txnCommit(simpleTxn("g", 100, 0), nil, off("t", 0, 10), off("t", 1, 20)), 0)

	if f := h.fetch1("g", "t", 0, true); f.Code != codec.CodeUnstableOffsetCommit || f.Offset != -1 {
		t.Fatalf("require_stable t/0 = %+v", f)
	}
	if f := h.fetch1("g", "t", 1, true); f.Code != codec.CodeUnstableOffsetCommit {
		t.Fatalf("require_stable t/1 = %+v", f)
	}
	if f := h.fetch1("g", "t", 2, true); f.Code != 0 || f.Offset != -1 {
		t.Fatalf("require_stable t/2 (nothing staged) = %+v", f)
	}
	if f := h.fetch1("g", "t", 0, false); f.Code != 0 || f.Offset != 3 {
		t.Fatalf("plain fetch must return the committed offset, got %+v", f)
	}
	if err := h.completeTxn("g", 100, true); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[int32]int64{0: 10, 1: 20} {
		if f := h.fetch1("g", "t", p, true); f.Code != 0 || f.Offset != want {
			t.Fatalf("after commit t/%d = %+v, want %d", p, f, want)
		}
	}
	// Completing again (a re-driven marker) is a no-op.
	if err := h.completeTxn("g", 100, true); err != nil {
		t.Fatal(err)
	}
	if err := h.completeTxn("never-seen", 100, false); err != nil {
		t.Fatal(err)
	}
	if f := h.fetch1("g", "t", 0, false); f.Offset != 10 {
		t.Fatalf("after redundant completion: %+v", f)
	}
}

func TestTxnOffsetCommitAbortDiscards(t *testing.T) {
	h := newHarness(t)
	wantCode(t, "plain commit", h.commit(Commit{Group: "g", Generation: -1}, off("t", 0, 3)), 0)
	wantCode(t, "txn commit", h.txnCommit(simpleTxn("g", 7, 2), nil, off("t", 0, 10)), 0)
	if err := h.completeTxn("g", 7, false); err != nil {
		t.Fatal(err)
	}
	if f := h.fetch1("g", "t", 0, true); f.Code != 0 || f.Offset != 3 {
		t.Fatalf("after abort: %+v", f)
	}
}

// A restart keeps staged offsets pending (durable, with their epoch); the transaction
// coordinator's reconcile then completes them.
func TestTxnOffsetCommitRestartKeepsPending(t *testing.T) {
	h := newHarness(t)
	wantCode(t, "txn commit", h.txnCommit(simpleTxn("g", 9, 5), nil, off("t", 0, 42)), 0)
	h.restart()
	if f := h.fetch1("g", "t", 0, true); f.Code != codec.CodeUnstableOffsetCommit {
		t.Fatalf("after restart: %+v", f)
	}
	// A group that only has pending offsets exists (Empty), like Apache after loading.
	if gs := h.c.ListGroups(nil); len(gs) != 1 || gs[0].Group != "g" || gs[0].State != "Empty" {
		t.Fatalf("list groups: %+v", gs)
	}
	// The epoch was persisted with the staging: an older epoch is fenced after the restart.
	wantCode(t, "older epoch after restart", h.txnCommit(simpleTxn("g", 9, 4), nil, off("t", 0, 1)), codec.CodeInvalidProducerEpoch)
	if err := h.completeTxn("g", 9, true); err != nil {
		t.Fatal(err)
	}
	h.restart()
	if f := h.fetch1("g", "t", 0, true); f.Code != 0 || f.Offset != 42 {
		t.Fatalf("after commit and restart: %+v", f)
	}
}

// KIP-447 fencing by group metadata, exactly like OffsetCommit's validation, plus the producer
// epoch: an older epoch than the highest seen for (group, producer) is INVALID_PRODUCER_EPOCH.
func TestTxnOffsetCommitFencing(t *testing.T) {
	h := newHarness(t)
	jr0 := h.join("g", "", withInstance("inst-1"))
	wantCode(t, "static join", jr0.ErrorCode, 0)
	id, gen := jr0.MemberID, jr0.Generation
	wantCode(t, "sync", h.sync("g", id, gen, map[string][]byte{id: []byte("a")}).ErrorCode, 0)
	tc := func(gen int32, member, inst string, epoch int16) TxnCommit {
		return TxnCommit{Commit: Commit{Group: "g", Generation: gen, MemberID: member, InstanceID: inst}, ProducerID: 1, ProducerEpoch: epoch}
	}
	o := off("t", 0, 5)
	wantCode(t, "current member", h.txnCommit(tc(gen, id, "inst-1", 3), nil, o), 0)
	wantCode(t, "stale generation", h.txnCommit(tc(gen-1, id, "inst-1", 3), nil, o), codec.CodeIllegalGeneration)
	wantCode(t, "unknown member", h.txnCommit(tc(gen, "zombie", "", 3), nil, o), codec.CodeUnknownMemberID)
	wantCode(t, "fenced instance", h.txnCommit(tc(gen, "zombie", "inst-1", 3), nil, o), codec.CodeFencedInstanceID)
	wantCode(t, "generation without member", h.txnCommit(tc(gen, "", "", 3), nil, o), codec.CodeUnknownMemberID)
	// v0-2 / manual assignment: no group check even though the group has members (Apache:
	// transactional commits are exempt from "only members may commit to a non-empty group").
	wantCode(t, "no group metadata", h.txnCommit(tc(-1, "", "", 3), nil, o), 0)
	// Producer epoch: older is fenced, equal and newer pass (and raise the floor).
	wantCode(t, "older epoch", h.txnCommit(tc(gen, id, "inst-1", 2), nil, o), codec.CodeInvalidProducerEpoch)
	wantCode(t, "newer epoch", h.txnCommit(tc(gen, id, "inst-1", 4), nil, o), 0)
	wantCode(t, "previous epoch now older", h.txnCommit(tc(-1, "", "", 3), nil, o), codec.CodeInvalidProducerEpoch)
	// Another producer is independent.
	other := tc(-1, "", "", 0)
	other.ProducerID = 2
	wantCode(t, "other producer", h.txnCommit(other, nil, o), 0)
	// The group check comes before the epoch check (Apache: member validation, then the append).
	wantCode(t, "stale generation and epoch", h.txnCommit(tc(gen+5, id, "inst-1", 0), nil, o), codec.CodeIllegalGeneration)
	// A member's commit is accepted while the group is CompletingRebalance (Apache's
	// doTxnCommitOffsets has no state check, unlike OffsetCommit's REBALANCE_IN_PROGRESS).
	ch := h.joinAsync("g", id, withInstance("inst-1"), withProtocols("range", "other"))
	jr := recv(t, ch, "rejoin")
	wantCode(t, "rejoin", jr.ErrorCode, 0)
	wantCode(t, "completing rebalance", h.txnCommit(tc(jr.Generation, id, "inst-1", 4), nil, o), 0)
	wantCode(t, "plain commit while completing", h.commit(Commit{Group: "g", Generation: jr.Generation, MemberID: id, InstanceID: "inst-1"}, o), codec.CodeRebalanceInProgress)
}

// The transaction-coordinator check runs before the group check, its code is answered as is, and
// nothing is staged when it fails.
func TestTxnOffsetCommitVerifyFirst(t *testing.T) {
	h := newHarness(t)
	fail := func(code int16) func(func(int16)) { return func(done func(int16)) { go done(code) } }
	wantCode(t, "not in txn", h.txnCommit(TxnCommit{Commit: Commit{Group: "g", Generation: 7, MemberID: "nobody"}, ProducerID: 1},
		fail(codec.CodeInvalidTxnState), off("t", 0, 1)), codec.CodeInvalidTxnState)
	if f := h.fetch1("g", "t", 0, true); f.Code != 0 {
		t.Fatalf("failed verification staged something: %+v", f)
	}
	wantCode(t, "verified, then group check", h.txnCommit(TxnCommit{Commit: Commit{Group: "g", Generation: 7, MemberID: "nobody"}, ProducerID: 1},
		fail(0), off("t", 0, 1)), codec.CodeUnknownMemberID)
}

// The ABA race: the transaction ends (CompleteTxnOffsets) after the coordinator said "in the
// transaction" but before the staging; the late staging is refused, never left pending for the
// producer's next transaction to commit.
func TestTxnOffsetCommitCompletedDuringVerification(t *testing.T) {
	h := newHarness(t)
	release := make(chan func(int16), 1)
	verify := func(done func(int16)) { release <- done }
	res := make(chan int16, 1)
	h.c.TxnOffsetCommit(simpleTxn("g", 5, 0), []storage.GroupOffset{off("t", 0, 99)}, verify, func(c int16) { res <- c })
	done := recv(t, release, "verification")
	if err := h.completeTxn("g", 5, true); err != nil {
		t.Fatal(err)
	}
	done(codec.CodeNone) // the (stale) verification succeeds
	wantCode(t, "late staging", recv(t, res, "TxnOffsetCommit"), codec.CodeInvalidTxnState)
	if f := h.fetch1("g", "t", 0, true); f.Code != 0 || f.Offset != -1 {
		t.Fatalf("late staging leaked: %+v", f)
	}
	// The guard is per transaction: the next one stages normally.
	wantCode(t, "next transaction", h.txnCommit(simpleTxn("g", 5, 0), verify2ok, off("t", 0, 100)), 0)
	if f := h.fetch1("g", "t", 0, true); f.Code != codec.CodeUnstableOffsetCommit {
		t.Fatalf("next transaction not staged: %+v", f)
	}
}

func verify2ok(done func(int16)) { go done(codec.CodeNone) }

// DeleteGroups of an Empty group with pending transactional offsets is allowed (Apache decides on
// membership only) and discards them; a later commit of that transaction resurrects nothing.
func TestTxnOffsetCommitDeleteGroupDropsPending(t *testing.T) {
	h := newHarness(t)
	wantCode(t, "txn commit", h.txnCommit(simpleTxn("g", 1, 0), nil, off("t", 0, 10)), 0)
	ch := make(chan int16, 1)
	h.c.DeleteGroup("g", func(c int16) { ch <- c })
	wantCode(t, "delete", recv(t, ch, "DeleteGroup"), 0)
	if err := h.completeTxn("g", 1, true); err != nil {
		t.Fatal(err)
	}
	if f := h.fetch1("g", "t", 0, true); f.Code != 0 || f.Offset != -1 {
		t.Fatalf("deleted group's pending offsets came back: %+v", f)
	}
	if gs := h.c.ListGroups(nil); len(gs) != 0 {
		t.Fatalf("groups after delete: %+v", gs)
	}
}

func TestTxnOffsetCommitClosed(t *testing.T) {
	h := newHarness(t)
	wantCode(t, "txn commit", h.txnCommit(simpleTxn("g", 1, 0), nil, off("t", 0, 10)), 0)
	h.c.Close()
	wantCode(t, "closed", h.txnCommit(simpleTxn("g", 1, 0), nil, off("t", 0, 10)), codec.CodeNotCoordinator)
	ch := make(chan error, 1)
	h.c.CompleteTxnOffsets("g", 1, true, func(err error) { ch <- err })
	if err := recv(t, ch, "complete"); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("complete on a closed coordinator: %v", err)
	}
}

// Many producers stage and complete concurrently in one group (run with -race).
func TestTxnOffsetCommitConcurrentProducers(t *testing.T) {
	h := newHarness(t)
	const producers, rounds = 8, 20
	var wg sync.WaitGroup
	for w := 0; w < producers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid := int64(w + 1)
			for i := 0; i < rounds; i++ {
				ch := make(chan int16, 1)
				h.c.TxnOffsetCommit(simpleTxn("g", pid, int16(i)), []storage.GroupOffset{off("t", int32(w), int64(i))}, verify2ok, func(c int16) { ch <- c })
				if c := <-ch; c != 0 {
					t.Errorf("producer %d round %d: code %d", w, i, c)
					return
				}
				errc := make(chan error, 1)
				h.c.CompleteTxnOffsets("g", pid, true, func(err error) { errc <- err })
				if err := <-errc; err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for w := int32(0); w < producers; w++ {
		if f := h.fetch1("g", "t", w, true); f.Code != 0 || f.Offset != rounds-1 {
			t.Fatalf("partition %d: %+v", w, f)
		}
	}
}
