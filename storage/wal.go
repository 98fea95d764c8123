package storage

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kaas-go/kaas/storage/framelog"
	"go.uber.org/zap"
)

// Shared write-ahead log (log.wal.enable).
//
// Why: with one flusher per partition, every partition pays its own fsync for every group of
// acks=all appends, and each of those fsyncs commits the file system journal because the append
// grew the file (ext4: a jbd2 commit). With 6 busy partitions that is thousands of fsyncs a
// second and most of the broker's CPU. The WAL turns them into ONE group-committed fdatasync of
// one pre-allocated file for all partitions of the Store, and makes segment fsyncs lazy.
// (Apache Kafka acknowledges acks=all from the page cache and relies on replication; a single
// kaas broker cannot, so it has to make the fsync cheap instead.)
//
// Layout: Dir/wal/<seq %020d>.wal, "generations" of walGenBytes (64 MiB) each, written front to
// back. A generation is pre-zeroed and fsync'd ahead of the write position (segment.zeroTo, the
// same code that pre-zeroes active segments), or is a recycled generation that was fully written
// before, so a write into it allocates nothing and the per-round fdatasync commits no metadata.
// The next generation is prepared in the background (Dir/wal/spare.wal.tmp) and renamed into
// place when the current one is full (rename + directory fsync once per generation).
//
// Record (8-byte aligned, big endian), walHeaderSize = 56 bytes of header:
//
//	magic u32 "KWAL" | crc32c u32 | seq u64 | round u64 | topicID [16] | partition i32 |
//	length u32 | baseOffset i64 | batch (length bytes) | zero padding to 8
//
// crc32c covers everything after the crc field up to the end of the batch (walFormat: the
// record is a framelog frame, so it is built, checked and scanned by the code the other logs
// share; only the round writer below is the WAL's own). seq is the
// generation's own number: a recycled file still holds records of its previous life, and those
// never carry the new seq, so they are never mistaken for records. round numbers the flusher's
// write+sync rounds (monotonic across generations and restarts). partition -1 with a zero topic
// ID is a control record (walMarker, below). The topic ID (not the name) identifies the topic,
// so a topic deleted and re-created under the same name never receives the old topic's records.
//
// Append path (flush.messages = 1 topics only; topics that acknowledge from the page cache keep
// their per-partition background fsync): under the partition's append mutex the batch is written
// to the active segment as before, then copied into the WAL's pending round (enqueue). The WAL
// flusher goroutine swaps the pending round out, writes it with one pwrite, fdatasyncs, and then
// for every partition in the round advances the durable end / HWM exactly as the per-partition
// flusher does and completes its Sync waiters. Appends that arrive during a sync form the next
// round (group commit across all partitions). The HWM (and with it the LSO, which is capped at the
// HWM) never passes WAL-durable data.
//
// Checkpoint: a generation may only be deleted (or recycled) once every record in it is durable
// in its segment. The checkpointer (after a generation fills up, and every walCheckpointEvery)
// takes the list of partitions appended to since the last checkpoint, fsyncs their active
// segments (closed segments were fsync'd by the roll that closed them), and only when all of them
// succeeded deletes the generations older than the current one (keeping walFreeKept of them to
// recycle: their blocks are allocated and written, so they need no zeroing). Invariant: every
// acknowledged byte is fsync'd in its segment or in a synced WAL record that recovery replays.
// Roll, retention and repairs keep it because closed segments are always fsync'd; topic deletion
// does not need it (replay skips unknown topic IDs); a clean Close fsyncs every active segment
// (partition shutdown) and then removes the WAL.
//
// Failures (see repairLocked on fsyncgate): a failed WAL write or fdatasync is never retried as
// if it had succeeded. The round's waiters fail, every partition with records in it (or in the
// round pending behind it) is repaired exactly as after a failed segment fsync (discard what is
// not durable, new segment at the old log end so offsets are never reused), appends answer
// KAFKA_STORAGE_ERROR meanwhile, and the WAL continues in a fresh generation whose first record
// is a walMarker naming where the failed generation was abandoned (so recovery can tell the
// abandoned tail from corruption). A failed SEGMENT fsync with the WAL on (roll, checkpoint,
// repair, close) is worse: acknowledged bytes of that segment may now exist only in the WAL, and
// a retried fsync proves nothing. That partition refuses appends until a restart (Apache takes
// the whole log directory offline in that case) and no generation is ever deleted again in this
// process ("pinned"), so the restart replays everything.
//
// Recovery (Store open), after every partition recovered its own log (torn tail cut, indexes,
// producer state): generations are replayed in seq order. Per record:
//   - unknown topic ID or partition: skipped (topic deleted);
//   - baseOffset < the partition's log end: already in the segment, skipped;
//   - baseOffset == log end: appended through the normal append path (producer state, indexes,
//     transaction index, rolls);
//   - baseOffset > log end: acknowledged records are missing: Open fails with an error.
//
// A generation's records end at the first one that does not validate. If a record of this
// generation (magic and seq match) fails, or valid records of this generation follow the end, the
// tail is torn: only the round that was being synced when the process died may be torn, so valid
// records after the end of more than one round, or of a round after the next one, mean
// corruption, and Open refuses to start. A torn tail in a generation followed by valid records in
// a later generation is corruption too, unless the later generation starts with a walMarker
// covering it (the flusher abandoned it after a failure). A torn tail of the newest generation is
// logged and replay stops there. Afterwards the replayed partitions are fsync'd and every
// generation is deleted, so the run starts with an empty WAL.
const (
	walDirName          = "wal"
	walGenBytesDefault  = 64 << 20
	walCheckpointEvery  = 2 * time.Second
	walHeaderSize       = 56
	walMagic            = 0x4b57414c // "KWAL"
	walAlign            = 8
	walSpareName        = "spare.wal.tmp"
	walMaxPendingBuffer = 16 << 20 // a round buffer larger than this is not kept for reuse
	walFreeKept         = 2        // checkpointed generations kept for recycling
)

// walMarker is a control record: partition -1, zero topic ID; baseOffset = the seq of the first
// generation abandoned after a failure, payload = 8 bytes, the position it was abandoned at.
const walMarkerPartition = -1

func walGenName(seq uint64) string { return fmt.Sprintf("%020d.wal", seq) }

// walFormat is the record layout above as a framelog frame. A record holds one batch, whose
// length is an int32 in the Kafka format.
var walFormat = framelog.Format{Magic: walMagic, HeaderLen: walHeaderSize, LenAt: 44, CRCAt: 4, CRCFrom: 8,
	Align: walAlign, MaxLen: math.MaxInt32}

func walRecLen(payload int) int { return walFormat.Size(payload) }

// appendWALRecord appends a record with seq, round and crc left zero (sealWALRecord fills them in
// when the flusher knows which generation and round it goes to).
func appendWALRecord(buf []byte, topicID [16]byte, partition int32, base int64, payload []byte) []byte {
	buf, n := walFormat.Begin(buf)
	h := buf[n:]
	copy(h[24:40], topicID[:])
	binary.BigEndian.PutUint32(h[40:], uint32(partition))
	binary.BigEndian.PutUint64(h[48:], uint64(base))
	buf = append(buf, payload...)
	return walFormat.EndUnsealed(buf, n)
}

// sealWALRecord stamps a record (starting at rec[0]) with its generation and round and computes
// its checksum. It returns the record's total (padded) length.
func sealWALRecord(rec []byte, seq, round uint64) int {
	binary.BigEndian.PutUint64(rec[8:], seq)
	binary.BigEndian.PutUint64(rec[16:], round)
	return walFormat.Seal(rec)
}

// walGen is one generation file. seg supplies the file handle and the pre-zeroing state
// (filled / zeroSynced / zmu, see segment.zeroTo); seg.base is unused.
type walGen struct {
	seq  uint64
	path string // guarded by wal.mu (a spare is renamed when it becomes current)
	seg  *segment
	end  int64 // write position, flusher only
}

func (g *walGen) close() {
	g.seg.seal()
	_ = g.seg.f.Close()
}

// walEntry is what a round did to one partition: its last append in the round.
type walEntry struct {
	p             *Partition
	end           int64    // log end after the append
	seg           *segment // segment it went to
	pos           int64    // logical size of seg after it
	maxTs, maxOff int64    // seg's max timestamp after it (MaxTimestamp of durable data)
}

type wal struct {
	dir      string
	fs       FS
	log      *zap.Logger
	genBytes int64
	ckEvery  time.Duration
	// keep: a clean close leaves the generations in place (cluster mode). A successor that
	// takes a partition over without a release record (this broker stopped without draining)
	// salvages this WAL, and a missing one would refuse the takeover; the controller deletes
	// the directory once every partition in it has a newer epoch (Store.RemoveDeadWAL).
	keep bool
	// publish is the store's Rule P check (Store.publishOK); nil = always.
	publish func() bool

	// broken is set while the flusher recovers from a WAL failure: appends answer
	// KAFKA_STORAGE_ERROR instead of queueing behind it.
	broken atomic.Bool

	mu      sync.Mutex
	buf     []byte     // pending round: records back to back
	recs    []int      // offsets of the records in buf
	ents    []walEntry // one per partition in the pending round
	pending uint64     // id of the pending round (Partition.walRound dedups entries)
	dirty   []*Partition
	zcur    *walGen   // the generation being written, for the zeroer
	curSeq  uint64    // its seq (0 before the first write)
	full    []*walGen // generations before curSeq, waiting for a checkpoint
	free    []*walGen // checkpointed, kept for recycling
	spare   *walGen   // prepared next generation (zeroed or recycled)
	making  *walGen   // the spare the zeroer is preparing (close stops its zeroing)
	pinned  bool      // a segment fsync failed: never delete a generation again
	closed  bool

	// Flusher goroutine only.
	cur                             *walGen
	nextSeq                         uint64
	round                           uint64
	abandonSeq                      uint64 // first generation abandoned since the last good round
	abandonPos                      int64
	freeBuf                         []byte
	freeRecs                        []int
	freeEnts                        []walEntry
	ckmu                            sync.Mutex // one checkpoint at a time
	kick, zkick, ckick, stop, ready chan struct{}
	wg                              sync.WaitGroup
}

func newWAL(dir string, fs FS, log *zap.Logger, genBytes int64, ckEvery time.Duration) *wal {
	if genBytes <= 0 {
		genBytes = walGenBytesDefault
	}
	if ckEvery <= 0 {
		ckEvery = walCheckpointEvery
	}
	return &wal{
		dir: dir, fs: fs, log: log.Named("wal"), genBytes: genBytes, ckEvery: ckEvery,
		pending: 1, nextSeq: 1, round: 1,
		kick: make(chan struct{}, 1), zkick: make(chan struct{}, 1), ckick: make(chan struct{}, 1),
		stop: make(chan struct{}),
	}
}

// start launches the flusher, the zeroer and the checkpointer. nextSeq and round continue after
// everything recovery saw, so a record is never confused with one of a previous run.
func (w *wal) start(nextSeq, round uint64) {
	w.nextSeq, w.round = max(nextSeq, 1), max(round, 1)
	w.wg.Add(3)
	go w.flushLoop()
	go w.zeroLoop()
	go w.checkpointLoop()
}

func kickChan(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// enqueue adds an appended batch (already in its segment at [pos-len(b), pos)) to the pending
// round. Called under p.mu, so a partition's records enter the WAL in offset order.
func (w *wal) enqueue(p *Partition, b []byte, base int64, e walEntry) {
	w.mu.Lock()
	w.recs = append(w.recs, len(w.buf))
	w.buf = appendWALRecord(w.buf, p.topic.ID, p.id, base, b)
	if p.walRound == w.pending && p.walIdx < len(w.ents) && w.ents[p.walIdx].p == p {
		w.ents[p.walIdx] = e
	} else {
		p.walRound, p.walIdx = w.pending, len(w.ents)
		w.ents = append(w.ents, e)
	}
	if !p.walDirty {
		p.walDirty = true
		w.dirty = append(w.dirty, p)
	}
	w.mu.Unlock()
	kickChan(w.kick)
}

// pin stops generation deletion for the rest of the process (a segment fsync failed).
func (w *wal) pin() {
	w.mu.Lock()
	if !w.pinned {
		w.pinned = true
		w.log.Error("a segment fsync failed: write-ahead log generations are kept until restart, which replays them")
	}
	w.mu.Unlock()
}

// pinnedNow reports whether generation deletion stopped for good (tests, diagnostics).
func (w *wal) pinnedNow() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pinned
}

func (w *wal) flushLoop() {
	defer w.wg.Done()
	for {
		select {
		case <-w.stop:
			return
		case <-w.kick:
		}
		for w.flushRound() {
			select {
			case <-w.stop:
				return
			default:
			}
		}
	}
}

// flushRound writes and syncs the pending round and publishes it; false when it was empty.
func (w *wal) flushRound() bool {
	w.mu.Lock()
	if len(w.recs) == 0 {
		w.mu.Unlock()
		return false
	}
	buf, recs, ents := w.buf, w.recs, w.ents
	w.buf, w.recs, w.ents = w.freeBuf[:0], w.freeRecs[:0], w.freeEnts[:0]
	w.pending++
	w.mu.Unlock()

	err := w.writeRound(buf, recs)
	switch {
	case err != nil:
		w.fail(ents, err)
	case w.publish != nil && !w.publish():
		// Rule P, checked once per round after its fdatasync: the records are durable (a
		// successor salvages them) but nothing is acknowledged or exposed.
		for i := range ents {
			ents[i].p.completeWaiters(ErrFenced)
		}
	default:
		w.abandonSeq, w.abandonPos = 0, 0
		walRecordsPerSync.Update(float64(len(recs)))
		for i := range ents {
			ents[i].p.walDurable(&ents[i])
		}
		for i := range ents {
			ents[i].p.completeWaiters(nil)
		}
	}
	clear(ents)
	if cap(buf) > walMaxPendingBuffer {
		buf = nil
	}
	w.freeBuf, w.freeRecs, w.freeEnts = buf[:0], recs[:0], ents[:0]
	return true
}

// writeRound writes the records of one round (rolling to the next generation when one does not
// fit) and makes them durable. Records never span generations; a record larger than a whole
// generation gets a generation of its own (which then grows, and is fsync'd rather than
// fdatasync'd).
func (w *wal) writeRound(buf []byte, recs []int) error {
	round := w.round
	w.round++
	if w.cur == nil {
		if err := w.roll(); err != nil {
			return err
		}
	}
	chunk, first, pos := 0, w.cur.end, w.cur.end
	for _, off := range recs {
		n := walRecLen(int(binary.BigEndian.Uint32(buf[off+44:])))
		if pos > 0 && pos+int64(n) > w.genBytes {
			if off > chunk {
				if err := w.writeChunk(buf[chunk:off], first); err != nil {
					return err
				}
			}
			if err := w.roll(); err != nil {
				return err
			}
			chunk, first, pos = off, 0, 0
		}
		sealWALRecord(buf[off:], w.cur.seq, round)
		pos += int64(n)
	}
	return w.writeChunk(buf[chunk:], first)
}

// writeChunk writes b at pos of the current generation and syncs it: fdatasync when everything up
// to the new end lies in the pre-zeroed, fsync'd region (no metadata to commit), fsync otherwise.
func (w *wal) writeChunk(b []byte, pos int64) error {
	g := w.cur
	if err := g.seg.writeAt(b, pos); err != nil {
		return fmt.Errorf("cannot write write-ahead log (%s@%d): %w", g.path, pos, err)
	}
	end := pos + int64(len(b))
	start := time.Now()
	var err error
	if ds, ok := g.seg.f.(datasyncer); ok && end <= g.seg.zeroSynced.Load() {
		err = ds.Datasync()
	} else {
		err = g.seg.f.Sync()
	}
	walSyncDuration.UpdateDuration(start)
	walSyncsTotal.Inc()
	if err != nil {
		return fmt.Errorf("cannot sync write-ahead log (%s): %w", g.path, err)
	}
	g.end = end
	walBytesTotal.Add(len(b))
	return nil
}

// roll makes the next generation current: the prepared spare renamed into place, or a new file.
// The directory is fsync'd before anything in the new file counts as durable.
func (w *wal) roll() error {
	seq := w.nextSeq
	path := filepath.Join(w.dir, walGenName(seq))
	w.mu.Lock()
	sp := w.spare
	w.spare = nil
	w.mu.Unlock()
	var g *walGen
	if sp != nil {
		w.mu.Lock()
		err := os.Rename(sp.path, path)
		if err == nil {
			sp.path, sp.seq = path, seq
		}
		w.mu.Unlock()
		if err != nil {
			sp.close()
			_ = os.Remove(sp.path)
		} else {
			g = sp
		}
	}
	if g == nil {
		f, err := w.fs.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("cannot create write-ahead log generation (%s): %w", path, err)
		}
		g = &walGen{seq: seq, path: path, seg: newSegment(w.dir, 0, f)}
		g.seg.zeroOn.Store(true)
	}
	if err := SyncDir(w.dir); err != nil {
		g.close()
		_ = os.Remove(path)
		return fmt.Errorf("cannot sync write-ahead log directory (%s): %w", w.dir, err)
	}
	g.end = 0
	old := w.cur
	w.cur = g
	w.nextSeq = seq + 1
	w.mu.Lock()
	if old != nil {
		w.full = append(w.full, old)
	}
	w.zcur, w.curSeq = g, seq
	w.mu.Unlock()
	kickChan(w.zkick)
	if old != nil {
		kickChan(w.ckick)
	}
	return nil
}

// fail handles a failed WAL write or sync of a round (ents): see "Failures" above.
func (w *wal) fail(ents []walEntry, err error) {
	walErrorsTotal.Inc()
	w.log.Error("write-ahead log write or sync failed: discarding the records that are not durable yet", zap.Error(err))
	w.broken.Store(true)
	w.mu.Lock()
	stale := append([]walEntry(nil), w.ents...)
	w.buf, w.recs, w.ents = w.buf[:0], w.recs[:0], w.ents[:0]
	w.pending++
	w.mu.Unlock()
	w.abandonCurrent()
	for _, list := range [][]walEntry{ents, stale} {
		for i := range list {
			p := list[i].p
			p.mu.Lock()
			if !p.closed {
				p.fsyncFailed = true
				if rerr := p.repairLocked(); rerr != nil {
					p.log.Error("partition repair after write-ahead log failure failed", zap.Error(rerr))
				}
			}
			p.mu.Unlock()
			p.completeWaiters(err)
		}
	}
	// Continue in a fresh generation that starts with a marker covering the abandoned tail.
	for {
		var rerr error
		if w.cur == nil {
			rerr = w.roll()
		}
		if rerr == nil && w.abandonSeq == 0 {
			break // nothing was abandoned (the failure came before any generation was current)
		}
		if rerr == nil {
			var pos [8]byte
			binary.BigEndian.PutUint64(pos[:], uint64(w.abandonPos))
			buf := appendWALRecord(nil, [16]byte{}, walMarkerPartition, int64(w.abandonSeq), pos[:])
			if rerr = w.writeRound(buf, []int{0}); rerr == nil {
				break
			}
			w.abandonCurrent()
		}
		w.log.Warn("cannot continue the write-ahead log; retrying", zap.Error(rerr))
		select {
		case <-w.stop:
			return
		case <-time.After(100 * time.Millisecond): // back-off before touching the disk again
		}
	}
	w.broken.Store(false)
	w.log.Info("write-ahead log continues in a fresh generation", zap.Uint64("generation", w.cur.seq))
}

// abandonCurrent stops writing the current generation after a failure. It still holds durable
// records of earlier rounds, so it waits for a checkpoint like any full generation.
func (w *wal) abandonCurrent() {
	g := w.cur
	if g == nil {
		return
	}
	if w.abandonSeq == 0 {
		w.abandonSeq, w.abandonPos = g.seq, g.end
	}
	g.seg.seal()
	w.cur = nil
	w.mu.Lock()
	w.full = append(w.full, g)
	w.zcur = nil
	w.mu.Unlock()
}

// walDurable publishes a synced round's effect on p (WAL flusher): the same bookkeeping as
// flushOnce after a successful fsync.
func (p *Partition) walDurable(e *walEntry) {
	p.mu.Lock()
	if !p.closed && e.end > p.durableEnd && e.seg == p.active {
		p.durablePos = e.pos
		p.flushedMaxTs, p.flushedMaxOff = e.maxTs, e.maxOff
		p.publishHWMCheckedLocked(e.end)
	}
	p.mu.Unlock()
}

// zeroLoop keeps the current generation zeroed ahead of the writer and prepares the spare: a
// checkpointed generation renamed to walSpareName (already written in full: nothing to zero) or a
// new file zeroed to walGenBytes.
func (w *wal) zeroLoop() {
	defer w.wg.Done()
	for {
		select {
		case <-w.stop:
			return
		case <-w.zkick:
		}
		w.mu.Lock()
		cur := w.zcur
		w.mu.Unlock()
		if cur != nil {
			if _, err := w.zero(cur); err != nil {
				w.log.Warn("pre-zeroing of the write-ahead log failed; its syncs fall back to fsync", zap.Error(err))
			}
		}
		w.mu.Lock()
		need := w.spare == nil && w.curSeq != 0 && !w.closed
		var g *walGen
		if need && len(w.free) > 0 {
			g = w.free[0]
			w.free = w.free[1:]
		} else if need && len(w.full) > 0 && !w.pinned {
			// A checkpoint is due and will free a generation to recycle (and kick us):
			// zeroing a new 64 MiB file now would only double the bytes written.
			need = false
		}
		w.mu.Unlock()
		if !need {
			continue
		}
		if err := w.prepareSpare(g); err != nil {
			w.log.Warn("cannot prepare the next write-ahead log generation", zap.Error(err))
		}
	}
}

func (w *wal) zero(g *walGen) (int64, error) {
	n, err := g.seg.zeroTo(w.genBytes, func() (File, error) {
		w.mu.Lock()
		path := g.path
		w.mu.Unlock()
		return w.fs.OpenFile(path, os.O_RDWR, 0o644)
	})
	walZeroBytesTotal.Add(int(n))
	return n, err
}

// prepareSpare turns g (a checkpointed generation, or nil for a new file) into the spare.
func (w *wal) prepareSpare(g *walGen) error {
	path := filepath.Join(w.dir, walSpareName)
	if g != nil {
		w.mu.Lock()
		err := os.Rename(g.path, path)
		if err == nil {
			g.path = path
		}
		w.mu.Unlock()
		if err != nil {
			g.close()
			_ = os.Remove(g.path)
			g = nil
		} else {
			g.seg.zmu.Lock()
			g.seg.zeroOn.Store(true)
			g.seg.zmu.Unlock()
		}
	}
	if g == nil {
		f, err := w.fs.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		g = &walGen{path: path, seg: newSegment(w.dir, 0, f)}
		g.seg.zeroOn.Store(true)
	}
	w.mu.Lock()
	if w.closed {
		g.seg.zeroOn.Store(false)
	}
	w.making = g
	w.mu.Unlock()
	_, err := w.zero(g)
	w.mu.Lock()
	w.making = nil
	w.mu.Unlock()
	if err != nil {
		g.close()
		_ = os.Remove(path)
		return err
	}
	// A recycled file was written in full by records and zeros; the writer's fsyncs do not
	// publish zeroSynced, so sync once (cheap: nothing is dirty) and publish the whole file.
	if err := g.seg.f.Sync(); err != nil {
		g.close()
		_ = os.Remove(path)
		return err
	}
	g.seg.zmu.Lock()
	g.seg.zeroSynced.Store(g.seg.filled.Load())
	g.seg.zmu.Unlock()
	w.mu.Lock()
	if w.closed || w.spare != nil {
		w.mu.Unlock()
		g.close()
		_ = os.Remove(path)
		return nil
	}
	w.spare = g
	w.mu.Unlock()
	return nil
}

func (w *wal) checkpointLoop() {
	defer w.wg.Done()
	t := time.NewTicker(w.ckEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.ckick:
		case <-t.C:
		}
		if err := w.checkpoint(); err != nil {
			w.log.Error("write-ahead log checkpoint failed", zap.Error(err))
		}
	}
}

// checkpoint fsyncs the active segment of every partition appended to since the last checkpoint
// and then deletes (or keeps for recycling) the generations before the current one: every record
// in them was written to its segment before it was queued, so before these fsyncs. Run by the
// timer it also fsyncs when no generation is full yet: that bounds what only the WAL holds (and
// what a restart replays) at a few seconds of appends, and spreads the segment writeback.
func (w *wal) checkpoint() error {
	w.ckmu.Lock()
	defer w.ckmu.Unlock()
	w.mu.Lock()
	if w.pinned || (len(w.full) == 0 && len(w.dirty) == 0) {
		w.mu.Unlock()
		return nil
	}
	done := append([]*walGen(nil), w.full...)
	dirty := w.dirty
	w.dirty = nil
	for _, p := range dirty {
		p.walDirty = false
	}
	w.mu.Unlock()
	start := time.Now()
	for i, p := range dirty {
		if err := p.checkpointSync(); err != nil {
			w.mu.Lock()
			for _, q := range dirty[i:] {
				if !q.walDirty {
					q.walDirty = true
					w.dirty = append(w.dirty, q)
				}
			}
			w.mu.Unlock()
			return err
		}
	}
	w.mu.Lock()
	if w.pinned {
		w.mu.Unlock()
		return nil
	}
	w.full = append([]*walGen(nil), w.full[len(done):]...)
	if len(done) == 0 {
		w.mu.Unlock()
		walCheckpointDuration.UpdateDuration(start)
		return nil
	}
	for len(done) > 0 && len(w.free) < walFreeKept && !w.closed {
		w.free = append(w.free, done[0])
		done = done[1:]
	}
	w.mu.Unlock()
	for _, g := range done {
		g.close()
		if err := os.Remove(g.path); err != nil && !os.IsNotExist(err) {
			w.log.Warn("cannot delete write-ahead log generation", zap.String("file", g.path), zap.Error(err))
		}
	}
	err := SyncDir(w.dir)
	walCheckpointDuration.UpdateDuration(start)
	kickChan(w.zkick)
	return err
}

// checkpointSync fsyncs p's active segment (checkpoint). A closed partition needs none: a clean
// shutdown fsync'd it, an unclean one belongs to a deleted topic (or a simulated crash).
func (p *Partition) checkpointSync() error {
	p.mu.Lock()
	seg, closed := p.active, p.closed
	var ck *recoveryCkpt
	if !closed {
		ck = p.captureRecoveryLocked(seg)
	}
	p.mu.Unlock()
	if closed {
		return nil
	}
	var err error
	p.segMu.RLock()
	if !seg.deleted {
		err = p.timedSync(seg.f, false)
	}
	p.segMu.RUnlock()
	if err != nil {
		p.mu.Lock()
		p.segmentSyncFailedLocked(err)
		p.mu.Unlock()
		return fmt.Errorf("cannot fsync segment (%s-%d@%d): %w", p.topic.Name, p.id, seg.base, err)
	}
	p.writeRecoveryCheckpoint(seg, ck)
	return nil
}

// close stops the WAL goroutines. With clean (every partition was shut down cleanly, so every
// acknowledged byte is fsync'd in its segment) and nothing pinned, the WAL is removed; otherwise
// the files stay for the next start to replay. Without clean nothing more is written (a simulated
// kill).
func (w *wal) close(clean bool) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	zeroing := []*walGen{w.making, w.zcur}
	w.mu.Unlock()
	// Stop zeroing now rather than after up to a whole generation of zeros (not under w.mu:
	// the zeroer takes w.mu while it holds a generation's zmu).
	for _, g := range zeroing {
		if g != nil {
			g.seg.seal()
		}
	}
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	gens := append(append(append([]*walGen(nil), w.full...), w.free...), w.zcur, w.spare)
	pinned := w.pinned
	w.mu.Unlock()
	if w.cur != nil && w.cur != w.zcur {
		gens = append(gens, w.cur)
	}
	for _, g := range gens {
		if g != nil {
			g.close()
		}
	}
	if !clean || pinned || w.keep {
		return nil
	}
	return removeWAL(w.dir)
}

// removeWAL deletes every generation (and a spare) and syncs the directory.
func removeWAL(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("cannot remove write-ahead log file (%s): %w", e.Name(), err)
		}
	}
	return SyncDir(dir)
}
