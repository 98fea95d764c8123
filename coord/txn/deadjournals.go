package txn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kaas-go/kaas/storage"
)

// RemoveDeadJournals deletes the journal generations of a dead incarnation inc of broker
// brokerID (cluster mode) whose every record is covered by its slot's newest checkpoint: one of a
// higher coordinator epoch, or of the same epoch with a seq at least the record's (cluster.md §3:
// "a dead coordinator's journal is only ever read"; this is the one exception, and only for what
// no load can need any more). A generation that cannot be read or scanned whole (damage inside
// acknowledged data) is kept. It returns how many files it deleted. The caller (the controller)
// must only pass incarnations whose lease is gone: a live writer's newest generation would be
// judged on a partial read.
func RemoveDeadJournals(clusterDir string, brokerID int32, inc string) (int, error) {
	if !validIncarnation(inc) {
		return 0, fmt.Errorf("cannot collect transaction journals of broker %d: incarnation %q is not letters and digits", brokerID, inc)
	}
	dir := filepath.Join(clusterDir, StateDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cannot list transaction state dir %s: %w", dir, err)
	}
	refs, err := scanCheckpoints(dir, ents)
	if err != nil {
		return 0, err
	}
	type pos struct {
		epoch int32
		seq   uint64
		ok    bool
	}
	var newest [NumSlots]pos
	for slot, r := range refs {
		if r.name == "" {
			continue
		}
		ls, err := readSlotPath(filepath.Join(dir, r.name), slot)
		if err != nil {
			return 0, err
		}
		newest[slot] = pos{r.epoch, ls.seq, true}
	}
	removed := 0
	for _, de := range ents {
		name := de.Name()
		base, tmp := strings.CutSuffix(name, ".tmp")
		id, ok := parseJournalName(base)
		if !ok || id.broker != brokerID || id.inc != inc {
			continue
		}
		path := filepath.Join(dir, name)
		if !tmp {
			// A .tmp leftover was never renamed into place, so never written to: it goes as is.
			data, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return removed, fmt.Errorf("cannot read transaction journal %s: %w", path, err)
			}
			hid, err := parseJournalHeader(data)
			if err != nil || !id.sameFile(hid) {
				continue
			}
			sc, err := scanJournal(data)
			if err != nil || sc.acked {
				continue
			}
			covered := true
			for i := range sc.recs {
				r := &sc.recs[i]
				n := newest[r.slot]
				if !n.ok || n.epoch < r.epoch || (n.epoch == r.epoch && n.seq < r.seq) {
					covered = false
					break
				}
			}
			if !covered {
				continue
			}
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("cannot delete transaction journal %s: %w", path, err)
		}
		removed++
		deadJournalsDeleted.Inc()
	}
	if removed > 0 {
		if err := storage.SyncDir(dir); err != nil {
			return removed, fmt.Errorf("cannot sync transaction state dir %s: %w", dir, err)
		}
	}
	return removed, nil
}

// JournalWriter is one (broker, incarnation) that has cluster-mode journal files on the volume.
type JournalWriter struct {
	Broker      int32
	Incarnation string
}

// JournalWriters lists the writers of the cluster-mode journal generations in clusterDir, so the
// controller can collect those of dead incarnations (RemoveDeadJournals) even after their other
// files are gone.
func JournalWriters(clusterDir string) ([]JournalWriter, error) {
	dir := filepath.Join(clusterDir, StateDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot list transaction state dir %s: %w", dir, err)
	}
	seen := map[JournalWriter]bool{}
	var out []JournalWriter
	for _, de := range ents {
		base, _ := strings.CutSuffix(de.Name(), ".tmp")
		id, ok := parseJournalName(base)
		if !ok || id.inc == "" {
			continue
		}
		w := JournalWriter{Broker: id.broker, Incarnation: id.inc}
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out, nil
}
