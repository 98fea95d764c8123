package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"go.uber.org/zap"
)

// Recovery checkpoints (cluster mode only; design §2.4 (b)).
//
// After a crash the successor must scan the dead holder's open segment to find where its valid
// batches end, and with segment.bytes = 1 GiB that could be a gigabyte read over NFS during a
// failover. So in cluster mode, each time at least recoveryCheckpointBytes more of the active
// segment are fsync'd, the partition writes <base>-<E>.ckpt: a fsync'd position in the segment
// (a batch boundary), the offset there, and the in-memory indexes up to it. The taker loads it
// and scans only from that position (segment.scanTo). Ordering: the state is captured before
// the fsync that covers it and written only after that fsync succeeded, so the checkpoint never
// names bytes that are not durable. It is the writer epoch's own file, like its segment; a roll
// (which writes the real indexes) removes it.
const (
	recoveryCheckpointBytes = 16 << 20
	recoveryCkptMagic       = "KRC1"
	recoveryCkptHeader      = 4 + 6*8 + 2*4
)

type recoveryCkpt struct {
	pos, next, maxTs, maxTsOff, rollTs, bytesSinceIndex int64
	index                                               []indexEntry
	tindex                                              []timeEntry
}

var errBadRecoveryCkpt = errors.New("bad recovery checkpoint")

func (c *recoveryCkpt) encode() []byte {
	buf := make([]byte, 0, recoveryCkptHeader+len(c.index)*indexEntrySize+len(c.tindex)*timeIndexEntrySize+4)
	buf = append(buf, recoveryCkptMagic...)
	for _, v := range []int64{c.pos, c.next, c.maxTs, c.maxTsOff, c.rollTs, c.bytesSinceIndex} {
		buf = binary.BigEndian.AppendUint64(buf, uint64(v))
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(c.index)))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(c.tindex)))
	for _, e := range c.index {
		buf = binary.BigEndian.AppendUint32(buf, uint32(e.rel))
		buf = binary.BigEndian.AppendUint32(buf, uint32(e.pos))
	}
	for _, e := range c.tindex {
		buf = binary.BigEndian.AppendUint64(buf, uint64(e.ts))
		buf = binary.BigEndian.AppendUint32(buf, uint32(e.rel))
	}
	return binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf, crcTable))
}

// decodeRecoveryCkpt parses and checks a checkpoint of the segment at base.
func decodeRecoveryCkpt(buf []byte, base int64) (*recoveryCkpt, error) {
	if len(buf) < recoveryCkptHeader+4 || string(buf[:4]) != recoveryCkptMagic ||
		crc32.Checksum(buf[:len(buf)-4], crcTable) != binary.BigEndian.Uint32(buf[len(buf)-4:]) {
		return nil, errBadRecoveryCkpt
	}
	c := &recoveryCkpt{}
	p := buf[4:]
	for _, v := range []*int64{&c.pos, &c.next, &c.maxTs, &c.maxTsOff, &c.rollTs, &c.bytesSinceIndex} {
		*v = int64(binary.BigEndian.Uint64(p))
		p = p[8:]
	}
	ni, nt := int(binary.BigEndian.Uint32(p)), int(binary.BigEndian.Uint32(p[4:]))
	p = p[8 : len(p)-4]
	if len(p) != ni*indexEntrySize+nt*timeIndexEntrySize || ni == 0 || c.pos <= 0 || c.next <= base {
		return nil, errBadRecoveryCkpt
	}
	maxRel := c.next - 1 - base
	for i := 0; i < ni; i++ {
		e := indexEntry{rel: int32(binary.BigEndian.Uint32(p)), pos: int32(binary.BigEndian.Uint32(p[4:]))}
		p = p[8:]
		if n := len(c.index); e.rel < 0 || int64(e.rel) > maxRel || int64(e.pos) >= c.pos ||
			(n == 0 && (e.rel != 0 || e.pos != 0)) || (n > 0 && (e.rel <= c.index[n-1].rel || e.pos <= c.index[n-1].pos)) {
			return nil, errBadRecoveryCkpt
		}
		c.index = append(c.index, e)
	}
	for i := 0; i < nt; i++ {
		e := timeEntry{ts: int64(binary.BigEndian.Uint64(p)), rel: int32(binary.BigEndian.Uint32(p[8:]))}
		p = p[12:]
		if e.rel < 0 || int64(e.rel) > maxRel || (len(c.tindex) > 0 && e.ts <= c.tindex[len(c.tindex)-1].ts) {
			return nil, errBadRecoveryCkpt
		}
		c.tindex = append(c.tindex, e)
	}
	return c, nil
}

// captureRecoveryLocked (under p.mu, before an fsync of seg) returns seg's state if a recovery
// checkpoint is due, else nil. Single-broker mode never writes one.
func (p *Partition) captureRecoveryLocked(seg *segment) *recoveryCkpt {
	every := p.topic.store.cfg.recoveryCheckpointBytes
	if every <= 0 {
		every = recoveryCheckpointBytes
	}
	size := seg.size.Load()
	if p.nameEpoch < 0 || seg.foreign || size == 0 || size-seg.ckptPos.Load() < every {
		return nil
	}
	seg.mu.Lock()
	defer seg.mu.Unlock()
	return &recoveryCkpt{pos: size, next: seg.next, maxTs: seg.maxTs, maxTsOff: seg.maxTsOff, rollTs: seg.rollTs,
		bytesSinceIndex: seg.bytesSinceIndex,
		index:           append([]indexEntry(nil), seg.index...), tindex: append([]timeEntry(nil), seg.tindex...)}
}

// writeRecoveryCheckpoint writes ck once the fsync covering ck.pos succeeded.
func (p *Partition) writeRecoveryCheckpoint(seg *segment, ck *recoveryCkpt) {
	if ck == nil {
		return
	}
	if err := WriteFileAtomic(p.dir, seg.name(".ckpt"), ck.encode()); err != nil {
		p.log.Warn("cannot write recovery checkpoint", zap.Int64("segment", seg.base), zap.Error(err))
		return
	}
	seg.ckptPos.Store(ck.pos)
	recoveryCheckpointsTotal.Inc()
}

// prevCkptName and prevTxnName are the files in which the taker at epoch E keeps what it
// learnt by scanning the crashed previous epoch's open segment (which has no indexes, and which
// E may not write to): its indexes up to the recorded end, as a recovery checkpoint, and its
// aborted transactions. A later taker then opens that segment without a scan.
func prevCkptName(e int32) string { return fmt.Sprintf("epoch-%d.prev.ckpt", e) }
func prevTxnName(e int32) string  { return fmt.Sprintf("epoch-%d.prev.txnindex", e) }

// writePrevCheckpoint (TakeOver at epoch, after the epoch file) writes seg's in-memory indexes
// and aborted transactions below next. Failure only costs the next taker a scan.
func (p *Partition) writePrevCheckpoint(seg *segment, epoch int32, next int64) {
	seg.mu.Lock()
	ck := &recoveryCkpt{pos: seg.size.Load(), next: seg.next, maxTs: seg.maxTs, maxTsOff: seg.maxTsOff, rollTs: seg.rollTs,
		bytesSinceIndex: seg.bytesSinceIndex, index: append([]indexEntry(nil), seg.index...), tindex: append([]timeEntry(nil), seg.tindex...)}
	seg.mu.Unlock()
	err := WriteFileAtomic(p.dir, prevTxnName(epoch), encodeTxnIndex(p.txn.abortedRange(seg.base, next)))
	if err == nil {
		err = WriteFileAtomic(p.dir, prevCkptName(epoch), ck.encode())
	}
	if err != nil {
		p.log.Warn("cannot write the previous epoch's segment indexes", zap.Int64("segment", seg.base), zap.Error(err))
	}
}

// loadPrevCheckpoint installs the indexes that the taker at epoch by wrote for seg (see
// prevCkptName) if they describe exactly [0, size) and offsets up to next, and returns the
// segment's aborted transactions.
func (s *segment) loadPrevCheckpoint(dir string, by int32, size, next int64) ([]AbortedTxn, bool) {
	tbuf, err := os.ReadFile(filepath.Join(dir, prevTxnName(by)))
	if err != nil {
		return nil, false
	}
	ents, err := decodeTxnIndex(tbuf, s.base, next)
	if err != nil {
		return nil, false
	}
	if s.loadRecoveryCheckpointFile(filepath.Join(dir, prevCkptName(by)), size) != size {
		s.resetIndexes()
		return nil, false
	}
	s.mu.Lock()
	ok := s.next == next
	s.mu.Unlock()
	if !ok {
		s.resetIndexes()
		return nil, false
	}
	return ents, true
}

// loadRecoveryCheckpoint installs seg's recovery checkpoint if it is valid and at or below
// limit, and returns the position to scan from (0 without one).
func (s *segment) loadRecoveryCheckpoint(limit int64) int64 {
	return s.loadRecoveryCheckpointFile(s.path(".ckpt"), limit)
}

func (s *segment) loadRecoveryCheckpointFile(path string, limit int64) int64 {
	buf, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	c, err := decodeRecoveryCkpt(buf, s.base)
	if err != nil || c.pos > limit || !framesToEnd(s.f, int64(c.index[len(c.index)-1].pos), c.pos) {
		return 0
	}
	s.mu.Lock()
	s.index, s.tindex = c.index, c.tindex
	s.next, s.maxTs, s.maxTsOff, s.rollTs, s.bytesSinceIndex = c.next, c.maxTs, c.maxTsOff, c.rollTs, c.bytesSinceIndex
	s.mu.Unlock()
	s.size.Store(c.pos)
	s.filled.Store(c.pos)
	return c.pos
}
