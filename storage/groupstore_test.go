package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kaas-go/kaas/storage/framelog"
)

func gsOpen(t *testing.T, dir string) *GroupStore {
	t.Helper()
	s, err := OpenGroupStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func gsPath(dir string) string {
	return filepath.Join(dir, "__cluster", "consumer_offsets", "offsets.log")
}

func TestGroupStoreCommitFetchReopen(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	if err := s.Commit("g1", []GroupOffset{
		{Topic: "a", Partition: 0, Offset: 10, LeaderEpoch: 3, Metadata: "m0", CommitTimeMs: 1},
		{Topic: "a", Partition: 1, Offset: 20, LeaderEpoch: -1},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit("g1", []GroupOffset{{Topic: "a", Partition: 0, Offset: 11, LeaderEpoch: 4, Metadata: "m1"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit("g2", []GroupOffset{{Topic: "b/c", Partition: 7, Offset: 5}}); err != nil {
		t.Fatal(err)
	}
	check := func(s *GroupStore) {
		t.Helper()
		o, ok := s.Offset("g1", "a", 0)
		if !ok || o.Offset != 11 || o.LeaderEpoch != 4 || o.Metadata != "m1" {
			t.Fatalf("g1 a/0 = %+v %v", o, ok)
		}
		if got := s.Offsets("g1"); len(got) != 2 || got[1].Offset != 20 || got[1].LeaderEpoch != -1 {
			t.Fatalf("g1 offsets = %+v", got)
		}
		if got := fmt.Sprint(s.Groups()); got != "[g1 g2]" {
			t.Fatalf("groups = %s", got)
		}
		if o, ok := s.Offset("g2", "b/c", 7); !ok || o.Offset != 5 {
			t.Fatalf("g2 = %+v %v", o, ok)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = gsOpen(t, dir)
	defer s.Close()
	check(s)
}

func TestGroupStoreDeletes(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Commit("g", []GroupOffset{{Topic: "t", Partition: 0, Offset: 1}, {Topic: "t", Partition: 1, Offset: 2}}))
	must(s.Commit("h", []GroupOffset{{Topic: "t", Partition: 0, Offset: 1}}))
	must(s.DeleteOffsets("g", []GroupPartition{{"t", 0}, {"nope", 3}}))
	must(s.DeleteGroup("h"))
	f := func(s *GroupStore) {
		t.Helper()
		if _, ok := s.Offset("g", "t", 0); ok {
			t.Fatal("deleted offset still there")
		}
		if _, ok := s.Offset("g", "t", 1); !ok {
			t.Fatal("kept offset missing")
		}
		if s.HasGroup("h") || !s.HasGroup("g") {
			t.Fatalf("groups = %v", s.Groups())
		}
	}
	f(s)
	must(s.DeleteOffsets("g", []GroupPartition{{"t", 1}}))
	if s.HasGroup("g") {
		t.Fatal("group without offsets still listed")
	}
	must(s.Commit("g", []GroupOffset{{Topic: "t", Partition: 1, Offset: 9}}))
	must(s.Close())
	s = gsOpen(t, dir)
	defer s.Close()
	if o, ok := s.Offset("g", "t", 1); !ok || o.Offset != 9 || s.HasGroup("h") {
		t.Fatalf("after reopen: %+v %v %v", o, ok, s.Groups())
	}
}

// Concurrent committers share fsyncs and every one of them is acknowledged after its data is
// durable and visible.
func TestGroupStoreConcurrentCommits(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	const writers, each = 16, 50
	fsyncsBefore := gsFsyncsTotal.Get()
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				g := fmt.Sprintf("g%d", w)
				if err := s.Commit(g, []GroupOffset{{Topic: "t", Partition: int32(w), Offset: int64(i)}}); err != nil {
					t.Error(err)
					return
				}
				if o, ok := s.Offset(g, "t", int32(w)); !ok || o.Offset != int64(i) {
					t.Errorf("commit not visible after ack: %+v", o)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := gsFsyncsTotal.Get() - fsyncsBefore; n >= writers*each {
		t.Errorf("no fsync sharing: %d fsyncs for %d commits", n, writers*each)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = gsOpen(t, dir)
	defer s.Close()
	for w := 0; w < writers; w++ {
		if o, _ := s.Offset(fmt.Sprintf("g%d", w), "t", int32(w)); o.Offset != each-1 {
			t.Fatalf("writer %d: %+v", w, o)
		}
	}
}

func TestGroupStoreTornTailTruncated(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(b []byte) []byte
	}{
		{"partial frame", func(b []byte) []byte { return b[:len(b)-3] }},
		{"zeroed tail", func(b []byte) []byte { return append(b, make([]byte, 100)...) }},
		{"bad crc last frame", func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b }},
		{"garbage after last", func(b []byte) []byte { return append(b, "garbage-bytes"...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := gsOpen(t, dir)
			if err := s.Commit("g", []GroupOffset{{Topic: "t", Partition: 0, Offset: 1}}); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit("g", []GroupOffset{{Topic: "t", Partition: 1, Offset: 2}}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			b, err := os.ReadFile(gsPath(dir))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(gsPath(dir), tc.tear(b), 0o644); err != nil {
				t.Fatal(err)
			}
			s = gsOpen(t, dir)
			if o, ok := s.Offset("g", "t", 0); !ok || o.Offset != 1 {
				t.Fatalf("earlier commit lost: %+v %v", o, ok)
			}
			// The store keeps working after the truncation, and the new commit survives.
			if err := s.Commit("g", []GroupOffset{{Topic: "t", Partition: 2, Offset: 3}}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			s = gsOpen(t, dir)
			defer s.Close()
			if o, ok := s.Offset("g", "t", 2); !ok || o.Offset != 3 {
				t.Fatalf("commit after truncation lost: %+v %v", o, ok)
			}
		})
	}
}

func TestGroupStoreCorruptMiddleRefused(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	for i := 0; i < 3; i++ {
		if err := s.Commit("g", []GroupOffset{{Topic: "t", Partition: int32(i), Offset: int64(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	b, _ := os.ReadFile(gsPath(dir))
	b[len(gsHeader)+gsFrameHdr+2] ^= 0x55 // inside the first frame's payload
	os.WriteFile(gsPath(dir), b, 0o644)
	_, err := OpenGroupStore(dir, nil)
	if err == nil || !strings.Contains(err.Error(), gsPath(dir)) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("want a refusal naming the file, got %v", err)
	}

	os.WriteFile(gsPath(dir), []byte("{\"offsets\":{}}"), 0o644)
	if _, err := OpenGroupStore(dir, nil); err == nil || !strings.Contains(err.Error(), gsPath(dir)) {
		t.Fatalf("want a bad-header refusal naming the file, got %v", err)
	}
}

func TestGroupStoreCompaction(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	s.compactMin = 1 << 10
	before := gsCompactionsTotal.Get()
	for i := 0; i < 300; i++ {
		if err := s.Commit("g", []GroupOffset{{Topic: "topic", Partition: int32(i % 4), Offset: int64(i), Metadata: "some metadata"}}); err != nil {
			t.Fatal(err)
		}
	}
	if gsCompactionsTotal.Get() == before {
		t.Fatal("log never compacted")
	}
	st, _ := os.Stat(gsPath(dir))
	if st.Size() > 4<<10 {
		t.Fatalf("log is %d bytes after compaction", st.Size())
	}
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	for p := int32(0); p < 4; p++ {
		if o, ok := s.Offset("g", "topic", p); !ok || o.Offset != int64(296+p) {
			t.Fatalf("p%d = %+v", p, o)
		}
	}
}

// A failed write answers an error and makes nothing visible; once the disk is back the store
// rewrites the log from the durable set and accepts commits again.
func TestGroupStoreWriteFailure(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	defer s.Close()
	if err := s.Commit("g", []GroupOffset{{Topic: "t", Offset: 1}}); err != nil {
		t.Fatal(err)
	}
	// Sabotage the writer's file: writes now fail with EBADF, and so does the appender's repair
	// (a truncate), so the store has to rewrite. (The writer is idle once Wait returns, and the
	// next batch starts after the push below.)
	ro, err := os.Open(gsPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	s.writer.Wait()
	old := s.f
	s.f, s.app = ro, framelog.NewAppender(gsFile{ro}, &gsFormat, s.app.Offset(), 0)
	s.CommitAsync("g", []GroupOffset{{Topic: "t", Offset: 2}}, func(err error) { done <- err })
	if err := <-done; err == nil {
		t.Fatal("commit acknowledged although the write failed")
	}
	if o, _ := s.Offset("g", "t", 0); o.Offset != 1 {
		t.Fatalf("failed commit became visible: %+v", o)
	}
	old.Close()
	if err := s.Commit("g", []GroupOffset{{Topic: "t", Offset: 3}}); err != nil {
		t.Fatalf("store did not recover: %v", err)
	}
	if o, _ := s.Offset("g", "t", 0); o.Offset != 3 {
		t.Fatalf("after recovery: %+v", o)
	}
	s.Close()
	s = gsOpen(t, dir)
	if o, _ := s.Offset("g", "t", 0); o.Offset != 3 {
		t.Fatalf("after recovery and reopen: %+v", o)
	}
	s.Close()
}

func FuzzGroupStoreDecode(f *testing.F) {
	f.Add(gsAppendOp(nil, &gsOp{kind: gsOpCommit, group: "g", offs: []GroupOffset{{Topic: "t", Offset: 5, Metadata: "x"}}}))
	f.Add(gsAppendOp(nil, &gsOp{kind: gsOpDelOffs, group: "g", parts: []GroupPartition{{"t", 1}}}))
	f.Add(gsAppendOp(nil, &gsOp{kind: gsOpStage, group: "g", pid: 7, epoch: 3, offs: []GroupOffset{{Topic: "t", Offset: 5}, {Topic: "t", Partition: 1}},
		superseded: []bool{false, true}}))
	f.Add(gsAppendOp(nil, &gsOp{kind: gsOpTxnCmt, group: "g", pid: 7}))
	f.Add(gsAppendOp(nil, &gsOp{kind: gsOpTxnAbrt, group: "g", pid: -1}))
	f.Add(gsAppendOp(nil, &gsOp{kind: gsOpMeta, group: "g", meta: gsTestMeta(3, "assigned")}))
	f.Add(gsAppendOp(nil, &gsOp{kind: gsOpMeta, group: "g"}))
	f.Add([]byte{2, 1, 'g'})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := gsDecodeOps(b, false)
		if err != nil {
			return
		}
		var re []byte
		for _, op := range ops {
			re = gsAppendOp(re, op)
		}
		if _, err := gsDecodeOps(re, false); err != nil {
			t.Fatalf("re-encoding a decoded payload fails: %v", err)
		}
	})
}

// ---- transactional offsets (TxnOffsetCommit staging) ----

func gsStage(t *testing.T, s *GroupStore, group string, pid int64, epoch int16, offs ...GroupOffset) {
	t.Helper()
	ch := make(chan error, 1)
	s.StageTxnOffsets(group, pid, epoch, offs, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
}

func gsComplete(t *testing.T, s *GroupStore, group string, pid int64, commit bool) {
	t.Helper()
	ch := make(chan error, 1)
	s.CompleteTxnOffsets(group, pid, commit, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
}

func gsOffsetIs(t *testing.T, s *GroupStore, group, topic string, p int32, want int64) {
	t.Helper()
	o, ok := s.Offset(group, topic, p)
	if want < 0 {
		if ok {
			t.Fatalf("%s %s/%d: want no committed offset, got %+v", group, topic, p, o)
		}
		return
	}
	if !ok || o.Offset != want {
		t.Fatalf("%s %s/%d: want committed %d, got %+v (found %v)", group, topic, p, want, o, ok)
	}
}

// Staged offsets are durable but invisible; they survive a restart still pending, a later
// staging overwrites, and the commit makes the whole set visible at once (and durably).
func TestGroupStoreTxnStageRestartCommit(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	gsStage(t, s, "g", 7, 3,
		GroupOffset{Topic: "t", Partition: 0, Offset: 10, LeaderEpoch: 2, Metadata: "m0", CommitTimeMs: 5},
		GroupOffset{Topic: "t", Partition: 1, Offset: 11, LeaderEpoch: -1})
	pendingView := func(s *GroupStore, epoch int16) {
		t.Helper()
		gsOffsetIs(t, s, "g", "t", 0, -1)
		gsOffsetIs(t, s, "g", "t", 1, -1)
		if !s.HasPending("g", "t", 0) || !s.HasPending("g", "t", 1) || s.HasPending("g", "t", 2) {
			t.Fatal("pending view wrong")
		}
		if got := fmt.Sprint(s.PendingProducers("g")); got != "[7]" {
			t.Fatalf("pending producers = %s", got)
		}
		if e, ok := s.PendingEpoch("g", 7); !ok || e != epoch {
			t.Fatalf("pending epoch = %d %v", e, ok)
		}
		// A group with only pending offsets exists (Apache loads it as an Empty group).
		if !s.HasGroup("g") || fmt.Sprint(s.Groups()) != "[g]" || len(s.Offsets("g")) != 0 {
			t.Fatalf("group view: %v %v %v", s.HasGroup("g"), s.Groups(), s.Offsets("g"))
		}
	}
	pendingView(s, 3)
	s.Close()
	s = gsOpen(t, dir)
	pendingView(s, 3)
	gsStage(t, s, "g", 7, 4, GroupOffset{Topic: "t", Partition: 0, Offset: 12, LeaderEpoch: 3, Metadata: "m1"})
	pendingView(s, 4)
	if got := s.PendingOffsets("g", 7); len(got) != 2 || got[0].Offset != 12 || got[1].Offset != 11 {
		t.Fatalf("restaging did not overwrite: %+v", got)
	}
	gsComplete(t, s, "g", 7, true)
	check := func(s *GroupStore) {
		t.Helper()
		o, _ := s.Offset("g", "t", 0)
		if o.Offset != 12 || o.LeaderEpoch != 3 || o.Metadata != "m1" {
			t.Fatalf("committed t/0 = %+v", o)
		}
		gsOffsetIs(t, s, "g", "t", 1, 11)
		if s.HasPending("g", "t", 0) || len(s.PendingProducers("g")) != 0 {
			t.Fatal("pending entry not dropped by the commit")
		}
		if _, ok := s.PendingEpoch("g", 7); ok {
			t.Fatal("pending epoch survived the commit")
		}
	}
	check(s)
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	check(s)
}

func TestGroupStoreTxnAbortDiscards(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	if err := s.Commit("g", []GroupOffset{{Topic: "t", Partition: 0, Offset: 5}}); err != nil {
		t.Fatal(err)
	}
	gsStage(t, s, "g", 1, 0, GroupOffset{Topic: "t", Partition: 0, Offset: 9}, GroupOffset{Topic: "t", Partition: 1, Offset: 9})
	gsComplete(t, s, "g", 1, false)
	gsOffsetIs(t, s, "g", "t", 0, 5)
	gsOffsetIs(t, s, "g", "t", 1, -1)
	if s.HasPending("g", "t", 0) || s.HasPending("g", "t", 1) {
		t.Fatal("aborted offsets still pending")
	}
	// Completing with nothing staged (a re-driven marker, or a group never staged into) is a no-op.
	gsComplete(t, s, "g", 1, true)
	gsComplete(t, s, "other", 42, true)
	gsComplete(t, s, "other", 42, false)
	if s.HasGroup("other") {
		t.Fatal("idempotent completion created a group")
	}
	gsOffsetIs(t, s, "g", "t", 0, 5)
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	gsOffsetIs(t, s, "g", "t", 0, 5)
	gsOffsetIs(t, s, "g", "t", 1, -1)
	if len(s.PendingProducers("g")) != 0 {
		t.Fatal("aborted staging replayed as pending")
	}
}

// kill -9 between the staging and the completion: the acknowledged staging is on disk (a copy of
// the file taken while the store is still open is what a crashed process leaves) and replays as
// pending; a completion torn by the crash is not applied, and redoing it works.
func TestGroupStoreTxnCrashBetweenStageAndComplete(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	defer s.Close()
	gsStage(t, s, "g", 3, 1, GroupOffset{Topic: "t", Partition: 0, Offset: 100})
	crashed := t.TempDir()
	copyLog := func(to string) {
		t.Helper()
		b, err := os.ReadFile(gsPath(dir))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(gsPath(to)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(gsPath(to), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyLog(crashed)
	r := gsOpen(t, crashed)
	if !r.HasPending("g", "t", 0) {
		t.Fatal("acknowledged staging lost by the crash")
	}
	gsOffsetIs(t, r, "g", "t", 0, -1)
	r.Close()

	// The completion's frame is torn by the crash: the staging must still be pending.
	gsComplete(t, s, "g", 3, true)
	torn := t.TempDir()
	copyLog(torn)
	b, _ := os.ReadFile(gsPath(torn))
	os.WriteFile(gsPath(torn), b[:len(b)-2], 0o644)
	r = gsOpen(t, torn)
	defer r.Close()
	if !r.HasPending("g", "t", 0) {
		t.Fatal("torn completion applied")
	}
	gsOffsetIs(t, r, "g", "t", 0, -1)
	// The reconcile pass redoes the completion.
	gsComplete(t, r, "g", 3, true)
	gsOffsetIs(t, r, "g", "t", 0, 100)
}

// require_stable is per partition and per group: pending offsets of any producer make a partition
// unstable; others stay stable and the committed (not pending) offset is what Offset returns.
func TestGroupStoreTxnRequireStableView(t *testing.T) {
	s := gsOpen(t, t.TempDir())
	defer s.Close()
	if err := s.Commit("g", []GroupOffset{{Topic: "t", Partition: 0, Offset: 1}, {Topic: "t", Partition: 2, Offset: 1}}); err != nil {
		t.Fatal(err)
	}
	gsStage(t, s, "g", 10, 0, GroupOffset{Topic: "t", Partition: 0, Offset: 2}, GroupOffset{Topic: "t", Partition: 1, Offset: 3})
	gsStage(t, s, "g", 11, 0, GroupOffset{Topic: "u", Partition: 0, Offset: 4})
	for _, c := range []struct {
		group, topic string
		p            int32
		want         bool
	}{{"g", "t", 0, true}, {"g", "t", 1, true}, {"g", "u", 0, true}, {"g", "t", 2, false}, {"h", "t", 0, false}} {
		if got := s.HasPending(c.group, c.topic, c.p); got != c.want {
			t.Errorf("HasPending(%s, %s, %d) = %v", c.group, c.topic, c.p, got)
		}
	}
	gsOffsetIs(t, s, "g", "t", 0, 1)
	gsOffsetIs(t, s, "g", "t", 1, -1)
	if got := fmt.Sprint(s.PendingProducers("g")); got != "[10 11]" {
		t.Fatalf("producers = %s", got)
	}
	gsComplete(t, s, "g", 10, true)
	if s.HasPending("g", "t", 0) || !s.HasPending("g", "u", 0) {
		t.Fatal("completing one producer must clear only its partitions")
	}
	gsOffsetIs(t, s, "g", "t", 0, 2)
	gsOffsetIs(t, s, "g", "t", 1, 3)
}

// A plain commit made after a staging wins when the transaction commits (Apache keeps the newer
// record), and compaction keeps that decision.
func TestGroupStoreTxnPlainCommitAfterStagingWins(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	s.compactMin = 1 << 10
	gsStage(t, s, "g", 5, 0, GroupOffset{Topic: "t", Partition: 0, Offset: 10}, GroupOffset{Topic: "t", Partition: 1, Offset: 10})
	if err := s.Commit("g", []GroupOffset{{Topic: "t", Partition: 0, Offset: 20}}); err != nil {
		t.Fatal(err)
	}
	before := gsCompactionsTotal.Get()
	for i := 0; i < 200; i++ {
		if err := s.Commit("filler", []GroupOffset{{Topic: "x", Partition: 0, Offset: int64(i), Metadata: "padding padding"}}); err != nil {
			t.Fatal(err)
		}
	}
	if gsCompactionsTotal.Get() == before {
		t.Fatal("log never compacted")
	}
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	if !s.HasPending("g", "t", 0) {
		t.Fatal("superseded staging must stay pending until the transaction ends (Apache)")
	}
	gsComplete(t, s, "g", 5, true)
	gsOffsetIs(t, s, "g", "t", 0, 20)
	gsOffsetIs(t, s, "g", "t", 1, 10)
}

// Compaction rewrites the live set; open transactions are part of it (epoch included).
func TestGroupStoreTxnCompactionKeepsPending(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	s.compactMin = 1 << 10
	gsStage(t, s, "g", 9, 7, GroupOffset{Topic: "t", Partition: 0, Offset: 50, Metadata: "txn"})
	gsStage(t, s, "only-pending", 9, 7, GroupOffset{Topic: "t", Partition: 3, Offset: 1})
	before := gsCompactionsTotal.Get()
	for i := 0; i < 300; i++ {
		if err := s.Commit("g", []GroupOffset{{Topic: "other", Partition: int32(i % 4), Offset: int64(i), Metadata: "some metadata"}}); err != nil {
			t.Fatal(err)
		}
	}
	if gsCompactionsTotal.Get() == before {
		t.Fatal("log never compacted")
	}
	if st, _ := os.Stat(gsPath(dir)); st.Size() > 4<<10 {
		t.Fatalf("log is %d bytes after compaction", st.Size())
	}
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	if e, ok := s.PendingEpoch("g", 9); !ok || e != 7 || !s.HasPending("g", "t", 0) || !s.HasPending("only-pending", "t", 3) {
		t.Fatalf("pending lost by compaction: %d %v", e, ok)
	}
	gsOffsetIs(t, s, "g", "t", 0, -1)
	gsOffsetIs(t, s, "g", "other", 3, 299)
	gsComplete(t, s, "g", 9, true)
	o, _ := s.Offset("g", "t", 0)
	if o.Offset != 50 || o.Metadata != "txn" {
		t.Fatalf("committed after compaction = %+v", o)
	}
}

// Deleting offsets or the group drops the pending offsets of what is deleted (Apache
// GroupMetadata.removeOffsets), durably.
func TestGroupStoreTxnDeletesDropPending(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	gsStage(t, s, "g", 1, 0, GroupOffset{Topic: "t", Partition: 0, Offset: 1}, GroupOffset{Topic: "t", Partition: 1, Offset: 1})
	gsStage(t, s, "h", 1, 0, GroupOffset{Topic: "t", Partition: 0, Offset: 1})
	if err := s.DeleteOffsets("g", []GroupPartition{{"t", 0}}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteGroup("h"); err != nil {
		t.Fatal(err)
	}
	f := func(s *GroupStore) {
		t.Helper()
		if s.HasPending("g", "t", 0) || !s.HasPending("g", "t", 1) || s.HasPending("h", "t", 0) || s.HasGroup("h") {
			t.Fatal("deletes did not drop the right pending offsets")
		}
	}
	f(s)
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	f(s)
	gsComplete(t, s, "h", 1, true)
	if s.HasGroup("h") {
		t.Fatal("commit after DeleteGroups resurrected the group")
	}
}

// Stagings and completions from many producers race with readers (run with -race); every
// acknowledged operation is visible at once and the final state survives a reopen.
func TestGroupStoreTxnConcurrent(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	const producers, rounds = 8, 40
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for r := 0; r < 2; r++ {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for p := int32(0); p < producers; p++ {
					s.HasPending("g", "t", p)
					s.Offset("g", "t", p)
				}
				s.PendingProducers("g")
				s.Groups()
			}
		}()
	}
	var wg sync.WaitGroup
	for w := 0; w < producers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid := int64(1000 + w)
			for i := 0; i < rounds; i++ {
				errc := make(chan error, 2)
				s.StageTxnOffsets("g", pid, int16(i), []GroupOffset{{Topic: "t", Partition: int32(w), Offset: int64(i)}}, func(err error) { errc <- err })
				if err := <-errc; err != nil {
					t.Error(err)
					return
				}
				if !s.HasPending("g", "t", int32(w)) {
					t.Error("acknowledged staging not pending")
					return
				}
				commit := i%2 == 0
				s.CompleteTxnOffsets("g", pid, commit, func(err error) { errc <- err })
				if err := <-errc; err != nil {
					t.Error(err)
					return
				}
				want := int64(i)
				if !commit {
					want = int64(i - 1)
				}
				if o, _ := s.Offset("g", "t", int32(w)); o.Offset != want {
					t.Errorf("producer %d round %d: committed %d, want %d", w, i, o.Offset, want)
					return
				}
			}
			// Leave one staging open.
			errc := make(chan error, 1)
			s.StageTxnOffsets("g", pid, rounds, []GroupOffset{{Topic: "t", Partition: int32(w), Offset: 999}}, func(err error) { errc <- err })
			if err := <-errc; err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	if n := len(s.PendingProducers("g")); n != producers {
		t.Fatalf("%d open transactions after reopen, want %d", n, producers)
	}
	for w := int32(0); w < producers; w++ {
		gsOffsetIs(t, s, "g", "t", w, rounds-2)
		if !s.HasPending("g", "t", w) {
			t.Fatalf("partition %d not pending after reopen", w)
		}
	}
}
