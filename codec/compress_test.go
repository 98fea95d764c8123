package codec

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// recordsOf encodes n v2 records; key(i) nil means a null key, delta(i) is record i's offset
// delta.
func recordsOf(n int, key func(int) []byte, delta func(int) int64) []byte {
	var recs []byte
	for i := 0; i < n; i++ {
		var body []byte
		body = append(body, 0)
		body = binary.AppendVarint(body, int64(i)) // timestamp delta
		body = binary.AppendVarint(body, delta(i))
		if k := key(i); k == nil {
			body = binary.AppendVarint(body, -1)
		} else {
			body = binary.AppendVarint(body, int64(len(k)))
			body = append(body, k...)
		}
		v := fmt.Sprintf("value-%d-%s", i, bytes.Repeat([]byte("abc"), 20))
		body = binary.AppendVarint(body, int64(len(v)))
		body = append(body, v...)
		body = binary.AppendVarint(body, 1) // one header
		body = binary.AppendVarint(body, 1)
		body = append(body, 'h')
		body = binary.AppendVarint(body, 2)
		body = append(body, "hv"...)
		recs = binary.AppendVarint(recs, int64(len(body)))
		recs = append(recs, body...)
	}
	return recs
}

func keyed(i int) []byte       { return []byte(fmt.Sprintf("k%d", i)) }
func inOrder(i int) int64      { return int64(i) }
func goodRecords(n int) []byte { return recordsOf(n, keyed, inOrder) }

// wrapBatch builds a producer's v2 batch of n records around payload (already compressed with
// codec c).
func wrapBatch(payload []byte, n int, c int16, attrs int16) []byte {
	rb := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1, Magic: 2, Attributes: attrs | c, LastOffsetDelta: int32(n - 1),
		FirstTimestamp: 1000, MaxTimestamp: 1000 + int64(n-1), ProducerID: 77, ProducerEpoch: 3,
		FirstSequence: 10, NumRecords: int32(n), Records: payload,
	}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	Batch(b).updateCRC()
	return b
}

// libCompress compresses with the libraries' own writers (not Compress), as a producer would.
func libCompress(t testing.TB, c int, raw []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	switch c {
	case CompressionGzip:
		w := gzip.NewWriter(&buf)
		w.Write(raw)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	case CompressionSnappy: // xerial framing, one chunk
		buf.Write(xerialMagic)
		buf.Write([]byte{0, 0, 0, 1, 0, 0, 0, 1})
		enc := snappy.Encode(nil, raw)
		binary.Write(&buf, binary.BigEndian, uint32(len(enc)))
		buf.Write(enc)
	case CompressionLZ4:
		w := lz4.NewWriter(&buf)
		w.Write(raw)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	case CompressionZstd:
		e, _ := zstd.NewWriter(nil)
		return e.EncodeAll(raw, nil)
	default:
		return raw
	}
	return buf.Bytes()
}

var allCodecs = []int{CompressionNone, CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd}

var lax = ValidateOptions{MaxMessageBytes: 1 << 20, TimestampBeforeMaxMs: -1, TimestampAfterMaxMs: -1}

func TestValidateCompressedBatchEachCodec(t *testing.T) {
	raw := goodRecords(50)
	for _, c := range allCodecs {
		b := wrapBatch(libCompress(t, c, raw), 50, int16(c), 0)
		v := ValidateProduceBatch(b, lax)
		if v.Code != CodeNone || v.UncompressedBytes != len(raw) || v.Recompressed || !bytes.Equal(v.Batch, b) {
			t.Fatalf("%s: code %d, %d bytes (want %d), recompressed %v", CompressionName(c), v.Code, v.UncompressedBytes, len(raw), v.Recompressed)
		}
	}
	// librdkafka's raw snappy block, without xerial framing, as Apache accepts it.
	b := wrapBatch(snappy.Encode(nil, raw), 50, CompressionSnappy, 0)
	if v := ValidateProduceBatch(b, lax); v.Code != CodeNone || v.UncompressedBytes != len(raw) {
		t.Fatalf("raw snappy: code %d", v.Code)
	}
}

// TestUncompressedBadOffsetDeltaIsInvalidRecord: kaas keeps its strict check of uncompressed
// batches (Apache stores them as they are and consumers compute wrong offsets).
func TestUncompressedBadOffsetDeltaIsInvalidRecord(t *testing.T) {
	skip := recordsOf(5, keyed, func(i int) int64 { return int64(i + i/3) })
	if v := ValidateProduceBatch(wrapBatch(skip, 5, CompressionNone, 0), lax); v.Code != CodeInvalidRecord || v.RecordIndex != 3 {
		t.Fatalf("code %d index %d", v.Code, v.RecordIndex)
	}
}

func TestValidateCompressedBatchErrors(t *testing.T) {
	f := func(name string, b []byte, o ValidateOptions, want int16, wantIndex int32) {
		t.Helper()
		v := ValidateProduceBatch(b, o)
		if v.Code != want || v.RecordIndex != wantIndex {
			t.Fatalf("%s: code %d index %d, want %d index %d (%s)", name, v.Code, v.RecordIndex, want, wantIndex, v.Message)
		}
	}
	for _, c := range []int{CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd} {
		name := CompressionName(c)
		skip := recordsOf(5, keyed, func(i int) int64 { return int64(i + i/3) }) // 0 1 2 4 5
		renumberedTo := func(o ValidateOptions, want int) {
			t.Helper()
			v := ValidateProduceBatch(wrapBatch(libCompress(t, c, skip), 5, int16(c), AttrTransactional), o)
			if v.Code != CodeNone || !v.Renumbered || !v.Recompressed || v.Batch.Compression() != want || !v.Batch.IsTransactional() {
				t.Fatalf("%s offset deltas 0 1 2 4 5: code %d renumbered %v codec %d", name, v.Code, v.Renumbered, v.Batch.Compression())
			}
			// Rewritten to 0..4: the rebuilt batch validates without renumbering, also when
			// uncompressed (where kaas checks deltas strictly).
			if again := ValidateProduceBatch(v.Batch, lax); again.Code != CodeNone || again.Renumbered {
				t.Fatalf("%s renumbered batch: code %d renumbered %v", name, again.Code, again.Renumbered)
			}
			v.Release()
		}
		renumberedTo(lax, c)
		toNone := lax
		toNone.Recompress, toNone.TargetCompression = true, CompressionNone
		renumberedTo(toNone, CompressionNone)
		// The header claims 6 records, the stream has 5: Apache's "premature EOF".
		f(name+" short stream", wrapBatch(libCompress(t, c, goodRecords(5)), 6, int16(c), 0), lax, CodeInvalidRecord, -1)
		// The header claims 4 records, the stream has 5.
		f(name+" records left over", wrapBatch(libCompress(t, c, goodRecords(5)), 4, int16(c), 0), lax, CodeInvalidRecord, -1)
		garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 40)
		f(name+" undecodable", wrapBatch(garbage, 5, int16(c), 0), lax, CodeInvalidRecord, -1)
		keyless := recordsOf(5, func(i int) []byte {
			if i == 2 {
				return nil
			}
			return keyed(i)
		}, inOrder)
		kb := wrapBatch(libCompress(t, c, keyless), 5, int16(c), 0)
		f(name+" keyless on delete topic", kb, lax, CodeNone, -1)
		compacted := lax
		compacted.Compacted = true
		f(name+" keyless on compacted topic", kb, compacted, CodeInvalidRecord, 2)
		// Header timestamps in range (1000..1004), record 4 at 1004 past now+after.
		ts := lax
		ts.NowMs, ts.TimestampAfterMaxMs = 1000, 3
		f(name+" record timestamp", wrapBatch(libCompress(t, c, goodRecords(5)), 5, int16(c), 0), ts, CodeInvalidTimestamp, 4)
		ts.LogAppendTime = true
		f(name+" timestamps unchecked on LogAppendTime topics", wrapBatch(libCompress(t, c, goodRecords(5)), 5, int16(c), 0), ts, CodeNone, -1)
		huge := wrapBatch(libCompress(t, c, goodRecords(5)), 5, int16(c), 0)
		f(name+" max.message.bytes on the compressed size", huge, ValidateOptions{MaxMessageBytes: int32(len(huge) - 1)}, CodeMessageTooLarge, -1)
	}
	// Unknown codec 5.
	f("codec 5", wrapBatch(goodRecords(2), 2, 5, 0), lax, CodeCorruptMessage, -1)
}

// TestDecompressionBombRefused guards the decompression limit: a batch of a few KiB that
// inflates to 32 MiB is refused with MESSAGE_TOO_LARGE and flagged for the caller's counter,
// after at most limit+1 bytes of output.
func TestDecompressionBombRefused(t *testing.T) {
	zeros := make([]byte, 32<<20)
	for _, c := range []int{CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd} {
		payload := libCompress(t, c, zeros)
		b := wrapBatch(payload, 1, int16(c), 0)
		o := lax
		o.MaxUncompressedBytes = 1 << 20
		o.MaxMessageBytes = 8 << 20
		v := ValidateProduceBatch(b, o)
		if v.Code != CodeMessageTooLarge || !v.DecompressLimited {
			t.Fatalf("%s (%d compressed bytes): code %d limited %v", CompressionName(c), len(payload), v.Code, v.DecompressLimited)
		}
		out, err := Decompress(nil, c, payload, 1<<20)
		if err != ErrDecompressLimit || len(out) > 1<<20 {
			t.Fatalf("%s: err %v, %d bytes out", CompressionName(c), err, len(out))
		}
	}
}

func TestRecompressEveryPair(t *testing.T) {
	raw := goodRecords(40)
	levels := map[int][]int{
		CompressionGzip: {GzipLevelDefault, 1, 9},
		CompressionLZ4:  {1, LZ4LevelDefault, 17},
		CompressionZstd: {-5, 1, ZstdLevelDefault, 22},
	}
	for _, from := range allCodecs {
		for _, to := range allCodecs {
			for _, lvl := range append([]int{0}, levels[to]...) {
				src := wrapBatch(libCompress(t, from, raw), 40, int16(from), AttrTransactional)
				o := lax
				o.Recompress, o.TargetCompression, o.TargetLevel = true, to, lvl
				v := ValidateProduceBatch(src, o)
				name := fmt.Sprintf("%s→%s level %d", CompressionName(from), CompressionName(to), lvl)
				if v.Code != CodeNone || v.Recompressed != (from != to) {
					t.Fatalf("%s: code %d recompressed %v", name, v.Code, v.Recompressed)
				}
				nb := v.Batch
				if !nb.CRCValid() || nb.Compression() != to || !nb.IsTransactional() ||
					nb.ProducerID() != 77 || nb.ProducerEpoch() != 3 || nb.BaseSequence() != 10 ||
					nb.NumRecords() != 40 || nb.LastOffsetDelta() != 39 || int(nb.BatchLength())+LogOverhead != len(nb) {
					t.Fatalf("%s: header not kept", name)
				}
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(nb); err != nil {
					t.Fatalf("%s: kmsg cannot read it: %v", name, err)
				}
				got, err := Decompress(nil, to, nb.Records(), 1<<20)
				if err != nil || !bytes.Equal(got, raw) {
					t.Fatalf("%s: records differ after the round trip (%v)", name, err)
				}
				// The rebuilt batch validates on its own, as a replica or a re-produce would.
				if again := ValidateProduceBatch(nb, lax); again.Code != CodeNone {
					t.Fatalf("%s: rebuilt batch invalid: %d", name, again.Code)
				}
				v.Release()
				v.Release()
			}
		}
	}
}

// TestRecompressedBatchMustFitMaxMessageBytes: Apache checks max.message.bytes again after
// recompressing; a batch that grows past it (zstd → uncompressed) is MESSAGE_TOO_LARGE.
func TestRecompressedBatchMustFitMaxMessageBytes(t *testing.T) {
	raw := goodRecords(200)
	src := wrapBatch(libCompress(t, CompressionZstd, raw), 200, CompressionZstd, 0)
	o := lax
	o.MaxMessageBytes = int32(len(src) + 100)
	o.Recompress, o.TargetCompression = true, CompressionNone
	if v := ValidateProduceBatch(src, o); v.Code != CodeMessageTooLarge || v.Batch != nil {
		t.Fatalf("code %d", v.Code)
	}
}

// TestMaxTimestampFromRecords: as Apache's in-place assignment, maxTimestamp becomes the largest
// record timestamp (the CRC follows).
func TestMaxTimestampFromRecords(t *testing.T) {
	b := wrapBatch(libCompress(t, CompressionLZ4, goodRecords(5)), 5, CompressionLZ4, 0)
	binary.BigEndian.PutUint64(b[35:], 5000)
	Batch(b).updateCRC()
	v := ValidateProduceBatch(b, lax)
	if v.Code != CodeNone || v.Batch.MaxTimestamp() != 1004 || !v.Batch.CRCValid() {
		t.Fatalf("code %d max %d", v.Code, v.Batch.MaxTimestamp())
	}
}

func TestSnappyXerialChunks(t *testing.T) {
	raw := bytes.Repeat(goodRecords(30), 40) // > 32 KiB: several chunks
	enc, err := Compress(nil, CompressionSnappy, 0, raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(enc, xerialMagic) {
		t.Fatal("xerial header missing")
	}
	got, err := Decompress(nil, CompressionSnappy, enc, len(raw))
	if err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := Decompress(nil, CompressionSnappy, enc[:len(enc)-3], len(raw)); err == nil {
		t.Fatal("a truncated chunk must fail")
	}
	if _, err := Decompress(nil, CompressionSnappy, enc, len(raw)-1); err != ErrDecompressLimit {
		t.Fatalf("limit: %v", err)
	}
}

func FuzzDecompress(f *testing.F) {
	raw := goodRecords(10)
	for _, c := range allCodecs {
		f.Add(byte(c), libCompress(f, c, raw))
	}
	f.Add(byte(CompressionSnappy), snappy.Encode(nil, raw))
	f.Add(byte(CompressionZstd), libCompress(f, CompressionZstd, make([]byte, 1<<20)))
	const limit = 64 << 10
	f.Fuzz(func(t *testing.T, c byte, data []byte) {
		out, err := Decompress(nil, int(c%8), data, limit)
		if len(out) > limit {
			t.Fatalf("%d bytes out past the %d limit (err %v)", len(out), limit, err)
		}
		if err == nil && c%8 <= CompressionZstd {
			// Whatever decoded must survive our own round trip.
			enc, err := Compress(nil, int(c%8), 0, out)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Decompress(nil, int(c%8), enc, limit)
			if err != nil || !bytes.Equal(back, out) {
				t.Fatalf("round trip: %v", err)
			}
		}
		// And the batch path never accepts what it cannot read.
		b := wrapBatch(data, 3, int16(c%8), 0)
		if v := ValidateProduceBatch(b, ValidateOptions{MaxUncompressedBytes: limit}); v.Code == CodeNone && v.UncompressedBytes > limit {
			t.Fatal("accepted past the limit")
		}
	})
}
