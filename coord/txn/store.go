package txn

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/storage"
)

// NumSlots is the number of slot files, Apache's transaction.state.log.num.partitions default.
// It is part of the on-disk format: changing it makes existing entries unreachable.
const NumSlots = topology.NumTxnSlots

// slotFileVersion is the only document version this code reads and writes.
const slotFileVersion = 1

// StateDir is the directory of the slot files under the cluster dir.
const StateDir = "txn_state"

// fnv1a32 is the slot hash (topology.FNV1a32); the topology owns it so that every package maps a
// transactional.id to the same slot.
func fnv1a32(s string) uint32 { return topology.FNV1a32(s) }

// SlotFor is the slot of a transactional.id: fnv1a32(id) % 50 (topology.TxnSlot).
func SlotFor(tid string) int { return topology.TxnSlot(tid) }

// SlotFileName is slot-N.json.
func SlotFileName(slot int) string { return "slot-" + strconv.Itoa(slot) + ".json" }

// SlotCheckpointName is slot-N-e<E>.json: in cluster mode the checkpoint of slot N written by its
// holder at coordinator epoch E (the assignment epoch of __transaction_state partition N). Each
// epoch has its own file, so two holders of a slot (a successor and a zombie past its lease) never
// write the same name, and a load takes the highest epoch (cluster.md §2.3, §3).
func SlotCheckpointName(slot int, epoch int32) string {
	return "slot-" + strconv.Itoa(slot) + "-e" + strconv.FormatInt(int64(epoch), 10) + ".json"
}

// parseSlotFileName recognises slot-N.json (legacy: epoch read from the document) and
// slot-N-e<E>.json.
func parseSlotFileName(name string) (slot int, epoch int32, legacy, ok bool) {
	rest, ok := strings.CutPrefix(name, "slot-")
	if !ok {
		return 0, 0, false, false
	}
	if rest, ok = strings.CutSuffix(rest, ".json"); !ok {
		return 0, 0, false, false
	}
	num, ep, named := strings.Cut(rest, "-e")
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n >= NumSlots {
		return 0, 0, false, false
	}
	if !named {
		return n, 0, true, SlotFileName(n) == name
	}
	e, err := strconv.ParseInt(ep, 10, 32)
	if err != nil || e < 0 || SlotCheckpointName(n, int32(e)) != name {
		return 0, 0, false, false
	}
	return n, int32(e), false, true
}

// ckRef is the newest checkpoint of one slot found in a listing, and the older ones it supersedes.
type ckRef struct {
	name  string // "" if the slot has none
	epoch int32
	older []string
}

// scanCheckpoints finds each slot's highest-epoch checkpoint among ents (a listing of dir). A legacy
// slot-N.json counts at its stored coordinatorEpoch (it is read for that); at equal epochs the
// epoch-named file wins, since only a cluster holder writes it.
func scanCheckpoints(dir string, ents []os.DirEntry) ([NumSlots]ckRef, error) {
	var refs [NumSlots]ckRef
	for _, de := range ents {
		slot, epoch, legacy, ok := parseSlotFileName(de.Name())
		if !ok {
			continue
		}
		if legacy {
			ls, err := readSlot(dir, slot)
			if err != nil {
				return refs, err
			}
			epoch = ls.coordinatorEpoch
		}
		r := &refs[slot]
		better := r.name == "" || epoch > r.epoch || (epoch == r.epoch && !legacy)
		if !better {
			r.older = append(r.older, de.Name())
			continue
		}
		if r.name != "" {
			r.older = append(r.older, r.name)
		}
		r.name, r.epoch = de.Name(), epoch
	}
	return refs, nil
}

// slotDoc is the persisted form of one slot. See README.md for the field-by-field layout.
type slotDoc struct {
	Version          int   `json:"version"`
	CoordinatorEpoch int32 `json:"coordinatorEpoch"`
	// Seq is the journal sequence number of the slot's last record this document includes
	// (journal.go); records with a higher seq are replayed on top of it. Files written before the
	// journal existed have none and read as 0.
	Seq     uint64            `json:"seq"`
	Entries map[string]*Entry `json:"entries"`
}

// FileSystem is the seam the slot store and the journal write through, so tests can inject
// failures and count writes. The default is the OS file system with fsync / fdatasync.
type FileSystem interface {
	// WriteTemp creates (truncating) path, writes data and fsyncs it before closing.
	WriteTemp(path string, data []byte) error
	Rename(from, to string) error
	// SyncDir fsyncs a directory so creates, renames and unlinks inside it survive a crash.
	SyncDir(dir string) error
	// CreateJournal creates (truncating) a journal generation file for writing.
	CreateJournal(path string) (JournalFile, error)
	// Remove deletes a file (a journal generation every record of which is checkpointed).
	Remove(path string) error
}

// JournalFile is an open journal generation (journal.go).
type JournalFile interface {
	WriteAt(b []byte, off int64) (int, error)
	// Datasync makes the written data durable without the metadata a read does not need
	// (fdatasync(2) on Linux, fsync elsewhere). Only used for writes into the pre-zeroed,
	// fsync'd region, so the file size and block map never have to be committed by it.
	Datasync() error
	// Sync is a full fsync (size and allocation included).
	Sync() error
	Truncate(size int64) error
	Close() error
}

// OSFileSystem is the production FileSystem.
type OSFileSystem struct{}

// CreateJournal implements FileSystem.
func (OSFileSystem) CreateJournal(path string) (JournalFile, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	return osJournalFile{f}, nil
}

// Remove implements FileSystem.
func (OSFileSystem) Remove(path string) error { return os.Remove(path) }

// osJournalFile is an *os.File with Datasync: fdatasync(2) on Linux (the journal is pre-zeroed,
// so no metadata to commit), fsync elsewhere — storage.Fdatasync.
type osJournalFile struct{ *os.File }

func (f osJournalFile) Datasync() error { return storage.Fdatasync(f.File) }

// WriteTemp implements FileSystem.
func (OSFileSystem) WriteTemp(path string, data []byte) error {
	return storage.WriteFileSynced(path, data)
}

// Rename implements FileSystem.
func (OSFileSystem) Rename(from, to string) error { return os.Rename(from, to) }

// SyncDir implements FileSystem.
func (OSFileSystem) SyncDir(dir string) error { return storage.SyncDir(dir) }

// encodeSlot appends the JSON document of a slot to buf (reset first). encoding/json sorts map
// keys, so the same state always encodes to the same bytes.
func encodeSlot(buf *bytes.Buffer, coordEpoch int32, seq uint64, entries map[string]*Entry) error {
	buf.Reset()
	enc := json.NewEncoder(buf)
	return enc.Encode(slotDoc{Version: slotFileVersion, CoordinatorEpoch: coordEpoch, Seq: seq, Entries: entries})
}

// loadedSlot is one slot read from disk.
type loadedSlot struct {
	exists           bool
	coordinatorEpoch int32
	seq              uint64
	entries          map[string]*Entry
}

// readSlot reads and validates dir/slot-N.json. A missing file is an empty slot. Anything else
// that is not a valid version-1 document (garbage, unknown version, unknown state, an entry that
// hashes to another slot, a key that disagrees with its entry) is an error naming the file: the
// coordinator must not start on state it cannot read, and must never silently drop entries.
// Leftover *.tmp files of interrupted writes are never read.
func readSlot(dir string, slot int) (loadedSlot, error) {
	return readSlotPath(filepath.Join(dir, SlotFileName(slot)), slot)
}

// readSlotPath is readSlot for any checkpoint file of slot.
func readSlotPath(path string, slot int) (loadedSlot, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return loadedSlot{entries: map[string]*Entry{}}, nil
	}
	if err != nil {
		return loadedSlot{}, fmt.Errorf("cannot read transaction slot file %s: %w", path, err)
	}
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return loadedSlot{}, fmt.Errorf("cannot parse transaction slot file %s: %w", path, err)
	}
	if head.Version == nil || *head.Version != slotFileVersion {
		v := "missing"
		if head.Version != nil {
			v = strconv.Itoa(*head.Version)
		}
		return loadedSlot{}, fmt.Errorf("cannot load transaction slot file %s: unsupported version %s (want %d)", path, v, slotFileVersion)
	}
	var doc slotDoc
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return loadedSlot{}, fmt.Errorf("cannot parse transaction slot file %s: %w", path, err)
	}
	if doc.Entries == nil {
		doc.Entries = map[string]*Entry{}
	}
	for tid, e := range doc.Entries {
		if err := checkEntry(slot, tid, e); err != nil {
			return loadedSlot{}, fmt.Errorf("cannot load transaction slot file %s: %w", path, err)
		}
	}
	return loadedSlot{exists: true, coordinatorEpoch: doc.CoordinatorEpoch, seq: doc.Seq, entries: doc.Entries}, nil
}

// checkEntry is the validation every persisted entry passes, in a slot file or a journal record,
// on load and before it is written: a state we could not read back must never reach the disk.
func checkEntry(slot int, tid string, e *Entry) error {
	switch {
	case e == nil:
		return fmt.Errorf("entry %q is null", tid)
	case e.TransactionalID != tid:
		return fmt.Errorf("entry key %q holds transactionalId %q", tid, e.TransactionalID)
	case SlotFor(tid) != slot:
		return fmt.Errorf("entry %q belongs to slot %d", tid, SlotFor(tid))
	case e.State == PrepareEpochFence || e.State < Empty || e.State > Dead:
		return fmt.Errorf("entry %q has non-persistable state %s", tid, e.State)
	case e.TxnVersion != 1 && e.TxnVersion != 2:
		return fmt.Errorf("entry %q has transaction version %d", tid, e.TxnVersion)
	}
	return nil
}

// writeSlotFiles durably replaces the given slot files (names: SlotFileName, or SlotCheckpointName
// in cluster mode): every tmp file is written and fsynced (concurrently: they are distinct files
// with one writer each), then renamed, then the directory is fsynced once for all of them.
// errs[i] reports file i's outcome; a directory fsync failure fails every file renamed in this
// call.
func writeSlotFiles(fsys FileSystem, dir string, names []string, data [][]byte) []error {
	errs := make([]error, len(names))
	tmp := func(i int) string { return filepath.Join(dir, names[i]+".tmp") }
	if len(names) == 1 {
		errs[0] = fsys.WriteTemp(tmp(0), data[0])
	} else {
		done := make(chan struct{}, len(names))
		for i := range names {
			go func(i int) {
				errs[i] = fsys.WriteTemp(tmp(i), data[i])
				done <- struct{}{}
			}(i)
		}
		for range names {
			<-done
		}
	}
	renamed := 0
	for i := range names {
		if errs[i] == nil {
			errs[i] = fsys.Rename(tmp(i), filepath.Join(dir, names[i]))
		}
		if errs[i] != nil {
			_ = os.Remove(tmp(i))
			errs[i] = fmt.Errorf("cannot write transaction slot file %s: %w", filepath.Join(dir, names[i]), errs[i])
			continue
		}
		renamed++
	}
	if renamed > 0 {
		if err := fsys.SyncDir(dir); err != nil {
			for i := range errs {
				if errs[i] == nil {
					errs[i] = fmt.Errorf("cannot sync transaction state dir %s: %w", dir, err)
				}
			}
		}
	}
	return errs
}
