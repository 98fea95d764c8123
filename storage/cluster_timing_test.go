package storage

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkTakeOver measures Store.TakeOver of one partition whose previous holder left a
// 16 MiB tail in its open segment: graceful (the holder released it: opened from its indexes
// and snapshot, no scan) against crash (kill -9: the tail is scanned, no recovery checkpoint
// being due below 16 MiB, and the holder's WAL, which holds the same 16 MiB, is read for
// salvage). Each iteration builds a fresh holder with the timer stopped; only TakeOver is timed.
func BenchmarkTakeOver(b *testing.B) {
	const tail = 16<<20 - 1<<20 // just below the recovery checkpoint period
	for _, mode := range []string{"graceful", "crash"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			var scanned int64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				dir := filepath.Join(b.TempDir(), strconv.Itoa(i))
				a := openClusterStore(b, dir, 1, "a0", nil, func(c *Config) { c.walGenBytes = 64 << 20 })
				pa, _ := takeOver(b, a, 1, Handover{})
				var last AppendResult
				for written := 0; written < tail; written += 64 << 10 {
					last = pa.Append(makeBatch(b, tb{value: 64 << 10}), time.Now().UnixMilli())
					if last.Code != 0 {
						b.Fatalf("append: code %d", last.Code)
					}
				}
				if err := syncWait(pa, last.LastOffset+1); err != nil {
					b.Fatal(err)
				}
				h := Handover{PrevWALDir: clusterWALDir(dir, 1, "a0")}
				if mode == "graceful" {
					rec, err := a.Release("t", 0)
					if err != nil {
						b.Fatal(err)
					}
					h = Handover{Release: &rec}
					_ = a.Close()
				} else {
					crash(a)
				}
				s := openClusterStore(b, dir, 2, "s1", nil)
				b.StartTimer()
				st, err := s.TakeOver("t", 0, 2, h)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				scanned += st.Scanned
				crash(s)
				b.StartTimer()
			}
			b.ReportMetric(float64(scanned)/float64(b.N), "scanned-bytes/op")
		})
	}
}
