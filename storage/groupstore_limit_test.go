package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kaas-go/kaas/storage/framelog"
)

// lowerFrameLimit makes the offset log's frame limit (reader and writer alike) small enough for a
// test to reach with a few commits.
func lowerFrameLimit(t *testing.T, n int) {
	t.Helper()
	old := gsFormat.MaxLen
	gsFormat.MaxLen = n
	t.Cleanup(func() { gsFormat.MaxLen = old })
}

// gsFrames returns the payload sizes of every frame of the offset log, failing on anything that
// does not read back whole.
func gsFrames(t *testing.T, dir string) []int {
	t.Helper()
	data, err := os.ReadFile(gsPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	s := framelog.Scanner{Format: &gsFormat, Frame: func(_ int, p []byte) (bool, error) {
		sizes = append(sizes, len(p))
		return true, nil
	}}
	res, err := s.Scan(data, len(gsHeader))
	if err != nil || res.Torn || res.Damaged || res.End != int64(len(data)) {
		t.Fatalf("offset log does not read back whole: %+v %v", res, err)
	}
	return sizes
}

// TestGroupStoreGroupIDLimit: group ids up to 32767 bytes are stored (and read back); a longer
// one is refused with ErrGroupIDTooLong before anything is written.
func TestGroupStoreGroupIDLimit(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	longest := strings.Repeat("g", GroupIDMaxBytes)
	if err := s.Commit(longest, []GroupOffset{{Topic: "t", Offset: 5}}); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(gsPath(dir))
	for _, op := range []func(string) error{
		func(g string) error { return s.Commit(g, []GroupOffset{{Topic: "t", Offset: 6}}) },
		func(g string) error { return s.DeleteGroup(g) },
		func(g string) error {
			ch := make(chan error, 1)
			s.StageTxnOffsets(g, 1, 0, []GroupOffset{{Topic: "t", Offset: 7}}, func(err error) { ch <- err })
			return <-ch
		},
	} {
		if err := op(longest + "g"); !errors.Is(err, ErrGroupIDTooLong) {
			t.Fatalf("32768-byte group id: %v", err)
		}
	}
	if st2, _ := os.Stat(gsPath(dir)); st2.Size() != st.Size() || s.HasGroup(longest+"g") {
		t.Fatalf("a refused op reached the log (%d → %d bytes) or memory", st.Size(), st2.Size())
	}
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	if o, ok := s.Offset(longest, "t", 0); !ok || o.Offset != 5 {
		t.Fatalf("longest group id after reopen: %+v %v", o, ok)
	}
}

// TestGroupStoreFrameLimit: the write side enforces the read side's frame limit. A commit just
// under it is acknowledged and survives a reopen; one over it is refused alone
// (ErrOffsetCommitTooLarge), the other ops of its batch are acknowledged; a batch over the limit
// is split into frames that each read back; so is a compaction snapshot of a group larger than
// one frame.
func TestGroupStoreFrameLimit(t *testing.T) {
	const limit = 1 << 10
	lowerFrameLimit(t, limit)
	dir := t.TempDir()
	s := gsOpen(t, dir)
	// One commit op: kind, group, count, and per offset topic, partition, offset, epoch,
	// metadata (2-byte length), time: fill the metadata to land exactly on the limit.
	op := func(meta int) []GroupOffset {
		return []GroupOffset{{Topic: "t", Partition: 1, Offset: 9, LeaderEpoch: 1, Metadata: strings.Repeat("m", meta), CommitTimeMs: 1}}
	}
	meta := 0
	for len(gsAppendOp(nil, &gsOp{kind: gsOpCommit, group: "g", offs: op(meta + 1)})) <= limit {
		meta++
	}
	if err := s.Commit("g", op(meta)); err != nil {
		t.Fatalf("commit of exactly %d bytes: %v", limit, err)
	}
	if err := s.Commit("g", op(meta+1)); !errors.Is(err, ErrOffsetCommitTooLarge) {
		t.Fatalf("commit one byte over the limit: %v", err)
	}
	if o, _ := s.Offset("g", "t", 1); len(o.Metadata) != meta {
		t.Fatalf("refused commit became visible: %d bytes of metadata", len(o.Metadata))
	}

	// One batch, handed to the writer as the mailbox would (the writer is idle once Wait
	// returns): 60 small commits (~2.5 KiB together) and an oversized one in the middle.
	splits := gsSplitsTotal.Get()
	errs := make([]chan error, 61)
	var batch []*gsOp
	for i := range errs {
		ch := make(chan error, 1)
		errs[i] = ch
		offs := []GroupOffset{{Topic: "batch", Partition: int32(i), Offset: int64(i), Metadata: "some metadata"}}
		if i == 30 {
			offs = op(2 * limit)
		}
		batch = append(batch, &gsOp{kind: gsOpCommit, group: "b", offs: offs, done: func(err error) { ch <- err }})
	}
	s.writer.Wait()
	s.writeOps(batch)
	for i, ch := range errs {
		err := <-ch
		if i == 30 && !errors.Is(err, ErrOffsetCommitTooLarge) || i != 30 && err != nil {
			t.Fatalf("op %d of the split batch: %v", i, err)
		}
	}
	if gsSplitsTotal.Get() == splits {
		t.Fatal("a batch over the frame limit was not split")
	}
	for _, n := range gsFrames(t, dir) {
		if n > limit {
			t.Fatalf("a %d-byte frame was written (limit %d)", n, limit)
		}
	}

	// Compaction of a group larger than one frame.
	s.compactMin = 1 << 10
	before := gsCompactionsTotal.Get()
	for round := 0; gsCompactionsTotal.Get() == before; round++ {
		if round > 50 {
			t.Fatal("log never compacted")
		}
		for p := int32(0); p < 60; p += 10 {
			var offs []GroupOffset
			for q := p; q < p+10; q++ {
				offs = append(offs, GroupOffset{Topic: "batch", Partition: q, Offset: int64(1000*round) + int64(q), Metadata: "some metadata"})
			}
			if err := s.Commit("b", offs); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := s.Offsets("b")
	s.Close()
	frames := gsFrames(t, dir)
	if len(frames) < 3 {
		t.Fatalf("a %d-offset snapshot in %d frames", len(want), len(frames))
	}

	s = gsOpen(t, dir)
	defer s.Close()
	if got := s.Offsets("b"); fmt.Sprint(got) != fmt.Sprint(want) || len(got) != 61 {
		t.Fatalf("after reopen: %d offsets, want %d", len(got), len(want))
	}
	if o, _ := s.Offset("g", "t", 1); len(o.Metadata) != meta {
		t.Fatalf("commit at the limit lost on reopen: %+v", o)
	}
}

// TestGroupStoreSnapshotSplitsLargeStaging: an open transaction's staged offsets larger than a
// frame survive compaction (the stage op is split, its superseded flags and epoch kept).
func TestGroupStoreSnapshotSplitsLargeStaging(t *testing.T) {
	lowerFrameLimit(t, 512)
	s := &GroupStore{groups: map[string]map[GroupPartition]GroupOffset{}, pending: map[string]map[int64]*gsPending{}}
	pe := &gsPending{epoch: 4, offs: map[GroupPartition]gsPendingOffset{}}
	for p := int32(0); p < 80; p++ {
		pe.offs[GroupPartition{"staged", p}] = gsPendingOffset{GroupOffset: GroupOffset{Topic: "staged", Partition: p, Offset: int64(p), Metadata: "md"},
			superseded: p%3 == 0}
	}
	s.pending["g"] = map[int64]*gsPending{7: pe}
	snap, _ := s.snapshot(nil, -1)
	r := &GroupStore{groups: map[string]map[GroupPartition]GroupOffset{}, pending: map[string]map[int64]*gsPending{}}
	frames := 0
	sc := framelog.Scanner{Format: &gsFormat, Frame: func(_ int, p []byte) (bool, error) {
		frames++
		ops, err := gsDecodeOps(p, false)
		for _, op := range ops {
			r.apply(op)
		}
		return true, err
	}}
	res, err := sc.Scan(snap, 0)
	if err != nil || res.Torn || frames < 2 {
		t.Fatalf("snapshot: %+v %v, %d frames", res, err, frames)
	}
	got := r.pending["g"][7]
	if got == nil || got.epoch != 4 || len(got.offs) != 80 {
		t.Fatalf("staged set after replay: %+v", got)
	}
	for gp, po := range pe.offs {
		if got.offs[gp] != po {
			t.Fatalf("%v: %+v, want %+v", gp, got.offs[gp], po)
		}
	}
}

// FuzzGroupStoreLoad: whatever offsets.log holds, opening it never panics; if it opens, the
// torn tail it cut is gone for good (a second open finds the same state and cuts nothing more).
func FuzzGroupStoreLoad(f *testing.F) {
	frame := func(ops ...*gsOp) []byte {
		var p []byte
		for _, op := range ops {
			p = gsAppendOp(p, op)
		}
		return gsFormat.Append(nil, p)
	}
	c1 := frame(&gsOp{kind: gsOpCommit, group: "g", offs: []GroupOffset{{Topic: "t", Offset: 5, Metadata: "m"}}})
	c2 := frame(&gsOp{kind: gsOpStage, group: "g", pid: 3, epoch: 1, offs: []GroupOffset{{Topic: "t", Partition: 1, Offset: 9}}},
		&gsOp{kind: gsOpTxnCmt, group: "g", pid: 3})
	file := append(append([]byte(gsHeader), c1...), c2...)
	f.Add(file)
	f.Add(file[:len(file)-4])
	f.Add(append(bytes.Clone(file), 0, 0, 0, 0))
	f.Add(append(append([]byte(gsHeader), make([]byte, 20)...), c2...))
	f.Add([]byte(gsHeader[:3]))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Dir(gsPath(dir)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(gsPath(dir), data, 0o644); err != nil {
			t.Fatal(err)
		}
		state := func(s *GroupStore) string {
			var b strings.Builder
			for _, g := range s.Groups() {
				fmt.Fprintf(&b, "%q=%v|%v;", g, s.Offsets(g), s.PendingProducers(g))
			}
			return b.String()
		}
		s, err := OpenGroupStore(dir, nil)
		if err != nil {
			return
		}
		first := state(s)
		s.Close()
		truncations := gsTruncatedTotal.Get()
		s, err = OpenGroupStore(dir, nil)
		if err != nil {
			t.Fatalf("opened once, then refused: %v", err)
		}
		defer s.Close()
		if again := state(s); again != first {
			t.Fatalf("state changed on reopen:\n%s\n%s", first, again)
		}
		if gsTruncatedTotal.Get() != truncations {
			t.Fatal("second open cut a torn tail again")
		}
	})
}
