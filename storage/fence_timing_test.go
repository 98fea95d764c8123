package storage

import (
	"fmt"
	"testing"
)

// BenchmarkFenceProducer measures one Store.FenceProducer (an epoch bump: under TV2 every
// commit) in a store with n partitions, a few of which hold state for the fenced producer and
// the rest for other producers. Its cost must not grow with n.
func BenchmarkFenceProducer(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("partitions=%d", n), func(b *testing.B) {
			s := openStore(b, "", withoutWAL, func(c *Config) { c.Preallocate = false })
			defer s.Close()
			const perTopic = 1000
			var parts []*Partition
			for i := 0; len(parts) < n; i++ {
				top, err := s.CreateTopic(fmt.Sprintf("t%d", i), int32(min(perTopic, n-len(parts))), nil)
				if err != nil {
					b.Fatal(err)
				}
				for j := int32(0); j < top.NumPartitions(); j++ {
					parts = append(parts, top.Partition(j))
				}
			}
			// Producer 1 (fenced below) has state on 3 partitions; every partition has state
			// for one other producer.
			for i, p := range parts {
				p.FenceProducer(int64(1000+i), 0)
			}
			for _, i := range []int{0, n / 2, n - 1} {
				parts[i].FenceProducer(1, 0)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.FenceProducer(1, int16(i%30000+1))
			}
			b.StopTimer() // not the deferred Close of n partitions
		})
	}
}
