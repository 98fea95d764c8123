package storage

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kaas-go/kaas/codec"
)

// On-disk layout of one partition directory:
//
//	00000000000000000000.log        v2 record batches, back to back, baseOffsets contiguous
//	00000000000000000000.index      sparse offset index: (relOffset int32, position int32) BE
//	00000000000000000000.timeindex  time index: (maxTimestampSoFar int64, relOffset int32) BE
//	00000000000000000000.txnindex   aborted transactions whose marker is in the segment (txn.go)
//	00000000000000001234.snapshot   producer state as of offset 1234 (producer.go)
//
// In cluster mode (cluster.go) every name carries the writer's leader epoch,
// <base>-<epoch %010d>.log and so on, and the directory also holds epoch-<E>.json (where the
// previous epoch ended), <base>-<E>.ckpt (recovery checkpoint, recovery_ckpt.go) and
// epoch-<E>.prev.{ckpt,txnindex} (the indexes a taker rebuilt for a crashed epoch's open segment).
//
// Index files are written only when a segment is closed (roll, clean Close), atomically (tmp +
// fsync + rename). The active segment's indexes live in memory and are rebuilt by the recovery
// scan on open, so the hot path never writes or fsyncs an index.

const (
	indexEntrySize     = 8
	timeIndexEntrySize = 12
)

func segmentName(base int64, ext string) string { return fmt.Sprintf("%020d%s", base, ext) }

// noEpoch names a file without an epoch suffix: single-broker mode's names, read as epoch 0.
const noEpoch int32 = -1

// epochFileName is a segment or snapshot file name. Cluster mode (cluster.go) puts the writer's
// leader epoch into every name, so that no two leaders ever write one file (design §2.3).
func epochFileName(base int64, epoch int32, ext string) string {
	if epoch < 0 {
		return segmentName(base, ext)
	}
	return fmt.Sprintf("%020d-%010d%s", base, epoch, ext)
}

type indexEntry struct{ rel, pos int32 }

type timeEntry struct {
	ts  int64
	rel int32
}

// segment is one log file plus its in-memory indexes.
type segment struct {
	base int64
	dir  string
	f    File
	// epoch is the leader epoch in the file names (noEpoch: single-broker names). foreign marks
	// a segment another epoch wrote (cluster mode): it is read, never written, truncated or
	// given new index files by this partition.
	epoch   int32
	foreign bool
	// stem, when set, is the file name without extension of a cluster-mode cleaned segment
	// (<base>-<E>.c<seq>, cleaner_cluster.go); it overrides the name built from base and epoch.
	stem string
	// ckptPos is the position of the last recovery checkpoint written (recovery_ckpt.go).
	ckptPos atomic.Int64

	deleted bool // file closed by retention/shutdown; guarded by the partition's segMu

	// size is the logical end of the segment: the end of the last whole batch written. Readers,
	// the index, roll (segment.bytes) and retention (retention.bytes) only ever use it, never the
	// file size: the active segment's file usually extends past it with pre-zeroed bytes (see
	// zeroTo), and a write in progress (or one that failed and is being truncated away) is never
	// visible.
	size atomic.Int64

	// Pre-zeroing of the active segment (zeroTo). File layout:
	//
	//	0            size          zeroSynced         filled        file size
	//	|== batches ==|=== zeros (written, fsync'd) ===|== zeros ==|(junk of a failed write)
	//
	// filled never decreases except by truncate (under zmu); zeroSynced <= filled.
	zmu        sync.Mutex   // serialises zero writes, writes past filled, truncations, seal
	zf         File         // the zeroer's own handle (own fsync error cursor), guarded by zmu
	zgen       uint64       // bumped by every truncation, guarded by zmu
	zeroOn     atomic.Bool  // pre-zeroing allowed (active segment, no write or zero failure)
	filled     atomic.Int64 // [0, filled) of the file is written: batches or zeros
	zeroSynced atomic.Int64 // [0, zeroSynced) is written AND fsync'd: size and extents durable

	mu              sync.Mutex // guards the fields below: the appender writes, readers look up
	index           []indexEntry
	tindex          []timeEntry
	next            int64 // offset after the last batch (= base when empty)
	maxTs           int64 // largest batch maxTimestamp, -1 when empty
	maxTsOff        int64 // baseOffset of the first batch carrying maxTs
	rollTs          int64 // time the segment.ms clock starts: first append's wall clock, -1 when empty
	bytesSinceIndex int64
}

func newSegment(dir string, base int64, f File) *segment {
	return &segment{base: base, dir: dir, f: f, epoch: noEpoch, next: base, maxTs: -1, maxTsOff: -1, rollTs: -1}
}

func (s *segment) name(ext string) string {
	if s.stem != "" {
		return s.stem + ext
	}
	return epochFileName(s.base, s.epoch, ext)
}

func (s *segment) path(ext string) string { return filepath.Join(s.dir, s.name(ext)) }

// Pre-zeroing (the active segment's durability fast path).
//
// An append grows the file, so a flush of it must commit the new inode size and extents through
// the file system journal (ext4: a jbd2 commit), and the fsyncs of all partitions serialise on
// that journal. Writing into blocks that are already allocated AND written needs no metadata, so
// fdatasync(2) only writes the data blocks. The partition's zeroer goroutine therefore keeps a
// region ahead of the logical end written with zeros and fsync'd; the flusher uses fdatasync
// when everything it flushes lies below zeroSynced, and fsync otherwise. fallocate(2) alone does
// not help: it leaves unwritten extents, and the first write into one converts it (a metadata
// change that fdatasync must commit).
//
// Crash safety: batches are written over zeros, and an all-zero batch header (length 0) is
// end-of-log to the recovery scan, which truncates the tail. Every truncation bumps zgen so a
// zeroer fsync that raced it never publishes zeroSynced past the truncation point. A closed
// segment is sealed (no more zeroing) and truncated to its logical size before its fsync, so it
// never carries a zero tail.
const (
	zeroStart      = 64 << 10 // pre-zero only once a segment holds this much (active partition)
	zeroAheadMin   = 1 << 20
	zeroAheadMax   = 16 << 20
	zeroChunk      = 256 << 10 // one zero write under zmu (an outrunning appender waits at most this)
	zeroSyncStride = 4 << 20   // fsync (and publish zeroSynced) every this many zeroed bytes
)

// zeroBuf is shared read-only by every zeroer.
var zeroBuf = make([]byte, zeroChunk)

// zeroAhead is how far ahead of the logical end the zeroed region should reach: it grows with
// the segment (a partition that only ever gets a few batches costs little disk).
func zeroAhead(size int64) int64 { return min(max(size, zeroAheadMin), zeroAheadMax) }

// needsZeroing reports (cheaply, on the append path) whether the zeroer should extend the
// zeroed region of this segment, whose logical end is now end.
func (s *segment) needsZeroing(end, segBytes int64) bool {
	if end < zeroStart || !s.zeroOn.Load() {
		return false
	}
	f := s.filled.Load()
	return f < segBytes && f-end < zeroAhead(end)/2
}

// writeAt writes a batch at pos (the logical end). Below filled the bytes overwrite zeros and
// cannot meet a zero write (the zeroer only writes at or past filled); past it, zmu keeps the
// zeroer out while the file grows.
func (s *segment) writeAt(b []byte, pos int64) error {
	end := pos + int64(len(b))
	if end <= s.filled.Load() {
		_, err := s.f.WriteAt(b, pos)
		return err
	}
	s.zmu.Lock()
	defer s.zmu.Unlock()
	_, err := s.f.WriteAt(b, pos)
	if err == nil && end > s.filled.Load() {
		s.filled.Store(end)
	}
	return err
}

// truncate cuts the file at n (n >= the data to keep). With seal, pre-zeroing stops for good
// (segment closing, or a write failed: the disk is in trouble, fall back to append + fsync).
func (s *segment) truncate(n int64, seal bool) error {
	s.zmu.Lock()
	defer s.zmu.Unlock()
	if seal {
		s.sealLocked()
	}
	s.zgen++
	if s.filled.Load() > n {
		s.filled.Store(n)
	}
	if s.zeroSynced.Load() > n {
		s.zeroSynced.Store(n)
	}
	return s.f.Truncate(n)
}

// seal stops pre-zeroing of this segment and closes the zeroer's handle.
func (s *segment) seal() {
	s.zmu.Lock()
	s.sealLocked()
	s.zmu.Unlock()
}

func (s *segment) sealLocked() {
	s.zeroOn.Store(false)
	if s.zf != nil {
		_ = s.zf.Close()
		s.zf = nil
	}
}

// zeroTo extends the zeroed region to target (never past what the caller allows: segment.bytes),
// in chunks under zmu, fsyncing every zeroSyncStride bytes through the zeroer's own handle and
// publishing zeroSynced after each fsync. open opens the zeroer's handle. It returns an error
// (after sealing the segment, so pre-zeroing stops) if a zero write or fsync fails; a failed
// zero write is truncated away so ENOSPC leaves no allocated junk behind.
//
// Its own handle matters: Linux reports a writeback error once per open file description, so an
// fsync error seen by the zeroer on the flusher's handle would be consumed, and the flusher's
// next fsync could "succeed" for data that never reached the disk.
func (s *segment) zeroTo(target int64, open func() (File, error)) (zeroed int64, err error) {
	for {
		s.zmu.Lock()
		if !s.zeroOn.Load() {
			s.zmu.Unlock()
			return zeroed, nil
		}
		if s.zf == nil {
			if s.zf, err = open(); err != nil {
				s.zf = nil
				s.sealLocked()
				s.zmu.Unlock()
				return zeroed, err
			}
		}
		gen, zf := s.zgen, s.zf
		from := s.filled.Load()
		if from >= target {
			s.zmu.Unlock()
			return zeroed, nil
		}
		stop := min(target, from+zeroSyncStride)
		for from < stop {
			n := min(int64(zeroChunk), stop-from)
			if _, err = zf.WriteAt(zeroBuf[:n], from); err != nil {
				_ = zf.Truncate(from)
				s.sealLocked()
				s.zmu.Unlock()
				return zeroed, err
			}
			zeroed += n
			from += n
			s.filled.Store(from)
			// Let an appender that outruns us (writing past filled) in between chunks, and
			// push the chunk to the disk now, so a concurrent flush never waits for more than
			// one chunk of zeros (errors surface at the fsync below).
			s.zmu.Unlock()
			if rw, ok := zf.(rangeWriter); ok {
				_ = rw.WriteBack(from-n, n)
			}
			s.zmu.Lock()
			if s.zgen != gen || !s.zeroOn.Load() {
				s.zmu.Unlock()
				return zeroed, nil
			}
			from = s.filled.Load()
		}
		s.zmu.Unlock()
		// Everything below from was written before this fsync started, batches included: the
		// fsync makes its size and extents durable, so fdatasync suffices for it from now on.
		err = zf.Sync()
		s.zmu.Lock()
		if err != nil {
			s.sealLocked()
			s.zmu.Unlock()
			return zeroed, err
		}
		if s.zgen == gen && from > s.zeroSynced.Load() {
			s.zeroSynced.Store(from)
		}
		s.zmu.Unlock()
	}
}

// track records a batch just written at pos in the in-memory indexes. An index entry is added for
// the first batch and then once at least interval bytes were written since the previous entry
// (Kafka's index.interval.bytes). A time entry is added alongside when the max timestamp grew.
func (s *segment) track(b codec.Batch, pos int64, interval int64, nowMs int64) {
	s.mu.Lock()
	rel := int32(b.BaseOffset() - s.base)
	if ts := b.MaxTimestamp(); ts > s.maxTs {
		s.maxTs, s.maxTsOff = ts, b.BaseOffset()
	}
	if len(s.index) == 0 || s.bytesSinceIndex >= interval {
		s.index = append(s.index, indexEntry{rel: rel, pos: int32(pos)})
		s.bytesSinceIndex = 0
		s.addTimeEntryLocked()
	}
	s.bytesSinceIndex += int64(len(b))
	if s.rollTs < 0 {
		s.rollTs = nowMs
	}
	s.next = b.LastOffset() + 1
	s.mu.Unlock()
}

func (s *segment) addTimeEntryLocked() {
	if s.maxTs < 0 {
		return
	}
	if n := len(s.tindex); n == 0 || s.tindex[n-1].ts < s.maxTs {
		s.tindex = append(s.tindex, timeEntry{ts: s.maxTs, rel: int32(s.maxTsOff - s.base)})
	}
}

// lookup returns the file position of the last indexed batch whose baseOffset <= offset: a safe
// place to start scanning for the batch containing offset.
func (s *segment) lookup(offset int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	rel := offset - s.base
	i := sort.Search(len(s.index), func(i int) bool { return int64(s.index[i].rel) > rel })
	if i == 0 {
		return 0
	}
	return int64(s.index[i-1].pos)
}

// timeLookup returns an offset from which scanning finds the first batch with maxTimestamp >= ts:
// every batch before the last time entry with a smaller timestamp is older than ts.
func (s *segment) timeLookup(ts int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.tindex), func(i int) bool { return s.tindex[i].ts >= ts })
	if i == 0 {
		return s.base
	}
	return s.base + int64(s.tindex[i-1].rel)
}

func (s *segment) stats() (next, maxTs, maxTsOff int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next, s.maxTs, s.maxTsOff
}

// truncateIndexLocked drops index entries at or beyond pos / offset after the log was cut back.
func (s *segment) truncateIndexLocked(pos, next int64) {
	for len(s.index) > 0 && int64(s.index[len(s.index)-1].pos) >= pos {
		s.index = s.index[:len(s.index)-1]
	}
	for len(s.tindex) > 0 && s.base+int64(s.tindex[len(s.tindex)-1].rel) >= next {
		s.tindex = s.tindex[:len(s.tindex)-1]
	}
	s.next = next
	s.bytesSinceIndex = 0
	if len(s.index) > 0 {
		s.bytesSinceIndex = pos - int64(s.index[len(s.index)-1].pos)
	}
	s.maxTs, s.maxTsOff = -1, -1
	if n := len(s.tindex); n > 0 {
		s.maxTs, s.maxTsOff = s.tindex[n-1].ts, s.base+int64(s.tindex[n-1].rel)
	}
	// maxTs may now be too low for batches between the last time entry and next; it is only a
	// lower bound used by retention and lookups until the next roll, which is acceptable after
	// an fsync failure (rare) because retention only considers closed segments, whose max is
	// recomputed by a scan when their index is rebuilt.
	if next == s.base {
		s.rollTs = -1
	}
}

// writeIndexes persists the segment's indexes (closing it). A final time entry for the max
// timestamp is added first, as Kafka does on roll, so the last time entry is the segment's max.
func (s *segment) writeIndexes() error {
	idx, tidx := s.encodeIndexes()
	if err := WriteFileAtomic(s.dir, s.name(".index"), idx); err != nil {
		return err
	}
	return WriteFileAtomic(s.dir, s.name(".timeindex"), tidx)
}

// encodeIndexes encodes the .index and .timeindex contents (adding the final time entry).
func (s *segment) encodeIndexes() (idx, tidx []byte) {
	s.mu.Lock()
	s.addTimeEntryLocked()
	idx = make([]byte, 0, len(s.index)*indexEntrySize)
	for _, e := range s.index {
		idx = binary.BigEndian.AppendUint32(idx, uint32(e.rel))
		idx = binary.BigEndian.AppendUint32(idx, uint32(e.pos))
	}
	tidx = make([]byte, 0, len(s.tindex)*timeIndexEntrySize)
	for _, e := range s.tindex {
		tidx = binary.BigEndian.AppendUint64(tidx, uint64(e.ts))
		tidx = binary.BigEndian.AppendUint32(tidx, uint32(e.rel))
	}
	s.mu.Unlock()
	return idx, tidx
}

// loadIndexes reads a closed segment's index files and checks them against the log size and the
// next segment's base offset. It returns false if they are missing or inconsistent (the caller
// rebuilds them by scanning).
func (s *segment) loadIndexes(size, next int64) bool {
	idx, err1 := os.ReadFile(s.path(".index"))
	tidx, err2 := os.ReadFile(s.path(".timeindex"))
	if err1 != nil || err2 != nil || len(idx)%indexEntrySize != 0 || len(tidx)%timeIndexEntrySize != 0 {
		return false
	}
	if size == 0 {
		// Empty closed segment (left behind by a repair, see repairLocked).
		if len(idx) != 0 || len(tidx) != 0 || next < s.base {
			return false
		}
		s.mu.Lock()
		s.next = next
		s.mu.Unlock()
		return true
	}
	if len(idx) == 0 || len(tidx) == 0 || next <= s.base {
		return false
	}
	maxRel := next - 1 - s.base
	index := make([]indexEntry, 0, len(idx)/indexEntrySize)
	for i := 0; i < len(idx); i += indexEntrySize {
		e := indexEntry{rel: int32(binary.BigEndian.Uint32(idx[i:])), pos: int32(binary.BigEndian.Uint32(idx[i+4:]))}
		if e.rel < 0 || int64(e.rel) > maxRel || e.pos < 0 || int64(e.pos) >= size {
			return false
		}
		// The first entry is at position 0 but not always at rel 0: a cleaned segment
		// (cleaner.go) may have lost its first offsets.
		if n := len(index); (n == 0 && e.pos != 0) || (n > 0 && (e.rel <= index[n-1].rel || e.pos <= index[n-1].pos)) {
			return false
		}
		index = append(index, e)
	}
	tindex := make([]timeEntry, 0, len(tidx)/timeIndexEntrySize)
	for i := 0; i < len(tidx); i += timeIndexEntrySize {
		e := timeEntry{ts: int64(binary.BigEndian.Uint64(tidx[i:])), rel: int32(binary.BigEndian.Uint32(tidx[i+8:]))}
		if e.rel < 0 || int64(e.rel) > maxRel || (len(tindex) > 0 && e.ts <= tindex[len(tindex)-1].ts) {
			return false
		}
		tindex = append(tindex, e)
	}
	// The batches from the last index entry must end exactly at the end of the file: a closed
	// segment never has a zero tail (roll truncates it before the fsync that precedes the
	// index write), and if it somehow had one, the rebuild scan must cut it rather than readers
	// serving zeros. This reads a few headers (one index interval).
	if !framesToEnd(s.f, int64(index[len(index)-1].pos), size) {
		return false
	}
	last := tindex[len(tindex)-1]
	s.mu.Lock()
	s.index, s.tindex = index, tindex
	s.next = next
	s.maxTs, s.maxTsOff = last.ts, s.base+int64(last.rel)
	s.rollTs = last.ts
	s.mu.Unlock()
	s.size.Store(size)
	return true
}

// framesToEnd reports whether the batch headers from pos frame exactly up to size.
func framesToEnd(f File, pos, size int64) bool {
	var hdr [codec.BatchHeaderSize]byte
	for pos < size {
		if size-pos < codec.BatchHeaderSize {
			return false
		}
		if _, err := f.ReadAt(hdr[:], pos); err != nil {
			return false
		}
		b := codec.Batch(hdr[:])
		total := int64(int32(binary.BigEndian.Uint32(hdr[8:]))) + codec.LogOverhead
		if total < codec.BatchHeaderSize || b.Magic() != 2 || pos+total > size {
			return false
		}
		pos += total
	}
	return pos == size
}

// resetIndexes clears the in-memory state before a rebuild scan.
func (s *segment) resetIndexes() {
	s.mu.Lock()
	s.index, s.tindex = nil, nil
	s.next, s.maxTs, s.maxTsOff, s.rollTs, s.bytesSinceIndex = s.base, -1, -1, -1, 0
	s.mu.Unlock()
	s.size.Store(0)
}

// recover scans the whole segment, verifying every batch (length, magic, CRC32C, contiguous
// offsets starting at base), rebuilding the in-memory indexes, and truncates the file at the first
// batch that fails (a torn write from a crash, garbage, or the pre-zeroed tail of an active
// segment). It returns how many bytes were cut and whether the cut began with an all-zero batch
// header: that is the normal end of a pre-zeroed segment (zeroTo), not corruption. A zero length
// field never frames (12 < the 61-byte header), so zeros are never taken for a batch. The caller
// fsyncs the file afterwards.
func (s *segment) recover(interval int64, gaps bool) (cut int64, zeroTail bool, err error) {
	st, err := s.f.Stat()
	if err != nil {
		return 0, false, err
	}
	fileSize := st.Size()
	s.resetIndexes()
	r := batchReader{f: s.f, end: fileSize}
	expect := s.base
	var pos int64
	for {
		b, status, err := r.next(true)
		if err != nil {
			return 0, false, err
		}
		if status != batchOK || !validStoredBatch(b, expect, gaps) {
			break
		}
		s.track(b, pos, interval, b.MaxTimestamp())
		pos += int64(len(b))
		expect = b.LastOffset() + 1
	}
	if pos < fileSize {
		var hdr [codec.LogOverhead]byte
		n, rerr := s.f.ReadAt(hdr[:min(int64(len(hdr)), fileSize-pos)], pos)
		if rerr != nil && rerr != io.EOF {
			return 0, false, rerr
		}
		zeroTail = n > 0 && allZero(hdr[:n])
		if err := s.truncate(pos, false); err != nil {
			return 0, false, err
		}
	}
	s.size.Store(pos)
	s.filled.Store(pos)
	return fileSize - pos, zeroTail, nil
}

// scanTo is recover for a segment this partition must not modify (cluster mode: another
// epoch's file): it verifies batches up to limit bytes (-1: the file size), from the segment's
// recovery checkpoint if it has one (recovery_ckpt.go) or else from the start, rebuilds the
// in-memory indexes and stops at the first batch that fails, without truncating. The logical
// size becomes the end of the last valid batch; the bytes scanned are returned.
func (s *segment) scanTo(interval, limit int64) (int64, error) {
	return s.scanRange(interval, limit, false)
}

// scanRange is scanTo; gaps accepts offset gaps between batches (a cleaned segment, see
// validStoredBatch).
func (s *segment) scanRange(interval, limit int64, gaps bool) (int64, error) {
	st, err := s.f.Stat()
	if err != nil {
		return 0, err
	}
	end := st.Size()
	if limit >= 0 {
		end = min(end, limit)
	}
	s.resetIndexes()
	start := s.loadRecoveryCheckpoint(end)
	r := batchReader{f: s.f, pos: start, end: end}
	s.mu.Lock()
	expect := s.next
	s.mu.Unlock()
	pos := start
	for {
		b, status, err := r.next(true)
		if err != nil {
			return 0, err
		}
		if status != batchOK || !validStoredBatch(b, expect, gaps) {
			break
		}
		s.track(b, pos, interval, b.MaxTimestamp())
		pos += int64(len(b))
		expect = b.LastOffset() + 1
	}
	s.size.Store(pos)
	s.filled.Store(pos)
	return pos - start, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// validStoredBatch checks what recovery relies on: magic 2, CRC32C, the expected base offset (or,
// with gaps, one at or past it), and sane header counts. gaps is for closed segments only: one
// rewritten by the cleaner (cleaner.go) has offset gaps, as Apache's compacted segments do. The
// active segment is never cleaned, so there a jump is a stale or foreign batch and ends the log.
func validStoredBatch(b codec.Batch, expectBase int64, gaps bool) bool {
	return len(b) >= codec.BatchHeaderSize && b.Magic() == 2 &&
		(b.BaseOffset() == expectBase || (gaps && b.BaseOffset() > expectBase)) &&
		b.LastOffsetDelta() >= 0 && b.CRCValid()
}

// Batch reader statuses.
const (
	batchOK  = iota
	batchEOF // clean end
	batchTorn
	batchBad
)

// batchReader walks batches of a file through a buffer of preads. With full=false only the
// 61-byte header of each batch is returned (large batches are skipped without reading them).
type batchReader struct {
	f      File
	pos    int64 // position of the next batch
	end    int64
	buf    []byte
	bufPos int64 // file position of buf[0]

	wholeControl bool // with full=false, still return control batches whole (markers are parsed)
}

const readChunk = 1 << 20

// ensure makes buf cover [r.pos, r.pos+n) (n <= end-pos is checked by the caller).
func (r *batchReader) ensure(n int64) error {
	if r.pos >= r.bufPos && r.pos+n <= r.bufPos+int64(len(r.buf)) {
		return nil
	}
	size := max(int64(readChunk), n)
	if size > r.end-r.pos {
		size = r.end - r.pos
	}
	if int64(cap(r.buf)) < size {
		r.buf = make([]byte, size)
	}
	r.buf = r.buf[:size]
	m, err := r.f.ReadAt(r.buf, r.pos)
	if err != nil && !(err == io.EOF && int64(m) >= n) {
		if err == io.EOF {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	r.buf = r.buf[:m]
	r.bufPos = r.pos
	return nil
}

func (r *batchReader) next(full bool) (codec.Batch, int, error) {
	if r.pos >= r.end {
		return nil, batchEOF, nil
	}
	if r.end-r.pos < codec.BatchHeaderSize {
		return nil, batchTorn, nil
	}
	if err := r.ensure(codec.BatchHeaderSize); err != nil {
		return nil, batchTorn, err
	}
	off := r.pos - r.bufPos
	total := int64(int32(binary.BigEndian.Uint32(r.buf[off+8:]))) + codec.LogOverhead
	if total < codec.BatchHeaderSize {
		return nil, batchBad, nil
	}
	if r.pos+total > r.end {
		return nil, batchTorn, nil
	}
	var b codec.Batch
	if r.wholeControl && codec.Batch(r.buf[off:off+codec.BatchHeaderSize]).IsControl() {
		full = true
	}
	if full {
		if err := r.ensure(total); err != nil {
			return nil, batchTorn, err
		}
		off = r.pos - r.bufPos
		b = codec.Batch(r.buf[off : off+total])
	} else {
		b = codec.Batch(r.buf[off : off+codec.BatchHeaderSize])
	}
	r.pos += total
	return b, batchOK, nil
}
