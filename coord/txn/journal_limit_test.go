package txn

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kaas-go/kaas/codec"
)

// lowerRecordLimit makes the journal's record limit (reader and writer alike) small enough for a
// test to reach with a few hundred partitions.
func lowerRecordLimit(t *testing.T, n int) {
	t.Helper()
	old := journalFormat.MaxLen
	journalFormat.MaxLen = n
	t.Cleanup(func() { journalFormat.MaxLen = old })
}

// TestJournalRecordLimitEnforcedAtWrite: a transaction grows (AddPartitionsToTxn, then
// AddOffsetsToTxn) until its record would pass the limit the journal reader enforces. Every
// change up to just under the limit is acknowledged and survives a crash and replay; the change
// that would pass it is refused with INVALID_REQUEST before anything changes, so nothing
// acknowledged is unreadable after a restart.
func TestJournalRecordLimitEnforcedAtWrite(t *testing.T) {
	for _, what := range []string{"partitions", "groups"} {
		t.Run(what, func(t *testing.T) {
			const limit = 4 << 10
			lowerRecordLimit(t, limit)
			dir := t.TempDir()
			tc, _ := startCoord(t, dir, nil)
			const tid = "big-txn"
			r, err := call(t, func(d func(InitProducerIDResult, error)) {
				tc.InitProducerID(InitProducerIDParams{TransactionalID: tid, TimeoutMs: 60_000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
			})
			if err != nil || r.Code != 0 {
				t.Fatal(r, err)
			}
			grow := func(step int) error {
				if what == "partitions" {
					ps := make([]int32, 16)
					for i := range ps {
						ps[i] = int32(step*16 + i)
					}
					a, err := call(t, func(d func(AddPartitionsResult, error)) {
						tc.AddPartitions(AddPartitionsParams{TransactionalID: tid, ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch,
							Partitions: []TopicPartitions{{Topic: fmt.Sprintf("topic-%03d", step%7), Partitions: ps}}, Version: 3}, d)
					})
					if err == nil && a.Code != 0 {
						t.Fatalf("add partitions: %+v", a)
					}
					return err
				}
				a, err := call(t, func(d func(AddOffsetsResult, error)) {
					tc.AddOffsets(AddOffsetsParams{TransactionalID: tid, ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch,
						Group: fmt.Sprintf("consumer-group-%05d", step), Version: 3}, d)
				})
				if err == nil && a.Code != 0 {
					t.Fatalf("add offsets: %+v", a)
				}
				return err
			}
			var refused error
			acked := 0
			for step := 0; step < 10_000; step++ {
				if refused = grow(step); refused != nil {
					break
				}
				acked++
			}
			if !errors.Is(refused, ErrRecordTooLarge) || ErrorCode(refused) != codec.CodeInvalidRequest {
				t.Fatalf("after %d changes: %v (code %d), want ErrRecordTooLarge → 42", acked, refused, ErrorCode(refused))
			}
			before := entriesOf(tc.Coordinator)[tid]
			// The last acknowledged record is just under the limit: one more step would pass it.
			got := appendRecord(nil, &journalRec{batch: 1, last: true, slot: SlotFor(tid), seq: 1, tid: tid, entry: &before})
			if n := len(got) - journalFrameHdr; n > limit || n < limit-400 {
				t.Fatalf("last acknowledged record is %d bytes, limit %d", n, limit)
			}
			// The refused op changed nothing, and later small ops still work.
			if err := grow(acked); !errors.Is(err, ErrRecordTooLarge) {
				t.Fatalf("retry: %v", err)
			}
			e, err := call(t, func(d func(EndTxnResult, error)) {
				tc.prepareEndTxn(EndTxnParams{TransactionalID: tid, ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch, Commit: true, Version: 3}, d)
			})
			if err != nil || e.Code != 0 {
				t.Fatalf("end txn of the big transaction: %+v %v", e, err)
			}
			tc.Coordinator.crash()
			want := entriesOf(tc.Coordinator)
			if n := len(want[tid].Partitions) + len(want[tid].Groups); n == 0 || want[tid].State != PrepareCommit {
				t.Fatalf("state before the crash: %+v", want[tid])
			}

			// Restart: the replay reads every acknowledged record, the refused change is not there.
			// (The restart re-drives the prepared commit, so only its lists are compared.)
			tc2, _ := startCoord(t, dir, nil)
			tc2.Coordinator.crash()
			after := entriesOf(tc2.Coordinator)[tid]
			if fmt.Sprint(after.Partitions, after.Groups) != fmt.Sprint(want[tid].Partitions, want[tid].Groups) ||
				(after.State != PrepareCommit && after.State != CompleteCommit) {
				t.Fatalf("after replay: %v %v %s, want %v %v", after.Partitions, after.Groups, after.State, want[tid].Partitions, want[tid].Groups)
			}
			if refusedTotal := journalRecordsRefused.Get(); refusedTotal == 0 {
				t.Fatal("refusals not counted")
			}
		})
	}
}

// TestRecordTooLargeIsExact: the write-time check never lets through a record the reader would
// refuse, and refuses only records within a few varints of the limit.
func TestRecordTooLargeIsExact(t *testing.T) {
	lowerRecordLimit(t, 2<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		e := &Entry{TransactionalID: "x", ProducerID: rng.Int64(), State: Ongoing, TxnVersion: 2, Partitions: map[string][]int32{}}
		for t := 0; t < 1+rng.IntN(5); t++ {
			ps := make([]int32, 0, 200)
			for p := int32(0); len(ps) < rng.IntN(200); p += 1 + rng.Int32N(1<<20) {
				ps = append(ps, p)
			}
			e.Partitions[strings.Repeat("t", 1+rng.IntN(200))+fmt.Sprint(t)] = ps
		}
		for g := 0; g < rng.IntN(20); g++ {
			e.Groups = append(e.Groups, fmt.Sprintf("g%05d", g))
		}
		rec := &journalRec{batch: 1<<63 + 1, last: true, slot: SlotFor("x"), seq: 1<<63 + 1, epoch: -1 << 31, tid: "x", entry: e}
		n := len(appendRecord(nil, rec)) - journalFrameHdr
		tooLarge := recordTooLarge("x", e)
		if !tooLarge && n > journalFormat.MaxLen {
			t.Fatalf("a %d-byte record passed the check (limit %d)", n, journalFormat.MaxLen)
		}
		if tooLarge && n < journalFormat.MaxLen-40 {
			t.Fatalf("a %d-byte record refused (limit %d)", n, journalFormat.MaxLen)
		}
	}
}

// TestEncodeBatchRefusesOversizedRecord: whatever produced it, a record over the reader's limit
// never reaches the disk; the batch fails before its write.
func TestEncodeBatchRefusesOversizedRecord(t *testing.T) {
	lowerRecordLimit(t, 256)
	const tid = "oversized"
	slot := SlotFor(tid)
	w := &worker{slots: map[int]*slotState{slot: {entries: map[string]*Entry{}}}}
	e := &Entry{TransactionalID: tid, State: Ongoing, TxnVersion: 2, Partitions: map[string][]int32{strings.Repeat("t", 300): {0}}}
	if _, err := w.encodeBatch([]pendingRec{{slot: slot, tid: tid, entry: e, seq: 1}}, 1); err == nil || !strings.Contains(err.Error(), "record limit") {
		t.Fatalf("oversized record encoded: %v", err)
	}
	e.Partitions = map[string][]int32{"t": {0}}
	if b, err := w.encodeBatch([]pendingRec{{slot: slot, tid: tid, entry: e, seq: 1}}, 1); err != nil || len(b) == 0 {
		t.Fatalf("small record: %v", err)
	}
}
