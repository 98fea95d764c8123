package txn

import (
	"fmt"
	"testing"
)

// BenchmarkJournalRecord measures the CPU side of a journal record: framing one entry (three
// topics, twelve partitions, a group) on the write path, and the scan of a generation holding
// 1000 such records in 250 batches on the replay path.
func BenchmarkJournalRecord(b *testing.B) {
	e := &Entry{TransactionalID: "bench-tid", ProducerID: 1 << 40, ProducerEpoch: 3, State: Ongoing, TxnVersion: 2,
		TimeoutMs: 60_000, TxnStartMs: 1_700_000_000_000, LastUpdateMs: 1_700_000_000_001,
		Partitions: map[string][]int32{"orders": {0, 1, 2, 3}, "payments": {4, 5, 6, 7}, "audit": {8, 9, 10, 11}},
		Groups:     []string{"billing"}}
	rec := &journalRec{batch: 7, last: true, slot: SlotFor(e.TransactionalID), seq: 1 << 20, epoch: 2, tid: e.TransactionalID, entry: e}
	b.Run("encode", func(b *testing.B) {
		buf := appendRecord(nil, rec)
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			buf = appendRecord(buf[:0], rec)
		}
	})
	b.Run("scan", func(b *testing.B) {
		data := appendJournalHeader(nil, journalID{gen: 1})
		for i := 0; i < 1000; i++ {
			tid := fmt.Sprintf("tid-%d", i)
			en := e.clone()
			en.TransactionalID = tid
			data = appendRecord(data, &journalRec{batch: uint64(i/4 + 1), last: i%4 == 3, slot: SlotFor(tid), seq: uint64(i + 1), tid: tid, entry: en})
		}
		data = append(data, make([]byte, 64<<10)...)
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if sc, err := scanJournal(data); err != nil || len(sc.recs) != 1000 || sc.torn {
				b.Fatal(err, len(sc.recs))
			}
		}
	})
}
