package storage

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kaas-go/kaas/codec"
)

// activeLogPath is the path of the partition's active segment file.
func activeLogPath(p *Partition) string { return p.active.path(".log") }

func TestRecoveryTornTail(t *testing.T) {
	type damage func(t *testing.T, path string, lastBatch codec.Batch)
	appendBytes := func(b []byte) damage {
		return func(t *testing.T, path string, _ codec.Batch) {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(b); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	cases := map[string]struct {
		d        damage
		survives int // batches of the 10 written that must survive
	}{
		"garbage":       {appendBytes([]byte("this is not a record batch at all, just garbage bytes......................")), 10},
		"short garbage": {appendBytes([]byte{1, 2, 3}), 10},
		"half a batch": {func(t *testing.T, path string, _ codec.Batch) {
			b := makeBatch(t, tb{n: 4})
			b.SetBaseOffset(20)
			appendBytes(b[:len(b)/2])(t, path, nil)
		}, 10},
		"huge length": {appendBytes([]byte{0, 0, 0, 0, 0, 0, 0, 20, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 2}), 10},
		"flipped CRC byte in last batch": {func(t *testing.T, path string, last codec.Batch) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			st, _ := f.Stat()
			var one [1]byte
			pos := st.Size() - 1 // last byte of the last batch's records
			f.ReadAt(one[:], pos)
			one[0] ^= 0xff
			f.WriteAt(one[:], pos)
			f.Close()
		}, 9},
		"wrong base offset after the end": {func(t *testing.T, path string, _ codec.Batch) {
			b := makeBatch(t, tb{n: 1})
			b.SetBaseOffset(99) // valid CRC, not contiguous
			appendBytes(b)(t, path, nil)
		}, 10},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			// Without the WAL: it would restore the damaged last batch (wal_test.go).
			s := openStore(t, dir, withoutWAL)
			p := newPartition(t, s, map[string]string{"segment.bytes": "2048"})
			var last codec.Batch
			for i := 0; i < 10; i++ {
				b := makeBatch(t, tb{n: 2, ts: int64(i), value: 100})
				mustAppend(t, p, b, 0)
				last = b
			}
			if len(*p.segs.Load()) < 2 {
				t.Fatal("want a closed segment too")
			}
			path := activeLogPath(p)
			crash(s)
			c.d(t, path, last)
			s = openStore(t, dir, withoutWAL)
			defer s.Close()
			p = s.Topic("t").Partition(0)
			want := int64(2 * c.survives)
			if p.LogEndOffset() != want || p.HighWatermark() != want {
				t.Fatalf("leo %d hwm %d, want %d", p.LogEndOffset(), p.HighWatermark(), want)
			}
			got := readAll(t, p, 0)
			if len(got) != c.survives {
				t.Fatalf("%d batches survived, want %d", len(got), c.survives)
			}
			st, _ := os.Stat(path)
			if st.Size() != p.active.size.Load() {
				t.Fatalf("file not truncated: %d vs %d", st.Size(), p.active.size.Load())
			}
			// The log continues at the truncation point.
			if r := mustAppend(t, p, makeBatch(t, tb{}), 0); r.BaseOffset != want {
				t.Fatalf("next append at %d", r.BaseOffset)
			}
		})
	}
}

func TestProducerStateSurvivesKill(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	p := newPartition(t, s, map[string]string{"segment.bytes": "2048"})
	const pid = 7
	var results []AppendResult
	var batches []codec.Batch
	seq := int32(0)
	for i := 0; i < 40; i++ {
		b := makeBatch(t, tb{pid: pid, epoch: 3, seq: seq, n: 2, value: 60})
		batches = append(batches, append(codec.Batch(nil), b...))
		results = append(results, mustAppend(t, p, b, 0))
		seq += 2
	}
	// Another producer only in the tail (after the last roll snapshot).
	mustAppend(t, p, makeBatch(t, tb{pid: 8, seq: 0}), 0)
	if len(*p.segs.Load()) < 3 {
		t.Fatal("want rolls (snapshots)")
	}
	check := func(s *Store) {
		t.Helper()
		p := s.Topic("t").Partition(0)
		for i := 35; i < 40; i++ { // the last 5 are in the window
			b := append(codec.Batch(nil), batches[i]...)
			r := p.Append(b, 0)
			if !r.Duplicate || r.BaseOffset != results[i].BaseOffset || r.LastOffset != results[i].LastOffset {
				t.Fatalf("retry of batch %d: %+v want %+v", i, r, results[i])
			}
		}
		if r := p.Append(append(codec.Batch(nil), batches[30]...), 0); r.Code != codec.CodeOutOfOrderSequenceNumber {
			t.Fatalf("old batch outside the window: %+v", r)
		}
		if ep, last, _, ok := p.ProducerState(pid); !ok || ep != 3 || last != 79 {
			t.Fatalf("state %d %d %v", ep, last, ok)
		}
		if _, last, _, ok := p.ProducerState(8); !ok || last != 0 {
			t.Fatal("tail producer lost")
		}
	}
	crash(s)
	s = openStore(t, dir)
	check(s)
	// Without any snapshot: replay from the log start.
	crash(s)
	for _, o := range listSnapshots(filepath.Join(dir, "topics", "t", "0")) {
		os.Remove(filepath.Join(dir, "topics", "t", "0", segmentName(o, ".snapshot")))
	}
	s = openStore(t, dir)
	check(s)
	// A corrupt newest snapshot is ignored.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	snaps := listSnapshots(filepath.Join(dir, "topics", "t", "0"))
	if len(snaps) == 0 {
		t.Fatal("clean close wrote no snapshot")
	}
	os.WriteFile(filepath.Join(dir, "topics", "t", "0", segmentName(snaps[0], ".snapshot")), []byte("KPS1 garbage"), 0o644)
	s = openStore(t, dir)
	defer s.Close()
	check(s)
}

func TestIdempotenceRules(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	app := func(o tb) AppendResult { return p.Append(makeBatch(t, o), 0) }
	// Unknown producer: any first sequence is accepted (state may have expired).
	if r := app(tb{pid: 1, epoch: 0, seq: 42}); r.Code != 0 || r.Duplicate {
		t.Fatalf("unknown producer: %+v", r)
	}
	// In sequence.
	if r := app(tb{pid: 1, epoch: 0, seq: 43, n: 3}); r.Code != 0 {
		t.Fatalf("in sequence: %+v", r)
	}
	// Gap and replay of an older, non-cached range: 45.
	if r := app(tb{pid: 1, epoch: 0, seq: 50}); r.Code != codec.CodeOutOfOrderSequenceNumber {
		t.Fatalf("gap: %+v", r)
	}
	if r := app(tb{pid: 1, epoch: 0, seq: 44}); r.Code != codec.CodeOutOfOrderSequenceNumber {
		t.Fatalf("overlap: %+v", r)
	}
	// Duplicate of a cached batch: original offsets, nothing written.
	leo := p.LogEndOffset()
	if r := app(tb{pid: 1, epoch: 0, seq: 43, n: 3}); !r.Duplicate || r.Code != 0 || r.BaseOffset != 1 || r.LastOffset != 3 || p.LogEndOffset() != leo {
		t.Fatalf("duplicate: %+v", r)
	}
	// Higher epoch needs sequence 0.
	if r := app(tb{pid: 1, epoch: 1, seq: 46}); r.Code != codec.CodeOutOfOrderSequenceNumber {
		t.Fatalf("new epoch seq!=0: %+v", r)
	}
	if r := app(tb{pid: 1, epoch: 1, seq: 0}); r.Code != 0 {
		t.Fatalf("new epoch seq 0: %+v", r)
	}
	// Lower epoch: 47.
	if r := app(tb{pid: 1, epoch: 0, seq: 46}); r.Code != codec.CodeInvalidProducerEpoch {
		t.Fatalf("old epoch: %+v", r)
	}
	// A duplicate from the old epoch is not a duplicate any more.
	if r := app(tb{pid: 1, epoch: 0, seq: 43, n: 3}); r.Code != codec.CodeInvalidProducerEpoch {
		t.Fatalf("old epoch dup: %+v", r)
	}
	// Window of 5: the 6th-newest batch is no longer recognised.
	for i := int32(1); i <= 6; i++ {
		if r := app(tb{pid: 1, epoch: 1, seq: i}); r.Code != 0 {
			t.Fatalf("seq %d: %+v", i, r)
		}
	}
	if r := app(tb{pid: 1, epoch: 1, seq: 2}); !r.Duplicate {
		t.Fatalf("5th newest: %+v", r)
	}
	if r := app(tb{pid: 1, epoch: 1, seq: 1}); r.Code != codec.CodeOutOfOrderSequenceNumber {
		t.Fatalf("6th newest: %+v", r)
	}
	// Sequence wrap: MaxInt32 -> 0.
	if r := app(tb{pid: 2, epoch: 0, seq: math.MaxInt32 - 1, n: 2}); r.Code != 0 {
		t.Fatal(r)
	}
	if r := app(tb{pid: 2, epoch: 0, seq: 0, n: 2}); r.Code != 0 {
		t.Fatalf("wrap: %+v", r)
	}
	if r := app(tb{pid: 2, epoch: 0, seq: math.MaxInt32, n: 3}); r.Code != codec.CodeOutOfOrderSequenceNumber {
		t.Fatalf("wrapping batch: %+v", r)
	}
	// Non-idempotent batches are never checked.
	for i := 0; i < 3; i++ {
		if r := app(tb{}); r.Code != 0 || r.Duplicate {
			t.Fatal(r)
		}
	}
	// Fencing raises the epoch and clears the window: old epoch 47, new epoch from seq 0 only.
	p.FenceProducer(1, 5)
	if r := app(tb{pid: 1, epoch: 1, seq: 7}); r.Code != codec.CodeInvalidProducerEpoch {
		t.Fatalf("fenced: %+v", r)
	}
	if r := app(tb{pid: 1, epoch: 5, seq: 3}); r.Code != codec.CodeOutOfOrderSequenceNumber {
		t.Fatalf("fenced epoch seq!=0: %+v", r)
	}
	if r := app(tb{pid: 1, epoch: 5, seq: 0}); r.Code != 0 {
		t.Fatalf("fenced epoch seq 0: %+v", r)
	}
	// A control batch (transaction marker) is appended without checks and raises the epoch.
	marker := codec.Batch(codec.AppendControlBatch(nil, 1, 6, true, 0, 123))
	if r := p.AppendControl(marker, 0); r.Code != 0 {
		t.Fatal(r)
	}
	if ep, last, _, _ := p.ProducerState(1); ep != 6 || last != -1 {
		t.Fatalf("after marker: epoch %d last %d", ep, last)
	}
	infos := p.Producers()
	if len(infos) != 2 || infos[0].ProducerID != 1 || infos[1].ProducerID != 2 || infos[1].LastSequence != 1 {
		t.Fatalf("producers %+v", infos)
	}
	// A failed write does not update the window (checked in TestDiskFull).
}

func TestSnapshotEncodeDecode(t *testing.T) {
	ps := newProducerState()
	for i := 0; i < 7; i++ {
		b := makeBatch(t, tb{pid: 9, epoch: 2, seq: int32(i), ts: int64(i)})
		b.SetBaseOffset(int64(i))
		ps.record(b)
	}
	ps.fence(10, 4)
	buf := ps.encode(77, nil)
	got, off, err := decodeProducerSnapshot(buf)
	if err != nil || off != 77 || len(got.m) != 2 {
		t.Fatal(err, off)
	}
	e := got.m[9]
	if e.n != 5 || e.newest().lastSeq != 6 || e.window[e.head].firstSeq != 2 || got.m[10].epoch != 4 {
		t.Fatalf("%+v", e)
	}
	for i := range buf {
		bad := append([]byte(nil), buf...)
		bad[i] ^= 1
		if _, _, err := decodeProducerSnapshot(bad); err == nil {
			t.Fatalf("flip at %d not detected", i)
		}
	}
	if _, _, err := decodeProducerSnapshot(buf[:len(buf)-1]); err == nil {
		t.Fatal("truncated snapshot accepted")
	}
}
