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

// FuzzTxnIndex feeds arbitrary bytes to the .txnindex reader: it must not panic, and whatever it
// accepts must satisfy the index invariants and re-encode to the same bytes.
func FuzzTxnIndex(f *testing.F) {
	f.Add(encodeTxnIndex(nil))
	f.Add(encodeTxnIndex([]AbortedTxn{{1, 100, 105}, {2, 90, 110}}))
	valid := encodeTxnIndex([]AbortedTxn{{7, 120, 150}})
	f.Add(valid[:len(valid)-1])
	f.Add([]byte("KTI1"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, buf []byte) {
		ents, err := decodeTxnIndex(buf, 100, 200)
		if err != nil {
			return
		}
		for i, a := range ents {
			if a.LastOffset < 100 || a.LastOffset >= 200 || a.FirstOffset > a.LastOffset || a.ProducerID < 0 ||
				(i > 0 && a.LastOffset <= ents[i-1].LastOffset) {
				t.Fatalf("accepted bad entry %+v", a)
			}
		}
		if got := encodeTxnIndex(ents); string(got) != string(buf) {
			t.Fatal("accepted bytes do not re-encode identically")
		}
	})
}
