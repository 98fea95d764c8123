package txn

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.uber.org/zap"
)

// replayResult is what Start needs to know after the journal replay.
type replayResult struct {
	touched [NumSlots]bool  // an owned slot got records: its slot file must be (re)written
	files   []string        // every generation read
	keep    map[string]bool // generations that must stay (records of slots we do not own)
	maxGen  uint64
	records int
	ignored int // records of a loaded slot that the filter left out (cluster mode: other epochs)
}

// replayJournals applies the journal generations found in the state dir on top of the loaded
// slot files (states[slot] is nil for slots this broker does not own). Rules (README.md,
// "Recovery"):
//
//   - Generations are grouped into chains by (broker, worker); within a chain only the newest
//     generation that holds data may have a torn tail (an incomplete last batch, a damaged last
//     record, stray records of that unfinished batch). This broker's torn tails are truncated to
//     the last complete batch, with a log line; another broker's files are only read. Damage
//     anywhere else — in an older generation, or followed by a record of a later batch —
//     refuses the start: that is acknowledged state.
//   - Records are applied per slot in seq order, whichever file holds them (generation numbers
//     of different brokers are not comparable; per-slot seq is): a record with seq <= the slot's
//     seq is already in the slot file (a crash between a checkpoint and the deletion of the
//     generations it covered) and is skipped; seq = slot seq + 1 is applied; anything else is a
//     gap and refuses the start.
//   - Records of slots this broker does not own are left for their owner: the generation
//     holding them is kept if any of them is newer than that slot's file. Another broker's
//     generations are never deleted here (README "Ownership").
//
// readOnly is the runtime load of one slot (LoadSlot) while the workers write their own
// generations: nothing is truncated or removed, a torn tail is only logged (it may be a batch
// being written right now), and a generation that disappears between listing and reading was
// deleted by a checkpoint that covered it.
//
// only, when set, picks the records of a loaded slot that take part (cluster mode: those of the
// epoch of the checkpoint the load started from); the others are ignored and counted.
func (c *Coordinator) replayJournals(states *[NumSlots]*slotState, readOnly bool, only func(*journalRec) bool) (replayResult, error) {
	rep := replayResult{keep: map[string]bool{}}
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return rep, fmt.Errorf("cannot list transaction state dir %s: %w", c.dir, err)
	}
	type chainKey struct {
		broker int32
		inc    string
		worker int
	}
	mine := func(id journalID) bool { return id.broker == c.cfg.BrokerID && id.inc == c.cfg.Incarnation }
	chains := map[chainKey][]journalID{}
	for _, de := range ents {
		name := de.Name()
		if base, ok := strings.CutSuffix(name, ".tmp"); ok {
			if id, ok := parseJournalName(base); ok && mine(id) && !readOnly {
				// An interrupted generation creation: never renamed into place, never written to.
				if err := c.cfg.FS.Remove(filepath.Join(c.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					c.log.Warn("cannot remove leftover journal file", zap.String("file", name), zap.Error(err))
				}
			}
			continue
		}
		if id, ok := parseJournalName(name); ok {
			k := chainKey{id.broker, id.inc, id.worker}
			chains[k] = append(chains[k], id)
			if mine(id) {
				rep.maxGen = max(rep.maxGen, id.gen)
			}
		}
	}

	type recRef struct {
		rec  *journalRec
		path string
	}
	var perSlot [NumSlots][]recRef
	foreignSeq := map[int]uint64{}
	for _, chain := range chains {
		slices.SortFunc(chain, func(a, b journalID) int { return cmp.Compare(a.gen, b.gen) })
		type genFile struct {
			id   journalID
			path string
			sc   genScan
		}
		files := make([]genFile, 0, len(chain))
		newest := -1
		for _, id := range chain {
			path := filepath.Join(c.dir, journalName(id))
			data, err := os.ReadFile(path)
			if readOnly && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return rep, fmt.Errorf("cannot read transaction journal %s: %w", path, err)
			}
			hid, err := parseJournalHeader(data)
			if err == nil && !id.sameFile(hid) {
				err = fmt.Errorf("its header names %s", journalName(hid))
			}
			var sc genScan
			if err == nil {
				sc, err = scanJournal(data)
			}
			if err != nil {
				return rep, fmt.Errorf("cannot load transaction journal %s: %w; refusing to start", path, err)
			}
			if sc.hasData {
				newest = len(files)
			}
			files = append(files, genFile{id: id, path: path, sc: sc})
		}
		for i := range files {
			f := &files[i]
			own := mine(f.id) && !readOnly
			switch {
			case f.sc.acked:
				return rep, fmt.Errorf("cannot load transaction journal %s: damaged record at byte %d is followed by acknowledged records (byte %d); refusing to start rather than lose acknowledged transaction state",
					f.path, f.sc.tornAt, f.sc.ackedAt)
			case f.sc.torn && i != newest:
				return rep, fmt.Errorf("cannot load transaction journal %s: %s at byte %d, but a later generation of worker %d holds data; refusing to start rather than lose acknowledged transaction state",
					f.path, f.sc.tornWhy, f.sc.tornAt, f.id.worker)
			case f.sc.torn && own:
				c.log.Warn("truncating torn tail of transaction journal (a batch that was never acknowledged)",
					zap.String("file", f.path), zap.String("why", f.sc.tornWhy), zap.Int64("at", f.sc.tornAt),
					zap.Int64("truncatedTo", f.sc.end))
				journalTruncationsTotal.Inc()
				if err := truncateSynced(f.path, f.sc.end); err != nil {
					return rep, fmt.Errorf("cannot truncate torn tail of transaction journal %s at %d: %w", f.path, f.sc.end, err)
				}
			case f.sc.torn && !readOnly:
				c.log.Warn("ignoring torn tail of another broker's transaction journal", zap.String("file", f.path),
					zap.Int64("at", f.sc.tornAt))
			}
			if own {
				rep.files = append(rep.files, f.path)
			} else if f.sc.hasData && !mine(f.id) && !readOnly {
				c.log.Warn("replaying another broker's transaction journal for the slots this broker owns; it is not deleted",
					zap.String("file", f.path))
			}
			for j := range f.sc.recs {
				r := &f.sc.recs[j]
				if states[r.slot] != nil {
					if only != nil && !only(r) {
						rep.ignored++
						continue
					}
					perSlot[r.slot] = append(perSlot[r.slot], recRef{r, f.path})
					continue
				}
				if readOnly {
					continue
				}
				seq, ok := foreignSeq[r.slot]
				if !ok {
					if ls, err := readSlot(c.dir, r.slot); err == nil {
						seq = ls.seq
					}
					foreignSeq[r.slot] = seq
				}
				if r.seq > seq && own {
					rep.keep[f.path] = true
				}
			}
		}
	}

	for slot, refs := range perSlot {
		ss := states[slot]
		slices.SortStableFunc(refs, func(a, b recRef) int { return cmp.Compare(a.rec.seq, b.rec.seq) })
		for i, ref := range refs {
			r := ref.rec
			if r.seq <= ss.seq {
				if i > 0 && refs[i-1].rec.seq == r.seq && !sameRecord(refs[i-1].rec, r) {
					return rep, fmt.Errorf("cannot load transaction journal %s: slot %d has two different records with seq %d (the other in %s); refusing to start",
						ref.path, slot, r.seq, refs[i-1].path)
				}
				continue
			}
			if r.seq != ss.seq+1 {
				return rep, fmt.Errorf("cannot load transaction journal %s: slot %d record seq %d follows seq %d, records are missing; refusing to start",
					ref.path, slot, r.seq, ss.seq)
			}
			if r.entry == nil {
				delete(ss.entries, r.tid)
			} else {
				// PrepareSeq is not in the record: the record that starts a prepare gives it its
				// seq, as the writer did; any later record of the same prepare keeps it.
				if prev := ss.entries[r.tid]; startsPrepare(prev, r.entry) {
					r.entry.PrepareSeq = r.seq
				} else if prev != nil {
					r.entry.PrepareSeq = prev.PrepareSeq
				}
				ss.entries[r.tid] = r.entry
			}
			ss.seq = r.seq
			ss.epoch = max(ss.epoch, r.epoch)
			rep.touched[slot] = true
			rep.records++
		}
	}
	return rep, nil
}

// sameRecord reports whether two records with one seq say the same thing (the same generation
// read twice is harmless; two different histories are not).
func sameRecord(a, b *journalRec) bool {
	return a.tid == b.tid && a.epoch == b.epoch && (a.entry == nil) == (b.entry == nil) &&
		(a.entry == nil || persistedEqual(a.entry, b.entry))
}

// retireReplayed deletes the replayed generations once Start's checkpoint made every record of
// them durable in a slot file. A generation that cannot be deleted is harmless (its records are
// skipped next time) and only logged.
func (c *Coordinator) retireReplayed(rep replayResult) {
	removed := false
	for _, path := range rep.files {
		if rep.keep[path] {
			c.log.Warn("keeping transaction journal: it holds changes of slots this broker does not own", zap.String("file", path))
			continue
		}
		if err := c.cfg.FS.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("cannot delete replayed transaction journal", zap.String("file", path), zap.Error(err))
			continue
		}
		removed = true
	}
	if removed {
		if err := c.cfg.FS.SyncDir(c.dir); err != nil {
			c.log.Warn("cannot sync transaction state dir after deleting replayed journals", zap.Error(err))
		}
	}
}

// truncateSynced cuts path to size and fsyncs it.
func truncateSynced(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
