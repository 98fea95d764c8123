package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kv is one keyed record of a test batch; a nil value is a tombstone.
type kv struct {
	key   string
	value []byte
}

// makeKeyed encodes a v2 batch of keyed records (see makeBatch).
func makeKeyed(t testing.TB, pid int64, epoch int16, seq int32, txn bool, ts int64, recs []kv) codec.Batch {
	t.Helper()
	return makeKeyedZ(t, pid, epoch, seq, txn, ts, recs, 0)
}

// makeKeyedZ is makeKeyed with the records compressed by Kafka codec comp (0: none).
func makeKeyedZ(t testing.TB, pid int64, epoch int16, seq int32, txn bool, ts int64, recs []kv, comp int) codec.Batch {
	t.Helper()
	if pid < 0 {
		seq, epoch = -1, -1
	}
	var body []byte
	for i, r := range recs {
		rec := kmsg.Record{TimestampDelta64: int64(i), OffsetDelta: int32(i), Key: []byte(r.key), Value: r.value}
		enc := rec.AppendTo(nil)
		rec.Length = int32(len(enc) - 1)
		body = rec.AppendTo(body)
	}
	var attrs int16
	if txn {
		attrs = codec.AttrTransactional
	}
	if comp != 0 {
		z, err := compressRecords(comp, body)
		if err != nil {
			t.Fatal(err)
		}
		body = z
		attrs |= int16(comp)
	}
	rb := kmsg.RecordBatch{Attributes: attrs,
		Length: int32(codec.BatchHeaderSize - codec.LogOverhead + len(body)), PartitionLeaderEpoch: -1, Magic: 2,
		LastOffsetDelta: int32(len(recs) - 1), FirstTimestamp: ts, MaxTimestamp: ts + int64(len(recs)-1),
		ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq, NumRecords: int32(len(recs)), Records: body,
	}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	v, code := codec.ValidateProduce(b, codec.ValidateOptions{})
	if code != codec.CodeNone {
		t.Fatalf("test batch invalid: code %d", code)
	}
	return v
}

// compactModel is what a read_committed consumer must end up with: the latest committed value
// of every key (nil: deleted).
type compactModel struct {
	latest map[string][]byte
	seqs   map[int64]int32 // next sequence per producer
}

const cleanerTestTopicDeleteRetention = 1000

// runCompactWorkload writes a random keyed workload: plain idempotent batches, transactions of
// three producers that commit or abort, tombstones, across many small segments. Every
// transaction is closed at the end.
func runCompactWorkload(t *testing.T, p *Partition, seed uint64, steps int) *compactModel {
	t.Helper()
	return runCompactWorkloadPIDs(t, p, seed, steps, 0)
}

// runCompactWorkloadPIDs is runCompactWorkload with producer ids shifted by pidBase (a later
// leader's workload on the same partition uses fresh producers).
func runCompactWorkloadPIDs(t *testing.T, p *Partition, seed uint64, steps int, pidBase int64) *compactModel {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	m := &compactModel{latest: map[string][]byte{}, seqs: map[int64]int32{}}
	// Every write with its offset; a transaction's writes count once it commits. The latest
	// committed write of a key by offset is what a read_committed consumer ends with.
	type write struct {
		off   int64
		key   string
		value []byte
		txn   int // 0: not transactional
	}
	var writes []write
	committed := map[int]bool{0: true}
	openTxn := map[int64]int{} // pid → transaction number
	txnNo := 0
	plain := 9 + pidBase
	batch := func(n int) []kv {
		recs := make([]kv, n)
		for i := range recs {
			var v []byte
			if rng.IntN(8) != 0 {
				v = []byte(fmt.Sprintf("v%d-%d", seed, rng.IntN(1_000_000)))
			}
			recs[i] = kv{fmt.Sprintf("k%02d", rng.IntN(40)), v}
		}
		return recs
	}
	record := func(base int64, recs []kv, txn int) {
		for i, r := range recs {
			writes = append(writes, write{base + int64(i), r.key, r.value, txn})
		}
	}
	closeTxn := func(pid int64, commit bool) {
		mustMarker(t, p, pid, 0, commit, 0)
		committed[openTxn[pid]] = commit
		delete(openTxn, pid)
	}
	for step := 0; step < steps; step++ {
		switch x := rng.IntN(10); {
		case x < 5:
			recs := batch(1 + rng.IntN(4))
			seq := m.seqs[plain]
			r := mustAppend(t, p, makeKeyedZ(t, plain, 0, seq, false, 1000+int64(step), recs, rng.IntN(5)), 0)
			m.seqs[plain] = seq + int32(len(recs))
			record(r.BaseOffset, recs, 0)
		case x < 8:
			pid := 100 + pidBase + int64(rng.IntN(3))
			if _, ok := openTxn[pid]; !ok {
				txnNo++
				openTxn[pid] = txnNo
			}
			recs := batch(1 + rng.IntN(3))
			seq := m.seqs[pid]
			g, ongoing := p.VerificationGuard(pid, 0)
			if ongoing {
				g = 0
			}
			r := p.AppendTxn(makeKeyedZ(t, pid, 0, seq, true, 1000+int64(step), recs, rng.IntN(5)), 0, g)
			if r.Code != codec.CodeNone {
				t.Fatalf("txn append: code %d", r.Code)
			}
			if err := syncWait(p, r.LastOffset+1); err != nil {
				t.Fatal(err)
			}
			m.seqs[pid] = seq + int32(len(recs))
			record(r.BaseOffset, recs, openTxn[pid])
		default:
			for pid := 100 + pidBase; pid < 103+pidBase; pid++ {
				if _, ok := openTxn[pid]; ok {
					closeTxn(pid, rng.IntN(3) != 0)
					break
				}
			}
		}
	}
	for pid := 100 + pidBase; pid < 103+pidBase; pid++ {
		if _, ok := openTxn[pid]; ok {
			closeTxn(pid, true)
		}
	}
	for _, w := range writes { // in offset order
		if committed[w.txn] {
			m.latest[w.key] = w.value
		}
	}
	return m
}

// committedView reads the partition as a read_committed consumer does: aborted transactions'
// records and markers are dropped, the last value of a key wins. It also returns how many
// times each key occurs in the batches below upTo, and the number of control batches there.
func committedView(t *testing.T, p *Partition, upTo int64) (view map[string][]byte, occ map[string]int, markers int) {
	t.Helper()
	view, occ = map[string][]byte{}, map[string]int{}
	lso := p.LastStableOffset()
	aborted := p.AbortedTransactions(p.LogStartOffset(), lso)
	inAborted := func(b codec.Batch) bool {
		for _, a := range aborted {
			if a.ProducerID == b.ProducerID() && a.FirstOffset <= b.BaseOffset() && b.BaseOffset() < a.LastOffset {
				return true
			}
		}
		return false
	}
	for _, b := range readAll(t, p, p.LogStartOffset()) {
		if b.BaseOffset() >= lso {
			break
		}
		if b.IsControl() {
			if b.BaseOffset() < upTo {
				markers++
			}
			continue
		}
		if b.IsTransactional() && inAborted(b) {
			continue
		}
		if err := walkRecords(b, func(r *rawRecord) error {
			k := string(r.key)
			if b.BaseOffset() < upTo {
				occ[k]++
			}
			if r.tombstone {
				view[k] = nil
			} else {
				view[k] = append([]byte(nil), recordValue(t, r)...)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return view, occ, markers
}

// recordValue extracts the value of a parsed record.
func recordValue(t *testing.T, r *rawRecord) []byte {
	t.Helper()
	q := r.rest
	_, k := binary.Varint(q) // offset delta
	q = q[k:]
	kl, k := binary.Varint(q)
	q = q[k:]
	if kl > 0 {
		q = q[kl:]
	}
	vl, k := binary.Varint(q)
	return q[k : k+int(vl)]
}

// liveOf drops deleted keys: a consumer cannot tell a tombstone from an absent key.
func liveOf(m map[string][]byte) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if v != nil {
			out[k] = string(v)
		}
	}
	return out
}

func sameLive(t *testing.T, what string, got map[string][]byte, want map[string][]byte) {
	t.Helper()
	g, w := liveOf(got), liveOf(want)
	if len(g) != len(w) {
		t.Fatalf("%s: %d live keys, want %d", what, len(g), len(w))
	}
	for k, v := range w {
		if g[k] != v {
			t.Fatalf("%s: key %s = %q, want %q", what, k, g[k], v)
		}
	}
}

func compactTopic(t *testing.T, s *Store) *Partition {
	t.Helper()
	return newPartition(t, s, map[string]string{"cleanup.policy": "compact", "segment.bytes": "2048",
		"delete.retention.ms": fmt.Sprint(cleanerTestTopicDeleteRetention), "min.cleanable.dirty.ratio": "0.01"})
}

var cleanerT0 = time.UnixMilli(10_000_000)

// TestCleanerModel: random keyed and transactional workloads with aborts, in batches of every
// codec (none, gzip, snappy, lz4, zstd); after a clean a
// read_committed read gives exactly the latest committed value of every key, each key occurs
// at most once in the cleaned range, tombstones and markers go once delete.retention.ms passed
// since the clean that first saw them, and the state survives a restart.
func TestCleanerModel(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			p := compactTopic(t, s)
			m := runCompactWorkload(t, p, seed, 400)
			before, _, _ := committedView(t, p, 0)
			sameLive(t, "before clean", before, m.latest)
			lso := p.LastStableOffset()
			states := map[int64]int32{}
			for pid := range m.seqs {
				_, seq, _, _ := p.ProducerState(pid)
				states[pid] = seq
			}

			aborts := 0
			for _, b := range readAll(t, p, 0) {
				if b.IsControl() && codec.ControlType(b) == codec.ControlAbort {
					aborts++
				}
			}
			sources, mergedBefore := p.planClean(cleanerT0).cleanable, cleanerSegmentsMergedTotal.Get()
			if err := s.RunCleaner(cleanerT0); err != nil {
				t.Fatal(err)
			}
			to := p.cleanedTo.Load()
			// Grouping: the clean emptied or shrank most segments (a few keys, overwritten
			// often), so the cleaned range is fewer segments than it was, each within
			// segment.bytes and contiguous, and the counter says how many went.
			groups := segmentsBelow(p, to)
			if merged := cleanerSegmentsMergedTotal.Get() - mergedBefore; groups >= sources || merged != uint64(sources-groups) {
				t.Fatalf("clean of %d segments left %d (merged counter +%d)", sources, groups, merged)
			}
			checkGroupedSegments(t, "after clean", p, 2048)
			if aborts == 0 || len(p.AbortedTransactions(0, to)) == 0 {
				t.Fatalf("workload has %d ABORT markers, %d in the cleaned range after the first clean", aborts, len(p.AbortedTransactions(0, to)))
			}
			if to == 0 {
				t.Fatal("nothing cleaned")
			}
			view, occ, _ := committedView(t, p, to)
			sameLive(t, "after clean", view, m.latest)
			codecs := map[int]int{}
			for _, b := range readAll(t, p, 0) {
				if b.BaseOffset() < to && b.NumRecords() > 0 {
					codecs[b.Compression()]++
				}
			}
			if len(codecs) != 5 {
				t.Fatalf("cleaned range holds batches of codecs %v, want all five kept in their codec", codecs)
			}
			for k, n := range occ {
				if n > 1 {
					t.Fatalf("key %s occurs %d times in the cleaned range", k, n)
				}
			}
			if p.LastStableOffset() != lso {
				t.Fatalf("LSO %d after clean, was %d", p.LastStableOffset(), lso)
			}
			tombs := func() int { return tombstonesBelow(t, p, to) }
			hadTombs := tombs()

			// Within delete.retention.ms nothing more goes; then tombstones go, and markers whose
			// transactions have no record left go one horizon later.
			if err := s.RunCleaner(cleanerT0.Add(cleanerTestTopicDeleteRetention * time.Millisecond / 2)); err != nil {
				t.Fatal(err)
			}
			if n := tombs(); n != hadTombs {
				t.Fatalf("%d tombstones before delete.retention.ms, want %d", n, hadTombs)
			}
			// A clean of an already grouped range never splits it.
			if n := segmentsBelow(p, to); n > groups {
				t.Fatalf("a second clean turned %d segments into %d", groups, n)
			}
			checkGroupedSegments(t, "after the second clean", p, 2048)
			for i := 1; i <= 3; i++ {
				if err := s.RunCleaner(cleanerT0.Add(time.Duration(i) * (cleanerTestTopicDeleteRetention + 1) * time.Millisecond)); err != nil {
					t.Fatal(err)
				}
			}
			if hadTombs == 0 {
				t.Fatal("workload wrote no tombstone into the cleaned range")
			}
			if n := tombs(); n != 0 {
				t.Fatalf("%d tombstones left after delete.retention.ms", n)
			}
			view, _, markers := committedView(t, p, to)
			sameLive(t, "after tombstone removal", view, m.latest)
			for _, a := range p.AbortedTransactions(0, to) {
				if a.LastOffset < to {
					t.Fatalf("aborted index still names a removed transaction: %+v", a)
				}
			}
			// No ABORT marker is left in the cleaned range: their records went in the first clean,
			// the second stamped their horizon, the third removed them.
			for _, b := range readAll(t, p, p.LogStartOffset()) {
				if b.BaseOffset() < to && b.IsControl() && codec.ControlType(b) == codec.ControlAbort {
					t.Fatalf("ABORT marker at %d left after its delete horizon", b.BaseOffset())
				}
			}
			if markers == 0 {
				t.Log("no COMMIT marker kept in the cleaned range")
			}
			for pid, seq := range states {
				if _, got, _, _ := p.ProducerState(pid); got != seq {
					t.Fatalf("producer %d last sequence %d after clean, was %d", pid, got, seq)
				}
			}

			// Restart (kill -9): the same committed content, producer state and LSO.
			nsegs := len(*p.segs.Load())
			crash(s)
			s = openStore(t, dir)
			defer s.Close()
			p = s.Topic("t").Partition(0)
			if got := len(*p.segs.Load()); got != nsegs || len(filesWith(t, p.dir, ".log")) != nsegs {
				t.Fatalf("after restart %d segments, %d .log files, want %d", got, len(filesWith(t, p.dir, ".log")), nsegs)
			}
			checkGroupedSegments(t, "after restart", p, 2048)
			view, _, _ = committedView(t, p, 0)
			sameLive(t, "after restart", view, m.latest)
			for pid, seq := range states {
				if _, got, _, _ := p.ProducerState(pid); got != seq {
					t.Fatalf("producer %d last sequence %d after restart, was %d", pid, got, seq)
				}
			}
			if p.LastStableOffset() != lso {
				t.Fatalf("LSO %d after restart, was %d", p.LastStableOffset(), lso)
			}
			// Idempotence across the clean: the next sequence is accepted, a duplicate is not
			// appended twice.
			seq := m.seqs[100]
			if seq > 0 {
				g, _ := p.VerificationGuard(100, 0)
				r := p.AppendTxn(makeKeyed(t, 100, 0, seq, true, 5000, []kv{{"k00", []byte("x")}}), 0, g)
				if r.Code != codec.CodeNone {
					t.Fatalf("append after clean: code %d", r.Code)
				}
			}
		})
	}
}

// segmentsBelow counts p's segments that end at or below off.
func segmentsBelow(p *Partition, off int64) int {
	n := 0
	for _, sg := range *p.segs.Load() {
		if next, _, _ := sg.stats(); next <= off {
			n++
		}
	}
	return n
}

// checkGroupedSegments: p's segments are contiguous (each ends where the next begins, whatever
// the clean removed), and every closed one is within segBytes and addressable by the 32-bit
// relative offsets of its indexes.
func checkGroupedSegments(t *testing.T, what string, p *Partition, segBytes int64) {
	t.Helper()
	segs := *p.segs.Load()
	for i, sg := range segs[:len(segs)-1] {
		next, _, _ := sg.stats()
		if next != segs[i+1].base {
			t.Fatalf("%s: segment %d ends at %d, the next begins at %d", what, sg.base, next, segs[i+1].base)
		}
		if sg.size.Load() > segBytes || next-1-sg.base > math.MaxInt32 {
			t.Fatalf("%s: segment %d holds %d bytes, offsets to %d", what, sg.base, sg.size.Load(), next)
		}
	}
}

// fileSet hashes every segment file (.log, .index, .timeindex, .txnindex) of dir.
func fileSet(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		for _, ext := range cleanedExts {
			if strings.HasSuffix(e.Name(), ext) {
				b, err := os.ReadFile(filepath.Join(dir, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				out[e.Name()] = fmt.Sprintf("%x", crc32.ChecksumIEEE(b))
			}
		}
	}
	return out
}

// TestCleanerCrashAtEachSwapStep: a kill -9 at each step of a clean leaves the old segment set
// or the new one (never a mix), reads give the same committed content, and a clean after the
// restart succeeds.
func TestCleanerCrashAtEachSwapStep(t *testing.T) {
	// The new set, from a clean that is not interrupted.
	refDir := t.TempDir()
	ref := openStore(t, refDir, withoutWAL)
	rp := compactTopic(t, ref)
	m := runCompactWorkload(t, rp, 42, 300)
	pdir := rp.dir
	if err := ref.Close(); err != nil {
		t.Fatal(err)
	}
	ref = openStore(t, refDir, withoutWAL)
	oldSet := fileSet(t, pdir)
	if err := ref.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	newSet := fileSet(t, pdir)
	ref.Close()
	// The clean groups: the new set has fewer segments, so the swap renames some groups'
	// files over their first source and deletes the others' (mid-delete stops there).
	if logs := func(set map[string]string) (n int) {
		for name := range set {
			if strings.HasSuffix(name, ".log") {
				n++
			}
		}
		return n
	}; logs(newSet) >= logs(oldSet) {
		t.Fatalf("the clean merged no segment: %d .log files before, %d after", logs(oldSet), logs(newSet))
	}

	steps := []string{"before-dir-sync", "before-marker", "mid-rename", "mid-delete", "before-final-dir-sync", "before-marker-removal"}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, withoutWAL)
			p := compactTopic(t, s)
			runCompactWorkload(t, p, 42, 300)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, dir, withoutWAL)
			p = s.Topic("t").Partition(0)
			if got := fileSet(t, p.dir); !sameFiles(got, oldSet) {
				t.Fatal("workload is not deterministic: old sets differ")
			}
			cleanerCrashAt = func(at string) bool { return at == step }
			err := s.RunCleaner(cleanerT0)
			cleanerCrashAt = nil
			if !errors.Is(err, errCrashInjected) {
				t.Fatalf("clean: %v, want the injected crash", err)
			}
			crash(s)
			s = openStore(t, dir, withoutWAL)
			defer s.Close()
			p = s.Topic("t").Partition(0)
			got := fileSet(t, p.dir)
			switch {
			case sameFiles(got, oldSet):
				if step == "mid-rename" || step == "mid-delete" || step == "before-final-dir-sync" || step == "before-marker-removal" {
					t.Fatal("rolled back after the swap marker was written")
				}
			case sameFiles(got, newSet):
				if step == "before-dir-sync" || step == "before-marker" {
					t.Fatal("rolled forward without a swap marker")
				}
			default:
				t.Fatalf("after a crash at %s the segment files are neither the old nor the new set", step)
			}
			ents, _ := os.ReadDir(p.dir)
			for _, e := range ents {
				if strings.HasSuffix(e.Name(), cleanedSuffix) || e.Name() == cleanerSwapName {
					t.Fatalf("%s left behind", e.Name())
				}
			}
			view, _, _ := committedView(t, p, 0)
			sameLive(t, "after crash", view, m.latest)
			if err := s.RunCleaner(cleanerT0); err != nil {
				t.Fatal(err)
			}
			view, _, _ = committedView(t, p, 0)
			sameLive(t, "after a clean following the crash", view, m.latest)
		})
	}
}

func sameFiles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestCleanerErrorTakesCleaningOffline: a write failure while cleaning leaves the partition
// serving (produce and fetch) with its cleaning offline and the error counted.
func TestCleanerErrorTakesCleaningOffline(t *testing.T) {
	ffs := &faultFS{}
	s := openStore(t, "", withoutWAL, func(c *Config) { c.FS = ffs })
	defer s.Close()
	p := compactTopic(t, s)
	m := runCompactWorkload(t, p, 3, 200)
	errs := cleanerErrorsTotal.Get()
	ffs.set(func(f *faultFS) { f.match = cleanedSuffix; f.writeErr = errors.New("EIO") })
	if err := s.RunCleaner(cleanerT0); err == nil {
		t.Fatal("clean succeeded despite the write failure")
	}
	ffs.set(func(f *faultFS) { f.match = ""; f.writeErr = nil })
	if !p.CleaningOffline() || cleanerErrorsTotal.Get() != errs+1 {
		t.Fatalf("offline %v, errors %d (was %d)", p.CleaningOffline(), cleanerErrorsTotal.Get(), errs)
	}
	view, _, _ := committedView(t, p, 0)
	sameLive(t, "after the failed clean", view, m.latest)
	mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, 9000, []kv{{"k01", []byte("after")}}), 0)
	ents, _ := os.ReadDir(p.dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), cleanedSuffix) {
			t.Fatalf("%s left behind by the failed clean", e.Name())
		}
	}
}

// TestReadAcrossCompactionGaps: a fetch at an offset a clean removed returns the next batch
// after the gap, and a fetch from the start walks every gap.
func TestReadAcrossCompactionGaps(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := compactTopic(t, s)
	for i := 0; i < 200; i++ {
		mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, int64(1000+i), []kv{{fmt.Sprintf("k%d", i%5), []byte(fmt.Sprint(i))}}), 0)
	}
	if err := s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	to := p.cleanedTo.Load()
	all := readAll(t, p, 0)
	var offs []int64
	for _, b := range all {
		offs = append(offs, b.BaseOffset())
	}
	if !sort.SliceIsSorted(offs, func(i, j int) bool { return offs[i] < offs[j] }) || int64(len(all)) >= to {
		t.Fatalf("no gaps below %d: %d batches", to, len(all))
	}
	for o := int64(0); o < to; o++ {
		buf, code := p.Read(nil, o, 1, p.HighWatermark())
		if code != codec.CodeNone || len(buf) == 0 {
			t.Fatalf("read at %d: code %d, %d bytes", o, code, len(buf))
		}
		b, _, _ := codec.FrameBatch(buf)
		if b.LastOffset() < o {
			t.Fatalf("read at %d returned batch ending at %d", o, b.LastOffset())
		}
		i := sort.Search(len(offs), func(i int) bool { return offs[i] >= o })
		if b.BaseOffset() != offs[i] {
			t.Fatalf("read at %d returned batch %d, want %d", o, b.BaseOffset(), offs[i])
		}
	}
}

// fillKeys appends n single-record batches cycling over keys, timestamps from ts.
func fillKeys(t *testing.T, p *Partition, n, keys int, ts int64) {
	t.Helper()
	for i := 0; i < n; i++ {
		mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, ts+int64(i), []kv{{fmt.Sprintf("k%d", i%keys), []byte(fmt.Sprintf("value-%06d", i))}}), 0)
	}
}

// TestCleanerChoosesByDirtyRatioAndLag: the background check cleans a partition only once its
// dirty ratio reaches min.cleanable.dirty.ratio, or once its oldest dirty segment waited
// max.compaction.lag.ms; segments younger than min.compaction.lag.ms are never cleaned.
func TestCleanerChoosesByDirtyRatioAndLag(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	ts := cleanerT0.UnixMilli()
	p := newPartition(t, s, map[string]string{"cleanup.policy": "compact", "segment.bytes": "2048",
		"min.cleanable.dirty.ratio": "0.9", "min.compaction.lag.ms": "3600000"})
	fillKeys(t, p, 300, 10, ts)
	check := func(now time.Time) int64 {
		c := s.newCleaner()
		c.cfg.Now = func() time.Time { return now }
		if err := c.runOnce(false); err != nil {
			t.Fatal(err)
		}
		return p.FirstDirtyOffset()
	}
	// Everything is younger than min.compaction.lag.ms.
	if got := check(cleanerT0); got != 0 {
		t.Fatalf("cleaned to %d within min.compaction.lag.ms", got)
	}
	later := cleanerT0.Add(2 * time.Hour)
	first := check(later) // all dirty: ratio 1 >= 0.9
	if first == 0 {
		t.Fatal("not cleaned with dirty ratio 1")
	}
	// A little more dirty data: the ratio stays below 0.9.
	fillKeys(t, p, 60, 10, ts+1000)
	if got := check(later); got != first {
		t.Fatalf("cleaned to %d with a low dirty ratio (was %d)", got, first)
	}
	g, ok := dirtyRatios.Load(`kaas_cleaner_dirty_ratio{topic="t",partition="0"}`)
	if !ok {
		t.Fatal("no dirty ratio gauge")
	}
	if r := math.Float64frombits(g.(*atomic.Uint64).Load()); !(r > 0 && r < 0.9) {
		t.Fatalf("dirty ratio gauge %v, want in (0, 0.9)", r)
	}
	// max.compaction.lag.ms forces it.
	if err := s.AlterTopicConfig("t", map[string]*string{"max.compaction.lag.ms": ptr("3600001")}); err != nil {
		t.Fatal(err)
	}
	if got := check(later.Add(time.Hour)); got <= first {
		t.Fatalf("max.compaction.lag.ms did not force a clean: %d (was %d)", got, first)
	}
}

// TestCompactedActiveSegmentRollsAtMaxCompactionLag: on a compacted topic the active segment
// rolls once max.compaction.lag.ms passed (when it is below segment.ms), so its records become
// cleanable (KIP-354).
func TestCompactedActiveSegmentRollsAtMaxCompactionLag(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, map[string]string{"cleanup.policy": "compact", "max.compaction.lag.ms": "1000"})
	mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, 1, []kv{{"a", []byte("1")}}), 10)
	mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, 2, []kv{{"a", []byte("2")}}), 500)
	if n := len(*p.segs.Load()); n != 1 {
		t.Fatalf("%d segments before the lag", n)
	}
	mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, 3, []kv{{"a", []byte("3")}}), 1010)
	if n := len(*p.segs.Load()); n != 2 {
		t.Fatalf("%d segments after max.compaction.lag.ms, want 2", n)
	}
}

// TestCompactOnlyTopicIgnoresTimeAndSizeRetention: cleanup.policy=compact alone deletes nothing
// by retention.ms / retention.bytes; compact,delete does both.
func TestCompactOnlyTopicIgnoresTimeAndSizeRetention(t *testing.T) {
	for _, policy := range []string{"compact", "compact,delete"} {
		s := openStore(t, "")
		p := newPartition(t, s, map[string]string{"cleanup.policy": policy, "segment.bytes": "1024", "retention.ms": "1", "retention.bytes": "1"})
		fillKeys(t, p, 100, 10, 1)
		before := len(*p.segs.Load())
		s.RunRetention(time.Now())
		after := len(*p.segs.Load())
		if policy == "compact" && (after != before || p.LogStartOffset() != 0) {
			t.Fatalf("compact: retention removed segments (%d -> %d)", before, after)
		}
		if policy == "compact,delete" && after != 1 {
			t.Fatalf("compact,delete: %d segments left, want the active one", after)
		}
		s.Close()
	}
}

// TestCleanedSegmentWithoutIndexesIsRescanned: a cleaned segment (offset gaps) whose index files
// are gone is rebuilt by the recovery scan without cutting anything at its gaps.
func TestCleanedSegmentWithoutIndexesIsRescanned(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	p := compactTopic(t, s)
	fillKeys(t, p, 300, 7, 1)
	if err := s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	want, _, _ := committedView(t, p, 0)
	batches := len(readAll(t, p, 0))
	pdir := p.dir
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	removeAll(t, filesWith(t, pdir, ".index"))
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	got, _, _ := committedView(t, p, 0)
	sameLive(t, "after rescan", got, want)
	if n := len(readAll(t, p, 0)); n != batches {
		t.Fatalf("%d batches after the rescan, want %d", n, batches)
	}
}

// TestCleanerConcurrentWithProduceAndFetch: cleans run while a producer appends (rolling
// segments) and a reader fetches from the start; every fetch returns valid batches in offset
// order, and the final content is the latest value of every key.
func TestCleanerConcurrentWithProduceAndFetch(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := compactTopic(t, s)
	mergedBefore := cleanerSegmentsMergedTotal.Get()
	latest := map[string]string{}
	done := make(chan struct{})
	prodErr := make(chan error, 1)
	go func() {
		defer close(prodErr)
		for i := 0; i < 1500; i++ {
			k, v := fmt.Sprintf("k%d", i%13), fmt.Sprint(i)
			r := p.Append(makeKeyed(t, -1, 0, 0, false, int64(i), []kv{{k, []byte(v)}}), 0)
			if r.Code != codec.CodeNone {
				prodErr <- fmt.Errorf("append %d: code %d", i, r.Code)
				return
			}
			if err := syncWait(p, r.LastOffset+1); err != nil {
				prodErr <- err
				return
			}
			latest[k] = v
		}
	}()
	readErr := make(chan error, 1)
	go func() {
		defer close(readErr)
		for {
			select {
			case <-done:
				return
			default:
			}
			from, last := int64(0), int64(-1)
			for from < p.HighWatermark() {
				buf, code := p.Read(nil, from, 4096, p.HighWatermark())
				if code != codec.CodeNone {
					readErr <- fmt.Errorf("read at %d: code %d", from, code)
					return
				}
				for len(buf) > 0 {
					b, ok, bad := codec.FrameBatch(buf)
					if !ok || bad || !b.CRCValid() || b.BaseOffset() <= last {
						readErr <- fmt.Errorf("read at %d: bad batch (last %d)", from, last)
						return
					}
					last = b.LastOffset()
					buf = buf[len(b):]
				}
				from = last + 1
			}
		}
	}()
	cleans := 0
	for {
		select {
		case err, ok := <-prodErr:
			if ok && err != nil {
				t.Fatal(err)
			}
			if !ok {
				close(done)
				if err := <-readErr; err != nil {
					t.Fatal(err)
				}
				if err := s.RunCleaner(cleanerT0); err != nil {
					t.Fatal(err)
				}
				view, _, _ := committedView(t, p, 0)
				got := liveOf(view)
				for k, v := range latest {
					if got[k] != v {
						t.Fatalf("key %s = %q, want %q", k, got[k], v)
					}
				}
				if cleans == 0 {
					t.Fatal("no clean ran during the produce")
				}
				// The cleans grouped: the reader ran across swaps that deleted merged sources'
				// files, and 13 keys end in a few segments, not one per roll.
				if cleanerSegmentsMergedTotal.Get() == mergedBefore {
					t.Fatal("no clean merged segments during the produce")
				}
				if n := len(*p.segs.Load()); n > 4 {
					t.Fatalf("%d segments hold 13 keys after the final clean", n)
				}
				checkGroupedSegments(t, "after the final clean", p, 2048)
				return
			}
		default:
			if err := s.RunCleaner(cleanerT0); err != nil {
				t.Fatal(err)
			}
			if p.FirstDirtyOffset() > 0 {
				cleans++
			}
		}
	}
}

// readBatches reads [from, HWM) of p without a testing.T (for hooks that run on the cleaner's
// goroutine).
func readBatches(p *Partition, from int64) ([]codec.Batch, error) {
	var out []codec.Batch
	for from < p.HighWatermark() {
		buf, code := p.Read(nil, from, 1<<20, p.HighWatermark())
		if code != codec.CodeNone || len(buf) == 0 {
			return out, fmt.Errorf("read at %d: code %d, %d bytes", from, code, len(buf))
		}
		for len(buf) > 0 {
			b, ok, bad := codec.FrameBatch(buf)
			if !ok || bad || !b.CRCValid() {
				return out, fmt.Errorf("read at %d: bad batch", from)
			}
			out = append(out, slices.Clone(b))
			buf = buf[len(b):]
			from = b.LastOffset() + 1
		}
	}
	return out, nil
}

// TestReadDuringGroupedSwapServesOldFiles: a read during the swap, after the merged sources'
// files are deleted and before the new list is published, still reads the old list's open
// files and returns the log as it was before the clean; after the swap the same read returns
// the cleaned log.
func TestReadDuringGroupedSwapServesOldFiles(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := compactTopic(t, s)
	fillKeys(t, p, 400, 5, 1)
	want, err := readBatches(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	var during []codec.Batch
	var duringErr error
	var logsDuring int // .log files on disk during the swap
	cleanerCrashAt = func(step string) bool {
		if step == "before-final-dir-sync" {
			ents, _ := os.ReadDir(p.dir)
			for _, e := range ents {
				if strings.HasSuffix(e.Name(), ".log") {
					logsDuring++
				}
			}
			during, duringErr = readBatches(p, 0)
		}
		return false
	}
	defer func() { cleanerCrashAt = nil }()
	segsBefore := len(*p.segs.Load())
	if err := s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	cleanerCrashAt = nil
	if duringErr != nil {
		t.Fatal(duringErr)
	}
	if logsDuring >= segsBefore {
		t.Fatalf("%d .log files on disk during the swap, %d segments before: no source was deleted", logsDuring, segsBefore)
	}
	if len(during) != len(want) {
		t.Fatalf("read during the swap returned %d batches, the log had %d", len(during), len(want))
	}
	for i := range want {
		if !bytes.Equal(during[i], want[i]) {
			t.Fatalf("batch %d read during the swap differs from the log before the clean", i)
		}
	}
	after, err := readBatches(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) >= len(want) || len(*p.segs.Load()) >= segsBefore {
		t.Fatalf("after the swap %d batches in %d segments, before %d in %d", len(after), len(*p.segs.Load()), len(want), segsBefore)
	}
}

// TestCompactedTopicWithSmallSegmentsStaysBounded guards against a compacted topic keeping one
// file per segment it ever rolled: a Kafka Streams changelog with a small segment.ms rolls a
// tiny segment every few records, and a cleaner that kept every base forever made thousands.
// Here a few keys are overwritten through 400 rolls with a clean every 20; the segment count
// stays bounded after every clean (and so the files on disk), the content is the latest per key, and a restart
// reads the same.
func TestCompactedTopicWithSmallSegmentsStaysBounded(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	p := newPartition(t, s, map[string]string{"cleanup.policy": "compact", "segment.ms": "100",
		"min.cleanable.dirty.ratio": "0.01"})
	latest := runSmallSegmentRounds(t, s, p, 400, 20, 0, func(round int) {
		if n := len(*p.segs.Load()); n > 3 {
			t.Fatalf("round %d: %d segments after the clean", round, n)
		}
		if logs := len(filesWith(t, p.dir, ".log")); logs != len(*p.segs.Load()) {
			t.Fatalf("round %d: %d .log files for %d segments", round, logs, len(*p.segs.Load()))
		}
	})
	if n := len(*p.segs.Load()); n > 3 {
		t.Fatalf("%d segments after the last clean (5 keys)", n)
	}
	checkGroupedSegments(t, "after the rounds", p, p.config().SegmentBytes)
	nsegs := len(*p.segs.Load())
	crash(s)
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	if n := len(*p.segs.Load()); n != nsegs {
		t.Fatalf("after restart %d segments, want %d", n, nsegs)
	}
	sameLive(t, "after restart", mustView(t, p), latest)
}

// runSmallSegmentRounds appends rounds of 3 records over 5 keys, one round per second of the
// append clock (so every round rolls a segment at segment.ms=100), cleans every cleanEvery
// rounds and calls check after each clean. It returns the latest value of every key.
func runSmallSegmentRounds(t *testing.T, s *Store, p *Partition, rounds, cleanEvery int, clock int64, check func(round int)) map[string][]byte {
	t.Helper()
	latest := map[string][]byte{}
	rolledFrom := len(*p.segs.Load())
	var rolls int
	for r := 1; r <= rounds; r++ {
		now := clock + int64(r)*1000
		for i := 0; i < 3; i++ {
			k, v := fmt.Sprintf("k%d", (r*3+i)%5), []byte(fmt.Sprintf("v%d-%d", r, i))
			mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, now, []kv{{k, v}}), now)
			latest[k] = v
		}
		if r%cleanEvery == 0 {
			rolls += len(*p.segs.Load()) - rolledFrom
			if err := s.RunCleaner(cleanerT0); err != nil {
				t.Fatal(err)
			}
			rolledFrom = len(*p.segs.Load())
			sameLive(t, fmt.Sprintf("round %d", r), mustView(t, p), latest)
			check(r)
		}
	}
	if rolls < rounds*9/10 {
		t.Fatalf("only %d segments rolled in %d rounds", rolls, rounds)
	}
	return latest
}

// TestCleanerStagedSourcePastStageStartsItsGroup: a source that may not fit in the group is held
// in memory up to cleanerStageBytes; one whose cleaned output passes that (here 4 MiB of keys
// that all survive, behind a group the clean shrank to about 1 MiB) starts a group of its own
// at its base, counted, with every record kept.
func TestCleanerStagedSourcePastStageStartsItsGroup(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	const segBytes = 4 << 20
	p := newPartition(t, s, map[string]string{"cleanup.policy": "compact", "segment.bytes": fmt.Sprint(segBytes),
		"min.cleanable.dirty.ratio": "0.01"})
	value := bytes.Repeat([]byte("v"), 1000)
	appendKeys := func(name func(i int) string, n int) {
		for i := 0; i < n; i += 32 {
			var recs []kv
			for j := i; j < i+32 && j < n; j++ {
				recs = append(recs, kv{name(j), value})
			}
			mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, 1, recs), 1)
		}
	}
	// Segment 1: 3 MiB of 10 keys overwritten, then keys that survive (320 KiB, then unique
	// keys up to the roll); segment 2: unique keys until it rolls.
	appendKeys(func(i int) string { return fmt.Sprintf("k%d", i%10) }, 3<<20/1100)
	appendKeys(func(i int) string { return fmt.Sprintf("b%d", i) }, 320)
	if len(*p.segs.Load()) != 1 {
		t.Fatal("the first segment rolled early")
	}
	var second int64 = -1
	for n := 0; len(*p.segs.Load()) < 3; n++ {
		appendKeys(func(i int) string { return fmt.Sprintf("u%d-%d", n, i) }, 32)
		if second < 0 && len(*p.segs.Load()) == 2 {
			second = p.active.base
		}
	}
	want, _, _ := committedView(t, p, 0)
	full := cleanerStageFullTotal.Get()
	if err := s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	segs := *p.segs.Load()
	if len(segs) != 3 || segs[1].base != second || cleanerStageFullTotal.Get() != full+1 {
		t.Fatalf("after the clean %d segments, the second at %d (want %d), stage-full counter +%d",
			len(segs), segs[1].base, second, cleanerStageFullTotal.Get()-full)
	}
	if segs[0].size.Load() > 2<<20 || segs[1].size.Load() < segBytes-(64<<10) {
		t.Fatalf("segment sizes %d and %d: want the first shrunk, the second whole", segs[0].size.Load(), segs[1].size.Load())
	}
	checkGroupedSegments(t, "after the clean", p, segBytes)
	got, _, _ := committedView(t, p, 0)
	sameLive(t, "after the clean", got, want)
}

// TestGroupFitsIn32BitRelativeOffsets: a group never spans more offsets than the 32-bit relative
// offsets of kaas's .index and .timeindex address, nor more bytes than segment.bytes.
func TestGroupFitsIn32BitRelativeOffsets(t *testing.T) {
	const base = 1000
	for _, tc := range []struct {
		pos, size, next, segBytes int64
		want                      bool
	}{
		{0, 100, base + 10, 1024, true},
		{900, 124, base + 10, 1024, true},
		{900, 125, base + 10, 1024, false},
		{0, 0, base + math.MaxInt32 + 1, 1024, true}, // last offset base+2^31-1: relative 2^31-1
		{0, 0, base + math.MaxInt32 + 2, 1024, false},
		{0, 0, base, 1024, true}, // an empty source
	} {
		if got := groupFits(base, tc.pos, tc.size, tc.next, tc.segBytes); got != tc.want {
			t.Errorf("groupFits(%d, pos %d, size %d, next %d, segment.bytes %d) = %v, want %v", base, tc.pos, tc.size, tc.next, tc.segBytes, got, tc.want)
		}
	}
}

// TestCleanerRacingRetentionStaysOnline: on a compact,delete topic retention removes segments
// (closing their files) between a clean's map pass and its rewrite; that clean is abandoned,
// not an error that takes cleaning offline, and the next one succeeds.
func TestCleanerRacingRetentionStaysOnline(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, map[string]string{"cleanup.policy": "compact,delete", "segment.bytes": "1024",
		"min.cleanable.dirty.ratio": "0.01"})
	fillKeys(t, p, 300, 50, time.Now().UnixMilli()) // young: only retention.bytes removes
	errs := cleanerErrorsTotal.Get()
	cleanerStepHook = func(p *Partition) {
		cleanerStepHook = nil
		if err := s.AlterTopicConfig("t", map[string]*string{"retention.bytes": ptr("16384")}); err != nil {
			t.Error(err)
		}
		s.RunRetention(time.Now())
	}
	defer func() { cleanerStepHook = nil }()
	if err := s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	if p.LogStartOffset() == 0 {
		t.Fatal("retention removed nothing")
	}
	if p.CleaningOffline() || cleanerErrorsTotal.Get() != errs || p.FirstDirtyOffset() != 0 {
		t.Fatalf("cleaning offline %v, cleaner errors %d (was %d), cleaned to %d", p.CleaningOffline(), cleanerErrorsTotal.Get(), errs, p.FirstDirtyOffset())
	}
	if err := s.RunCleaner(cleanerT0); err != nil || p.FirstDirtyOffset() == 0 {
		t.Fatalf("clean after retention: %v, cleaned to %d", err, p.FirstDirtyOffset())
	}
}

// TestDeleteTopicWaitsForItsClean: a clean in flight when its topic is deleted is finished
// (abandoned) before DeleteTopic returns, as Release waits for one. Otherwise the clean goes on
// creating and deleting files by its partition's path after the directory was parked, i.e. in
// whatever holds that path next (a re-created topic of the same name, whose segment and
// .cleaned names are the same ones).
func TestDeleteTopicWaitsForItsClean(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	defer s.Close()
	p := compactTopic(t, s)
	fillKeys(t, p, 400, 40, cleanerT0.UnixMilli()-1000)
	paused, resume := make(chan struct{}), make(chan struct{})
	cleanerStepHook = func(hp *Partition) {
		if hp == p {
			close(paused)
			<-resume
		}
	}
	defer func() { cleanerStepHook = nil }()
	cleanDone := make(chan error, 1)
	go func() { cleanDone <- s.RunCleaner(cleanerT0) }()
	<-paused
	delDone := make(chan error, 1)
	go func() { delDone <- s.DeleteTopic("t") }()
	eventually(t, "the deletion closes the partition", func() bool { return !p.Loaded() })
	// The deletion must not get past the clean: a bounded wait is the only way to see that it
	// stays blocked (it returns as soon as the clean ends below).
	select {
	case err := <-delDone:
		close(resume)
		t.Fatalf("DeleteTopic returned (%v) while a clean of its partition was still running", err)
	case <-time.After(time.Second):
	}
	close(resume)
	if err := <-delDone; err != nil {
		t.Fatal(err)
	}
	// The clean's file work is over when DeleteTopic returns: nothing of it is left anywhere.
	if err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, cleanedSuffix) {
			t.Errorf("%s left behind by a clean racing the deletion", path)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-cleanDone; err != nil {
		t.Fatalf("clean racing the deletion: %v (want it abandoned, not failed)", err)
	}
	if p.CleaningOffline() {
		t.Fatal("a clean abandoned by the deletion took cleaning offline")
	}
}

// TestCleanerKeepsCommitMarkerOfRetainedEmptyBatch: a committed transaction whose records were
// all compacted away but whose batch stays, empty, as its producer's last (for the sequence
// checks) keeps its COMMIT marker, as Apache keeps the marker of a transaction it still
// traverses a batch of. Without the marker, a replay of the producer state over the cleaned
// range (a .txnindex that did not load makes recovery replay from the log start) finds a
// transactional batch with no end: the transaction stays open and the LSO stays below it
// forever.
func TestCleanerKeepsCommitMarkerOfRetainedEmptyBatch(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, withoutWAL)
	p := compactTopic(t, s)
	const pid = 100
	// The producer's only transaction: k0 committed, then overwritten by a plain producer.
	g, _ := p.VerificationGuard(pid, 0)
	r := p.AppendTxn(makeKeyed(t, pid, 0, 0, true, 1000, []kv{{"k0", []byte("in-txn")}}), 0, g)
	if r.Code != codec.CodeNone {
		t.Fatalf("txn append: code %d", r.Code)
	}
	txnBatch := r.BaseOffset
	mustMarker(t, p, pid, 0, true, 0)
	fillKeys(t, p, 300, 20, 2000) // k0 among them: the transaction's record is superseded
	if err := s.RunCleaner(cleanerT0); err != nil {
		t.Fatal(err)
	}
	// Past the delete horizon the first clean stamped: a marker without records goes now.
	if err := s.RunCleaner(cleanerT0.Add(2 * cleanerTestTopicDeleteRetention * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var sawBatch, sawMarker bool
	for _, b := range readAll(t, p, p.LogStartOffset()) {
		if b.ProducerID() != pid {
			continue
		}
		if b.IsControl() {
			sawMarker = true
		} else if b.BaseOffset() == txnBatch {
			sawBatch = true
		}
	}
	if !sawBatch {
		t.Fatal("the producer's last batch was removed by the clean")
	}
	if !sawMarker {
		t.Fatalf("the COMMIT marker of the transaction whose (empty) batch at %d stays was removed", txnBatch)
	}
	hwm := p.HighWatermark()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A .txnindex that does not load: recovery replays the producer state from the log start.
	if err := os.Remove(filepath.Join(p.dir, epochFileName(0, noEpoch, ".txnindex"))); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, withoutWAL)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	if lso := p.LastStableOffset(); lso != hwm || p.HighWatermark() != hwm {
		t.Fatalf("after a replay over the cleaned range: LSO %d, HWM %d (was %d)", lso, p.HighWatermark(), hwm)
	}
}

// TestCleanerSwapFailureAfterMarkerKeepsFilesForRecovery: a swap that fails after its marker
// (a merged source that cannot be deleted) leaves the disk half way to the new set, which the
// next open finishes, while the partition serves on from the old list. The first source's
// name then holds its whole group: retention removing that (old) first segment by name must
// not delete the group file, or the next open, finishing the swap, deletes the other sources
// too and loses records retention never expired.
func TestCleanerSwapFailureAfterMarkerKeepsFilesForRecovery(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, withoutWAL)
	const retentionMs = 1_000_000
	p := newPartition(t, s, map[string]string{"cleanup.policy": "compact,delete", "segment.bytes": "1024",
		"retention.ms": fmt.Sprint(retentionMs), "min.cleanable.dirty.ratio": "0.01",
		"delete.retention.ms": fmt.Sprint(cleanerTestTopicDeleteRetention)})
	ts0 := cleanerT0.UnixMilli() - 100_000
	// Mostly overwrites (the clean empties segments, so groups merge several), and every
	// tenth record a key of its own that survives the clean wherever it is.
	for i := 0; i < 400; i++ {
		k := fmt.Sprintf("k%d", i%40)
		if i%10 == 0 {
			k = fmt.Sprintf("u%d", i)
		}
		mustAppend(t, p, makeKeyed(t, -1, 0, 0, false, ts0+int64(i), []kv{{k, []byte(fmt.Sprintf("value-%06d", i))}}), 0)
	}
	segs := *p.segs.Load()
	if len(segs) < 4 {
		t.Fatalf("only %d segments", len(segs))
	}
	_, firstMaxTs, _ := segs[0].stats()
	// A merged source whose file cannot be deleted: every closed segment but the first gets
	// a non-empty directory as its .txnindex once the clean has written its groups.
	var blocked []string
	cleanerCrashAt = func(at string) bool {
		if at == "before-marker" {
			for _, sg := range segs[1 : len(segs)-1] {
				path := sg.path(".txnindex")
				_ = os.Remove(path)
				if err := os.MkdirAll(filepath.Join(path, "x"), 0o755); err != nil {
					t.Error(err)
				}
				blocked = append(blocked, path)
			}
		}
		return false
	}
	err := s.RunCleaner(cleanerT0)
	cleanerCrashAt = nil
	if err == nil {
		t.Fatal("the swap did not fail")
	}
	if _, err := os.Stat(filepath.Join(p.dir, cleanerSwapName)); err != nil {
		t.Fatalf("no swap marker after the failure: %v", err)
	}
	// Retention expires the old first segment only; what the partition serves after that is
	// what the reopen must give.
	s.RunRetention(time.UnixMilli(firstMaxTs + retentionMs + 1))
	if p.LogStartOffset() != segs[1].base {
		t.Fatalf("retention moved the log start to %d, want %d", p.LogStartOffset(), segs[1].base)
	}
	want, _, _ := committedView(t, p, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, path := range blocked {
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
	}
	s = openStore(t, dir, withoutWAL)
	defer s.Close()
	rp := s.Topic("t").Partition(0)
	if rp.LogStartOffset() != segs[1].base {
		t.Fatalf("log start %d after the reopen, was %d", rp.LogStartOffset(), segs[1].base)
	}
	got, _, _ := committedView(t, rp, 0)
	sameLive(t, "after the reopen that finished the swap", got, want)
}
