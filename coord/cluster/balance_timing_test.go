package cluster

import (
	"testing"
)

// BenchmarkBalanceSteady10k is one controller tick over a settled cluster of 5 brokers and
// 10 000 partitions (100 topics of 100): the work every watch event costs the controller.
func BenchmarkBalanceSteady10k(b *testing.B) {
	in := BalanceInput{Brokers: brokers(1, 2, 3, 4, 5), Current: map[ResourceID]StoredAssignment{}, MovesPerTick: 64}
	for i := 0; i < 100; i++ {
		in.Topics = append(in.Topics, TopicPartitions{ID: [16]byte{byte(i), byte(i >> 8), 7}, Partitions: 100})
	}
	var rev int64
	applyWrites(in.Current, Balance(in).Writes, &rev)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if res := Balance(in); len(res.Writes) != 0 {
			b.Fatalf("a settled cluster wrote %d", len(res.Writes))
		}
	}
}
