package server

// The transaction marker writer: carries out the follow-up work the transaction coordinator
// hands out (txn.Action) — fence the old producer epoch on every partition, write the
// COMMIT/ABORT control batches (KIP-98 markers) to every partition of a prepared transaction,
// and complete the transaction once all of them are durable.
//
// Two-phase end of a transaction (Apache's TransactionCoordinator / TransactionMarkerChannelManager
// shape):
//
//	EndTxn / reaper / rejoin / reconcile
//	        │  Prepare* durable (coordinator journal), partition + group lists kept
//	        ▼
//	   Fence (Store.FenceProducer: old epoch rejected everywhere)
//	        │
//	        ▼  per partition: markerQueue (back to back appends, one shared Sync)
//	   AppendMarker ×N ──▶ Sync(last+1) ──▶ every partition durable?
//	        │ no (append/fsync error)              │ yes
//	        ▼                                      ▼
//	   MarkersFailed (coordinator re-drives     groups CompleteTxnOffsets (commit/discard, durable)
//	   on the next reaper tick / EndTxn retry)     │
//	   waiter ← COORDINATOR_NOT_AVAILABLE          ▼
//	                                            coordinator Complete (Complete*, durable)
//	                                               │
//	                                               ▼
//	                                            waiter (EndTxn) ← NONE
//
// Crash safety: the Prepare* record is durable before any marker is written and Complete is
// written only after every marker and every group completion is durable, so a crash anywhere in
// between leaves a Prepare* entry that Coordinator.Start returns and Reconcile finishes. A second
// marker for an already-ended transaction is harmless (it closes nothing), and CompleteTxnOffsets is
// idempotent, so redoing the tail is safe. Groups are completed BEFORE the coordinator's Complete:
// the other order could lose an EOS offset commit if we crashed between the two (Complete* has no
// group list left to redo).
//
// Batching: markers for several transactions finishing together on one partition are appended back
// to back by one drainer and share one Sync (one fsync), like Apache's per-leader
// WriteTxnMarkers batching. Markers for a partition of a deleted topic are skipped (Apache drops
// markers for unknown partitions), so a deleted topic can never wedge a transaction.

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

var (
	mMarkersWritten   = metrics.NewCounter("kaas_txn_markers_written_total")
	mMarkerFailures   = metrics.NewCounter("kaas_txn_marker_dispatch_failures_total")
	mMarkersSkipped   = metrics.NewCounter("kaas_txn_markers_skipped_total") // deleted topic / partition
	mMarkerDispatches = metrics.NewCounter("kaas_txn_marker_dispatches_total")
	lsoStore          atomic.Pointer[storage.Store]
	// LSO lag as one snapshot gauge pair computed at scrape time (not one series per partition):
	// the largest high-watermark − LSO over all partitions, and how many partitions lag at all.
	_ = metrics.NewGauge("kaas_txn_lso_lag_max_offsets", func() float64 { m, _ := lsoLagSnapshot(); return float64(m) })
	_ = metrics.NewGauge("kaas_txn_lso_lagging_partitions", func() float64 { _, n := lsoLagSnapshot(); return float64(n) })
)

// lsoLagSnapshot walks every partition of the bound store (the process has one).
func lsoLagSnapshot() (maxLag int64, lagging int) {
	s := lsoStore.Load()
	if s == nil {
		return 0, 0
	}
	for _, t := range s.Topics() {
		for i := int32(0); i < t.NumPartitions(); i++ {
			p := t.Partition(i)
			if p == nil {
				continue
			}
			if lag := p.HighWatermark() - p.LastStableOffset(); lag > 0 {
				lagging++
				maxLag = max(maxLag, lag)
			}
		}
	}
	return maxLag, lagging
}

// MarkerWriterConfig configures a MarkerWriter.
type MarkerWriterConfig struct {
	Store *storage.Store
	// Groups completes staged transactional offsets (nil: no group coordinator, nothing staged).
	Groups *group.Coordinator
	// Topology answers partition leadership (nil: single broker, leads everything).
	Topology topology.Topology
	Logger   *zap.Logger
}

// MarkerWriter writes transaction markers and completes transactions. Build it before the
// transaction coordinator (its OnAction is the coordinator's Config.OnAction), Attach it to the
// coordinator, then Reconcile what Coordinator.Start returns.
type MarkerWriter struct {
	cfg MarkerWriterConfig
	log *zap.Logger
	tc  atomic.Pointer[txn.Coordinator]

	stopOnce  sync.Once
	stopWatch chan struct{}
}

// NewMarkerWriter builds a writer; Attach binds it to its coordinator.
func NewMarkerWriter(cfg MarkerWriterConfig) *MarkerWriter {
	if cfg.Topology == nil {
		cfg.Topology = topology.NewTable(topology.Broker{})
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	lsoStore.Store(cfg.Store)
	return &MarkerWriter{cfg: cfg, log: cfg.Logger, stopWatch: make(chan struct{})}
}

// Attach binds the writer to the coordinator whose actions it carries out (before Start).
func (w *MarkerWriter) Attach(c *txn.Coordinator) {
	w.tc.Store(c)
}

// Detach forgets the binding and stops the hanging-transaction watch (after the coordinator is
// closed).
func (w *MarkerWriter) Detach() {
	w.stopOnce.Do(func() { close(w.stopWatch) })
}

var mHangingPartitionTxns atomic.Int64

var _ = metrics.NewGauge("kaas_txn_hanging_partition_transactions", func() float64 {
	return float64(mHangingPartitionTxns.Load())
})

// WatchHanging scans every partition each interval for transactions open longer than maxTimeout
// (transaction.max.timeout.ms: no transaction can legally run that long, so the coordinator has
// lost track of it — Apache's definition of a hanging transaction) and logs each one with what
// kafka-transactions.sh abort needs. The coordinator's reaper logs its own entries that overrun
// their timeout; this catches the partition side it cannot see (e.g. a zombie write after a
// restart lost the in-memory fence). Stopped by Detach.
func (w *MarkerWriter) WatchHanging(interval, maxTimeout time.Duration) {
	if interval <= 0 {
		return
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-w.stopWatch:
				return
			case now := <-t.C:
				w.scanHanging(now, maxTimeout)
			}
		}
	}()
}

func (w *MarkerWriter) scanHanging(now time.Time, maxTimeout time.Duration) {
	var n int64
	limit := now.Add(-maxTimeout).UnixMilli()
	for _, t := range w.cfg.Store.Topics() {
		for i := int32(0); i < t.NumPartitions(); i++ {
			p := t.Partition(i)
			if p == nil || p.LastStableOffset() == p.HighWatermark() {
				continue // nothing open here (cheap check first)
			}
			for _, o := range p.OpenTransactions() {
				if o.StartTimestamp > limit {
					continue
				}
				n++
				w.log.Warn("hanging transaction on partition: open longer than transaction.max.timeout.ms",
					zap.String("topic", t.Name), zap.Int32("partition", i), zap.Int64("producerId", o.ProducerID),
					zap.Int16("producerEpoch", o.Epoch), zap.Int64("startOffset", o.FirstOffset),
					zap.Duration("openFor", time.Duration(now.UnixMilli()-o.StartTimestamp)*time.Millisecond))
			}
		}
	}
	mHangingPartitionTxns.Store(n)
}

// OnAction is txn.Config.OnAction: reaper aborts and re-drives have no waiter.
func (w *MarkerWriter) OnAction(a txn.Action) { w.Run(a, nil) }

// Reconcile finishes the prepared transactions Coordinator.Start found (fence to the current
// epoch, write the markers, complete). It returns at once; done (optional) runs when every one
// of them is complete or failed (a failed one is re-driven by the reaper).
func (w *MarkerWriter) Reconcile(acts []txn.Action, done func(failed int)) {
	var left, failed atomic.Int32
	left.Store(int32(len(acts)) + 1)
	fin := func(code int16) {
		if code != codec.CodeNone {
			failed.Add(1)
		}
		if left.Add(-1) == 0 && done != nil {
			done(int(failed.Load()))
		}
	}
	for _, a := range acts {
		w.Run(a, fin)
	}
	fin(codec.CodeNone)
}

// Run carries out one action: the fence first (so zombie appends racing the markers are already
// rejected), then the markers. waiter, if set, gets NONE once the transaction is complete, or the
// retriable COORDINATOR_NOT_AVAILABLE if it could not be (Apache's client retries EndTxn).
func (w *MarkerWriter) Run(a txn.Action, waiter func(code int16)) {
	if a.Fence != nil {
		w.cfg.Store.FenceProducer(a.Fence.ProducerID, a.Fence.NewEpoch)
	}
	if a.Markers == nil {
		if waiter != nil {
			waiter(codec.CodeNone)
		}
		return
	}
	w.dispatch(a.Markers, waiter)
}

// markerDispatch is one transaction's marker write in flight.
type markerDispatch struct {
	w      *MarkerWriter
	m      *txn.Markers
	waiter func(int16)
	left   atomic.Int32
	failed atomic.Bool
}

func (w *MarkerWriter) dispatch(m *txn.Markers, waiter func(int16)) {
	mMarkerDispatches.Inc()
	d := &markerDispatch{w: w, m: m, waiter: waiter}
	var targets []*storage.Partition
	for _, tp := range m.Partitions {
		t := w.cfg.Store.Topic(tp.Topic)
		for _, pn := range tp.Partitions {
			var p *storage.Partition
			if t != nil {
				p = t.Partition(pn)
			}
			if p == nil {
				// Deleted topic or partition: Apache drops markers for unknown partitions; the
				// data they would close is gone with the log.
				mMarkersSkipped.Inc()
				w.log.Info("skipping transaction marker for unknown partition",
					zap.String("transactionalId", m.TransactionalID), zap.String("topic", tp.Topic), zap.Int32("partition", pn))
				continue
			}
			if !w.cfg.Topology.Partition(tp.Topic, pn).Local {
				// Cluster mode must send WriteTxnMarkers to the leader; until that sender exists
				// the dispatch fails and the reaper re-drives it (never append on a non-leader).
				w.log.Warn("cannot write transaction marker: not the partition leader",
					zap.String("transactionalId", m.TransactionalID), zap.String("topic", tp.Topic), zap.Int32("partition", pn))
				d.failed.Store(true)
				continue
			}
			targets = append(targets, p)
		}
	}
	d.left.Store(int32(len(targets)) + 1) // +1: released below, so completion waits for every enqueue
	for _, p := range targets {
		enqueueMarker(p, markerItem{pid: m.ProducerID, epoch: m.ProducerEpoch, commit: m.Commit,
			coordinatorEpoch: m.CoordinatorEpoch, done: d.partitionDone})
	}
	d.partitionDone(codec.CodeNone)
}

func (d *markerDispatch) partitionDone(code int16) {
	if code != codec.CodeNone {
		d.failed.Store(true)
		d.w.log.Warn("transaction marker write failed", zap.String("transactionalId", d.m.TransactionalID),
			zap.Int64("producerId", d.m.ProducerID), zap.Int16("code", code))
	}
	if d.left.Add(-1) != 0 {
		return
	}
	if d.failed.Load() {
		d.fail()
		return
	}
	d.completeGroups()
}

// fail releases the coordinator's in-flight flag so the reaper (or a retried EndTxn) re-drives
// the markers, and tells the waiter to retry.
func (d *markerDispatch) fail() {
	mMarkerFailures.Inc()
	if tc := d.w.tc.Load(); tc != nil {
		tc.MarkersFailed(d.m, nil)
	}
	if d.waiter != nil {
		d.waiter(codec.CodeCoordinatorNotAvailable)
	}
}

// completeGroups commits (or discards) the offsets TxnOffsetCommit staged for every group of the
// transaction, durably, before the coordinator records the completion.
func (d *markerDispatch) completeGroups() {
	groups := d.m.Groups
	gc := d.w.cfg.Groups
	if len(groups) == 0 || gc == nil {
		d.completeCoordinator()
		return
	}
	var left atomic.Int32
	var failed atomic.Bool
	left.Store(int32(len(groups)))
	for _, g := range groups {
		gc.CompleteTxnOffsets(g, d.m.ProducerID, d.m.Commit, func(err error) {
			if err != nil {
				failed.Store(true)
				d.w.log.Warn("cannot complete transactional offsets", zap.String("group", g),
					zap.String("transactionalId", d.m.TransactionalID), zap.Error(err))
			}
			if left.Add(-1) == 0 {
				if failed.Load() {
					d.fail()
					return
				}
				d.completeCoordinator()
			}
		})
	}
}

func (d *markerDispatch) completeCoordinator() {
	tc := d.w.tc.Load()
	if tc == nil {
		d.fail()
		return
	}
	m := d.m
	tc.Complete(txn.CompleteParams{TransactionalID: m.TransactionalID, ProducerID: m.ProducerID,
		ProducerEpoch: m.ProducerEpoch, Commit: m.Commit}, func(res txn.CompleteResult, err error) {
		switch {
		case err != nil:
			// The completion was not persisted: the entry is still prepared with the in-flight
			// flag set; release it so the markers are re-driven (they are idempotent).
			d.w.log.Warn("cannot complete transaction", zap.String("transactionalId", m.TransactionalID), zap.Error(err))
			d.fail()
		case res.Code != codec.CodeNone:
			// The entry moved on (a stale or duplicate dispatch): nothing to complete.
			d.w.log.Warn("transaction completion did not match the prepared transaction",
				zap.String("transactionalId", m.TransactionalID), zap.Int64("producerId", m.ProducerID),
				zap.Int16("producerEpoch", m.ProducerEpoch), zap.Int16("code", res.Code))
			if d.waiter != nil {
				d.waiter(codec.CodeCoordinatorNotAvailable)
			}
		default:
			if d.waiter != nil {
				d.waiter(codec.CodeNone)
			}
		}
	})
}

// ---------------------------------------------------------------------------------------------
// Per-partition marker queue: back-to-back appends sharing one Sync.

type markerItem struct {
	pid              int64
	epoch            int16
	commit           bool
	coordinatorEpoch int32
	done             func(code int16) // NONE once durable; called once
}

type markerQueue struct {
	p       *storage.Partition
	mu      sync.Mutex
	items   []markerItem
	running bool
}

var markerQueues sync.Map // *storage.Partition → *markerQueue

// enqueueMarker queues a marker for p; a drainer goroutine (one per busy partition) appends every
// queued marker back to back and covers them with one Sync.
func enqueueMarker(p *storage.Partition, it markerItem) {
	v, _ := markerQueues.LoadOrStore(p, &markerQueue{p: p})
	q := v.(*markerQueue)
	q.mu.Lock()
	q.items = append(q.items, it)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		go q.drain()
	}
}

func (q *markerQueue) drain() {
	for {
		q.mu.Lock()
		batch := q.items
		q.items = nil
		if len(batch) == 0 {
			q.running = false
			// An add that loaded q before this delete still runs its own drainer on q: correct,
			// just unbatched.
			markerQueues.CompareAndDelete(q.p, q)
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		now := time.Now().UnixMilli()
		end := int64(-1)
		var written []markerItem
		for _, it := range batch {
			res := q.p.AppendMarker(it.pid, it.epoch, it.commit, it.coordinatorEpoch, now)
			if res.Code != codec.CodeNone {
				it.done(res.Code)
				continue
			}
			mMarkersWritten.Inc()
			written = append(written, it)
			end = res.LastOffset + 1
		}
		if len(written) == 0 {
			continue
		}
		q.p.Sync(end, func(err error) {
			code := codec.CodeNone
			if err != nil {
				code = codec.CodeKafkaStorageError
			}
			for _, it := range written {
				it.done(code)
			}
		})
	}
}
