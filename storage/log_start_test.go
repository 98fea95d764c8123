package storage

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// deleteRecords calls Partition.DeleteRecords and waits for its answer.
func deleteRecords(t testing.TB, p *Partition, offset int64) (int64, int16) {
	t.Helper()
	type res struct {
		lw   int64
		code int16
	}
	ch := make(chan res, 1)
	p.DeleteRecords(offset, func(lw int64, code int16) { ch <- res{lw, code} })
	select {
	case r := <-ch:
		return r.lw, r.code
	case <-time.After(10 * time.Second):
		t.Fatal("DeleteRecords did not answer")
		return 0, 0
	}
}

func TestDeleteRecordsLogStartSurvivesCrashAndReopen(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	p := newPartition(t, s, map[string]string{"segment.bytes": "1024"})
	for i := 0; i < 40; i++ {
		mustAppend(t, p, makeBatch(t, tb{n: 2, value: 40}), 0)
	}
	if len(*p.segs.Load()) < 4 {
		t.Fatalf("want several segments, have %d", len(*p.segs.Load()))
	}
	hwm := p.HighWatermark()

	// Above the HWM and below -1: OFFSET_OUT_OF_RANGE, nothing moves.
	if _, code := deleteRecords(t, p, hwm+1); code != codec.CodeOffsetOutOfRange {
		t.Fatalf("offset above HWM: code %d", code)
	}
	if _, code := deleteRecords(t, p, -2); code != codec.CodeOffsetOutOfRange {
		t.Fatalf("offset -2: code %d", code)
	}
	if p.LogStartOffset() != 0 {
		t.Fatalf("log start moved to %d on a refused request", p.LogStartOffset())
	}

	// Into the middle of a batch in a later segment.
	target := int64(37)
	lw, code := deleteRecords(t, p, target)
	if code != codec.CodeNone || lw != target {
		t.Fatalf("DeleteRecords(%d) = %d, code %d", target, lw, code)
	}
	segs := *p.segs.Load()
	if next, _, _ := segs[0].stats(); next <= target || segs[0].base > target {
		t.Fatalf("first segment [%d, %d) should hold %d: wholly-below segments must be gone", segs[0].base, next, target)
	}
	if _, code := p.Read(nil, target-1, 1<<20, hwm); code != codec.CodeOffsetOutOfRange {
		t.Fatalf("read below the new start: code %d", code)
	}
	got := readAll(t, p, target)
	if len(got) == 0 || got[0].BaseOffset() > target || got[0].LastOffset() < target {
		t.Fatalf("read at the new start returned batches from %d", got[0].BaseOffset())
	}
	// A lower offset changes nothing and answers the current start.
	if lw, code := deleteRecords(t, p, 5); code != codec.CodeNone || lw != target {
		t.Fatalf("DeleteRecords(5) after %d = %d, code %d", target, lw, code)
	}

	crash(s)
	s = openStore(t, dir)
	p = s.Topic("t").Partition(0)
	if p.LogStartOffset() != target {
		t.Fatalf("after kill: log start %d, want %d", p.LogStartOffset(), target)
	}
	if _, code := p.Read(nil, target-1, 1<<20, hwm); code != codec.CodeOffsetOutOfRange {
		t.Fatalf("after kill, read below the start: code %d", code)
	}
	if off, _, found := p.OffsetForTimestamp(0); !found || off != target {
		t.Fatalf("OffsetForTimestamp(0) = %d %v, want the log start %d", off, found, target)
	}

	// -1 means the HWM; the active segment stays (the log start is its end).
	if lw, code := deleteRecords(t, p, -1); code != codec.CodeNone || lw != hwm {
		t.Fatalf("DeleteRecords(-1) = %d, code %d, want %d", lw, code, hwm)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	if p.LogStartOffset() != hwm || p.HighWatermark() != hwm {
		t.Fatalf("after reopen: log start %d HWM %d, want both %d", p.LogStartOffset(), p.HighWatermark(), hwm)
	}
	// Appends continue at the log end.
	if r := mustAppend(t, p, makeBatch(t, tb{}), 0); r.BaseOffset != hwm || r.LogStartOffset != hwm {
		t.Fatalf("append after deleting everything: %+v", r)
	}
}

// A crash after the checkpoint was written but before the segments went: recovery uses the
// checkpoint and retention removes what is wholly below it.
func TestDeleteRecordsCheckpointBeforeSegmentDeletion(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	p := newPartition(t, s, map[string]string{"segment.bytes": "1024"})
	now := time.Now().UnixMilli() // recent records: retention.ms removes nothing
	for i := 0; i < 40; i++ {
		mustAppend(t, p, makeBatch(t, tb{n: 2, value: 40, ts: now}), now)
	}
	nsegs := len(*p.segs.Load())
	crash(s)
	pdir := filepath.Join(dir, "topics", "t", "0")
	if err := WriteFileAtomic(pdir, logStartFile, encodeLogStart(50)); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	if p.LogStartOffset() != 50 {
		t.Fatalf("log start %d, want 50", p.LogStartOffset())
	}
	if len(*p.segs.Load()) != nsegs {
		t.Fatalf("segments changed before retention ran")
	}
	s.RunRetention(time.Now())
	segs := *p.segs.Load()
	if next, _, _ := segs[0].stats(); segs[0].base > 50 || next <= 50 {
		t.Fatalf("after retention the first segment is [%d, %d), want it to hold 50", segs[0].base, next)
	}
	if p.LogStartOffset() != 50 {
		t.Fatalf("retention moved the log start to %d", p.LogStartOffset())
	}

	// An invalid checkpoint is ignored (the first segment's base is used).
	crash(s)
	if err := os.WriteFile(filepath.Join(pdir, logStartFile), []byte("KLSO garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	if got := s.Topic("t").Partition(0).LogStartOffset(); got != segs[0].base {
		t.Fatalf("with a corrupt checkpoint the log start is %d, want %d", got, segs[0].base)
	}
}

// DeleteRecords past an aborted transaction drops it from the aborted index; past the start of
// an open one, the LSO is the log start (never below it), and read_committed readers resume at
// the right place after the commit.
func TestDeleteRecordsAcrossTransactions(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	p := newPartition(t, s, nil)
	txnAppend(t, p, 1, 0, 0, 2)      // 0-1
	mustMarker(t, p, 1, 0, false, 0) // 2: ABORT
	txnAppend(t, p, 2, 0, 0, 2)      // 3-4, open
	mustAppend(t, p, makeBatch(t, tb{n: 2}), 0)
	if got := p.AbortedTransactions(0, p.HighWatermark()); len(got) != 1 {
		t.Fatalf("aborted before: %+v", got)
	}
	if p.LastStableOffset() != 3 {
		t.Fatalf("LSO %d, want 3", p.LastStableOffset())
	}
	if lw, code := deleteRecords(t, p, 4); code != codec.CodeNone || lw != 4 {
		t.Fatalf("DeleteRecords(4) = %d %d", lw, code)
	}
	if got := p.AbortedTransactions(4, p.HighWatermark()); len(got) != 0 {
		t.Fatalf("aborted transaction below the start is still indexed: %+v", got)
	}
	if p.LastStableOffset() != 4 {
		t.Fatalf("LSO %d, want the log start 4 while pid 2's transaction is open", p.LastStableOffset())
	}
	crash(s)
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	if p.LogStartOffset() != 4 || p.LastStableOffset() != 4 {
		t.Fatalf("after kill: log start %d LSO %d, want 4 and 4", p.LogStartOffset(), p.LastStableOffset())
	}
	if got := p.AbortedTransactions(0, p.HighWatermark()); len(got) != 0 {
		t.Fatalf("after kill the aborted index has %+v", got)
	}
	m := mustMarker(t, p, 2, 0, true, 0)
	if p.LastStableOffset() != m.LastOffset+1 {
		t.Fatalf("after the commit LSO %d, want %d", p.LastStableOffset(), m.LastOffset+1)
	}
}

// With the WAL on, a power loss can take the segments' tail (it was durable only in the WAL):
// the checkpointed start lies past the segments until the WAL replay restores them, and must
// apply in full afterwards.
func TestDeleteRecordsLogStartAfterPowerLossWithWAL(t *testing.T) {
	dir := t.TempDir()
	ffs := &faultFS{}
	s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs })
	p := newPartition(t, s, nil)
	for i := 0; i < 10; i++ {
		mustAppend(t, p, makeBatch(t, tb{n: 2}), 0)
	}
	if lw, code := deleteRecords(t, p, 15); code != codec.CodeNone || lw != 15 {
		t.Fatalf("DeleteRecords(15) = %d %d", lw, code)
	}
	crash(s)
	if loseUnsynced(t, ffs, dir) == 0 {
		t.Fatal("nothing was only in the WAL: the test does not test the replay")
	}
	s = openStore(t, dir, withWAL)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	if p.HighWatermark() != 20 || p.LogStartOffset() != 15 {
		t.Fatalf("after power loss and WAL replay: HWM %d log start %d, want 20 and 15", p.HighWatermark(), p.LogStartOffset())
	}
}
