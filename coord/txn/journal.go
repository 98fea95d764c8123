package txn

// Write-ahead journal: the durability path of every worker batch. The format and the recovery
// rules are documented in README.md ("Journal"); this file holds the encoding, the scan that
// classifies a generation file on load, and the active generation a worker appends to.
//
// Why: a batch used to rewrite every slot file it touched (tmp write + fsync per slot, renames,
// a directory fsync), so the cost of a batch grew with the number of slots in it and each write
// created and renamed files (inode and directory metadata through the file system journal). Now a
// batch is one write(2) of its records and one fdatasync(2) into blocks that were zeroed and
// fsync'd ahead of time, whatever the number of slots; the slot files become checkpoints written
// off the critical path (checkpoint.go).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/kaas-go/kaas/storage/framelog"
	"go.uber.org/zap"
)

const (
	journalMagic      = "KTXJ"
	journalVersion    = 1
	journalHeaderSize = 32
	journalFrameHdr   = 8 // len u32 | crc32c(payload) u32
	// journalMaxRecord bounds one record (an entry with a huge partition list): the reader takes
	// larger lengths for damage, so the writer refuses to produce them (ErrRecordTooLarge).
	journalMaxRecord = 16 << 20
	// journalMinBytes is the smallest pre-zeroed generation; generations grow (up to twice the
	// checkpoint size) with the bytes the previous one took, so an idle coordinator costs little
	// disk and a busy one rotates rarely.
	journalMinBytes = 256 << 10

	recPut    = 'P'
	recDelete = 'D'
	recLast   = 1 << 0 // flags: last record of its batch
)

// journalFormat is the record frame (storage/framelog): len u32 | crc32c(payload) u32 | payload,
// no magic, in a pre-zeroed file (a zero length is the end of the journal). The record type byte
// is a cheap filter for the damage scan. MaxLen is what both the reader and the writer
// enforce; tests lower it.
var journalFormat = framelog.Format{
	HeaderLen: journalFrameHdr, LenAt: 0, CRCAt: 4,
	MinLen: 2, MaxLen: journalMaxRecord,
	Plausible: func(fr []byte) bool { t := fr[journalFrameHdr]; return t == recPut || t == recDelete },
	Prezeroed: true,
}

// ErrRecordTooLarge: the change would make a transaction's journal record larger than the
// journal reader accepts (journalMaxRecord). The op is refused before anything changes (answer
// INVALID_REQUEST, 42): acknowledging it would lose the transaction's state, or keep the broker
// from starting, at the next replay.
var ErrRecordTooLarge = errors.New("transaction state record would exceed the journal's record limit")

// journalRecordsRefused counts ops refused by ErrRecordTooLarge.
var journalRecordsRefused = metrics.NewCounter("kaas_txn_journal_records_too_large_total")

// journalID names one generation file: the broker that wrote it, its incarnation (cluster mode
// only; "" for a single broker), the worker, the generation. Generation numbers come from one
// counter per coordinator, so they increase in time across workers, and a new run starts above
// every number found on disk (single mode; in cluster mode every run is a new incarnation and
// starts its own names at 1).
type journalID struct {
	broker int32
	inc    string
	worker int
	gen    uint64
}

// journalName is journal-b<broker>-w<worker>-<gen, 20 digits>.log (single broker) or
// journal-b<broker>-i<inc>-w<worker>-<gen>.log (cluster mode). The incarnation in the name is what
// gives every file exactly one writer on a shared volume: a restarted broker (same id, new
// incarnation) and a zombie of its previous run (past its lease, still writing) never share a file.
func journalName(id journalID) string {
	if id.inc != "" {
		return fmt.Sprintf("journal-b%d-i%s-w%d-%020d.log", id.broker, id.inc, id.worker, id.gen)
	}
	return fmt.Sprintf("journal-b%d-w%d-%020d.log", id.broker, id.worker, id.gen)
}

// validIncarnation: an incarnation names files, so it is non-empty and made of [0-9A-Za-z] only
// (no separator of the journal name can appear in it).
func validIncarnation(inc string) bool {
	if inc == "" || len(inc) > 64 {
		return false
	}
	for _, r := range inc {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// parseJournalName is the inverse of journalName, for both forms (false for any other file name).
func parseJournalName(name string) (journalID, bool) {
	rest, ok := strings.CutPrefix(name, "journal-b")
	if !ok {
		return journalID{}, false
	}
	if rest, ok = strings.CutSuffix(rest, ".log"); !ok {
		return journalID{}, false
	}
	parts := strings.Split(rest, "-")
	var inc string
	if len(parts) == 4 && strings.HasPrefix(parts[1], "i") {
		inc = parts[1][1:]
		if !validIncarnation(inc) {
			return journalID{}, false
		}
		parts = []string{parts[0], parts[2], parts[3]}
	}
	if len(parts) != 3 || !strings.HasPrefix(parts[1], "w") || len(parts[2]) != 20 {
		return journalID{}, false
	}
	b, err1 := strconv.ParseInt(parts[0], 10, 32)
	w, err2 := strconv.ParseUint(parts[1][1:], 10, 16)
	g, err3 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || b < 0 {
		return journalID{}, false
	}
	id := journalID{broker: int32(b), inc: inc, worker: int(w), gen: g}
	if journalName(id) != name {
		return journalID{}, false // non-canonical spelling (signs, leading zeros)
	}
	return id, true
}

// sameFile reports whether a header (which carries no incarnation) matches the file's name.
func (id journalID) sameFile(hdr journalID) bool {
	return id.broker == hdr.broker && id.worker == hdr.worker && id.gen == hdr.gen
}

// appendJournalHeader: magic "KTXJ" | version u8 | 3 zero bytes | broker i32 | worker u32 |
// gen u64 | 4 zero bytes | crc32c(bytes 0..27) u32, big-endian like the Kafka wire format.
func appendJournalHeader(b []byte, id journalID) []byte {
	var h [journalHeaderSize]byte
	copy(h[:], journalMagic)
	h[4] = journalVersion
	binary.BigEndian.PutUint32(h[8:], uint32(id.broker))
	binary.BigEndian.PutUint32(h[12:], uint32(id.worker))
	binary.BigEndian.PutUint64(h[16:], id.gen)
	binary.BigEndian.PutUint32(h[28:], framelog.Checksum(h[:28]))
	return append(b, h[:]...)
}

func parseJournalHeader(b []byte) (journalID, error) {
	if len(b) < journalHeaderSize {
		return journalID{}, errors.New("file shorter than the journal header")
	}
	h := b[:journalHeaderSize]
	if string(h[:4]) != journalMagic {
		return journalID{}, errors.New("not a transaction journal (bad magic)")
	}
	if framelog.Checksum(h[:28]) != binary.BigEndian.Uint32(h[28:]) {
		return journalID{}, errors.New("journal header checksum mismatch")
	}
	if h[4] != journalVersion {
		return journalID{}, fmt.Errorf("unsupported journal version %d (want %d)", h[4], journalVersion)
	}
	return journalID{broker: int32(binary.BigEndian.Uint32(h[8:])), worker: int(binary.BigEndian.Uint32(h[12:])),
		gen: binary.BigEndian.Uint64(h[16:])}, nil
}

// journalRec is one record: the full persisted state of one transactional.id after a batch
// (entry), or its removal (entry nil).
type journalRec struct {
	batch uint64 // batch number within the generation, from 1
	last  bool   // last record of its batch: the batch is complete (atomic on replay)
	slot  int
	seq   uint64 // per slot, +1 per record, continuing across generations and restarts
	epoch int32  // the slot's coordinator epoch when written
	tid   string
	entry *Entry
}

// appendRecord appends one frame: len u32 | crc32c(payload) u32 | payload, where payload is
//
//	type u8 ('P' put, 'D' delete) | flags u8 (bit 0: last of batch) | batch uvarint |
//	slot uvarint | seq uvarint | epoch varint | tid str | entry (put only)
//
// and str is uvarint length + bytes (see README.md for the entry layout).
func appendRecord(b []byte, r *journalRec) []byte {
	b, start := journalFormat.Begin(b)
	typ := byte(recPut)
	if r.entry == nil {
		typ = recDelete
	}
	var flags byte
	if r.last {
		flags |= recLast
	}
	b = append(b, typ, flags)
	b = binary.AppendUvarint(b, r.batch)
	b = binary.AppendUvarint(b, uint64(r.slot))
	b = binary.AppendUvarint(b, r.seq)
	b = binary.AppendVarint(b, int64(r.epoch))
	b = framelog.AppendStr(b, r.tid)
	if r.entry != nil {
		b = appendEntry(b, r.entry)
	}
	return journalFormat.End(b, start)
}

// stateCode pins the on-disk number of every persistable state, so the in-memory enum can be
// reordered without changing what a journal means (the slot files store names for the same
// reason).
func stateCode(s State) byte {
	switch s {
	case Empty:
		return 0
	case Ongoing:
		return 1
	case PrepareCommit:
		return 2
	case PrepareAbort:
		return 3
	case CompleteCommit:
		return 4
	case CompleteAbort:
		return 5
	case Dead:
		return 7
	}
	panic("BUG: journaling non-persistable transaction state " + s.String())
}

func stateFromCode(c byte) (State, bool) {
	switch c {
	case 0:
		return Empty, true
	case 1:
		return Ongoing, true
	case 2:
		return PrepareCommit, true
	case 3:
		return PrepareAbort, true
	case 4:
		return CompleteCommit, true
	case 5:
		return CompleteAbort, true
	case 7:
		return Dead, true
	}
	return 0, false
}

// appendEntry: producerId, producerEpoch, lastProducerId, lastProducerEpoch, nextProducerId
// (varints) | state u8 | timeoutMs, txnStartMs, lastUpdateMs (varints) | txnVersion u8 |
// coordinatorEpoch varint | topics uvarint × (topic str, n uvarint, n × partition varint) |
// groups uvarint × group str. Topics are written sorted, partitions and groups are kept sorted.
func appendEntry(b []byte, e *Entry) []byte {
	b = binary.AppendVarint(b, e.ProducerID)
	b = binary.AppendVarint(b, int64(e.ProducerEpoch))
	b = binary.AppendVarint(b, e.LastProducerID)
	b = binary.AppendVarint(b, int64(e.LastProducerEpoch))
	b = binary.AppendVarint(b, e.NextProducerID)
	b = append(b, stateCode(e.State))
	b = binary.AppendVarint(b, int64(e.TimeoutMs))
	b = binary.AppendVarint(b, e.TxnStartMs)
	b = binary.AppendVarint(b, e.LastUpdateMs)
	b = append(b, byte(e.TxnVersion))
	b = binary.AppendVarint(b, int64(e.CoordinatorEpoch))
	b = binary.AppendUvarint(b, uint64(len(e.Partitions)))
	appendTopic := func(t string, ps []int32) {
		b = framelog.AppendStr(b, t)
		b = binary.AppendUvarint(b, uint64(len(ps)))
		for _, p := range ps {
			b = binary.AppendVarint(b, int64(p))
		}
	}
	if len(e.Partitions) == 1 {
		for t, ps := range e.Partitions {
			appendTopic(t, ps)
		}
	} else if len(e.Partitions) > 1 {
		for _, t := range slices.Sorted(maps.Keys(e.Partitions)) {
			appendTopic(t, e.Partitions[t])
		}
	}
	b = binary.AppendUvarint(b, uint64(len(e.Groups)))
	for _, g := range e.Groups {
		b = framelog.AppendStr(b, g)
	}
	return b
}

const (
	minI16, maxI16 = -1 << 15, 1<<15 - 1
	minI32, maxI32 = -1 << 31, 1<<31 - 1
	minI64, maxI64 = -1 << 63, 1<<63 - 1
)

// decodeRecord parses and validates one payload: the same checks a slot file's entries pass
// (checkEntry), plus sorted, duplicate-free partition and group lists and no trailing bytes.
func decodeRecord(p []byte) (journalRec, error) {
	r := framelog.Reader{B: p}
	var rec journalRec
	typ := r.Byte("record type")
	flags := r.Byte("flags")
	if r.Err == nil && (typ != recPut && typ != recDelete) {
		return rec, fmt.Errorf("unknown record type %#x", typ)
	}
	if flags&^recLast != 0 {
		return rec, fmt.Errorf("unknown record flags %#x", flags)
	}
	rec.last = flags&recLast != 0
	rec.batch = r.Uvarint("batch")
	slot := r.Uvarint("slot")
	rec.seq = r.Uvarint("seq")
	rec.epoch = int32(r.VarintIn("coordinator epoch", minI32, maxI32))
	rec.tid = r.Str("transactional id")
	if r.Err != nil {
		return rec, r.Err
	}
	if slot >= NumSlots || rec.batch == 0 || rec.seq == 0 {
		return rec, fmt.Errorf("bad record header (slot %d batch %d seq %d)", slot, rec.batch, rec.seq)
	}
	rec.slot = int(slot)
	if typ == recPut {
		e := &Entry{TransactionalID: rec.tid}
		e.ProducerID = r.VarintIn("producerId", minI64, maxI64)
		e.ProducerEpoch = int16(r.VarintIn("producerEpoch", minI16, maxI16))
		e.LastProducerID = r.VarintIn("lastProducerId", minI64, maxI64)
		e.LastProducerEpoch = int16(r.VarintIn("lastProducerEpoch", minI16, maxI16))
		e.NextProducerID = r.VarintIn("nextProducerId", minI64, maxI64)
		st, ok := stateFromCode(r.Byte("state"))
		if !ok && r.Err == nil {
			return rec, errors.New("unknown state code")
		}
		e.State = st
		e.TimeoutMs = int32(r.VarintIn("timeoutMs", minI32, maxI32))
		e.TxnStartMs = r.VarintIn("txnStartMs", minI64, maxI64)
		e.LastUpdateMs = r.VarintIn("lastUpdateMs", minI64, maxI64)
		e.TxnVersion = int8(r.Byte("txnVersion"))
		e.CoordinatorEpoch = int32(r.VarintIn("coordinatorEpoch", minI32, maxI32))
		if n := r.Count("topic count"); n > 0 {
			e.Partitions = make(map[string][]int32, n)
			prev := ""
			for i := 0; i < n && r.Err == nil; i++ {
				t := r.Str("topic")
				if i > 0 && t <= prev {
					r.Fail("topics not sorted")
				}
				prev = t
				m := r.Count("partition count")
				ps := make([]int32, 0, m)
				for j := 0; j < m && r.Err == nil; j++ {
					p := int32(r.VarintIn("partition", minI32, maxI32))
					if j > 0 && p <= ps[j-1] {
						r.Fail("partitions not sorted")
					}
					ps = append(ps, p)
				}
				e.Partitions[t] = ps
			}
		}
		if n := r.Count("group count"); n > 0 {
			e.Groups = make([]string, 0, n)
			for i := 0; i < n && r.Err == nil; i++ {
				g := r.Str("group")
				if i > 0 && g <= e.Groups[i-1] {
					r.Fail("groups not sorted")
				}
				e.Groups = append(e.Groups, g)
			}
		}
		if r.Err != nil {
			return rec, r.Err
		}
		if err := checkEntry(rec.slot, rec.tid, e); err != nil {
			return rec, err
		}
		rec.entry = e
	} else if SlotFor(rec.tid) != rec.slot {
		return rec, fmt.Errorf("deletion of %q in slot %d, which belongs to slot %d", rec.tid, rec.slot, SlotFor(rec.tid))
	}
	if len(r.B) != 0 {
		return rec, fmt.Errorf("%d trailing bytes", len(r.B))
	}
	return rec, nil
}

// readFrame parses one frame at the start of b: ok only for a plausible length, a known record
// type (a cheap filter for the damage scan) and a matching CRC.
func readFrame(b []byte) (payload []byte, ok bool) {
	payload, _, ok = journalFormat.Parse(b)
	return payload, ok
}

// findFrame returns the position of the first CRC-valid frame at or after from, or -1. Runs of
// zeros (the pre-zeroed region) are skipped without CRC work.
func findFrame(data []byte, from int) int { return journalFormat.Find(data, from) }

// genScan is what a generation file holds.
type genScan struct {
	recs []journalRec // records of complete batches, in file order
	// end is the offset just past the last complete batch (the header's end if none): the valid
	// length of the generation.
	end     int64
	hasData bool // anything but zeros past the header
	// torn: something past end must be discarded — an incomplete batch, a damaged record, or
	// stray records of the unfinished batch (a torn write of the last, unacknowledged batch).
	torn    bool
	tornAt  int64
	tornWhy string
	// acked: a valid record of a LATER batch follows the damage, i.e. the damage is inside data
	// that was acknowledged. Never a torn write.
	acked   bool
	ackedAt int64
}

// scanJournal classifies a generation file's bytes (header already checked) with the framelog
// scanner: a batch is the unit (its last record carries recLast), reading stops at the first zero
// length (the pre-zeroed region is the end of the journal), and only records of the unfinished
// batch (batch+1) may lie beyond a stop (its pages can reach the disk in any order before the
// fdatasync that never completed); any other valid record there is damage inside acknowledged
// data. A record whose CRC holds but that does not decode, or breaks the batch order, is an
// error: no crash produces it.
func scanJournal(data []byte) (genScan, error) {
	sc := genScan{end: journalHeaderSize}
	sc.hasData = framelog.IndexNonZero(data[journalHeaderSize:]) >= 0
	var open []journalRec
	var batch uint64 // last complete batch
	s := framelog.Scanner{
		Format: &journalFormat,
		Frame: func(pos int, payload []byte) (bool, error) {
			rec, err := decodeRecord(payload)
			if err != nil {
				return false, fmt.Errorf("invalid record at byte %d: %w", pos, err)
			}
			if rec.batch != batch+1 {
				return false, fmt.Errorf("record at byte %d is in batch %d, expected %d", pos, rec.batch, batch+1)
			}
			open = append(open, rec)
			if rec.last {
				sc.recs = append(sc.recs, open...)
				open = open[:0]
				batch++
			}
			return rec.last, nil
		},
		Follow: func(_ int, payload []byte) framelog.Follow {
			if rec, err := decodeRecord(payload); err != nil || rec.batch != batch+1 {
				return framelog.Acked
			}
			return framelog.Stray
		},
	}
	res, err := s.Scan(data, journalHeaderSize)
	if err != nil {
		return sc, err
	}
	sc.end = res.End
	sc.torn, sc.tornAt, sc.tornWhy = res.Torn, res.TornAt, res.Why
	sc.acked, sc.ackedAt = res.Damaged, res.DamagedAt
	return sc, nil
}

// journal is a worker's active generation. Only the worker goroutine touches it.
type journal struct {
	id   journalID
	path string
	f    JournalFile
	// app appends batches at the end of the last durable batch: one write and one fdatasync
	// into the pre-zeroed region (fsync past it), and the repair after a failed write
	// (framelog.Appender: nothing is appended after a possibly partial batch).
	app   *framelog.Appender
	batch uint64 // last batch number written
}

// createJournal creates a generation: header + capacity zero bytes written under a .tmp name,
// fsync'd (size and blocks durable once, so appends need only fdatasync), renamed into place and
// the directory fsync'd, so a file with a generation's name always has a whole header and its
// zeros. The returned journal keeps the file open for appending.
func createJournal(fsys FileSystem, dir string, id journalID, capacity int64) (*journal, error) {
	path := filepath.Join(dir, journalName(id))
	tmp := path + ".tmp"
	f, err := fsys.CreateJournal(tmp)
	if err != nil {
		return nil, fmt.Errorf("cannot create transaction journal %s: %w", tmp, err)
	}
	end := int64(journalHeaderSize) + capacity
	err = func() error {
		if _, err := f.WriteAt(appendJournalHeader(nil, id), 0); err != nil {
			return err
		}
		if err := framelog.WriteZeros(f, journalHeaderSize, end); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		if err := fsys.Rename(tmp, path); err != nil {
			return err
		}
		return fsys.SyncDir(dir)
	}()
	if err != nil {
		_ = f.Close()
		_ = fsys.Remove(tmp)
		return nil, fmt.Errorf("cannot create transaction journal %s: %w", path, err)
	}
	app := framelog.NewAppender(f, &journalFormat, journalHeaderSize, end)
	app.Observe = observeJournalWrite
	return &journal{id: id, path: path, f: f, app: app}, nil
}

func observeJournalWrite(write, sync time.Duration, full bool) {
	journalWriteDuration.Update(write.Seconds())
	journalSyncDuration.Update(sync.Seconds())
	if full {
		journalFullSyncsTotal.Inc()
	}
}

// off is the end of the last durable batch.
func (j *journal) off() int64 { return j.app.Offset() }

// repair makes the generation end cleanly at off again after a failed write (a no-op otherwise).
func (j *journal) repair() error {
	if err := j.app.Repair(); err != nil {
		return fmt.Errorf("cannot repair transaction journal %s after a failed write: %w", j.path, err)
	}
	return nil
}

// recordTooLarge reports whether tid's journal record with entry e would exceed what the reader
// accepts. The bound is computed first (no allocation; a few bytes per topic and group, five
// per partition) and the record encoded only when the bound does not settle it.
func recordTooLarge(tid string, e *Entry) bool {
	if e == nil {
		return false
	}
	const fixed = 2 + 4*binary.MaxVarintLen64 + 5*binary.MaxVarintLen64 + 1 + 3*binary.MaxVarintLen64 + 1 +
		binary.MaxVarintLen64 + 2*binary.MaxVarintLen64 // header + entry scalars + list counts
	bound := fixed + binary.MaxVarintLen64 + len(tid)
	for t, ps := range e.Partitions {
		bound += 2*binary.MaxVarintLen64 + len(t) + binary.MaxVarintLen32*len(ps)
	}
	for _, g := range e.Groups {
		bound += binary.MaxVarintLen64 + len(g)
	}
	if bound <= journalFormat.MaxLen {
		return false
	}
	// batch and seq are written as 1 here: leave room for their largest varints (and the epoch's).
	n := len(appendRecord(nil, &journalRec{batch: 1, slot: SlotFor(tid), seq: 1, tid: tid, entry: e}))
	return n-journalFrameHdr+2*binary.MaxVarintLen64+binary.MaxVarintLen32 > journalFormat.MaxLen
}

// refuseTooLarge refuses an op whose resulting entry could not be journaled (recordTooLarge),
// before it changes anything: acknowledging a change that the replay cannot read would lose the
// transaction's state (or keep the broker from starting) at the next start.
func (w *worker) refuseTooLarge(tid string, next *Entry) bool {
	if !recordTooLarge(tid, next) {
		return false
	}
	journalRecordsRefused.Inc()
	w.c.log.Warn("refusing a transaction change: its journal record would exceed the record limit",
		zap.String("transactionalId", tid), zap.Int("topics", len(next.Partitions)), zap.Int("groups", len(next.Groups)),
		zap.Int("limitBytes", journalFormat.MaxLen))
	return true
}
