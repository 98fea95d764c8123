package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kaas-go/kaas/codec"
	"go.uber.org/zap"
)

// relaxedFlushDelay bounds how long appended records stay un-fsynced (and therefore invisible to
// consumers: the HWM only moves on fsync) when a topic sets flush.messages > 1.
const relaxedFlushDelay = 100 * time.Millisecond

// snapshotsKept is how many producer state snapshots a partition keeps on disk.
const snapshotsKept = 2

// ErrLost is passed to a Sync callback whose records were discarded after an fsync failure.
var ErrLost = errors.New("records were discarded after an fsync failure")

// AppendResult is the outcome of one Append.
type AppendResult struct {
	BaseOffset     int64 // assigned (or, for a duplicate, the original) base offset
	LastOffset     int64
	LogAppendTime  int64 // -1 unless the topic uses LogAppendTime
	LogStartOffset int64
	Duplicate      bool
	Code           int16 // codec.CodeNone or a Kafka error code
}

type waiter struct {
	end  int64
	done func(error)
}

type offsetRange struct{ from, to int64 } // [from, to)

// Partition is one partition's log.
//
// Concurrency:
//   - mu (the append mutex) serialises Append, rolls, repairs and retention's list edits. It is
//     never held across an fsync on the append path: a roll does its fsyncs with mu released
//     while appends wait for it (rollLocked). (Repairs after a failed fsync, the switch of a
//     topic onto the WAL, clean shutdown and startup replay still fsync under it: none of them
//     is on the path of a fence.)
//   - segs is a copy-on-write list of segments; readers load it without mu.
//   - segMu is held for reading by anyone using a segment's file outside mu (Read, the flusher's
//     fsync) and for writing by retention while it closes files, so no file is closed under a
//     reader.
//   - hwm / leo / logStart are atomics so Read and the long-poll path never take mu.
//
// Lock order (a lock may be taken while holding any lock to its left, never the reverse):
//
//	Partition.startMu (log start checkpoint, log_start.go) → Partition.mu
//	Partition.cleanMu (the clean in progress, cleaner.go) → Partition.mu
//	Topic.mu → Partition.cleanMu (Release and the topic deletions wait for a clean, cleaner.go,
//	           then for fileOps: retention and DeleteRecords file work, log_start.go)
//	Topic.mu → Partition.mu → segment.zmu, segment.mu, txnIndex.mu, wmu, epochMu,
//	                          Store.pids.mu, Store.fences.mu, wal.mu
//	fireMu → wmu
//
// segMu is never taken under mu (the flusher, retention and closeFiles take it after releasing
// mu), and a roll releases mu for its I/O (rollLocked).
//
// Durability (group commit): Append writes to the page cache and kicks the flusher goroutine.
// The flusher captures (leo, active segment) under mu, fsyncs without mu, then publishes the HWM
// and completes every Sync waiter whose end is covered. Appends that arrive during an fsync are
// covered by the next one, so N concurrent producers share few fsyncs. The HWM never passes what
// is fsync'd, so a consumer never reads what a crash could take back. When every byte to flush
// lies in the active segment's pre-zeroed, fsync'd region (zeroLoop, segment.zeroTo), the flush
// is an fdatasync.
type Partition struct {
	topic    *Topic
	id       int32
	dir      string
	fs       FS
	log      *zap.Logger
	interval int64

	mu            sync.Mutex
	active        *segment
	producers     *producerState
	txn           txnIndex // LSO queue and aborted index (txn.go); written under mu, read under txn.mu
	leoLocal      int64    // == leo, owned by mu
	durableEnd    int64    // == hwm, owned by mu
	durablePos    int64    // position in active of durableEnd
	flushedMaxTs  int64    // active segment's max timestamp as of the last fsync
	flushedMaxOff int64
	dirtyTail     bool // a failed write could not be truncated away yet
	fsyncFailed   bool // see repairLocked
	closed        bool
	// rolling: a roll does its I/O without mu (rollLocked); appends and shutdown wait for
	// rollDone, closed when it ends.
	rolling  bool
	rollDone chan struct{}
	// segFailed (WAL on): a segment fsync failed, so acknowledged bytes of this partition may
	// exist durably only in the WAL. The partition refuses appends until a restart replays the
	// WAL (see wal.go, "Failures").
	segFailed bool

	// wal is the store's write-ahead log when log.wal.enable is on: flush.messages = 1 appends
	// are made durable by its group-committed fdatasync instead of an fsync of the segment.
	wal *wal
	// nonWALEnd is the log end after the last append that did NOT go through the WAL (topic
	// acknowledging from the page cache); such data needs a segment fsync to become durable.
	nonWALEnd atomic.Int64
	// markerEnd is the log end after the last COMMIT/ABORT marker appended. While it is above
	// the HWM, Sync waits for the fsync even on a topic that acknowledges from the page cache
	// (see Sync).
	markerEnd atomic.Int64
	// Guarded by wal.mu: dedup of this partition's entry in the pending round, and membership in
	// the checkpoint's dirty list.
	walRound uint64
	walIdx   int
	walDirty bool

	segs  atomic.Pointer[[]*segment]
	segMu sync.RWMutex

	leo      atomic.Int64
	hwm      atomic.Int64
	logStart atomic.Int64
	changed  atomic.Pointer[chan struct{}]

	// DeleteRecords (log_start.go): startMu serialises writes of the log start checkpoint;
	// startDurable is the start that file holds (the first segment's base if there is none).
	startMu      sync.Mutex
	startDurable int64

	wmu     sync.Mutex
	waiters []waiter
	fire    []waiter // completeWaiters' scratch, guarded by fireMu
	fireMu  sync.Mutex
	lost    []offsetRange
	wclosed bool

	// Runtime load / release (Store.LoadPartition, Store.ReleasePartition). loaded is true from
	// the end of a successful open until shutdown starts; released marks a shutdown by
	// ReleasePartition, after which appends, reads and markers answer NOT_LEADER_OR_FOLLOWER.
	loaded   atomic.Bool
	released atomic.Bool

	// Leader epoch (leader_epoch.go): leaderEpoch stamps every appended batch; epochs is the
	// epoch cache, written under mu and epochMu, read under either.
	leaderEpoch atomic.Int32
	epochMu     sync.Mutex
	epochs      []epochEntry

	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	zkick chan struct{} // wakes zeroLoop
	// preallocate (log.preallocate) turns pre-zeroing of active segments on.
	preallocate bool
	zdone       chan struct{}
	abandon     atomic.Bool // shutdown without a final fsync

	// Cluster mode (cluster.go). nameEpoch is the epoch in the names of the files this partition
	// creates (noEpoch in single-broker mode: today's names); snapOK says which snapshots count
	// (nil: unsuffixed names only). sealOnClose makes a clean shutdown also write the active
	// segment's indexes, so a successor opens it without a scan (Store.Release); the resulting
	// record is left in releaseRec.
	nameEpoch int32
	snapOK    func(snapFile) bool

	// Log cleaner (cleaner.go): cleanedTo is where the last clean ended (the first dirty
	// offset, persisted in cleaner.checkpoint); cleanerOffline is set by a cleaner error.
	cleanedTo      atomic.Int64
	cleanerOffline atomic.Bool
	// swapPending: a swap failed after writing its marker (cleaner.go). The names of the
	// listed segments may then hold their group's new file, which the next open completes,
	// so retention and DeleteRecords delete no file by name until then (they close them).
	swapPending atomic.Bool
	// fileOps counts retention and DeleteRecords work that goes on writing the log start
	// checkpoint and deleting segment files after it released mu (log_start.go); it is added
	// to under mu while the partition is open, so a Wait after the shutdown sees all of it.
	fileOps sync.WaitGroup
	cleanMu sync.Mutex // held by the clean in progress (never with mu held on entry)
	// Cluster mode (cleaner_cluster.go): cleanWinner is the clean manifest whose files the
	// segment list holds below its cleanEnd (guarded by mu); cleanSeq the last clean sequence
	// used at this epoch (guarded by cleanMu); cleanView the takeover's view, kept only until
	// the leftovers it names are deleted.
	cleanWinner *cleanManifest
	cleanSeq    int64
	cleanView   *partitionView
	sealOnClose bool
	releaseRec  ReleaseRecord
}

func (p *Partition) config() *TopicConfig { return p.topic.cfg.Load() }

// ID returns the partition index.
func (p *Partition) ID() int32 { return p.id }

// Topic returns the partition's topic.
func (p *Partition) Topic() *Topic { return p.topic }

// Loaded reports whether the partition is open on this broker. A partition released by
// Store.ReleasePartition stays reachable but answers NOT_LEADER_OR_FOLLOWER (6) to appends,
// reads and markers (ErrNotLoaded from Sync); Store.LoadPartition installs a fresh one.
func (p *Partition) Loaded() bool { return p.loaded.Load() }

// HighWatermark is the offset below which everything is fsync'd. Consumers never see data a crash
// could take back.
func (p *Partition) HighWatermark() int64 { return p.hwm.Load() }

// LogEndOffset is the next offset to assign (appended, maybe not yet durable).
func (p *Partition) LogEndOffset() int64 { return p.leo.Load() }

// LogStartOffset is the first offset still in the log.
func (p *Partition) LogStartOffset() int64 { return p.logStart.Load() }

// Changed returns a channel closed the next time the HWM advances. To wait without missing an
// advance, call Changed before checking the HWM.
func (p *Partition) Changed() <-chan struct{} { return *p.changed.Load() }

// publishHWMLocked moves the HWM (under mu) and wakes long-polls. Every caller has just made
// [.., end) durable; Rule P (Config.Publish) is checked here, after that durability point and
// before anything becomes visible. If it fails nothing moves and the store is fenced for good.
func (p *Partition) publishHWMLocked(end int64) {
	if !p.topic.store.publishOK() {
		return
	}
	p.publishHWMCheckedLocked(end)
}

// publishHWMCheckedLocked is publishHWMLocked for a caller that checked Rule P itself (the WAL
// flusher checks once per round, not once per partition).
func (p *Partition) publishHWMCheckedLocked(end int64) {
	p.durableEnd = end
	p.hwm.Store(end)
	ch := make(chan struct{})
	old := p.changed.Swap(&ch)
	close(*old)
}

// openPartition opens (or creates) a partition directory and recovers it (see recoverLog).
func openPartition(t *Topic, id int32, dir string, s *Store) (*Partition, error) {
	p := &Partition{
		topic: t, id: id, dir: dir, fs: s.fs, log: s.log.With(zap.String("topic", t.Name), zap.Int32("partition", id)),
		interval: int64(s.cfg.IndexIntervalBytes), flushedMaxTs: -1, flushedMaxOff: -1,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		zkick: make(chan struct{}, 1), zdone: make(chan struct{}),
		preallocate: s.cfg.Preallocate,
		wal:         s.wal,
		nameEpoch:   noEpoch,
	}
	ch := make(chan struct{})
	p.changed.Store(&ch)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create partition dir (%s): %w", dir, err)
	}
	if err := p.recoverLog(); err != nil {
		p.closeFiles()
		return nil, fmt.Errorf("cannot recover partition (%s-%d): %w", t.Name, id, err)
	}
	p.loaded.Store(true)
	go p.flushLoop()
	go p.zeroLoop()
	return p, nil
}

// recoverLog loads the segments and rebuilds in-memory state. Recovery after a crash:
//
//  1. Closed segments were fsync'd (and their indexes written atomically) before the roll that
//     closed them completed, so their indexes are trusted if consistent; otherwise rebuilt by a
//     CRC-checked scan.
//  2. The active (last) segment is scanned from the start: every batch must frame, have magic 2,
//     the expected contiguous baseOffset and a valid CRC32C. The file is truncated at the first
//     one that does not (a torn write), then fsync'd, so everything left is durable and
//     HWM = LEO.
//  3. Producer state = newest valid snapshot at or below LEO, then the batch headers from the
//     snapshot offset to LEO are replayed. Nothing depends on a clean shutdown.
//  4. Transactions: open transactions come from the snapshot + replay (a transaction whose marker
//     never made it keeps the LSO pinned at its first offset until the coordinator writes it).
//     The aborted index is the union of the closed segments' .txnindex files, the snapshot's tail
//     (the active segment at snapshot time) and the replay. If a closed segment's .txnindex is
//     missing or invalid, the replay starts from a snapshot at or below that segment (or the log
//     start), which covers it, and the file is rewritten.
func (p *Partition) recoverLog() error {
	// A clean interrupted by a crash: finish or roll back its swap first (cleaner.go).
	if err := recoverCleanerSwap(p.dir, p.log); err != nil {
		return err
	}
	p.cleanedTo.Store(loadCleanerCheckpoint(p.dir))
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return err
	}
	var bases []int64
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(filepath.Join(p.dir, name))
			continue
		}
		if !strings.HasSuffix(name, ".log") {
			continue
		}
		b, err := strconv.ParseInt(strings.TrimSuffix(name, ".log"), 10, 64)
		if err != nil || b < 0 {
			continue
		}
		bases = append(bases, b)
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	var segs []*segment
	var loadedAborted []AbortedTxn     // from the closed segments' .txnindex files
	var rewriteTxn []*segment          // closed segments whose .txnindex must be rebuilt
	badTxnBase := int64(math.MaxInt64) // base of the first of them
	markBad := func(seg *segment) {
		rewriteTxn = append(rewriteTxn, seg)
		badTxnBase = min(badTxnBase, seg.base)
	}
	if len(bases) == 0 {
		seg, err := p.createSegment(0)
		if err != nil {
			return err
		}
		segs = append(segs, seg)
	}
	for i, base := range bases {
		f, err := p.fs.OpenFile(filepath.Join(p.dir, segmentName(base, ".log")), os.O_RDWR, 0o644)
		if err != nil {
			return err
		}
		seg := newSegment(p.dir, base, f)
		segs = append(segs, seg)
		p.segs.Store(&segs) // so closeFiles sees it on error
		if i == len(bases)-1 {
			cut, zeroTail, err := seg.recover(p.interval, false)
			if err != nil {
				return err
			}
			switch {
			case cut > 0 && zeroTail:
				// The pre-zeroed region of a segment that was not closed cleanly: the
				// normal end of the log, nothing was lost.
				p.log.Debug("dropped pre-zeroed tail of active segment", zap.Int64("segment", base), zap.Int64("bytes", cut))
			case cut > 0:
				p.log.Warn("truncated torn tail of active segment", zap.Int64("segment", base), zap.Int64("bytes", cut))
			}
			// Whatever survived may still be only in the page cache (the process died, not
			// the machine): make it durable before calling it committed.
			if err := seg.f.Sync(); err != nil {
				return err
			}
			seg.zeroOn.Store(p.preallocate)
			// A .txnindex of the active segment is left from a roll that did not complete; the
			// replay covers this segment.
			_ = os.Remove(seg.path(".txnindex"))
			continue
		}
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if ents, ok := seg.loadTxnIndex(bases[i+1]); ok {
			loadedAborted = append(loadedAborted, ents...)
		} else {
			markBad(seg)
		}
		if seg.loadIndexes(st.Size(), bases[i+1]) {
			continue
		}
		cut, zeroTail, err := seg.recover(p.interval, true) // closed: may be a cleaned segment
		if err != nil {
			return err
		}
		if cut > 0 && zeroTail {
			// A zero tail on a closed segment whose indexes are missing: a crash during the
			// roll that closed it, between its truncation and its fsync. Nothing was lost.
			p.log.Warn("dropped pre-zeroed tail of closed segment", zap.Int64("segment", base), zap.Int64("bytes", cut))
			_ = seg.f.Sync()
		} else if cut > 0 {
			// A closed segment was fsync'd before it was closed, so this is media corruption.
			// Offsets past the cut stay a gap; later segments are intact and readable.
			p.log.Error("truncated corrupt closed segment", zap.Int64("segment", base), zap.Int64("bytes", cut))
			_ = seg.f.Sync()
			if len(rewriteTxn) == 0 || rewriteTxn[len(rewriteTxn)-1] != seg {
				markBad(seg) // its .txnindex may name markers that were cut
			}
		}
		seg.mu.Lock()
		seg.next = bases[i+1]
		seg.mu.Unlock()
		if err := seg.writeIndexes(); err != nil {
			p.log.Warn("cannot rewrite segment indexes", zap.Int64("segment", base), zap.Error(err))
		}
	}
	p.segs.Store(&segs)
	p.active = segs[len(segs)-1]
	next, maxTs, maxOff := p.active.stats()
	p.leoLocal = next
	p.leo.Store(next)
	p.durablePos = p.active.size.Load()
	p.flushedMaxTs, p.flushedMaxOff = maxTs, maxOff
	p.durableEnd = next
	p.hwm.Store(next)
	p.logStart.Store(segs[0].base)
	p.startDurable = segs[0].base
	if ck := p.loadLogStart(); ck > segs[0].base {
		// DeleteRecords moved the start into (or past) the first segment. A crash between the
		// checkpoint and the deletion leaves segments wholly below it: the next retention pass
		// removes them. The checkpoint cannot be past the log end for an acknowledged request
		// (the HWM capped it and only durable bytes count), but a lost tail is capped anyway.
		p.logStart.Store(min(ck, next))
		p.startDurable = ck
	}
	if err := p.loadEpochs(next); err != nil {
		return err
	}
	if err := p.rebuildProducersLocked(next, min(next, badTxnBase), loadedAborted); err != nil {
		return err
	}
	for _, seg := range rewriteTxn {
		segNext, _, _ := seg.stats()
		if err := seg.writeTxnIndex(p.txn.abortedRange(seg.base, segNext)); err != nil {
			p.log.Warn("cannot rewrite transaction index", zap.Int64("segment", seg.base), zap.Error(err))
		} else {
			p.log.Info("rebuilt transaction index", zap.Int64("segment", seg.base))
		}
	}
	return nil
}

// rebuildProducersLocked loads the newest snapshot at or below snapMax (<= end), replays
// [snapshot, end) and installs the producer state and transaction index. keep are aborted-index
// entries known from elsewhere (closed segments' .txnindex, or the in-memory index before a
// repair); only those below the replay start are used, the replay being authoritative after it.
func (p *Partition) rebuildProducersLocked(end, snapMax int64, keep []AbortedTxn) error {
	ps, from := loadNewestSnapshotOf(p.dir, snapMax, p.snapOK)
	ls := p.logStart.Load()
	if from < ls {
		from = ls
	}
	var replayed []AbortedTxn
	if err := p.replay(ps, from, end, func(a AbortedTxn) { replayed = append(replayed, a) }); err != nil {
		return err
	}
	var before []AbortedTxn
	for _, a := range keep {
		if a.LastOffset < from {
			before = append(before, a)
		}
	}
	p.installProducersLocked(ps, mergeAborted(ls, end, replayed, ps.snapTail, before))
	return nil
}

// replay feeds every batch in [from, end) to the producer state: headers only, except control
// batches (markers), which are read whole. onAbort receives each aborted transaction it completes.
func (p *Partition) replay(ps *producerState, from, end int64, onAbort func(AbortedTxn)) error {
	for _, seg := range *p.segs.Load() {
		next, _, _ := seg.stats()
		if next <= from || seg.base >= end {
			continue
		}
		pos := int64(0)
		if from > seg.base {
			pos = seg.lookup(from)
		}
		r := batchReader{f: seg.f, pos: pos, end: seg.size.Load(), wholeControl: true}
		for {
			b, status, err := r.next(false)
			if err != nil {
				return err
			}
			if status != batchOK {
				break
			}
			if b.BaseOffset() >= end {
				return nil
			}
			// LastOffset, not BaseOffset: a log start moved by DeleteRecords may lie inside a
			// batch, which still belongs to the producer state (Apache reads from the batch
			// holding the start). A snapshot offset is always a batch boundary.
			if b.LastOffset() >= from {
				if ev := ps.record(b); ev.closed != nil && ev.abort {
					onAbort(AbortedTxn{ProducerID: b.ProducerID(), FirstOffset: ev.closed.first, LastOffset: b.BaseOffset()})
				}
			}
		}
	}
	return nil
}

func (p *Partition) createSegment(base int64) (*segment, error) {
	f, err := p.fs.OpenFile(filepath.Join(p.dir, epochFileName(base, p.nameEpoch, ".log")), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	// The new file's directory entry must be durable before anything written to it is
	// acknowledged as durable.
	if err := SyncDir(p.dir); err != nil {
		_ = f.Close()
		return nil, err
	}
	seg := newSegment(p.dir, base, f)
	seg.epoch = p.nameEpoch
	seg.zeroOn.Store(p.preallocate)
	return seg, nil
}

// Append writes one batch already validated by codec.ValidateProduce. The caller owns the bytes;
// Append rewrites baseOffset, partitionLeaderEpoch and (LogAppendTime topics) maxTimestamp in
// place and keeps no reference. Durability is separate: see Sync.
//
// Transactions: a transactional batch is accepted only if its producer has an ongoing transaction
// here (otherwise INVALID_TXN_STATE; the first batch of a transaction goes through AppendTxn with
// a verification guard). A non-transactional batch from a producer with an ongoing transaction
// here gets INVALID_TXN_STATE (Apache).
func (p *Partition) Append(b codec.Batch, nowMs int64) AppendResult {
	return p.append(b, nowMs, kindClient, 0, markerArgs{})
}

// AppendControl appends a broker-built batch without any check. A COMMIT/ABORT control batch has
// the full effect of a marker on the producer state (epoch, closing the transaction, aborted
// index), but without AppendMarker's fencing checks: transaction code must use AppendMarker.
func (p *Partition) AppendControl(b codec.Batch, nowMs int64) AppendResult {
	return p.append(b, nowMs, kindControl, 0, markerArgs{})
}

// Kinds of append.
const (
	kindClient  = iota // produce request: idempotence, epoch and transaction-state checks
	kindControl        // broker-built, unchecked
	kindMarker         // AppendMarker: epoch and coordinator-epoch fencing checks
	kindReplay         // WAL recovery: a batch that was acknowledged before, written as it is
)

// markerArgs are AppendMarker's checks' inputs: the marker's coordinator epoch and prepare
// sequence (0: none given).
type markerArgs struct {
	coordEpoch int32
	prepareSeq uint64
}

func (p *Partition) append(b codec.Batch, nowMs int64, kind int, guard uint64, mk markerArgs) AppendResult {
	res := AppendResult{BaseOffset: -1, LastOffset: -1, LogAppendTime: -1, LogStartOffset: -1}
	cfg := p.config()
	p.mu.Lock()
	p.waitRollLocked()
	res.LogStartOffset = p.logStart.Load()
	if p.closed || p.topic.store.fenced.Load() {
		p.mu.Unlock()
		res.Code = codec.CodeUnknownTopicOrPartition
		if p.released.Load() || p.topic.store.fenced.Load() {
			res.Code = codec.CodeNotLeaderForPartition
		}
		return res
	}
	if p.dirtyTail || p.fsyncFailed {
		if err := p.repairLocked(); err != nil {
			p.mu.Unlock()
			p.log.Warn("partition repair failed", zap.Error(err))
			appendErrorsTotal.Inc()
			res.Code = codec.CodeKafkaStorageError
			return res
		}
	}
	// viaWAL: this append is made durable by the shared WAL (flush.messages = 1).
	viaWAL := p.wal != nil && cfg.FlushMessages <= 1 && kind != kindReplay
	if p.segFailed || (viaWAL && p.wal.broken.Load()) {
		p.mu.Unlock()
		appendErrorsTotal.Inc()
		res.Code = codec.CodeKafkaStorageError
		return res
	}
	if viaWAL && p.nonWALEnd.Load() > p.durableEnd {
		// The topic acknowledged from the page cache until a config change: that data is not
		// in the WAL, so the segment is fsync'd before the WAL may move the HWM past it.
		if err := p.syncActiveLocked(); err != nil {
			p.mu.Unlock()
			p.log.Warn("segment fsync failed", zap.Error(err))
			appendErrorsTotal.Inc()
			res.Code = codec.CodeKafkaStorageError
			return res
		}
	}
	if int64(len(b)) > cfg.SegmentBytes && kind != kindReplay {
		// Kafka: RecordBatchTooLargeException when a batch cannot fit in any segment. (A
		// replayed batch was accepted before segment.bytes was lowered: it goes in as it is.)
		p.mu.Unlock()
		res.Code = codec.CodeRecordListTooLarge
		return res
	}
	if kind == kindMarker {
		if code := p.checkMarkerLocked(b.ProducerID(), b.ProducerEpoch(), mk.coordEpoch); code != codec.CodeNone {
			p.mu.Unlock()
			res.Code = code
			return res
		}
		if p.resentMarkerLocked(b.ProducerID(), b.ProducerEpoch(), mk, nowMs) {
			// Nothing to write; the caller's Sync to the log end covers the first copy.
			res.BaseOffset, res.LastOffset, res.Duplicate = p.leoLocal-1, p.leoLocal-1, true
			p.mu.Unlock()
			return res
		}
	}
	if kind == kindClient {
		code, dup, isDup := p.producers.check(b, &p.topic.store.fences, guard)
		if code != codec.CodeNone {
			p.mu.Unlock()
			res.Code = code
			return res
		}
		if isDup {
			p.mu.Unlock()
			res.BaseOffset, res.LastOffset, res.Duplicate = dup.baseOffset, dup.lastOffset, true
			if cfg.TimestampType == TimestampLogAppendTime {
				res.LogAppendTime = dup.timestamp
			}
			return res
		}
	}
	base := p.leoLocal
	seg := p.active
	size := seg.size.Load()
	if size > 0 {
		seg.mu.Lock()
		rollTs := seg.rollTs
		seg.mu.Unlock()
		if size+int64(len(b)) > cfg.SegmentBytes || nowMs-rollTs >= cfg.maxSegmentMs() ||
			base+int64(b.LastOffsetDelta())-seg.base > math.MaxInt32 {
			if err := p.rollLocked(); err != nil {
				p.mu.Unlock()
				p.log.Warn("segment roll failed", zap.Error(err))
				appendErrorsTotal.Inc()
				res.Code = codec.CodeKafkaStorageError
				return res
			}
			// The roll released mu: a fence or a marker may have changed what the checks
			// above decided, so the append starts over (into the new, empty segment).
			p.mu.Unlock()
			return p.append(b, nowMs, kind, guard, mk)
		}
	}
	b.SetBaseOffset(base)
	if kind != kindReplay {
		// A replayed batch keeps the epoch it was acknowledged under.
		b.SetPartitionLeaderEpoch(p.leaderEpoch.Load())
	}
	if cfg.TimestampType == TimestampLogAppendTime && !b.IsControl() && kind != kindReplay {
		b.SetLogAppendTime(nowMs)
		res.LogAppendTime = nowMs
	}
	if err := seg.writeAt(b, size); err != nil {
		// ENOSPC/EIO: cut off whatever part of the batch reached the file so no half batch
		// stays behind (and the pre-zeroed tail with it: the disk is in trouble, so this
		// segment falls back to append + fsync). If even that fails, the next append (or
		// flush) retries the cut first.
		if terr := seg.truncate(size, true); terr != nil {
			p.dirtyTail = true
		}
		p.mu.Unlock()
		p.log.Warn("append write failed", zap.Error(err))
		appendErrorsTotal.Inc()
		res.Code = codec.CodeKafkaStorageError
		return res
	}
	seg.track(b, size, p.interval, nowMs)
	seg.size.Store(size + int64(len(b)))
	pid := b.ProducerID()
	_, known := p.producers.m[pid]
	p.applyTxnEventLocked(p.producers.record(b), b.BaseOffset())
	if e := p.producers.m[pid]; e != nil {
		if nowMs > e.touchMs {
			e.touchMs = nowMs
		}
		if kind == kindMarker && mk.prepareSeq > e.prepareSeq {
			e.prepareSeq = mk.prepareSeq
		}
	}
	if !known && pid >= 0 {
		p.trackPIDLocked(pid)
	}
	p.leoLocal = b.LastOffset() + 1
	p.leo.Store(p.leoLocal)
	if b.IsControl() {
		p.markerEnd.Store(p.leoLocal)
	}
	if viaWAL {
		_, maxTs, maxOff := seg.stats()
		p.wal.enqueue(p, b, base, walEntry{p: p, end: p.leoLocal, seg: seg, pos: size + int64(len(b)), maxTs: maxTs, maxOff: maxOff})
	} else if kind != kindReplay {
		p.nonWALEnd.Store(p.leoLocal)
	}
	p.mu.Unlock()

	appendBytesTotal.Add(len(b))
	if !viaWAL {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	if seg.needsZeroing(size+int64(len(b)), cfg.SegmentBytes) {
		select {
		case p.zkick <- struct{}{}:
		default:
		}
	}
	res.BaseOffset, res.LastOffset = base, b.LastOffset()
	return res
}

// rollLocked closes the active segment and opens a new one at the log end. The old segment is
// fsync'd first (so a closed segment is always durable and never needs a recovery scan), its
// indexes are written atomically, and a producer snapshot is taken at the new base.
//
// None of that I/O happens under mu: rollLocked marks the partition rolling, encodes what it
// needs (snapshot, transaction index entries) and releases mu for the fsyncs, so fences,
// verification guards, marker checks and producer-state reads never wait for a roll's disk
// writes. Appends wait for the roll without holding mu (waitRollLocked), so nothing writes to
// the old segment meanwhile; shutdown waits for it too. A flusher fsync that fails during the
// roll leaves fsyncFailed set: the roll is abandoned and the repair runs afterwards.
//
//	append ─ mu ─► rollLocked: seal + truncate, encode, rolling=true ─ unlock ─►
//	   fsync old, write .index/.timeindex/.txnindex, snapshot, create new segment + dir fsync
//	─ mu ─► (failure seen? abandon) publish HWM, install new active, rolling=false ─► append retries
//
// Called and returns with mu held.
func (p *Partition) rollLocked() error {
	old := p.active
	newBase := p.leoLocal
	// Stop pre-zeroing and cut the zero tail first, so the fsync below makes the logical size
	// the file size: a closed segment never has a zero tail (loadIndexes relies on it).
	if err := old.truncate(old.size.Load(), true); err != nil {
		return fmt.Errorf("cannot truncate segment (%s-%d@%d): %w", p.topic.Name, p.id, old.base, err)
	}
	snap := p.snapshotLocked(newBase)
	aborted := p.txn.abortedRange(old.base, newBase)
	done := make(chan struct{})
	p.rolling, p.rollDone = true, done
	p.mu.Unlock()

	syncErr := p.timedSync(old.f, false)
	var seg *segment
	var err error
	if syncErr == nil {
		if ierr := old.writeIndexes(); ierr != nil {
			// Indexes are rebuildable: make sure no stale file is trusted on the next open.
			p.log.Warn("cannot write segment indexes", zap.Int64("segment", old.base), zap.Error(ierr))
			_ = os.Remove(old.path(".index"))
			_ = os.Remove(old.path(".timeindex"))
		}
		if terr := old.writeTxnIndex(aborted); terr != nil {
			// Rebuilt from the log on the next open.
			p.log.Warn("cannot write transaction index", zap.Int64("segment", old.base), zap.Error(terr))
		}
		if old.ckptPos.Load() > 0 {
			_ = os.Remove(old.path(".ckpt")) // superseded by the indexes
		}
		p.writeSnapshot(newBase, snap)
		seg, err = p.createSegment(newBase)
	}

	p.mu.Lock()
	p.rolling, p.rollDone = false, nil
	close(done)
	switch {
	case syncErr != nil:
		p.segmentSyncFailedLocked(syncErr)
		err = fmt.Errorf("cannot fsync segment (%s-%d@%d): %w", p.topic.Name, p.id, old.base, syncErr)
	case err != nil:
		err = fmt.Errorf("cannot create segment (%s-%d@%d): %w", p.topic.Name, p.id, newBase, err)
	case p.fsyncFailed || p.segFailed:
		err = fmt.Errorf("cannot roll segment (%s-%d@%d): an fsync failed during the roll", p.topic.Name, p.id, old.base)
	}
	if err != nil {
		if seg != nil {
			_ = seg.f.Close()
			_ = os.Remove(seg.path(".log"))
		}
		kickChan(p.kick) // the flusher repairs what a failed fsync left
		return err
	}
	if newBase > p.durableEnd {
		p.publishHWMLocked(newBase)
	}
	p.installActiveLocked(seg)
	segmentRollsTotal.Inc()
	return nil
}

// waitRollLocked waits (not holding mu) until no roll is in progress; called and returns with
// mu held.
func (p *Partition) waitRollLocked() {
	for p.rolling {
		ch := p.rollDone
		p.mu.Unlock()
		<-ch
		p.mu.Lock()
	}
}

func (p *Partition) installActiveLocked(seg *segment) {
	old := *p.segs.Load()
	list := make([]*segment, len(old), len(old)+1)
	copy(list, old)
	list = append(list, seg)
	p.segs.Store(&list)
	p.active = seg
	p.durablePos = 0
	p.flushedMaxTs, p.flushedMaxOff = -1, -1
}

// writeSnapshotLocked writes the producer snapshot at offset, carrying the aborted-index entries of
// the active segment (which has no .txnindex yet); see the snapshot format in producer.go.
func (p *Partition) writeSnapshotLocked(offset int64) {
	p.writeSnapshot(offset, p.snapshotLocked(offset))
}

// writeSnapshot writes an encoded snapshot (snapshotLocked) and prunes older ones; rolls call it
// without mu.
func (p *Partition) writeSnapshot(offset int64, snap []byte) {
	if err := WriteFileAtomic(p.dir, epochFileName(offset, p.nameEpoch, ".snapshot"), snap); err != nil {
		p.log.Warn("cannot write producer snapshot", zap.Int64("offset", offset), zap.Error(err))
		return
	}
	pruneSnapshots(p.dir, offset, snapshotsKept, p.nameEpoch)
}

func (p *Partition) snapshotLocked(offset int64) []byte {
	return p.producers.encode(offset, p.txn.abortedRange(p.active.base, offset))
}

// timedSync makes f durable: fdatasync when datasync is set (every byte to flush lies in the
// pre-zeroed, fsync'd region, so no metadata has to be committed) and f supports it, fsync
// otherwise. kaas_storage_fsync_duration_seconds covers both; the fdatasync ones are also in
// kaas_storage_fdatasync_duration_seconds.
func (p *Partition) timedSync(f File, datasync bool) error {
	start := time.Now()
	var err error
	if ds, ok := f.(datasyncer); ok && datasync {
		err = ds.Datasync()
		fdatasyncDuration.UpdateDuration(start)
		fdatasyncsTotal.Inc()
	} else {
		err = f.Sync()
	}
	fsyncDuration.UpdateDuration(start)
	fsyncsTotal.Inc()
	return err
}

// repairLocked brings the partition back to a consistent state after a failed write or fsync.
//
// Failed write: the file may hold part of a batch past seg.size; cut it off.
//
// Failed fsync: after an fsync error Linux may have dropped the dirty pages and marked them
// clean, so a later fsync can "succeed" without the data ever reaching the disk (the 2018
// fsyncgate lesson). Retrying the fsync would therefore claim durability we do not have. Instead
// everything past the last successful fsync is discarded: the active segment is truncated to the
// durable position (and that truncation fsync'd), producer state is rebuilt from disk, and a new
// segment is started at the old log end so the discarded offsets are never reused (a consumer or
// producer never sees two different records under one offset; the gap is skipped on read, as
// Kafka clients already do for compacted topics). Every waiter on a discarded offset gets
// ErrLost. Each step is idempotent, so a repair that fails part way is retried by the next
// append or flush.
//
// With the WAL on, bytes below durablePos may be durable only in the WAL, so the segment is
// always fsync'd before it is closed here; if that fails the partition is segFailed.
func (p *Partition) repairLocked() error {
	seg := p.active
	if p.segFailed {
		return errSegFailed
	}
	if p.rolling {
		return errRolling // the roll sees the failure, gives up and kicks the flusher
	}
	if p.dirtyTail {
		if err := seg.truncate(seg.size.Load(), true); err != nil {
			return err
		}
		p.dirtyTail = false
	}
	if !p.fsyncFailed {
		return nil
	}
	// The pre-zeroed tail goes too (and pre-zeroing stops for this segment): after an fsync
	// error nothing past the last successful fsync is trusted.
	if seg.size.Load() > p.durablePos || seg.filled.Load() > p.durablePos {
		if err := seg.truncate(p.durablePos, true); err != nil {
			return err
		}
		if err := seg.f.Sync(); err != nil {
			if p.wal != nil {
				p.segmentSyncFailedLocked(err)
			}
			return err
		}
		seg.size.Store(p.durablePos)
		seg.mu.Lock()
		seg.truncateIndexLocked(p.durablePos, p.durableEnd)
		seg.mu.Unlock()
		if p.leoLocal > p.durableEnd {
			p.wmu.Lock()
			p.lost = append(p.lost, offsetRange{p.durableEnd, p.leoLocal})
			p.wmu.Unlock()
			p.log.Error("discarded un-fsync'd records after fsync failure",
				zap.Int64("from", p.durableEnd), zap.Int64("to", p.leoLocal))
		}
		if err := p.rebuildProducersLocked(p.durableEnd, p.durableEnd, p.txn.abortedRange(0, p.durableEnd)); err != nil {
			return err
		}
	}
	if p.leoLocal > p.durableEnd {
		if p.wal != nil {
			if err := seg.f.Sync(); err != nil {
				p.segmentSyncFailedLocked(err)
				return err
			}
		}
		// Skip the discarded offsets: continue in a fresh segment at the old log end.
		_ = WriteFileAtomic(p.dir, epochFileName(p.leoLocal, p.nameEpoch, ".snapshot"), p.snapshotLocked(p.leoLocal))
		if err := seg.writeIndexes(); err != nil {
			_ = os.Remove(seg.path(".index"))
			_ = os.Remove(seg.path(".timeindex"))
		}
		_ = seg.writeTxnIndex(p.txn.abortedRange(seg.base, p.leoLocal))
		ns, err := p.createSegment(p.leoLocal)
		if err != nil {
			return err
		}
		seg.mu.Lock()
		seg.next = p.leoLocal
		seg.mu.Unlock()
		p.installActiveLocked(ns)
		p.publishHWMLocked(p.leoLocal)
	}
	p.fsyncFailed = false
	return nil
}

// syncActiveLocked fsyncs the active segment and publishes everything appended as durable.
func (p *Partition) syncActiveLocked() error {
	seg := p.active
	if err := p.timedSync(seg.f, false); err != nil {
		p.segmentSyncFailedLocked(err)
		return err
	}
	p.durablePos = seg.size.Load()
	_, p.flushedMaxTs, p.flushedMaxOff = seg.stats()
	if p.leoLocal > p.durableEnd {
		p.publishHWMLocked(p.leoLocal)
	}
	return nil
}

// errRolling: a repair was asked for while a roll has the segment files (see rollLocked).
var errRolling = errors.New("a segment roll is in progress")

// errSegFailed is returned for appends to a partition whose segment fsync failed with the WAL on.
var errSegFailed = errors.New("a segment fsync failed; the partition refuses appends until restart")

// segmentSyncFailedLocked records a failed segment fsync. Without the WAL the repair path
// discards what was not fsync'd. With it, acknowledged bytes may be durable only in the WAL and a
// retried fsync proves nothing: the partition stops taking appends and the WAL is kept for the
// next start to replay.
func (p *Partition) segmentSyncFailedLocked(err error) {
	if p.wal == nil {
		p.fsyncFailed = true
		return
	}
	if !p.segFailed {
		p.segFailed = true
		p.log.Error("segment fsync failed: partition refuses appends until restart, which replays the write-ahead log", zap.Error(err))
	}
	p.wal.pin()
}

// Sync calls done once every offset < end is fsync'd (from the flusher goroutine; done must not
// block). err != nil means the caller answers KAFKA_STORAGE_ERROR. One fsync serves every waiter
// covered at that moment (group commit). With flush.messages > 1 the operator chose acks from the
// page cache: done(nil) is called inline, except while a transaction marker is not yet durable.
// A marker's durability is not the topic's choice: the coordinator writes COMPLETE once every
// marker's Sync said durable, and a marker lost to a power loss after that leaves the
// transaction hanging on this partition (the LSO pinned) with nobody left to rewrite it. So
// while a marker is above the HWM every Sync reaching past the HWM waits for the fsync (the
// waiter makes the flusher fsync at once).
func (p *Partition) Sync(end int64, done func(err error)) {
	if p.config().FlushMessages > 1 && !(p.markerEnd.Load() > p.hwm.Load() && end > p.hwm.Load()) {
		if p.topic.store.fenced.Load() {
			done(ErrFenced) // Rule P: no ack at all once fenced, not even from the page cache
			return
		}
		done(nil)
		return
	}
	p.wmu.Lock()
	if p.isLostLocked(end) {
		p.wmu.Unlock()
		done(ErrLost)
		return
	}
	if p.topic.store.fenced.Load() && p.hwm.Load() < end {
		// Checked under wmu: Store.fence sets the flag before failing the waiters under wmu,
		// so a waiter is either failed there or refused here.
		p.wmu.Unlock()
		done(ErrFenced)
		return
	}
	if p.hwm.Load() >= end {
		p.wmu.Unlock()
		done(nil)
		return
	}
	if p.wclosed {
		p.wmu.Unlock()
		if p.released.Load() {
			done(ErrNotLoaded)
		} else {
			done(ErrClosed)
		}
		return
	}
	p.waiters = append(p.waiters, waiter{end: end, done: done})
	p.wmu.Unlock()
	if p.wal != nil && p.nonWALEnd.Load() <= p.hwm.Load() {
		// The records are in a WAL round: the WAL flusher completes the waiter after that
		// round's sync (it publishes the HWM before it takes wmu, so the check above and this
		// waiter cannot both miss it). Waking the partition's flusher would be a wasted
		// context switch per produce.
		return
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// isLostLocked reports whether a waiter for end (offsets < end) covers a discarded record.
func (p *Partition) isLostLocked(end int64) bool {
	for _, r := range p.lost {
		if end > r.from && end <= r.to {
			return true
		}
	}
	return false
}

// flushLoop is the partition's flusher goroutine. It sleeps on the kick channel (idle partitions
// cost nothing) and fsyncs:
//   - flush.messages = 1: as soon as anything is unflushed (group commit);
//   - flush.messages > 1: once that many records are unflushed, or after
//     min(flush.ms, relaxedFlushDelay) since the first unflushed append.
func (p *Partition) flushLoop() {
	defer close(p.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		select {
		case <-p.stop:
			timer.Stop()
			err := error(ErrClosed)
			if !p.abandon.Load() {
				if ferr := p.flushOnce(); ferr != nil {
					err = ferr
				}
			}
			p.wmu.Lock()
			p.wclosed = true
			p.wmu.Unlock()
			p.completeWaiters(err)
			return
		case <-timer.C:
			armed = false
			_ = p.flushOnce()
			continue
		case <-p.kick:
		}
		cfg := p.config()
		if p.wal != nil && cfg.FlushMessages <= 1 && p.nonWALEnd.Load() <= p.hwm.Load() {
			continue // the WAL flusher makes these appends durable and completes the waiters
		}
		pending := p.leo.Load() - p.hwm.Load()
		p.wmu.Lock()
		hasWaiters := len(p.waiters) > 0
		p.wmu.Unlock()
		if cfg.FlushMessages <= 1 || pending >= cfg.FlushMessages || hasWaiters {
			if armed {
				timer.Stop()
				armed = false
			}
			_ = p.flushOnce()
			continue
		}
		if pending > 0 && !armed {
			d := relaxedFlushDelay
			if ms := time.Duration(cfg.FlushMs) * time.Millisecond; cfg.FlushMs < int64(relaxedFlushDelay/time.Millisecond) {
				d = ms
			}
			timer.Reset(d)
			armed = true
		}
	}
}

// flushOnce makes everything appended so far durable and completes the covered waiters.
func (p *Partition) flushOnce() error {
	p.mu.Lock()
	if (p.dirtyTail || p.fsyncFailed) && p.rolling {
		p.mu.Unlock()
		return nil // the roll gives up and kicks this flusher again
	}
	if p.dirtyTail || p.fsyncFailed {
		if err := p.repairLocked(); err != nil {
			p.mu.Unlock()
			p.completeWaiters(err)
			return err
		}
	}
	end, seg, pos, durable := p.leoLocal, p.active, p.active.size.Load(), p.durableEnd
	_, maxTs, maxOff := seg.stats()
	var ck *recoveryCkpt
	if end > durable {
		ck = p.captureRecoveryLocked(seg)
	}
	// Every byte to flush ([durablePos, pos)) lies in blocks that were written (zeros) and
	// fsync'd before: fdatasync has no metadata to commit.
	datasync := pos <= seg.zeroSynced.Load()
	p.mu.Unlock()

	var err error
	if end > durable {
		p.segMu.RLock()
		if !seg.deleted {
			err = p.timedSync(seg.f, datasync)
		}
		p.segMu.RUnlock()
		p.mu.Lock()
		if err != nil && p.wal != nil {
			p.segmentSyncFailedLocked(err)
		} else if err != nil {
			p.log.Error("fsync failed; discarding un-fsync'd records", zap.Error(err))
			p.fsyncFailed = true
			if rerr := p.repairLocked(); rerr != nil {
				p.log.Error("partition repair failed", zap.Error(rerr))
			}
		} else if end > p.durableEnd && seg == p.active {
			defer p.writeRecoveryCheckpoint(seg, ck)
			p.durablePos = pos
			p.flushedMaxTs, p.flushedMaxOff = maxTs, maxOff
			p.publishHWMLocked(end)
		}
		p.mu.Unlock()
	}
	p.completeWaiters(err)
	return err
}

// zeroLoop is the partition's zeroer goroutine (see the pre-zeroing notes in segment.go). Appends
// kick it when the zeroed region ahead of the active segment's logical end runs short; it never
// takes the append mutex, and an append only waits for it when it outruns the zeroed region
// (then for one zeroChunk write at most). A failed zero write or fsync (ENOSPC, EIO) stops
// pre-zeroing for that segment: appends and flushes continue as append + fsync.
func (p *Partition) zeroLoop() {
	defer close(p.zdone)
	for {
		select {
		case <-p.stop:
			return
		case <-p.zkick:
		}
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			segs := *p.segs.Load()
			seg := segs[len(segs)-1] // the active segment
			segBytes := p.config().SegmentBytes
			size := seg.size.Load()
			if !seg.needsZeroing(size, segBytes) {
				break
			}
			target := min(segBytes, size+zeroAhead(size))
			n, err := seg.zeroTo(target, func() (File, error) {
				return p.fs.OpenFile(seg.path(".log"), os.O_RDWR, 0o644)
			})
			prezeroBytesTotal.Add(int(n))
			if err != nil {
				prezeroFailuresTotal.Inc()
				p.log.Warn("pre-zeroing failed; segment falls back to append + fsync",
					zap.Int64("segment", seg.base), zap.Error(err))
				break
			}
			if n == 0 {
				break // truncated or sealed meanwhile; the next append kicks again
			}
		}
	}
}

// completeWaiters fires every waiter that is covered by the HWM, that waits on a discarded range,
// or (when err != nil) every waiter. The partition's flusher and the WAL flusher both call it;
// fireMu guards the scratch slice (callbacks must not block).
func (p *Partition) completeWaiters(err error) {
	p.fireMu.Lock()
	defer p.fireMu.Unlock()
	hwm := p.hwm.Load()
	p.wmu.Lock()
	fire := p.fire[:0]
	n := 0
	for _, w := range p.waiters {
		switch {
		case p.isLostLocked(w.end):
			w.end = math.MinInt64 // marker: answer ErrLost
			fire = append(fire, w)
		case w.end <= hwm || err != nil:
			fire = append(fire, w)
		default:
			p.waiters[n] = w
			n++
		}
	}
	clear(p.waiters[n:])
	p.waiters = p.waiters[:n]
	p.wmu.Unlock()
	for _, w := range fire {
		switch {
		case w.end == math.MinInt64:
			w.done(ErrLost)
		case w.end <= hwm:
			w.done(nil)
		default:
			w.done(err)
		}
	}
	clear(fire)
	p.fire = fire[:0]
}

// shutdown stops the flusher (final fsync when clean), writes a producer snapshot at the log end
// (clean only, and only if everything is durable) and closes the files.
func (p *Partition) shutdown(clean bool) error {
	p.mu.Lock()
	p.waitRollLocked()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.loaded.Store(false)
	active := p.active
	p.untrackAllLocked()
	p.mu.Unlock()
	active.seal() // the zeroer stops after its current chunk
	if !clean {
		// Crash-like close (topic deletion, tests): nothing more is written.
		// The flusher fails the remaining waiters (only it uses the waiter scratch slice).
		p.abandon.Store(true)
		close(p.stop)
		<-p.done
		<-p.zdone
		p.closeFiles()
		return nil
	}
	close(p.stop)
	<-p.done
	<-p.zdone
	var err error
	p.mu.Lock()
	if p.wal != nil && p.durableEnd == p.leoLocal && !p.fsyncFailed && !p.segFailed {
		// The WAL made the tail durable, not the segment: fsync it, the WAL goes away after a
		// clean close.
		if serr := p.timedSync(p.active.f, false); serr != nil {
			p.segmentSyncFailedLocked(serr)
		}
	}
	if p.durableEnd == p.leoLocal && !p.fsyncFailed && !p.segFailed {
		// Leave no zero tail behind a clean close (recovery would cut it anyway). The final
		// flush may have repaired the partition into a new active segment.
		active = p.active
		if size := active.size.Load(); active.filled.Load() > size {
			terr := active.truncate(size, true)
			if terr == nil {
				terr = active.f.Sync()
			}
			if terr != nil {
				p.log.Warn("cannot cut pre-zeroed tail", zap.Error(terr))
			}
		}
		p.writeSnapshotLocked(p.leoLocal)
		if p.sealOnClose {
			p.sealActiveLocked()
		}
	} else {
		err = fmt.Errorf("cannot flush partition (%s-%d): log end %d, durable %d", p.topic.Name, p.id, p.leoLocal, p.durableEnd)
	}
	p.mu.Unlock()
	p.closeFiles()
	return err
}

// release is ReleasePartition's part: the partition is shut down cleanly (final fsync — with
// the WAL on this is its checkpoint: everything the WAL acknowledged is then in the segment —,
// producer snapshot, files closed) and long-polls are woken.
func (p *Partition) release() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("cannot release partition (%s-%d): %w", p.topic.Name, p.id, ErrNotLoaded)
	}
	// Set before shutdown marks it closed, so every append that finds it closed answers 6.
	p.released.Store(true)
	p.mu.Unlock()
	err := p.shutdown(true)
	// Long-polls wake and, reading, get NOT_LEADER_OR_FOLLOWER; Changed stays closed.
	p.mu.Lock()
	ch := make(chan struct{})
	close(ch)
	old := p.changed.Swap(&ch)
	close(*old)
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cannot release partition (%s-%d): %w", p.topic.Name, p.id, err)
	}
	return nil
}

func (p *Partition) closeFiles() {
	p.segMu.Lock()
	defer p.segMu.Unlock()
	if l := p.segs.Load(); l != nil {
		for _, s := range *l {
			if !s.deleted {
				s.deleted = true
				s.seal()
				_ = s.f.Close()
			}
		}
	}
}

// Read appends whole batches starting at the batch containing offset, up to maxBytes (but at
// least one whole batch if any exists, as Kafka does with minOneMessage), never returning a batch
// at or beyond upTo (capped at the HWM). It returns OFFSET_OUT_OF_RANGE if offset < log start or
// offset > HWM, and KAFKA_STORAGE_ERROR on an I/O error. Reads use pread and never take the
// append mutex.
func (p *Partition) Read(dst []byte, offset int64, maxBytes int32, upTo int64) ([]byte, int16) {
	if p.released.Load() || p.topic.store.fenced.Load() {
		return dst, codec.CodeNotLeaderForPartition
	}
	hwm := p.hwm.Load()
	if offset < p.logStart.Load() || offset > hwm {
		return dst, codec.CodeOffsetOutOfRange
	}
	if upTo > hwm {
		upTo = hwm
	}
	if offset >= upTo {
		return dst, codec.CodeNone
	}
	p.segMu.RLock()
	defer p.segMu.RUnlock()
	segs := *p.segs.Load()
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base > offset }) - 1
	if i < 0 {
		i = 0
	}
	remaining := int64(maxBytes)
	first := true
	for ; i < len(segs) && (first || remaining > 0); i++ {
		seg := segs[i]
		if seg.deleted {
			return dst, codec.CodeOffsetOutOfRange // retention removed it meanwhile
		}
		size := seg.size.Load()
		pos := int64(0)
		var hdr [codec.BatchHeaderSize]byte
		var firstLen int64
		if offset > seg.base {
			pos = seg.lookup(offset)
		}
		// Skip batches that end before offset.
		for pos < size {
			if _, err := seg.f.ReadAt(hdr[:], pos); err != nil {
				return dst, codec.CodeKafkaStorageError
			}
			b := codec.Batch(hdr[:])
			firstLen = int64(b.BatchLength()) + codec.LogOverhead
			if b.LastOffset() >= offset {
				break
			}
			pos += firstLen
		}
		if pos >= size {
			continue
		}
		want := size - pos
		if want > remaining {
			want = remaining
		}
		if first && want < firstLen {
			want = firstLen
		}
		n0 := len(dst)
		dst = growLen(dst, int(want))
		m, err := seg.f.ReadAt(dst[n0:], pos)
		if err != nil && err != io.EOF {
			return dst[:n0], codec.CodeKafkaStorageError
		}
		kept := 0
		stop := false
		for {
			b, ok, bad := codec.FrameBatch(dst[n0+kept : n0+m])
			if !ok || bad {
				break
			}
			if b.BaseOffset() >= upTo {
				stop = true
				break
			}
			kept += len(b)
		}
		dst = dst[:n0+kept]
		if kept == 0 {
			break
		}
		first = false
		remaining -= int64(kept)
		if stop || pos+int64(kept) < size {
			break
		}
	}
	return dst, codec.CodeNone
}

// growLen extends dst by n bytes, reallocating if needed.
func growLen(dst []byte, n int) []byte {
	if cap(dst)-len(dst) < n {
		nd := make([]byte, len(dst), len(dst)+n)
		copy(nd, dst)
		dst = nd
	}
	return dst[:len(dst)+n]
}

// batchAt reads the whole batch containing offset from seg.
func (p *Partition) batchAt(seg *segment, offset int64) (codec.Batch, error) {
	r := batchReader{f: seg.f, pos: seg.lookup(offset), end: seg.size.Load()}
	for {
		b, status, err := r.next(true)
		if err != nil {
			return nil, err
		}
		if status != batchOK {
			return nil, io.ErrUnexpectedEOF
		}
		if b.LastOffset() >= offset {
			return b, nil
		}
	}
}

// OffsetForTimestamp finds the first record with timestamp >= ts below the HWM (ListOffsets).
// The batch is found through the time index; inside an uncompressed CreateTime batch the exact
// record is returned (as Kafka does). For compressed or LogAppendTime batches the answer is the
// batch's base offset and max timestamp (kaas does not decompress on this path).
func (p *Partition) OffsetForTimestamp(ts int64) (offset, timestamp int64, found bool) {
	hwm := p.hwm.Load()
	ls := p.logStart.Load()
	p.segMu.RLock()
	defer p.segMu.RUnlock()
	for _, seg := range *p.segs.Load() {
		if seg.base >= hwm || seg.deleted {
			break
		}
		if next, maxTs, _ := seg.stats(); maxTs < ts || next <= ls {
			continue
		}
		start := seg.timeLookup(ts)
		r := batchReader{f: seg.f, pos: seg.lookup(start), end: seg.size.Load()}
		for {
			b, status, err := r.next(true)
			if err != nil || status != batchOK || b.BaseOffset() >= hwm {
				return -1, -1, false
			}
			if b.LastOffset() < ls {
				continue // below a log start DeleteRecords moved into this segment
			}
			if b.MaxTimestamp() >= ts {
				o, t := recordAtOrAfter(b, ts)
				// Apache searches from the log start: a record below it is never the answer.
				return max(o, ls), t, true
			}
		}
	}
	return -1, -1, false
}

// recordAtOrAfter returns the first record of b with timestamp >= ts, or (b.base, b.max).
func recordAtOrAfter(b codec.Batch, ts int64) (int64, int64) {
	if b.Compression() == 0 && !b.IsLogAppendTime() {
		found, fo, ft := false, int64(0), int64(0)
		walkRecordTimestamps(b, func(offDelta, t int64) bool {
			if t >= ts {
				found, fo, ft = true, b.BaseOffset()+offDelta, t
				return false
			}
			return true
		})
		if found {
			return fo, ft
		}
	}
	return b.BaseOffset(), b.MaxTimestamp()
}

// walkRecordTimestamps calls fn(offsetDelta, timestamp) for each record of an uncompressed batch
// until fn returns false or the records do not parse.
func walkRecordTimestamps(b codec.Batch, fn func(offDelta, ts int64) bool) {
	p := b.Records()
	base := b.BaseTimestamp()
	for i := int32(0); i < b.NumRecords(); i++ {
		l, k := binary.Varint(p)
		if k <= 0 || l < 1 || int64(len(p)-k) < l {
			return
		}
		rec := p[k+1 : k+int(l)] // skip attributes
		p = p[k+int(l):]
		td, k1 := binary.Varint(rec)
		if k1 <= 0 {
			return
		}
		od, k2 := binary.Varint(rec[k1:])
		if k2 <= 0 {
			return
		}
		if !fn(od, base+td) {
			return
		}
	}
}

// MaxTimestamp returns the offset and timestamp of the record with the largest timestamp among
// durable records (ListOffsets MAX_TIMESTAMP, KIP-734), or -1, -1 if there is none.
func (p *Partition) MaxTimestamp() (offset, timestamp int64) {
	p.mu.Lock()
	active, bestTs, bestOff := p.active, p.flushedMaxTs, p.flushedMaxOff
	p.mu.Unlock()
	p.segMu.RLock()
	defer p.segMu.RUnlock()
	var bestSeg *segment
	if bestOff >= 0 {
		bestSeg = active
	}
	for _, seg := range *p.segs.Load() {
		if seg == active || seg.deleted {
			continue
		}
		// Earlier segments win ties: the first record with the max timestamp is reported.
		if _, ts, off := seg.stats(); off >= 0 && (ts > bestTs || (ts == bestTs && off < bestOff)) {
			bestTs, bestOff, bestSeg = ts, off, seg
		}
	}
	if bestSeg == nil || bestOff < p.logStart.Load() || bestSeg.deleted {
		return -1, -1
	}
	b, err := p.batchAt(bestSeg, bestOff)
	if err != nil {
		return bestOff, bestTs
	}
	o, t := recordAtOrAfter(b, bestTs)
	return o, t
}

// retain applies retention.ms / retention.bytes to closed segments (never the active one) and
// advances the log start offset. Segment age is its max timestamp (Kafka's largestTimestamp);
// an empty closed segment (left by a repair) is always removable.
func (p *Partition) retain(now time.Time) {
	cfg := p.config()
	nowMs := now.UnixMilli()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	segs := *p.segs.Load()
	var total int64
	for _, s := range segs {
		total += s.size.Load()
	}
	drop := 0
	for drop < len(segs)-1 { // never the active segment
		s := segs[drop]
		size := s.size.Load()
		next, maxTs, _ := s.stats()
		// cleanup.policy=compact alone: no time or size retention (Apache).
		byTime := cfg.deletes() && cfg.RetentionMs >= 0 && (maxTs < 0 || nowMs-maxTs > cfg.RetentionMs)
		byBytes := cfg.deletes() && cfg.RetentionBytes >= 0 && total-size >= cfg.RetentionBytes
		belowStart := next <= p.logStart.Load() // DeleteRecords moved the start past it
		if !byTime && !byBytes && !belowStart && size > 0 {
			break
		}
		total -= size
		drop++
	}
	if drop == 0 {
		p.mu.Unlock()
		return
	}
	p.removeSegmentsLocked(segs, drop) // releases mu
	p.log.Info("retention removed segments", zap.Int("segments", drop), zap.Int64("logStartOffset", p.logStart.Load()))
}

// expireProducers applies producer.id.expiration.ms (see Config.ProducerIDExpiration). The
// next snapshot (roll, close, release) no longer carries the removed producers.
func (p *Partition) expireProducers(nowMs, expirationMs int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.producers == nil {
		return
	}
	gone := p.producers.expire(nowMs, expirationMs)
	for _, pid := range gone {
		p.untrackPIDLocked(pid)
	}
	producersExpiredTotal.Add(len(gone))
}

// ProducerState returns pid's epoch, last sequence (-1 if none at this epoch), and last
// timestamp.
func (p *Partition) ProducerState(pid int64) (epoch int16, lastSeq int32, lastTimestamp int64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.producers.m[pid]
	if e == nil {
		return 0, -1, -1, false
	}
	lastSeq = -1
	if e.n > 0 {
		lastSeq = e.newest().lastSeq
	}
	return e.epoch, lastSeq, e.lastTs, true
}

// Producers lists the producers known to this partition (DescribeProducers).
func (p *Partition) Producers() []ProducerInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.producers.infos()
}

// FenceProducer raises pid's epoch to epoch (if higher), clears its window and drops its
// verification guard, so the old epoch's in-flight batches get INVALID_PRODUCER_EPOCH. Use
// Store.FenceProducer for an epoch bump: it reaches every partition.
func (p *Partition) FenceProducer(pid int64, epoch int16) {
	p.mu.Lock()
	if !p.closed {
		p.producers.fence(pid, epoch)
		p.touchLocked(pid)
		p.topic.store.pids.add(pid, p)
	}
	p.mu.Unlock()
}

// touchLocked stamps pid's entry with the wall clock (expiration counts idleness from it).
func (p *Partition) touchLocked(pid int64) {
	if e := p.producers.m[pid]; e != nil {
		e.touchMs = max(e.touchMs, time.Now().UnixMilli())
	}
}

// untrackAllLocked removes every pid of this partition from the store's index (close, release).
func (p *Partition) untrackAllLocked() {
	if p.producers == nil {
		return
	}
	for pid := range p.producers.m {
		p.topic.store.pids.remove(pid, p)
	}
	for pid := range p.producers.guards {
		p.topic.store.pids.remove(pid, p)
	}
}
