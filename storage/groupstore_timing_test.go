package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkGroupStoreClusterLoadShard measures LoadShard + ReleaseShard of one group shard with
// the logs of three incarnations in the directory (each about logMiB MiB of commits spread over
// every shard): a load reads every log (§3: a successor cannot know which logs carry its shard's
// epoch), so its cost grows with the logs not yet rolled or deleted, not with the shard's size.
func BenchmarkGroupStoreClusterLoadShard(b *testing.B) {
	for _, logMiB := range []int{1, 8} {
		b.Run(fmt.Sprintf("logs=3x%dMiB", logMiB), func(b *testing.B) {
			dir := b.TempDir()
			for i := 0; i < 3; i++ {
				s, err := OpenGroupStoreCluster(dir, int32(i), fmt.Sprintf("i%d", i), nil)
				if err != nil {
					b.Fatal(err)
				}
				s.compactMin = 1 << 40 // keep the whole log
				for n := i; n < GroupShards; n += 3 {
					if err := s.LoadShard(n, 1); err != nil {
						b.Fatal(err)
					}
				}
				for s.size < int64(logMiB)<<20 {
					const batch = 4096
					errs := make(chan error, batch)
					for k := 0; k < batch; k++ {
						n := i + 3*(k%((GroupShards-i+2)/3))
						g := gsGroupOfShard(n, "bench")
						s.CommitAsync(g, []GroupOffset{{Topic: "some-topic", Partition: int32(k % 16), Offset: int64(k), Metadata: "m"}},
							func(err error) { errs <- err })
					}
					for k := 0; k < batch; k++ {
						if err := <-errs; err != nil {
							b.Fatal(err)
						}
					}
				}
				s.Close() // dies holding its shards
			}
			var total int64
			ents, _ := os.ReadDir(filepath.Join(dir, "__cluster", gsSubdir))
			for _, e := range ents {
				if st, err := e.Info(); err == nil {
					total += st.Size()
				}
			}
			r, err := OpenGroupStoreCluster(dir, 9, "reader", nil)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			b.ReportAllocs()
			b.SetBytes(total)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := r.LoadShard(0, int32(2+i)); err != nil {
					b.Fatal(err)
				}
				if err := r.ReleaseShard(0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
