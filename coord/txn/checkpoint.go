package txn

// Worker side of the journal: appending a batch, rotating generations, checkpoints.
//
//	 worker goroutine (critical path)              checkpointer goroutine (one per worker)
//	 ───────────────────────────────               ─────────────────────────────────────
//	 apply batch → records → ONE write +
//	 ONE fdatasync into the current gen
//	 ──► callbacks
//	 every CheckpointBytes / CheckpointInterval:
//	   rotate to the prepared next gen,
//	   snapshot the changed slots (map copies),
//	   hand {snapshots, retired gens,       ───►   encode + write slot files (tmp, fsync, rename,
//	         "prepare a next gen"}                 dir fsync); only if ALL are durable: delete
//	                                               the retired gens; create + zero + fsync the
//	                                        ◄───   next gen; report failures and the new gen
//
// One job is in flight per worker at a time, so each slot file still has exactly one writer. A
// failed checkpoint loses nothing: its slots are marked changed again and its generations stay
// until a later checkpoint covers them.

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"time"

	"go.uber.org/zap"
)

// slotSnap is a consistent copy of one slot for a checkpoint. Entries are immutable values (the
// transition functions return copies), so copying the map is enough.
type slotSnap struct {
	slot    int
	epoch   int32
	seq     uint64
	entries map[string]*Entry
}

type ckJob struct {
	snaps []slotSnap
	// del are retired generations: deleted once every snapshot of the job is durable (each of
	// their records is then in a slot file: the snapshot was taken after the last of them).
	del []string
	// prepare, when set, is the next generation to create.
	prepare *journalID
	cap     int64
}

type ckResult struct {
	failed []int    // slots whose file could not be written
	keep   []string // generations not deleted
	next   *journal // prepared generation, nil if none was asked for or creation failed
	tried  bool     // a generation was asked for
}

// pendingRec is one record of the batch being flushed.
type pendingRec struct {
	slot  int
	tid   string
	entry *Entry
	seq   uint64
	// prepare: the record starts a prepared transaction (startsPrepare); its seq becomes the
	// entry's PrepareSeq once durable.
	prepare bool
}

// appendBatch writes the batch's records to the current generation with one write and makes
// them durable with one fdatasync (fsync if the batch does not fit in the pre-zeroed region and
// no next generation is ready). Sequence numbers are assigned here; the caller commits them only
// on success.
func (w *worker) appendBatch(recs []pendingRec) error {
	j := w.cur
	if err := j.repair(); err != nil {
		return err
	}
	for i := range recs {
		r := &recs[i]
		if w.bseq[r.slot] == 0 {
			w.bseq[r.slot] = w.slots[r.slot].seq
		}
		w.bseq[r.slot]++
		r.seq = w.bseq[r.slot]
	}
	b, err := w.encodeBatch(recs, j.batch+1)
	if err != nil {
		return err
	}
	if !j.app.Fits(len(b)) && w.next != nil {
		w.rotate()
		j = w.cur
		if b, err = w.encodeBatch(recs, 1); err != nil {
			return err
		}
	}
	if err := j.app.Write(b); err != nil {
		journalErrorsTotal.Inc()
		return fmt.Errorf("cannot append to transaction journal %s: %w", j.path, err)
	}
	j.batch++
	w.sinceCk += int64(len(b))
	journalBatchRecords.Update(float64(len(recs)))
	journalBatchBytes.Update(float64(len(b)))
	journalBytesTotal.Add(len(b))
	return nil
}

// encodeBatch frames the batch's records. A record the journal reader would refuse fails the
// batch before anything is written. The ops refuse such entries up front (ErrRecordTooLarge, 42);
// this is the backstop that keeps an unreadable record off the disk whatever produced it, and as
// it fails the whole batch, its error stays the retriable COORDINATOR_NOT_AVAILABLE for the other
// ops in it.
func (w *worker) encodeBatch(recs []pendingRec, batch uint64) ([]byte, error) {
	b := w.jbuf[:0]
	for i := range recs {
		r := &recs[i]
		start := len(b)
		b = appendRecord(b, &journalRec{batch: batch, last: i == len(recs)-1, slot: r.slot, seq: r.seq,
			epoch: w.slots[r.slot].epoch, tid: r.tid, entry: r.entry})
		if n := len(b) - start - journalFrameHdr; !journalFormat.Fits(n) {
			journalRecordsRefused.Inc()
			return nil, fmt.Errorf("cannot journal transactional id %q (slot %d): %d-byte record, over the journal's %d-byte record limit",
				r.tid, r.slot, n, journalFormat.MaxLen)
		}
	}
	if cap(b) <= 4<<20 {
		w.jbuf = b
	}
	return b, nil
}

// rotate retires the current generation (every batch in it is durable) and makes the prepared
// one current.
func (w *worker) rotate() {
	old := w.cur
	if err := old.f.Close(); err != nil {
		w.c.log.Warn("cannot close retired transaction journal", zap.String("file", old.path), zap.Error(err))
	}
	w.retired = append(w.retired, old.path)
	w.lastUsed = old.off() - journalHeaderSize
	w.cur, w.next = w.next, nil
	journalRotationsTotal.Inc()
}

// nextCap sizes the next generation: twice what the last one took, within
// [journalMinBytes, 2 × CheckpointBytes].
func (w *worker) nextCap() int64 {
	used := max(w.lastUsed, w.cur.off()-journalHeaderSize)
	return min(max(2*used, journalMinBytes), 2*w.c.cfg.CheckpointBytes)
}

// housekeeping runs after every batch and on every tick: start a checkpoint when one is due,
// and keep a next generation prepared so rotation never waits for a file to be created.
func (w *worker) housekeeping(now time.Time) {
	if w.ckBusy || w.cur == nil || w.c.pubFenced.Load() {
		// Rule P stopped the coordinator: its in-memory state may hold seqs of records it rolled
		// back (durable but never published), so it checkpoints nothing any more.
		return
	}
	cfg := w.c.cfg
	pending := len(w.retired) > 0
	for _, d := range w.unck {
		pending = pending || d
	}
	var job ckJob
	if pending && (w.sinceCk >= cfg.CheckpointBytes || now.Sub(w.lastCk) >= cfg.CheckpointInterval) {
		if w.next != nil && w.cur.off() > journalHeaderSize && !w.cur.app.Broken() {
			w.rotate()
		}
		job.snaps = w.snapshot()
		job.del, w.retired = w.retired, nil
		w.sinceCk, w.lastCk = 0, now
	}
	if w.next == nil && !now.Before(w.prepRetry) {
		id := journalID{broker: cfg.BrokerID, inc: cfg.Incarnation, worker: w.id, gen: w.c.gen.Add(1)}
		job.prepare, job.cap = &id, w.nextCap()
	}
	if len(job.snaps) == 0 && len(job.del) == 0 && job.prepare == nil {
		return
	}
	w.ckBusy = true
	w.ckJobs <- job
}

// snapshot copies every slot changed since the last checkpoint and clears its mark.
func (w *worker) snapshot() []slotSnap {
	var snaps []slotSnap
	for slot, dirty := range w.unck {
		if !dirty {
			continue
		}
		w.unck[slot] = false
		ss := w.slots[slot]
		snaps = append(snaps, slotSnap{slot: slot, epoch: ss.epoch, seq: ss.seq, entries: maps.Clone(ss.entries)})
	}
	return snaps
}

// ckDone takes a finished job's outcome back into the worker's state.
func (w *worker) ckDone(r ckResult, now time.Time) {
	w.ckBusy = false
	for _, s := range r.failed {
		w.unck[s] = true
	}
	w.retired = append(r.keep, w.retired...)
	if r.next != nil {
		w.next = r.next
	} else if r.tried {
		w.prepRetry = now.Add(time.Second)
	}
}

// ckLoop is the checkpointer goroutine: it runs the worker's jobs one at a time.
func (w *worker) ckLoop() {
	defer close(w.ckExited)
	for job := range w.ckJobs {
		w.ckRes <- w.runJob(job)
	}
}

// runJob writes the job's slot files, deletes its generations if every file is durable, and
// creates the next generation.
func (w *worker) runJob(job ckJob) ckResult {
	c := w.c
	var res ckResult
	if len(job.snaps) > 0 {
		slots := make([]int, 0, len(job.snaps))
		names := make([]string, 0, len(job.snaps))
		data := make([][]byte, 0, len(job.snaps))
		for _, s := range job.snaps {
			var buf bytes.Buffer
			if err := encodeSlot(&buf, s.epoch, s.seq, s.entries); err != nil {
				c.log.Error("cannot encode transaction slot for a checkpoint", zap.Int("slot", s.slot), zap.Error(err))
				res.failed = append(res.failed, s.slot)
				continue
			}
			slots, data = append(slots, s.slot), append(data, buf.Bytes())
			names = append(names, c.slotFile(s.slot, s.epoch))
		}
		start := time.Now()
		errs := writeSlotFiles(c.cfg.FS, c.dir, names, data)
		slotWriteDuration.UpdateDuration(start)
		slotWritesTotal.Add(len(slots))
		for i, err := range errs {
			if err != nil {
				res.failed = append(res.failed, slots[i])
				c.log.Error("transaction checkpoint failed; the journal keeps the slot's changes and the next checkpoint retries",
					zap.Int("slot", slots[i]), zap.Error(err))
			}
		}
		checkpointsTotal.Inc()
		if len(res.failed) > 0 {
			checkpointErrorsTotal.Inc()
		}
	}
	switch {
	case len(res.failed) > 0:
		res.keep = job.del
	case len(job.del) > 0 && !c.publishable():
		// Rule P for deletion (cluster mode): a successor may be loading one of these slots from
		// an older checkpoint right now and still need the records. Past the lease deadline the
		// generations stay; RemoveDeadJournals collects them once a newer checkpoint covers them.
		res.keep = job.del
	default:
		for _, path := range job.del {
			if err := c.cfg.FS.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				c.log.Warn("cannot delete checkpointed transaction journal; retrying later", zap.String("file", path), zap.Error(err))
				res.keep = append(res.keep, path)
			}
		}
	}
	if job.prepare != nil {
		res.tried = true
		j, err := createJournal(c.cfg.FS, c.dir, *job.prepare, job.cap)
		if err != nil {
			c.log.Warn("cannot prepare the next transaction journal generation; retrying", zap.Error(err))
		}
		res.next = j
	}
	return res
}

// shutdown runs on the worker goroutine after the last batch. Clean: checkpoint every changed
// slot and delete every generation, so a cleanly stopped coordinator leaves exactly the slot
// files. Crash simulation (tests): just close the files.
func (w *worker) shutdown(clean bool) {
	if w.ckBusy {
		w.ckDone(<-w.ckRes, time.Now())
	}
	close(w.ckJobs)
	<-w.ckExited
	var paths []string
	for _, j := range []*journal{w.cur, w.next} {
		if j != nil {
			_ = j.f.Close()
			paths = append(paths, j.path)
		}
	}
	w.cur, w.next = nil, nil
	if !clean || w.c.pubFenced.Load() {
		return
	}
	if len(w.retired)+len(paths) == 0 {
		return
	}
	res := w.runJob(ckJob{snaps: w.snapshot(), del: append(w.retired, paths...)})
	if len(res.failed) > 0 || len(res.keep) > 0 {
		w.c.log.Error("transaction checkpoint at close incomplete; the journal is kept and replayed on the next start",
			zap.Ints("failedSlots", res.failed), zap.Strings("kept", res.keep))
		return
	}
	if err := w.c.cfg.FS.SyncDir(w.c.dir); err != nil {
		w.c.log.Warn("cannot sync transaction state dir after deleting the journal", zap.Error(err))
	}
}
