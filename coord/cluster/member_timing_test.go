package cluster

import (
	"context"
	"testing"
	"time"
)

// BenchmarkPublishable measures Rule P's lease check, which runs after every WAL sync.
func BenchmarkPublishable(b *testing.B) {
	f := NewFake(NewManualClock(time.Time{}))
	fs := &failStops{}
	m, err := Join(context.Background(), f, testMemberConfig(RealClock, fs))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Leave(context.Background())
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for i := 0; i < b.N; i++ {
		if m.Publishable() {
			n++
		}
	}
	if n == 0 {
		b.Fatal("never publishable")
	}
}
