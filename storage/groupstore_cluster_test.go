package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

func gsTestMeta(gen int32, assignment string) *GroupMeta {
	return &GroupMeta{
		State: GroupMetaStable, Generation: gen, ProtocolType: "consumer", Protocol: "range", Leader: "m1",
		Members: []GroupMember{
			{MemberID: "m1", InstanceID: "inst-1", ClientID: "c1", ClientHost: "/10.0.0.1", SessionTimeoutMs: 10000,
				RebalanceTimeoutMs: 30000, Subscription: []byte("sub-1"), Assignment: []byte(assignment)},
			{MemberID: "m2", ClientID: "c2", ClientHost: "/10.0.0.2", SessionTimeoutMs: 45000,
				RebalanceTimeoutMs: 60000, Subscription: []byte("sub-2"), Assignment: []byte{}},
		},
	}
}

func gsMetaIs(t *testing.T, s *GroupStore, group string, want *GroupMeta) {
	t.Helper()
	got, ok := s.GroupMeta(group)
	if want == nil {
		if ok {
			t.Fatalf("%s: want no metadata, got %+v", group, got)
		}
		return
	}
	if !ok || !got.Equal(want) {
		t.Fatalf("%s: metadata %+v (found %v), want %+v", group, got, ok, want)
	}
}

// TestGroupStoreMetaSurvivesRestartAndCompaction: group metadata is durable, the last one wins,
// a member-less one is the tombstone, deleteGroup drops it, and compaction keeps it.
func TestGroupStoreMetaSurvivesRestartAndCompaction(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	if err := s.StoreGroupMeta("g", gsTestMeta(3, "a-old")); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreGroupMeta("g", gsTestMeta(4, "a-new")); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreGroupMeta("members-only", gsTestMeta(1, "x")); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreGroupMeta("gone", gsTestMeta(1, "x")); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreGroupMeta("gone", &GroupMeta{Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit("deleted", []GroupOffset{{Topic: "t", Offset: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreGroupMeta("deleted", gsTestMeta(1, "x")); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteGroup("deleted"); err != nil {
		t.Fatal(err)
	}
	check := func(s *GroupStore) {
		t.Helper()
		gsMetaIs(t, s, "g", gsTestMeta(4, "a-new"))
		gsMetaIs(t, s, "members-only", gsTestMeta(1, "x"))
		gsMetaIs(t, s, "gone", nil)
		gsMetaIs(t, s, "deleted", nil)
		if got := fmt.Sprint(s.Groups()); got != "[g members-only]" {
			t.Fatalf("groups %s, want [g members-only]", got)
		}
		if !s.HasGroup("members-only") || s.HasGroup("gone") {
			t.Fatal("HasGroup disagrees with the metadata")
		}
	}
	check(s)
	s.Close()
	s = gsOpen(t, dir)
	check(s)
	if err := s.rewrite(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	check(s)
}

func gsOpenCluster(t *testing.T, dir string, broker int32, inc string) *GroupStore {
	t.Helper()
	s, err := OpenGroupStoreCluster(dir, broker, inc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func gsGroupOfShard(shard int, prefix string) string {
	for i := 0; ; i++ {
		if g := fmt.Sprintf("%s-%d", prefix, i); GroupShardFor(g) == shard {
			return g
		}
	}
}

func gsCkpts(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "__cluster", gsSubdir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".ckpt") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestGroupStoreClusterShardMove: a shard moves between three incarnations on one directory.
// Store 1 holds it at epoch 1 and releases it gracefully; store 2 loads it at epoch 2 and sees
// everything, commits more and "crashes" (no release); store 3 loads it at epoch 3 and sees
// store 2's acknowledged ops from store 2's log; store 2, now a zombie, writes at epoch 2 after
// the move, and the next load (epoch 4) ignores that op. Checkpoints carry the epoch in their
// name; superseded ones are removed.
func TestGroupStoreClusterShardMove(t *testing.T) {
	dir := t.TempDir()
	const n = 7
	g := gsGroupOfShard(n, "grp")
	other := gsGroupOfShard(n+1, "other")

	s1 := gsOpenCluster(t, dir, 1, "aa01")
	defer s1.Close()
	if err := s1.Commit(g, []GroupOffset{{Topic: "t", Offset: 1}}); !errors.Is(err, ErrGroupShardNotLoaded) {
		t.Fatalf("commit to an unloaded shard: %v, want ErrGroupShardNotLoaded", err)
	}
	if err := s1.LoadShard(n, 1); err != nil {
		t.Fatal(err)
	}
	if err := s1.LoadShard(n+1, 1); err != nil {
		t.Fatal(err)
	}
	if got := gsCkpts(t, dir); !slices.Contains(got, "shard-7-e1.ckpt") {
		t.Fatalf("checkpoints after load at epoch 1: %v", got)
	}
	if err := s1.Commit(g, []GroupOffset{{Topic: "t", Partition: 0, Offset: 10}, {Topic: "t", Partition: 1, Offset: 11}}); err != nil {
		t.Fatal(err)
	}
	if err := s1.Commit(other, []GroupOffset{{Topic: "t", Offset: 99}}); err != nil {
		t.Fatal(err)
	}
	gsStage(t, s1, g, 42, 3, GroupOffset{Topic: "t", Partition: 2, Offset: 77})
	if err := s1.StoreGroupMeta(g, gsTestMeta(5, "assigned")); err != nil {
		t.Fatal(err)
	}
	if err := s1.ReleaseShard(n); err != nil {
		t.Fatal(err)
	}
	if _, ok := s1.Offset(g, "t", 0); ok {
		t.Fatal("released shard still in memory")
	}
	if err := s1.Commit(g, []GroupOffset{{Topic: "t", Offset: 1}}); !errors.Is(err, ErrGroupShardNotLoaded) {
		t.Fatalf("commit after release: %v, want ErrGroupShardNotLoaded", err)
	}

	s2 := gsOpenCluster(t, dir, 2, "bb02")
	defer s2.Close()
	if err := s2.LoadShard(n, 2); err != nil {
		t.Fatal(err)
	}
	gsOffsetIs(t, s2, g, "t", 0, 10)
	gsOffsetIs(t, s2, g, "t", 1, 11)
	gsOffsetIs(t, s2, other, "t", 0, -1) // another shard: not loaded here
	if e, ok := s2.PendingEpoch(g, 42); !ok || e != 3 || !s2.HasPending(g, "t", 2) {
		t.Fatalf("staged offsets after the move: epoch %d %v", e, ok)
	}
	gsMetaIs(t, s2, g, gsTestMeta(5, "assigned"))
	if got := gsCkpts(t, dir); !slices.Contains(got, "shard-7-e2.ckpt") || slices.Contains(got, "shard-7-e1.ckpt") {
		t.Fatalf("checkpoints after load at epoch 2: %v (want e2, e1 superseded)", got)
	}
	// More work at epoch 2, then store 2 "crashes": no release, no checkpoint.
	gsComplete(t, s2, g, 42, true)
	if err := s2.Commit(g, []GroupOffset{{Topic: "t", Partition: 0, Offset: 20}}); err != nil {
		t.Fatal(err)
	}
	if err := s2.StoreGroupMeta(g, gsTestMeta(6, "reassigned")); err != nil {
		t.Fatal(err)
	}

	s3 := gsOpenCluster(t, dir, 3, "cc03")
	defer s3.Close()
	if err := s3.LoadShard(n, 3); err != nil {
		t.Fatal(err)
	}
	gsOffsetIs(t, s3, g, "t", 0, 20)
	gsOffsetIs(t, s3, g, "t", 1, 11)
	gsOffsetIs(t, s3, g, "t", 2, 77)
	if s3.HasPending(g, "t", 2) {
		t.Fatal("the committed transaction is still pending after the move")
	}
	gsMetaIs(t, s3, g, gsTestMeta(6, "reassigned"))

	// Store 2 does not know it lost the shard: its write is acknowledged locally, at epoch 2.
	// (Several ops, so their seqs pass the next checkpoint's: only the epoch tells them apart.)
	for o := int64(666); o < 670; o++ {
		if err := s2.Commit(g, []GroupOffset{{Topic: "t", Partition: 0, Offset: o}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s3.Commit(g, []GroupOffset{{Topic: "t", Partition: 1, Offset: 30}}); err != nil {
		t.Fatal(err)
	}
	if err := s3.ReleaseShard(n); err != nil {
		t.Fatal(err)
	}
	ignored := gsIgnoredOps.Get()
	s4 := gsOpenCluster(t, dir, 1, "aa04")
	defer s4.Close()
	if err := s4.LoadShard(n, 4); err != nil {
		t.Fatal(err)
	}
	gsOffsetIs(t, s4, g, "t", 0, 20) // not the zombie's 666
	gsOffsetIs(t, s4, g, "t", 1, 30)
	if gsIgnoredOps.Get() == ignored {
		t.Fatal("the zombie's op was not seen and ignored")
	}
	if err := s4.LoadShard(n+2, 4); err != nil {
		t.Fatal(err)
	}
	// A stale assignment: the shard has a newer checkpoint than the epoch asked for.
	if err := s1.LoadShard(n, 2); !errors.Is(err, ErrGroupShardFenced) {
		t.Fatalf("load at an epoch older than the newest checkpoint: %v, want ErrGroupShardFenced", err)
	}
	if _, ok := s1.Offset(g, "t", 0); ok {
		t.Fatal("a refused load left the shard in memory")
	}
	if got := gsCkpts(t, dir); !slices.Equal(got, []string{"shard-7-e4.ckpt", "shard-8-e1.ckpt", "shard-9-e4.ckpt"}) {
		t.Fatalf("checkpoints at the end: %v", got)
	}
}

// TestGroupStoreClusterRollDeletesCoveredLogs: compaction in cluster mode checkpoints the held
// shards, starts a new generation and deletes the old one; what was acknowledged survives a
// crash (no release) and is loaded by a successor from the checkpoint plus the new generation.
func TestGroupStoreClusterRollDeletesCoveredLogs(t *testing.T) {
	dir := t.TempDir()
	const n = 3
	g := gsGroupOfShard(n, "roll")
	s := gsOpenCluster(t, dir, 1, "dd01")
	defer s.Close()
	s.compactMin = 1 << 10
	if err := s.LoadShard(n, 1); err != nil {
		t.Fatal(err)
	}
	rolls, deleted := gsRolls.Get(), gsLogsDeleted.Get()
	for i := 0; i < 300; i++ {
		if err := s.Commit(g, []GroupOffset{{Topic: "topic", Partition: int32(i % 4), Offset: int64(i), Metadata: "some metadata"}}); err != nil {
			t.Fatal(err)
		}
	}
	if gsRolls.Get() == rolls || gsLogsDeleted.Get() == deleted {
		t.Fatalf("rolls %d, deleted logs %d: the log never rolled", gsRolls.Get()-rolls, gsLogsDeleted.Get()-deleted)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "__cluster", gsSubdir))
	var logs []string
	for _, e := range ents {
		if _, _, _, ok := gsParseLogName(e.Name()); ok {
			logs = append(logs, e.Name())
		}
	}
	if len(logs) != 1 || logs[0] == gsLogName(1, "dd01", 1) {
		t.Fatalf("logs after rolling: %v, want one newer generation", logs)
	}
	s2 := gsOpenCluster(t, dir, 2, "ee02")
	defer s2.Close()
	if err := s2.LoadShard(n, 2); err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 4; p++ {
		gsOffsetIs(t, s2, g, "topic", p, int64(296+p))
	}
}

// TestGroupStoreClusterTornTailRead: a dead incarnation's torn last frame is where it stopped:
// the successor reads the log up to it (and leaves the file alone).
func TestGroupStoreClusterTornTailRead(t *testing.T) {
	dir := t.TempDir()
	const n = 11
	g := gsGroupOfShard(n, "torn")
	s := gsOpenCluster(t, dir, 1, "ff01")
	if err := s.LoadShard(n, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(g, []GroupOffset{{Topic: "t", Offset: 5}}); err != nil {
		t.Fatal(err)
	}
	path := s.path
	s.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	torn := gsFormat.Append(nil, []byte("half a frame of some op"))
	if _, err := f.Write(torn[:len(torn)-5]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, _ := os.Stat(path)
	s2 := gsOpenCluster(t, dir, 2, "ff02")
	defer s2.Close()
	if err := s2.LoadShard(n, 2); err != nil {
		t.Fatal(err)
	}
	gsOffsetIs(t, s2, g, "t", 0, 5)
	if st2, _ := os.Stat(path); st2.Size() != st.Size() {
		t.Fatalf("the dead incarnation's log changed size: %d → %d", st.Size(), st2.Size())
	}
}

func TestGroupStoreClusterNames(t *testing.T) {
	b, inc, gen, ok := gsParseLogName(gsLogName(12, "7a3f", 9))
	if !ok || b != 12 || inc != "7a3f" || gen != 9 {
		t.Fatalf("log name round trip: %d %q %d %v", b, inc, gen, ok)
	}
	sh, ep, ok := gsParseCkptName(gsCkptName(49, 123))
	if !ok || sh != 49 || ep != 123 {
		t.Fatalf("checkpoint name round trip: %d %d %v", sh, ep, ok)
	}
	for _, bad := range []string{"shard-50-e1.ckpt", "shard-1.ckpt", ".shard-1-e1.ckpt.aa.tmp", "shard-x-e1.ckpt"} {
		if _, _, ok := gsParseCkptName(bad); ok {
			t.Errorf("%q parsed as a checkpoint", bad)
		}
	}
	if _, err := OpenGroupStoreCluster(t.TempDir(), 1, "", nil); err == nil {
		t.Fatal("an empty incarnation was accepted")
	}
}

// TestRemoveDeadGroupLogs: a dead incarnation's log is deleted only once every op in it is
// covered by a newer checkpoint of its shard.
func TestRemoveDeadGroupLogs(t *testing.T) {
	dir := t.TempDir()
	a, b := gsGroupOfShard(1, "dead"), gsGroupOfShard(2, "dead")
	s1 := gsOpenCluster(t, dir, 1, "a1")
	for _, n := range []int{1, 2} {
		if err := s1.LoadShard(n, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := s1.Commit(a, []GroupOffset{{Topic: "t", Offset: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := s1.Commit(b, []GroupOffset{{Topic: "t", Offset: 2}}); err != nil {
		t.Fatal(err)
	}
	s1.Close() // dies holding both shards
	log1 := filepath.Join(dir, "__cluster", gsSubdir, gsLogName(1, "a1", 1))

	if n, err := RemoveDeadGroupLogs(dir, 1, "a1"); err != nil || n != 0 {
		t.Fatalf("nothing covered yet: removed %d (%v)", n, err)
	}
	s2 := gsOpenCluster(t, dir, 2, "b2")
	defer s2.Close()
	if err := s2.LoadShard(1, 2); err != nil {
		t.Fatal(err)
	}
	if n, err := RemoveDeadGroupLogs(dir, 1, "a1"); err != nil || n != 0 {
		t.Fatalf("shard 2's op not covered: removed %d (%v)", n, err)
	}
	if err := s2.LoadShard(2, 2); err != nil {
		t.Fatal(err)
	}
	if n, err := RemoveDeadGroupLogs(dir, 1, "a1"); err != nil || n != 1 {
		t.Fatalf("every op covered: removed %d (%v)", n, err)
	}
	if _, err := os.Stat(log1); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dead log still there: %v", err)
	}
	// The successor's state does not depend on it.
	if err := s2.ReleaseShard(2); err != nil {
		t.Fatal(err)
	}
	s3 := gsOpenCluster(t, dir, 3, "c3")
	defer s3.Close()
	if err := s3.LoadShard(2, 3); err != nil {
		t.Fatal(err)
	}
	gsOffsetIs(t, s3, b, "t", 0, 2)
}

// TestGroupStoreClusterReleaseUnderCommits: commits racing a release are either acknowledged
// (and then loaded by the successor) or refused with ErrGroupShardNotLoaded; none is lost.
func TestGroupStoreClusterReleaseUnderCommits(t *testing.T) {
	dir := t.TempDir()
	const n = 5
	g := gsGroupOfShard(n, "race")
	s1 := gsOpenCluster(t, dir, 1, "r1")
	defer s1.Close()
	if err := s1.LoadShard(n, 1); err != nil {
		t.Fatal(err)
	}
	const writers = 4
	var acked [writers]atomic.Int64
	done := make(chan error, writers)
	for w := 0; w < writers; w++ {
		go func(w int) {
			for o := int64(1); ; o++ {
				err := s1.Commit(g, []GroupOffset{{Topic: "t", Partition: int32(w), Offset: o}})
				if errors.Is(err, ErrGroupShardNotLoaded) {
					done <- nil
					return
				}
				if err != nil {
					done <- err
					return
				}
				acked[w].Store(o)
			}
		}(w)
	}
	eventually(t, "every writer has commits acknowledged", func() bool {
		for w := range acked {
			if acked[w].Load() < 20 {
				return false
			}
		}
		return true
	})
	if err := s1.ReleaseShard(n); err != nil {
		t.Fatal(err)
	}
	for w := 0; w < writers; w++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	s2 := gsOpenCluster(t, dir, 2, "r2")
	defer s2.Close()
	if err := s2.LoadShard(n, 2); err != nil {
		t.Fatal(err)
	}
	for w := 0; w < writers; w++ {
		gsOffsetIs(t, s2, g, "t", int32(w), acked[w].Load())
	}
}

func FuzzGroupStoreClusterDecode(f *testing.F) {
	c := &gsCluster{}
	enc := func(ops ...*gsOp) []byte {
		var b []byte
		for _, op := range ops {
			body := gsAppendOp(nil, op)
			b = c.stamp(b, op, len(body))
			b = append(b, body...)
		}
		return b
	}
	f.Add(enc(&gsOp{kind: gsOpCommit, group: "g", shard: 3, offs: []GroupOffset{{Topic: "t", Offset: 5}}},
		&gsOp{kind: gsOpMeta, group: "g", shard: 3, meta: gsTestMeta(2, "x")}))
	f.Add(enc(&gsOp{kind: gsOpTxnCmt, group: "h", shard: 49, pid: 7}))
	f.Add([]byte{50, 2, 1, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := gsDecodeOps(b, true)
		if err != nil {
			return
		}
		var re []byte
		for _, op := range ops {
			body := gsAppendOp(nil, op)
			re = binary.AppendUvarint(re, uint64(op.shard))
			re = binary.AppendVarint(re, int64(op.cepoch))
			re = binary.AppendUvarint(re, op.seq)
			re = binary.AppendUvarint(re, uint64(len(body)))
			re = append(re, body...)
		}
		again, err := gsDecodeOps(re, true)
		if err != nil || len(again) != len(ops) {
			t.Fatalf("re-encoding a decoded payload: %d ops, %v", len(again), err)
		}
	})
}

// TestGroupStorePublishRule: past the lease deadline (Rule P) a durable write is neither
// acknowledged nor made visible.
func TestGroupStorePublishRule(t *testing.T) {
	dir := t.TempDir()
	const n = 9
	g := gsGroupOfShard(n, "rulep")
	s := gsOpenCluster(t, dir, 1, "p1")
	defer s.Close()
	if err := s.LoadShard(n, 1); err != nil {
		t.Fatal(err)
	}
	var publishable atomic.Bool
	publishable.Store(true)
	s.SetPublish(publishable.Load)
	if err := s.Commit(g, []GroupOffset{{Topic: "t", Offset: 1}}); err != nil {
		t.Fatal(err)
	}
	publishable.Store(false)
	if err := s.Commit(g, []GroupOffset{{Topic: "t", Offset: 2}}); !errors.Is(err, ErrGroupStorePublishFenced) {
		t.Fatalf("commit past the deadline: %v, want ErrGroupStorePublishFenced", err)
	}
	if err := s.StoreGroupMeta(g, gsTestMeta(1, "x")); !errors.Is(err, ErrGroupStorePublishFenced) {
		t.Fatalf("metadata past the deadline: %v, want ErrGroupStorePublishFenced", err)
	}
	gsOffsetIs(t, s, g, "t", 0, 1)
	gsMetaIs(t, s, g, nil)
}
