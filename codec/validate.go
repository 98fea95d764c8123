package codec

import (
	"encoding/binary"
	"math"
	"strconv"

	"github.com/valyala/bytebufferpool"
)

// ValidateOptions are the topic settings a produced batch is checked against.
type ValidateOptions struct {
	MaxMessageBytes int32 // max.message.bytes: whole-batch limit (MESSAGE_TOO_LARGE)
	// Timestamp bounds for CreateTime topics (message.timestamp.before/after.max.ms, KIP-937);
	// a negative value disables the check.
	TimestampBeforeMaxMs int64
	TimestampAfterMaxMs  int64
	NowMs                int64
	// LogAppendTime: the topic's message.timestamp.type is LogAppendTime, so producer
	// timestamps are replaced on append and not checked (Apache validates them for CreateTime
	// only).
	LogAppendTime bool
	// Compacted: cleanup.policy includes compact, so every record needs a key (Apache's
	// LogValidator: "Compacted topic cannot accept message without key", INVALID_RECORD).
	Compacted bool
	// MaxUncompressedBytes caps what a compressed batch may inflate to (0 =
	// DefaultMaxUncompressedBytes). Beyond it the batch is refused with MESSAGE_TOO_LARGE and
	// Validated.DecompressLimited is set, so the caller can count it.
	MaxUncompressedBytes int
	// Recompress: store the batch with TargetCompression (at TargetLevel, Apache's level
	// semantics) whatever codec the producer used (compression.type other than producer).
	Recompress        bool
	TargetCompression int
	TargetLevel       int
}

// RecordError is one invalid record of a produced batch: its index in the batch and why.
type RecordError struct {
	Index   int32
	Message string
}

// MaxRecordErrors bounds RecordErrors. Apache's LogValidator checks every record, collects one
// error per invalid record and answers them all; kaas does the same up to this many. Without a
// bound, a 64 MiB decompressed batch of minimal keyless records on a compacted topic would build
// millions of entries for one response. A Java producer fails every record of a rejected batch
// anyway (the listed ones with their own message), so the bound only shortens the detail.
const MaxRecordErrors = 10000

// DefaultMaxUncompressedBytes bounds the decompressed records of one produced batch. Apache has
// no such bound (it streams); kaas decompresses a batch whole to validate it, so the bound is
// what one produce partition may cost in memory. 64 MiB is 64 times the default
// max.message.bytes: far above what real compressed records reach (zstd on JSON gets ~10x).
const DefaultMaxUncompressedBytes = 64 << 20

// Validated is the outcome of ValidateProduceBatch.
type Validated struct {
	// Batch is what to append: the producer's bytes (offsets and maxTimestamp still rewritten
	// in place), or a rebuilt batch when Recompressed.
	Batch Batch
	Code  int16
	// RecordIndex is the first record a record-level error is about, -1 for a batch-level
	// error; Message is the partition's error message.
	RecordIndex int32
	Message     string
	// RecordErrors lists every invalid record of the batch (Produce v8 RecordErrors), in batch
	// order, at most MaxRecordErrors of them; RecordErrorsDropped counts those left off.
	RecordErrors        []RecordError
	RecordErrorsDropped int
	// DecompressLimited: refused because it inflated past MaxUncompressedBytes.
	DecompressLimited bool
	// Recompressed: Batch is a new batch (another codec, or Renumbered).
	Recompressed bool
	// Renumbered: a compressed batch's inner offset deltas were not 0..n-1 and were rewritten.
	Renumbered bool
	// UncompressedBytes is the size of the records section once decompressed.
	UncompressedBytes int
	buf               *bytebufferpool.ByteBuffer
}

// Release returns a rebuilt batch's buffer to the pool; Batch must not be used afterwards.
// Safe on any Validated, and more than once.
func (v *Validated) Release() {
	if v.buf != nil {
		BatchPool.Put(v.buf)
		v.buf = nil
		v.Batch = nil
	}
}

// ValidateProduce is ValidateProduceBatch for callers that only need the batch and code. A
// rebuilt batch's buffer is then left to the garbage collector.
func ValidateProduce(records []byte, o ValidateOptions) (Batch, int16) {
	v := ValidateProduceBatch(records, o)
	return v.Batch, v.Code
}

// ValidateProduceBatch checks the records of one partition in a Produce request (v3+) the way
// Apache's ProduceRequest and LogValidator do, and returns the single batch they must hold.
//
//   - exactly one v2 batch (magic 2), else INVALID_RECORD (87)
//   - length field consistent with the bytes, else CORRUPT_MESSAGE (2)
//   - whole batch within max.message.bytes, else MESSAGE_TOO_LARGE (10)
//   - CRC32C over bytes 21.., else CORRUPT_MESSAGE
//   - no client-written control batches, a known compression codec, at least one record,
//     lastOffsetDelta = count-1, transactional batches carry a producer id, else INVALID_RECORD
//   - every record is walked, compressed batches after decompression (bounded by
//     MaxUncompressedBytes, MESSAGE_TOO_LARGE beyond): exactly count records with lengths in
//     bounds and nothing left over, a key on compacted topics, CreateTime timestamps within the
//     configured skew (INVALID_TIMESTAMP, 32)
//   - offset deltas 0..n-1: an uncompressed batch that breaks this is INVALID_RECORD (kaas is
//     stricter than Apache here, which stores it as is and lets consumers compute wrong
//     offsets); a compressed one is renumbered and recompressed, as Apache does
//   - maxTimestamp is set to the largest record timestamp, as Apache's in-place assignment does
//   - with Recompress, the records are recompressed into a new batch (same producer id, epoch,
//     sequence, transactional bit, timestamps; new length and CRC), which must itself fit
//     max.message.bytes (MESSAGE_TOO_LARGE), as Apache checks after recompressing
//
// Malformed records answer CORRUPT_MESSAGE in an uncompressed batch, and INVALID_RECORD in a
// compressed one: there the CRC covered the compressed bytes and held, so the producer encoded
// garbage, and CORRUPT_MESSAGE is retriable (Apache's stream iterator raises
// InvalidRecordException for a short stream; a stream its codec cannot decode is a generic
// KafkaException there, UNKNOWN_SERVER_ERROR, which kaas answers as INVALID_RECORD too).
func ValidateProduceBatch(records []byte, o ValidateOptions) Validated {
	v := Validated{RecordIndex: -1}
	fail := func(code int16) Validated { v.Code = code; return v }
	if len(records) < BatchHeaderSize {
		return fail(CodeCorruptMessage)
	}
	if records[16] != 2 {
		return fail(CodeInvalidRecord)
	}
	b, ok, bad := FrameBatch(records)
	if !ok || bad {
		return fail(CodeCorruptMessage)
	}
	if o.MaxMessageBytes > 0 && len(b) > int(o.MaxMessageBytes) {
		return fail(CodeMessageTooLarge)
	}
	if len(b) != len(records) {
		// A second batch (or trailing garbage) after the first.
		return fail(CodeInvalidRecord)
	}
	if !b.CRCValid() {
		return fail(CodeCorruptMessage)
	}
	if b.IsControl() {
		return fail(CodeInvalidRecord)
	}
	if b.Compression() > CompressionZstd {
		return fail(CodeCorruptMessage)
	}
	n := b.NumRecords()
	if n <= 0 || b.LastOffsetDelta() != n-1 {
		return fail(CodeInvalidRecord)
	}
	if b.IsTransactional() && b.ProducerID() < 0 {
		return fail(CodeInvalidRecord)
	}
	w := recordWalk{
		n: n, base: b.BaseTimestamp(), compacted: o.Compacted,
		checkTs: !o.LogAppendTime && !b.IsLogAppendTime() && o.NowMs > 0,
		lo:      math.MinInt64, hi: math.MaxInt64,
	}
	if w.checkTs {
		if o.TimestampBeforeMaxMs >= 0 && o.TimestampBeforeMaxMs <= o.NowMs {
			w.lo = o.NowMs - o.TimestampBeforeMaxMs
		}
		if o.TimestampAfterMaxMs >= 0 && o.TimestampAfterMaxMs <= math.MaxInt64-o.NowMs {
			w.hi = o.NowMs + o.TimestampAfterMaxMs
		}
	}
	recs := b.Records()
	malformed := CodeCorruptMessage
	var scratch *bytebufferpool.ByteBuffer
	if c := b.Compression(); c != CompressionNone {
		malformed = CodeInvalidRecord
		w.renumber = true
		limit := o.MaxUncompressedBytes
		if limit <= 0 {
			limit = DefaultMaxUncompressedBytes
		}
		scratch = DecompressPool.Get()
		defer DecompressPool.Put(scratch)
		out, err := Decompress(scratch.B[:0], c, recs, limit)
		scratch.B = out
		if err == ErrDecompressLimit {
			v.DecompressLimited = true
			v.Message = "compressed records exceed the broker's decompression limit"
			return fail(CodeMessageTooLarge)
		}
		if err != nil {
			v.Message = "cannot decompress " + CompressionName(c) + " records: " + err.Error()
			return fail(CodeInvalidRecord)
		}
		recs = out
	}
	v.UncompressedBytes = len(recs)
	if code := w.walk(recs, malformed); code != CodeNone {
		v.Message = w.reason
		if len(w.errs) > 0 {
			v.RecordIndex, v.RecordErrors, v.RecordErrorsDropped = w.errs[0].Index, w.errs, w.dropped
		}
		return fail(code)
	}
	if !o.LogAppendTime && !b.IsLogAppendTime() && w.maxTs != b.MaxTimestamp() {
		binary.BigEndian.PutUint64(b[35:], uint64(w.maxTs))
		b.updateCRC()
	}
	v.Batch = b
	target, level := o.TargetCompression, o.TargetLevel
	if !o.Recompress {
		target, level = b.Compression(), 0 // 0: the codec's default level
	}
	if w.misnumbered {
		// Apache rewrites, rather than rejects, a compressed batch whose inner offsets are not
		// 0..n-1 (LogValidator: old clients got them wrong): the records are renumbered and
		// recompressed, in the topic's codec or else the producer's.
		fixed := DecompressPool.Get()
		defer DecompressPool.Put(fixed)
		fixed.B = renumberRecords(fixed.B[:0], recs, w.n)
		recs = fixed.B
		v.Renumbered = true
	} else if target == b.Compression() {
		return v
	}
	nb, code := rebuildBatch(b, recs, target, level)
	if code != CodeNone {
		return fail(code)
	}
	if o.MaxMessageBytes > 0 && len(nb.B) > int(o.MaxMessageBytes) {
		BatchPool.Put(nb)
		v.Batch = nil
		return fail(CodeMessageTooLarge)
	}
	v.Batch, v.buf, v.Recompressed = Batch(nb.B), nb, true
	return v
}

// renumberRecords appends recs (n records already walked, so well-formed) with offset delta i
// for record i and every other byte kept.
func renumberRecords(dst, recs []byte, n int32) []byte {
	var body []byte
	for i := int32(0); i < n; i++ {
		l, k := binary.Varint(recs)
		rec := recs[k : k+int(l)]
		recs = recs[k+int(l):]
		_, tk := binary.Varint(rec[1:]) // timestamp delta
		head := rec[:1+tk]
		_, ok := binary.Varint(rec[1+tk:]) // old offset delta
		rest := rec[1+tk+ok:]
		body = append(body[:0], head...)
		body = binary.AppendVarint(body, int64(i))
		body = append(body, rest...)
		dst = binary.AppendVarint(dst, int64(len(body)))
		dst = append(dst, body...)
	}
	return dst
}

// rebuildBatch writes b's header and recs (uncompressed records) compressed with codec c into a
// pooled buffer, with the codec bits, the length and the CRC set for the new bytes. Every other
// header field (producer id, epoch, base sequence, transactional bit, timestamps, counts) is
// kept: the producer's idempotence and transaction state refer to them.
func rebuildBatch(b Batch, recs []byte, c, level int) (*bytebufferpool.ByteBuffer, int16) {
	nb := BatchPool.Get()
	out := append(nb.B[:0], b[:BatchHeaderSize]...)
	out, err := Compress(out, c, level, recs)
	if err != nil {
		BatchPool.Put(nb)
		return nil, CodeUnknownServerError
	}
	nb.B = out
	nbatch := Batch(out)
	attrs := uint16(b.Attributes())&^AttrCompressionMask | uint16(c)
	binary.BigEndian.PutUint16(nbatch[21:], attrs)
	binary.BigEndian.PutUint32(nbatch[8:], uint32(len(out)-LogOverhead))
	nbatch.updateCRC()
	return nb, CodeNone
}

// recordWalk checks n v2 records (uncompressed bytes) in one pass.
type recordWalk struct {
	n         int32
	base      int64 // baseTimestamp
	compacted bool
	checkTs   bool
	lo, hi    int64 // accepted CreateTime timestamp range when checkTs
	// renumber: accept offset deltas other than 0..n-1 (set misnumbered) instead of failing.
	renumber    bool
	misnumbered bool  // out
	maxTs       int64 // out: the largest record timestamp
	// out: the record-level errors (one per invalid record, at most MaxRecordErrors), how many
	// more were left off, whether one is a timestamp error, and the partition's error message.
	errs    []RecordError
	dropped int
	badTs   bool
	reason  string
}

// recordErr notes record i as invalid and moves on to the next record: Apache's LogValidator
// checks every record of the batch and answers one RecordError per invalid one.
func (w *recordWalk) recordErr(i int32, msg string) {
	if len(w.errs) >= MaxRecordErrors {
		w.dropped++
		return
	}
	w.errs = append(w.errs, RecordError{Index: i, Message: msg})
}

// malformed ends the walk on a framing error: the records collected so far are not reported,
// the batch as a whole is bad.
func (w *recordWalk) malformed(code int16) int16 {
	w.errs, w.dropped = nil, 0
	return code
}

// walk returns CodeNone or the error: malformed for framing problems (lengths, varints, record
// count), which end the walk at once (Apache's record iterator throws there, with no record
// detail). Record-level problems are collected over the whole batch: offset deltas and missing
// keys are INVALID_RECORD, timestamps INVALID_TIMESTAMP, and as in Apache a batch with any
// timestamp error answers INVALID_TIMESTAMP, else INVALID_RECORD.
func (w *recordWalk) walk(p []byte, malformed int16) int16 {
	w.errs, w.dropped, w.badTs = nil, 0, false
	w.maxTs = math.MinInt64
	for i := int32(0); i < w.n; i++ {
		bad := false // this record already has its error: one per record, the first found
		l, k := binary.Varint(p)
		if k <= 0 || l < 0 || int64(len(p)-k) < l {
			w.reason = "record size does not match the bytes"
			return w.malformed(malformed)
		}
		rec := p[k : k+int(l)]
		p = p[k+int(l):]
		if len(rec) < 1 {
			return w.malformed(malformed)
		}
		rec = rec[1:] // attributes (unused in v2)
		tsd, k := binary.Varint(rec)
		if k <= 0 {
			return w.malformed(malformed)
		}
		ts := w.base + tsd
		rec = rec[k:]
		od, k := binary.Varint(rec)
		if k <= 0 {
			return w.malformed(malformed)
		}
		if od != int64(i) && w.renumber {
			w.misnumbered = true
		} else if od != int64(i) {
			w.recordErr(i, "offset delta "+strconv.FormatInt(od, 10)+" where "+strconv.Itoa(int(i))+" was expected")
			bad = true
		}
		rec = rec[k:]
		kl, k := binary.Varint(rec)
		if k <= 0 || kl < -1 || int64(len(rec)-k) < kl {
			return w.malformed(malformed)
		}
		if kl < 0 && w.compacted && !bad {
			w.recordErr(i, "Compacted topic cannot accept message without key")
			bad = true
		}
		rec = rec[k+max(int(kl), 0):]
		var ok bool
		if rec, ok = skipVarBytes(rec); !ok { // value
			return w.malformed(malformed)
		}
		hc, k := binary.Varint(rec)
		if k <= 0 || hc < 0 {
			return w.malformed(malformed)
		}
		rec = rec[k:]
		for h := int64(0); h < hc; h++ {
			if rec, ok = skipVarBytes(rec); !ok {
				return w.malformed(malformed)
			}
			if rec, ok = skipVarBytes(rec); !ok {
				return w.malformed(malformed)
			}
		}
		if len(rec) != 0 {
			return w.malformed(malformed)
		}
		if w.checkTs && (ts < w.lo || ts > w.hi) && !bad {
			w.recordErr(i, "timestamp "+strconv.FormatInt(ts, 10)+" of the record is out of range")
			w.badTs = true
		}
		w.maxTs = max(w.maxTs, ts)
	}
	if len(p) != 0 {
		w.reason = "bytes left after the declared record count"
		return w.malformed(malformed)
	}
	if n := len(w.errs) + w.dropped; n > 0 {
		if w.badTs {
			w.reason = strconv.Itoa(n) + " record(s) rejected: invalid timestamp"
			return CodeInvalidTimestamp
		}
		w.reason = strconv.Itoa(n) + " record(s) rejected, the first: " + w.errs[0].Message
		return CodeInvalidRecord
	}
	return CodeNone
}

// skipVarBytes skips a varint-length byte field (length -1 = null).
func skipVarBytes(p []byte) ([]byte, bool) {
	l, k := binary.Varint(p)
	if k <= 0 || l < -1 || int64(len(p)-k) < l {
		return nil, false
	}
	if l < 0 {
		return p[k:], true
	}
	return p[k+int(l):], true
}
