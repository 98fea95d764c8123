package quota

import (
	"fmt"
	"testing"
)

// BenchmarkRecord is the per-request cost of quota accounting for a client with a quota (resolve
// the level, update its sensor), and of the no-quota fast path.
func BenchmarkRecord(b *testing.B) {
	m, err := New(Config{}, NewFileStore(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("no-quotas", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			m.Record(Produce, "alice", "app", 1024)
		}
	})
	for i := 0; i < 1000; i++ {
		if err := m.Alter(Entity{User: user(fmt.Sprintf("u%d", i))}, []Op{{Key: ProducerByteRate, Value: 1 << 40}}, false); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("user-quota-1000-entities", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			m.Record(Produce, "u500", "app", 1024)
		}
	})
}
