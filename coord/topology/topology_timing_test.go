package topology

import (
	"strconv"
	"testing"
)

// BenchmarkTablePartitionDefault is the single-broker hot path: no overrides, no map lookup.
func BenchmarkTablePartitionDefault(b *testing.B) {
	b.ReportAllocs()
	tb := NewTable(Broker{ID: 1})
	var local int
	for i := 0; i < b.N; i++ {
		if tb.Partition("orders", int32(i&63)).Local {
			local++
		}
	}
	if local != b.N {
		b.Fatal("not local")
	}
}

// BenchmarkTablePartitionOverrides looks partitions up in a table with 10k overrides (a cluster
// broker's view).
func BenchmarkTablePartitionOverrides(b *testing.B) {
	b.ReportAllocs()
	tb := NewTable(Broker{ID: 1})
	owners := make(map[TopicPartition]Owner, 10_000)
	for i := 0; i < 10_000; i++ {
		owners[TopicPartition{"topic-" + strconv.Itoa(i/100), int32(i % 100)}] = Owner{Broker: int32(i % 3), Epoch: 1, Known: true}
	}
	tb.SetPartitions(owners)
	names := make([]string, 100)
	for i := range names {
		names[i] = "topic-" + strconv.Itoa(i)
	}
	b.ResetTimer()
	var known int
	for i := 0; i < b.N; i++ {
		if tb.Partition(names[i%100], int32(i%100)).Known {
			known++
		}
	}
	if known != b.N {
		b.Fatal("unknown")
	}
}
