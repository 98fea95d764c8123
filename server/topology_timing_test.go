package server

import (
	"testing"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/storage"
)

// BenchmarkLocalPartition is the per-partition cost the shared check adds to a Produce or Fetch
// of 100 partitions of one topic on a single broker: one lookupTopic per topic, one
// localPartition per partition.
func BenchmarkLocalPartition(b *testing.B) {
	cfg := configs.Default()
	cfg.DataDir = b.TempDir()
	store, err := storage.Open(storage.Config{Dir: cfg.DataDir, Defaults: TopicDefaults(cfg), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	if _, err := store.CreateTopic("bench", 100, nil); err != nil {
		b.Fatal(err)
	}
	s := New(cfg, zap.NewNop(), Deps{Store: store}, "bench-cluster")
	rc := &reqCtx{s: s}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tr := rc.lookupTopic(OpWrite, "bench")
		for p := int32(0); p < 100; p++ {
			if lp, code := rc.localPartition(&tr, p, -1); code != codec.CodeNone || lp.p == nil {
				b.Fatalf("partition %d: %d", p, code)
			}
		}
	}
	b.StopTimer()
}
