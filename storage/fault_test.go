package storage

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
)

func TestDiskFullAndRecovery(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, func(c *Config) { c.FS = ffs })
	p := newPartition(t, s, nil)
	mustAppend(t, p, makeBatch(t, tb{pid: 1, seq: 0}), 0)
	size := p.active.size.Load()

	ffs.set(func(f *faultFS) { f.writeErr, f.partial = syscall.ENOSPC, 30 })
	r := p.Append(makeBatch(t, tb{pid: 1, seq: 1}), 0)
	if r.Code != codec.CodeKafkaStorageError {
		t.Fatalf("disk full: %+v", r)
	}
	st, _ := os.Stat(activeLogPath(p))
	if st.Size() != size || p.LogEndOffset() != 1 {
		t.Fatalf("partial bytes left: file %d, want %d; leo %d", st.Size(), size, p.LogEndOffset())
	}
	// Producer window untouched by the failed write: the retry is in sequence, not a duplicate.
	ffs.set(func(f *faultFS) { f.writeErr = nil })
	r = mustAppend(t, p, makeBatch(t, tb{pid: 1, seq: 1}), 0)
	if r.Duplicate || r.BaseOffset != 1 {
		t.Fatalf("retry after space returned: %+v", r)
	}
	crash(s)
	s = openStore(t, dir)
	defer s.Close()
	if got := readAll(t, s.Topic("t").Partition(0), 0); len(got) != 2 {
		t.Fatalf("%d batches after reopen", len(got))
	}
}

func TestFsyncFailureDiscardsAndNeverReusesOffsets(t *testing.T) {
	ffs := &faultFS{}
	dir := t.TempDir()
	s := openStore(t, dir, func(c *Config) { c.FS = ffs })
	if s.wal != nil {
		// With the WAL the acks come from its sync: fail that one (a failing segment fsync
		// takes the partition offline until restart, see TestWALSegmentFsyncFailure).
		ffs.match = "/" + walDirName + "/"
	}
	p := newPartition(t, s, nil)
	mustAppend(t, p, makeBatch(t, tb{pid: 1, seq: 0}), 0)
	ffs.set(func(f *faultFS) { f.syncErr = syscall.EIO })
	r := p.Append(makeBatch(t, tb{pid: 1, seq: 1, n: 3}), 0)
	if r.Code != 0 {
		t.Fatal(r)
	}
	err := syncWait(p, r.LastOffset+1)
	if err == nil {
		t.Fatal("sync succeeded despite fsync error")
	}
	// Without the WAL the repair fails while fsync keeps failing (HWM stays); with it the
	// segment is fine and the repair completes, leaving 1..3 as a gap: either way nothing
	// undurable is readable.
	if buf, _ := p.Read(nil, 0, 1<<20, p.HighWatermark()); p.HighWatermark() != 1 &&
		(s.wal == nil || len(buf) != len(makeBatch(t, tb{pid: 1, seq: 0}))) {
		t.Fatalf("HWM %d claims undurable data", p.HighWatermark())
	}
	// Then the disk recovers.
	ffs.set(func(f *faultFS) { f.syncErr = nil })
	waitWALContinues(t, s)
	r2 := mustAppend(t, p, makeBatch(t, tb{pid: 1, seq: 1}), 0)
	if r2.BaseOffset != 4 {
		t.Fatalf("offsets reused: next base %d, want 4 (1..3 discarded)", r2.BaseOffset)
	}
	// The discarded range answers ErrLost, never success.
	if err := syncWait(p, r.LastOffset+1); !errors.Is(err, ErrLost) {
		t.Fatalf("sync of discarded range: %v", err)
	}
	got := readAll(t, p, 0)
	if len(got) != 2 || got[0].BaseOffset() != 0 || got[1].BaseOffset() != 4 {
		t.Fatalf("read after repair: %d batches", len(got))
	}
	// Offsets in the gap read as the next batch.
	buf, code := p.Read(nil, 2, 1<<20, p.HighWatermark())
	if b, ok, _ := codec.FrameBatch(buf); code != 0 || !ok || b.BaseOffset() != 4 {
		t.Fatal("gap read")
	}
	crash(s)
	s = openStore(t, dir)
	defer s.Close()
	p = s.Topic("t").Partition(0)
	if p.LogEndOffset() != 5 || len(readAll(t, p, 0)) != 2 {
		t.Fatalf("after reopen leo %d", p.LogEndOffset())
	}
	if r := p.Append(makeBatch(t, tb{pid: 1, seq: 1}), 0); !r.Duplicate || r.BaseOffset != 4 {
		t.Fatalf("producer state after repair+reopen: %+v", r)
	}
}

func TestGroupCommit(t *testing.T) {
	ffs := &faultFS{syncDelay: 2 * time.Millisecond}
	s := openStore(t, "", func(c *Config) { c.FS = ffs })
	defer s.Close()
	p := newPartition(t, s, nil)
	before := ffs.syncs.Load()
	const producers, each = 16, 25
	var wg sync.WaitGroup
	var fired, violations atomic.Int64
	for g := 0; g < producers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := makeBatch(t, tb{n: 2})
			for i := 0; i < each; i++ {
				r := p.Append(b, 0)
				if r.Code != 0 {
					t.Error(r)
					return
				}
				done := make(chan struct{})
				end := r.LastOffset + 1
				p.Sync(end, func(err error) {
					if err != nil || p.HighWatermark() < end {
						violations.Add(1)
					}
					fired.Add(1)
					close(done)
				})
				<-done
			}
		}()
	}
	// Concurrently: the HWM never exceeds what the flusher fsync'd, and readers below it see
	// only whole, valid batches.
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	rwg.Add(1)
	go func() {
		defer rwg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			h := p.HighWatermark()
			if h > p.LogEndOffset() {
				violations.Add(1)
			}
			buf, code := p.Read(nil, 0, 1<<20, h)
			for code == 0 && len(buf) > 0 {
				b, ok, _ := codec.FrameBatch(buf)
				if !ok || !b.CRCValid() || b.LastOffset() >= h {
					violations.Add(1)
					break
				}
				buf = buf[len(b):]
			}
		}
	}()
	wg.Wait()
	close(stop)
	rwg.Wait()
	appends := int64(producers * each)
	syncs := ffs.syncs.Load() - before
	if fired.Load() != appends || violations.Load() != 0 {
		t.Fatalf("fired %d of %d, violations %d", fired.Load(), appends, violations.Load())
	}
	if syncs >= appends {
		t.Fatalf("no group commit: %d fsyncs for %d appends", syncs, appends)
	}
	t.Logf("%d appends, %d fsyncs", appends, syncs)
}

func TestRelaxedFlushAcksInlineAndFlushesInBackground(t *testing.T) {
	ffs := &faultFS{}
	s := openStore(t, "", func(c *Config) { c.FS = ffs })
	defer s.Close()
	p := newPartition(t, s, map[string]string{"flush.messages": "1000"})
	// Taken before the append: the background flush may advance the HWM before Sync returns,
	// and a channel taken after that would wait for the next change.
	ch := p.Changed()
	r := p.Append(makeBatch(t, tb{}), 0)
	called := false
	p.Sync(r.LastOffset+1, func(err error) { called = err == nil })
	if !called {
		t.Fatal("relaxed Sync did not return inline")
	}
	eventually(t, "background flush", func() bool { return p.HighWatermark() == 1 })
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed on HWM advance")
	}
	// An idle partition does not fsync.
	n := ffs.syncs.Load()
	time.Sleep(3 * relaxedFlushDelay) // asserting the absence of activity
	if ffs.syncs.Load() != n {
		t.Fatal("idle partition keeps fsyncing")
	}
}

// A transaction marker is durable before its Sync says so, whatever flush.messages says: the
// coordinator completes the transaction on that answer.
func TestMarkerDurableBeforeSyncOnRelaxedFlushTopic(t *testing.T) {
	ffs := &faultFS{match: "/topics/"}
	s := openStore(t, "", func(c *Config) { c.FS = ffs })
	defer s.Close()
	p := newPartition(t, s, map[string]string{"flush.messages": "1000", "flush.ms": "3600000"})
	const pid = 7
	g, _ := p.VerificationGuard(pid, 0)
	if r := p.AppendTxn(makeBatch(t, tb{pid: pid, txn: true}), 0, g); r.Code != 0 {
		t.Fatalf("txn append: code %d", r.Code)
	}
	// Data acknowledges from the page cache, as the topic asks.
	called := false
	p.Sync(1, func(err error) { called = err == nil })
	if !called {
		t.Fatal("relaxed data Sync did not return inline")
	}
	eventually(t, "background flush of the data", func() bool { return p.HighWatermark() == 1 })

	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate); ffs.set(func(f *faultFS) { f.gate = nil }) }) }
	defer release() // before s.Close, which fsyncs, if the test fails early
	ffs.set(func(f *faultFS) { f.gate = gate })
	before := ffs.syncs.Load()
	m := p.AppendMarker(pid, 0, true, 0, 0)
	if m.Code != 0 {
		t.Fatalf("marker: code %d", m.Code)
	}
	done := make(chan error, 1)
	p.Sync(m.LastOffset+1, func(err error) { done <- err })
	eventually(t, "the flusher's fsync of the marker to start", func() bool { return ffs.syncs.Load() > before })
	select {
	case err := <-done:
		t.Fatalf("marker Sync answered (%v) before its fsync finished", err)
	default:
	}
	if p.HighWatermark() > m.LastOffset {
		t.Fatal("HWM passed the marker before its fsync")
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p.HighWatermark() <= m.LastOffset {
		t.Fatalf("marker Sync answered with HWM %d not past the marker %d", p.HighWatermark(), m.LastOffset)
	}
	// Once the marker is durable, data acknowledges inline again.
	r := p.Append(makeBatch(t, tb{}), 0)
	called = false
	p.Sync(r.LastOffset+1, func(err error) { called = err == nil })
	if !called {
		t.Fatal("relaxed Sync after a durable marker did not return inline")
	}
}

// A segment roll does its fsyncs without the append mutex: while the roll's fsync of the old
// segment is stuck, a fence and producer-state reads on the partition complete, and the append
// that rolled finishes once the disk answers.
func TestRollDoesNotFsyncUnderAppendMutex(t *testing.T) {
	ffs := &faultFS{match: "/topics/"}
	s := openStore(t, "", func(c *Config) { c.FS = ffs })
	defer s.Close()
	p := newPartition(t, s, map[string]string{"segment.bytes": "2048"})
	seq := int32(0)
	for p.active.size.Load()+200 < 2048 {
		mustAppend(t, p, makeBatch(t, tb{pid: 9, seq: seq, value: 100}), 0)
		seq++
	}
	segsBefore := len(*p.segs.Load())
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate); ffs.set(func(f *faultFS) { f.gate = nil }) }) }
	defer release()
	ffs.set(func(f *faultFS) { f.gate = gate })
	before := ffs.syncs.Load()
	rolled := make(chan AppendResult, 1)
	go func() { rolled <- p.Append(makeBatch(t, tb{pid: 9, seq: seq, value: 400}), 0) }()
	eventually(t, "the roll's fsync to start", func() bool { return ffs.syncs.Load() > before })

	fenced := make(chan struct{})
	go func() {
		s.FenceProducer(9, 1)
		_, _, _, _ = p.ProducerState(9)
		close(fenced)
	}()
	select {
	case <-fenced:
	case <-time.After(10 * time.Second):
		t.Fatal("fence blocked behind the roll's fsync")
	}
	select {
	case r := <-rolled:
		t.Fatalf("append finished (code %d) while the roll's fsync was blocked", r.Code)
	default:
	}
	release()
	r := <-rolled
	// The fence came while the append was waiting for its roll: the append re-ran its checks
	// after the roll and is refused at the old epoch.
	if r.Code != codec.CodeInvalidProducerEpoch {
		t.Fatalf("append at the fenced epoch after the roll: code %d, want %d", r.Code, codec.CodeInvalidProducerEpoch)
	}
	if n := len(*p.segs.Load()); n != segsBefore+1 {
		t.Fatalf("%d segments after the roll, want %d", n, segsBefore+1)
	}
	r = mustAppend(t, p, makeBatch(t, tb{pid: 9, epoch: 1, seq: 0, value: 400}), 0)
	if r.BaseOffset != int64(seq) || p.active.base != int64(seq) {
		t.Fatalf("first batch of the new segment at %d (segment base %d), want %d", r.BaseOffset, p.active.base, seq)
	}
}
