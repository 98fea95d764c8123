package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
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
	// Sabotage the writer's file: writes now fail with EBADF. (The writer is idle: it
	// acknowledged the previous commit and reads s.f only after taking qmu.)
	ro, err := os.Open(gsPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	s.qmu.Lock()
	old := s.f
	s.f = ro
	s.qmu.Unlock()
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
	f.Add([]byte{2, 1, 'g'})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := gsDecodeOps(b)
		if err != nil {
			return
		}
		var re []byte
		for _, op := range ops {
			re = gsAppendOp(re, op)
		}
		if _, err := gsDecodeOps(re); err != nil {
			t.Fatalf("re-encoding a decoded payload fails: %v", err)
		}
	})
}
