package txn

// Loading and releasing one slot at runtime (cluster mode moves slot N with the leadership of
// __transaction_state partition N; the single broker loads every slot in Start).
//
//	              LoadSlot(N, epoch)                      install (worker)
//	 unloaded ─────────────────────────► loading ─────────────────────────► loaded
//	    ▲      ops answer 16              │  read slot-N.json + replay every   │ ops served;
//	    │                                 │  journal's records of N (read-     │ Prepare* entries
//	    │                                 │  only), epoch = max(epoch, stored),│ re-driven (sagas)
//	    │                                 │  checkpoint slot-N.json            │
//	    │                                 │  ops answer 14                     │ ReleaseSlot(N)
//	    │                                 ▼ (a read or write error)            ▼
//	    └────────────────────────────── unloaded ◄──────────────────────── releasing
//	       checkpoint slot-N.json durable,        client ops answer 16; the queued ops before
//	       entries dropped from memory            the release and the sagas in flight finish
//	                                              (their internal ops are still served)
//
// In cluster mode the "loading" step is readSlotStateCluster instead: the highest-epoch
// checkpoint, only its epoch's records, and slot-N-e<epoch>.json written before serving.
//
// Every status change happens on the slot's worker goroutine, so it is ordered with the slot's
// operations: an op queued before ReleaseSlot is answered normally, one queued after it answers
// NOT_COORDINATOR. The status is also published in Coordinator.status for cheap reads (Owns).
// A release waits for the slot's entries to leave pending (the single record of a saga in
// flight); a fence-only saga (InitProducerId) changes no state, so it does not hold a release. The release checkpoint runs on the worker after waiting for the checkpointer's job
// in flight, so slot-N.json still has exactly one writer at a time; a loading slot has no
// in-memory state on any worker, so its checkpoint by the loader cannot race one.

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
)

// mStaleSlots counts slots unloaded because a leader answered 52 to one of their markers.
var mStaleSlots = metrics.NewCounter("kaas_txn_stale_slots_total")

type slotStatus int32

const (
	slotUnloaded slotStatus = iota
	slotLoading
	slotLoaded
	slotReleasing
)

// ErrSlotBusy: a LoadSlot or ReleaseSlot found the slot in the middle of the other transition.
var ErrSlotBusy = errors.New("transaction slot is being loaded or released")

func checkSlot(slot int) error {
	if slot < 0 || slot >= NumSlots {
		return fmt.Errorf("cannot use transaction slot %d: there are %d", slot, NumSlots)
	}
	return nil
}

// LoadSlot loads slot (its file and every journal record of it, from any broker; in cluster mode
// readSlotStateCluster's rules, and the coordinator epoch is exactly epoch), makes its
// coordinator epoch max(epoch, the persisted one) — epoch is the leader epoch of
// __transaction_state partition slot — checkpoints it, starts serving it and re-drives every
// prepared transaction in it. Meanwhile its operations answer COORDINATOR_LOAD_IN_PROGRESS. done
// gets nil once the slot is served (at once if it already is), or the error that stopped the load
// (the slot is then unloaded again).
func (c *Coordinator) LoadSlot(slot int, epoch int32, done func(error)) {
	if err := checkSlot(slot); err != nil {
		done(err)
		return
	}
	c.enqueue(&op{slot: slot, done: func(_ any, err error) { done(err) }, ctl: func(w *worker) {
		switch slotStatus(c.status[slot].Load()) {
		case slotLoaded:
			done(nil)
			return
		case slotLoading, slotReleasing:
			done(ErrSlotBusy)
			return
		}
		if below := c.staleBelow[slot].Load(); epoch < below {
			done(fmt.Errorf("cannot load transaction slot %d at epoch %d: it was found stale at epoch %d: %w",
				slot, epoch, below-1, ErrSlotFenced))
			return
		}
		c.status[slot].Store(int32(slotLoading))
		// Reading the journals can take a while: off the worker, which keeps serving the other
		// slots. One goroutine per load, not per operation.
		go func() {
			var ss *slotState
			var err error
			if c.clusterMode() {
				ss, err = c.readSlotStateCluster(slot, epoch)
			} else {
				ss, err = c.readSlotState(slot, epoch)
			}
			c.enqueue(&op{slot: slot, internal: true, done: func(_ any, cerr error) { done(errors.Join(err, cerr)) },
				ctl: func(w *worker) { w.installSlot(slot, ss, err, done) }})
		}()
	}})
}

// readSlotState is the load of one slot: the slot file, the journal records of the slot from
// every generation in the directory (read-only: nothing is truncated or deleted; the files of
// running workers are read as they are), the epoch, and the checkpoint.
func (c *Coordinator) readSlotState(slot int, epoch int32) (*slotState, error) {
	ls, err := readSlot(c.dir, slot)
	if err != nil {
		return nil, err
	}
	var states [NumSlots]*slotState
	ss := &slotState{epoch: ls.coordinatorEpoch, seq: ls.seq, entries: ls.entries}
	states[slot] = ss
	rep, err := c.replayJournals(&states, true, nil)
	if err != nil {
		return nil, err
	}
	ss.epoch = max(ss.epoch, epoch)
	var buf bytes.Buffer
	if err := encodeSlot(&buf, ss.epoch, ss.seq, ss.entries); err != nil {
		return nil, fmt.Errorf("cannot encode transaction slot %d: %w", slot, err)
	}
	if err := writeSlotFiles(c.cfg.FS, c.dir, []string{SlotFileName(slot)}, [][]byte{buf.Bytes()})[0]; err != nil {
		return nil, err
	}
	c.log.Info("transaction slot loaded", zap.Int("slot", slot), zap.Int32("coordinatorEpoch", ss.epoch),
		zap.Int("entries", len(ss.entries)), zap.Int("journalRecordsReplayed", rep.records))
	return ss, nil
}

// loadAttempts bounds the re-reads of a cluster load that found a generation torn in the middle
// of its chain: a live writer (of another slot) may have been between its write and its next
// generation while we listed and read; a second read sees the batch whole.
const loadAttempts = 3

// readSlotStateCluster is the cluster-mode load of one slot at coordinator epoch epoch
// (cluster.md §3; Rule S was checked by the assignment agent before it called LoadSlot):
//
//  1. a fresh listing; the slot's highest-epoch checkpoint E′ (slot-N-e<E′>.json, or a legacy
//     slot-N.json at its stored coordinatorEpoch) and its seq; E′ > epoch is a stale
//     assignment (ErrSlotFenced);
//  2. the slot's records from every journal generation of every broker and incarnation whose
//     epoch is E′ and seq is above the checkpoint's, in seq order, with no gap. Records of other
//     epochs are ignored: older ones are in the checkpoint already, and a zombie's records
//     written after the slot moved carry an epoch whose holder's checkpoint no newer load starts
//     from (the successor's own checkpoint is newer), so they are never applied;
//  3. slot-N-e<epoch>.json is written durably before the slot serves, so every later record of
//     this holder (epoch, seq above it) continues a chain the next load can follow;
//  4. the superseded checkpoints of the slot are deleted (Rule P: only while publishable).
//
// The caller re-drives the Prepare* entries (installSlot).
func (c *Coordinator) readSlotStateCluster(slot int, epoch int32) (*slotState, error) {
	var err error
	for attempt := 0; attempt < loadAttempts; attempt++ {
		var ss *slotState
		var retry bool
		ss, retry, err = c.loadSlotCluster(slot, epoch)
		if err == nil || !retry {
			return ss, err
		}
		c.log.Warn("re-reading the transaction journals for a slot load", zap.Int("slot", slot), zap.Error(err))
	}
	return nil, err
}

func (c *Coordinator) loadSlotCluster(slot int, epoch int32) (_ *slotState, retry bool, _ error) {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, false, fmt.Errorf("cannot list transaction state dir %s: %w", c.dir, err)
	}
	refs, err := scanCheckpoints(c.dir, ents)
	if err != nil {
		return nil, false, err
	}
	ref := refs[slot]
	ls := loadedSlot{entries: map[string]*Entry{}}
	if ref.name != "" {
		path := filepath.Join(c.dir, ref.name)
		if ls, err = readSlotPath(path, slot); err != nil {
			return nil, false, err
		}
		if ls.coordinatorEpoch != ref.epoch {
			return nil, false, fmt.Errorf("cannot load transaction slot file %s: it holds coordinator epoch %d", path, ls.coordinatorEpoch)
		}
	}
	from := ref.epoch
	if from > epoch {
		return nil, false, fmt.Errorf("cannot load transaction slot %d at epoch %d: %s is newer: %w", slot, epoch, ref.name, ErrSlotFenced)
	}
	var states [NumSlots]*slotState
	ss := &slotState{epoch: from, seq: ls.seq, entries: ls.entries}
	states[slot] = ss
	rep, err := c.replayJournals(&states, true, func(r *journalRec) bool { return r.epoch == from })
	if err != nil {
		return nil, true, err
	}
	ignoredRecordsTotal.Add(rep.ignored)
	ss.epoch = epoch
	var buf bytes.Buffer
	if err := encodeSlot(&buf, ss.epoch, ss.seq, ss.entries); err != nil {
		return nil, false, fmt.Errorf("cannot encode transaction slot %d: %w", slot, err)
	}
	name := SlotCheckpointName(slot, epoch)
	if err := writeSlotFiles(c.cfg.FS, c.dir, []string{name}, [][]byte{buf.Bytes()})[0]; err != nil {
		return nil, false, err
	}
	if c.publishable() {
		// The checkpoint just written carries everything the older ones did; no load reads them
		// any more (and RemoveDeadJournals counts coverage from the newest one).
		removed := false
		for _, old := range append(ref.older, ref.name) {
			if old == "" || old == name {
				continue
			}
			if err := c.cfg.FS.Remove(filepath.Join(c.dir, old)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				c.log.Warn("cannot delete superseded transaction slot checkpoint", zap.String("file", old), zap.Error(err))
				continue
			}
			removed = true
		}
		if removed {
			if err := c.cfg.FS.SyncDir(c.dir); err != nil {
				c.log.Warn("cannot sync transaction state dir after deleting superseded checkpoints", zap.Error(err))
			}
		}
	}
	c.log.Info("transaction slot loaded", zap.Int("slot", slot), zap.Int32("coordinatorEpoch", epoch),
		zap.Int32("fromCheckpointEpoch", from), zap.Uint64("seq", ss.seq), zap.Int("entries", len(ss.entries)),
		zap.Int("journalRecordsReplayed", rep.records), zap.Int("otherEpochRecordsIgnored", rep.ignored))
	return ss, false, nil
}

// installSlot finishes a load on the slot's worker.
func (w *worker) installSlot(slot int, ss *slotState, err error, done func(error)) {
	c := w.c
	if err == nil && !c.publishable() {
		err = ErrPublishFenced
	}
	if err != nil {
		c.status[slot].Store(int32(slotUnloaded))
		c.log.Error("cannot load transaction slot", zap.Int("slot", slot), zap.Error(err))
		done(fmt.Errorf("cannot load transaction slot %d: %w", slot, err))
		return
	}
	open, _ := ss.prepareLoaded()
	w.slots[slot] = ss
	w.open += open
	openTxns.Add(open)
	c.status[slot].Store(int32(slotLoaded))
	w.redriveLoaded(slot, ss)
	done(nil)
}

// ReleaseSlot stops serving slot: operations queued after it answer NOT_COORDINATOR, the ones
// queued before it and every saga in flight finish, then the slot is checkpointed durably and
// dropped from memory. done gets nil once the slot file holds everything (at once if the slot is
// not loaded), or the checkpoint error (the slot is then served again, nothing lost: the journal
// still holds its changes). The PartitionWriter and GroupCompleter must answer every call: a
// dispatch that never answers holds the release. The checkpoint runs on the worker, so the
// worker's other slots wait for that one slot file write.
func (c *Coordinator) ReleaseSlot(slot int, done func(error)) {
	if err := checkSlot(slot); err != nil {
		done(err)
		return
	}
	c.enqueue(&op{slot: slot, done: func(_ any, err error) { done(err) }, ctl: func(w *worker) {
		switch slotStatus(c.status[slot].Load()) {
		case slotUnloaded:
			done(nil)
			return
		case slotLoading:
			done(ErrSlotBusy)
			return
		}
		ss := w.slots[slot]
		ss.releaseDone = append(ss.releaseDone, done)
		c.status[slot].Store(int32(slotReleasing))
		w.releasing[slot] = struct{}{}
	}})
}

// finishRelease completes a release once no dispatch of the slot is in flight: no entry is
// pending (the one record of a saga in flight; a failed saga has released its flag before it
// answers). The worker calls it after every batch while the slot is releasing.
func (w *worker) finishRelease(slot int) {
	c := w.c
	ss := w.slots[slot]
	if c.pubFenced.Load() {
		// Rule P stopped the coordinator: no checkpoint (see housekeeping), and the sagas in
		// flight are not waited for; the successor replays this holder's journal as after a crash.
		delete(w.releasing, slot)
		w.dropSlot(slot, ss)
		for _, d := range ss.releaseDone {
			d(ErrPublishFenced)
		}
		ss.releaseDone = nil
		return
	}
	if !ss.stale {
		for _, e := range ss.entries {
			if e.pending {
				return
			}
		}
	}
	delete(w.releasing, slot)
	if w.ckBusy {
		w.ckDone(<-w.ckRes, time.Now())
	}
	res := w.runJob(ckJob{snaps: []slotSnap{{slot: slot, epoch: ss.epoch, seq: ss.seq, entries: ss.entries}}})
	waiters := ss.releaseDone
	ss.releaseDone = nil
	if len(res.failed) > 0 && ss.stale {
		// Never served again (it stays releasing, in memory): the next periodic checkpoint
		// includes it, the journal holds everything meanwhile (no generation is deleted before a
		// checkpoint covers it), and the agent's release, which precedes any new load, retries
		// the unload.
		w.unck[slot] = true
		err := fmt.Errorf("cannot unload stale transaction slot %d: its checkpoint failed", slot)
		c.log.Error("cannot checkpoint stale transaction slot", zap.Int("slot", slot), zap.Error(err))
		for _, d := range waiters {
			d(err)
		}
		return
	}
	if len(res.failed) > 0 {
		// Keep serving it: its changes are in the journal, the next checkpoint retries.
		w.unck[slot] = true
		c.status[slot].Store(int32(slotLoaded))
		err := fmt.Errorf("cannot release transaction slot %d: its checkpoint failed", slot)
		for _, d := range waiters {
			d(err)
		}
		return
	}
	w.dropSlot(slot, ss)
	c.log.Info("transaction slot released", zap.Int("slot", slot), zap.Int("entries", len(ss.entries)),
		zap.Uint64("seq", ss.seq))
	for _, d := range waiters {
		d(nil)
	}
}

// dropSlot takes a released slot out of the worker's memory.
func (w *worker) dropSlot(slot int, ss *slotState) {
	w.unck[slot] = false
	var open int64
	for _, e := range ss.entries {
		if e.State.IsOpen() {
			open++
		}
	}
	w.open -= open
	openTxns.Add(-open)
	delete(w.slots, slot)
	w.c.status[slot].Store(int32(slotUnloaded))
}

// staleSlot handles TRANSACTION_COORDINATOR_FENCED (52) from a partition leader for a marker of
// slot sent at coordinator epoch epoch: the leader has seen a marker of a newer coordinator epoch
// of the producer, so a newer holder of the slot exists and this one is stale (design/cluster.md
// §4: "on 52, C is stale and releases the slot"). In cluster mode the slot stops being served at
// once, and is then checkpointed and unloaded like a release, except that it does not wait for
// the sagas in flight (their markers may be retrying against a dead leader) and their internal
// ops are refused too (no Complete* from a stale holder): its ops answer NOT_COORDINATOR, the
// reaper skips it, nothing more of it is dispatched, and a load at this epoch or below is refused
// (ErrSlotFenced), so the agent cannot bring it back at the stale epoch.
//
// Why unload and not fail-stop (design/cluster.md §2.2): a newer coordinator epoch is a newer
// assignment, which Rule S let in only after this broker's release record or the end of its
// lease. The lease case already stopped this coordinator (Rule P, pubFenced). Otherwise the 52
// proves only that this one slot moved while this broker's watch lags; its other partitions,
// shards and slots are still its own, and a fail-stop would move all of them. The handing back is
// the agent's ordinary release once its watch shows the new assignment: ReleaseSlot finds the
// slot unloaded (or joins this unload) and the agent publishes release/txn/N/E as usual. The
// checkpoint is written (Rule P permitting) because a newer holder's load ignores it (its own
// checkpoint has a higher epoch), while it protects the slot's records if the newer epoch on the
// leader was not a real holder's. A single broker never sees 52 from its own partitions in
// normal operation; there the saga just fails as before (the entry stays prepared, re-driven).
func (c *Coordinator) staleSlot(slot int, epoch int32) {
	if !c.clusterMode() || checkSlot(slot) != nil {
		return
	}
	c.enqueue(&op{slot: slot, internal: true, ctl: func(w *worker) {
		ss := w.slots[slot]
		st := slotStatus(c.status[slot].Load())
		if ss == nil || ss.stale || ss.epoch != epoch || (st != slotLoaded && st != slotReleasing) {
			return // already unloaded, or loaded again at a newer epoch
		}
		mStaleSlots.Inc()
		c.log.Error("transaction slot is stale: a partition leader saw a newer coordinator epoch (TRANSACTION_COORDINATOR_FENCED); unloading it",
			zap.Int("slot", slot), zap.Int32("coordinatorEpoch", epoch))
		for {
			below := c.staleBelow[slot].Load()
			if below > epoch || c.staleBelow[slot].CompareAndSwap(below, epoch+1) {
				break
			}
		}
		ss.stale = true
		c.status[slot].Store(int32(slotReleasing))
		w.releasing[slot] = struct{}{}
	}})
}
