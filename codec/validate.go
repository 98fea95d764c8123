package codec

import "encoding/binary"

// ValidateOptions are the topic settings a produced batch is checked against.
type ValidateOptions struct {
	MaxMessageBytes int32 // max.message.bytes: whole-batch limit (MESSAGE_TOO_LARGE)
	// Timestamp bounds for CreateTime topics (message.timestamp.before/after.max.ms, KIP-937);
	// a negative value disables the check.
	TimestampBeforeMaxMs int64
	TimestampAfterMaxMs  int64
	NowMs                int64
}

// ValidateProduce checks the records of one partition in a Produce request (v3+) the way Apache's
// ProduceRequest/LogValidator do, and returns the single batch they must hold.
//
//   - exactly one v2 batch (magic 2), else INVALID_RECORD (87)
//   - length field consistent with the bytes, else CORRUPT_MESSAGE (2)
//   - whole batch within max.message.bytes, else MESSAGE_TOO_LARGE (10)
//   - CRC32C over bytes 21.., else CORRUPT_MESSAGE
//   - no client-written control batches, a known compression codec, at least one record,
//     lastOffsetDelta = count-1, transactional batches carry a producer id, else INVALID_RECORD
//   - for uncompressed batches every record is walked: lengths in bounds, offset deltas 0..n-1,
//     nothing left over, else CORRUPT_MESSAGE / INVALID_RECORD
//   - CreateTime timestamps within the configured skew, else INVALID_TIMESTAMP (32)
func ValidateProduce(records []byte, o ValidateOptions) (Batch, int16) {
	if len(records) < BatchHeaderSize {
		return nil, CodeCorruptMessage
	}
	if records[16] != 2 {
		return nil, CodeInvalidRecord
	}
	b, ok, bad := FrameBatch(records)
	if !ok || bad {
		return nil, CodeCorruptMessage
	}
	if o.MaxMessageBytes > 0 && len(b) > int(o.MaxMessageBytes) {
		return nil, CodeMessageTooLarge
	}
	if len(b) != len(records) {
		// A second batch (or trailing garbage) after the first.
		return nil, CodeInvalidRecord
	}
	if !b.CRCValid() {
		return nil, CodeCorruptMessage
	}
	if b.IsControl() {
		return nil, CodeInvalidRecord
	}
	if b.Compression() > 4 {
		return nil, CodeCorruptMessage
	}
	n := b.NumRecords()
	if n <= 0 || b.LastOffsetDelta() != n-1 {
		return nil, CodeInvalidRecord
	}
	if b.IsTransactional() && b.ProducerID() < 0 {
		return nil, CodeInvalidRecord
	}
	if b.Compression() == 0 {
		if code := walkRecords(b.Records(), n); code != CodeNone {
			return nil, code
		}
	}
	if !b.IsLogAppendTime() && o.NowMs > 0 {
		if o.TimestampBeforeMaxMs >= 0 && b.BaseTimestamp() < o.NowMs-o.TimestampBeforeMaxMs {
			return nil, CodeInvalidTimestamp
		}
		if o.TimestampAfterMaxMs >= 0 && b.MaxTimestamp() > o.NowMs+o.TimestampAfterMaxMs {
			return nil, CodeInvalidTimestamp
		}
	}
	return b, CodeNone
}

// walkRecords checks the framing of n uncompressed v2 records.
func walkRecords(p []byte, n int32) int16 {
	for i := int32(0); i < n; i++ {
		l, k := binary.Varint(p)
		if k <= 0 || l < 0 || int64(len(p)-k) < l {
			return CodeCorruptMessage
		}
		rec := p[k : k+int(l)]
		p = p[k+int(l):]
		if len(rec) < 1 {
			return CodeCorruptMessage
		}
		rec = rec[1:]                          // attributes
		if _, k = binary.Varint(rec); k <= 0 { // timestamp delta
			return CodeCorruptMessage
		}
		rec = rec[k:]
		od, k := binary.Varint(rec)
		if k <= 0 {
			return CodeCorruptMessage
		}
		if od != int64(i) {
			return CodeInvalidRecord
		}
		rec = rec[k:]
		var ok bool
		if rec, ok = skipVarBytes(rec); !ok { // key
			return CodeCorruptMessage
		}
		if rec, ok = skipVarBytes(rec); !ok { // value
			return CodeCorruptMessage
		}
		hc, k := binary.Varint(rec)
		if k <= 0 || hc < 0 {
			return CodeCorruptMessage
		}
		rec = rec[k:]
		for h := int64(0); h < hc; h++ {
			if rec, ok = skipVarBytes(rec); !ok {
				return CodeCorruptMessage
			}
			if rec, ok = skipVarBytes(rec); !ok {
				return CodeCorruptMessage
			}
		}
		if len(rec) != 0 {
			return CodeCorruptMessage
		}
	}
	if len(p) != 0 {
		return CodeCorruptMessage
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
