package txn

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkTxnCycle measures full coordinator transactions per second: AddPartitions, EndTxn
// (commit) and Complete, i.e. three durable changes (journal records) per transaction, with N
// producers on distinct transactional ids running concurrently against a real directory (real
// fdatasync). One b.N iteration is one transaction; txns/s is reported.
func BenchmarkTxnCycle(b *testing.B) {
	for _, tv := range []struct {
		name    string
		version int16
	}{{"tv1", 3}, {"tv2", 5}} {
		for _, ids := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/ids=%d", tv.name, ids), func(b *testing.B) {
				benchCycle(b, ids, tv.version)
			})
		}
	}
}

// BenchmarkGroupCommit measures the worker's group-commit path alone: N submitters, each on its
// own transactional id, each submitting one persisted change (LastUpdateMs bumped) and waiting for
// its callback before the next, so every op pays for one durable batch and concurrent submitters
// share batches. One b.N iteration is one durable change; ops/s is reported.
func BenchmarkGroupCommit(b *testing.B) {
	for _, n := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("submitters=%d", n), func(b *testing.B) {
			c := benchCoordinator(b)
			tids := make([]string, n)
			for i := range tids {
				tids[i] = fmt.Sprintf("gc-%d", i)
				r, err := call(b, func(d func(InitProducerIDResult, error)) {
					c.InitProducerID(InitProducerIDParams{TransactionalID: tids[i], TimeoutMs: 60_000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
				})
				if err != nil || r.Code != 0 {
					b.Fatal(r, err)
				}
			}
			bump := func(e *Entry, _ time.Time) (*Entry, any) {
				next := e.clone()
				next.LastUpdateMs++
				return next, nil
			}
			work := make(chan struct{}, b.N)
			for i := 0; i < b.N; i++ {
				work <- struct{}{}
			}
			close(work)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for _, tid := range tids {
				wg.Add(1)
				go func(tid string) {
					defer wg.Done()
					step := make(chan struct{}, 1)
					for range work {
						c.submit(tid, bump, func(_ any, err error) {
							if err != nil {
								b.Errorf("submit: %v", err)
							}
							step <- struct{}{}
						})
						<-step
					}
				}(tid)
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
		})
	}
}

// benchCoordinator starts a coordinator for a benchmark. KAAS_TXN_BENCH_DIR points it at the
// disk to measure, KAAS_TXN_BENCH_WORKERS sets the worker count, KAAS_TXN_BENCH_NOFSYNC removes
// every fsync (CPU-side ceiling).
func benchCoordinator(b *testing.B) *Coordinator {
	dir := os.Getenv("KAAS_TXN_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	} else {
		var err error
		if dir, err = os.MkdirTemp(dir, "txnbench"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	alloc := &atomicAlloc{}
	workers := 0
	if w := os.Getenv("KAAS_TXN_BENCH_WORKERS"); w != "" {
		workers, _ = strconv.Atoi(w)
	}
	parts := newFakeParts()
	parts.auto()
	cfg := Config{ClusterDir: dir, AllocPID: alloc.alloc, ReaperInterval: time.Hour, Workers: workers, Partitions: parts}
	if os.Getenv("KAAS_TXN_BENCH_NOFSYNC") != "" {
		cfg.FS = noSyncFS{}
	}
	c, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c
}

func benchCycle(b *testing.B, ids int, version int16) {
	c := benchCoordinator(b)

	type producer struct {
		tid   string
		pid   int64
		epoch int16
		part  []TopicPartitions
	}
	ps := make([]*producer, ids)
	for i := range ps {
		p := &producer{tid: fmt.Sprintf("bench-%d", i), part: tps("topic", int32(i%8))}
		r, err := call(b, func(d func(InitProducerIDResult, error)) {
			c.InitProducerID(InitProducerIDParams{TransactionalID: p.tid, TimeoutMs: 60_000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
		})
		if err != nil || r.Code != 0 {
			b.Fatal(r, err)
		}
		p.pid, p.epoch = r.ProducerID, r.ProducerEpoch
		ps[i] = p
	}
	work := make(chan struct{}, b.N)
	for i := 0; i < b.N; i++ {
		work <- struct{}{}
	}
	close(work)

	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func(p *producer) {
			defer wg.Done()
			// Each step waits for the previous one's callback, like a real producer.
			step := make(chan struct{}, 1)
			for range work {
				var endRes EndTxnResult
				c.AddPartitions(AddPartitionsParams{TransactionalID: p.tid, ProducerID: p.pid, ProducerEpoch: p.epoch,
					Partitions: p.part, Version: version, Implicit: version >= 5}, func(r AddPartitionsResult, err error) {
					if err != nil || r.Code != 0 {
						b.Errorf("add: %+v %v", r, err)
					}
					step <- struct{}{}
				})
				<-step
				c.EndTxn(EndTxnParams{TransactionalID: p.tid, ProducerID: p.pid, ProducerEpoch: p.epoch, Commit: true, Version: version},
					func(r EndTxnResult, err error) {
						if err != nil || r.Code != 0 {
							b.Errorf("end: %+v %v", r, err)
						}
						endRes = r
						step <- struct{}{}
					})
				<-step
				if version >= 5 {
					p.pid, p.epoch = endRes.ProducerID, endRes.ProducerEpoch
				}
			}
		}(p)
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "txns/s")
}

// noSyncFS writes and renames like the real store but never fsyncs (benchmark ceiling only).
type noSyncFS struct{ OSFileSystem }

func (noSyncFS) WriteTemp(path string, data []byte) error { return os.WriteFile(path, data, 0o644) }
func (noSyncFS) SyncDir(string) error                     { return nil }
func (noSyncFS) CreateJournal(path string) (JournalFile, error) {
	jf, err := OSFileSystem{}.CreateJournal(path)
	if err != nil {
		return nil, err
	}
	return noSyncJournal{jf}, nil
}

type noSyncJournal struct{ JournalFile }

func (noSyncJournal) Datasync() error { return nil }
func (noSyncJournal) Sync() error     { return nil }
