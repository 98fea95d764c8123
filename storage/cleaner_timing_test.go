package storage

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkCleaner measures cleaner throughput: MB/s of log cleaned (bytes of the cleanable range
// read), on 10,000 keys × 100-byte values in batches of 10 records, each key written ~8 times,
// 1 MiB segments. Every iteration cleans a fresh copy of the same never-cleaned log, unthrottled.
func BenchmarkCleaner(b *testing.B) {
	tmpl := b.TempDir()
	s := openStore(b, tmpl, withoutWAL)
	p := newPartition(b, s, map[string]string{"cleanup.policy": "compact", "segment.bytes": "1048576", "flush.messages": "1000000"})
	val := make([]byte, 100)
	const keys, writes = 10_000, 80_000
	for i := 0; i < writes; i += 10 {
		recs := make([]kv, 10)
		for j := range recs {
			recs[j] = kv{fmt.Sprintf("key-%05d", (i+j)*7919%keys), val}
		}
		if r := p.Append(makeKeyed(b, -1, 0, 0, false, int64(i), recs), 0); r.Code != 0 {
			b.Fatal(r.Code)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	var total int64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir := filepath.Join(b.TempDir(), "d")
		copyDir(b, tmpl, dir)
		s := openStore(b, dir, withoutWAL)
		p := s.Topic("t").Partition(0)
		before := cleanerBytesReadTotal.Get()
		b.StartTimer()
		if err := s.RunCleaner(cleanerT0); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		// The map pass and the rewrite pass each read the range; count it once.
		total = int64(cleanerBytesReadTotal.Get()-before) / 2
		if p.FirstDirtyOffset() == 0 {
			b.Fatal("nothing cleaned")
		}
		s.Close()
	}
	b.SetBytes(total)
}

func copyDir(b *testing.B, from, to string) {
	b.Helper()
	err := filepath.Walk(from, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		dst := filepath.Join(to, rel)
		if info.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(dst)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		b.Fatal(err)
	}
}
