package storage

import "testing"

// BenchmarkWALRecord measures the CPU side of a write-ahead log record: building and sealing one
// (the flusher's per-batch work besides the write and the sync) and parsing it back (replay).
func BenchmarkWALRecord(b *testing.B) {
	payload := make([]byte, 1000)
	for i := range payload {
		payload[i] = byte(i)
	}
	var id [16]byte
	id[3] = 7
	buf := appendWALRecord(nil, id, 3, 42, payload)
	b.Run("build+seal", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			buf = appendWALRecord(buf[:0], id, 3, 42, payload)
			sealWALRecord(buf, 5, uint64(i))
		}
	})
	b.Run("parse", func(b *testing.B) {
		sealWALRecord(buf, 5, 9)
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, ok := parseWALRecord(buf, 0, 5); !ok {
				b.Fatal("record does not parse")
			}
		}
	})
}
