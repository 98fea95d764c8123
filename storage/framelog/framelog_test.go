package framelog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

// The three layouts kaas has on disk, as the logs declare them (coord/txn journal.go,
// storage groupstore.go, storage wal.go). Their bytes are pinned below by hand-built frames.
var (
	journalLike = Format{HeaderLen: 8, LenAt: 0, CRCAt: 4, MinLen: 2, MaxLen: 1 << 10, Prezeroed: true,
		Plausible: func(fr []byte) bool { return fr[8] == 'P' || fr[8] == 'D' }}
	offsetsLike = Format{Magic: 0x4B474F46, HeaderLen: 12, LenAt: 4, CRCAt: 8, MaxLen: 1 << 10}
	walLike     = Format{Magic: 0x4b57414c, HeaderLen: 56, LenAt: 44, CRCAt: 4, CRCFrom: 8, Align: 8, MaxLen: 1 << 20}
)

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func crc(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// TestFormatsKeepOnDiskLayout: frames built by the primitive are byte for byte the layouts the
// logs wrote before it existed, so existing files still read.
func TestFormatsKeepOnDiskLayout(t *testing.T) {
	payload := []byte("Pxyz-payload")

	want := append(append(be32(uint32(len(payload))), be32(crc(payload))...), payload...)
	if got := journalLike.Append(nil, payload); !bytes.Equal(got, want) {
		t.Fatalf("journal frame\n got %x\nwant %x", got, want)
	}

	want = append(append(append(be32(0x4B474F46), be32(uint32(len(payload)))...), be32(crc(payload))...), payload...)
	if got := offsetsLike.Append(nil, payload); !bytes.Equal(got, want) {
		t.Fatalf("offsets frame\n got %x\nwant %x", got, want)
	}

	// WAL: the log fills header fields itself (seq at 8, round at 16) and seals afterwards.
	h := make([]byte, 56)
	binary.BigEndian.PutUint32(h, 0x4b57414c)
	binary.BigEndian.PutUint64(h[8:], 7)
	binary.BigEndian.PutUint64(h[16:], 9)
	binary.BigEndian.PutUint32(h[44:], uint32(len(payload)))
	want = append(h, payload...)
	binary.BigEndian.PutUint32(want[4:], crc(want[8:]))
	want = append(want, make([]byte, 4)...) // 56 + 12 = 68, padded to 72
	b, start := walLike.Begin([]byte{1, 2, 3})
	b = append(b, payload...)
	b = walLike.EndUnsealed(b, start)
	fr := b[start:]
	binary.BigEndian.PutUint64(fr[8:], 7)
	binary.BigEndian.PutUint64(fr[16:], 9)
	if n := walLike.Seal(fr); n != 72 || walLike.Size(len(payload)) != 72 {
		t.Fatalf("wal frame size %d", n)
	}
	if !bytes.Equal(fr, want) || !bytes.Equal(b[:3], []byte{1, 2, 3}) {
		t.Fatalf("wal frame\n got %x\nwant %x", fr, want)
	}
	for _, f := range []*Format{&journalLike, &offsetsLike, &walLike} {
		fr := f.Append(nil, payload)
		if f == &walLike {
			fr = want
		}
		p, size, ok := f.Parse(fr)
		if !ok || !bytes.Equal(p, payload) || size != len(fr) {
			t.Fatalf("parse own frame: %v %q %d", ok, p, size)
		}
	}
}

func TestParseRejects(t *testing.T) {
	good := offsetsLike.Append(nil, []byte("abc"))
	cases := map[string][]byte{
		"short header":  good[:11],
		"bad magic":     append([]byte{0}, good[1:]...),
		"cut payload":   good[:len(good)-1],
		"flipped bit":   append(bytes.Clone(good[:len(good)-1]), good[len(good)-1]^1),
		"flipped crc":   append(append(bytes.Clone(good[:8]), good[8]^0x80), good[9:]...),
		"over the max":  offsetsLike.Append(nil, make([]byte, 1<<10+1)),
		"length lies":   append(append(be32(0x4B474F46), be32(1<<30)...), good[8:]...),
		"empty":         nil,
		"zeros":         make([]byte, 64),
		"journal types": journalLike.Append(nil, []byte("Xabc")),
	}
	for name, b := range cases {
		f := &offsetsLike
		if name == "journal types" {
			f = &journalLike
		}
		if _, _, ok := f.Parse(b); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, _, ok := journalLike.Parse(journalLike.Append(nil, []byte("P"))); ok {
		t.Error("journal frame under MinLen accepted")
	}
	if !offsetsLike.Fits(1<<10) || offsetsLike.Fits(1<<10+1) || journalLike.Fits(1) {
		t.Error("Fits disagrees with the reader's bounds")
	}
}

func TestFind(t *testing.T) {
	// No magic, pre-zeroed: a frame far behind zeros is found, a damaged one is not.
	data := make([]byte, 1<<20)
	fr := journalLike.Append(nil, []byte("Pfound"))
	copy(data[700_001:], fr)
	if p := journalLike.Find(data, 0); p != 700_001 {
		t.Fatalf("Find = %d", p)
	}
	data[700_001+9] ^= 1
	if p := journalLike.Find(data, 0); p != -1 {
		t.Fatalf("Find on a bad CRC = %d", p)
	}
	// Magic and alignment: a magic at an unaligned position is not a frame start.
	w := walLike.Append(nil, []byte("x"))
	data = append(make([]byte, 3), w...)
	if p := walLike.Find(data, 0); p != -1 {
		t.Fatalf("unaligned frame found at %d", p)
	}
	data = append(make([]byte, 16), w...)
	if p := walLike.Find(data, 1); p != 16 {
		t.Fatalf("aligned frame at %d", p)
	}
}

// unitScanner reads frames whose first payload byte says whether they end a unit ('L' = last)
// and whose second is the unit number; a frame of the unit after the last complete one is Stray.
func unitScanner(f *Format) (*Scanner, *[]string) {
	var got []string
	unit := byte('0')
	s := &Scanner{Format: f,
		Frame: func(_ int, p []byte) (bool, error) {
			if p[0] == 'E' {
				return false, errors.New("undecodable payload")
			}
			if p[0] == 'B' {
				return false, ErrBadFrame
			}
			got = append(got, string(p))
			if p[0] == 'L' {
				unit = p[1]
				return true, nil
			}
			return false, nil
		},
		Follow: func(_ int, p []byte) Follow {
			if len(p) >= 2 && p[1] == unit+1 {
				return Stray
			}
			return Acked
		},
	}
	return s, &got
}

func TestScanClassifiesTheStop(t *testing.T) {
	f := Format{HeaderLen: 8, LenAt: 0, CRCAt: 4, MinLen: 2, MaxLen: 1 << 10, Prezeroed: true}
	fr := func(s string) []byte { return f.Append(nil, []byte(s)) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	u1 := cat(fr("P1a"), fr("L1b"))
	u2 := cat(fr("L2c"))
	zeros := make([]byte, 40)
	full := cat(u1, u2)
	for _, tc := range []struct {
		name                 string
		data                 []byte
		end                  int
		torn, damaged        bool
		why                  string
		wantErr, wantFrames  int
		damagedAt, tornAtEnd int
	}{
		{name: "clean at end of data", data: full, end: len(full), wantFrames: 3},
		{name: "clean at zeros", data: cat(full, zeros), end: len(full), wantFrames: 3},
		{name: "incomplete unit", data: cat(u1, fr("P2x"), zeros), end: len(u1), torn: true, why: "incomplete", wantFrames: 3},
		{name: "cut frame", data: full[:len(full)-2], end: len(u1), torn: true, why: "torn or corrupt", wantFrames: 2},
		{name: "short header", data: cat(full, []byte{0, 0, 1}), end: len(full), torn: true, why: "short frame header", wantFrames: 3},
		{name: "stray frame of the unfinished unit behind zeros", data: cat(u1, zeros, fr("P2y"), zeros), end: len(u1), torn: true, why: "stray", wantFrames: 2},
		{name: "acknowledged frame after damage", data: cat(fr("L1a"), []byte{0, 0, 0, 9, 1, 2, 3, 4}, zeros, fr("L3z")), end: 11, torn: true, damaged: true, wantFrames: 1, damagedAt: 11 + 8 + 40},
		{name: "acknowledged frame after zeros", data: cat(fr("L1a"), zeros, fr("L3z")), end: 11, damaged: true, wantFrames: 1, damagedAt: 11 + 40},
		{name: "bad frame from the callback, then the next unit", data: cat(u1, fr("B2"), u2), end: len(u1), torn: true, why: "bad frame", wantFrames: 2},
		{name: "bad frame from the callback, then a later unit", data: cat(u1, fr("B2"), fr("L3c")), end: len(u1), torn: true, damaged: true, why: "bad frame", wantFrames: 2, damagedAt: len(u1) + 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, got := unitScanner(&f)
			res, err := s.Scan(tc.data, 0)
			if err != nil {
				t.Fatal(err)
			}
			if int(res.End) != tc.end || res.Torn != tc.torn || res.Damaged != tc.damaged || len(*got) != tc.wantFrames {
				t.Fatalf("got %+v frames %q", res, *got)
			}
			if tc.why != "" && !strings.Contains(res.Why, tc.why) {
				t.Fatalf("why %q, want %q", res.Why, tc.why)
			}
			if tc.damaged && int(res.DamagedAt) != tc.damagedAt {
				t.Fatalf("damaged at %d, want %d", res.DamagedAt, tc.damagedAt)
			}
			if res.Torn && res.TornAt != res.Stop {
				t.Fatalf("torn at %d, stop %d", res.TornAt, res.Stop)
			}
		})
	}
	// An error from the callback ends the scan.
	s, _ := unitScanner(&f)
	if _, err := s.Scan(cat(fr("L1a"), fr("E2")), 0); err == nil || !strings.Contains(err.Error(), "undecodable payload") {
		t.Fatalf("callback error: %v", err)
	}

	// Without Prezeroed any byte after the last frame is a torn tail (the offset log).
	o := offsetsLike
	ofr := o.Append(nil, []byte("L1"))
	for _, tail := range [][]byte{zeros, []byte("garbage"), ofr[:5]} {
		s := &Scanner{Format: &o, Frame: func(int, []byte) (bool, error) { return true, nil }}
		res, _ := s.Scan(cat(ofr, tail), 0)
		if !res.Torn || res.Damaged || int(res.End) != len(ofr) {
			t.Fatalf("tail %q: %+v", tail, res)
		}
	}
	// Filler overrides: bytes that are not "ours" end the log cleanly (a recycled WAL file).
	w := walLike
	w.Filler = func(rest []byte) bool { return len(rest) < 4 || binary.BigEndian.Uint32(rest) != w.Magic }
	wfr := w.Append(nil, []byte("rec"))
	s = &Scanner{Format: &w, Frame: func(int, []byte) (bool, error) { return true, nil }}
	if res, _ := s.Scan(cat(wfr, []byte("old life of the file....")), 0); res.Torn || res.Damaged || int(res.End) != len(wfr) {
		t.Fatalf("filler: %+v", res)
	}
	bad := cat(wfr, wfr)
	bad[len(bad)-1] ^= 1 // padding is not checksummed; hit the payload
	bad[len(wfr)+56] ^= 1
	if res, _ := s.Scan(bad, 0); !res.Torn || int(res.End) != len(wfr) {
		t.Fatalf("a record of ours that fails is torn: %+v", res)
	}
}

// memFile is an in-memory File that fails the operations it is told to.
type memFile struct {
	data                               []byte
	failWrite, failSync, failDatasync  int // fail the next n calls
	failTruncate                       int
	writes, syncs, datasyncs, truncate int
	partial                            bool // a failing write still lands its first half
}

var errDisk = errors.New("injected disk error")

func (m *memFile) WriteAt(b []byte, off int64) (int, error) {
	if m.failWrite > 0 {
		m.failWrite--
		if m.partial {
			b = b[:len(b)/2]
			m.put(b, off)
		}
		return len(b), errDisk
	}
	m.writes++
	m.put(b, off)
	return len(b), nil
}

func (m *memFile) put(b []byte, off int64) {
	if end := int(off) + len(b); end > len(m.data) {
		m.data = append(m.data, make([]byte, end-len(m.data))...)
	}
	copy(m.data[off:], b)
}

func (m *memFile) Sync() error {
	if m.failSync > 0 {
		m.failSync--
		return errDisk
	}
	m.syncs++
	return nil
}

func (m *memFile) Datasync() error {
	if m.failDatasync > 0 {
		m.failDatasync--
		return errDisk
	}
	m.datasyncs++
	return nil
}

func (m *memFile) Truncate(n int64) error {
	if m.failTruncate > 0 {
		m.failTruncate--
		return errDisk
	}
	m.truncate++
	m.data = m.data[:min(int(n), len(m.data))]
	if int(n) > len(m.data) {
		m.data = append(m.data, make([]byte, int(n)-len(m.data))...)
	}
	return nil
}

func scanAll(t *testing.T, f *Format, data []byte) ([]string, Result) {
	t.Helper()
	var got []string
	s := &Scanner{Format: f, Frame: func(_ int, p []byte) (bool, error) { got = append(got, string(p)); return true, nil }}
	res, err := s.Scan(data, 0)
	if err != nil {
		t.Fatal(err)
	}
	return got, res
}

// TestAppenderRepairsAfterFailedSync: a write whose fdatasync failed is never trusted: its region
// is zeroed and fsync'd before anything else is appended, so the log reads back exactly the
// acknowledged frames, and while the repair itself fails nothing is written.
func TestAppenderRepairsAfterFailedSync(t *testing.T) {
	f := journalLike
	m := &memFile{data: make([]byte, 4096), partial: true}
	a := NewAppender(m, &f, 0, 4096)
	if err := a.Append([]byte("Pone"), []byte("Ptwo")); err != nil || m.writes != 1 || m.datasyncs != 1 || m.syncs != 0 {
		t.Fatalf("append: %v, %d writes %d datasyncs %d syncs", err, m.writes, m.datasyncs, m.syncs)
	}
	acked := a.Offset()

	m.failDatasync = 1
	if err := a.Append([]byte("Plost")); !errors.Is(err, errDisk) {
		t.Fatalf("failed sync answered %v", err)
	}
	if a.Broken() || a.Offset() != acked || m.syncs != 1 {
		t.Fatalf("after a failed sync: broken %v off %d syncs %d", a.Broken(), a.Offset(), m.syncs)
	}
	if IndexNonZero(m.data[acked:]) >= 0 {
		t.Fatal("the failed write's bytes were not zeroed back")
	}

	// The write and then the repair fail: the appender stays broken and writes nothing more.
	m.failWrite, m.failSync = 1, 1
	if err := a.Append([]byte("Pgone")); !errors.Is(err, errDisk) || !a.Broken() {
		t.Fatalf("write+repair failure: %v broken %v", err, a.Broken())
	}
	m.failSync = 1
	writes := m.writes
	if err := a.Append([]byte("Pnever")); err == nil || m.writes != writes+1 {
		// the one write is the repair's zeros, never the frame
		t.Fatalf("append while the repair fails: %v, writes %d→%d", err, writes, m.writes)
	}
	if err := a.Append([]byte("Pthree")); err != nil || a.Broken() {
		t.Fatalf("append after the disk came back: %v", err)
	}
	got, res := scanAll(t, &f, m.data)
	if strings.Join(got, ",") != "Pone,Ptwo,Pthree" || res.Torn || res.Damaged {
		t.Fatalf("log reads %q %+v", got, res)
	}
}

// TestAppenderPastTheZeroedRegion: a write that ends past the pre-zeroed region is fsync'd, and
// its failure cuts the file back to the durable end (an unbounded log such as the offset log has
// no zeroed region at all).
func TestAppenderPastTheZeroedRegion(t *testing.T) {
	f := offsetsLike
	m := &memFile{}
	a := NewAppender(m, &f, 0, 0)
	if err := a.Append([]byte("L1")); err != nil || m.syncs != 1 || m.datasyncs != 0 {
		t.Fatalf("append: %v syncs %d datasyncs %d", err, m.syncs, m.datasyncs)
	}
	good := len(m.data)
	m.failSync = 1
	if err := a.Append([]byte("L2-lost")); err == nil {
		t.Fatal("failed fsync acknowledged")
	}
	if len(m.data) != good || m.truncate != 1 || a.Broken() {
		t.Fatalf("not cut back: %d bytes (want %d), %d truncates", len(m.data), good, m.truncate)
	}
	if err := a.Append(make([]byte, f.MaxLen+1)); !errors.Is(err, ErrFrameTooLarge) || len(m.data) != good {
		t.Fatalf("over-limit payload: %v, file %d bytes", err, len(m.data))
	}
	if err := a.Append([]byte("L3")); err != nil {
		t.Fatal(err)
	}
	got, res := scanAll(t, &f, m.data)
	if strings.Join(got, ",") != "L1,L3" || res.Torn {
		t.Fatalf("log reads %q %+v", got, res)
	}
}

// TestReaderLatchesTheFirstError: decoding stops at the first bad field and names it.
func TestReaderLatchesTheFirstError(t *testing.T) {
	b := AppendStr(nil, "group")
	b = binary.AppendVarint(b, -5)
	b = append(b, 7)
	r := Reader{B: b}
	if r.Str("group") != "group" || r.Varint("v") != -5 || r.Byte("b") != 7 || r.Err != nil || len(r.B) != 0 {
		t.Fatalf("round trip failed: %v", r.Err)
	}
	r = Reader{B: binary.AppendVarint(nil, 1<<40)}
	if r.VarintIn("epoch", -1<<31, 1<<31-1); r.Err == nil || r.Err.Error() != "bad epoch" {
		t.Fatalf("range: %v", r.Err)
	}
	r = Reader{B: []byte{5, 'a'}}
	if r.Str("topic"); r.Err == nil || r.Err.Error() != "bad topic length" || r.B != nil {
		t.Fatalf("short string: %v", r.Err)
	}
	r.Byte("later")
	if r.Err.Error() != "bad topic length" {
		t.Fatalf("error not latched: %v", r.Err)
	}
	r = Reader{B: []byte{200, 1, 1}}
	if n := r.Count("items"); n != 0 || r.Err == nil {
		t.Fatalf("count larger than the payload accepted: %d", n)
	}
}

// TestAppendAtTheLimit: the largest payload the reader accepts is written and read back; one
// byte more is refused before the write.
func TestAppendAtTheLimit(t *testing.T) {
	f := Format{HeaderLen: 8, LenAt: 0, CRCAt: 4, MinLen: 1, MaxLen: 16 << 20, Prezeroed: true}
	m := &memFile{}
	a := NewAppender(m, &f, 0, 0)
	big := bytes.Repeat([]byte{'x'}, f.MaxLen)
	if err := a.Append(big); err != nil {
		t.Fatal(err)
	}
	if err := a.Append(append(big, 'y')); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
	got, res := scanAll(t, &f, m.data)
	if len(got) != 1 || len(got[0]) != f.MaxLen || res.Torn || int(res.End) != len(m.data) {
		t.Fatalf("read back %d frames, %+v", len(got), res)
	}
}
