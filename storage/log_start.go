package storage

// The log start offset and DeleteRecords (key 21).
//
// Without DeleteRecords the log start is the base offset of the first segment: retention only
// ever removes whole segments. DeleteRecords moves it to any offset up to the HWM, usually into
// the middle of a segment, so it must be recorded: Apache checkpoints it in the log directory
// (log-start-offset-checkpoint, one file per log dir); kaas writes one small file per partition,
// next to the segments, through WriteFileAtomic:
//
//	magic "KLSO" u32 | version u16 (0) | log start i64 | crc32c u32 over everything before it
//
// A missing file means "the first segment's base"; a torn or invalid one is ignored with a
// warning (it can only be older than the segments or equal to a value that was never
// acknowledged: the reply waits for the rename and the directory fsync). Recovery takes
// max(first segment base, checkpoint), capped at the log end.
//
//	DeleteRecords(offset)
//	  │ under mu: offset -1 → HWM; offset > HWM → OFFSET_OUT_OF_RANGE
//	  │ offset > logStart: logStart := offset (reads below it fail from now on),
//	  │                    aborted index trimmed below it
//	  ▼
//	goroutine (never the caller's): startMu held → checkpoint written + fsync'd
//	  │ closed segments wholly below the new start are deleted (as retention deletes them)
//	  ▼
//	done(low watermark, code)
//
// Producer state is not dropped when the start moves: Apache keeps producers until
// producer.id.expiration.ms removes them, and their sequence numbers stay valid for
// deduplication. What the new start does affect is transactional reads: the aborted index loses
// the entries whose marker is below it, and the LSO is never reported below the log start (an
// open transaction that began below it keeps pinning the LSO at max(first, log start), see
// txnIndex.lso), exactly as Apache's firstUnstableOffset after a log start increment.
//
// Lock order: startMu → Partition.mu (→ the locks after it in partition.go); segMu is taken with
// neither mu nor startMu's file write in progress under mu.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
)

// logStartFile is the per-partition checkpoint of a log start moved by DeleteRecords.
const logStartFile = "log-start-offset-checkpoint"

var (
	logStartMagic = [4]byte{'K', 'L', 'S', 'O'}

	mDeleteRecords       = metrics.NewCounter(`kaas_storage_delete_records_total`)
	mDeleteRecordsErrors = metrics.NewCounter(`kaas_storage_delete_records_errors_total`)
	mLogStartBadFile     = metrics.NewCounter(`kaas_storage_log_start_checkpoint_invalid_total`)
)

func encodeLogStart(off int64) []byte {
	buf := make([]byte, 0, 18)
	buf = append(buf, logStartMagic[:]...)
	buf = binary.BigEndian.AppendUint16(buf, 0)
	buf = binary.BigEndian.AppendUint64(buf, uint64(off))
	return binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf, crcTable))
}

func decodeLogStart(buf []byte) (int64, error) {
	if len(buf) != 18 || [4]byte(buf[:4]) != logStartMagic {
		return 0, errors.New("bad length or magic")
	}
	if binary.BigEndian.Uint16(buf[4:]) != 0 {
		return 0, errors.New("unknown version")
	}
	if crc32.Checksum(buf[:14], crcTable) != binary.BigEndian.Uint32(buf[14:]) {
		return 0, errors.New("bad crc")
	}
	off := int64(binary.BigEndian.Uint64(buf[6:]))
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	return off, nil
}

// loadLogStart returns the checkpointed log start, or -1 if there is none (or it is invalid).
func (p *Partition) loadLogStart() int64 {
	buf, err := os.ReadFile(filepath.Join(p.dir, logStartFile))
	if err != nil {
		if !os.IsNotExist(err) {
			p.log.Warn("cannot read log start checkpoint", zap.Error(err))
		}
		return -1
	}
	off, err := decodeLogStart(buf)
	if err != nil {
		mLogStartBadFile.Inc()
		p.log.Warn("ignoring invalid log start checkpoint", zap.Error(err))
		return -1
	}
	return off
}

// DeleteRecords moves the log start offset to offset (-1: the HWM), as Apache's
// UnifiedLog.maybeIncrementLogStartOffset does for a DeleteRecords request. done is called once,
// on another goroutine, after the new start is durable: with the low watermark (the log start
// now) and CodeNone, or with an error code: OFFSET_OUT_OF_RANGE for an offset above the HWM or
// below -1, NOT_LEADER_OR_FOLLOWER for a released partition, KAFKA_STORAGE_ERROR if the
// checkpoint cannot be written. An offset at or below the current start changes nothing and
// answers the current start (still after the checkpoint is known durable).
func (p *Partition) DeleteRecords(offset int64, done func(lowWatermark int64, code int16)) {
	mDeleteRecords.Inc()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		code := codec.CodeKafkaStorageError
		if p.released.Load() {
			code = codec.CodeNotLeaderForPartition
		}
		go done(-1, code)
		return
	}
	hwm := p.hwm.Load()
	if offset == -1 {
		offset = hwm
	}
	if offset < 0 || offset > hwm {
		p.mu.Unlock()
		go done(-1, codec.CodeOffsetOutOfRange)
		return
	}
	if offset > p.logStart.Load() {
		p.logStart.Store(offset)
		p.txn.trimBelow(offset)
	}
	p.fileOps.Add(1)
	p.mu.Unlock()
	go func() {
		ls, err := p.checkpointLogStart()
		if err != nil {
			p.fileOps.Done()
			mDeleteRecordsErrors.Inc()
			p.log.Error("cannot checkpoint log start offset", zap.Error(err))
			done(-1, codec.CodeKafkaStorageError)
			return
		}
		p.dropSegmentsBelowStart()
		p.fileOps.Done()
		done(ls, codec.CodeNone)
	}()
}

// checkpointLogStart makes the current log start durable (if a previous call has not already)
// and returns the start it covered. Calls are serialised by startMu; each writes the newest
// start, so concurrent DeleteRecords share writes and the file never goes backwards.
func (p *Partition) checkpointLogStart() (int64, error) {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	ls := p.logStart.Load()
	if ls <= p.startDurable {
		return ls, nil
	}
	if err := WriteFileAtomic(p.dir, logStartFile, encodeLogStart(ls)); err != nil {
		return -1, fmt.Errorf("cannot write log start checkpoint (%s, %d): %w", p.dir, ls, err)
	}
	p.startDurable = ls
	return ls, nil
}

// dropSegmentsBelowStart deletes the closed segments wholly below the log start (never the
// active one), as retention would on its next pass.
func (p *Partition) dropSegmentsBelowStart() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	segs := *p.segs.Load()
	ls := p.logStart.Load()
	drop := 0
	for drop < len(segs)-1 {
		if next, _, _ := segs[drop].stats(); next > ls {
			break
		}
		drop++
	}
	p.removeSegmentsLocked(segs, drop) // releases mu
	if drop > 0 {
		p.log.Info("DeleteRecords removed segments", zap.Int("segments", drop), zap.Int64("logStartOffset", ls))
	}
}

// retentionRemoveHook lets tests act between the list update of removeSegmentsLocked and its
// file work. nil in production.
var retentionRemoveHook func(p *Partition)

// removeSegmentsLocked drops segs[:drop] from the list (under mu, which it releases), then closes
// and deletes their files. The log start becomes the first kept segment's base unless it is
// already past it (DeleteRecords).
func (p *Partition) removeSegmentsLocked(segs []*segment, drop int) {
	if drop == 0 {
		p.mu.Unlock()
		return
	}
	// Release and the topic deletions wait for the writes and deletions below (fileOps): in
	// cluster mode none of them may land once the successor lists the directory.
	p.fileOps.Add(1)
	defer p.fileOps.Done()
	keep := append([]*segment(nil), segs[drop:]...)
	p.segs.Store(&keep)
	if keep[0].base > p.logStart.Load() {
		p.logStart.Store(keep[0].base)
	}
	p.txn.trimBelow(p.logStart.Load())
	p.mu.Unlock()
	if retentionRemoveHook != nil {
		retentionRemoveHook(p)
	}

	if p.nameEpoch >= 0 && slices.ContainsFunc(segs[:drop], func(s *segment) bool { return s.stem != "" }) {
		// Cluster mode: a loader takes a clean manifest whose files are missing only if they are
		// below the durable log start (cleaner_cluster.go), so that goes first.
		if _, err := p.checkpointLogStart(); err != nil {
			p.log.Warn("cannot checkpoint the log start; the removed cleaned segments' files stay", zap.Error(err))
			p.segMu.Lock()
			for _, s := range segs[:drop] {
				s.deleted = true
				_ = s.f.Close()
			}
			p.segMu.Unlock()
			return
		}
	}
	p.segMu.Lock()
	for _, s := range segs[:drop] {
		s.deleted = true
		_ = s.f.Close()
	}
	p.segMu.Unlock()
	if p.swapPending.Load() {
		// A failed cleaner swap (cleaner.go): these names may hold a group the next open
		// installs, with offsets beyond the removed segments. The files stay; the log start
		// is checkpointed so that the reopen does not move it back over what they hold.
		if _, err := p.checkpointLogStart(); err != nil {
			p.log.Warn("cannot checkpoint the log start", zap.Error(err))
		}
		p.log.Warn("a cleaner swap is pending until the next open; the removed segments' files stay", zap.Int("segments", drop))
		return
	}
	for _, s := range segs[:drop] {
		exts := []string{".log", ".index", ".timeindex", ".txnindex"}
		if s.epoch >= 0 {
			exts = append(exts, ".ckpt") // cluster mode (recovery_ckpt.go)
		}
		for _, ext := range exts {
			if err := os.Remove(s.path(ext)); err != nil && !os.IsNotExist(err) {
				p.log.Warn("cannot delete segment file", zap.String("file", s.path(ext)), zap.Error(err))
			}
		}
	}
	_ = SyncDir(p.dir)
}
