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
}

func newProducerState() *producerState { return &producerState{m: make(map[int64]*producerEntry)} }

// check classifies a client batch. It returns the Kafka error code, and for a duplicate the
// original batch.
func (ps *producerState) check(b codec.Batch) (code int16, dup batchMeta, isDup bool) {
	pid := b.ProducerID()
	if pid < 0 {
		return codec.CodeNone, batchMeta{}, false
	}
	e := ps.m[pid]
	if e == nil {
		return codec.CodeNone, batchMeta{}, false
	}
	epoch, first := b.ProducerEpoch(), b.BaseSequence()
	if epoch == e.epoch {
		if m, ok := e.find(first, b.LastSequence()); ok {
			return codec.CodeNone, m, true
		}
	}
	switch {
	case epoch < e.epoch:
		return codec.CodeInvalidProducerEpoch, batchMeta{}, false
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

// record updates the state with a batch that is now in the log (also used by replay). Control
// batches (transaction markers) only move the epoch up; they carry no sequence.
func (ps *producerState) record(b codec.Batch) {
	pid := b.ProducerID()
	if pid < 0 {
		return
	}
	e := ps.m[pid]
	if e == nil {
		e = &producerEntry{epoch: b.ProducerEpoch()}
		ps.m[pid] = e
	}
	e.bumpEpoch(b.ProducerEpoch())
	e.lastTs = b.MaxTimestamp()
	if b.IsControl() || b.BaseSequence() < 0 || b.ProducerEpoch() != e.epoch {
		return
	}
	e.push(batchMeta{
		firstSeq: b.BaseSequence(), lastSeq: b.LastSequence(),
		baseOffset: b.BaseOffset(), lastOffset: b.LastOffset(), timestamp: b.MaxTimestamp(),
	})
}

// fence raises pid's epoch (creating the entry if needed) and clears its window.
func (ps *producerState) fence(pid int64, epoch int16) {
	e := ps.m[pid]
	if e == nil {
		ps.m[pid] = &producerEntry{epoch: epoch, lastTs: -1}
		return
	}
	e.bumpEpoch(epoch)
}

// ProducerInfo describes one producer's state on a partition (DescribeProducers, KIP-664).
type ProducerInfo struct {
	ProducerID            int64
	Epoch                 int16
	LastSequence          int32 // -1 if no batch is remembered at the current epoch
	LastTimestamp         int64
	CoordinatorEpoch      int32 // -1 until transactions track it
	CurrentTxnStartOffset int64 // -1 until transactions track it
}

func (ps *producerState) infos() []ProducerInfo {
	out := make([]ProducerInfo, 0, len(ps.m))
	for pid, e := range ps.m {
		last := int32(-1)
		if e.n > 0 {
			last = e.newest().lastSeq
		}
		out = append(out, ProducerInfo{ProducerID: pid, Epoch: e.epoch, LastSequence: last,
			LastTimestamp: e.lastTs, CoordinatorEpoch: -1, CurrentTxnStartOffset: -1})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ProducerID < out[j].ProducerID })
	return out
}

// Snapshot file format (big endian), named <offset %020d>.snapshot, meaning "state after every
// batch below offset":
//
//	"KPS1" | version u16 = 1 | offset i64 | count u32 |
//	count × { pid i64 | epoch i16 | lastTs i64 | n u8 | n × { firstSeq i32 | lastSeq i32 |
//	                                                          baseOffset i64 | lastOffset i64 | ts i64 } } |
//	crc32c u32 over everything before it
//
// Written at each segment roll and at clean close (tmp + fsync + rename). A snapshot that fails
// its CRC is ignored and an older one (or the log start) is used instead; the log tail after the
// snapshot is always replayed, so a kill -9 loses nothing.
const snapshotMagic = "KPS1"

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func (ps *producerState) encode(offset int64) []byte {
	pids := make([]int64, 0, len(ps.m))
	for pid := range ps.m {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	buf := append([]byte(nil), snapshotMagic...)
	buf = binary.BigEndian.AppendUint16(buf, 1)
	buf = binary.BigEndian.AppendUint64(buf, uint64(offset))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(pids)))
	for _, pid := range pids {
		e := ps.m[pid]
		buf = binary.BigEndian.AppendUint64(buf, uint64(pid))
		buf = binary.BigEndian.AppendUint16(buf, uint16(e.epoch))
		buf = binary.BigEndian.AppendUint64(buf, uint64(e.lastTs))
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
	if binary.BigEndian.Uint16(body[4:]) != 1 {
		return nil, 0, errBadSnapshot // a future version is not misread
	}
	offset := int64(binary.BigEndian.Uint64(body[6:]))
	count := binary.BigEndian.Uint32(body[14:])
	p := body[18:]
	ps := newProducerState()
	for i := uint32(0); i < count; i++ {
		if len(p) < 19 {
			return nil, 0, errBadSnapshot
		}
		pid := int64(binary.BigEndian.Uint64(p))
		e := &producerEntry{epoch: int16(binary.BigEndian.Uint16(p[8:])), lastTs: int64(binary.BigEndian.Uint64(p[10:]))}
		n := int(p[18])
		p = p[19:]
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
	if len(p) != 0 {
		return nil, 0, errBadSnapshot
	}
	return ps, offset, nil
}

// listSnapshots returns the snapshot offsets in dir, newest first.
func listSnapshots(dir string) []int64 {
	ents, _ := os.ReadDir(dir)
	var offs []int64
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".snapshot") {
			continue
		}
		o, err := strconv.ParseInt(strings.TrimSuffix(name, ".snapshot"), 10, 64)
		if err == nil {
			offs = append(offs, o)
		}
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] > offs[j] })
	return offs
}

// loadNewestSnapshot returns the newest valid snapshot at or below maxOffset, or an empty state
// and offset -1.
func loadNewestSnapshot(dir string, maxOffset int64) (*producerState, int64) {
	for _, o := range listSnapshots(dir) {
		if o > maxOffset {
			continue // describes offsets the log no longer has (cut back after a failure)
		}
		buf, err := os.ReadFile(filepath.Join(dir, segmentName(o, ".snapshot")))
		if err != nil {
			continue
		}
		ps, off, err := decodeProducerSnapshot(buf)
		if err != nil || off != o {
			continue
		}
		return ps, o
	}
	return newProducerState(), -1
}

// pruneSnapshots keeps the newest `keep` snapshots and removes the rest, plus any above maxOffset.
func pruneSnapshots(dir string, maxOffset int64, keep int) {
	kept := 0
	for _, o := range listSnapshots(dir) {
		if o <= maxOffset && kept < keep {
			kept++
			continue
		}
		_ = os.Remove(filepath.Join(dir, segmentName(o, ".snapshot")))
	}
}
