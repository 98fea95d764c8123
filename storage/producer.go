package storage

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage/framelog"
)

// Idempotent producer state (KIP-98), per partition, modelled on Apache's ProducerStateManager.
//
// For every producer id the partition remembers its epoch and the last producerWindow batches
// it appended. Java producers keep at most 5 requests in flight, so a retry of any of them is
// recognised as a duplicate and answered with its original offsets.
//
//	classify(batch) for a client batch, producerId >= 0:
//
//	  no state for pid ───────────────────────────────► accept (state may have expired)
//	  same epoch, (firstSeq,lastSeq) in window ──────────► duplicate: original offsets, write nothing
//	  epoch < recorded ─────────────────────────────────► 47 INVALID_PRODUCER_EPOCH
//	  epoch > recorded ──── firstSeq == 0 ──────────────► accept (window resets on write)
//	                   └─── else ───────────────────────► 45 OUT_OF_ORDER_SEQUENCE_NUMBER
//	  same epoch, empty window ── firstSeq == 0 ────────► accept, else 45
//	  same epoch ── firstSeq == newest.lastSeq+1 (wrap MaxInt32→0) ► accept, else 45
//
// The window changes only after the batch is on disk (record), never on a rejected or failed
// append.
const producerWindow = 5

// batchMeta is one remembered batch.
type batchMeta struct {
	firstSeq, lastSeq      int32
	baseOffset, lastOffset int64
	timestamp              int64
}

type producerEntry struct {
	epoch  int16
	window [producerWindow]batchMeta // ring, oldest at head
	head   int
	n      int
	lastTs int64
	// touchMs is the broker's wall clock when this process last appended for or fenced the
	// producer (0 after a load: the snapshot has only lastTs). Expiration measures idleness
	// from the later of the two, so a client clock running behind, or a fence that created the
	// entry (lastTs -1), does not expire state at once.
	touchMs int64

	// Transaction state (KIP-98, Apache ProducerStateEntry): the coordinator epoch of the last
	// marker (-1 before any), and the producer's ongoing transaction on this partition (nil when
	// none). txn is set by the first transactional data batch and cleared by the next marker.
	coordEpoch int32
	txn        *txnSpan
	// prepareSeq is the highest prepare sequence of a marker applied for the producer here
	// (AppendMarkerSeq; 0: none since this partition was opened). In memory only.
	prepareSeq uint64
}

func (e *producerEntry) newest() *batchMeta {
	return &e.window[(e.head+e.n-1)%producerWindow]
}

func (e *producerEntry) push(m batchMeta) {
	if e.n < producerWindow {
		e.window[(e.head+e.n)%producerWindow] = m
		e.n++
		return
	}
	e.window[e.head] = m
	e.head = (e.head + 1) % producerWindow
}

func (e *producerEntry) find(first, last int32) (batchMeta, bool) {
	for i := 0; i < e.n; i++ {
		m := e.window[(e.head+i)%producerWindow]
		if m.firstSeq == first && m.lastSeq == last {
			return m, true
		}
	}
	return batchMeta{}, false
}

// bumpEpoch raises the epoch and clears the window (a new epoch restarts sequences at 0).
func (e *producerEntry) bumpEpoch(epoch int16) {
	if epoch > e.epoch {
		e.epoch = epoch
		e.n, e.head = 0, 0
	}
}

// producerState is guarded by the partition's append mutex.
type producerState struct {
	m map[int64]*producerEntry

	// guards are the KIP-890 verification guards (txn.go), in memory only: a restart fails an
	// in-flight verification with INVALID_TXN_STATE and the client retries or aborts.
	guards map[int64]verifyGuard

	// snapTail is what a decoded snapshot carried of the aborted-transaction index (entries of
	// the then-active segment, see encode); only meaningful right after decoding.
	snapTail []AbortedTxn
}

func newProducerState() *producerState {
	return &producerState{m: make(map[int64]*producerEntry), guards: make(map[int64]verifyGuard)}
}

// check classifies a client batch. It returns the Kafka error code, and for a duplicate the
// original batch. Order (Apache UnifiedLog.analyzeAndValidateProducerState with KAFKA-19690):
// duplicate → epoch (47) → transaction state (48) → sequence (45).
//
// fences holds the store-wide fenced epochs (Store.FenceProducer), consulted only when this
// partition has no state for pid: a partition that holds state was fenced directly.
// guard is the caller's verification guard (0 = none); see txnCheck.
func (ps *producerState) check(b codec.Batch, fences *fenceMemory, guard uint64) (code int16, dup batchMeta, isDup bool) {
	pid := b.ProducerID()
	if pid < 0 {
		if b.IsTransactional() {
			return codec.CodeInvalidTxnState, batchMeta{}, false
		}
		return codec.CodeNone, batchMeta{}, false
	}
	e := ps.m[pid]
	epoch, first := b.ProducerEpoch(), b.BaseSequence()
	if e == nil {
		if fences != nil {
			if min, ok := fences.get(pid); ok && epoch < min {
				return codec.CodeInvalidProducerEpoch, batchMeta{}, false
			}
		}
		if code := ps.txnCheck(nil, b, guard); code != codec.CodeNone {
			return code, batchMeta{}, false
		}
		return codec.CodeNone, batchMeta{}, false
	}
	if epoch == e.epoch {
		if m, ok := e.find(first, b.LastSequence()); ok {
			return codec.CodeNone, m, true
		}
	}
	if epoch < e.epoch {
		return codec.CodeInvalidProducerEpoch, batchMeta{}, false
	}
	if code := ps.txnCheck(e, b, guard); code != codec.CodeNone {
		return code, batchMeta{}, false
	}
	switch {
	case first < 0:
		// A producer id without sequences (not sent by real clients): epoch-checked only.
		return codec.CodeNone, batchMeta{}, false
	case epoch > e.epoch, e.n == 0:
		if first != 0 {
			return codec.CodeOutOfOrderSequenceNumber, batchMeta{}, false
		}
		return codec.CodeNone, batchMeta{}, false
	case first != codec.IncrementSequence(e.newest().lastSeq, 1):
		return codec.CodeOutOfOrderSequenceNumber, batchMeta{}, false
	}
	return codec.CodeNone, batchMeta{}, false
}

// txnCheck applies the transaction-state rules to a client batch whose epoch already passed:
//
//	transactional, ongoing txn here opened at this epoch ────► ok
//	transactional, ongoing txn here opened at another epoch ─► 48 (stricter than Apache: two
//	                                                            sessions' data never merge into
//	                                                            one transaction)
//	transactional, guard == current guard for (pid, epoch) ──► ok (first batch, KIP-890)
//	transactional, otherwise ─────────────────────────────────► 48 INVALID_TXN_STATE
//	non-transactional while a txn is ongoing here ────────────► 48 (Apache ProducerAppendInfo)
func (ps *producerState) txnCheck(e *producerEntry, b codec.Batch, guard uint64) int16 {
	if !b.IsTransactional() {
		if e != nil && e.txn != nil {
			return codec.CodeInvalidTxnState
		}
		return codec.CodeNone
	}
	if e != nil && e.txn != nil {
		if e.txn.epoch == b.ProducerEpoch() {
			return codec.CodeNone
		}
		return codec.CodeInvalidTxnState
	}
	if g, ok := ps.guards[b.ProducerID()]; ok && guard != 0 && g.token == guard && g.epoch == b.ProducerEpoch() {
		return codec.CodeNone
	}
	return codec.CodeInvalidTxnState
}

// txnEvent is what record did to the producer's transaction on this partition.
type txnEvent struct {
	opened *txnSpan // the batch opened a transaction
	closed *txnSpan // a marker closed this transaction (nil: the marker closed nothing)
	abort  bool     // the closing marker was an ABORT
}

// record updates the state with a batch that is now in the log (also used by replay, which is
// why no check happens here). Data batches: a transactional one opens the producer's transaction
// if none is ongoing. Control batches (COMMIT/ABORT markers, which must be passed whole): raise the
// epoch (resetting the window when it grows), record the coordinator epoch, close the ongoing
// transaction, and clear the verification guard; they carry no sequence. Kafka skips the aborted
// index entry for a marker that closes nothing (Apache appendEndTxnMarker), and so does the caller.
func (ps *producerState) record(b codec.Batch) (ev txnEvent) {
	pid := b.ProducerID()
	if pid < 0 {
		return ev
	}
	e := ps.m[pid]
	if e == nil {
		e = &producerEntry{epoch: b.ProducerEpoch(), coordEpoch: -1}
		ps.m[pid] = e
	}
	e.bumpEpoch(b.ProducerEpoch())
	e.lastTs = b.MaxTimestamp()
	if b.IsControl() {
		typ := codec.ControlType(b)
		if typ != codec.ControlAbort && typ != codec.ControlCommit {
			return ev // not a transaction marker (no such batches are written to data partitions)
		}
		if ce, ok := controlCoordinatorEpoch(b); ok && ce > e.coordEpoch {
			e.coordEpoch = ce
		}
		if e.txn != nil {
			ev.closed, ev.abort = e.txn, typ == codec.ControlAbort
			e.txn = nil
		}
		delete(ps.guards, pid)
		return ev
	}
	if b.IsTransactional() && e.txn == nil {
		e.txn = &txnSpan{pid: pid, epoch: b.ProducerEpoch(), first: b.BaseOffset(), startTs: b.MaxTimestamp(), end: -1}
		ev.opened = e.txn
		delete(ps.guards, pid) // Apache drops the guard once the transaction is ongoing
	}
	if b.BaseSequence() < 0 || b.ProducerEpoch() != e.epoch {
		return ev
	}
	e.push(batchMeta{
		firstSeq: b.BaseSequence(), lastSeq: b.LastSequence(),
		baseOffset: b.BaseOffset(), lastOffset: b.LastOffset(), timestamp: b.MaxTimestamp(),
	})
	return ev
}

// fence raises pid's epoch (creating the entry if needed), clears its window and drops its
// verification guard. An ongoing transaction stays open: only its marker closes it.
func (ps *producerState) fence(pid int64, epoch int16) {
	delete(ps.guards, pid)
	e := ps.m[pid]
	if e == nil {
		ps.m[pid] = &producerEntry{epoch: epoch, lastTs: -1, coordEpoch: -1}
		return
	}
	e.bumpEpoch(epoch)
}

// expire removes the producers idle for at least expirationMs at nowMs, except those with an
// ongoing transaction here (Apache removeExpiredProducers), and returns their ids.
func (ps *producerState) expire(nowMs, expirationMs int64) []int64 {
	var gone []int64
	for pid, e := range ps.m {
		if e.txn == nil && nowMs-max(e.lastTs, e.touchMs) >= expirationMs {
			delete(ps.m, pid)
			gone = append(gone, pid)
		}
	}
	return gone
}

// ProducerInfo describes one producer's state on a partition (DescribeProducers, KIP-664).
type ProducerInfo struct {
	ProducerID            int64
	Epoch                 int16
	LastSequence          int32 // -1 if no batch is remembered at the current epoch
	LastTimestamp         int64
	CoordinatorEpoch      int32 // of the last marker written for this producer, -1 if none
	CurrentTxnStartOffset int64 // first offset of the ongoing transaction, -1 if none
}

func (ps *producerState) infos() []ProducerInfo {
	out := make([]ProducerInfo, 0, len(ps.m))
	for pid, e := range ps.m {
		last := int32(-1)
		if e.n > 0 {
			last = e.newest().lastSeq
		}
		start := int64(-1)
		if e.txn != nil {
			start = e.txn.first
		}
		out = append(out, ProducerInfo{ProducerID: pid, Epoch: e.epoch, LastSequence: last,
			LastTimestamp: e.lastTs, CoordinatorEpoch: e.coordEpoch, CurrentTxnStartOffset: start})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ProducerID < out[j].ProducerID })
	return out
}

// Snapshot file format (big endian), named <offset %020d>.snapshot, meaning "state after every
// batch below offset":
//
//	"KPS1" | version u16 = 2 | offset i64 | count u32 |
//	count × { pid i64 | epoch i16 | lastTs i64 | coordEpoch i32 | txnFirst i64 | txnEpoch i16 | txnStartTs i64 |
//	          n u8 | n × { firstSeq i32 | lastSeq i32 | baseOffset i64 | lastOffset i64 | ts i64 } } |
//	tailCount u32 | tailCount × { pid i64 | firstOffset i64 | lastOffset i64 } |
//	crc32c u32 over everything before it
//
// txnFirst is -1 when the producer has no ongoing transaction. The tail is the aborted-transaction
// index of the segment that was active when the snapshot was written (closed segments have their
// own .txnindex, see encodeTxnIndex), so a snapshot taken inside a segment (clean close) loses nothing.
// Version 1 (before transactions: no coordEpoch/txn fields, no tail) is still read.
//
// Written at each segment roll and at clean close (tmp + fsync + rename). A snapshot that fails
// its CRC is ignored and an older one (or the log start) is used instead; the log tail after the
// snapshot is always replayed, so a kill -9 loses nothing.
const snapshotMagic = "KPS1"

var crcTable = framelog.Castagnoli

func (ps *producerState) encode(offset int64, tail []AbortedTxn) []byte {
	pids := make([]int64, 0, len(ps.m))
	for pid := range ps.m {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	buf := append([]byte(nil), snapshotMagic...)
	buf = binary.BigEndian.AppendUint16(buf, 2)
	buf = binary.BigEndian.AppendUint64(buf, uint64(offset))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(pids)))
	for _, pid := range pids {
		e := ps.m[pid]
		first, txnEpoch, startTs := int64(-1), int16(-1), int64(-1)
		if e.txn != nil {
			first, txnEpoch, startTs = e.txn.first, e.txn.epoch, e.txn.startTs
		}
		buf = binary.BigEndian.AppendUint64(buf, uint64(pid))
		buf = binary.BigEndian.AppendUint16(buf, uint16(e.epoch))
		buf = binary.BigEndian.AppendUint64(buf, uint64(e.lastTs))
		buf = binary.BigEndian.AppendUint32(buf, uint32(e.coordEpoch))
		buf = binary.BigEndian.AppendUint64(buf, uint64(first))
		buf = binary.BigEndian.AppendUint16(buf, uint16(txnEpoch))
		buf = binary.BigEndian.AppendUint64(buf, uint64(startTs))
		buf = append(buf, byte(e.n))
		for i := 0; i < e.n; i++ {
			m := e.window[(e.head+i)%producerWindow]
			buf = binary.BigEndian.AppendUint32(buf, uint32(m.firstSeq))
			buf = binary.BigEndian.AppendUint32(buf, uint32(m.lastSeq))
			buf = binary.BigEndian.AppendUint64(buf, uint64(m.baseOffset))
			buf = binary.BigEndian.AppendUint64(buf, uint64(m.lastOffset))
			buf = binary.BigEndian.AppendUint64(buf, uint64(m.timestamp))
		}
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(tail)))
	for _, a := range tail {
		buf = binary.BigEndian.AppendUint64(buf, uint64(a.ProducerID))
		buf = binary.BigEndian.AppendUint64(buf, uint64(a.FirstOffset))
		buf = binary.BigEndian.AppendUint64(buf, uint64(a.LastOffset))
	}
	return binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf, crcTable))
}

var errBadSnapshot = errors.New("bad producer state snapshot")

func decodeProducerSnapshot(buf []byte) (*producerState, int64, error) {
	if len(buf) < 4+2+8+4+4 || string(buf[:4]) != snapshotMagic {
		return nil, 0, errBadSnapshot
	}
	body := buf[:len(buf)-4]
	if crc32.Checksum(body, crcTable) != binary.BigEndian.Uint32(buf[len(buf)-4:]) {
		return nil, 0, errBadSnapshot
	}
	version := binary.BigEndian.Uint16(body[4:])
	if version != 1 && version != 2 {
		return nil, 0, errBadSnapshot // a future version is not misread
	}
	offset := int64(binary.BigEndian.Uint64(body[6:]))
	count := binary.BigEndian.Uint32(body[14:])
	p := body[18:]
	ps := newProducerState()
	fixed := 19
	if version == 2 {
		fixed = 41
	}
	for i := uint32(0); i < count; i++ {
		if len(p) < fixed {
			return nil, 0, errBadSnapshot
		}
		pid := int64(binary.BigEndian.Uint64(p))
		e := &producerEntry{epoch: int16(binary.BigEndian.Uint16(p[8:])), lastTs: int64(binary.BigEndian.Uint64(p[10:])), coordEpoch: -1}
		if version == 2 {
			e.coordEpoch = int32(binary.BigEndian.Uint32(p[18:]))
			first, txnEpoch, startTs := int64(binary.BigEndian.Uint64(p[22:])), int16(binary.BigEndian.Uint16(p[30:])), int64(binary.BigEndian.Uint64(p[32:]))
			if first < -1 || first > offset {
				return nil, 0, errBadSnapshot
			}
			if first >= 0 {
				e.txn = &txnSpan{pid: pid, epoch: txnEpoch, first: first, startTs: startTs, end: -1}
			}
		}
		n := int(p[fixed-1])
		p = p[fixed:]
		if n > producerWindow || len(p) < n*32 {
			return nil, 0, errBadSnapshot
		}
		for j := 0; j < n; j++ {
			e.push(batchMeta{
				firstSeq: int32(binary.BigEndian.Uint32(p)), lastSeq: int32(binary.BigEndian.Uint32(p[4:])),
				baseOffset: int64(binary.BigEndian.Uint64(p[8:])), lastOffset: int64(binary.BigEndian.Uint64(p[16:])),
				timestamp: int64(binary.BigEndian.Uint64(p[24:])),
			})
			p = p[32:]
		}
		ps.m[pid] = e
	}
	if version == 2 {
		if len(p) < 4 {
			return nil, 0, errBadSnapshot
		}
		n := binary.BigEndian.Uint32(p)
		p = p[4:]
		if uint64(len(p)) != uint64(n)*24 {
			return nil, 0, errBadSnapshot
		}
		for i := uint32(0); i < n; i++ {
			a := AbortedTxn{ProducerID: int64(binary.BigEndian.Uint64(p)), FirstOffset: int64(binary.BigEndian.Uint64(p[8:])),
				LastOffset: int64(binary.BigEndian.Uint64(p[16:]))}
			if a.FirstOffset > a.LastOffset || a.LastOffset >= offset ||
				(len(ps.snapTail) > 0 && a.LastOffset <= ps.snapTail[len(ps.snapTail)-1].LastOffset) {
				return nil, 0, errBadSnapshot
			}
			ps.snapTail = append(ps.snapTail, a)
			p = p[24:]
		}
	}
	if len(p) != 0 {
		return nil, 0, errBadSnapshot
	}
	return ps, offset, nil
}

// snapFile is one producer snapshot file: <offset>.snapshot (epoch noEpoch) or, in cluster mode,
// <offset>-<epoch>.snapshot.
type snapFile struct {
	off   int64
	epoch int32
	name  string
}

// parseEpochName parses "<base %020d><ext>" (epoch noEpoch) or "<base>-<epoch %010d><ext>".
func parseEpochName(name, ext string) (base int64, epoch int32, ok bool) {
	stem, found := strings.CutSuffix(name, ext)
	if !found {
		return 0, 0, false
	}
	epoch = noEpoch
	if b, e, two := strings.Cut(stem, "-"); two {
		ep, err := strconv.ParseInt(e, 10, 32)
		if err != nil || ep < 0 {
			return 0, 0, false
		}
		stem, epoch = b, int32(ep)
	}
	base, err := strconv.ParseInt(stem, 10, 64)
	if err != nil || base < 0 {
		return 0, 0, false
	}
	return base, epoch, true
}

// listSnapshotFiles returns every snapshot in dir, newest offset first (higher epoch first on a tie).
func listSnapshotFiles(dir string) []snapFile {
	ents, _ := os.ReadDir(dir)
	var out []snapFile
	for _, e := range ents {
		if o, ep, ok := parseEpochName(e.Name(), ".snapshot"); ok {
			out = append(out, snapFile{off: o, epoch: ep, name: e.Name()})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].off != out[j].off {
			return out[i].off > out[j].off
		}
		return out[i].epoch > out[j].epoch
	})
	return out
}

// listSnapshots returns the offsets of the single-broker snapshots in dir, newest first.
func listSnapshots(dir string) []int64 {
	var offs []int64
	for _, f := range listSnapshotFiles(dir) {
		if f.epoch == noEpoch {
			offs = append(offs, f.off)
		}
	}
	return offs
}

// loadNewestSnapshot returns the newest valid snapshot at or below maxOffset, or an empty state
// and offset -1. Only single-broker names count; loadNewestSnapshotOf takes a filter.
func loadNewestSnapshot(dir string, maxOffset int64) (*producerState, int64) {
	return loadNewestSnapshotOf(dir, maxOffset, nil)
}

// loadNewestSnapshotOf is loadNewestSnapshot over the snapshots ok accepts (nil: unsuffixed
// names only).
func loadNewestSnapshotOf(dir string, maxOffset int64, ok func(snapFile) bool) (*producerState, int64) {
	for _, f := range listSnapshotFiles(dir) {
		if f.off > maxOffset {
			continue // describes offsets the log no longer has (cut back after a failure)
		}
		if (ok == nil && f.epoch != noEpoch) || (ok != nil && !ok(f)) {
			continue
		}
		buf, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			continue
		}
		ps, off, err := decodeProducerSnapshot(buf)
		if err != nil || off != f.off {
			continue
		}
		return ps, f.off
	}
	return newProducerState(), -1
}

// pruneSnapshots keeps the newest `keep` snapshots named with epoch and removes the rest, plus
// any above maxOffset. Snapshots of other epochs are never touched (another leader's files).
func pruneSnapshots(dir string, maxOffset int64, keep int, epoch int32) {
	kept := 0
	for _, f := range listSnapshotFiles(dir) {
		if f.epoch != epoch {
			continue
		}
		if f.off <= maxOffset && kept < keep {
			kept++
			continue
		}
		_ = os.Remove(filepath.Join(dir, f.name))
	}
}
