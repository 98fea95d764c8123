package storage

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// fileSize is the on-disk size of path.
func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// fillPastZeroStart appends acknowledged ~1 KiB batches until the active segment is past
// zeroStart and the zeroer has fsync'd a region ahead of it. It returns the batches' count.
func fillPastZeroStart(t *testing.T, p *Partition) int {
	t.Helper()
	n := 0
	for p.active.size.Load() < zeroStart+4096 {
		mustAppend(t, p, makeBatch(t, tb{n: 4, value: 250, ts: int64(n)}), 0)
		n++
	}
	seg := p.active
	eventually(t, "zeroed region fsync'd ahead of the log end", func() bool {
		return seg.zeroSynced.Load() >= seg.size.Load()+zeroAheadMin/2
	})
	return n
}

func TestPrezeroFlushUsesFdatasyncInsideTheZeroedRegion(t *testing.T) {
	ffs := &faultFS{}
	s := openStore(t, "", withPrealloc, withoutWAL, func(c *Config) { c.FS = ffs })
	defer s.Close()
	p := newPartition(t, s, nil)
	// A partition that only ever gets a few batches is not pre-zeroed.
	mustAppend(t, p, makeBatch(t, tb{}), 0)
	if ffs.zeroWrite.Load() != 0 || fileSize(t, activeLogPath(p)) != p.active.size.Load() {
		t.Fatal("pre-zeroed below zeroStart")
	}
	n := 1 + fillPastZeroStart(t, p)
	seg := p.active
	if fs := fileSize(t, activeLogPath(p)); fs <= seg.size.Load() {
		t.Fatalf("no zero tail: file %d, logical %d", fs, seg.size.Load())
	}
	ds := ffs.datasyncs.Load()
	for i := 0; i < 20; i++ {
		mustAppend(t, p, makeBatch(t, tb{n: 2, value: 100}), 0)
		n++
	}
	if got := ffs.datasyncs.Load() - ds; got == 0 {
		t.Fatal("flushes inside the zeroed region did not use fdatasync")
	}
	// Reads stop at the logical end: exactly the batches written, all valid, and nothing at
	// the HWM although the file goes on with zeros.
	if got := readAll(t, p, 0); len(got) != n {
		t.Fatalf("read %d batches, wrote %d", len(got), n)
	}
	if buf, code := p.Read(nil, p.HighWatermark(), 1<<20, p.HighWatermark()); code != 0 || len(buf) != 0 {
		t.Fatalf("read at HWM returned %d bytes, code %d", len(buf), code)
	}
	// A clean close leaves no zero tail.
	path, logical := activeLogPath(p), seg.size.Load()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if fs := fileSize(t, path); fs != logical {
		t.Fatalf("clean close left file %d, logical %d", fs, logical)
	}
}

func TestPrezeroRecoveryAfterKill(t *testing.T) {
	// What the crash leaves past the acknowledged batches, on top of the zeroer's tail.
	cases := map[string]func(t *testing.T, path string, logical int64){
		"zero tail": func(*testing.T, string, int64) {},
		"zero tail then a hole (crash mid-extension)": func(t *testing.T, path string, _ int64) {
			if err := os.Truncate(path, fileSize(t, path)+3<<20); err != nil {
				t.Fatal(err)
			}
		},
		"extension cut short (zeros end mid-file)": func(t *testing.T, path string, logical int64) {
			if err := os.Truncate(path, logical+5000); err != nil {
				t.Fatal(err)
			}
		},
		"torn batch over the zeros": func(t *testing.T, path string, logical int64) {
			b := makeBatch(t, tb{n: 4, value: 300})
			b.SetBaseOffset(1 << 20) // whatever: the CRC no longer matches after the tear
			writeAt(t, path, b[:len(b)/2], logical)
		},
		"later pages of an unacknowledged batch without its header": func(t *testing.T, path string, logical int64) {
			b := makeBatch(t, tb{n: 40, value: 300})
			writeAt(t, path, b[4096:], logical+4096)
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, withPrealloc)
			p := newPartition(t, s, nil)
			n := fillPastZeroStart(t, p)
			for i := 0; i < 10; i++ { // acknowledged writes into the zeroed region
				mustAppend(t, p, makeBatch(t, tb{n: 3, value: 200}), 0)
				n++
			}
			leo, path, logical := p.LogEndOffset(), activeLogPath(p), p.active.size.Load()
			crash(s)
			if fileSize(t, path) <= logical {
				t.Fatal("the crash left no zero tail")
			}
			damage(t, path, logical)
			s = openStore(t, dir, withPrealloc)
			defer s.Close()
			p = s.Topic("t").Partition(0)
			if p.LogEndOffset() != leo || p.HighWatermark() != leo {
				t.Fatalf("leo %d hwm %d, want %d", p.LogEndOffset(), p.HighWatermark(), leo)
			}
			if got := readAll(t, p, 0); len(got) != n {
				t.Fatalf("%d batches after recovery, want %d", len(got), n)
			}
			if fs := fileSize(t, path); fs != logical || p.active.size.Load() != logical {
				t.Fatalf("tail not cut: file %d, logical %d, want %d", fs, p.active.size.Load(), logical)
			}
			// The log continues at the right offset, and pre-zeroing resumes.
			if r := mustAppend(t, p, makeBatch(t, tb{}), 0); r.BaseOffset != leo {
				t.Fatalf("next append at %d, want %d", r.BaseOffset, leo)
			}
			seg := p.active
			eventually(t, "pre-zeroing after recovery", func() bool { return seg.zeroSynced.Load() > seg.size.Load() })
		})
	}
}

func writeAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// A closed segment with a zero tail but no indexes (crash during the roll that closed it, after
// the truncation but before it reached the disk) is scanned and cut, not served with zeros; one
// with indexes but a zero tail (cannot happen, checked anyway) is rebuilt.
func TestPrezeroClosedSegmentWithZeroTail(t *testing.T) {
	for _, keepIndexes := range []bool{false, true} {
		t.Run("indexes="+strconv.FormatBool(keepIndexes), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, withPrealloc)
			p := newPartition(t, s, map[string]string{"segment.bytes": "4096"})
			for i := 0; i < 20; i++ {
				mustAppend(t, p, makeBatch(t, tb{n: 2, value: 100}), 0)
			}
			first := (*p.segs.Load())[0]
			path, logical := first.path(".log"), first.size.Load()
			crash(s)
			if err := os.Truncate(path, logical+64<<10); err != nil {
				t.Fatal(err)
			}
			if !keepIndexes {
				os.Remove(first.path(".index"))
				os.Remove(first.path(".timeindex"))
			}
			s = openStore(t, dir, withPrealloc)
			defer s.Close()
			p = s.Topic("t").Partition(0)
			if got := readAll(t, p, 0); len(got) != 20 {
				t.Fatalf("%d batches, want 20", len(got))
			}
			if fs := fileSize(t, path); fs != logical {
				t.Fatalf("closed segment file %d, logical %d", fs, logical)
			}
		})
	}
}

func TestPrezeroRollTruncatesAndRetentionUsesLogicalSizes(t *testing.T) {
	ffs := &faultFS{}
	s := openStore(t, "", withPrealloc, func(c *Config) { c.FS = ffs })
	defer s.Close()
	const segBytes = 256 << 10
	p := newPartition(t, s, map[string]string{"segment.bytes": strconv.Itoa(segBytes), "retention.ms": "-1"})
	// Fill the first segment past zeroStart and let the zeroer reach segment.bytes.
	for p.active.size.Load() < zeroStart+4096 {
		mustAppend(t, p, makeBatch(t, tb{n: 4, value: 250}), 0)
	}
	seg := p.active
	eventually(t, "zeroed up to segment.bytes", func() bool { return seg.zeroSynced.Load() == segBytes })
	if fs := fileSize(t, seg.path(".log")); fs != segBytes {
		t.Fatalf("zeroed past segment.bytes: file %d", fs)
	}
	// segment.bytes compares the logical size: the segment rolls when its batches fill it, not
	// at once because the file is already segment.bytes long.
	if len(*p.segs.Load()) != 1 {
		t.Fatal("rolled on the file size")
	}
	for len(*p.segs.Load()) < 4 {
		mustAppend(t, p, makeBatch(t, tb{n: 4, value: 250}), 0)
	}
	segs := *p.segs.Load()
	for _, c := range segs[:len(segs)-1] {
		if fs := fileSize(t, c.path(".log")); fs != c.size.Load() || fs > segBytes || c.zeroOn.Load() {
			t.Fatalf("closed segment %d: file %d, logical %d, zeroing %v", c.base, fs, c.size.Load(), c.zeroOn.Load())
		}
	}
	// The active segment gets a long zero tail; retention must not count it.
	for p.active.size.Load() < zeroStart+4096 {
		mustAppend(t, p, makeBatch(t, tb{n: 4, value: 250}), 0)
	}
	act := p.active
	eventually(t, "active zero tail", func() bool { return act.zeroSynced.Load() == segBytes })
	segs = *p.segs.Load()
	var total int64
	for _, c := range segs {
		total += c.size.Load()
	}
	// Exactly enough to keep all but the oldest segment by logical size.
	if err := s.AlterTopicConfig("t", map[string]*string{"retention.bytes": ptr(strconv.FormatInt(total-segs[0].size.Load(), 10))}); err != nil {
		t.Fatal(err)
	}
	p.retain(time.Now())
	if got := len(*p.segs.Load()); got != len(segs)-1 || p.LogStartOffset() != segs[1].base {
		t.Fatalf("retention kept %d of %d segments, log start %d", got, len(segs), p.LogStartOffset())
	}
}

func TestPrezeroFailureFallsBackToFsync(t *testing.T) {
	ffs := &faultFS{zeroErr: syscall.ENOSPC, partial: 5000}
	dir := t.TempDir()
	s := openStore(t, dir, withPrealloc, withoutWAL, func(c *Config) { c.FS = ffs })
	p := newPartition(t, s, nil)
	n := 0
	for p.active.size.Load() < zeroStart+4096 {
		mustAppend(t, p, makeBatch(t, tb{n: 4, value: 250}), 0)
		n++
	}
	seg := p.active
	eventually(t, "pre-zeroing given up", func() bool { return ffs.zeroWrite.Load() > 0 && !seg.zeroOn.Load() })
	// The part of the zero write that reached the disk is cut: no space is held by junk.
	if fs := fileSize(t, activeLogPath(p)); fs != seg.size.Load() {
		t.Fatalf("file %d, logical %d after failed zeroing", fs, seg.size.Load())
	}
	ds := ffs.datasyncs.Load()
	for i := 0; i < 10; i++ {
		mustAppend(t, p, makeBatch(t, tb{n: 4, value: 250}), 0)
		n++
	}
	if ffs.datasyncs.Load() != ds || ffs.zeroWrite.Load() != 1 {
		t.Fatalf("after the failure: %d fdatasyncs, %d zero writes", ffs.datasyncs.Load()-ds, ffs.zeroWrite.Load())
	}
	if got := readAll(t, p, 0); len(got) != n {
		t.Fatalf("%d batches, want %d", len(got), n)
	}
	crash(s)
	s = openStore(t, dir, withPrealloc)
	defer s.Close()
	if got := readAll(t, s.Topic("t").Partition(0), 0); len(got) != n {
		t.Fatalf("%d batches after reopen, want %d", len(got), n)
	}
}

// The disk-full path of an append that lands inside the zeroed region: the half batch and the
// zero tail are cut, the retry succeeds, and pre-zeroing stops for the segment.
func TestPrezeroDiskFullInsideZeroedRegion(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, withPrealloc, func(c *Config) { c.FS = ffs })
	p := newPartition(t, s, nil)
	n := fillPastZeroStart(t, p)
	seg := p.active
	size := seg.size.Load()
	ffs.set(func(f *faultFS) { f.writeErr, f.partial = syscall.ENOSPC, 30 })
	if r := p.Append(makeBatch(t, tb{pid: 1, seq: 0}), 0); r.Code != codec.CodeKafkaStorageError {
		t.Fatalf("disk full: %+v", r)
	}
	if fs := fileSize(t, activeLogPath(p)); fs != size || seg.zeroOn.Load() || seg.zeroSynced.Load() > size {
		t.Fatalf("after failed write: file %d, want %d; zeroing %v", fs, size, seg.zeroOn.Load())
	}
	ffs.set(func(f *faultFS) { f.writeErr = nil })
	if r := mustAppend(t, p, makeBatch(t, tb{pid: 1, seq: 0}), 0); r.Duplicate {
		t.Fatalf("retry: %+v", r)
	}
	n++
	crash(s)
	s = openStore(t, dir, withPrealloc)
	defer s.Close()
	if got := readAll(t, s.Topic("t").Partition(0), 0); len(got) != n {
		t.Fatalf("%d batches after reopen, want %d", len(got), n)
	}
}

// Concurrent appends racing the zeroer (run under -race): every batch is read back intact and
// the file never has a zero byte inside the logical size.
func TestPrezeroConcurrentAppendsAndReads(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, withPrealloc)
	p := newPartition(t, s, map[string]string{"segment.bytes": strconv.Itoa(3 << 20)})
	const producers, each = 4, 300
	done := make(chan error, producers)
	for g := 0; g < producers; g++ {
		go func() {
			for i := 0; i < each; i++ {
				r := p.Append(makeBatch(t, tb{n: 8, value: 400}), 0)
				if r.Code != 0 {
					done <- os.ErrInvalid
					return
				}
				if err := syncWait(p, r.LastOffset+1); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	stop := make(chan struct{})
	readerDone := make(chan int)
	go func() {
		bad := 0
		for {
			select {
			case <-stop:
				readerDone <- bad
				return
			default:
			}
			h := p.HighWatermark()
			from := p.LogStartOffset()
			for from < h {
				buf, code := p.Read(nil, from, 1<<20, h)
				if code != 0 || len(buf) == 0 {
					bad++
					break
				}
				for len(buf) > 0 {
					b, ok, _ := codec.FrameBatch(buf)
					if !ok || !b.CRCValid() {
						bad++
						buf = nil
						from = h
						break
					}
					buf = buf[len(b):]
					from = b.LastOffset() + 1
				}
			}
		}
	}()
	for g := 0; g < producers; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if bad := <-readerDone; bad != 0 {
		t.Fatalf("%d bad reads", bad)
	}
	if got := readAll(t, p, 0); len(got) != producers*each {
		t.Fatalf("%d batches, want %d", len(got), producers*each)
	}
	if len(*p.segs.Load()) < 2 || prezeroBytesTotal.Get() == 0 {
		t.Fatal("want rolls and pre-zeroing")
	}
	for _, seg := range *p.segs.Load() {
		data, err := os.ReadFile(seg.path(".log"))
		if err != nil {
			t.Fatal(err)
		}
		logical := seg.size.Load()
		if seg != p.active && int64(len(data)) != logical {
			t.Fatalf("closed segment %d: file %d, logical %d", seg.base, len(data), logical)
		}
		// Zeros inside the log would show as a batch whose header is zero.
		r := batchReader{f: seg.f, end: logical}
		var pos int64
		for {
			b, status, err := r.next(true)
			if err != nil || status == batchBad || status == batchTorn {
				t.Fatalf("segment %d at %d: status %d %v", seg.base, pos, status, err)
			}
			if status == batchEOF {
				break
			}
			if bytes.Equal(b[:codec.LogOverhead], make([]byte, codec.LogOverhead)) || !b.CRCValid() {
				t.Fatalf("segment %d: bad batch at %d", seg.base, pos)
			}
			pos += int64(len(b))
		}
		if pos != logical {
			t.Fatalf("segment %d: batches end at %d, logical %d", seg.base, pos, logical)
		}
	}
	leo := p.LogEndOffset()
	crash(s)
	s = openStore(t, dir, withPrealloc)
	defer s.Close()
	if p := s.Topic("t").Partition(0); p.LogEndOffset() != leo || len(readAll(t, p, 0)) != producers*each {
		t.Fatalf("after kill: leo %d, want %d", p.LogEndOffset(), leo)
	}
}

// withPrealloc turns log.preallocate on whatever KAAS_TEST_PREALLOCATE says: these tests are
// about the pre-zeroed tail.
func withPrealloc(c *Config) { c.Preallocate = true }
