package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage/framelog"
	"go.uber.org/zap"
)

// Write-ahead log recovery; the rules are in the comment at the top of wal.go.

// walRecord is one parsed record.
type walRecord struct {
	round     uint64
	topicID   [16]byte
	partition int32
	base      int64
	payload   []byte
	size      int // padded length on disk
}

func (r *walRecord) isMarker() bool {
	return r.partition == walMarkerPartition && r.topicID == [16]byte{}
}

// parseWALRecord validates the record at data[pos:] for generation seq.
func parseWALRecord(data []byte, pos int, seq uint64) (walRecord, bool) {
	if pos < 0 || len(data)-pos < walHeaderSize || !walOfGen(data[pos:], seq) {
		return walRecord{}, false
	}
	payload, size, ok := walFormat.Parse(data[pos:])
	if !ok {
		return walRecord{}, false
	}
	return walRecordAt(data[pos:], payload, size), true
}

// walOfGen reports whether h starts with the magic and seq of a record of generation seq.
func walOfGen(h []byte, seq uint64) bool {
	return len(h) >= 16 && binary.BigEndian.Uint32(h) == walMagic && binary.BigEndian.Uint64(h[8:]) == seq
}

// walRecordAt decodes the header of the validated record at h[0:].
func walRecordAt(h, payload []byte, size int) walRecord {
	r := walRecord{
		round:     binary.BigEndian.Uint64(h[16:]),
		partition: int32(binary.BigEndian.Uint32(h[40:])),
		base:      int64(binary.BigEndian.Uint64(h[48:])),
		payload:   payload,
		size:      size,
	}
	copy(r.topicID[:], h[24:40])
	return r
}

// walGenFormat is walFormat for the records of generation seq. Bytes at the end of its records
// that are not a record of this generation (zeros, or a recycled file's earlier life, whose
// records carry another seq) end it cleanly; a record of this generation that does not
// validate is a torn tail.
func walGenFormat(seq uint64) *framelog.Format {
	f := walFormat
	f.Plausible = func(fr []byte) bool { return binary.BigEndian.Uint64(fr[8:]) == seq }
	f.Filler = func(rest []byte) bool { return !walOfGen(rest, seq) }
	return &f
}

// errWALCorrupt marks an unrecoverable WAL state: acknowledged data would be missing or wrong.
var errWALCorrupt = errors.New("write-ahead log is corrupt")

// listWAL returns the generation seqs in dir, sorted, and removes leftovers (spare, tmp files).
func listWAL(dir string) ([]uint64, error) { return listWALGens(dir, true) }

// listWALGens is listWAL; with tidy false nothing is removed (another broker's WAL, salvage).
func listWALGens(dir string, tidy bool) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".wal") {
			if tidy {
				_ = os.Remove(filepath.Join(dir, name)) // spare.wal.tmp: prepared, never written
			}
			continue
		}
		seq, err := strconv.ParseUint(strings.TrimSuffix(name, ".wal"), 10, 64)
		if err != nil || seq == 0 {
			continue
		}
		seqs = append(seqs, seq)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	return seqs, nil
}

// replayWAL replays every generation in dir into the store's partitions (Open, before any client
// can append), fsyncs what it appended and deletes the generations. It returns the next
// generation seq and round to use, so nothing written later can be confused with these records.
func (s *Store) replayWAL(dir string) (nextSeq, nextRound uint64, err error) {
	start := time.Now()
	var (
		replayed = map[*Partition]bool{}
		applied  int
		skipped  int
	)
	seqs, lastRound, err := scanWAL(dir, true, s.log, func(r *walRecord, seq uint64, pos int) error {
		did, err := s.replayRecord(r, seq, pos, replayed)
		if did {
			applied++
		} else if err == nil {
			skipped++
		}
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	if len(seqs) == 0 {
		return 1, 1, nil
	}
	for p := range replayed {
		if err := p.finishReplay(); err != nil {
			return 0, 0, err
		}
	}
	s.log.Info("write-ahead log replayed", zap.Int("generations", len(seqs)), zap.Int("appended", applied),
		zap.Int("alreadyPresent", skipped), zap.Int("partitions", len(replayed)), zap.Duration("took", time.Since(start)))
	// Everything is in fsync'd segments now (each partition's recovery fsync'd its active
	// segment, finishReplay the replayed ones): the run starts with an empty WAL.
	if err := removeWAL(dir); err != nil {
		return 0, 0, err
	}
	return seqs[len(seqs)-1] + 1, lastRound + 1, nil
}

// scanWAL reads every generation in dir in seq order, read-only, with the torn-tail rules of
// wal.go, and calls fn for each valid record that is not a control record. tidy removes leftover
// files (a spare) first; salvage of another broker's WAL passes false. It returns the seqs seen
// and the highest round.
func scanWAL(dir string, tidy bool, log *zap.Logger, fn func(r *walRecord, seq uint64, pos int) error) (seqs []uint64, lastRound uint64, err error) {
	seqs, err = listWALGens(dir, tidy)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot list write-ahead log (%s): %w", dir, err)
	}
	type damage struct {
		seq uint64
		pos int64
	}
	var pending *damage // a torn tail not yet known to be the newest data
	for _, seq := range seqs {
		path := filepath.Join(dir, walGenName(seq))
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, 0, fmt.Errorf("cannot read write-ahead log (%s): %w", path, err)
		}
		genRound, seen := lastRound, false
		var rounds []uint64 // of the valid records of this generation after its end
		sc := framelog.Scanner{
			Format: walGenFormat(seq),
			Frame: func(pos int, payload []byte) (bool, error) {
				r := walRecordAt(data[pos:], payload, walRecLen(len(payload)))
				if pending != nil {
					// Valid data after a torn tail of an earlier generation: acceptable only if the
					// flusher abandoned that tail after a failure and said so.
					if !r.isMarker() || len(r.payload) != 8 || r.base < 1 ||
						!(uint64(r.base) < pending.seq || (uint64(r.base) == pending.seq && int64(binary.BigEndian.Uint64(r.payload)) <= pending.pos)) {
						return false, fmt.Errorf("%w: generation %d is damaged at byte %d but generation %d holds valid records after it (refusing to start)",
							errWALCorrupt, pending.seq, pending.pos, seq)
					}
					pending = nil
				}
				seen = true
				genRound = r.round
				lastRound = max(lastRound, r.round)
				if !r.isMarker() {
					if err := fn(&r, seq, pos); err != nil {
						return false, err
					}
				}
				return true, nil
			},
			// Only the round being synced when the process died can be torn, and it is the last
			// one written: valid records of several rounds, or of a round that is not the one at
			// the cut or the next, were durable before that (corruption).
			Follow: func(pos int, payload []byte) framelog.Follow {
				round := binary.BigEndian.Uint64(data[pos+16:])
				if len(rounds) == 0 || rounds[len(rounds)-1] != round {
					rounds = append(rounds, round)
				}
				lastRound = max(lastRound, round)
				if len(rounds) > 1 || (seen && rounds[0] != genRound && rounds[0] != genRound+1) {
					return framelog.Acked
				}
				return framelog.Stray
			},
		}
		res, err := sc.Scan(data, 0)
		if err != nil {
			return nil, 0, err
		}
		if res.Damaged {
			return nil, 0, fmt.Errorf("%w: generation %d is damaged at byte %d and valid records of rounds %v follow (refusing to start)",
				errWALCorrupt, seq, res.Stop, rounds)
		}
		if res.Torn && pending == nil {
			pending = &damage{seq: seq, pos: res.Stop}
		}
	}
	if pending != nil {
		log.Warn("write-ahead log: torn tail of the newest generation, replay stopped there (those records were never acknowledged)",
			zap.String("dir", dir), zap.Uint64("generation", pending.seq), zap.Int64("byte", pending.pos))
	}
	return seqs, lastRound, nil
}

// replayRecord applies one record. It returns whether it appended.
func (s *Store) replayRecord(r *walRecord, seq uint64, pos int, replayed map[*Partition]bool) (bool, error) {
	t := s.byID[r.topicID]
	if t == nil {
		return false, nil // topic deleted (a topic re-created under the name has another ID)
	}
	p := t.Partition(r.partition)
	if p == nil {
		return false, nil
	}
	b := codec.Batch(append([]byte(nil), r.payload...))
	if len(b) < codec.BatchHeaderSize || int64(b.BatchLength())+codec.LogOverhead != int64(len(b)) ||
		b.Magic() != 2 || b.BaseOffset() != r.base || b.LastOffsetDelta() < 0 || !b.CRCValid() {
		return false, fmt.Errorf("%w: generation %d byte %d: record for %s-%d is not a valid batch (refusing to start)",
			errWALCorrupt, seq, pos, t.Name, r.partition)
	}
	p.mu.Lock()
	leo := p.leoLocal
	p.mu.Unlock()
	switch {
	case r.base < leo:
		return false, nil
	case r.base > leo:
		return false, fmt.Errorf("cannot replay write-ahead log (%s-%d): record at offset %d but the log ends at %d: acknowledged records are missing (refusing to start)",
			t.Name, r.partition, r.base, leo)
	}
	res := p.append(b, time.Now().UnixMilli(), kindReplay, 0, markerArgs{})
	if res.Code != codec.CodeNone || res.BaseOffset != r.base {
		return false, fmt.Errorf("cannot replay write-ahead log (%s-%d): append at offset %d failed with code %d",
			t.Name, r.partition, r.base, res.Code)
	}
	replayed[p] = true
	return true, nil
}

// finishReplay makes what replay appended durable in the segment and publishes it.
func (p *Partition) finishReplay() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	seg := p.active
	if err := seg.f.Sync(); err != nil {
		return fmt.Errorf("cannot fsync replayed segment (%s-%d@%d): %w", p.topic.Name, p.id, seg.base, err)
	}
	p.durablePos = seg.size.Load()
	_, p.flushedMaxTs, p.flushedMaxOff = seg.stats()
	if p.leoLocal > p.durableEnd {
		p.publishHWMLocked(p.leoLocal)
	}
	// A DeleteRecords checkpoint past what the segments held before replay (their tail was only
	// in the WAL) was capped by recoverLog; with the tail back it applies in full.
	if ls := min(p.startDurable, p.leoLocal); ls > p.logStart.Load() {
		p.logStart.Store(ls)
		p.txn.trimBelow(ls)
	}
	return nil
}
