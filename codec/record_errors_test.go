package codec

import (
	"testing"
)

func recordErrorIndexes(v Validated) []int32 {
	var idx []int32
	for _, e := range v.RecordErrors {
		idx = append(idx, e.Index)
	}
	return idx
}

func sameIndexes(got, want []int32) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// TestEveryInvalidRecordIsListed guards Apache's LogValidator behaviour: every invalid record of a
// batch gets its own RecordError (index + message), in compressed and uncompressed batches, not
// only the first one; a batch with a bad timestamp among them answers INVALID_TIMESTAMP, else
// INVALID_RECORD.
func TestEveryInvalidRecordIsListed(t *testing.T) {
	keylessAt := func(bad ...int) func(int) []byte {
		return func(i int) []byte {
			for _, b := range bad {
				if i == b {
					return nil
				}
			}
			return keyed(i)
		}
	}
	compacted := lax
	compacted.Compacted = true
	for _, c := range allCodecs {
		name := CompressionName(c)
		keyless := recordsOf(8, keylessAt(1, 3, 6), inOrder)
		v := ValidateProduceBatch(wrapBatch(libCompress(t, c, keyless), 8, int16(c), 0), compacted)
		if v.Code != CodeInvalidRecord || !sameIndexes(recordErrorIndexes(v), []int32{1, 3, 6}) || v.RecordIndex != 1 || v.Message == "" {
			t.Fatalf("%s keyless 1 3 6 on a compacted topic: code %d errors %+v first %d message %q", name, v.Code, v.RecordErrors, v.RecordIndex, v.Message)
		}
		for _, e := range v.RecordErrors {
			if e.Message != "Compacted topic cannot accept message without key" {
				t.Fatalf("%s: record %d message %q", name, e.Index, e.Message)
			}
		}
		// Timestamps 1000..1007 against now 1000 + 4: records 5, 6, 7 are too new; 3 is keyless.
		// One error per record, and the batch answers INVALID_TIMESTAMP.
		mixed := compacted
		mixed.NowMs, mixed.TimestampAfterMaxMs = 1000, 4
		v = ValidateProduceBatch(wrapBatch(libCompress(t, c, recordsOf(8, keylessAt(3, 6), inOrder)), 8, int16(c), 0), mixed)
		if v.Code != CodeInvalidTimestamp || !sameIndexes(recordErrorIndexes(v), []int32{3, 5, 6, 7}) {
			t.Fatalf("%s keyless 3 6 and late 5 6 7: code %d errors %+v", name, v.Code, v.RecordErrors)
		}
		// A framing error after invalid records: the batch is bad as a whole, with no record list.
		short := wrapBatch(libCompress(t, c, keyless), 9, int16(c), 0)
		if v = ValidateProduceBatch(short, compacted); v.Code == CodeNone || len(v.RecordErrors) != 0 || v.RecordIndex != -1 {
			t.Fatalf("%s keyless records then a short stream: code %d errors %+v", name, v.Code, v.RecordErrors)
		}
	}
	// Uncompressed offset deltas 0 1 2 4 5 7: records 3, 4 and 5 are off.
	skip := recordsOf(6, keyed, func(i int) int64 { return int64(i + i/3) })
	if v := ValidateProduceBatch(wrapBatch(skip, 6, CompressionNone, 0), lax); v.Code != CodeInvalidRecord ||
		!sameIndexes(recordErrorIndexes(v), []int32{3, 4, 5}) {
		t.Fatalf("uncompressed deltas 0 1 2 4 5 7: code %d errors %+v", v.Code, v.RecordErrors)
	}
}

// TestRecordErrorsBounded: a batch of more invalid records than MaxRecordErrors lists that many
// and counts the rest, so one request cannot make the broker build millions of entries.
func TestRecordErrorsBounded(t *testing.T) {
	n := MaxRecordErrors + 7
	compacted := lax
	compacted.Compacted = true
	recs := recordsOf(n, func(int) []byte { return nil }, inOrder)
	v := ValidateProduceBatch(wrapBatch(libCompress(t, CompressionZstd, recs), n, CompressionZstd, 0), compacted)
	if v.Code != CodeInvalidRecord || len(v.RecordErrors) != MaxRecordErrors || v.RecordErrorsDropped != 7 {
		t.Fatalf("code %d, %d errors listed, %d dropped", v.Code, len(v.RecordErrors), v.RecordErrorsDropped)
	}
	if last := v.RecordErrors[MaxRecordErrors-1].Index; last != MaxRecordErrors-1 {
		t.Fatalf("last listed record %d", last)
	}
}
