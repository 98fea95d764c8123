package storage

import (
	"testing"

	"github.com/kaas-go/kaas/codec"
)

// TestLateSequencedMarkerDoesNotCloseNextTransaction: a COMMIT of transaction 1 that arrives
// again (a copy queued here while the coordinator's retry landed) after the producer's next
// transaction of the same epoch (TV1) started here is answered as a resend and not written, so
// transaction 2 stays open and is closed only by its own marker. A marker without a sequence
// (an Apache coordinator) keeps the old rules; a newer coordinator epoch is always written.
func TestLateSequencedMarkerDoesNotCloseNextTransaction(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	marker := func(commit bool, coordEpoch int32, seq uint64) AppendResult {
		t.Helper()
		r := p.AppendMarkerSeq(7, 0, commit, coordEpoch, seq, 1000)
		wantCode(t, "marker", r, codec.CodeNone)
		if err := syncWait(p, r.LastOffset+1); err != nil {
			t.Fatal(err)
		}
		return r
	}
	txnAppend(t, p, 7, 0, 0, 2) // 0-1: transaction 1
	if r := marker(true, 3, 10); r.Duplicate || r.LastOffset != 2 {
		t.Fatalf("marker of transaction 1: %+v", r)
	}
	if r := marker(true, 3, 10); !r.Duplicate {
		t.Fatalf("resend before anything else: %+v, want a duplicate", r)
	}
	txnAppend(t, p, 7, 0, 2, 1) // 3: transaction 2, same producer epoch
	resent := markersResentTotal.Get()
	if r := marker(true, 3, 10); !r.Duplicate || p.LogEndOffset() != 4 {
		t.Fatalf("late copy of transaction 1's marker: %+v, LEO %d; want a duplicate, LEO 4", r, p.LogEndOffset())
	}
	if markersResentTotal.Get() != resent+1 {
		t.Fatal("late copy not counted as a resend")
	}
	if lso := p.LastStableOffset(); lso != 3 {
		t.Fatalf("LSO %d after the late copy, want 3 (transaction 2 still open)", lso)
	}
	// Transaction 2 ends with its own marker (an abort): its record is aborted, not committed.
	if r := marker(false, 3, 11); r.Duplicate || r.LastOffset != 4 {
		t.Fatalf("marker of transaction 2: %+v", r)
	}
	if got := p.AbortedTransactions(0, p.HighWatermark()); len(got) != 1 || got[0].FirstOffset != 3 {
		t.Fatalf("aborted index %+v, want transaction 2 from offset 3", got)
	}
	// No sequence: the marker closes whatever is ongoing (Apache's rule, kept for its coordinators).
	txnAppend(t, p, 7, 0, 3, 1) // 5
	if r := marker(true, 3, 0); r.Duplicate || r.LastOffset != 6 {
		t.Fatalf("marker without a sequence: %+v, want written at 6", r)
	}
	// A newer coordinator epoch re-driving an already applied prepare is written (it raises the
	// coordinator epoch here and closes nothing).
	if r := marker(true, 4, 11); r.Duplicate || r.LastOffset != 7 {
		t.Fatalf("marker from a newer coordinator epoch: %+v, want written at 7", r)
	}
	if lso, hwm := p.LastStableOffset(), p.HighWatermark(); lso != hwm || hwm != 8 {
		t.Fatalf("LSO %d HWM %d, want 8", lso, hwm)
	}
}
