package storage

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage/crashfs"
)

var clusterTopicID = [16]byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x40, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x01}

// hostFS adapts a crashfs host to the storage FS interface.
type hostFS struct{ h *crashfs.Host }

func (f hostFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	cf, err := f.h.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return cf, nil
}

func clusterWALDir(dir string, id int32, inc string) string { return ClusterWALDir(dir, id, inc) }

// openClusterStore opens a Lazy cluster-mode store of broker id, incarnation inc, on the shared
// volume dir, with fs (nil = the OS) and the WAL on.
func openClusterStore(t testing.TB, dir string, id int32, inc string, fs FS, mod ...func(*Config)) *Store {
	t.Helper()
	cfg := Config{Dir: dir, IndexIntervalBytes: 256, WAL: true, walGenBytes: 1 << 20, walCheckpointEvery: time.Hour,
		Lazy: true, Incarnation: inc, BrokerID: id, WALDir: clusterWALDir(dir, id, inc), FS: fs}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnsureTopic("t", clusterTopicID, 1, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

func takeOver(t testing.TB, s *Store, epoch int32, h Handover) (*Partition, TakeoverStats) {
	t.Helper()
	st, err := s.TakeOver("t", 0, epoch, h)
	if err != nil {
		t.Fatalf("take over at epoch %d: %v", epoch, err)
	}
	p := s.Topic("t").Partition(0)
	if !p.Loaded() || p.LeaderEpoch() != epoch {
		t.Fatalf("after takeover: loaded %v, epoch %d", p.Loaded(), p.LeaderEpoch())
	}
	if p.HighWatermark() != p.LogEndOffset() {
		t.Fatalf("after takeover: HWM %d != LEO %d", p.HighWatermark(), p.LogEndOffset())
	}
	return p, st
}

// appendN appends n acked single-record batches of producer pid from sequence seq on.
func appendN(t testing.TB, p *Partition, pid int64, seq int32, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		mustAppend(t, p, makeBatch(t, tb{pid: pid, seq: seq + int32(i), value: 100}), time.Now().UnixMilli())
	}
}

// checkLog reads the whole partition and checks offsets 0..want-1 appear exactly once, in order.
func checkLog(t testing.TB, p *Partition, want int64) []codec.Batch {
	t.Helper()
	bs := readAll(t, p, 0)
	next := int64(0)
	for _, b := range bs {
		if b.BaseOffset() != next {
			t.Fatalf("batch at offset %d, want %d", b.BaseOffset(), next)
		}
		next = b.LastOffset() + 1
	}
	if next != want {
		t.Fatalf("log holds offsets up to %d, want %d", next, want)
	}
	return bs
}

func readEpochFile(t testing.TB, dir string, e int32) *epochRecord {
	t.Helper()
	recs, err := readEpochRecords(filepath.Join(dir, "topics", "t", "0"))
	if err != nil {
		t.Fatal(err)
	}
	return recs[e]
}

func TestTakeOverSalvagesAckedRecordsAfterCrash(t *testing.T) {
	dir := t.TempDir()
	cfs := crashfs.New()
	a := openClusterStore(t, dir, 1, "a1", hostFS{cfs.Host("a")})
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, 7, 0, 10) // acked through the WAL; the segment is unsynced in a's cache
	if cfs.Unsynced("a") == 0 {
		t.Fatal("test needs unsynced segment bytes on host a")
	}
	cfs.Crash("a")
	crash(a)

	b := openClusterStore(t, dir, 2, "b1", hostFS{cfs.Host("b")})
	defer b.Close()
	deadWAL := clusterWALDir(dir, 1, "a1")
	if removed, err := b.RemoveDeadWAL(deadWAL); err != nil || removed {
		t.Fatalf("RemoveDeadWAL before any takeover: removed %v, err %v", removed, err)
	}
	// A taker at epoch 2 that crashed mid-takeover left a segment and no epoch file: ignored.
	part := filepath.Join(dir, "topics", "t", "0")
	junk := makeBatch(t, tb{value: 50})
	if err := os.WriteFile(filepath.Join(part, epochFileName(0, 2, ".log")), junk, 0o644); err != nil {
		t.Fatal(err)
	}
	pb, st := takeOver(t, b, 3, Handover{PrevWALDir: deadWAL, PrevInc: "a1", PrevEpoch: 2})
	if st.Salvaged != 10 {
		t.Fatalf("salvaged %d batches, want 10", st.Salvaged)
	}
	if pb.HighWatermark() != 10 {
		t.Fatalf("HWM %d, want 10", pb.HighWatermark())
	}
	for _, bt := range checkLog(t, pb, 10) {
		if bt.PartitionLeaderEpoch() != 1 {
			t.Fatalf("salvaged batch at %d carries epoch %d, want the epoch it was acked under (1)", bt.BaseOffset(), bt.PartitionLeaderEpoch())
		}
	}
	rec := readEpochFile(t, dir, 3)
	if rec == nil || rec.Inc != "b1" || rec.Broker != 2 || rec.StartOffset != 10 || rec.Salvaged == nil ||
		rec.Salvaged.From != 0 || rec.Salvaged.To != 10 || rec.Prev == nil || rec.Prev.Epoch != 1 || rec.Prev.End != 0 {
		t.Fatalf("epoch-3.json = %+v", rec)
	}
	// The producer state came back with the salvaged batches: a retry is a duplicate.
	if r := pb.Append(makeBatch(t, tb{pid: 7, seq: 9, value: 100}), time.Now().UnixMilli()); !r.Duplicate || r.BaseOffset != 9 {
		t.Fatalf("retry of the last salvaged batch: %+v", r)
	}
	appendN(t, pb, 7, 10, 2)
	if removed, err := b.RemoveDeadWAL(deadWAL); err != nil || !removed {
		t.Fatalf("RemoveDeadWAL after the takeover: removed %v, err %v", removed, err)
	}
	if _, err := os.Stat(deadWAL); !os.IsNotExist(err) {
		t.Fatalf("dead WAL still there: %v", err)
	}
}

// TestCrashTakeoverSalvagesLastWriterNotForwardingAssignee guards the forwarded handover: the
// partition moved from crashed holder a (epoch 1) to c (epoch 2), which never loaded it and
// passed a's handover on; the taker at epoch 3 is told "previous: c". c's WAL holds nothing
// of the partition, so salvaging it would find no gap and lose a's acknowledged tail; the
// epoch chain names a as the last writer, and its WAL is salvaged.
func TestCrashTakeoverSalvagesLastWriterNotForwardingAssignee(t *testing.T) {
	dir := t.TempDir()
	cfs := crashfs.New()
	a := openClusterStore(t, dir, 1, "a1", hostFS{cfs.Host("a")})
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, 7, 0, 10)
	cfs.Crash("a")
	crash(a)
	c := openClusterStore(t, dir, 3, "c1", hostFS{cfs.Host("c")}) // running, never took the partition
	defer c.Close()

	b := openClusterStore(t, dir, 2, "b1", hostFS{cfs.Host("b")})
	defer b.Close()
	pb, st := takeOver(t, b, 3, Handover{PrevWALDir: clusterWALDir(dir, 3, "c1"), PrevInc: "c1", PrevEpoch: 2})
	if st.Salvaged != 10 || pb.HighWatermark() != 10 {
		t.Fatalf("salvaged %d batches, HWM %d; want a's 10 acknowledged records", st.Salvaged, pb.HighWatermark())
	}
	checkLog(t, pb, 10)
}

// TestCleanCloseWithoutReleaseKeepsWALForSuccessor guards a broker stopped without draining
// (SIGINT, a drain timeout): its store closes cleanly but writes no release record, so the
// successor takes over as after a crash and salvages the holder's WAL. A clean close used to
// delete the WAL, and every such takeover then failed on the missing directory.
func TestCleanCloseWithoutReleaseKeepsWALForSuccessor(t *testing.T) {
	dir := t.TempDir()
	a := openClusterStore(t, dir, 1, "a1", nil)
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, 7, 0, 5)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(clusterWALDir(dir, 1, "a1")); err != nil {
		t.Fatalf("clean close in cluster mode removed the WAL: %v", err)
	}
	b := openClusterStore(t, dir, 2, "b1", nil)
	defer b.Close()
	pb, _ := takeOver(t, b, 2, Handover{PrevWALDir: clusterWALDir(dir, 1, "a1"), PrevInc: "a1", PrevEpoch: 1})
	checkLog(t, pb, 5)
}

func TestTakeOverRefusesSalvageGap(t *testing.T) {
	dir := t.TempDir()
	a := openClusterStore(t, dir, 1, "a1", nil)
	pa, _ := takeOver(t, a, 1, Handover{})
	// Batches of ~400 KiB in 1 MiB generations: the first generation holds offsets 0 and 1 only.
	for i := 0; i < 6; i++ {
		mustAppend(t, pa, makeBatch(t, tb{value: 400 << 10}), time.Now().UnixMilli())
	}
	segName := pa.active.name(".log")
	crash(a)
	// The volume lost the segment and the oldest generation: offsets 0 and 1 are nowhere.
	part := filepath.Join(dir, "topics", "t", "0")
	if err := os.Truncate(filepath.Join(part, segName), 0); err != nil {
		t.Fatal(err)
	}
	deadWAL := clusterWALDir(dir, 1, "a1")
	// The checkpointer may already have deleted the oldest generations (after fsyncing the
	// segment, which the volume then lost): drop generations until offset 0 is in none.
	firstBase := func() (int64, int) {
		lo, n := int64(-1), 0
		if _, _, err := scanWAL(deadWAL, false, a.log, func(r *walRecord, _ uint64, _ int) error {
			if lo < 0 || r.base < lo {
				lo = r.base
			}
			n++
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return lo, n
	}
	for lo, _ := firstBase(); lo == 0; lo, _ = firstBase() {
		seqs, err := listWALGens(deadWAL, false)
		if err != nil || len(seqs) < 2 {
			t.Fatalf("generations %v, %v", seqs, err)
		}
		if err := os.Remove(filepath.Join(deadWAL, walGenName(seqs[0]))); err != nil {
			t.Fatal(err)
		}
	}
	if lo, n := firstBase(); lo <= 0 || n == 0 {
		t.Fatalf("WAL records: %d from offset %d; the test needs some, none at offset 0", n, lo)
	}
	before, _ := os.ReadDir(part)

	b := openClusterStore(t, dir, 2, "b1", nil)
	defer b.Close()
	gaps := salvageGapsTotal.Get()
	_, err := b.TakeOver("t", 0, 2, Handover{PrevWALDir: deadWAL, PrevInc: "a1", PrevEpoch: 1})
	if !errors.Is(err, ErrSalvageGap) {
		t.Fatalf("takeover over a gap: %v, want ErrSalvageGap", err)
	}
	if salvageGapsTotal.Get() != gaps+1 {
		t.Fatal("kaas_storage_salvage_gaps_total did not count the refusal")
	}
	if b.Topic("t").Partition(0).Loaded() {
		t.Fatal("partition loaded after a refused takeover")
	}
	after, _ := os.ReadDir(part)
	if len(after) != len(before) {
		var names []string
		for _, e := range after {
			names = append(names, e.Name())
		}
		t.Fatalf("refused takeover wrote files: before %d entries, after %v", len(before), names)
	}
}

func TestZombieWritesPastRecordedEndAreIgnored(t *testing.T) {
	dir := t.TempDir()
	cfs := crashfs.New()
	var aAlive atomic.Bool
	aAlive.Store(true)
	a := openClusterStore(t, dir, 1, "a1", hostFS{cfs.Host("a")}, func(c *Config) { c.Publish = aAlive.Load })
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, -1, 0, 3)
	if err := pa.checkpointSync(); err != nil { // the three batches are in the segment on the volume
		t.Fatal(err)
	}
	zombieSeg := filepath.Join(dir, "topics", "t", "0", pa.active.name(".log"))
	cfs.Crash("a") // a is presumed dead: its lease expired

	b := openClusterStore(t, dir, 2, "b1", hostFS{cfs.Host("b")})
	pb, st := takeOver(t, b, 2, Handover{PrevWALDir: clusterWALDir(dir, 1, "a1"), PrevInc: "a1", PrevEpoch: 1})
	if st.Scanned == 0 || st.Salvaged != 0 {
		t.Fatalf("stats %+v: want a scan of a's segment and nothing to salvage", st)
	}
	appendN(t, pb, -1, 0, 2)
	capEnd := readEpochFile(t, dir, 2).Prev.End

	// a wakes up (SIGCONT) and keeps writing: its page cache reaches the volume, but its lease
	// deadline has passed, so nothing is acknowledged and its HWM stays.
	cfs.Zombie("a")
	aAlive.Store(false)
	r := pa.Append(makeBatch(t, tb{value: 100}), time.Now().UnixMilli())
	if r.Code != codec.CodeNone {
		t.Fatalf("zombie append: code %d", r.Code)
	}
	if err := syncWait(pa, r.LastOffset+1); !errors.Is(err, ErrFenced) || ErrorCode(err) != codec.CodeNotLeaderForPartition {
		t.Fatalf("zombie ack: %v, want ErrFenced (6)", err)
	}
	if pa.HighWatermark() != 3 {
		t.Fatalf("zombie HWM moved to %d", pa.HighWatermark())
	}
	_ = pa.checkpointSync() // its segment bytes reach the file
	crash(a)
	if fi, err := os.Stat(zombieSeg); err != nil || fi.Size() <= capEnd {
		t.Fatalf("zombie segment size %v (err %v), recorded end %d: the test wants bytes past the end", fi.Size(), err, capEnd)
	}
	// b still reads only its view.
	checkLog(t, pb, 5)
	cfs.Crash("b")
	crash(b)

	c := openClusterStore(t, dir, 3, "c1", hostFS{cfs.Host("c")})
	defer c.Close()
	pc, _ := takeOver(t, c, 3, Handover{PrevWALDir: clusterWALDir(dir, 2, "b1"), PrevInc: "b1", PrevEpoch: 2})
	checkLog(t, pc, 5)
	if pc.LogEndOffset() != 5 {
		t.Fatalf("LEO %d, want 5 (the zombie's batch is not part of the log)", pc.LogEndOffset())
	}
}

func TestGracefulReleaseThenTakeOverScansNothing(t *testing.T) {
	dir := t.TempDir()
	a := openClusterStore(t, dir, 1, "a1", nil)
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, 9, 0, 5)
	rec, err := a.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Inc != "a1" || rec.Epoch != 1 || rec.EndOffset != 5 || rec.End == 0 || rec.Segment != epochFileName(0, 1, ".log") {
		t.Fatalf("release record %+v", rec)
	}
	if r := pa.Append(makeBatch(t, tb{value: 10}), 0); r.Code != codec.CodeNotLeaderForPartition {
		t.Fatalf("append after release: code %d, want 6", r.Code)
	}
	b := openClusterStore(t, dir, 2, "b1", nil)
	defer b.Close()
	defer a.Close()
	pb, st := takeOver(t, b, 2, Handover{Release: &rec, PrevInc: "a1", PrevEpoch: 1})
	if st.Scanned != 0 || st.Salvaged != 0 {
		t.Fatalf("graceful takeover: %+v, want no scan and no salvage", st)
	}
	checkLog(t, pb, 5)
	if r := pb.Append(makeBatch(t, tb{pid: 9, seq: 4, value: 100}), time.Now().UnixMilli()); !r.Duplicate {
		t.Fatalf("producer state lost in the handover: %+v", r)
	}
	if r := pb.Append(makeBatch(t, tb{pid: 9, seq: 5, value: 100}), time.Now().UnixMilli()); r.Code != codec.CodeNone || r.BaseOffset != 5 {
		t.Fatalf("next append: %+v", r)
	}
	// A release record that does not match the volume is refused.
	bad := rec
	bad.EndOffset = 4
	c := openClusterStore(t, dir, 3, "c1", nil)
	defer c.Close()
	if _, err := c.TakeOver("t", 0, 3, Handover{Release: &bad}); err == nil {
		t.Fatal("takeover with a wrong release record succeeded")
	}
}

func TestEpochChainOverThreeTakeovers(t *testing.T) {
	dir := t.TempDir()
	a := openClusterStore(t, dir, 1, "a1", nil)
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, -1, 0, 5) // epoch 1: [0, 5)
	rec, err := a.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()

	b := openClusterStore(t, dir, 2, "b1", nil)
	pb, _ := takeOver(t, b, 2, Handover{Release: &rec})
	appendN(t, pb, -1, 0, 3) // epoch 2: [5, 8)
	crash(b)                 // kill -9: page cache survives, the WAL is there too

	c := openClusterStore(t, dir, 3, "c1", nil)
	pc, st := takeOver(t, c, 3, Handover{PrevWALDir: clusterWALDir(dir, 2, "b1"), PrevInc: "b1", PrevEpoch: 2})
	if st.Scanned == 0 {
		t.Fatal("crash takeover scanned nothing")
	}
	appendN(t, pc, -1, 0, 2) // epoch 3: [8, 10)
	rec, err = c.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	d := openClusterStore(t, dir, 4, "d1", nil)
	defer d.Close()
	pd, _ := takeOver(t, d, 4, Handover{Release: &rec})
	appendN(t, pd, -1, 0, 1) // epoch 4: [10, 11)
	wantEpoch := []int32{1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4}
	for _, bt := range checkLog(t, pd, 11) {
		if got := bt.PartitionLeaderEpoch(); got != wantEpoch[bt.BaseOffset()] {
			t.Fatalf("batch %d stamped with epoch %d, want %d", bt.BaseOffset(), got, wantEpoch[bt.BaseOffset()])
		}
	}
	for _, c := range []struct {
		req, epoch int32
		end        int64
	}{{0, 0, 0}, {1, 1, 5}, {2, 2, 8}, {3, 3, 10}, {4, 4, 11}, {5, -1, -1}} {
		if e, end := pd.EndOffsetForEpoch(c.req); e != c.epoch || end != c.end {
			t.Errorf("EndOffsetForEpoch(%d) = (%d, %d), want (%d, %d)", c.req, e, end, c.epoch, c.end)
		}
	}
	// Each epoch file names where the previous epoch ended.
	for _, c := range []struct {
		e, prev int32
		end     int64
	}{{2, 1, 5}, {3, 2, 8}, {4, 3, 10}} {
		r := readEpochFile(t, dir, c.e)
		if r == nil || r.Prev == nil || r.Prev.Epoch != c.prev || r.Prev.EndOffset != c.end {
			t.Errorf("epoch-%d.json = %+v, want prev epoch %d ending at %d", c.e, r, c.prev, c.end)
		}
	}
	// A stale taker is refused.
	if _, err := d.TakeOver("t", 0, 4, Handover{}); err != nil {
		t.Fatalf("takeover at the loaded epoch should be a no-op: %v", err)
	}
}

func TestPublishFalseWithholdsAckAndHWM(t *testing.T) {
	var alive atomic.Bool
	alive.Store(true)
	for _, wal := range []bool{true, false} {
		t.Run(map[bool]string{true: "wal", false: "segment"}[wal], func(t *testing.T) {
			alive.Store(true)
			dir := t.TempDir()
			s := openClusterStore(t, dir, 1, "a1", nil, func(c *Config) { c.WAL = wal; c.Publish = alive.Load })
			defer s.Close()
			p, _ := takeOver(t, s, 1, Handover{})
			appendN(t, p, -1, 0, 2)
			alive.Store(false)
			r := p.Append(makeBatch(t, tb{value: 10}), time.Now().UnixMilli())
			if r.Code != codec.CodeNone {
				t.Fatalf("append: code %d", r.Code)
			}
			if err := syncWait(p, r.LastOffset+1); !errors.Is(err, ErrFenced) {
				t.Fatalf("ack after the deadline: %v, want ErrFenced", err)
			}
			if p.HighWatermark() != 2 {
				t.Fatalf("HWM advanced to %d after the deadline", p.HighWatermark())
			}
			if !s.Fenced() {
				t.Fatal("store not fenced")
			}
			alive.Store(true) // fenced for good, whatever the lease says now
			if r := p.Append(makeBatch(t, tb{value: 10}), time.Now().UnixMilli()); r.Code != codec.CodeNotLeaderForPartition {
				t.Fatalf("append after fencing: code %d, want 6", r.Code)
			}
			if _, code := p.Read(nil, 0, 1<<20, 10); code != codec.CodeNotLeaderForPartition {
				t.Fatalf("read after fencing: code %d, want 6", code)
			}
			if err := syncWait(p, 10); !errors.Is(err, ErrFenced) {
				t.Fatalf("sync after fencing: %v", err)
			}
		})
	}
}

func TestEnsureTopicRaceOnOneVolume(t *testing.T) {
	dir := t.TempDir()
	open := func(inc string) *Store {
		s, err := Open(Config{Dir: dir, Lazy: true, Incarnation: inc, WALDir: clusterWALDir(dir, 1, inc)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s1, s2 := open("x1"), open("x2")
	defer s1.Close()
	defer s2.Close()
	cfgs := map[string]string{"retention.ms": "1000"}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, s := range []*Store{s1, s2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 20 && errs[i] == nil; k++ {
				_, errs[i] = s.EnsureTopic("race", clusterTopicID, 3, cfgs)
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	for _, s := range []*Store{s1, s2} {
		top := s.Topic("race")
		if top.ID != clusterTopicID || top.NumPartitions() != 3 || top.Config().RetentionMs != 1000 || top.Partition(0).Loaded() {
			t.Fatalf("topic %x with %d partitions, retention %d", top.ID, top.NumPartitions(), top.Config().RetentionMs)
		}
	}
	buf, err := os.ReadFile(filepath.Join(dir, "topics", "race", topicMetaFile))
	if err != nil {
		t.Fatal(err)
	}
	var m topicMeta
	if err := json.Unmarshal(buf, &m); err != nil || m.Partitions != 3 {
		t.Fatalf("topic.json %s: %v", buf, err)
	}
	other := clusterTopicID
	other[0]++
	if _, err := s2.EnsureTopic("race", other, 3, nil); !errors.Is(err, ErrTopicExists) {
		t.Fatalf("EnsureTopic with another id: %v", err)
	}
	if err := s1.EnsurePartitions("race", 5); err != nil {
		t.Fatal(err)
	}
	if err := s1.EnsurePartitions("race", 4); err != nil || s1.Topic("race").NumPartitions() != 5 {
		t.Fatalf("EnsurePartitions below the count: %v, %d", err, s1.Topic("race").NumPartitions())
	}
	// A broker that has not applied the growth yet rewrites topic.json (a config change): the
	// count on the volume does not go back.
	if err := s2.AlterTopicConfig("race", map[string]*string{"retention.ms": ptr("2000")}); err != nil {
		t.Fatal(err)
	}
	if m, err := readTopicMeta(filepath.Join(dir, "topics", "race")); err != nil || m.Partitions != 5 {
		t.Fatalf("topic.json after a stale rewrite: %+v, %v", m, err)
	}
	// A third broker opening the volume later finds the topic with its grown count.
	s3 := open("x3")
	defer s3.Close()
	if top := s3.Topic("race"); top == nil || top.ID != clusterTopicID || top.NumPartitions() != 5 || top.Partition(4).Loaded() {
		t.Fatalf("third store: %+v", top)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "topics", "race"))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("temp file left behind: %s", e.Name())
		}
	}
}

func TestLazyOpenDoesNotReplayWAL(t *testing.T) {
	dir := t.TempDir()
	walDir := clusterWALDir(dir, 1, "a1")
	a := openClusterStore(t, dir, 1, "a1", nil)
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, -1, 0, 3)
	crash(a)
	// Reopening with the same (not fresh) WAL directory is refused: it needs salvage by a taker.
	if _, err := Open(Config{Dir: dir, Lazy: true, WAL: true, Incarnation: "a1", WALDir: walDir}); err == nil {
		t.Fatal("lazy open over a used WAL directory succeeded")
	}
	b := openClusterStore(t, dir, 2, "b1", nil)
	defer b.Close()
	if p := b.Topic("t").Partition(0); p.Loaded() || p.LogEndOffset() != 0 {
		t.Fatalf("lazy open loaded the partition (LEO %d)", p.LogEndOffset())
	}
	if seqs, _ := listWALGens(walDir, false); len(seqs) == 0 {
		t.Fatal("lazy open touched the dead WAL")
	}
}

func TestSelfTestVolume(t *testing.T) {
	dir := t.TempDir()
	if err := SelfTestVolume(dir); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("probe left behind: %v", ents)
	}
	missing := filepath.Join(dir, "nope")
	err := SelfTestVolume(missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "write and fsync") {
		t.Fatalf("self-test of a missing dir: %v", err)
	}
}

func TestTakeOverAcrossRolledSegments(t *testing.T) {
	dir := t.TempDir()
	small := map[string]string{"segment.bytes": "1024"}
	cfs := crashfs.New()
	a := openClusterStore(t, dir, 1, "a1", hostFS{cfs.Host("a")})
	if _, err := a.EnsureTopic("r", clusterTopicID, 1, small); err == nil {
		t.Fatal("EnsureTopic of a second name with the same id should collide in the id index")
	}
	if err := a.AlterTopicConfig("t", map[string]*string{"segment.bytes": ptr("1024")}); err != nil {
		t.Fatal(err)
	}
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, 3, 0, 20) // ~190 bytes each: several epoch-1 segments, rolled (fsync'd) ones and an open one
	if n := len(*pa.segs.Load()); n < 3 {
		t.Fatalf("%d segments, want rolls", n)
	}
	cfs.Crash("a")
	crash(a)

	b := openClusterStore(t, dir, 2, "b1", hostFS{cfs.Host("b")})
	pb, st := takeOver(t, b, 2, Handover{PrevWALDir: clusterWALDir(dir, 1, "a1")})
	if st.Salvaged == 0 {
		t.Fatal("the open segment's unsynced tail should have come from the WAL")
	}
	checkLog(t, pb, 20)
	appendN(t, pb, 3, 20, 10)
	rec, err := b.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()

	c := openClusterStore(t, dir, 3, "c1", hostFS{cfs.Host("c")})
	defer c.Close()
	pc, st := takeOver(t, c, 3, Handover{Release: &rec})
	checkLog(t, pc, 30)
	if r := pc.Append(makeBatch(t, tb{pid: 3, seq: 29, value: 100}), time.Now().UnixMilli()); !r.Duplicate {
		t.Fatalf("producer state lost: %+v", r)
	}
	// Epoch 1's open segment has no index of its own (a crashed): b left its indexes under
	// epoch 2's names, so c scans nothing.
	if st.Scanned != 0 {
		t.Fatalf("graceful takeover scanned %d bytes", st.Scanned)
	}
}

func TestTakeOverOfSingleBrokerData(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, withWAL)
	p := newPartition(t, s, nil)
	appendN(t, p, -1, 0, 4)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The single-broker topic has a random id; a cluster store ensures it with the same one.
	c, err := Open(Config{Dir: dir, Lazy: true, WAL: true, Incarnation: "c1", WALDir: clusterWALDir(dir, 1, "c1")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, _ := takeOver(t, c, 1, Handover{})
	bs := checkLog(t, pc, 4)
	if bs[0].PartitionLeaderEpoch() != 0 {
		t.Fatalf("single-broker batch epoch %d", bs[0].PartitionLeaderEpoch())
	}
	appendN(t, pc, -1, 0, 1)
	if e, end := pc.EndOffsetForEpoch(0); e != 0 || end != 4 {
		t.Fatalf("EndOffsetForEpoch(0) = (%d, %d), want (0, 4)", e, end)
	}
	part := filepath.Join(dir, "topics", "t", "0")
	for _, name := range []string{segmentName(0, ".log"), epochFileName(4, 1, ".log"), epochRecordName(1)} {
		if _, err := os.Stat(filepath.Join(part, name)); err != nil {
			t.Fatalf("want %s: %v", name, err)
		}
	}
}

func TestCrashTakeoverScansFromRecoveryCheckpoint(t *testing.T) {
	dir := t.TempDir()
	a := openClusterStore(t, dir, 1, "a1", nil, func(c *Config) { c.recoveryCheckpointBytes = 4096 })
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, 5, 0, 40)
	if err := pa.checkpointSync(); err != nil { // the WAL checkpointer's segment fsync
		t.Fatal(err)
	}
	ckPos := pa.active.ckptPos.Load()
	if ckPos == 0 {
		t.Fatal("no recovery checkpoint written")
	}
	appendN(t, pa, 5, 40, 10)
	total := pa.active.size.Load()
	crash(a)

	b := openClusterStore(t, dir, 2, "b1", nil)
	defer b.Close()
	pb, st := takeOver(t, b, 2, Handover{PrevWALDir: clusterWALDir(dir, 1, "a1")})
	if st.Scanned != total-ckPos {
		t.Fatalf("scanned %d bytes, want %d (from the checkpoint at %d to the end %d)", st.Scanned, total-ckPos, ckPos, total)
	}
	checkLog(t, pb, 50)
	// The index loaded from the checkpoint serves reads from the middle.
	for _, off := range []int64{1, 17, 39, 40, 49} {
		buf, code := pb.Read(nil, off, 1, pb.HighWatermark())
		if b, ok, bad := codec.FrameBatch(buf); code != codec.CodeNone || !ok || bad || b.BaseOffset() != off {
			t.Fatalf("read at %d: code %d, %d bytes", off, code, len(buf))
		}
	}
	if r := pb.Append(makeBatch(t, tb{pid: 5, seq: 49, value: 100}), time.Now().UnixMilli()); !r.Duplicate {
		t.Fatalf("producer state lost: %+v", r)
	}
}

func TestRetriedTakeoverRemovesItsOwnLeftovers(t *testing.T) {
	dir := t.TempDir()
	a := openClusterStore(t, dir, 1, "a1", nil)
	pa, _ := takeOver(t, a, 1, Handover{})
	appendN(t, pa, -1, 0, 3)
	rec, err := a.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	// An earlier attempt at epoch 2 on this broker failed after writing segments (no epoch file).
	part := filepath.Join(dir, "topics", "t", "0")
	stale := []string{epochFileName(3, 2, ".log"), epochFileName(900, 2, ".log"), epochFileName(900, 2, ".snapshot")}
	for _, name := range stale {
		if err := os.WriteFile(filepath.Join(part, name), makeBatch(t, tb{value: 10}), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := openClusterStore(t, dir, 2, "b1", nil)
	pb, _ := takeOver(t, b, 2, Handover{Release: &rec})
	appendN(t, pb, -1, 0, 1)
	if _, err := os.Stat(filepath.Join(part, stale[1])); !os.IsNotExist(err) {
		t.Fatalf("stale segment of the failed attempt still there: %v", err)
	}
	rec, err = b.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	c := openClusterStore(t, dir, 3, "c1", nil)
	defer c.Close()
	pc, _ := takeOver(t, c, 3, Handover{Release: &rec})
	checkLog(t, pc, 4)
}

func TestClusterModeRequiresLazyAndTakeOver(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(Config{Dir: dir, Incarnation: "x"}); err == nil {
		t.Fatal("cluster mode without Lazy opened")
	}
	s := openClusterStore(t, dir, 1, "a1", nil)
	defer s.Close()
	if err := s.LoadPartition("t", 0, 1); err == nil {
		t.Fatal("LoadPartition in cluster mode succeeded")
	}
	single := openStore(t, "")
	defer single.Close()
	newPartition(t, single, nil)
	if _, err := single.TakeOver("t", 0, 1, Handover{}); err == nil {
		t.Fatal("TakeOver in single-broker mode succeeded")
	}
}

func TestTxnStateSurvivesCrashAndGracefulTakeovers(t *testing.T) {
	dir := t.TempDir()
	cfs := crashfs.New()
	a := openClusterStore(t, dir, 1, "a1", hostFS{cfs.Host("a")})
	if err := a.AlterTopicConfig("t", map[string]*string{"segment.bytes": ptr("1024")}); err != nil {
		t.Fatal(err)
	}
	pa, _ := takeOver(t, a, 1, Handover{})
	m := runTxnWorkload(t, pa, 150)
	m.check(t, pa)
	// The open segment reaches the volume (a WAL checkpoint), so b scans a non-empty one.
	if err := pa.checkpointSync(); err != nil {
		t.Fatal(err)
	}
	cfs.Crash("a")
	crash(a)

	b := openClusterStore(t, dir, 2, "b1", hostFS{cfs.Host("b")})
	pb, _ := takeOver(t, b, 2, Handover{PrevWALDir: clusterWALDir(dir, 1, "a1")})
	m.check(t, pb)
	rec, err := b.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()

	c := openClusterStore(t, dir, 3, "c1", hostFS{cfs.Host("c")})
	defer c.Close()
	pc, st := takeOver(t, c, 3, Handover{Release: &rec})
	m.check(t, pc)
	if _, err := os.Stat(filepath.Join(dir, "topics", "t", "0", prevCkptName(2))); err != nil {
		t.Fatalf("b left no indexes for epoch 1's open segment: %v", err)
	}
	if st.Scanned != 0 {
		t.Fatalf("graceful takeover scanned %d bytes", st.Scanned)
	}
	// Without the indexes b left for epoch 1's open segment, c's successor scans it and
	// rebuilds the same state.
	for _, name := range []string{prevCkptName(2), prevTxnName(2)} {
		if err := os.Remove(filepath.Join(dir, "topics", "t", "0", name)); err != nil {
			t.Fatal(err)
		}
	}
	rec, err = c.Release("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	d := openClusterStore(t, dir, 4, "d1", nil)
	defer d.Close()
	pd, st := takeOver(t, d, 4, Handover{Release: &rec})
	m.check(t, pd)
	if want := readEpochFile(t, dir, 2).Prev.End; st.Scanned != want {
		t.Fatalf("scanned %d bytes, want epoch 1's capped open segment (%d)", st.Scanned, want)
	}
}

func TestDeleteTopicOnSharedVolume(t *testing.T) {
	dir := t.TempDir()
	s1 := openClusterStore(t, dir, 1, "a1", nil)
	defer s1.Close()
	s2 := openClusterStore(t, dir, 2, "b1", nil)
	defer s2.Close()
	if err := s1.DeleteTopic("t"); err != nil {
		t.Fatal(err)
	}
	if err := s2.DeleteTopic("t"); err != nil {
		t.Fatalf("second broker deleting the same topic: %v", err)
	}
	if s2.Topic("t") != nil {
		t.Fatal("topic still known")
	}
	if removed, err := s1.RemoveDeadWAL(filepath.Join(dir, "__cluster", "wal", "b9-ix")); err != nil || !removed {
		t.Fatalf("RemoveDeadWAL of a missing dir: %v, %v", removed, err)
	}
}

// TestParkTopicAndRecreateOnSharedVolume: the deleting broker parks the directory by the deleted
// id even when it never opened the topic (or its agent let go of it first); a broker still holding
// the topic open writes nothing into the name's directory when it forgets it; and the creator of a
// new topic of the same name parks a leftover directory of the old id instead of refusing.
func TestParkTopicAndRecreateOnSharedVolume(t *testing.T) {
	dir := t.TempDir()
	s1 := openClusterStore(t, dir, 1, "a1", nil) // has topic "t" open (clusterTopicID)
	defer s1.Close()
	s2, err := Open(Config{Dir: dir, Lazy: true, Incarnation: "b1", WALDir: clusterWALDir(dir, 2, "b1")})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	tdir := filepath.Join(dir, "topics", "t")
	// A leftover (the deleter crashed after etcd's delete, before parking): the creator of the
	// new incarnation parks it.
	fresh := clusterTopicID
	fresh[0]++
	if err := s2.ForgetTopic("t"); err != nil && !errors.Is(err, ErrUnknownTopic) {
		t.Fatal(err)
	}
	if _, err := s2.EnsureTopic("t", fresh, 1, nil); !errors.Is(err, ErrTopicExists) {
		t.Fatalf("EnsureTopic over another id's directory: %v, want ErrTopicExists", err)
	}
	if _, err := s2.EnsureNewTopic("t", fresh, 2, nil); err != nil {
		t.Fatalf("EnsureNewTopic over a leftover: %v", err)
	}
	if m, err := readTopicMeta(tdir); err != nil || m.ID != hex.EncodeToString(fresh[:]) || m.Partitions != 2 {
		t.Fatalf("topic.json after the re-create: %+v %v", m, err)
	}
	// s1 still holds the old incarnation open; forgetting it writes nothing into the new dir.
	before, _ := os.ReadDir(filepath.Join(tdir, "0"))
	if err := s1.ForgetTopic("t"); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadDir(filepath.Join(tdir, "0"))
	if len(after) != len(before) {
		t.Fatalf("forgetting the old topic wrote into the new one's directory: %d → %d entries", len(before), len(after))
	}
	// ParkTopic with a stale id leaves the new incarnation alone; with its own id it parks it,
	// though s1 never opened it.
	if err := s1.ParkTopic("t", clusterTopicID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tdir); err != nil {
		t.Fatalf("ParkTopic with the old id removed the new topic: %v", err)
	}
	if err := s1.ParkTopic("t", fresh); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tdir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("topic dir after ParkTopic: %v", err)
	}
	if err := s2.ParkTopic("t", fresh); err != nil {
		t.Fatalf("second ParkTopic (already parked): %v", err)
	}
	if s2.Topic("t") != nil {
		t.Fatal("s2 still serves the parked topic")
	}
}
