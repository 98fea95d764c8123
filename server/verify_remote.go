package server

// KIP-890 verification with a transaction coordinator on another broker (cluster mode; design
// cluster.md §5). Apache 3.6+'s AddPartitionsToTxnManager is the model:
//
//   - the partition leader queues one entry per transactional id and coordinator broker, and
//     sends each coordinator one AddPartitionsToTxn (the broker form, v4+: Transactions[]) at a
//     time; whatever is queued while it is in flight goes in the next one, so the batch grows
//     with the load and a quiet broker sends at once;
//   - an entry is VerifyOnly=true for Produce <= v11 (TV1: the partition must already be in the
//     transaction) and VerifyOnly=false for Produce v12 (TV2: the coordinator adds it, the
//     implicit add). The request is sent at the highest version both brokers serve (v5), as
//     Apache's AddPartitionsToTxnRequest.Builder.forBroker does for both kinds, so a missing
//     partition is answered TRANSACTION_ABORTABLE and the leader downgrades it for old clients
//     (translateVerifyError) — the same codes the local coordinator gives;
//   - a second entry for a queued transactional id: a higher epoch fences the queued one
//     (INVALID_PRODUCER_EPOCH), a lower one is refused the same way at once, and an equal one
//     (same producer, same kind) is merged into it (Apache answers the queued one
//     NETWORK_EXCEPTION and keeps the newer, which costs the producer a retry for nothing);
//   - no connection, a timeout or a closed client → NETWORK_EXCEPTION for every entry of the
//     request (Apache: wasDisconnected || wasTimedOut); a coordinator the topology cannot place
//     → COORDINATOR_NOT_AVAILABLE (Apache's getTransactionCoordinator); a top-level error (the
//     coordinator refused CLUSTER_ACTION) → that code for every entry; translateVerifyError then
//     maps each code for the producer (47, 48, 19, ...).
//
// State per coordinator broker:
//
//	        enqueue                 send (one request)              response / failure
//	 idle ──────────► queued ─────────────────────────► in flight ──────────────────────► idle
//	                    ▲   (entries taken, queue empty)     │ enqueue meanwhile: queued again,
//	                    └────────────────────────────────────┘ sent as soon as the answer is in
//
// Nothing here blocks an event loop or a connection executor: the request runs on its own
// goroutine, the callbacks only record codes (verifyAll then appends on a fresh goroutine).
//
// Lock order: remoteVerifier.mu, then nothing (InterBroker.mu is taken only outside it).

import (
	"context"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/txn"
)

// maxQueuedVerifications bounds the transactions queued for one coordinator broker while its
// request is in flight; beyond it a verification answers COORDINATOR_NOT_AVAILABLE (retriable:
// the producer sees NOT_ENOUGH_REPLICAS and retries).
const maxQueuedVerifications = 4096

var (
	mVerifyRemoteRequests = metrics.NewCounter(`kaas_txn_verify_remote_requests_total`)
	mVerifyRemoteTxns     = metrics.NewCounter(`kaas_txn_verify_remote_transactions_total`)
	mVerifyRemoteFailed   = metrics.NewCounter(`kaas_txn_verify_remote_request_failures_total`)
	mVerifyRemoteFull     = metrics.NewCounter(`kaas_txn_verify_remote_queue_full_total`)
	mVerifyRemoteFenced   = metrics.NewCounter(`kaas_txn_verify_remote_superseded_total`)
	mVerifyRemoteTime     = metrics.NewHistogram(`kaas_txn_verify_remote_duration_seconds`)
)

// remoteVerification is one transaction's entry: the partitions to verify (or add) and the
// callback that gets one coordinator code per partition, in the order of tps, untranslated.
type remoteVerification struct {
	tid        string
	pid        int64
	epoch      int16
	verifyOnly bool
	tps        []txn.TopicPartitions
	done       []func(codes []int16) // one per merged caller, each with its own slice of tps
	spans      []int                 // spans[i] = how many partitions of tps belong to done[i]
}

func (v *remoteVerification) finish(code func(k int) int16) {
	k := 0
	for i, cb := range v.done {
		codes := make([]int16, v.spans[i])
		for j := range codes {
			codes[j] = code(k)
			k++
		}
		cb(codes)
	}
}

func (v *remoteVerification) finishAll(code int16) { v.finish(func(int) int16 { return code }) }

// coordQueue is the state of one coordinator broker.
type coordQueue struct {
	queued   map[string]*remoteVerification // by transactional id
	order    []string                       // queue order of queued
	inflight bool
}

// remoteVerifier is the leader's side of remote verification, one per Server.
type remoteVerifier struct {
	s      *Server
	mu     sync.Mutex
	queues map[int32]*coordQueue
}

// verify queues the verification of tps (each one partition) for (tid, pid, epoch) with the
// coordinator on broker coord; done gets one untranslated code per entry of tps.
func (rv *remoteVerifier) verify(coord int32, tid string, pid int64, epoch int16, verifyOnly bool,
	tps []txn.TopicPartitions, done func(codes []int16)) {
	n := 0
	for _, tp := range tps {
		n += len(tp.Partitions)
	}
	entry := &remoteVerification{tid: tid, pid: pid, epoch: epoch, verifyOnly: verifyOnly,
		tps: tps, done: []func([]int16){done}, spans: []int{n}}
	rv.mu.Lock()
	if rv.queues == nil {
		rv.queues = map[int32]*coordQueue{}
	}
	q := rv.queues[coord]
	if q == nil {
		q = &coordQueue{queued: map[string]*remoteVerification{}}
		rv.queues[coord] = q
	}
	var refuse, fenced *remoteVerification
	refuseCode := codec.CodeNone
	switch old := q.queued[tid]; {
	case old == nil:
		if len(q.queued) >= maxQueuedVerifications {
			mVerifyRemoteFull.Inc()
			refuse, refuseCode = entry, codec.CodeCoordinatorNotAvailable
			break
		}
		q.queued[tid] = entry
		q.order = append(q.order, tid)
	case old.epoch > epoch:
		mVerifyRemoteFenced.Inc()
		refuse, refuseCode = entry, codec.CodeInvalidProducerEpoch
	case old.epoch < epoch || old.pid != pid || old.verifyOnly != verifyOnly:
		mVerifyRemoteFenced.Inc()
		fenced = old
		q.queued[tid] = entry // keeps old's place in order
		if old.epoch == epoch {
			refuseCode = codec.CodeNetworkException // Apache: the client is retrying; retriable
		} else {
			refuseCode = codec.CodeInvalidProducerEpoch
		}
	default:
		old.tps = append(old.tps, tps...)
		old.done = append(old.done, done)
		old.spans = append(old.spans, n)
	}
	send := !q.inflight && refuse == nil
	var batch []*remoteVerification
	if send {
		batch = q.takeLocked()
	}
	rv.mu.Unlock()
	switch {
	case refuse != nil:
		refuse.finishAll(refuseCode)
	case fenced != nil:
		fenced.finishAll(refuseCode)
	}
	if len(batch) > 0 {
		go rv.send(coord, batch)
	}
}

// takeLocked empties the queue into a batch and marks the coordinator in flight.
func (q *coordQueue) takeLocked() []*remoteVerification {
	if len(q.queued) == 0 {
		return nil
	}
	batch := make([]*remoteVerification, 0, len(q.queued))
	for _, tid := range q.order {
		if v := q.queued[tid]; v != nil {
			batch = append(batch, v)
			delete(q.queued, tid)
		}
	}
	q.order = q.order[:0]
	q.inflight = true
	return batch
}

// send sends one batch to coord, answers it, and sends whatever was queued meanwhile.
func (rv *remoteVerifier) send(coord int32, batch []*remoteVerification) {
	for len(batch) > 0 {
		rv.sendOne(coord, batch)
		rv.mu.Lock()
		q := rv.queues[coord]
		q.inflight = false
		batch = q.takeLocked()
		if len(batch) == 0 && len(q.queued) == 0 {
			delete(rv.queues, coord)
		}
		rv.mu.Unlock()
	}
}

func (rv *remoteVerifier) sendOne(coord int32, batch []*remoteVerification) {
	start := time.Now()
	defer mVerifyRemoteTime.UpdateDuration(start)
	mVerifyRemoteRequests.Inc()
	mVerifyRemoteTxns.Add(len(batch))
	b, err := rv.s.peers.Broker(coord)
	if err != nil {
		// The topology has no address for the coordinator (it just left): Apache's answer for a
		// coordinator it cannot place.
		mVerifyRemoteFailed.Inc()
		for _, v := range batch {
			v.finishAll(codec.CodeCoordinatorNotAvailable)
		}
		return
	}
	req := kmsg.NewPtrAddPartitionsToTxnRequest()
	for _, v := range batch {
		t := kmsg.NewAddPartitionsToTxnRequestTransaction()
		t.TransactionalID, t.ProducerID, t.ProducerEpoch, t.VerifyOnly = v.tid, v.pid, v.epoch, v.verifyOnly
		byTopic := map[string]int{}
		for _, tp := range v.tps {
			i, ok := byTopic[tp.Topic]
			if !ok {
				i = len(t.Topics)
				byTopic[tp.Topic] = i
				rt := kmsg.NewAddPartitionsToTxnRequestTransactionTopic()
				rt.Topic = tp.Topic
				t.Topics = append(t.Topics, rt)
			}
			t.Topics[i].Partitions = append(t.Topics[i].Partitions, tp.Partitions...)
		}
		req.Transactions = append(req.Transactions, t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerRequestTimeout)
	kresp, err := b.Request(ctx, req)
	cancel()
	if err != nil {
		mVerifyRemoteFailed.Inc()
		for _, v := range batch {
			v.finishAll(codec.CodeNetworkException)
		}
		return
	}
	resp := kresp.(*kmsg.AddPartitionsToTxnResponse)
	rv.s.peers.noteClusterAuthz("AddPartitionsToTxn", coord, resp.ErrorCode)
	if resp.ErrorCode != codec.CodeNone {
		for _, v := range batch {
			v.finishAll(resp.ErrorCode)
		}
		return
	}
	type tpKey struct {
		topic string
		part  int32
	}
	results := make(map[string]map[tpKey]int16, len(resp.Transactions))
	for _, rt := range resp.Transactions {
		m := map[tpKey]int16{}
		for _, t := range rt.Topics {
			for _, p := range t.Partitions {
				m[tpKey{t.Topic, p.Partition}] = p.ErrorCode
			}
		}
		results[rt.TransactionalID] = m
	}
	for _, v := range batch {
		m := results[v.tid]
		flat := make([]int16, 0, len(v.tps))
		for _, tp := range v.tps {
			for _, p := range tp.Partitions {
				code, ok := m[tpKey{tp.Topic, p}]
				if !ok {
					// Every kaas coordinator answers each partition it was asked; a missing
					// one is not taken for a yes (Apache would).
					code = codec.CodeUnknownServerError
				}
				flat = append(flat, code)
			}
		}
		v.finish(func(k int) int16 { return flat[k] })
	}
}
