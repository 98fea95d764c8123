package storage

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kaas-go/kaas/codec"
)

type ackedAppend struct {
	pid  int64
	seq  int32
	base int64
}

// Release and reload a partition in the middle of concurrent idempotent appends: every
// acknowledged append is in the log afterwards (exactly once: producer state survived through
// the snapshot), appends during the release answer NOT_LEADER_OR_FOLLOWER, and the new leader
// epoch is stamped on later batches, persisted and answered by EndOffsetForEpoch.
func TestReleaseReloadPartitionDuringAppends(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	top, err := s.CreateTopic("rl", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.CreateTopic("untouched", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := top.Partition(0)
	if !old.Loaded() || old.LeaderEpoch() != 0 {
		t.Fatalf("fresh partition: loaded %v epoch %d", old.Loaded(), old.LeaderEpoch())
	}

	const producers = 4
	var (
		mu       sync.Mutex
		acked    []ackedAppend
		notOwner atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
		failure  atomic.Value
	)
	nAcked := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	for g := 0; g < producers; g++ {
		wg.Add(1)
		go func(pid int64) {
			defer wg.Done()
			seq := int32(0)
			for !stop.Load() {
				p := top.Partition(0)
				r := p.Append(makeBatch(t, tb{pid: pid, epoch: 0, seq: seq, n: 2}), 0)
				switch r.Code {
				case codec.CodeNone:
				case codec.CodeNotLeaderForPartition:
					notOwner.Add(1)
					continue // retried with the same sequence on whatever Topic.Partition returns next
				default:
					failure.Store(errors.New("unexpected append code"))
					return
				}
				if err := syncWait(p, r.LastOffset+1); err != nil {
					failure.Store(err)
					return
				}
				mu.Lock()
				acked = append(acked, ackedAppend{pid: pid, seq: seq, base: r.BaseOffset})
				mu.Unlock()
				seq += 2
			}
		}(int64(100 + g))
	}

	eventually(t, "appends before the release", func() bool { return nAcked() >= 50 })
	changed := old.Changed()
	if err := s.ReleasePartition("rl", 0); err != nil {
		t.Fatal(err)
	}
	releasedAt := old.LogEndOffset()
	if old.Loaded() {
		t.Fatal("released partition still loaded")
	}
	select {
	case <-changed:
	default:
		t.Fatal("long-poll waiters not woken by the release")
	}
	wantCode(t, "append to released partition", old.Append(makeBatch(t, tb{}), 0), codec.CodeNotLeaderForPartition)
	wantCode(t, "marker on released partition", old.AppendMarker(100, 0, true, 0, 0), codec.CodeNotLeaderForPartition)
	if g, _ := old.VerificationGuard(100, 0); g != 0 {
		t.Fatal("released partition handed out a verification guard")
	}
	wantCode(t, "transactional append to released partition", old.AppendTxn(makeBatch(t, tb{pid: 100, txn: true}), 0, 0), codec.CodeNotLeaderForPartition)
	if _, code := old.Read(nil, 0, 1<<20, releasedAt); code != codec.CodeNotLeaderForPartition {
		t.Fatalf("read of released partition: code %d", code)
	}
	if err := syncWait(old, releasedAt+10); !errors.Is(err, ErrNotLoaded) || ErrorCode(err) != codec.CodeNotLeaderForPartition {
		t.Fatalf("Sync on released partition: %v", err)
	}
	if e, o := old.EndOffsetForEpoch(0); e != -1 || o != -1 {
		t.Fatalf("EndOffsetForEpoch on released partition: %d %d", e, o)
	}
	eventually(t, "appends refused while released", func() bool { return notOwner.Load() > 0 })
	before := nAcked()

	if err := s.LoadPartition("rl", 0, 1); err != nil {
		t.Fatal(err)
	}
	p := top.Partition(0)
	if p == old || !p.Loaded() || p.LeaderEpoch() != 1 {
		t.Fatalf("reloaded partition: same object %v, loaded %v, epoch %d", p == old, p.Loaded(), p.LeaderEpoch())
	}
	if p.LogEndOffset() != releasedAt {
		t.Fatalf("reloaded log end %d, released at %d", p.LogEndOffset(), releasedAt)
	}
	eventually(t, "appends after the reload", func() bool { return nAcked() >= before+50 })
	stop.Store(true)
	wg.Wait()
	if err, _ := failure.Load().(error); err != nil {
		t.Fatal(err)
	}

	check := func(p *Partition) {
		t.Helper()
		byBase := map[int64]codec.Batch{}
		perPID := map[int64]int{}
		for _, b := range readAll(t, p, 0) {
			byBase[b.BaseOffset()] = b
			perPID[b.ProducerID()]++
			want := int32(0)
			if b.BaseOffset() >= releasedAt {
				want = 1
			}
			if b.PartitionLeaderEpoch() != want {
				t.Fatalf("batch at %d stamped with epoch %d, want %d", b.BaseOffset(), b.PartitionLeaderEpoch(), want)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		ackedPerPID := map[int64]int{}
		for _, a := range acked {
			b := byBase[a.base]
			if b == nil || b.ProducerID() != a.pid || b.BaseSequence() != a.seq {
				t.Fatalf("acknowledged append %+v missing after reload", a)
			}
			ackedPerPID[a.pid]++
		}
		for pid, n := range perPID {
			if n != ackedPerPID[pid] {
				t.Fatalf("producer %d: %d batches in the log, %d acknowledged (a retry was duplicated)", pid, n, ackedPerPID[pid])
			}
		}
		leo := p.LogEndOffset()
		for _, c := range []struct {
			req   int32
			epoch int32
			end   int64
		}{{0, 0, releasedAt}, {1, 1, leo}, {2, -1, -1}, {-1, -1, -1}} {
			if e, o := p.EndOffsetForEpoch(c.req); e != c.epoch || o != c.end {
				t.Fatalf("EndOffsetForEpoch(%d) = %d, %d; want %d, %d", c.req, e, o, c.epoch, c.end)
			}
		}
	}
	check(p)
	if err := s.LoadPartition("rl", 0, 0); err == nil {
		t.Fatal("LoadPartition with an epoch below the current one succeeded")
	}

	// The epoch survives a restart; a partition that never changed epoch has no checkpoint file.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "topics", "untouched", "0", leaderEpochFile)); !os.IsNotExist(err) {
		t.Fatalf("single-broker partition has a leader epoch file: %v", err)
	}
	_ = other
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("rl").Partition(0)
	if p.LeaderEpoch() != 1 {
		t.Fatalf("leader epoch %d after restart, want 1", p.LeaderEpoch())
	}
	check(p)
	if e, o := s.Topic("untouched").Partition(0).EndOffsetForEpoch(0); e != 0 || o != 0 {
		t.Fatalf("EndOffsetForEpoch(0) of an empty epoch-0 partition: %d, %d", e, o)
	}
}

func TestLeaderEpochCheckpointFormat(t *testing.T) {
	ents := []epochEntry{{0, 0}, {3, 17}, {4, 17}, {9, 250}}
	got, err := decodeEpochs(encodeEpochs(ents))
	if err != nil || len(got) != len(ents) {
		t.Fatalf("round trip: %v %v", got, err)
	}
	for i := range ents {
		if got[i] != ents[i] {
			t.Fatalf("entry %d: %v, want %v", i, got[i], ents[i])
		}
	}
	for _, bad := range []string{"", "1\n0\n", "0\n2\n0 0\n", "0\n2\n3 5\n2 9\n", "0\n2\n1 9\n2 5\n", "0\n1\nx 1\n"} {
		if _, err := decodeEpochs([]byte(bad)); err == nil {
			t.Fatalf("decoded %q", bad)
		}
	}
}

// EndOffsetForEpoch follows Apache's LeaderEpochFileCache.endOffsetFor on a cache that does not
// start at epoch 0.
func TestEndOffsetForEpochSemantics(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	for i := 0; i < 30; i++ {
		mustAppend(t, p, makeBatch(t, tb{}), 0)
	}
	p.mu.Lock()
	p.epochMu.Lock()
	p.epochs = []epochEntry{{epoch: 2, start: 5}, {epoch: 4, start: 12}, {epoch: 7, start: 20}}
	p.epochMu.Unlock()
	p.leaderEpoch.Store(7)
	p.mu.Unlock()
	for _, c := range []struct {
		req, epoch int32
		end        int64
	}{
		{-1, -1, -1}, // undefined
		{0, 0, 5},    // below every known epoch: the requested epoch, first epoch's start
		{2, 2, 12},
		{3, 2, 12}, // between epochs: the largest one below, ending where the next starts
		{4, 4, 20},
		{6, 4, 20},
		{7, 7, 30}, // current: the log end
		{8, -1, -1},
	} {
		if e, o := p.EndOffsetForEpoch(c.req); e != c.epoch || o != c.end {
			t.Errorf("EndOffsetForEpoch(%d) = %d, %d; want %d, %d", c.req, e, o, c.epoch, c.end)
		}
	}
	// A new epoch starts at the log end and is stamped on the next batch.
	if err := s.LoadPartition("t", 0, 9); err != nil {
		t.Fatal(err)
	}
	r := mustAppend(t, p, makeBatch(t, tb{}), 0)
	if bs := readAll(t, p, r.BaseOffset); len(bs) != 1 || bs[0].PartitionLeaderEpoch() != 9 {
		t.Fatalf("batch after the bump not stamped with epoch 9")
	}
	if e, o := p.EndOffsetForEpoch(7); e != 7 || o != 30 {
		t.Fatalf("EndOffsetForEpoch(7) after the bump = %d, %d; want 7, 30", e, o)
	}
}
