package txn

// The commit saga: everything that happens between "Prepare* is durable" and the answer to
// EndTxn, and the same tail for the reaper's aborts, InitProducerId's fence-and-abort and the
// re-drive of prepared transactions found when a slot is loaded. It runs entirely in this
// package; partitions and groups are reached only through PartitionWriter and GroupCompleter,
// whose local implementations live in the server wiring and whose remote ones are the cluster
// RPCs (WriteTxnMarkers to a partition leader, completion at a remote group coordinator).
//
//	 EndTxn / reaper abort / rejoin abort / re-drive (reaper, retried EndTxn) / slot load
//	       │ worker batch: Prepare* durable in the journal, entry.pending = true
//	       │ (pending is THE record that a dispatch is in flight: nothing else keeps one)
//	       ▼
//	 worker outbox ── every saga started by one batch is dispatched together ──┐
//	       │                                                                   │
//	       ▼ PartitionWriter.Fence(all fences of the batch)                    │
//	 old epochs rejected on the partitions ──► InitProducerId answered here    │
//	       │                                                                   │
//	       ▼ PartitionWriter.WriteMarkers(all markers of the batch, grouped per partition)
//	 per marker: NONE │ UNKNOWN_TOPIC_OR_PARTITION (deleted topic: that marker is dropped)
//	             │    │ anything else ──► markersFailed: pending = false, the entry stays
//	             │    │                   Prepare* (reaper tick or client retry re-drives;
//	             │    │                   a retry while pending answers 51); EndTxn ← 15
//	             │    │ 52 (cluster) ───► as above, and the slot is stale: unloaded (staleSlot)
//	             │    EndTxnMarkerWait passed first: EndTxn ← 15 at once, the saga goes on
//	             ▼
//	 GroupCompleter.CompleteTxnOffsets(each group of the transaction)   (durable; error → as above)
//	       │
//	       ▼ worker op complete: Prepare* → Complete* durable (journal)     (error → as above)
//	       │
//	       ▼
//	 EndTxn ← NONE (+ next producer id / epoch for v5)
//
// Crash safety: Prepare* is durable before any marker is written, and Complete* is written only
// after every marker and every group completion is durable, so a crash anywhere in between leaves
// a Prepare* entry that the next load re-drives. A second marker for an ended transaction closes
// nothing and CompleteTxnOffsets is idempotent, so redoing the tail is safe. Groups are completed
// BEFORE Complete*: the other order could lose an EOS offset commit if the broker crashed between
// the two (Complete* has no group list left to redo).
//
// Batching: one worker batch yields one Fence call and one WriteMarkers call for every saga it
// started, and the Complete ops of sagas whose markers landed together are queued together and
// share one journal fdatasync. A PartitionWriter is expected to share one append and one sync per
// partition among the markers it receives (the local one queues per partition; the remote one
// sends one WriteTxnMarkers per leader, like Apache's TransactionMarkerChannelManager).

import (
	"cmp"
	"slices"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
)

var (
	mSagas          = metrics.NewCounter("kaas_txn_marker_dispatches_total")
	mSagaFailures   = metrics.NewCounter("kaas_txn_marker_dispatch_failures_total")
	mMarkersDropped = metrics.NewCounter("kaas_txn_markers_skipped_total") // deleted topic / partition
	mFenceFailures  = metrics.NewCounter("kaas_txn_fence_failures_total")
	// EndTxn answered 15 because its markers were not done within EndTxnMarkerWait.
	mEndTxnWaitExpired = metrics.NewCounter("kaas_txn_endtxn_marker_wait_expired_total")
)

// DefaultEndTxnMarkerWait is Config.EndTxnMarkerWait's default (design/cluster.md §4).
const DefaultEndTxnMarkerWait = 20 * time.Second

// MarkerRequest is one COMMIT/ABORT control batch to write on one partition.
type MarkerRequest struct {
	TransactionalID  string // for logs only
	Topic            string
	Partition        int32
	ProducerID       int64
	ProducerEpoch    int16
	Commit           bool
	CoordinatorEpoch int32
	TxnVersion       int8
	// PrepareSeq identifies the prepared transaction the marker ends: the journal sequence of the
	// record that made the entry Prepare* (Entry.PrepareSeq; 0 if unknown). A leader that has
	// already written the marker of (ProducerID, ProducerEpoch, PrepareSeq) answers a resend NONE
	// without writing it again, even after the producer's next transaction (same epoch under TV1)
	// has started on the partition.
	PrepareSeq uint64
}

// MarkerResult is the outcome of one MarkerRequest: NONE once the marker is durable;
// UNKNOWN_TOPIC_OR_PARTITION when the partition no longer exists (the marker is dropped, as
// Apache drops markers for deleted partitions: the data it would close is gone with the log);
// any other code fails the transaction's dispatch, which is re-driven later.
type MarkerResult struct {
	Code int16
}

// FenceRequest raises ProducerID's epoch floor to Epoch on the partitions where that producer
// has state (Partitions names those of the transaction, for a writer that has to route by
// partition; the local writer fences every partition that knows the producer).
type FenceRequest struct {
	ProducerID int64
	Epoch      int16
	Partitions []TopicPartitions
}

// PartitionWriter writes markers and fences on partition leaders. The local implementation
// appends to the in-process storage; a remote one sends WriteTxnMarkers to the leader. Both
// calls are asynchronous and may call done on any goroutine, exactly once; done must not block.
type PartitionWriter interface {
	// Fence applies every fence of the batch. An error is logged and counted: the markers that
	// follow carry the new epoch and fence the partitions they land on anyway.
	Fence(batch []FenceRequest, done func(error))
	// WriteMarkers writes every marker of the batch (sorted by topic and partition, markers of
	// many transactions together) and reports one result per request, in request order.
	WriteMarkers(batch []MarkerRequest, done func([]MarkerResult))
}

// GroupCompleter commits (commit) or discards the offsets a transaction staged for a group,
// durably, and calls done exactly once (any goroutine, must not block). It must be idempotent:
// a re-driven saga completes the same groups again.
type GroupCompleter interface {
	CompleteTxnOffsets(group string, producerID int64, producerEpoch int16, commit bool, done func(error))
}

// saga is one transaction's tail in flight. Created and dispatched on the worker goroutine
// that owns its slot; the callbacks of the writer and completer move it along on theirs.
// Its durable state is the entry itself: Prepare* plus the in-memory pending flag, the one record
// that a dispatch is in flight.
type saga struct {
	act Action
	// fenced, if set, runs once the fence is applied (InitProducerId answers then), or with
	// ErrPublishFenced if Rule P refused the dispatch.
	fenced func(error)
	// done, if set, gets NONE once Complete* is durable, or COORDINATOR_NOT_AVAILABLE if the
	// dispatch failed (the entry stays prepared and is re-driven).
	done   func(code int16)
	failed bool // set by the WriteMarkers callback only (one callback per batch)
}

// startSaga queues a's follow-up work in w's outbox; dispatchOutbox sends it at the end of
// the batch. Must run on w's goroutine (every op callback does).
func (w *worker) startSaga(a Action, fenced func(error), done func(int16)) {
	if a.IsZero() {
		if fenced != nil {
			fenced(nil)
		}
		if done != nil {
			done(codec.CodeNone)
		}
		return
	}
	if m := a.Markers; m != nil {
		m.PrepareSeq = w.prepareSeq(m)
	}
	w.outbox = append(w.outbox, &saga{act: a, fenced: fenced, done: done})
}

// prepareSeq is the PrepareSeq of the prepared entry m ends, read on the worker after the
// batch that prepared it was journaled (the sequence is assigned by the journal append); 0 when
// the entry is not that prepared transaction any more.
func (w *worker) prepareSeq(m *Markers) uint64 {
	ss := w.slots[SlotFor(m.TransactionalID)]
	if ss == nil {
		return 0
	}
	e := ss.entries[m.TransactionalID]
	if e == nil || !e.State.IsPrepare() || (e.State == PrepareCommit) != m.Commit ||
		e.ProducerID != m.ProducerID || e.ProducerEpoch != m.ProducerEpoch {
		return 0
	}
	return e.PrepareSeq
}

// boundedWait wraps an EndTxn waiter so that it runs exactly once: with the saga's own answer,
// or with COORDINATOR_NOT_AVAILABLE once Config.EndTxnMarkerWait has passed (design/cluster.md §4:
// markers not done after 20 s → EndTxn answers 15 and the sending goes on). The saga itself is
// untouched: its entry keeps the pending flag, so the retry answers 51 until Complete* (see
// Config.EndTxnMarkerWait), and its late answer is dropped here. One runtime timer per waiting
// EndTxn, stopped when the saga answers, so a completed saga leaves no timer behind (cost:
// BenchmarkEndTxnBoundedWait). A timer that fires after Close answers nothing: the coordinator
// is gone (its writer answers the sagas it still held when it closed), and so is the server the
// waiter would answer through.
func (c *Coordinator) boundedWait(tid string, done func(code int16)) func(code int16) {
	var answered atomic.Bool
	t := time.AfterFunc(c.cfg.EndTxnMarkerWait, func() {
		if c.running.Load() && answered.CompareAndSwap(false, true) {
			mEndTxnWaitExpired.Inc()
			c.log.Warn("transaction markers not done in time; EndTxn answers COORDINATOR_NOT_AVAILABLE and the markers are still being written",
				zap.String("transactionalId", tid), zap.Duration("waited", c.cfg.EndTxnMarkerWait))
			done(codec.CodeCoordinatorNotAvailable)
		}
	})
	return func(code int16) {
		if answered.CompareAndSwap(false, true) {
			t.Stop()
			done(code)
		}
	}
}

// dispatchOutbox sends the fences and then the markers of every saga started since the last
// dispatch, in one call each.
func (w *worker) dispatchOutbox() {
	if len(w.outbox) == 0 {
		return
	}
	sagas := w.outbox
	w.outbox = nil
	c := w.c
	if !c.publishable() {
		c.refuseSagas(sagas)
		return
	}
	var fences []FenceRequest
	for _, s := range sagas {
		if s.act.Markers != nil {
			mSagas.Inc()
		}
		if f := s.act.Fence; f != nil {
			fr := FenceRequest{ProducerID: f.ProducerID, Epoch: f.NewEpoch}
			if s.act.Markers != nil {
				fr.Partitions = s.act.Markers.Partitions
			}
			fences = append(fences, fr)
		}
	}
	if len(fences) == 0 {
		c.writeMarkers(sagas)
		return
	}
	c.cfg.Partitions.Fence(fences, func(err error) {
		if err != nil {
			mFenceFailures.Inc()
			c.log.Warn("cannot fence producer epochs; the markers fence the partitions they reach", zap.Error(err))
		}
		c.writeMarkers(sagas)
	})
}

// writeMarkers runs once the sagas' fences are applied: one WriteMarkers call for every marker
// of the batch, grouped per partition (stable, so one transaction's markers keep their order).
func (c *Coordinator) writeMarkers(sagas []*saga) {
	var (
		sorted      []MarkerRequest
		sortedOwner []*saga
		none        []*saga // offsets-only or empty transactions: no marker, still completed
	)
	if !c.publishable() {
		c.refuseSagas(sagas)
		return
	}
	for _, s := range sagas {
		if s.fenced != nil {
			s.fenced(nil)
		}
		m := s.act.Markers
		switch {
		case m == nil:
			c.sagaEnd(s, codec.CodeNone)
			continue
		case len(m.Partitions) == 0:
			none = append(none, s)
			continue
		}
		for _, tp := range m.Partitions {
			for _, p := range tp.Partitions {
				sorted = append(sorted, MarkerRequest{TransactionalID: m.TransactionalID, Topic: tp.Topic, Partition: p,
					ProducerID: m.ProducerID, ProducerEpoch: m.ProducerEpoch, Commit: m.Commit,
					CoordinatorEpoch: m.CoordinatorEpoch, TxnVersion: m.TxnVersion, PrepareSeq: m.PrepareSeq})
				sortedOwner = append(sortedOwner, s)
			}
		}
	}
	if len(sorted) > 1 {
		idx := make([]int, len(sorted))
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			if r := cmp.Compare(sorted[a].Topic, sorted[b].Topic); r != 0 {
				return r
			}
			return cmp.Compare(sorted[a].Partition, sorted[b].Partition)
		})
		reqs, owners := make([]MarkerRequest, len(idx)), make([]*saga, len(idx))
		for k, i := range idx {
			reqs[k], owners[k] = sorted[i], sortedOwner[i]
		}
		sorted, sortedOwner = reqs, owners
	}
	for _, s := range none {
		c.completeGroups(s)
	}
	if len(sorted) == 0 {
		return
	}
	c.cfg.Partitions.WriteMarkers(sorted, func(res []MarkerResult) {
		for k, r := range sorted {
			code := codec.CodeNotCoordinator // a writer that answered short: treat as failed
			if k < len(res) {
				code = res[k].Code
			}
			switch code {
			case codec.CodeNone:
			case codec.CodeUnknownTopicOrPartition:
				mMarkersDropped.Inc()
				c.log.Info("dropping transaction marker for unknown partition", zap.String("transactionalId", r.TransactionalID),
					zap.String("topic", r.Topic), zap.Int32("partition", r.Partition))
			default:
				if code == codec.CodeTransactionCoordinatorFenced {
					// A newer coordinator of the slot wrote on that partition: stop serving it.
					c.staleSlot(SlotFor(r.TransactionalID), r.CoordinatorEpoch)
				}
				if s := sortedOwner[k]; !s.failed {
					s.failed = true
					c.log.Warn("transaction marker write failed; the transaction stays prepared and is re-driven",
						zap.String("transactionalId", r.TransactionalID), zap.String("topic", r.Topic),
						zap.Int32("partition", r.Partition), zap.Int64("producerId", r.ProducerID), zap.Int16("code", code))
				}
			}
		}
		// Each saga once, in batch order.
		seen := make(map[*saga]struct{}, len(sagas))
		for _, s := range sortedOwner {
			if _, ok := seen[s]; ok {
				continue
			}
			seen[s] = struct{}{}
			if s.failed {
				c.sagaFail(s)
				continue
			}
			c.completeGroups(s)
		}
	})
}

// completeGroups commits (or discards) the staged offsets of every group of the transaction,
// durably, before the coordinator records the completion.
func (c *Coordinator) completeGroups(s *saga) {
	m := s.act.Markers
	if len(m.Groups) == 0 || c.cfg.Groups == nil {
		c.completeSaga(s)
		return
	}
	var left atomic.Int32
	var failed atomic.Bool
	left.Store(int32(len(m.Groups)))
	for _, g := range m.Groups {
		c.cfg.Groups.CompleteTxnOffsets(g, m.ProducerID, m.ProducerEpoch, m.Commit, func(err error) {
			if err != nil {
				failed.Store(true)
				c.log.Warn("cannot complete transactional offsets; the transaction stays prepared and is re-driven",
					zap.String("group", g), zap.String("transactionalId", m.TransactionalID), zap.Error(err))
			}
			if left.Add(-1) != 0 {
				return
			}
			if failed.Load() {
				c.sagaFail(s)
				return
			}
			c.completeSaga(s)
		})
	}
}

// completeSaga records Complete* durably and answers the waiter.
func (c *Coordinator) completeSaga(s *saga) {
	m := s.act.Markers
	c.complete(CompleteParams{TransactionalID: m.TransactionalID, ProducerID: m.ProducerID,
		ProducerEpoch: m.ProducerEpoch, Commit: m.Commit}, func(res CompleteResult, err error) {
		switch {
		case err != nil:
			// Not persisted: the entry is still prepared with pending set; release it so the
			// markers are re-driven (they are idempotent).
			c.log.Warn("cannot complete transaction", zap.String("transactionalId", m.TransactionalID), zap.Error(err))
			c.sagaFail(s)
		case res.Code != codec.CodeNone:
			// The entry moved on (a stale or duplicate dispatch): nothing to complete.
			c.log.Warn("transaction completion did not match the prepared transaction",
				zap.String("transactionalId", m.TransactionalID), zap.Int64("producerId", m.ProducerID),
				zap.Int16("producerEpoch", m.ProducerEpoch), zap.Int16("code", res.Code))
			c.sagaEnd(s, codec.CodeCoordinatorNotAvailable)
		default:
			c.sagaEnd(s, codec.CodeNone)
		}
	})
}

// sagaFail releases the in-flight flag so the reaper (or a retried EndTxn) re-drives the
// markers, then tells the waiter to retry.
func (c *Coordinator) sagaFail(s *saga) {
	mSagaFailures.Inc()
	c.markersFailed(s.act.Markers, func(error) { c.sagaEnd(s, codec.CodeCoordinatorNotAvailable) })
}

// refuseSagas is Rule P for marker dispatch (cluster.md §3: "Rule P covers every answer and
// every marker dispatch"): past the lease deadline nothing is sent, and the waiters answer
// NOT_COORDINATOR. The entries stay Prepare* on disk; the slot's successor re-drives them.
func (c *Coordinator) refuseSagas(sagas []*saga) {
	for _, s := range sagas {
		if s.fenced != nil {
			s.fenced(ErrPublishFenced)
		}
		c.sagaEnd(s, codec.CodeNotCoordinator)
	}
}

// sagaEnd answers the waiter.
func (c *Coordinator) sagaEnd(s *saga, code int16) {
	if s.done != nil {
		s.done(code)
	}
}
