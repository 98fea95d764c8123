package codec

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func init() {
	// The server registers its handlers; the codec tests register a few keys of their own.
	Register(int16(kmsg.ApiVersions), 0, 4)
	Register(int16(kmsg.Metadata), 0, 12)
	Register(int16(kmsg.Produce), 3, 11)
}

// frame encodes a request the way a client does: header v1/v2 then the body (no size prefix).
func frame(req kmsg.Request, corr int32, clientID *string) []byte {
	var b []byte
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	if clientID == nil {
		b = binary.BigEndian.AppendUint16(b, 0xffff)
	} else {
		b = binary.BigEndian.AppendUint16(b, uint16(len(*clientID)))
		b = append(b, *clientID...)
	}
	if req.IsFlexible() {
		b = append(b, 0)
	}
	return req.AppendTo(b)
}

func TestParseRequestHeaders(t *testing.T) {
	id := "client-1"
	f := func(req kmsg.Request, clientID *string) {
		t.Helper()
		got, err := ParseRequest(frame(req, 77, clientID))
		if err != nil {
			t.Fatalf("v%d: %v", req.GetVersion(), err)
		}
		if got.Header.CorrelationID != 77 || got.Header.Key != req.Key() || got.Header.Version != req.GetVersion() {
			t.Fatalf("bad header %+v", got.Header)
		}
		if (clientID == nil) != (got.Header.ClientID == nil) || (clientID != nil && *clientID != *got.Header.ClientID) {
			t.Fatalf("client id mismatch")
		}
	}
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 1 // header v1
	f(md, &id)
	md = kmsg.NewPtrMetadataRequest()
	md.Version = 9 // flexible: header v2
	f(md, &id)
	f(md, nil)
	av := kmsg.NewPtrApiVersionsRequest()
	av.Version = 3
	av.ClientSoftwareName, av.ClientSoftwareVersion = "x", "1"
	f(av, &id)
}

func TestParseRequestErrors(t *testing.T) {
	f := func(b []byte, want error) {
		t.Helper()
		_, err := ParseRequest(b)
		if !errors.Is(err, want) {
			t.Fatalf("got %v want %v", err, want)
		}
	}
	f([]byte{0, 18, 0}, ErrTruncated)
	av := kmsg.NewPtrApiVersionsRequest()
	av.Version = 9 // above ours: KIP-511 fallback
	b := binary.BigEndian.AppendUint16(nil, 18)
	b = binary.BigEndian.AppendUint16(b, 9)
	b = binary.BigEndian.AppendUint32(b, 5)
	f(b, ErrUnsupportedVersion)
	b = binary.BigEndian.AppendUint16(nil, 999)
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint32(b, 5)
	f(b, ErrUnknownKey)
	// A served key version below the minimum.
	pr := kmsg.NewPtrProduceRequest()
	pr.Version = 2
	f(frame(pr, 1, nil), ErrUnsupportedVersion)
	// Truncated client id.
	b = binary.BigEndian.AppendUint16(nil, 3)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint32(b, 5)
	b = binary.BigEndian.AppendUint16(b, 10)
	f(append(b, 'a'), ErrTruncated)
}

func TestControlledShutdownV0HasNoClientID(t *testing.T) {
	h := RequestHeader{Key: 7, Version: 0}
	rest, err := parseHeaderRest(&h, []byte{1, 2, 3}, false)
	if err != nil || len(rest) != 3 || h.ClientID != nil {
		t.Fatalf("rest=%v err=%v", rest, err)
	}
}

func TestApiVersionsResponseUsesHeaderV0(t *testing.T) {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 3 // flexible body, but the header has no tag byte (KIP-511)
	b := AppendResponse(nil, 9, resp)
	if int(binary.BigEndian.Uint32(b)) != len(b)-4 || binary.BigEndian.Uint32(b[4:]) != 9 {
		t.Fatal("bad frame")
	}
	back := kmsg.NewPtrApiVersionsResponse()
	back.Version = 3
	if err := back.ReadFrom(b[8:]); err != nil {
		t.Fatalf("body must start right after the correlation id: %v", err)
	}
	md := kmsg.NewPtrMetadataResponse()
	md.Version = 9
	b = AppendResponse(nil, 9, md)
	if b[8] != 0 {
		t.Fatal("flexible response header must carry an empty tag section")
	}
	fb := ApiVersionsFallback()
	// KIP-511: only ApiVersions' own range, so the client retries at it (franz-go would take a
	// full list as the v0 answer and never learn the finalized features).
	if fb.Version != 0 || fb.ErrorCode != CodeUnsupportedVersion || len(fb.ApiKeys) != 1 ||
		fb.ApiKeys[0].ApiKey != int16(kmsg.ApiVersions) || fb.ApiKeys[0].MaxVersion != 4 {
		t.Fatalf("fallback %+v", fb)
	}
}

// makeBatch builds a v2 batch like a producer does.
func makeBatch(n int, pid int64, seq int32, attrs int16) []byte {
	rb := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1, Magic: 2, Attributes: attrs, LastOffsetDelta: int32(n - 1),
		FirstTimestamp: 1000, MaxTimestamp: 1000 + int64(n), ProducerID: pid, ProducerEpoch: 0,
		FirstSequence: seq, NumRecords: int32(n),
	}
	var recs []byte
	for i := 0; i < n; i++ {
		var body []byte
		body = append(body, 0)
		body = binary.AppendVarint(body, int64(i))
		body = binary.AppendVarint(body, int64(i))
		body = binary.AppendVarint(body, 1)
		body = append(body, 'k')
		body = binary.AppendVarint(body, 5)
		body = append(body, "value"...)
		body = binary.AppendVarint(body, 0)
		recs = binary.AppendVarint(recs, int64(len(body)))
		recs = append(recs, body...)
	}
	rb.Records = recs
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func TestValidateProduce(t *testing.T) {
	opts := ValidateOptions{MaxMessageBytes: 1 << 20, TimestampBeforeMaxMs: -1, TimestampAfterMaxMs: -1}
	f := func(name string, b []byte, o ValidateOptions, want int16) {
		t.Helper()
		_, got := ValidateProduce(b, o)
		if got != want {
			t.Fatalf("%s: code %d want %d", name, got, want)
		}
	}
	good := makeBatch(3, 7, 0, 0)
	f("good", good, opts, CodeNone)
	bad := append([]byte(nil), good...)
	bad[len(bad)-1] ^= 1
	f("crc", bad, opts, CodeCorruptMessage)
	f("short", good[:30], opts, CodeCorruptMessage)
	f("truncated", good[:len(good)-1], opts, CodeCorruptMessage)
	f("two batches", append(append([]byte(nil), good...), good...), opts, CodeInvalidRecord)
	m1 := append([]byte(nil), good...)
	m1[16] = 1
	f("magic", m1, opts, CodeInvalidRecord)
	f("too large", good, ValidateOptions{MaxMessageBytes: 50}, CodeMessageTooLarge)
	f("control", makeBatch(1, 7, 0, AttrControl|AttrTransactional), opts, CodeInvalidRecord)
	f("txn without pid", makeBatch(1, -1, 0, AttrTransactional), opts, CodeInvalidRecord)
	// Count says 3 but lastOffsetDelta says 1.
	c := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(c[23:], 1)
	binary.BigEndian.PutUint32(c[17:], crc32.Checksum(c[21:], castagnoli))
	f("delta", c, opts, CodeInvalidRecord)
	// Count says 4 records but only 3 are there.
	c = append([]byte(nil), good...)
	binary.BigEndian.PutUint32(c[23:], 3)
	binary.BigEndian.PutUint32(c[57:], 4)
	binary.BigEndian.PutUint32(c[17:], crc32.Checksum(c[21:], castagnoli))
	f("count", c, opts, CodeCorruptMessage)
	f("too old", good, ValidateOptions{TimestampBeforeMaxMs: 10, TimestampAfterMaxMs: -1, NowMs: 1_000_000}, CodeInvalidTimestamp)
	f("future", good, ValidateOptions{TimestampBeforeMaxMs: -1, TimestampAfterMaxMs: 10, NowMs: 10}, CodeInvalidTimestamp)
}

func TestBatchAccessorsAndRewrite(t *testing.T) {
	b, code := ValidateProduce(makeBatch(5, 42, 100, 0), ValidateOptions{TimestampBeforeMaxMs: -1, TimestampAfterMaxMs: -1})
	if code != CodeNone {
		t.Fatal(code)
	}
	if b.NumRecords() != 5 || b.ProducerID() != 42 || b.BaseSequence() != 100 || b.LastSequence() != 104 {
		t.Fatalf("accessors: %d %d %d %d", b.NumRecords(), b.ProducerID(), b.BaseSequence(), b.LastSequence())
	}
	b.SetBaseOffset(1234)
	if !b.CRCValid() || b.LastOffset() != 1238 {
		t.Fatal("base offset rewrite must not touch the CRC")
	}
	b.SetLogAppendTime(99)
	if !b.CRCValid() || !b.IsLogAppendTime() || b.MaxTimestamp() != 99 {
		t.Fatal("log append time rewrite")
	}
	var rb kmsg.RecordBatch
	if err := rb.ReadFrom(b); err != nil || rb.FirstOffset != 1234 || rb.MaxTimestamp != 99 {
		t.Fatalf("kmsg disagrees: %v %+v", err, rb)
	}
}

func TestIncrementSequenceWraps(t *testing.T) {
	f := func(seq, d, want int32) {
		t.Helper()
		if got := IncrementSequence(seq, d); got != want {
			t.Fatalf("IncrementSequence(%d,%d)=%d want %d", seq, d, got, want)
		}
	}
	f(0, 4, 4)
	f(math.MaxInt32, 1, 0)
	f(math.MaxInt32-1, 3, 1)
	f(math.MaxInt32-4, 4, math.MaxInt32)
}

func TestControlBatch(t *testing.T) {
	for _, commit := range []bool{true, false} {
		b := Batch(AppendControlBatch(nil, 55, 3, commit, 7, 123))
		if _, ok, bad := FrameBatch(b); !ok || bad || !b.CRCValid() {
			t.Fatal("control batch framing/crc")
		}
		if !b.IsControl() || !b.IsTransactional() || b.ProducerID() != 55 || b.ProducerEpoch() != 3 || b.NumRecords() != 1 {
			t.Fatal("control batch header")
		}
		want := ControlAbort
		if commit {
			want = ControlCommit
		}
		if ControlType(b) != want {
			t.Fatalf("type %d", ControlType(b))
		}
		var rb kmsg.RecordBatch
		if err := rb.ReadFrom(b); err != nil {
			t.Fatal(err)
		}
		var r kmsg.Record
		if err := r.ReadFrom(rb.Records); err != nil {
			t.Fatal(err)
		}
		if len(r.Key) != 4 || len(r.Value) != 6 || binary.BigEndian.Uint32(r.Value[2:]) != 7 {
			t.Fatalf("control record %+v", r)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	id := "c"
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 9
	f.Add(frame(md, 1, &id))
	pr := kmsg.NewPtrProduceRequest()
	pr.Version = 9
	pr.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{{Records: makeBatch(2, 1, 0, 0)}}}}
	f.Add(frame(pr, 2, nil))
	f.Add([]byte{0, 18, 0, 3, 0, 0, 0, 1, 0xff, 0xff, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseRequest(b)
	})
}

func FuzzValidateProduce(f *testing.F) {
	f.Add(makeBatch(1, -1, -1, 0))
	f.Add(makeBatch(4, 9, 0, 0))
	f.Add(AppendControlBatch(nil, 1, 1, true, 0, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		batch, code := ValidateProduce(b, ValidateOptions{MaxMessageBytes: 1 << 20, TimestampBeforeMaxMs: -1, TimestampAfterMaxMs: -1})
		if code == CodeNone && (!batch.CRCValid() || len(batch) != len(b)) {
			t.Fatal("accepted an invalid batch")
		}
		_ = ControlType(Batch(b[:min(len(b), len(batch))]))
	})
}
