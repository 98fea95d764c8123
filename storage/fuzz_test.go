package storage

import (
	"os"
	"testing"

	"github.com/kaas-go/kaas/codec"
)

// FuzzRecovery appends random bytes to a valid active segment: reopening must not panic, must
// keep every valid batch, and must leave a log that accepts appends.
func FuzzRecovery(f *testing.F) {
	valid := makeBatch(f, tb{n: 2})
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0})
	f.Add([]byte(valid[:40]))
	f.Add([]byte(valid))
	half := append(codec.Batch(nil), valid...)
	half.SetBaseOffset(6)
	f.Add([]byte(half))
	f.Fuzz(func(t *testing.T, tail []byte) {
		dir := t.TempDir()
		s := openStore(t, dir)
		p := newPartition(t, s, nil)
		for i := 0; i < 3; i++ {
			mustAppend(t, p, makeBatch(t, tb{n: 2}), 0)
		}
		path := activeLogPath(p)
		crash(s)
		fh, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fh.Write(tail)
		fh.Close()
		s = openStore(t, dir)
		defer s.Close()
		p = s.Topic("t").Partition(0)
		if p.LogEndOffset() < 6 {
			t.Fatalf("valid prefix lost: leo %d", p.LogEndOffset())
		}
		got := readAll(t, p, 0)
		if len(got) < 3 {
			t.Fatalf("%d batches", len(got))
		}
		if r := mustAppend(t, p, makeBatch(t, tb{}), 0); r.BaseOffset != p.LogEndOffset()-1 {
			t.Fatalf("append after recovery: %+v", r)
		}
	})
}
