package storage

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

func TestAppendAssignsOffsetsAndHWMFollowsFsync(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	for i := 0; i < 5; i++ {
		r := mustAppend(t, p, makeBatch(t, tb{n: 3, ts: 1000}), 2000)
		if r.BaseOffset != int64(i*3) || r.LastOffset != int64(i*3+2) || r.LogAppendTime != -1 || r.LogStartOffset != 0 {
			t.Fatalf("append %d: %+v", i, r)
		}
	}
	if p.LogEndOffset() != 15 || p.HighWatermark() != 15 {
		t.Fatalf("leo %d hwm %d", p.LogEndOffset(), p.HighWatermark())
	}
	bs := readAll(t, p, 0)
	if len(bs) != 5 || bs[4].BaseOffset() != 12 {
		t.Fatalf("read %d batches", len(bs))
	}
}

func TestLogAppendTime(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, map[string]string{"message.timestamp.type": "LogAppendTime"})
	r := mustAppend(t, p, makeBatch(t, tb{n: 2, ts: 5}), 777)
	if r.LogAppendTime != 777 {
		t.Fatalf("%+v", r)
	}
	b := readAll(t, p, 0)[0]
	if !b.IsLogAppendTime() || b.MaxTimestamp() != 777 || !b.CRCValid() {
		t.Fatal("batch not stamped with LogAppendTime")
	}
}

func TestReadSemantics(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, nil)
	var sizes []int
	for i := 0; i < 10; i++ {
		b := makeBatch(t, tb{n: 2, ts: int64(i), value: 100})
		sizes = append(sizes, len(b))
		mustAppend(t, p, b, 0)
	}
	hwm := p.HighWatermark() // 20
	count := func(buf []byte) (n int, first, last int64) {
		first = -1
		for len(buf) > 0 {
			b, ok, _ := codec.FrameBatch(buf)
			if !ok {
				t.Fatal("partial batch returned")
			}
			if first < 0 {
				first = b.BaseOffset()
			}
			last = b.LastOffset()
			n++
			buf = buf[len(b):]
		}
		return
	}
	// Offset inside a batch returns that whole batch.
	buf, code := p.Read(nil, 5, 1<<20, hwm)
	if n, first, last := count(buf); code != 0 || n != 8 || first != 4 || last != 19 {
		t.Fatalf("mid-batch read: code %d n %d first %d last %d", code, n, first, last)
	}
	// maxBytes smaller than one batch still returns one batch.
	buf, _ = p.Read(nil, 0, 1, hwm)
	if n, _, _ := count(buf); n != 1 {
		t.Fatalf("maxBytes=1 gave %d batches", n)
	}
	// maxBytes for exactly 3 batches.
	buf, _ = p.Read(nil, 0, int32(sizes[0]*3+10), hwm)
	if n, _, _ := count(buf); n != 3 {
		t.Fatalf("maxBytes 3 batches gave %d", n)
	}
	// upTo stops before the batch at or beyond it.
	buf, _ = p.Read(nil, 0, 1<<20, 6)
	if n, _, last := count(buf); n != 3 || last != 5 {
		t.Fatalf("upTo=6 gave %d batches, last %d", n, last)
	}
	// At the HWM: empty, no error. Past it or before the start: out of range.
	if buf, code = p.Read(nil, hwm, 1<<20, hwm); code != 0 || len(buf) != 0 {
		t.Fatalf("read at hwm: %d %d", code, len(buf))
	}
	if _, code = p.Read(nil, hwm+1, 1<<20, hwm); code != codec.CodeOffsetOutOfRange {
		t.Fatalf("read past hwm: %d", code)
	}
	if _, code = p.Read(nil, -1, 1<<20, hwm); code != codec.CodeOffsetOutOfRange {
		t.Fatalf("read before start: %d", code)
	}
	// dst is appended to.
	buf, _ = p.Read([]byte("xy"), 0, 1, hwm)
	if string(buf[:2]) != "xy" || len(buf) != 2+sizes[0] {
		t.Fatal("dst not appended")
	}
}

func TestRollBySizeAndIndexRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	p := newPartition(t, s, map[string]string{"segment.bytes": "2048"})
	for i := 0; i < 60; i++ {
		mustAppend(t, p, makeBatch(t, tb{n: 2, ts: int64(100 + i), value: 50}), 0)
	}
	segs := *p.segs.Load()
	if len(segs) < 4 {
		t.Fatalf("only %d segments", len(segs))
	}
	for _, sg := range segs {
		if sg.size.Load() > 2048 {
			t.Fatalf("segment %d has %d bytes", sg.base, sg.size.Load())
		}
	}
	// Closed segments have index files on disk.
	for _, sg := range segs[:len(segs)-1] {
		for _, ext := range []string{".index", ".timeindex"} {
			if _, err := os.Stat(sg.path(ext)); err != nil {
				t.Fatalf("missing %s: %v", ext, err)
			}
		}
	}
	want := readAll(t, p, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	// Reopened closed segments load their index files (not a rescan) and agree.
	for _, sg := range (*p.segs.Load())[:len(segs)-1] {
		sg.mu.Lock()
		n := len(sg.index)
		sg.mu.Unlock()
		if n == 0 {
			t.Fatalf("segment %d has no index after reopen", sg.base)
		}
	}
	if p.HighWatermark() != 120 || p.LogEndOffset() != 120 {
		t.Fatalf("hwm %d", p.HighWatermark())
	}
	// Every single offset can be read from the batch containing it.
	for o := int64(0); o < 120; o++ {
		buf, code := p.Read(nil, o, 1, 120)
		b, ok, _ := codec.FrameBatch(buf)
		if code != 0 || !ok || b.BaseOffset() > o || b.LastOffset() < o {
			t.Fatalf("offset %d: code %d ok %v", o, code, ok)
		}
	}
	got := readAll(t, p, 0)
	if len(got) != len(want) {
		t.Fatalf("%d batches after reopen, want %d", len(got), len(want))
	}
	// A corrupt index of a closed segment is detected and rebuilt.
	first := (*p.segs.Load())[0]
	s.Close()
	if err := os.WriteFile(first.path(".index"), []byte{1, 2, 3, 4, 5, 6, 7, 8}, 0o644); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	if got := readAll(t, p, 0); len(got) != len(want) {
		t.Fatalf("%d batches after index rebuild", len(got))
	}
}

func TestRollByTime(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, map[string]string{"segment.ms": "1000"})
	mustAppend(t, p, makeBatch(t, tb{}), 10_000)
	mustAppend(t, p, makeBatch(t, tb{}), 10_999)
	if n := len(*p.segs.Load()); n != 1 {
		t.Fatalf("%d segments before segment.ms", n)
	}
	mustAppend(t, p, makeBatch(t, tb{}), 11_000)
	segs := *p.segs.Load()
	if len(segs) != 2 || segs[1].base != 2 {
		t.Fatalf("no roll by time: %d segments", len(segs))
	}
	if got := readAll(t, p, 0); len(got) != 3 {
		t.Fatalf("%d batches", len(got))
	}
}

func TestRetentionByTimeAndBytes(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, map[string]string{"segment.bytes": "1024", "retention.ms": "10000"})
	// ~4 batches per segment; timestamps grow by 1000 per batch.
	for i := 0; i < 20; i++ {
		mustAppend(t, p, makeBatch(t, tb{ts: int64(i * 1000), value: 200}), 0)
	}
	segs := *p.segs.Load()
	if len(segs) < 4 {
		t.Fatalf("%d segments", len(segs))
	}
	// now = 25s: a segment goes when its max timestamp is older than 15s (< 15000).
	s.RunRetention(time.UnixMilli(25_000))
	ls := p.LogStartOffset()
	if ls == 0 {
		t.Fatal("nothing removed by time")
	}
	for _, sg := range *p.segs.Load() {
		if _, maxTs, _ := sg.stats(); sg != p.active && maxTs < 15_000 {
			t.Fatalf("segment %d with max ts %d survived", sg.base, maxTs)
		}
	}
	if _, err := os.Stat(segs[0].path(".log")); !os.IsNotExist(err) {
		t.Fatal("deleted segment file still there")
	}
	if _, code := p.Read(nil, 0, 100, p.HighWatermark()); code != codec.CodeOffsetOutOfRange {
		t.Fatal("read below log start succeeded")
	}
	if r := mustAppend(t, p, makeBatch(t, tb{ts: 30_000}), 0); r.LogStartOffset != ls {
		t.Fatalf("append reports log start %d, want %d", r.LogStartOffset, ls)
	}
	// retention.bytes: keep at most ~1 segment besides the active one.
	if err := s.AlterTopicConfig("t", map[string]*string{"retention.ms": nil, "retention.bytes": ptr("1024")}); err != nil {
		t.Fatal(err)
	}
	s.RunRetention(time.UnixMilli(25_000))
	segs = *p.segs.Load()
	var total int64
	for _, sg := range segs {
		total += sg.size.Load()
	}
	if total-segs[0].size.Load() >= 1024 && len(segs) > 1 {
		t.Fatalf("retention.bytes not applied: %d segments, %d bytes", len(segs), total)
	}
	if p.active != segs[len(segs)-1] || p.active.size.Load() == 0 {
		t.Fatal("active segment touched")
	}
	// Retention never removes the active segment, even if everything is expired.
	s.RunRetention(time.UnixMilli(1 << 50))
	if n := len(*p.segs.Load()); n != 1 {
		t.Fatalf("%d segments after full expiry", n)
	}
	if got := readAll(t, p, p.LogStartOffset()); len(got) == 0 {
		t.Fatal("active segment data lost")
	}
}

func ptr(s string) *string { return &s }

func TestOffsetForTimestampAndMaxTimestamp(t *testing.T) {
	s := openStore(t, "")
	defer s.Close()
	p := newPartition(t, s, map[string]string{"segment.bytes": "1024"})
	if o, ts := p.MaxTimestamp(); o != -1 || ts != -1 {
		t.Fatalf("empty max ts %d %d", o, ts)
	}
	// Batch i has 5 records at timestamps 100*i + 0..4, offsets 5i..5i+4.
	for i := 0; i < 30; i++ {
		mustAppend(t, p, makeBatch(t, tb{n: 5, ts: int64(100 * i), value: 30}), 0)
	}
	if len(*p.segs.Load()) < 3 {
		t.Fatal("want several segments")
	}
	cases := []struct{ ts, off, gotTs int64 }{
		{0, 0, 0}, {3, 3, 3}, {50, 5, 100}, {1002, 52, 1002}, {2904, 149, 2904},
	}
	for _, c := range cases {
		o, ts, ok := p.OffsetForTimestamp(c.ts)
		if !ok || o != c.off || ts != c.gotTs {
			t.Fatalf("ts %d: got %d %d %v, want %d %d", c.ts, o, ts, ok, c.off, c.gotTs)
		}
	}
	if _, _, ok := p.OffsetForTimestamp(2905); ok {
		t.Fatal("found a timestamp beyond the max")
	}
	if o, ts := p.MaxTimestamp(); o != 149 || ts != 2904 {
		t.Fatalf("max ts %d %d", o, ts)
	}
	// An older timestamp appended later does not change the max.
	mustAppend(t, p, makeBatch(t, tb{ts: 5}), 0)
	if o, ts := p.MaxTimestamp(); o != 149 || ts != 2904 {
		t.Fatalf("max ts %d %d", o, ts)
	}
}

func TestTopicLifecycle(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	for _, bad := range []string{"", ".", "..", "a/b", "sp ace", string(make([]byte, 250))} {
		if _, err := s.CreateTopic(bad, 1, nil); ErrorCode(err) != codec.CodeInvalidTopicException {
			t.Fatalf("name %q: %v", bad, err)
		}
	}
	if _, err := s.CreateTopic("x", 0, nil); ErrorCode(err) != codec.CodeInvalidPartitions {
		t.Fatal(err)
	}
	if _, err := s.CreateTopic("x", 1, map[string]string{"bogus": "1"}); ErrorCode(err) != codec.CodeInvalidConfig {
		t.Fatal(err)
	}
	a, err := s.CreateTopic("a.b", 2, map[string]string{"retention.ms": "5000"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTopic("a.b", 1, nil); ErrorCode(err) != codec.CodeTopicAlreadyExists {
		t.Fatal(err)
	}
	if _, err := s.CreateTopic("a_b", 1, nil); ErrorCode(err) != codec.CodeInvalidTopicException {
		t.Fatalf("collision: %v", err)
	}
	if a.ID == ([16]byte{}) || a.ID[6]>>4 != 4 || s.TopicByID(a.ID) != a {
		t.Fatal("bad topic id")
	}
	mustAppend(t, a.Partition(1), makeBatch(t, tb{}), 0)
	if err := s.CreatePartitions("a.b", 2); ErrorCode(err) != codec.CodeInvalidPartitions {
		t.Fatal(err)
	}
	if err := s.CreatePartitions("a.b", 4); err != nil || a.NumPartitions() != 4 || a.Partition(3) == nil || a.Partition(4) != nil {
		t.Fatal(err)
	}
	if err := s.AlterTopicConfig("a.b", map[string]*string{"retention.ms": nil, "segment.ms": ptr("60000")}); err != nil {
		t.Fatal(err)
	}
	if err := s.AlterTopicConfig("a.b", map[string]*string{"segment.ms": ptr("-5")}); ErrorCode(err) != codec.CodeInvalidConfig {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, dir)
	a2 := s.Topic("a.b")
	if a2 == nil || a2.ID != a.ID || a2.NumPartitions() != 4 {
		t.Fatal("topic not reloaded")
	}
	if ov := a2.Overrides(); len(ov) != 1 || ov["segment.ms"] != "60000" || a2.Config().RetentionMs != DefaultTopicConfig().RetentionMs {
		t.Fatalf("overrides %v", ov)
	}
	if a2.Partition(1).HighWatermark() != 1 {
		t.Fatal("data lost")
	}
	// An incomplete creation (dir without metadata) is discarded on open.
	if err := os.MkdirAll(filepath.Join(dir, "topics", "half", "0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTopic("a.b"); err != nil {
		t.Fatal(err)
	}
	if s.Topic("a.b") != nil || s.TopicByID(a.ID) != nil {
		t.Fatal("still there")
	}
	if err := s.DeleteTopic("a.b"); ErrorCode(err) != codec.CodeUnknownTopicOrPartition {
		t.Fatal(err)
	}
	if r := a2.Partition(0).Append(makeBatch(t, tb{}), 0); r.Code == codec.CodeNone {
		t.Fatal("append to deleted topic succeeded")
	}
	a3, err := s.CreateTopic("a.b", 1, nil)
	if err != nil || a3.ID == a.ID || a3.Partition(0).LogEndOffset() != 0 {
		t.Fatalf("recreate: %v", err)
	}
	s.Close()
	s = openStore(t, dir)
	defer s.Close()
	if s.Topic("half") != nil {
		t.Fatal("incomplete topic loaded")
	}
	if names := s.Topics(); len(names) != 1 || names[0].Name != "a.b" {
		t.Fatalf("topics %v", names)
	}
	eventually(t, "deleted dirs removed", func() bool {
		ents, _ := os.ReadDir(filepath.Join(dir, "deleted"))
		return len(ents) == 0
	})
}
