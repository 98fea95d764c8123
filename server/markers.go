package server

// The local marker writer: txn.PartitionWriter for the partitions of this process's storage.
// The commit saga itself (prepare → fence → markers → groups → complete → answer) and its diagram
// are in coord/txn/saga.go; this file only fences producers and appends COMMIT/ABORT control
// batches (KIP-98 markers) to local partitions, and watches for hanging transactions.
//
//	WriteMarkers(batch) ──► markerQueue (one on-demand drainer for every local partition)
//	                        ──► per partition: AppendMarker × n back to back ──► one Sync ──►
//	                        every marker of the batch answered ──► done(results)
//
// Markers for several transactions finishing together on one partition (from one call or from
// calls of different coordinator workers) are appended back to back and share one Sync (one
// fsync), like Apache's per-leader WriteTxnMarkers batching. A partition of a deleted topic
// answers UNKNOWN_TOPIC_OR_PARTITION (the coordinator drops that marker); a partition this broker
// does not lead answers NOT_LEADER_OR_FOLLOWER (the coordinator re-drives later; never append on
// a non-leader).

import (
	"errors"
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
	"github.com/kaas-go/kaas/storage/mailbox"
)

var (
	mMarkersWritten = metrics.NewCounter("kaas_txn_markers_written_total")
	lsoStore        atomic.Pointer[storage.Store]
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

// MarkerWriter is the local txn.PartitionWriter: it fences producers in, and appends markers
// to, this broker's partitions.
type MarkerWriter struct {
	store *storage.Store
	topo  topology.Topology
	log   *zap.Logger

	stopOnce  sync.Once
	stopWatch chan struct{}
	// swallow (tests only) makes WriteMarkers never answer: the broker then stops exactly
	// between "Prepare* durable" and "markers written", as a crash there would.
	swallow atomic.Bool
	// testHooks (tests only, nil otherwise) stops a cluster broker at one step of a transaction's
	// tail, so the crash tests (cluster_txn_crash_test.go) can kill it exactly there.
	testHooks atomic.Pointer[markerTestHooks]

	// Set by the broker wiring before serving: the group coordinator and its store, which
	// complete a producer's staged offsets when a WriteTxnMarkers names a __consumer_offsets
	// partition this broker owns (design/cluster.md §6 step 4); publish is Rule P for those
	// answers (nil: always).
	groups  *group.Coordinator
	offsets *storage.GroupStore
	publish func() bool
}

var _ txn.PartitionWriter = (*MarkerWriter)(nil)

// markerTestHooks are the points of the transaction tail at which a test stops a cluster broker
// and then crashes it. Each hook is called with what is about to pass that point and returns
// false to swallow it, so that nothing more happens to it on this broker (as after kill -9
// there), or true to let it go on; a nil hook lets everything pass. A hook must not wait for the
// crash: it runs on a coordinator worker, a partition's marker drainer or a peer sender, which
// closing the broker waits for.
type markerTestHooks struct {
	// Transaction coordinator, ClusterMarkerWriter.WriteMarkers: the saga hands over a batch
	// of markers. Prepare* is durable and no marker has left yet.
	dispatch func(batch []txn.MarkerRequest) bool
	// Transaction coordinator, ClusterMarkerWriter.Groups: a group's staged offsets are
	// completed (durable at the group coordinator) and the saga has not heard it yet, so
	// Complete* is not written.
	groupCompleted func(group string, producerID int64) bool
	// Partition leader, WriteTxnMarkers: a marker for one of its partitions has arrived and is
	// not appended yet (received), or is durable and not answered yet (durable).
	received func(topic string, partition int32, producerID int64) bool
	durable  func(topic string, partition int32, producerID int64) bool
}

// NewMarkerWriter builds the local writer over store. topo answers partition leadership (nil:
// single broker, leads everything).
func NewMarkerWriter(store *storage.Store, topo topology.Topology, log *zap.Logger) *MarkerWriter {
	if topo == nil {
		topo = topology.NewTable(topology.Broker{})
	}
	if log == nil {
		log = zap.NewNop()
	}
	lsoStore.Store(store)
	return &MarkerWriter{store: store, topo: topo, log: log, stopWatch: make(chan struct{})}
}

// Close stops the hanging-transaction watch.
func (w *MarkerWriter) Close() {
	w.stopOnce.Do(func() { close(w.stopWatch) })
}

// Fence is txn.PartitionWriter.Fence: the storage fences every partition where the producer has
// state, so the partition list is not needed locally.
func (w *MarkerWriter) Fence(batch []txn.FenceRequest, done func(error)) {
	for _, f := range batch {
		w.store.FenceProducer(f.ProducerID, f.Epoch)
	}
	done(nil)
}

// WriteMarkers is txn.PartitionWriter.WriteMarkers.
func (w *MarkerWriter) WriteMarkers(batch []txn.MarkerRequest, done func([]txn.MarkerResult)) {
	if w.swallow.Load() {
		return
	}
	res := make([]txn.MarkerResult, len(batch))
	var left atomic.Int32
	left.Store(int32(len(batch)) + 1) // +1: released below, so done waits for every enqueue
	finish := func() {
		if left.Add(-1) == 0 {
			done(res)
		}
	}
	for i := range batch {
		m := &batch[i]
		// The same partition check as a client's WriteTxnMarkers (topology.go): a deleted topic
		// answers UNKNOWN_TOPIC_OR_PARTITION (the coordinator drops that marker only, as Apache
		// drops markers for unknown partitions), a partition we do not lead answers
		// NOT_LEADER_OR_FOLLOWER (the saga re-drives it once the leader is known).
		tr := resolveTopic(w.store, opCallerAuthorized, m.Topic)
		lp, code := leadPartition(w.topo, &tr, m.Partition, -1)
		if code == codec.CodeNone && lp.p == nil {
			code = codec.CodeInvalidTopicException // internal topics: groups complete through GroupCompleter
		}
		if code != codec.CodeNone {
			res[i].Code = code
			finish()
			continue
		}
		p := lp.p
		enqueueMarker(p, markerItem{pid: m.ProducerID, epoch: m.ProducerEpoch, commit: m.Commit,
			coordinatorEpoch: m.CoordinatorEpoch, prepareSeq: m.PrepareSeq, done: func(code int16) {
				res[i].Code = code
				finish()
			}})
	}
	finish()
}

// completeShard completes every staging of producerID in group shard: Apache's
// GroupCoordinator.scheduleHandleTxnCompletion for a marker on a __consumer_offsets partition.
// The transaction coordinator names only the shard (the wire carries no group), so every group
// of the shard with offsets staged by the producer is completed, each durably (one record per
// group), and done gets NONE once all are; NOT_LEADER_OR_FOLLOWER if the shard is not (or no
// longer) served here, KAFKA_STORAGE_ERROR if a record could not be written. A producer with
// nothing staged in the shard (a resend after a lost answer) answers NONE: completion is
// idempotent.
func (w *MarkerWriter) completeShard(shard int32, producerID int64, commit bool, done func(code int16)) {
	if w == nil || w.groups == nil || w.offsets == nil {
		done(codec.CodeCoordinatorNotAvailable)
		return
	}
	var todo []string
	for _, g := range w.offsets.Groups() {
		if int32(topology.GroupShard(g)) != shard {
			continue
		}
		for _, pid := range w.offsets.PendingProducers(g) {
			if pid == producerID {
				todo = append(todo, g)
				break
			}
		}
	}
	if len(todo) == 0 {
		done(codec.CodeNone)
		return
	}
	var left atomic.Int32
	var worst atomic.Int32 // the first non-NONE code
	left.Store(int32(len(todo)))
	for _, g := range todo {
		w.groups.CompleteTxnOffsets(g, producerID, commit, func(err error) {
			if err != nil {
				code := codec.CodeKafkaStorageError
				if errors.Is(err, group.ErrNotRunning) {
					code = codec.CodeNotLeaderForPartition // the shard left this broker
				}
				w.log.Warn("cannot complete transactional offsets for a remote coordinator", zap.String("group", g),
					zap.Int32("shard", shard), zap.Int64("producerId", producerID), zap.Error(err))
				worst.CompareAndSwap(0, int32(code))
			}
			if left.Add(-1) == 0 {
				done(int16(worst.Load()))
			}
		})
	}
}

// publishable is Rule P for the answers of WriteTxnMarkers.
func (w *MarkerWriter) publishable() bool { return w == nil || w.publish == nil || w.publish() }

// groupCompleter adapts the group coordinator to txn.GroupCompleter (the producer epoch is not
// needed locally: the group's staged offsets are keyed by producer id).
type groupCompleter struct{ g *group.Coordinator }

func (a groupCompleter) CompleteTxnOffsets(grp string, producerID int64, _ int16, commit bool, done func(error)) {
	a.g.CompleteTxnOffsets(grp, producerID, commit, done)
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
// restart lost the in-memory fence). Stopped by Close.
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
	for _, t := range w.store.Topics() {
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

// ---------------------------------------------------------------------------------------------
// Per-partition marker queue: back-to-back appends sharing one Sync.

type markerItem struct {
	pid              int64
	epoch            int16
	commit           bool
	coordinatorEpoch int32
	prepareSeq       uint64           // the coordinator's prepare sequence (0: not given)
	done             func(code int16) // NONE once durable; called once
}

// markerJob is one marker for one partition, queued on markerQueue.
type markerJob struct {
	p  *storage.Partition
	it markerItem
}

// markerQueue carries every local marker (the coordinator's sagas and clients' WriteTxnMarkers)
// to one drainer, which exists only while markers are queued. It takes everything queued at once,
// appends each partition's markers back to back and covers them with one Sync per partition: the
// markers of transactions finishing together share one append run and one fsync per partition,
// Apache's per-leader WriteTxnMarkers batching seen from the leader's side. Appends are page-cache
// writes (the fsyncs run asynchronously in storage), so one drainer for all partitions keeps up.
// Push, not TryPush: a marker is a continuation of work already admitted (a prepared transaction
// or a WriteTxnMarkers request that passed the connection's in-flight bound) and must not be
// dropped; the queue is bounded by those.
var markerQueue = mailbox.New(mailbox.Config[markerJob]{Name: "txn_markers", Batch: true}, writeMarkerBatch)

// enqueueMarker queues a marker for p; done runs once it is durable (or failed).
func enqueueMarker(p *storage.Partition, it markerItem) {
	markerQueue.Push(markerJob{p: p, it: it})
}

func writeMarkerBatch(batch []markerJob) {
	// Group by partition in first-seen order, keeping each partition's markers in queue order.
	var order []*storage.Partition
	per := make(map[*storage.Partition][]markerItem, 4)
	for _, j := range batch {
		if _, ok := per[j.p]; !ok {
			order = append(order, j.p)
		}
		per[j.p] = append(per[j.p], j.it)
	}
	now := time.Now().UnixMilli()
	for _, p := range order {
		end := int64(-1)
		var written []markerItem
		for _, it := range per[p] {
			res := p.AppendMarkerSeq(it.pid, it.epoch, it.commit, it.coordinatorEpoch, it.prepareSeq, now)
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
		p.Sync(end, func(err error) {
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
