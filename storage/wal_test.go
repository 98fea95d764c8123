package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// walFiles lists the generation files in dir's WAL directory.
func walFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, walDirName, "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// snapshotParts reads every batch of every partition of topic, from its log start.
func snapshotParts(t testing.TB, top *Topic) [][]codec.Batch {
	t.Helper()
	out := make([][]codec.Batch, top.NumPartitions())
	for i := range out {
		p := top.Partition(int32(i))
		out[i] = readAll(t, p, p.LogStartOffset())
	}
	return out
}

func sameBatches(t testing.TB, what string, got, want [][]codec.Batch) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d partitions, want %d", what, len(got), len(want))
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("%s: partition %d has %d batches, want %d", what, i, len(got[i]), len(want[i]))
		}
		for j := range want[i] {
			if !bytes.Equal(got[i][j], want[i][j]) {
				t.Fatalf("%s: partition %d batch %d (offset %d) differs", what, i, j, want[i][j].BaseOffset())
			}
		}
	}
}

// Acknowledged appends on several partitions (idempotent producers, a transaction, segment rolls)
// survive a crash in which the segments lost everything not fsync'd: the WAL replay restores them
// byte for byte, with producer state and transaction index.
func TestWALReplayRestoresUnsyncedSegmentTails(t *testing.T) {
	ffs := &faultFS{match: "/" + walDirName + "/", syncDelay: time.Millisecond}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs; c.walCheckpointEvery = time.Hour })
	top, err := s.CreateTopic("m", 3, map[string]string{"segment.bytes": "4096"})
	if err != nil {
		t.Fatal(err)
	}
	const each = 40
	var wg sync.WaitGroup
	for part := int32(0); part < 3; part++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := top.Partition(part)
			for i := 0; i < each; i++ {
				r := p.Append(makeBatch(t, tb{pid: 10 + int64(part), seq: int32(2 * i), n: 2, value: 100, ts: int64(i)}), 0)
				if r.Code != codec.CodeNone {
					t.Error(r)
					return
				}
				if err := syncWait(p, r.LastOffset+1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// An aborted transaction on partition 0, its marker only in the WAL.
	p0 := top.Partition(0)
	txnAppend(t, p0, 99, 0, 0, 2)
	mustMarker(t, p0, 99, 0, false, 0)
	appends := int64(3*each + 2)
	if got := ffs.walSyncs.Load(); got >= appends {
		t.Fatalf("no group commit across partitions: %d WAL syncs for %d appends", got, appends)
	}
	want := snapshotParts(t, top)
	wantView := viewOf(p0)
	crash(s)
	if cut := loseUnsynced(t, ffs, dir); cut == 0 {
		t.Fatal("nothing was left un-fsync'd in the segments: the test proves nothing")
	}
	s = openStore(t, dir, withWAL)
	defer s.Close()
	top = s.Topic("m")
	sameBatches(t, "after replay", snapshotParts(t, top), want)
	if got := viewOf(top.Partition(0)); !reflect.DeepEqual(got, wantView) {
		t.Fatalf("transaction state after replay:\n%+v\nwant\n%+v", got, wantView)
	}
	if len(walFiles(t, dir)) != 0 {
		t.Fatal("replayed generations were not removed")
	}
	for part := int32(0); part < 3; part++ {
		p := top.Partition(part)
		if p.HighWatermark() != p.LogEndOffset() {
			t.Fatalf("partition %d: HWM %d, LEO %d", part, p.HighWatermark(), p.LogEndOffset())
		}
		// The last batch is still known to the producer (idempotent retry) ...
		last := makeBatch(t, tb{pid: 10 + int64(part), seq: int32(2 * (each - 1)), n: 2, value: 100, ts: each - 1})
		if r := p.Append(last, 0); !r.Duplicate {
			t.Fatalf("partition %d: retry after replay not a duplicate: %+v", part, r)
		}
		// ... and the log continues where it ended.
		leo := p.LogEndOffset()
		if r := mustAppend(t, p, makeBatch(t, tb{pid: 10 + int64(part), seq: 2 * each}), 0); r.BaseOffset != leo {
			t.Fatalf("partition %d: next append at %d, want %d", part, r.BaseOffset, leo)
		}
	}
	// A clean close leaves no WAL behind, and nothing to replay.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(walFiles(t, dir)); n != 0 {
		t.Fatalf("%d WAL files after a clean close", n)
	}
}

// Generations roll, checkpoints delete the old ones (after fsyncing the segments), and a crash
// after that loses nothing acknowledged; segments roll and retention runs meanwhile.
func TestWALCheckpointRollRetentionThenCrash(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) {
		c.FS = ffs
		c.walGenBytes = 16 << 10
		c.walCheckpointEvery = 20 * time.Millisecond
	})
	top, err := s.CreateTopic("r", 2, map[string]string{"segment.bytes": "4096", "retention.bytes": "8192"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		p := top.Partition(int32(i % 2))
		mustAppend(t, p, makeBatch(t, tb{n: 2, value: 200, ts: int64(i)}), 0)
		if i%50 == 49 {
			s.RunRetention(time.Now())
		}
	}
	// One record larger than a generation gets a generation of its own.
	big, err := s.CreateTopic("big", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, big.Partition(0), makeBatch(t, tb{n: 1, value: 20 << 10}), 0)
	mustAppend(t, top.Partition(0), makeBatch(t, tb{n: 2, value: 200}), 0)
	if top.Partition(0).LogStartOffset() == 0 {
		t.Fatal("retention did not run")
	}
	eventually(t, "checkpoints delete full generations", func() bool { return len(walFiles(t, dir)) <= 2 })
	want := snapshotParts(t, top)
	wantBig := snapshotParts(t, big)
	starts := []int64{top.Partition(0).LogStartOffset(), top.Partition(1).LogStartOffset()}
	crash(s)
	loseUnsynced(t, ffs, dir)
	s = openStore(t, dir, withWAL)
	defer s.Close()
	top = s.Topic("r")
	for i, ls := range starts {
		if got := top.Partition(int32(i)).LogStartOffset(); got != ls {
			t.Fatalf("partition %d: log start %d, want %d", i, got, ls)
		}
	}
	sameBatches(t, "after checkpoints and crash", snapshotParts(t, top), want)
	sameBatches(t, "oversized record", snapshotParts(t, s.Topic("big")), wantBig)
}

// walTail returns the current generation's path and write position (after crash: no writer).
func walTail(s *Store) (string, int64) {
	return s.wal.cur.path, s.wal.cur.end
}

func TestWALTornTailIsCut(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs })
	p := newPartition(t, s, nil)
	for i := 0; i < 10; i++ {
		mustAppend(t, p, makeBatch(t, tb{pid: 1, seq: int32(i), value: 50}), 0)
	}
	want := snapshotParts(t, s.Topic("t"))
	crash(s)
	path, end := walTail(s)
	// A record of the next round that only half reached the disk: its header is there (magic,
	// generation), the rest is old junk.
	b := makeBatch(t, tb{pid: 1, seq: 10, value: 300})
	b.SetBaseOffset(10)
	rec := appendWALRecord(nil, s.Topic("t").ID, 0, 10, b)
	sealWALRecord(rec, s.wal.cur.seq, s.wal.round)
	for i := len(rec) / 2; i < len(rec); i++ {
		rec[i] = 0xaa
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(rec, end); err != nil {
		t.Fatal(err)
	}
	f.Close()
	loseUnsynced(t, ffs, dir)
	s = openStore(t, dir, withWAL)
	defer s.Close()
	sameBatches(t, "after torn WAL tail", snapshotParts(t, s.Topic("t")), want)
	if r := mustAppend(t, s.Topic("t").Partition(0), makeBatch(t, tb{pid: 1, seq: 10}), 0); r.BaseOffset != 10 {
		t.Fatalf("next append at %d", r.BaseOffset)
	}
}

func TestWALCorruptionBeforeValidRecordsRefusesStart(t *testing.T) {
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, path string, offs []int)
	}{
		{"flipped byte in an early record", func(t *testing.T, path string, offs []int) {
			flipByte(t, path, int64(offs[2]+walHeaderSize+20))
		}},
		{"zeroed early record header", func(t *testing.T, path string, offs []int) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, walHeaderSize), int64(offs[1])); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, withWAL)
			p := newPartition(t, s, nil)
			for i := 0; i < 6; i++ {
				mustAppend(t, p, makeBatch(t, tb{value: 100}), 0) // one round each
			}
			crash(s)
			path, _ := walTail(s)
			c.damage(t, path, recordOffsets(t, path, s.wal.cur.seq))
			_, err := Open(Config{Dir: dir, IndexIntervalBytes: 256, WAL: true})
			if !errors.Is(err, errWALCorrupt) {
				t.Fatalf("open with a corrupt WAL record before valid ones: %v", err)
			}
			// The files are left alone for an operator to look at.
			if len(walFiles(t, dir)) == 0 {
				t.Fatal("WAL removed after a refused start")
			}
		})
	}
}

// recordOffsets lists where the valid records of generation seq start in path.
func recordOffsets(t testing.TB, path string, seq uint64) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int
	for pos := 0; ; {
		r, ok := parseWALRecord(data, pos, seq)
		if !ok {
			return offs
		}
		offs = append(offs, pos)
		pos += r.size
	}
}

// A record missing from the middle of a partition's WAL history (the segment lost it too) is
// acknowledged data that is gone: the broker refuses to start rather than serve a gap.
func TestWALGapRefusesStart(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs })
	p := newPartition(t, s, nil)
	for i := 0; i < 4; i++ {
		mustAppend(t, p, makeBatch(t, tb{value: 100}), 0)
	}
	crash(s)
	path, _ := walTail(s)
	offs := recordOffsets(t, path, s.wal.cur.seq)
	loseUnsynced(t, ffs, dir)
	// Rewrite record 1 as a valid record of another (unknown) topic: offset 1 is gone.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[offs[1]+24] ^= 1
	sealWALRecord(data[offs[1]:], s.wal.cur.seq, binary.BigEndian.Uint64(data[offs[1]+16:]))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Open(Config{Dir: dir, IndexIntervalBytes: 256, WAL: true})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("acknowledged records are missing")) {
		t.Fatalf("open with a gap: %v", err)
	}
}

// A topic deleted and re-created under the same name never receives the old topic's WAL records.
func TestWALTopicDeleteRecreateGetsNoOldRecords(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs; c.walCheckpointEvery = time.Hour })
	p := newPartition(t, s, nil)
	for i := 0; i < 5; i++ {
		mustAppend(t, p, makeBatch(t, tb{value: 100}), 0)
	}
	if err := s.DeleteTopic("t"); err != nil {
		t.Fatal(err)
	}
	p = newPartition(t, s, nil)
	mustAppend(t, p, makeBatch(t, tb{value: 7}), 0)
	want := snapshotParts(t, s.Topic("t"))
	crash(s)
	loseUnsynced(t, ffs, dir)
	s = openStore(t, dir, withWAL)
	defer s.Close()
	sameBatches(t, "re-created topic", snapshotParts(t, s.Topic("t")), want)
	if got := s.Topic("t").Partition(0).LogEndOffset(); got != 1 {
		t.Fatalf("re-created topic has log end %d, want 1", got)
	}
}

// A failed WAL write or sync fails the waiting appends (never acknowledges them), discards what
// was not durable, and the WAL continues in a fresh generation; after a crash the abandoned tail
// (covered by the marker) does not stop the start, and everything acknowledged is there.
func TestWALWriteOrSyncFailure(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(f *faultFS)
	}{
		{"sync", func(f *faultFS) { f.syncErr = syscall.EIO }},
		{"write", func(f *faultFS) { f.writeErr, f.partial = syscall.ENOSPC, 70 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ffs := &faultFS{match: "/" + walDirName + "/"}
			dir := t.TempDir()
			s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs; c.walCheckpointEvery = time.Hour })
			top, err := s.CreateTopic("f", 2, nil)
			if err != nil {
				t.Fatal(err)
			}
			p0, p1 := top.Partition(0), top.Partition(1)
			mustAppend(t, p0, makeBatch(t, tb{pid: 1, seq: 0}), 0)
			mustAppend(t, p1, makeBatch(t, tb{pid: 2, seq: 0}), 0)
			ffs.set(c.set)
			r := p0.Append(makeBatch(t, tb{pid: 1, seq: 1, n: 3}), 0)
			if r.Code != codec.CodeNone {
				t.Fatal(r)
			}
			if err := syncWait(p0, r.LastOffset+1); err == nil {
				t.Fatal("sync succeeded despite the WAL failure")
			}
			if p0.HighWatermark() > 1 {
				if buf, _ := p0.Read(nil, 1, 1<<20, p0.HighWatermark()); len(buf) != 0 {
					t.Fatalf("HWM %d exposes records the WAL never made durable", p0.HighWatermark())
				}
			}
			ffs.set(func(f *faultFS) { f.syncErr, f.writeErr = nil, nil })
			waitWALContinues(t, s)
			// Later appends work on both partitions; the discarded offsets are not reused.
			r2 := mustAppend(t, p0, makeBatch(t, tb{pid: 1, seq: 1}), 0)
			if r2.BaseOffset != 4 {
				t.Fatalf("next append at %d, want 4 (1..3 discarded)", r2.BaseOffset)
			}
			mustAppend(t, p1, makeBatch(t, tb{pid: 2, seq: 1}), 0)
			if err := syncWait(p0, r.LastOffset+1); !errors.Is(err, ErrLost) {
				t.Fatalf("sync of the discarded range: %v", err)
			}
			if n := len(walFiles(t, dir)); n < 2 {
				t.Fatalf("%d generations: the WAL did not continue in a fresh one", n)
			}
			want := snapshotParts(t, top)
			crash(s)
			loseUnsynced(t, ffs, dir)
			s = openStore(t, dir, withWAL)
			defer s.Close()
			sameBatches(t, "after WAL failure and crash", snapshotParts(t, s.Topic("f")), want)
		})
	}
}

// A failed segment fsync with the WAL on (here: at a checkpoint) takes the partition offline
// until restart and keeps the WAL; the restart replays it.
func TestWALSegmentFsyncFailure(t *testing.T) {
	ffs := &faultFS{match: "/topics/"}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) {
		c.FS = ffs
		c.walGenBytes = 8 << 10
		c.walCheckpointEvery = 10 * time.Millisecond
	})
	p := newPartition(t, s, nil)
	mustAppend(t, p, makeBatch(t, tb{value: 100}), 0)
	ffs.set(func(f *faultFS) { f.syncErr = syscall.EIO })
	// Acks still come from the WAL; enough data to fill generations and trigger checkpoints.
	n := 1
	for !s.wal.pinnedNow() {
		r := p.Append(makeBatch(t, tb{value: 1000}), 0)
		if r.Code != codec.CodeNone {
			break
		}
		if err := syncWait(p, r.LastOffset+1); err != nil {
			t.Fatal(err)
		}
		n++
		if n > 1000 {
			t.Fatal("no checkpoint failed")
		}
	}
	eventually(t, "WAL pinned", s.wal.pinnedNow)
	eventually(t, "partition refuses appends", func() bool {
		return p.Append(makeBatch(t, tb{}), 0).Code == codec.CodeKafkaStorageError
	})
	want := snapshotParts(t, s.Topic("t"))
	if len(want[0]) != n {
		t.Fatalf("%d batches readable, %d acknowledged", len(want[0]), n)
	}
	ffs.set(func(f *faultFS) { f.syncErr = nil })
	if err := s.Close(); err == nil {
		t.Fatal("clean close of a partition whose segment fsync failed reported no error")
	}
	if len(walFiles(t, dir)) == 0 {
		t.Fatal("pinned WAL removed at close")
	}
	loseUnsynced(t, ffs, dir)
	s = openStore(t, dir, withWAL)
	defer s.Close()
	sameBatches(t, "after restart", snapshotParts(t, s.Topic("t")), want)
}

// With log.wal.enable off nothing is written to the WAL directory, and a WAL left by an earlier
// run is still replayed.
func TestWALOffStillReplays(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs })
	p := newPartition(t, s, nil)
	for i := 0; i < 5; i++ {
		mustAppend(t, p, makeBatch(t, tb{value: 100}), 0)
	}
	want := snapshotParts(t, s.Topic("t"))
	crash(s)
	loseUnsynced(t, ffs, dir)
	s = openStore(t, dir, withoutWAL)
	sameBatches(t, "WAL off after a crash with it on", snapshotParts(t, s.Topic("t")), want)
	mustAppend(t, s.Topic("t").Partition(0), makeBatch(t, tb{}), 0)
	if n := len(walFiles(t, dir)); n != 0 {
		t.Fatalf("%d WAL files with the WAL off", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestWALRecordRoundTrip(t *testing.T) {
	id := [16]byte{1, 2, 3}
	payload := []byte("batch bytes of odd length")
	rec := appendWALRecord([]byte{9, 9, 9, 9, 9, 9, 9, 9}, id, 7, 42, payload)[8:]
	if len(rec)%walAlign != 0 || len(rec) != walRecLen(len(payload)) {
		t.Fatalf("record length %d", len(rec))
	}
	if _, ok := parseWALRecord(rec, 0, 5); ok {
		t.Fatal("unsealed record parsed")
	}
	sealWALRecord(rec, 5, 11)
	r, ok := parseWALRecord(rec, 0, 5)
	if !ok || r.round != 11 || r.topicID != id || r.partition != 7 || r.base != 42 || string(r.payload) != string(payload) {
		t.Fatalf("%+v %v", r, ok)
	}
	if _, ok := parseWALRecord(rec, 0, 6); ok {
		t.Fatal("record of another generation parsed")
	}
	for i := 0; i < walHeaderSize+len(payload); i++ {
		bad := append([]byte(nil), rec...)
		bad[i] ^= 1
		if _, ok := parseWALRecord(bad, 0, 5); ok {
			t.Fatalf("flip at %d not detected", i)
		}
	}
}

// A topic that acknowledged from the page cache (flush.messages > 1) and is switched to
// flush.messages = 1: its earlier records are not in the WAL, so a wait for them fsyncs the
// segment, and the first WAL append fsyncs it before the WAL may move the HWM past them.
func TestWALFlushMessagesSwitch(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs; c.walCheckpointEvery = time.Hour })
	p := newPartition(t, s, map[string]string{"flush.messages": "1000000", "flush.ms": "3600000"})
	r := p.Append(makeBatch(t, tb{value: 100}), 0)
	if r.Code != codec.CodeNone {
		t.Fatal(r)
	}
	one := "1"
	if err := s.AlterTopicConfig("t", map[string]*string{"flush.messages": &one}); err != nil {
		t.Fatal(err)
	}
	if err := syncWait(p, r.LastOffset+1); err != nil {
		t.Fatalf("wait for page-cache records after the switch: %v", err)
	}
	// Strict now: through the WAL.
	mustAppend(t, p, makeBatch(t, tb{value: 100}), 0)
	if p.Topic().Config().FlushMessages != 1 {
		t.Fatal("config not applied")
	}
	// Back to page-cache acks for one record, then strict again: the WAL append must first
	// make that record durable in the segment.
	big := "1000000"
	if err := s.AlterTopicConfig("t", map[string]*string{"flush.messages": &big}); err != nil {
		t.Fatal(err)
	}
	if r := p.Append(makeBatch(t, tb{value: 100}), 0); r.Code != codec.CodeNone {
		t.Fatal(r)
	}
	if err := s.AlterTopicConfig("t", map[string]*string{"flush.messages": &one}); err != nil {
		t.Fatal(err)
	}
	last := mustAppend(t, p, makeBatch(t, tb{value: 100}), 0)
	if p.HighWatermark() != last.LastOffset+1 {
		t.Fatalf("HWM %d, want %d", p.HighWatermark(), last.LastOffset+1)
	}
	want := snapshotParts(t, s.Topic("t"))
	if len(want[0]) != 4 {
		t.Fatalf("%d batches", len(want[0]))
	}
	crash(s)
	loseUnsynced(t, ffs, dir)
	s = openStore(t, dir, withWAL)
	defer s.Close()
	sameBatches(t, "after switching flush.messages and a crash", snapshotParts(t, s.Topic("t")), want)
}

// Damage at the end of a generation that later generations follow (so it was synced before they
// were written, and no marker says it was abandoned) is corruption, not a torn tail.
func TestWALCorruptGenerationTailBeforeNextGenerationRefusesStart(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) { c.walGenBytes = 4 << 10 })
	s.wal.pin() // keep every generation (no checkpoint deletes one)
	p := newPartition(t, s, nil)
	for i := 0; i < 40; i++ {
		mustAppend(t, p, makeBatch(t, tb{value: 200}), 0)
	}
	crash(s)
	files := walFiles(t, dir)
	if len(files) < 3 {
		t.Fatalf("%d generations, want several", len(files))
	}
	first := files[0]
	var seq uint64
	if _, err := fmt.Sscanf(filepath.Base(first), "%020d.wal", &seq); err != nil {
		t.Fatal(err)
	}
	offs := recordOffsets(t, first, seq)
	flipByte(t, first, int64(offs[len(offs)-1]+walHeaderSize+30))
	if _, err := Open(Config{Dir: dir, IndexIntervalBytes: 256, WAL: true}); !errors.Is(err, errWALCorrupt) {
		t.Fatalf("open with a corrupt generation tail followed by later generations: %v", err)
	}
}

// Replay walks many generations in order (none deleted: pinned) into segments that lost
// everything unsynced, across segment rolls.
func TestWALReplayAcrossGenerations(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, withWAL, func(c *Config) { c.FS = ffs; c.walGenBytes = 4 << 10 })
	s.wal.pin()
	p := newPartition(t, s, map[string]string{"segment.bytes": "3000"})
	for i := 0; i < 40; i++ {
		mustAppend(t, p, makeBatch(t, tb{pid: 3, seq: int32(i), value: 200}), 0)
	}
	if n := len(walFiles(t, dir)); n < 3 {
		t.Fatalf("%d generations", n)
	}
	want := snapshotParts(t, s.Topic("t"))
	crash(s)
	loseUnsynced(t, ffs, dir)
	s = openStore(t, dir, withWAL)
	defer s.Close()
	sameBatches(t, "replay across generations", snapshotParts(t, s.Topic("t")), want)
}
