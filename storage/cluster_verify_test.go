package storage

import (
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// TestTakeOverDropsVerificationGuards: KIP-890 verification state is per leader epoch. A guard
// taken while this broker led the partition at epoch 1 (a verification in flight when the
// partition was handed away) opens nothing after the partition comes back at epoch 3: the old
// handle answers NOT_LEADER_OR_FOLLOWER, the new partition knows no guard (INVALID_TXN_STATE
// with the stale token) and hands out a fresh one, which then opens the transaction.
func TestTakeOverDropsVerificationGuards(t *testing.T) {
	dir := t.TempDir()
	a := openClusterStore(t, dir, 1, "a1", nil)
	defer a.Close()
	const pid = 42
	p1, _ := takeOver(t, a, 1, Handover{})
	stale, ongoing := p1.VerificationGuard(pid, 0)
	if stale == 0 || ongoing {
		t.Fatalf("first guard: %d ongoing %v", stale, ongoing)
	}
	rec, err := a.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	if r := p1.AppendTxn(makeBatch(t, tb{pid: pid, txn: true}), now, stale); r.Code != codec.CodeNotLeaderForPartition {
		t.Fatalf("append through the released handle: code %d, want 6", r.Code)
	}
	p3, _ := takeOver(t, a, 3, Handover{Release: &rec, PrevInc: "a1", PrevEpoch: 1})
	if p3 == p1 {
		t.Fatal("the takeover reused the released partition")
	}
	if r := p3.AppendTxn(makeBatch(t, tb{pid: pid, txn: true}), now, stale); r.Code != codec.CodeInvalidTxnState {
		t.Fatalf("append with the previous epoch's guard: code %d, want INVALID_TXN_STATE", r.Code)
	}
	if p3.LogEndOffset() != 0 {
		t.Fatalf("stale guard appended: log end %d", p3.LogEndOffset())
	}
	fresh, ongoing := p3.VerificationGuard(pid, 0)
	if fresh == 0 || fresh == stale || ongoing {
		t.Fatalf("guard after the takeover: %d (stale %d) ongoing %v", fresh, stale, ongoing)
	}
	if r := p3.AppendTxn(makeBatch(t, tb{pid: pid, txn: true}), now, fresh); r.Code != codec.CodeNone {
		t.Fatalf("append with the fresh guard: code %d", r.Code)
	}
	if _, ongoing := p3.VerificationGuard(pid, 0); !ongoing {
		t.Fatal("the verified append did not open the transaction")
	}
}
