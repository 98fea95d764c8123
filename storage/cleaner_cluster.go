package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
)

// Log compaction in cluster mode: the cleaner runs on the partition leader, under the fencing
// rules of the shared volume (cluster.go: one writer per file name, a successor never renames
// another epoch's file, zombies write back late).
//
// The single-broker swap renames <name>.cleaned over the old names; in cluster mode that would
// rename another epoch's files. So a clean by the leader at epoch E writes new names of its
// own and commits them with one manifest:
//
//	<base %020d>-<E %010d>.c<seq %010d>.{log,index,timeindex,txnindex}   one per group
//	clean-<E>-<seq>.json = {epoch, seq, cleanEnd, files: [{base, name, next, size}]}
//
// A group (cleaner.go) is consecutive segments cleaned into one file: its base is the first's,
// its next the last's, so a file covers several old bases and the files of a manifest are
// contiguous from the first to cleanEnd. Nothing reads a manifest per old base: the loader
// (applyCleanWinner) takes the files as the segments below cleanEnd and ignores every original
// there, whatever its base; cleanWinner, retention's log-start checkpoint and the GC reason per
// file with its [base, next); FirstDirtyOffset is cleanEnd. The deletions below delete every
// source of every group.
//
// parseEpochName does not take the cleaned names for original segments (their epoch part is
// not a number), so recoverLog, readPartitionView and the snapshot listing skip them;
// removeEpochLeftovers takes them as files of their epoch, which is right (they are).
//
// Why content needs no epoch fencing: a clean rewrites only closed segments wholly below the
// LSO, and the LSO is at or below the HWM, so every record it reads was durable and published
// under the leader's lease. Every successor's view of that epoch contains it (a crashed epoch's
// end is found by scanning to its first bad batch, which includes all fsync'd data; a graceful
// one records its end). So a clean result is a correct compaction of [log start, cleanEnd)
// whoever wrote it and whenever, a zombie included, and cleanEnd is at or below the start of
// every later epoch's segments. What must be safe is the atomicity of a clean set (never a mix:
// a mix can resurrect a key whose tombstone was dropped, or strand the records of a transaction
// whose marker was dropped) and the deletions. Hence:
//
//   - Every clean rewrites the whole prefix [log start, cleanEnd), one file per group, and the
//     manifest is the commit point: a set is used whole or not at all.
//   - A clean whose cleanEnd is below the current winner's is skipped.
//   - The loader (readPartitionView) takes as winner the highest (epoch, seq) manifest of a
//     valid epoch below its own whose files all exist, except those wholly below the durable log
//     start (retention removes from the front, and in cluster mode it checkpoints the log start
//     before it deletes a cleaned file). If the highest is incomplete it falls back to the next.
//     Bases below the winner's cleanEnd come from the winner; every original there (and every
//     other manifest's file) is ignored. Bases at or above it follow the epoch chain.
//   - Deletions: a manifest's files are deleted only (a) by the writer of a newer manifest after
//     that one is durable, (b) by a loader whose winner is newer (after its takeover), or
//     (c) by retention from the front. None of these can remove the highest complete manifest's
//     files above the log start: (a) and (b) delete only what is older than a complete manifest
//     that exists, and (c) only below the log start. So a complete winner always exists once one
//     manifest was written, and it never needs an original below its cleanEnd. A loader also
//     deletes cleaned files that no manifest names (a clean that crashed before its manifest):
//     if a zombie writes that manifest afterwards, it is incomplete and loses to the next one.
//
// One clean at epoch E (cleanCommitCluster):
//
//	rewrite each group into <first base>-<E>.c<seq>.* ─► fsync each ─► dir fsync ─► mu: still
//	leader at E, not released, sources still listed, Rule P ─► manifest clean-E-seq.json
//	(atomic) ─► publish the new list, drop removed aborts ─► unlock ─► Rule P ─► delete every
//	group's sources (previous winner's files, originals below cleanEnd; ENOENT is fine) ─►
//	delete the previous manifest
//
//	crash before the manifest: old set (the new files are orphans; the next loader deletes them)
//	crash after it:            new set (the sources left are ignored below cleanEnd and deleted)
//
// Release racing a clean: the manifest is written under Partition.mu after checking that the
// partition is neither closed nor released, and Release closes it under mu, so a manifest is
// either written before the release (the successor's listing, made after the release, sees it)
// or never. Release then waits for the clean to finish its deletions (Partition.cleanMu), which
// shutdown's closing of p.stop cuts short while it is still reading.

var (
	cleanerClusterCleansTotal = metrics.NewCounter("kaas_cleaner_cluster_manifests_total")
	cleanerClusterSkipsTotal  = metrics.NewCounter("kaas_cleaner_cluster_skipped_total")
	cleanerClusterGCFiles     = metrics.NewCounter("kaas_cleaner_cluster_gc_files_total")
)

// cleanManifest is clean-<Epoch>-<Seq>.json.
type cleanManifest struct {
	Epoch    int32       `json:"epoch"`
	Seq      int64       `json:"seq"`
	CleanEnd int64       `json:"cleanEnd"`
	Files    []cleanFile `json:"files"`
}

// cleanFile is one cleaned segment (a group) of a manifest: its base offset (its first source's),
// .log file name, the offset after it (its last source's end, the next segment's base) and its
// size in bytes.
type cleanFile struct {
	Base int64  `json:"base"`
	Name string `json:"name"`
	Next int64  `json:"next"`
	Size int64  `json:"size"`
}

func (m *cleanManifest) name() string { return cleanManifestName(m.Epoch, m.Seq) }

// newer orders manifests by (epoch, seq).
func (m *cleanManifest) newer(o *cleanManifest) bool {
	if m.Epoch != o.Epoch {
		return m.Epoch > o.Epoch
	}
	return m.Seq > o.Seq
}

func cleanManifestName(e int32, seq int64) string { return fmt.Sprintf("clean-%d-%d.json", e, seq) }

// parseCleanManifestName returns (E, seq) for "clean-<E>-<seq>.json".
func parseCleanManifestName(name string) (int32, int64, bool) {
	s, ok := strings.CutPrefix(name, "clean-")
	if !ok {
		return 0, 0, false
	}
	if s, ok = strings.CutSuffix(s, ".json"); !ok {
		return 0, 0, false
	}
	es, ss, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, false
	}
	e, err1 := strconv.ParseInt(es, 10, 32)
	seq, err2 := strconv.ParseInt(ss, 10, 64)
	if err1 != nil || err2 != nil || e < 0 || seq < 0 || strconv.FormatInt(e, 10) != es || strconv.FormatInt(seq, 10) != ss {
		return 0, 0, false
	}
	return int32(e), seq, true
}

// cleanedStem is the file name without extension of a cleaned segment of epoch e's clean seq.
func cleanedStem(base int64, e int32, seq int64) string {
	return fmt.Sprintf("%020d-%010d.c%010d", base, e, seq)
}

// parseCleanedName parses "<base>-<E>.c<seq><ext>" for ext one of cleanedExts.
func parseCleanedName(name string) (e int32, seq int64, ok bool) {
	stem, c, found := strings.Cut(name, ".c")
	if !found {
		return 0, 0, false
	}
	_, e, ok = parseEpochName(stem+".log", ".log")
	if !ok || e < 0 {
		return 0, 0, false
	}
	for _, ext := range cleanedExts {
		if s, ok := strings.CutSuffix(c, ext); ok {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 || len(s) != 10 {
				return 0, 0, false
			}
			return e, n, true
		}
	}
	return 0, 0, false
}

// readCleanManifests reads every manifest in names (a fresh listing of dir), newest first.
func readCleanManifests(dir string, names []string) ([]*cleanManifest, error) {
	var out []*cleanManifest
	for _, n := range names {
		e, seq, ok := parseCleanManifestName(n)
		if !ok {
			continue
		}
		buf, err := os.ReadFile(filepath.Join(dir, n))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted since the listing by a newer manifest's writer
		}
		if err != nil {
			return nil, fmt.Errorf("cannot read clean manifest (%s): %w", filepath.Join(dir, n), err)
		}
		var m cleanManifest
		if err := json.Unmarshal(buf, &m); err != nil || m.Epoch != e || m.Seq != seq {
			// Written tmp + fsync + rename: never partial. A bad one is foreign damage.
			return nil, fmt.Errorf("cannot parse clean manifest (%s): bad content", filepath.Join(dir, n))
		}
		out = append(out, &m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].newer(out[j]) })
	return out, nil
}

// cleanWinner picks the manifest a taker at epoch uses (see the top of this file): the newest of
// a valid epoch below epoch whose files exist, except those wholly below logStart.
func cleanWinner(ms []*cleanManifest, valid func(int32) bool, epoch int32, logStart int64, exists map[string]bool) *cleanManifest {
	for _, m := range ms {
		if m.Epoch >= epoch || !valid(m.Epoch) {
			continue
		}
		complete := true
		for _, f := range m.Files {
			if f.Next > logStart && !exists[f.Name] {
				complete = false
				break
			}
		}
		if complete {
			return m
		}
	}
	return nil
}

// readLogStartFloor is the durable log start of dir (-1: none).
func readLogStartFloor(dir string) int64 {
	buf, err := os.ReadFile(filepath.Join(dir, logStartFile))
	if err != nil {
		return -1
	}
	off, err := decodeLogStart(buf)
	if err != nil {
		return -1
	}
	return off
}

// applyCleanWinner replaces the view's segments below the winner's cleanEnd by the winner's
// files (readPartitionView).
func (v *partitionView) applyCleanWinner(w *cleanManifest, exists map[string]bool) {
	v.clean = w
	if w == nil {
		return
	}
	var segs []segFile
	for i := range w.Files {
		f := &w.Files[i]
		if !exists[f.Name] {
			continue // below the log start: retention removed it
		}
		segs = append(segs, segFile{base: f.Base, nameEpoch: w.Epoch, epoch: w.Epoch, name: f.Name, capEnd: -1, clean: f})
	}
	for _, sf := range v.segs {
		if sf.base >= w.CleanEnd {
			segs = append(segs, sf)
		}
	}
	v.segs = segs
}

// openCleanedSegment loads a cleaned segment of the view (recoverTakeover): its size and end
// come from the manifest, its indexes from its files or a scan (it has offset gaps).
func (p *Partition) openCleanedSegment(seg *segment, f *cleanFile) ([]AbortedTxn, bool, int64, error) {
	seg.stem = strings.TrimSuffix(f.Name, ".log")
	ents, txnOK := seg.loadTxnIndex(f.Next)
	if seg.loadIndexes(f.Size, f.Next) {
		return ents, txnOK, 0, nil
	}
	n, err := seg.scanRange(p.interval, f.Size, true)
	if err != nil {
		return nil, false, n, err
	}
	if seg.size.Load() != f.Size {
		return nil, false, n, fmt.Errorf("cleaned segment %s holds valid batches up to byte %d, its manifest says %d", f.Name, seg.size.Load(), f.Size)
	}
	seg.mu.Lock()
	seg.next = f.Next
	seg.mu.Unlock()
	return ents, txnOK, n, nil
}

// cleanCommitCluster commits a cluster-mode clean (the diagram at the top of this file): out
// are the rewritten segments, already fsync'd under their own names, cleanEnd the offset after
// the last. Only the manifest write and the list swap run under the append mutex.
func (p *Partition) cleanCommitCluster(out []*cleaned, droppedAborts map[int64]bool, seq, cleanEnd int64) error {
	crash := func(step string) bool { return cleanerCrashAt != nil && cleanerCrashAt(step) }
	if len(out) == 0 {
		return nil
	}
	if crash("cluster-before-dir-sync") {
		return errCrashInjected
	}
	if err := SyncDir(p.dir); err != nil {
		return fmt.Errorf("cannot fsync partition dir: %w", err)
	}
	epoch := p.nameEpoch
	m := &cleanManifest{Epoch: epoch, Seq: seq, CleanEnd: cleanEnd}
	for _, c := range out {
		next, _, _ := c.seg.stats()
		m.Files = append(m.Files, cleanFile{Base: c.seg.base, Name: c.seg.name(".log"), Next: next, Size: c.seg.size.Load()})
	}
	buf, err := json.Marshal(m)
	if err != nil {
		return err
	}
	s := p.topic.store
	p.mu.Lock()
	p.waitRollLocked()
	cur := *p.segs.Load()
	prev := p.cleanWinner
	switch {
	case p.closed || p.released.Load() || p.leaderEpoch.Load() != epoch || !segmentsPresent(cur, out):
		p.mu.Unlock()
		return errCleanAborted
	case prev != nil && cleanEnd < prev.CleanEnd:
		p.mu.Unlock()
		cleanerClusterSkipsTotal.Inc()
		return errCleanAborted
	}
	if crash("cluster-before-manifest") {
		p.mu.Unlock()
		return errCrashInjected
	}
	// Rule P: the cleaned files are durable; the manifest publishes them.
	if !s.publishOK() {
		p.mu.Unlock()
		return fmt.Errorf("cannot commit clean (%s-%d, epoch %d): %w", p.topic.Name, p.id, epoch, ErrFenced)
	}
	if err := writeFileAtomicTmp(p.dir, m.name(), m.name()+s.tmpSuffix(), buf); err != nil {
		p.mu.Unlock()
		// The manifest is not there (a failed rename leaves the old directory entry, i.e.
		// none): the files are orphans, deleted by the caller or the next loader.
		return fmt.Errorf("cannot write clean manifest (%s): %w", m.name(), err)
	}
	cleanerClusterCleansTotal.Inc()
	crashed := crash("cluster-after-manifest")
	if !crashed {
		next := withCleaned(cur, out)
		p.segs.Store(&next)
		p.dropAbortsLocked(droppedAborts)
		p.cleanWinner = m
		p.cleanedTo.Store(cleanEnd)
	}
	p.mu.Unlock()
	if crashed {
		return errCrashInjected
	}
	closeSources(p, out)
	// A zombie (lease gone) deletes nothing: its sources may be what its successor reads.
	if !s.publishOK() {
		return nil
	}
	for i, c := range out {
		if i == len(out)/2 && crash("cluster-mid-deletes") {
			return errCrashInjected
		}
		for _, o := range c.olds {
			p.removeSegmentFiles(o)
		}
	}
	if prev != nil {
		for _, f := range prev.Files {
			if f.Base < cleanEnd { // normally every one, as a source above; retention took the rest
				p.removeFiles(strings.TrimSuffix(f.Name, ".log"))
			}
		}
		if err := os.Remove(filepath.Join(p.dir, prev.name())); err != nil && !os.IsNotExist(err) {
			p.log.Warn("cannot delete superseded clean manifest", zap.String("manifest", prev.name()), zap.Error(err))
		}
	}
	_ = SyncDir(p.dir)
	return nil
}

// dropAbortsLocked removes the aborted-index entries of the ABORT markers a clean removed
// (under mu).
func (p *Partition) dropAbortsLocked(droppedAborts map[int64]bool) {
	if len(droppedAborts) == 0 {
		return
	}
	p.txn.mu.Lock()
	kept := p.txn.aborted[:0:0]
	var span int64
	for _, a := range p.txn.aborted {
		if !droppedAborts[a.LastOffset] {
			kept = append(kept, a)
			span = max(span, a.LastOffset-a.FirstOffset)
		}
	}
	p.txn.aborted, p.txn.maxSpan = kept, span
	p.txn.mu.Unlock()
}

// removeSegmentFiles deletes a segment's files, best effort (ENOENT is fine).
func (p *Partition) removeSegmentFiles(s *segment) {
	p.removeFiles(s.name(""))
}

func (p *Partition) removeFiles(stem string) {
	for _, ext := range append(cleanedExts, ".ckpt") {
		if err := os.Remove(filepath.Join(p.dir, stem+ext)); err != nil && !os.IsNotExist(err) {
			p.log.Warn("cannot delete segment file", zap.String("file", stem+ext), zap.Error(err))
		} else if err == nil {
			cleanerClusterGCFiles.Inc()
		}
	}
}

// gcCleanLeftovers (after a completed takeover at epoch, best effort) deletes what the winner
// makes unreachable: the files and manifests of older manifests, cleaned files no manifest
// names, and original segment files below the winner's cleanEnd. Only files of epochs below
// epoch are touched; none of them is read by this partition or by any later loader (see the
// deletion argument at the top of this file).
func (p *Partition) gcCleanLeftovers(epoch int32, w *cleanManifest, ms []*cleanManifest) {
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return
	}
	type key struct {
		e   int32
		seq int64
	}
	live := map[key]bool{}
	for _, m := range ms {
		if w == nil || !w.newer(m) {
			live[key{m.Epoch, m.Seq}] = true // the winner, and anything newer (incomplete or not valid: left alone)
		}
	}
	for _, m := range ms {
		if w != nil && w.newer(m) {
			if err := os.Remove(filepath.Join(p.dir, m.name())); err == nil {
				cleanerClusterGCFiles.Inc()
			}
		}
	}
	removed := 0
	for _, de := range ents {
		name := de.Name()
		if e, seq, ok := parseCleanedName(name); ok {
			if e < epoch && !live[key{e, seq}] {
				if os.Remove(filepath.Join(p.dir, name)) == nil {
					removed++
				}
			}
			continue
		}
		if w == nil {
			continue
		}
		for _, ext := range append(cleanedExts, ".ckpt") {
			if base, ne, ok := parseEpochName(name, ext); ok && max(ne, 0) < epoch && base < w.CleanEnd {
				if os.Remove(filepath.Join(p.dir, name)) == nil {
					removed++
				}
				break
			}
		}
	}
	if removed > 0 {
		cleanerClusterGCFiles.Add(removed)
		_ = SyncDir(p.dir)
	}
}
