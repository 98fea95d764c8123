package storage

import (
	"testing"

	"github.com/kaas-go/kaas/codec"
)

// BenchmarkAppendMarkerSync measures a marker append plus its durable ack (one fsync each, as
// the coordinator waits for every marker before completing the transaction). "withTxn" also
// appends one transactional batch first, so the marker closes a real transaction (an abort every
// other iteration, which adds an aborted-index entry).
func BenchmarkAppendMarkerSync(b *testing.B) {
	for _, withTxn := range []bool{false, true} {
		name := "markerOnly"
		if withTxn {
			name = "withTxn"
		}
		b.Run(name, func(b *testing.B) {
			s := openStore(b, "", func(c *Config) { c.IndexIntervalBytes = 4096 })
			defer s.Close()
			p := newPartition(b, s, nil)
			batch := makeBatch(b, tb{pid: 1, epoch: 0, seq: 0, n: 10, value: 100, txn: true})
			done := make(chan error, 1)
			cb := func(err error) { done <- err }
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if withTxn {
					g, _ := p.VerificationGuard(1, 0)
					// Rewrite the sequence in place: 10 records per batch.
					setBaseSequence(batch, int32(i*10))
					if r := p.AppendTxn(batch, 0, g); r.Code != codec.CodeNone {
						b.Fatal(r)
					}
				}
				r := p.AppendMarker(1, 0, i%2 == 0, 0, 0)
				if r.Code != codec.CodeNone {
					b.Fatal(r)
				}
				p.Sync(r.LastOffset+1, cb)
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// setBaseSequence changes a batch's base sequence and fixes its CRC.
func setBaseSequence(b codec.Batch, seq int32) {
	b[53], b[54], b[55], b[56] = byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq)
	c := b.ComputeCRC()
	b[17], b[18], b[19], b[20] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
}
