package txn

import (
	"testing"
	"time"
)

// BenchmarkEndTxnBoundedWait is what EndTxnMarkerWait adds to every EndTxn: arming the timer
// when the saga starts and stopping it when the saga answers (the common case: in time).
func BenchmarkEndTxnBoundedWait(b *testing.B) {
	c := &Coordinator{cfg: Config{EndTxnMarkerWait: 20 * time.Second}}
	n := 0
	done := func(int16) { n++ }
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.boundedWait("bench", done)(0)
	}
	b.StopTimer()
	if n != b.N {
		b.Fatalf("answered %d of %d", n, b.N)
	}
}
