package storage

import (
	"fmt"
	"sync"
	"testing"
)

// BenchmarkAppend measures the hot path alone (page cache write, no fsync wait). Expect 0
// allocs/op.
func BenchmarkAppend(b *testing.B) {
	s := openStore(b, "", func(c *Config) { c.IndexIntervalBytes = 4096 })
	defer s.Close()
	p := newPartition(b, s, nil)
	batch := makeBatch(b, tb{n: 10, value: 100})
	b.SetBytes(int64(len(batch)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r := p.Append(batch, 0); r.Code != 0 {
			b.Fatal(r)
		}
	}
}

// BenchmarkAppendSync measures Append + durable ack with N concurrent producers (group commit).
func BenchmarkAppendSync(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("producers=%d", n), func(b *testing.B) {
			s := openStore(b, "", func(c *Config) { c.IndexIntervalBytes = 4096 })
			defer s.Close()
			p := newPartition(b, s, nil)
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N/n + 1
			for g := 0; g < n; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					batch := makeBatch(b, tb{n: 10, value: 100})
					done := make(chan error, 1)
					cb := func(err error) { done <- err }
					for i := 0; i < per; i++ {
						r := p.Append(batch, 0)
						if r.Code != 0 {
							b.Error(r)
							return
						}
						p.Sync(r.LastOffset+1, cb)
						if err := <-done; err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}
