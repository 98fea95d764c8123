package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage/crashfs"
)

// compactConfigs is the compacted topic of the cluster cleaner tests (compactTopic's configs).
func compactConfigs() map[string]string {
	return map[string]string{"cleanup.policy": "compact", "segment.bytes": "2048",
		"delete.retention.ms": fmt.Sprint(cleanerTestTopicDeleteRetention), "min.cleanable.dirty.ratio": "0.01"}
}

// mergeModel is what a read_committed reader sees after later's workload followed earlier's.
func mergeModel(earlier, later *compactModel) *compactModel {
	m := &compactModel{latest: map[string][]byte{}, seqs: map[int64]int32{}}
	for k, v := range earlier.latest {
		m.latest[k] = v
	}
	for k, v := range later.latest {
		m.latest[k] = v
	}
	return m
}

// clusterChain is a partition written by leaders at epochs 0 (single broker), 1 (crashed, its
// open segment capped by epoch 2) and 2 (released gracefully), now led at epoch 3 on host c.
type clusterChain struct {
	dir   string
	cfs   *crashfs.FS
	model *compactModel
	s     *Store // epoch 3's store
	p     *Partition
	alive *atomic.Bool // epoch 3's Publish (lease)
}

func buildCleanChain(t *testing.T, steps int) *clusterChain {
	t.Helper()
	ch := &clusterChain{dir: t.TempDir(), cfs: crashfs.New(), alive: new(atomic.Bool)}
	ch.alive.Store(true)
	// Epoch 0: single-broker data.
	s0 := openStore(t, ch.dir, withWAL)
	if _, err := s0.EnsureTopic("t", clusterTopicID, 1, compactConfigs()); err != nil {
		t.Fatal(err)
	}
	m := runCompactWorkloadPIDs(t, s0.Topic("t").Partition(0), 11, steps, 0)
	if err := s0.Close(); err != nil {
		t.Fatal(err)
	}
	// Epoch 1 crashes with its open segment on the volume (capped by epoch 2's scan).
	a := openClusterStore(t, ch.dir, 1, "a1", hostFS{ch.cfs.Host("a")})
	pa, _ := takeOver(t, a, 1, Handover{})
	m = mergeModel(m, runCompactWorkloadPIDs(t, pa, 12, steps, 10))
	if err := pa.checkpointSync(); err != nil {
		t.Fatal(err)
	}
	ch.cfs.Crash("a")
	crash(a)
	// Epoch 2 releases gracefully.
	b := openClusterStore(t, ch.dir, 2, "b1", hostFS{ch.cfs.Host("b")})
	pb, _ := takeOver(t, b, 2, Handover{PrevWALDir: clusterWALDir(ch.dir, 1, "a1"), PrevInc: "a1", PrevEpoch: 1})
	m = mergeModel(m, runCompactWorkloadPIDs(t, pb, 13, steps, 20))
	rec, err := b.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Epoch 3 leads on host c.
	ch.s = openClusterStore(t, ch.dir, 3, "c1", hostFS{ch.cfs.Host("c")}, func(c *Config) { c.Publish = ch.alive.Load })
	ch.p, _ = takeOver(t, ch.s, 3, Handover{Release: &rec})
	ch.model = mergeModel(m, runCompactWorkloadPIDs(t, ch.p, 14, steps, 30))
	sameLive(t, "epoch 3 before cleaning", mustView(t, ch.p), ch.model.latest)
	return ch
}

func (ch *clusterChain) partDir() string { return filepath.Join(ch.dir, "topics", "t", "0") }

func mustView(t *testing.T, p *Partition) map[string][]byte {
	t.Helper()
	v, _, _ := committedView(t, p, 0)
	return v
}

// recordsByOffset maps every record's offset to its key and value ("" value: tombstone).
func recordsByOffset(t *testing.T, p *Partition) map[int64]string {
	t.Helper()
	out := map[int64]string{}
	for _, b := range readAll(t, p, p.LogStartOffset()) {
		if b.IsControl() {
			out[b.BaseOffset()] = fmt.Sprintf("marker %d", codec.ControlType(b))
			continue
		}
		if err := walkRecords(b, func(r *rawRecord) error {
			v := "<tombstone>"
			if !r.tombstone {
				v = string(recordValue(t, r))
			}
			out[b.BaseOffset()+r.offDelta] = string(r.key) + "=" + v
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// checkOffsetsKept: every record p holds is at the offset it had before any clean.
func checkOffsetsKept(t *testing.T, what string, p *Partition, before map[int64]string) {
	t.Helper()
	after := recordsByOffset(t, p)
	if len(after) == 0 {
		t.Fatalf("%s: no records", what)
	}
	for o, r := range after {
		if before[o] != r {
			t.Fatalf("%s: offset %d holds %q, before the clean %q", what, o, r, before[o])
		}
	}
}

// checkAbortedIndex: the aborted index has no duplicate and names only transactions that were
// aborted before the clean, and every aborted-transaction record left is covered by it.
func checkAbortedIndex(t *testing.T, what string, p *Partition, before []AbortedTxn) {
	t.Helper()
	known := map[AbortedTxn]bool{}
	for _, a := range before {
		known[a] = true
	}
	seen := map[AbortedTxn]bool{}
	for _, a := range p.AbortedTransactions(0, p.LogEndOffset()) {
		if seen[a] || !known[a] {
			t.Fatalf("%s: aborted index entry %+v duplicated (%v) or unknown", what, a, seen[a])
		}
		seen[a] = true
	}
	// Every ABORT marker left in the log is in the index (a consumer needs it to drop records).
	for _, b := range readAll(t, p, p.LogStartOffset()) {
		if b.IsControl() && codec.ControlType(b) == codec.ControlAbort {
			found := false
			for a := range seen {
				if a.LastOffset == b.BaseOffset() && a.ProducerID == b.ProducerID() {
					found = true
				}
			}
			if !found {
				t.Fatalf("%s: ABORT marker at %d has no aborted index entry", what, b.BaseOffset())
			}
		}
	}
}

// cleanedSegs returns the (epoch, seq) of every cleaned segment in p's list and the bases of
// the original segments below end.
func cleanedSegs(p *Partition, end int64) (sets map[string]int, originalsBelow []int64) {
	sets = map[string]int{}
	for _, s := range *p.segs.Load() {
		if s.stem != "" {
			sets[s.stem[strings.IndexByte(s.stem, '-')+1:]]++
		} else if s.base < end {
			originalsBelow = append(originalsBelow, s.base)
		}
	}
	return sets, originalsBelow
}

// checkFilesMatchList: every .log file in dir is in p's segment list and vice versa, except
// an empty original segment: a taker leaves an empty last segment of the previous epoch on
// disk, out of its list (its own starts at the same offset).
func checkFilesMatchList(t *testing.T, what, dir string, p *Partition) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	list := map[string]bool{}
	var names []string
	for _, s := range *p.segs.Load() {
		list[s.name(".log")] = true
		names = append(names, s.name(".log"))
	}
	onDisk := map[string]bool{}
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".log") {
			continue
		}
		onDisk[n] = true
		if list[n] {
			continue
		}
		if _, _, cleaned := parseCleanedName(n); !cleaned {
			if fi, err := e.Info(); err == nil && fi.Size() == 0 {
				continue
			}
		}
		t.Fatalf("%s: %s is on the volume and not in the segment list %v", what, n, names)
	}
	for n := range list {
		if !onDisk[n] {
			t.Fatalf("%s: %s is in the segment list and not on the volume", what, n)
		}
	}
}

// segBases are the base offsets of p's segments.
func segBases(p *Partition) []int64 {
	var out []int64
	for _, sg := range *p.segs.Load() {
		out = append(out, sg.base)
	}
	return out
}

// checkGroupedManifest: m's files are groups of the sources (whose bases were sources before the
// clean): each file starts at a source's base, they are contiguous up to the clean end, each is
// within segment.bytes (2048 here), and there are fewer of them than sources below the clean
// end, so at least one file covers several old bases.
func checkGroupedManifest(t *testing.T, what string, m *cleanManifest, sources []int64) {
	t.Helper()
	if m == nil || len(m.Files) == 0 {
		t.Fatalf("%s: no clean manifest", what)
	}
	n := 0
	for _, b := range sources {
		if b >= m.Files[0].Base && b < m.CleanEnd {
			n++
		}
	}
	for i, f := range m.Files {
		if !slices.Contains(sources, f.Base) || f.Size > 2048 || f.Next <= f.Base && f.Size > 0 {
			t.Fatalf("%s: manifest file %+v (sources %v)", what, f, sources)
		}
		if i+1 < len(m.Files) && f.Next != m.Files[i+1].Base {
			t.Fatalf("%s: manifest file %s ends at %d, the next begins at %d", what, f.Name, f.Next, m.Files[i+1].Base)
		}
	}
	if last := m.Files[len(m.Files)-1]; last.Next != m.CleanEnd {
		t.Fatalf("%s: the last manifest file ends at %d, the clean at %d", what, last.Next, m.CleanEnd)
	}
	if len(m.Files) >= n {
		t.Fatalf("%s: %d manifest files for %d sources: nothing grouped", what, len(m.Files), n)
	}
}

func manifestsIn(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if _, _, ok := parseCleanManifestName(e.Name()); ok {
			out = append(out, e.Name())
		}
	}
	return out
}

func tombstonesBelow(t *testing.T, p *Partition, to int64) int {
	t.Helper()
	n := 0
	for _, b := range readAll(t, p, p.LogStartOffset()) {
		if b.BaseOffset() >= to || b.IsControl() {
			continue
		}
		_ = walkRecords(b, func(r *rawRecord) error {
			if r.tombstone {
				n++
			}
			return nil
		})
	}
	return n
}

// TestClusterCleanerLeaderCleansEpochChain: the leader at epoch 3 cleans a partition written by
// epochs 0, 1 (crashed, capped open segment) and 2; a takeover at epoch 4 on another host reads
// exactly the latest committed value per key, with offsets, LSO and aborted index right; it
// cleans further, tombstones go after delete.retention.ms, and epoch 5 reads the same.
func TestClusterCleanerLeaderCleansEpochChain(t *testing.T) {
	ch := buildCleanChain(t, 150)
	pc := ch.p
	sources := segBases(pc)
	before := recordsByOffset(t, pc)
	abortedBefore := pc.AbortedTransactions(0, pc.LogEndOffset())
	lso := pc.LastStableOffset()
	if err := ch.s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	end := pc.FirstDirtyOffset()
	if end == 0 {
		t.Fatal("nothing cleaned")
	}
	if sets, orig := cleanedSegs(pc, end); len(sets) != 1 || len(orig) != 0 {
		t.Fatalf("after the clean: cleaned sets %v, originals below clean end %d: %v", sets, end, orig)
	}
	if got := manifestsIn(t, ch.partDir()); len(got) != 1 || got[0] != cleanManifestName(3, 1) {
		t.Fatalf("manifests %v, want clean-3-1.json", got)
	}
	// Grouped across the epochs' segments: a file covers several old bases, and every consumer
	// of the manifest below (the takers' loader, their GC, FirstDirtyOffset) handles that.
	checkGroupedManifest(t, "epoch 3's clean", pc.cleanWinner, sources)
	// The leader deleted its sources: every .log file on the volume is in its list, except the
	// earlier epochs' segments at or above clean end (the chain above it).
	checkFilesMatchList(t, "files", ch.partDir(), pc)
	view, occ, _ := committedView(t, pc, end)
	sameLive(t, "epoch 3 after the clean", view, ch.model.latest)
	for k, n := range occ {
		if n > 1 {
			t.Fatalf("key %s occurs %d times in the cleaned range", k, n)
		}
	}
	checkOffsetsKept(t, "epoch 3", pc, before)
	checkAbortedIndex(t, "epoch 3", pc, abortedBefore)
	if pc.LastStableOffset() != lso {
		t.Fatalf("LSO %d after the clean, was %d", pc.LastStableOffset(), lso)
	}
	ch.cfs.Crash("c")
	crash(ch.s)

	d := openClusterStore(t, ch.dir, 4, "d1", hostFS{ch.cfs.Host("d")})
	pd, _ := takeOver(t, d, 4, Handover{PrevWALDir: clusterWALDir(ch.dir, 3, "c1"), PrevInc: "c1", PrevEpoch: 3})
	if pd.FirstDirtyOffset() != end {
		t.Fatalf("epoch 4: first dirty offset %d, want the manifest's clean end %d", pd.FirstDirtyOffset(), end)
	}
	sameLive(t, "epoch 4", mustView(t, pd), ch.model.latest)
	if got, want := segmentsBelow(pd, end), len(pc.cleanWinner.Files); got != want {
		t.Fatalf("epoch 4 holds %d segments below clean end, the manifest %d files", got, want)
	}
	checkOffsetsKept(t, "epoch 4", pd, before)
	checkAbortedIndex(t, "epoch 4", pd, abortedBefore)
	if pd.LastStableOffset() != lso || pd.LogEndOffset() != lso {
		t.Fatalf("epoch 4: LSO %d, LEO %d, want %d", pd.LastStableOffset(), pd.LogEndOffset(), lso)
	}
	hadTombs := tombstonesBelow(t, pd, end)
	if hadTombs == 0 {
		t.Fatal("workload left no tombstone in the cleaned range")
	}
	// Epoch 4 cleans on: within delete.retention.ms the tombstones stay, then they go.
	if err := d.RunCleaner(cleanerT0.Add(cleanerTestTopicDeleteRetention * time.Millisecond / 2)); err != nil {
		t.Fatal(err)
	}
	if n := tombstonesBelow(t, pd, end); n != hadTombs {
		t.Fatalf("%d tombstones before delete.retention.ms, want %d", n, hadTombs)
	}
	m4 := runCompactWorkloadPIDs(t, pd, 15, 60, 40)
	model := mergeModel(ch.model, m4)
	sources4 := segBases(pd)
	before4 := recordsByOffset(t, pd)
	for o, r := range before {
		if _, ok := before4[o]; !ok {
			before4[o] = r // removed by epoch 3's clean: never back
		}
	}
	for i := 1; i <= 3; i++ {
		if err := d.RunCleaner(cleanerT0.Add(time.Duration(i) * (cleanerTestTopicDeleteRetention + 1) * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	end4 := pd.FirstDirtyOffset()
	if n := tombstonesBelow(t, pd, end4); n != 0 {
		t.Fatalf("%d tombstones left after delete.retention.ms", n)
	}
	sameLive(t, "epoch 4 after its cleans", mustView(t, pd), model.latest)
	if got := manifestsIn(t, ch.partDir()); len(got) != 1 || got[0] != cleanManifestName(4, 4) {
		t.Fatalf("manifests %v, want only clean-4-4.json", got)
	}
	checkGroupedManifest(t, "epoch 4's cleans", pd.cleanWinner, sources4)
	checkFilesMatchList(t, "epoch 4's files", ch.partDir(), pd)
	aborted4 := pd.AbortedTransactions(0, pd.LogEndOffset())
	checkAbortedIndex(t, "epoch 4", pd, append(abortedBefore, aborted4...))
	lso4 := pd.LastStableOffset()
	rec, err := d.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()

	e := openClusterStore(t, ch.dir, 5, "e1", hostFS{ch.cfs.Host("e")})
	defer e.Close()
	pe, st := takeOver(t, e, 5, Handover{Release: &rec})
	if st.Scanned != 0 {
		t.Fatalf("graceful takeover scanned %d bytes (cleaned segments' indexes not used?)", st.Scanned)
	}
	sameLive(t, "epoch 5", mustView(t, pe), model.latest)
	checkOffsetsKept(t, "epoch 5", pe, before4)
	if pe.LastStableOffset() != lso4 || pe.FirstDirtyOffset() != end4 {
		t.Fatalf("epoch 5: LSO %d (want %d), first dirty %d (want %d)", pe.LastStableOffset(), lso4, pe.FirstDirtyOffset(), end4)
	}
	// The aborted index is epoch 4's (no entry of a removed ABORT marker comes back from the
	// originals' files), and it matches the markers left.
	if got := pe.AbortedTransactions(0, pe.LogEndOffset()); fmt.Sprint(got) != fmt.Sprint(aborted4) {
		t.Fatalf("epoch 5 aborted index %v, epoch 4 had %v", got, aborted4)
	}
	checkAbortedIndex(t, "epoch 5", pe, aborted4)
	if len(aborted4) >= len(abortedBefore) {
		t.Fatalf("the cleans removed no ABORT marker: %d entries, %d before", len(aborted4), len(abortedBefore))
	}
	// Idempotence across the cleans: a producer's next sequence is accepted.
	if seq := m4.seqs[49]; seq > 0 {
		if r := pe.Append(makeKeyed(t, 49, 0, seq, false, 9000, []kv{{"k00", []byte("x")}}), 0); r.Code != codec.CodeNone || r.Duplicate {
			t.Fatalf("append after the cleans: %+v", r)
		}
	}
}

// cleanChainSteps are the crash points of a cluster clean, in order.
var cleanChainSteps = []string{"cluster-files-written", "cluster-before-dir-sync", "cluster-before-manifest",
	"cluster-after-manifest", "cluster-mid-deletes"}

// TestClusterCleanerCrashAtEachStep: a crash of the cleaning host at each step leaves the next
// taker the old set (before the manifest) or the new one (after it), never a mix, with no
// loss; the leftovers are deleted and the next leader cleans again.
func TestClusterCleanerCrashAtEachStep(t *testing.T) {
	for i, step := range cleanChainSteps {
		t.Run(step, func(t *testing.T) {
			ch := buildCleanChain(t, 80)
			before := recordsByOffset(t, ch.p)
			sources := segBases(ch.p)
			cleanerCrashAt = func(at string) bool { return at == step }
			err := ch.s.RunCleaner(cleanerT0)
			cleanerCrashAt = nil
			if !errors.Is(err, errCrashInjected) {
				t.Fatalf("clean: %v, want the injected crash", err)
			}
			ch.cfs.Crash("c")
			crash(ch.s)

			d := openClusterStore(t, ch.dir, 4, "d1", hostFS{ch.cfs.Host("d")})
			defer d.Close()
			pd, _ := takeOver(t, d, 4, Handover{PrevWALDir: clusterWALDir(ch.dir, 3, "c1"), PrevInc: "c1", PrevEpoch: 3})
			committed := i >= 3
			end := pd.FirstDirtyOffset()
			sets, orig := cleanedSegs(pd, end)
			switch {
			case committed && (end == 0 || len(sets) != 1 || len(orig) != 0 || sets[fmt.Sprintf("%010d.c%010d", 3, 1)] == 0):
				t.Fatalf("after a crash at %s: clean end %d, cleaned sets %v, originals below %v: want the new set", step, end, sets, orig)
			case !committed && (end != 0 || len(sets) != 0):
				t.Fatalf("after a crash at %s: clean end %d, cleaned sets %v: want the old set", step, end, sets)
			}
			if committed {
				// The new set is grouped; a crash amid the deletions left some merged sources,
				// which the taker ignores below clean end and deletes (checkFilesMatchList).
				checkGroupedManifest(t, "the crashed clean", pd.cleanWinner, sources)
			} else if got := segBases(pd); len(got) < len(sources) || !slices.Equal(got[:len(sources)-1], sources[:len(sources)-1]) {
				t.Fatalf("old set: segments %v, before the clean %v", got, sources)
			}
			sameLive(t, "after the crash", mustView(t, pd), ch.model.latest)
			checkOffsetsKept(t, "after the crash", pd, before)
			// Leftovers: orphans of an uncommitted clean, or the sources a committed one had not
			// deleted yet, are gone after the takeover.
			checkFilesMatchList(t, "files", ch.partDir(), pd)
			if err := d.RunCleaner(cleanerT0); err != nil {
				t.Fatal(err)
			}
			sameLive(t, "after a clean following the crash", mustView(t, pd), ch.model.latest)
			if got := manifestsIn(t, ch.partDir()); len(got) != 1 || got[0] != cleanManifestName(4, 1) {
				t.Fatalf("manifests %v, want only clean-4-1.json", got)
			}
		})
	}
}

// TestClusterCleanerZombieCommitsAfterSuccessor: the epoch-3 leader's clean writes its manifest
// and deletes its sources after epoch 4 took over (in one variant epoch 4 cleaned meanwhile);
// epoch 4 keeps serving, and a takeover at epoch 5 is consistent and correct. In the last
// variant the zombie sees its lease gone (Rule P) before its manifest and commits nothing.
func TestClusterCleanerZombieCommitsAfterSuccessor(t *testing.T) {
	for _, tc := range []struct{ successorCleans, leaseGone bool }{{false, false}, {true, false}, {false, true}} {
		successorCleans := tc.successorCleans
		t.Run(fmt.Sprintf("successorCleans=%v,leaseGone=%v", successorCleans, tc.leaseGone), func(t *testing.T) {
			ch := buildCleanChain(t, 100)
			pc := ch.p
			sources := segBases(pc)
			resume, cleanDone := pauseClean(t, ch.s, pc)
			// c stops (SIGSTOP): it is declared dead, its unsynced writes are lost.
			ch.cfs.Crash("c")
			d := openClusterStore(t, ch.dir, 4, "d1", hostFS{ch.cfs.Host("d")})
			defer d.Close()
			pd, _ := takeOver(t, d, 4, Handover{PrevWALDir: clusterWALDir(ch.dir, 3, "c1"), PrevInc: "c1", PrevEpoch: 3})
			model := mergeModel(ch.model, runCompactWorkloadPIDs(t, pd, 21, 60, 40))
			if successorCleans {
				sources = segBases(pd)
				if err := d.RunCleaner(cleanerT0); err != nil {
					t.Fatal(err)
				}
			}
			// c resumes (SIGCONT) past its last lease check: its clean writes back, commits its
			// manifest and deletes its sources under epoch 4.
			ch.cfs.Zombie("c")
			if tc.leaseGone {
				ch.alive.Store(false)
			}
			close(resume)
			if err := <-cleanDone; err != nil {
				t.Fatalf("zombie clean: %v", err)
			}
			_, err := os.Stat(filepath.Join(ch.partDir(), cleanManifestName(3, 1)))
			switch {
			case tc.leaseGone && (err == nil || !ch.s.Fenced()):
				t.Fatalf("a zombie whose lease is gone committed a clean (fenced %v)", ch.s.Fenced())
			case !tc.leaseGone && err != nil:
				t.Fatalf("the zombie wrote no manifest: %v", err)
			}
			crash(ch.s)
			sameLive(t, "epoch 4 after the zombie's clean", mustView(t, pd), model.latest)
			ch.cfs.Crash("d")
			crash(d)

			e := openClusterStore(t, ch.dir, 5, "e1", hostFS{ch.cfs.Host("e")})
			defer e.Close()
			pe, _ := takeOver(t, e, 5, Handover{PrevWALDir: clusterWALDir(ch.dir, 4, "d1"), PrevInc: "d1", PrevEpoch: 4})
			sameLive(t, "epoch 5", mustView(t, pe), model.latest)
			checkLog := recordsByOffset(t, pe)
			if len(checkLog) == 0 {
				t.Fatal("epoch 5 reads nothing")
			}
			wantWinner := []string{cleanManifestName(3, 1)}
			switch {
			case successorCleans:
				wantWinner = []string{cleanManifestName(4, 1)}
			case tc.leaseGone:
				wantWinner = nil
			}
			if got := manifestsIn(t, ch.partDir()); fmt.Sprint(got) != fmt.Sprint(wantWinner) {
				t.Fatalf("manifests after epoch 5's takeover %v, want %v", got, wantWinner)
			}
			checkFilesMatchList(t, "files", ch.partDir(), pe)
			if wantWinner != nil {
				// The winner's grouped files, whoever wrote them, are what epoch 5 reads below
				// its clean end.
				checkGroupedManifest(t, "the winner", pe.cleanWinner, sources)
				if got := segmentsBelow(pe, pe.FirstDirtyOffset()); got != len(pe.cleanWinner.Files) {
					t.Fatalf("epoch 5 holds %d segments below clean end, the winner %d files", got, len(pe.cleanWinner.Files))
				}
			}
			sources5 := segBases(pe)
			if err := e.RunCleaner(cleanerT0); err != nil {
				t.Fatal(err)
			}
			sameLive(t, "epoch 5 after its clean", mustView(t, pe), model.latest)
			if tc.leaseGone {
				checkGroupedManifest(t, "epoch 5's clean (the first committed)", pe.cleanWinner, sources5)
			}
			checkGroupedSegments(t, "epoch 5 after its clean", pe, 2048)
		})
	}
}

// TestClusterCleanerRacingRelease: a Release during a clean's rewrite aborts it (no manifest,
// no file of it left when Release returns); a Release that arrives while the clean holds the
// append mutex before its manifest waits for it, and the successor sees the new set.
func TestClusterCleanerRacingRelease(t *testing.T) {
	t.Run("during-rewrite", func(t *testing.T) {
		ch := buildCleanChain(t, 80)
		pc := ch.p
		resume, cleanDone := pauseClean(t, ch.s, pc)
		type relRes struct {
			rec ReleaseRecord
			err error
		}
		relDone := make(chan relRes, 1)
		go func() {
			rec, err := ch.s.Release("t", 0)
			relDone <- relRes{rec, err}
		}()
		eventually(t, "the partition is closed by the release", func() bool { return !pc.Loaded() })
		close(resume)
		r := <-relDone
		if r.err != nil {
			t.Fatal(r.err)
		}
		// Release returned: nothing of the aborted clean is on the volume.
		ents, _ := os.ReadDir(ch.partDir())
		for _, e := range ents {
			if _, _, ok := parseCleanedName(e.Name()); ok {
				t.Fatalf("%s left on the volume after Release returned", e.Name())
			}
			if _, _, ok := parseCleanManifestName(e.Name()); ok {
				t.Fatalf("manifest %s written by a clean racing the release", e.Name())
			}
		}
		if err := <-cleanDone; err != nil {
			t.Fatalf("clean racing the release: %v (want it abandoned, not failed)", err)
		}
		ch.s.Close()
		d := openClusterStore(t, ch.dir, 4, "d1", hostFS{ch.cfs.Host("d")})
		defer d.Close()
		pd, st := takeOver(t, d, 4, Handover{Release: &r.rec})
		if st.Scanned != 0 || pd.FirstDirtyOffset() != 0 {
			t.Fatalf("graceful takeover scanned %d bytes, first dirty %d", st.Scanned, pd.FirstDirtyOffset())
		}
		sameLive(t, "after the release", mustView(t, pd), ch.model.latest)
	})
	t.Run("before-manifest", func(t *testing.T) {
		ch := buildCleanChain(t, 80)
		type relRes struct {
			rec ReleaseRecord
			err error
		}
		relDone := make(chan relRes, 1)
		cleanerCrashAt = func(at string) bool {
			if at == "cluster-before-manifest" {
				// The clean holds the append mutex: the release cannot close the partition
				// before the manifest is written.
				go func() {
					rec, err := ch.s.Release("t", 0)
					relDone <- relRes{rec, err}
				}()
			}
			return false
		}
		err := ch.s.RunCleaner(cleanerT0)
		cleanerCrashAt = nil
		if err != nil {
			t.Fatal(err)
		}
		r := <-relDone
		if r.err != nil {
			t.Fatal(r.err)
		}
		end := ch.p.FirstDirtyOffset()
		ch.s.Close()
		d := openClusterStore(t, ch.dir, 4, "d1", hostFS{ch.cfs.Host("d")})
		defer d.Close()
		pd, st := takeOver(t, d, 4, Handover{Release: &r.rec})
		if end == 0 || pd.FirstDirtyOffset() != end || st.Scanned != 0 {
			t.Fatalf("clean end %d, successor's first dirty %d, scanned %d", end, pd.FirstDirtyOffset(), st.Scanned)
		}
		sameLive(t, "after the release", mustView(t, pd), ch.model.latest)
	})
}

// TestClusterCleanerRepeatedTakeoversBoundFiles: cleans across several takeovers (crash and
// graceful in turn) leave one manifest and no file outside the leader's segment list, so the
// directory does not grow with the number of cleans.
func TestClusterCleanerRepeatedTakeoversBoundFiles(t *testing.T) {
	dir := t.TempDir()
	cfs := crashfs.New()
	var h Handover
	model := &compactModel{latest: map[string][]byte{}}
	var counts []int
	for epoch := int32(1); epoch <= 6; epoch++ {
		inc := fmt.Sprintf("i%d", epoch)
		s := openClusterStore(t, dir, epoch, inc, hostFS{cfs.Host(inc)})
		if epoch == 1 {
			if err := s.AlterTopicConfig("t", ptrMap(compactConfigs())); err != nil {
				t.Fatal(err)
			}
		}
		p, _ := takeOver(t, s, epoch, h)
		sameLive(t, fmt.Sprintf("epoch %d after its takeover", epoch), mustView(t, p), model.latest)
		model = mergeModel(model, runCompactWorkloadPIDs(t, p, uint64(30+epoch), 60, int64(epoch)*10))
		if err := s.RunCleaner(cleanerT0); err != nil {
			t.Fatal(err)
		}
		sameLive(t, fmt.Sprintf("epoch %d after its clean", epoch), mustView(t, p), model.latest)
		pdir := filepath.Join(dir, "topics", "t", "0")
		checkFilesMatchList(t, "files", pdir, p)
		if got := manifestsIn(t, pdir); len(got) != 1 || got[0] != cleanManifestName(epoch, 1) {
			t.Fatalf("epoch %d: manifests %v", epoch, got)
		}
		garbage, small := classifyPartitionFiles(t, pdir, p)
		if len(garbage) > 0 {
			t.Fatalf("epoch %d: files no reader needs: %v", epoch, garbage)
		}
		counts = append(counts, small)
		h = handOff(t, s, cfs, dir, epoch, inc, epoch%2 == 0)
	}
	// Per takeover only small per-epoch files accumulate (epoch-E.json, each epoch's two
	// producer snapshots, prev checkpoints of a crashed predecessor, an empty last segment):
	// none of them is a clean's.
	t.Logf("per-epoch small files after each clean: %v", counts)
	if last := counts[len(counts)-1]; last > 6*len(counts) {
		t.Fatalf("per-epoch files grow faster than the takeovers: %v", counts)
	}
}

// classifyPartitionFiles returns the files of dir that no reader of p's view needs (garbage),
// and how many small per-epoch files there are. Each segment in p's list may have its four
// files and a recovery checkpoint; one clean manifest; the rest are epoch files, snapshots,
// the log start checkpoint and empty original segments (the last one of a released epoch).
func classifyPartitionFiles(t *testing.T, dir string, p *Partition) (garbage []string, small int) {
	t.Helper()
	live := map[string]bool{}
	for _, s := range *p.segs.Load() {
		for _, ext := range append(cleanedExts, ".ckpt") {
			live[s.name(ext)] = true
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	manifests := 0
	for _, e := range ents {
		n := e.Name()
		_, _, isManifest := parseCleanManifestName(n)
		_, _, isSnap := parseEpochName(n, ".snapshot")
		_, _, isLog := parseEpochName(n, ".log")
		switch {
		case live[n]:
		case isManifest:
			manifests++
			if manifests > 1 {
				garbage = append(garbage, n)
			}
		case strings.HasPrefix(n, "epoch-") || isSnap || n == logStartFile:
			small++
		case isLog:
			if fi, err := e.Info(); err != nil || fi.Size() != 0 {
				garbage = append(garbage, n)
			} else {
				small++
			}
		default:
			garbage = append(garbage, n)
		}
	}
	return garbage, small
}

func ptrMap(m map[string]string) map[string]*string {
	out := make(map[string]*string, len(m))
	for k, v := range m {
		out[k] = ptr(v)
	}
	return out
}

// TestTakeOverOfCleanedSingleBrokerDataWithoutIndexes guards the takeover's rebuild scan of a
// closed segment: one cleaned by a single broker has offset gaps, and a scan that took the
// first gap for the end of the data ignored the rest of the segment.
func TestTakeOverOfCleanedSingleBrokerDataWithoutIndexes(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, withWAL)
	if _, err := s.EnsureTopic("t", clusterTopicID, 1, compactConfigs()); err != nil {
		t.Fatal(err)
	}
	p := s.Topic("t").Partition(0)
	m := runCompactWorkload(t, p, 5, 200)
	if err := s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	if p.FirstDirtyOffset() == 0 {
		t.Fatal("nothing cleaned")
	}
	pdir := p.dir
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(pdir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".index") {
			if err := os.Remove(filepath.Join(pdir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := openClusterStore(t, dir, 1, "c1", nil)
	defer c.Close()
	pc, _ := takeOver(t, c, 1, Handover{})
	sameLive(t, "after the takeover", mustView(t, pc), m.latest)
}

// TestClusterCleanerFallsBackFromIncompleteManifest: if the newest manifest misses a file above
// the log start (damage), the taker uses the next one, whose files its writer's successor had
// not deleted yet (a crash right after the newer manifest), and reads the committed model.
func TestClusterCleanerFallsBackFromIncompleteManifest(t *testing.T) {
	ch := buildCleanChain(t, 80)
	if err := ch.s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	end1 := ch.p.FirstDirtyOffset()
	m := mergeModel(ch.model, runCompactWorkloadPIDs(t, ch.p, 41, 60, 50))
	cleanerCrashAt = func(at string) bool { return at == "cluster-after-manifest" }
	err := ch.s.RunCleaner(cleanerT0)
	cleanerCrashAt = nil
	if !errors.Is(err, errCrashInjected) {
		t.Fatalf("clean: %v, want the injected crash", err)
	}
	ch.cfs.Crash("c")
	crash(ch.s)
	buf, err := os.ReadFile(filepath.Join(ch.partDir(), cleanManifestName(3, 2)))
	if err != nil {
		t.Fatal(err)
	}
	var newest cleanManifest
	if err := json.Unmarshal(buf, &newest); err != nil || len(newest.Files) < 3 || newest.CleanEnd <= end1 {
		t.Fatalf("second manifest %+v (%v), first clean end %d", newest, err, end1)
	}
	if err := os.Remove(filepath.Join(ch.partDir(), newest.Files[len(newest.Files)/2].Name)); err != nil {
		t.Fatal(err)
	}
	d := openClusterStore(t, ch.dir, 4, "d1", hostFS{ch.cfs.Host("d")})
	defer d.Close()
	pd, _ := takeOver(t, d, 4, Handover{PrevWALDir: clusterWALDir(ch.dir, 3, "c1"), PrevInc: "c1", PrevEpoch: 3})
	if pd.FirstDirtyOffset() != end1 {
		t.Fatalf("first dirty offset %d, want the first manifest's clean end %d", pd.FirstDirtyOffset(), end1)
	}
	if sets, orig := cleanedSegs(pd, end1); len(sets) != 1 || sets[fmt.Sprintf("%010d.c%010d", 3, 1)] == 0 || len(orig) != 0 {
		t.Fatalf("cleaned sets %v, originals below %d: %v", sets, end1, orig)
	}
	sameLive(t, "after the fallback", mustView(t, pd), m.latest)
}

// TestClusterCleanerRetentionRemovesCleanedPrefix: on a compact,delete topic retention deletes
// cleaned segments from the front; the log start is checkpointed first, so the next taker still
// takes the manifest (its missing files are below the log start) and reads what the leader had.
func TestClusterCleanerRetentionRemovesCleanedPrefix(t *testing.T) {
	dir := t.TempDir()
	cfs := crashfs.New()
	a := openClusterStore(t, dir, 1, "a1", hostFS{cfs.Host("a")})
	cfgs := compactConfigs()
	cfgs["cleanup.policy"] = "compact,delete"
	cfgs["retention.ms"] = "1000"
	if err := a.AlterTopicConfig("t", ptrMap(cfgs)); err != nil {
		t.Fatal(err)
	}
	pa, _ := takeOver(t, a, 1, Handover{})
	runCompactWorkloadPIDs(t, pa, 51, 300, 0)
	sourcesA := segBases(pa)
	if err := a.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	end := pa.FirstDirtyOffset()
	cleanedBefore, _ := cleanedSegs(pa, end)
	checkGroupedManifest(t, "the clean", pa.cleanWinner, sourcesA)
	// Segments whose records are older than 1000+150 ms (workload time) expire.
	pa.retain(time.UnixMilli(1000 + 150 + 1000))
	ls := pa.LogStartOffset()
	if ls == 0 || ls >= end {
		t.Fatalf("retention moved the log start to %d; the test wants it inside the cleaned range [0, %d)", ls, end)
	}
	if got := readLogStartFloor(pa.dir); got != ls {
		t.Fatalf("log start checkpoint %d, want %d before the cleaned files went", got, ls)
	}
	cleanedAfter, _ := cleanedSegs(pa, end)
	if fmt.Sprint(cleanedAfter) == fmt.Sprint(cleanedBefore) {
		t.Fatalf("retention removed no cleaned segment: %v", cleanedAfter)
	}
	want := recordsByOffset(t, pa)
	cfs.Crash("a")
	crash(a)

	b := openClusterStore(t, dir, 2, "b1", hostFS{cfs.Host("b")})
	defer b.Close()
	pb, _ := takeOver(t, b, 2, Handover{PrevWALDir: clusterWALDir(dir, 1, "a1"), PrevInc: "a1", PrevEpoch: 1})
	if pb.FirstDirtyOffset() != end || pb.LogStartOffset() != ls {
		t.Fatalf("taker: first dirty %d (want %d), log start %d (want %d)", pb.FirstDirtyOffset(), end, pb.LogStartOffset(), ls)
	}
	got := recordsByOffset(t, pb)
	if len(got) != len(want) {
		t.Fatalf("taker reads %d records, the leader had %d", len(got), len(want))
	}
	for o, r := range want {
		if got[o] != r {
			t.Fatalf("offset %d: taker %q, leader %q", o, got[o], r)
		}
	}
}

// TestCleanedNamesAreNotOriginalSegments: no directory scanner takes a cleaned file or a
// manifest for an original segment or snapshot, and the cleaned-name parser takes only them.
func TestCleanedNamesAreNotOriginalSegments(t *testing.T) {
	stem := cleanedStem(1234, 7, 3)
	for _, ext := range cleanedExts {
		name := stem + ext
		if _, _, ok := parseEpochName(name, ext); ok {
			t.Fatalf("parseEpochName takes %s for an original", name)
		}
		if e, seq, ok := parseCleanedName(name); !ok || e != 7 || seq != 3 {
			t.Fatalf("parseCleanedName(%s) = %d, %d, %v", name, e, seq, ok)
		}
	}
	if _, _, ok := parseEpochName(stem+".log", ".snapshot"); ok {
		t.Fatal("a cleaned file taken for a snapshot")
	}
	for _, name := range []string{epochFileName(1234, 7, ".log"), epochFileName(1234, 7, ".ckpt"), segmentName(5, ".log"),
		"epoch-7.prev.ckpt", cleanManifestName(7, 3), stem + ".ckpt"} {
		if _, _, ok := parseCleanedName(name); ok {
			t.Fatalf("parseCleanedName takes %s", name)
		}
	}
	if e, seq, ok := parseCleanManifestName(cleanManifestName(7, 3)); !ok || e != 7 || seq != 3 {
		t.Fatalf("parseCleanManifestName = %d, %d, %v", e, seq, ok)
	}
	for _, bad := range []string{"clean-7.json", "clean-07-3.json", "clean-7-3.json.tmp", "clean--1-3.json"} {
		if _, _, ok := parseCleanManifestName(bad); ok {
			t.Fatalf("parseCleanManifestName takes %s", bad)
		}
	}
}

// TestClusterCompactedTopicWithSmallSegmentsStaysBounded is the cluster-mode case of
// TestCompactedTopicWithSmallSegmentsStaysBounded: through takeovers (a crash, then a graceful
// release) the leader's cleans keep the segment count, the manifest count and the files on the
// volume bounded, and each taker reads the latest value of every key.
func TestClusterCompactedTopicWithSmallSegmentsStaysBounded(t *testing.T) {
	dir := t.TempDir()
	cfs := crashfs.New()
	pdir := filepath.Join(dir, "topics", "t", "0")
	cfgs := compactConfigs()
	delete(cfgs, "segment.bytes")
	cfgs["segment.ms"] = "100"
	var h Handover
	latest := map[string][]byte{}
	for epoch := int32(1); epoch <= 3; epoch++ {
		inc := fmt.Sprintf("i%d", epoch)
		s := openClusterStore(t, dir, epoch, inc, hostFS{cfs.Host(inc)})
		if epoch == 1 {
			if err := s.AlterTopicConfig("t", ptrMap(cfgs)); err != nil {
				t.Fatal(err)
			}
		}
		p, _ := takeOver(t, s, epoch, h)
		sameLive(t, fmt.Sprintf("epoch %d after its takeover", epoch), mustView(t, p), latest)
		// The append clock runs ahead of the wall clock: a crashed predecessor's records that the
		// taker replays into its active segment start that segment's segment.ms at wall time.
		got := runSmallSegmentRounds(t, s, p, 200, 20, time.Now().UnixMilli()+int64(epoch)*1_000_000, func(round int) {
			// After a clean: the cleaned groups, the previous epoch's last segment (at or
			// above the clean end until this leader's own data is cleaned) and the active one.
			if n := len(*p.segs.Load()); n > 4 {
				t.Fatalf("epoch %d round %d: %d segments after the clean", epoch, round, n)
			}
			if ms := manifestsIn(t, pdir); len(ms) != 1 {
				t.Fatalf("epoch %d round %d: manifests %v", epoch, round, ms)
			}
			if garbage, _ := classifyPartitionFiles(t, pdir, p); len(garbage) > 0 {
				t.Fatalf("epoch %d round %d: files no reader needs: %v", epoch, round, garbage)
			}
		})
		for k, v := range got {
			latest[k] = v
		}
		checkGroupedSegments(t, fmt.Sprintf("epoch %d", epoch), p, p.config().SegmentBytes)
		h = handOff(t, s, cfs, dir, epoch, inc, epoch == 2)
	}
	s := openClusterStore(t, dir, 4, "i4", hostFS{cfs.Host("i4")})
	defer s.Close()
	p, _ := takeOver(t, s, 4, h)
	sameLive(t, "epoch 4", mustView(t, p), latest)
	if n := len(*p.segs.Load()); n > 5 {
		t.Fatalf("epoch 4 took over %d segments", n)
	}
}

// TestTakeOverFinishesSingleBrokerCleanerSwap: a single broker that crashed in the middle of a
// swap (marker written, some groups renamed, others not) leaves a mix of old and new segment
// files that only its own recovery (recoverCleanerSwap) makes whole. A takeover of that
// directory in cluster mode finishes the swap first, as the single broker's next open would:
// the marker is only ever written by a single broker, gone once the cluster owns the volume.
// Without that the loader reads a cleaned .log with its old .index (or its merged sources' old
// files), a mix of the two sets.
func TestTakeOverFinishesSingleBrokerCleanerSwap(t *testing.T) {
	for _, step := range []string{"before-marker", "mid-rename", "mid-delete", "before-marker-removal"} {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, withoutWAL)
			if _, err := s.EnsureTopic("t", clusterTopicID, 1, compactConfigs()); err != nil {
				t.Fatal(err)
			}
			p := s.Topic("t").Partition(0)
			m := runCompactWorkload(t, p, 42, 300)
			pdir := p.dir
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, dir, withoutWAL)
			cleanerCrashAt = func(at string) bool { return at == step }
			err := s.RunCleaner(cleanerT0)
			cleanerCrashAt = nil
			if !errors.Is(err, errCrashInjected) {
				t.Fatalf("clean: %v, want the injected crash", err)
			}
			crash(s)
			c := openClusterStore(t, dir, 1, "c1", nil)
			defer c.Close()
			pc, _ := takeOver(t, c, 1, Handover{})
			checkSegmentsDisjoint(t, "after the takeover", pc)
			sameLive(t, "after the takeover", mustView(t, pc), m.latest)
			ents, _ := os.ReadDir(pdir)
			for _, e := range ents {
				if strings.HasSuffix(e.Name(), cleanedSuffix) || e.Name() == cleanerSwapName {
					t.Fatalf("%s left behind by the takeover", e.Name())
				}
			}
			if err := c.RunCleaner(cleanerT0); err != nil {
				t.Fatal(err)
			}
			sameLive(t, "after a cluster clean", mustView(t, pc), m.latest)
		})
	}
}

// checkSegmentsDisjoint: every segment of p's list holds only batches within [base, next), and
// each ends at or below the next one's base (no offset is held twice).
func checkSegmentsDisjoint(t *testing.T, what string, p *Partition) {
	t.Helper()
	segs := *p.segs.Load()
	for i, sg := range segs {
		next, _, _ := sg.stats()
		if i+1 < len(segs) && next > segs[i+1].base {
			t.Fatalf("%s: segment %s ends at %d, past the next one's base %d", what, sg.name(".log"), next, segs[i+1].base)
		}
		r := batchReader{f: sg.f, end: sg.size.Load()}
		for {
			b, status, err := r.next(false)
			if err != nil {
				t.Fatal(err)
			}
			if status != batchOK {
				break
			}
			if b.BaseOffset() < sg.base || b.LastOffset() >= next {
				t.Fatalf("%s: segment %s [%d, %d) holds batch [%d, %d]", what, sg.name(".log"), sg.base, next, b.BaseOffset(), b.LastOffset())
			}
		}
	}
}

// TestReleaseWaitsForRetentionFileWork: retention that dropped segments (cleaned ones among
// them) from the list just before a release goes on writing the log start checkpoint and
// deleting their files after it let go of the append mutex. Release must wait for that: once
// it returns, the successor lists the directory, and a checkpoint or a deletion landing after
// that changes a view already taken (files it opened vanish; cluster.md: nothing of this
// epoch writes after the release).
func TestReleaseWaitsForRetentionFileWork(t *testing.T) {
	dir := t.TempDir()
	cfs := crashfs.New()
	a := openClusterStore(t, dir, 1, "a1", hostFS{cfs.Host("a")})
	defer a.Close()
	cfgs := compactConfigs()
	cfgs["cleanup.policy"] = "compact,delete"
	cfgs["retention.ms"] = "1000"
	if err := a.AlterTopicConfig("t", ptrMap(cfgs)); err != nil {
		t.Fatal(err)
	}
	pa, _ := takeOver(t, a, 1, Handover{})
	runCompactWorkloadPIDs(t, pa, 51, 300, 0)
	if err := a.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	paused, resume := make(chan struct{}), make(chan struct{})
	retentionRemoveHook = func(p *Partition) {
		if p == pa {
			close(paused)
			<-resume
		}
	}
	defer func() { retentionRemoveHook = nil }()
	before := *pa.segs.Load()
	retDone := make(chan struct{})
	go func() {
		pa.retain(time.UnixMilli(1000 + 150 + 1000)) // as TestClusterCleanerRetentionRemovesCleanedPrefix
		close(retDone)
	}()
	<-paused
	dropped := (*pa.segs.Load())[0].base // the first kept one
	relDone := make(chan error, 1)
	go func() {
		_, err := a.Release("t", 0)
		relDone <- err
	}()
	eventually(t, "the release closes the partition", func() bool { return !pa.Loaded() })
	// Release must stay blocked while the retention's file work is pending; a bounded wait is
	// the only way to see that (it returns as soon as the retention goes on below).
	select {
	case err := <-relDone:
		close(resume)
		t.Fatalf("Release returned (%v) while retention had files of this epoch still to delete", err)
	case <-time.After(time.Second):
	}
	close(resume)
	if err := <-relDone; err != nil {
		t.Fatal(err)
	}
	// Everything the retention had to do on the volume is done when Release returns.
	if got := readLogStartFloor(pa.dir); got != dropped {
		t.Fatalf("log start checkpoint %d after the release, want %d", got, dropped)
	}
	for _, sg := range before {
		if sg.base >= dropped {
			break
		}
		if _, err := os.Stat(sg.path(".log")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s removed by retention is still on the volume after the release (%v)", sg.name(".log"), err)
		}
	}
	<-retDone
}

// pauseClean runs s.RunCleaner in the background and returns once its clean of p is paused
// between the key map and the rewrite (cleanerStepHook); closing resume lets it go on, and done
// then gives RunCleaner's result.
func pauseClean(t *testing.T, s *Store, p *Partition) (resume chan struct{}, done <-chan error) {
	t.Helper()
	paused := make(chan struct{})
	resume = make(chan struct{})
	cleanerStepHook = func(q *Partition) {
		if q == p {
			close(paused)
			<-resume
		}
	}
	t.Cleanup(func() { cleanerStepHook = nil })
	d := make(chan error, 1)
	go func() { d <- s.RunCleaner(cleanerT0) }()
	<-paused
	return resume, d
}

// handOff ends store s (the leader of t-0 at epoch, incarnation inc on host inc) and returns the
// Handover its successor takes over with: a graceful release, or a crash of its host (unsynced
// data gone) whose WAL the successor salvages.
func handOff(t *testing.T, s *Store, cfs *crashfs.FS, dir string, epoch int32, inc string, graceful bool) Handover {
	t.Helper()
	if graceful {
		rec, err := s.Release("t", 0)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		return Handover{Release: &rec}
	}
	cfs.Crash(inc)
	crash(s)
	return Handover{PrevWALDir: clusterWALDir(dir, epoch, inc), PrevInc: inc, PrevEpoch: epoch}
}
