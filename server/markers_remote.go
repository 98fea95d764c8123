package server

// The cluster marker writer (design/cluster.md §4, §6): txn.PartitionWriter and
// txn.GroupCompleter for a broker whose transactions touch partitions led by, and group shards
// owned by, other brokers. Markers for what this broker owns go through the local writer
// (markers.go); everything else goes to the owner as WriteTxnMarkers, with ONE request in flight
// per destination broker. Markers queued while a request is out ride in the next one, so the
// markers of every transaction finishing meanwhile share a request per leader (Apache's
// TransactionMarkerChannelManager drains its per-broker queue the same way).
//
//	WriteMarkers / CompleteTxnOffsets
//	     │ one markerJob per (partition | group shard)
//	     ▼
//	 route ── owner Local ──► local writer (partition) / group coordinator (shard) ──┐
//	   │  ├─ topic gone ───► UNKNOWN_TOPIC_OR_PARTITION (the saga drops that marker)  │
//	   │  ├─ no owner yet ─► retry ◄──────────────────────────────────────────────┐   │
//	   │  └─ remote owner ─► peer queue ──► one WriteTxnMarkers in flight ──┐     │   │
//	   │                                                                     ▼     │   ▼
//	   │                                                                  settle(code)
//	   │      NONE / 3 ─────────────────────────────────────────────────► done
//	   │      6, 14, 15, 16, 56, timeout, connection error ──────────────► retry
//	   │      52 (stale coordinator), 47, anything else ─────────────────► done (the saga fails
//	   │                                                                   and the entry stays prepared)
//	   ▲
//	 retry: poll the topology with backoff; resend as soon as the owner (broker, epoch) changes,
//	        or when the backoff ends (a remote owner still loading answers 6 at the same epoch)
//
// A marker leaves only on success, on its topic's deletion, or with a code no resend can change.
// Resends are safe: a marker for a transaction the partition has already closed is not written
// again (storage.Partition.AppendMarker), nor is a late copy once the producer's next transaction
// has started there, since each marker carries its prepare's sequence (tagMarkerPrepareSeq,
// AppendMarkerSeq), and completing a group's staged offsets twice commits nothing the second time.
//
// Lock order: ClusterMarkerWriter.mu and markerPeer.mu are leaves (never held together), and
// neither is held while calling out (local writer, group coordinator, kgo, done callbacks).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

var (
	mMarkerRetries      = metrics.NewCounter("kaas_txn_marker_retries_total")
	mMarkerRequestSplit = metrics.NewCounter("kaas_txn_marker_request_full_total") // a request hit markerRequestMax
	mMarkerFailed       = metrics.NewCounter("kaas_txn_marker_remote_failures_total")
)

const (
	// markerRequestMax bounds the partitions one WriteTxnMarkers carries; the rest waits for the
	// next request to the same broker.
	markerRequestMax = 2000
	// markerRequestTimeout bounds one WriteTxnMarkers round trip (the leader answers after its
	// fsync); a request that outlives it is resent.
	markerRequestTimeout = 10 * time.Second
	markerRetryMin       = 25 * time.Millisecond
	markerRetryMax       = time.Second
	// markerPoll is how often a marker waiting for a new owner looks at the topology.
	markerPoll = 20 * time.Millisecond
)

// markerJob is one marker on its way: a partition's COMMIT/ABORT, or the completion of a
// producer's staged offsets in one group shard (Topic __consumer_offsets, Partition = shard).
type remoteMarker struct {
	req txn.MarkerRequest
	// group is set for a shard completion asked for one group: served locally, only that group
	// is completed; remotely, the owner completes every staging of the producer in the shard
	// (the wire names only the shard, as in Apache).
	group   string
	done    func(code int16)
	backoff time.Duration
}

// ClusterMarkerWriter is the txn.PartitionWriter (and, through Groups, the txn.GroupCompleter) of
// a cluster broker.
type ClusterMarkerWriter struct {
	local  *MarkerWriter
	groups txn.GroupCompleter // local group completion
	topo   topology.Topology
	store  *storage.Store
	peers  *InterBroker // the broker's inter-broker clients (peer_clients.go); not closed here
	log    *zap.Logger

	mu      sync.Mutex
	queues  map[int32]*markerPeer // by destination broker
	parked  []parkedMarker        // waiting to be routed again (retry)
	polling bool                  // pollParked is running
	closed  bool
	stop    chan struct{}
}

var _ txn.PartitionWriter = (*ClusterMarkerWriter)(nil)

// NewClusterMarkerWriter builds the cluster writer over the local writer and local group
// completion. peers are the broker's inter-broker clients (their owner closes them): the writer
// keeps only its per-destination queues.
func NewClusterMarkerWriter(local *MarkerWriter, groups txn.GroupCompleter, topo topology.Topology, peers *InterBroker,
	log *zap.Logger) *ClusterMarkerWriter {
	if log == nil {
		log = zap.NewNop()
	}
	return &ClusterMarkerWriter{local: local, groups: groups, topo: topo, store: local.store, peers: peers,
		log: log, queues: map[int32]*markerPeer{}, stop: make(chan struct{})}
}

// Close fails every queued and waiting marker with COORDINATOR_NOT_AVAILABLE (the saga leaves
// their transactions prepared; the slot's next owner re-drives them). The clients are the
// broker's (InterBroker), closed by it afterwards.
func (w *ClusterMarkerWriter) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.stop)
	queues := w.queues
	w.queues = map[int32]*markerPeer{}
	w.mu.Unlock()
	for _, p := range queues {
		p.close()
	}
}

// Fence is txn.PartitionWriter.Fence. Locally the store raises the producer's epoch floor on
// every partition that knows it. A remote partition needs no separate fence message: the ABORT
// markers at the bumped epoch that follow (design §5: every epoch bump of an Ongoing transaction
// writes them to all of its partitions) raise the epoch where they land, and a partition the
// transaction never reached verifies a first write of the old epoch with the coordinator, which
// refuses it. So the remote half of a fence is the marker path itself.
func (w *ClusterMarkerWriter) Fence(batch []txn.FenceRequest, done func(error)) {
	w.local.Fence(batch, done)
}

// WriteMarkers is txn.PartitionWriter.WriteMarkers.
func (w *ClusterMarkerWriter) WriteMarkers(batch []txn.MarkerRequest, done func([]txn.MarkerResult)) {
	if len(batch) == 0 {
		done(nil)
		return
	}
	if h := w.local.testHooks.Load(); h != nil && h.dispatch != nil && !h.dispatch(batch) {
		return
	}
	res := make([]txn.MarkerResult, len(batch))
	var left atomic.Int32
	left.Store(int32(len(batch)))
	for i := range batch {
		w.route(&remoteMarker{req: batch[i], done: func(code int16) {
			res[i].Code = code
			if left.Add(-1) == 0 {
				done(res)
			}
		}})
	}
}

// Groups is the txn.GroupCompleter of the cluster: a group whose shard this broker owns is
// completed here, any other one by a WriteTxnMarkers for its __consumer_offsets partition sent
// to the shard's owner (design §6 step 3).
func (w *ClusterMarkerWriter) Groups() txn.GroupCompleter { return clusterGroups{w} }

type clusterGroups struct{ w *ClusterMarkerWriter }

func (g clusterGroups) CompleteTxnOffsets(grp string, producerID int64, producerEpoch int16, commit bool, done func(error)) {
	shard := int32(topology.GroupShard(grp))
	g.w.route(&remoteMarker{group: grp, req: txn.MarkerRequest{Topic: topology.GroupsTopic, Partition: shard,
		ProducerID: producerID, ProducerEpoch: producerEpoch, Commit: commit, CoordinatorEpoch: -1},
		done: func(code int16) {
			if h := g.w.local.testHooks.Load(); code == codec.CodeNone && h != nil && h.groupCompleted != nil &&
				!h.groupCompleted(grp, producerID) {
				return
			}
			if code == codec.CodeNone {
				done(nil)
				return
			}
			done(fmt.Errorf("cannot complete transactional offsets (group %s, shard %d, producer %d): error code %d",
				grp, shard, producerID, code))
		}})
}

// route sends m to whoever owns its partition now.
func (w *ClusterMarkerWriter) route(m *remoteMarker) {
	select {
	case <-w.stop:
		m.done(codec.CodeCoordinatorNotAvailable) // closing: the transaction stays prepared
		return
	default:
	}
	o := topology.PartitionOwner(w.topo, m.req.Topic, m.req.Partition)
	switch {
	case o.Local:
		w.writeLocal(m, o)
	case !o.Known:
		if w.deleted(m.req.Topic, m.req.Partition) {
			m.done(codec.CodeUnknownTopicOrPartition)
			return
		}
		w.retry(m, o)
	default:
		p, err := w.peer(o.Broker)
		if err != nil {
			w.log.Warn("cannot reach partition leader for transaction markers; retrying", zap.Int32("broker", o.Broker), zap.Error(err))
			w.retry(m, o)
			return
		}
		p.enqueue(m, o)
	}
}

// deleted reports whether the marker's partition no longer exists (a deleted topic, or a
// partition number the topic does not have). Internal topics always exist.
func (w *ClusterMarkerWriter) deleted(topic string, part int32) bool {
	if _, ok := topology.InternalPartitions(topic); ok {
		return false
	}
	t := w.store.Topic(topic)
	return t == nil || part < 0 || part >= t.NumPartitions()
}

func (w *ClusterMarkerWriter) writeLocal(m *remoteMarker, o topology.Owner) {
	if m.req.Topic == topology.GroupsTopic {
		w.groups.CompleteTxnOffsets(m.group, m.req.ProducerID, m.req.ProducerEpoch, m.req.Commit, func(err error) {
			switch {
			case err == nil:
				w.settle(m, o, codec.CodeNone)
			case errors.Is(err, group.ErrNotRunning):
				w.settle(m, o, codec.CodeNotCoordinator) // the shard moved (or is moving) away
			default:
				w.settle(m, o, codec.CodeKafkaStorageError)
			}
		})
		return
	}
	w.local.WriteMarkers([]txn.MarkerRequest{m.req}, func(res []txn.MarkerResult) {
		code := codec.CodeUnknownServerError
		if len(res) == 1 {
			code = res[0].Code
		}
		w.settle(m, o, code)
	})
}

// settle decides what an answer means for m (see the diagram).
func (w *ClusterMarkerWriter) settle(m *remoteMarker, o topology.Owner, code int16) {
	switch code {
	case codec.CodeNone:
		m.done(codec.CodeNone)
	case codec.CodeUnknownTopicOrPartition:
		if w.deleted(m.req.Topic, m.req.Partition) {
			m.done(code)
			return
		}
		// The leader does not know a topic this broker knows: its view lags (a topic just
		// created); retry.
		w.retry(m, o)
	case codec.CodeNotLeaderForPartition, codec.CodeCoordinatorLoadInProgress, codec.CodeCoordinatorNotAvailable,
		codec.CodeNotCoordinator, codec.CodeKafkaStorageError, codec.CodeRequestTimedOut, codec.CodeLeaderNotAvailable,
		codec.CodeFencedLeaderEpoch, codec.CodeUnknownLeaderEpoch:
		w.retry(m, o)
	default:
		// 52: a newer coordinator of the slot wrote on that partition, this one is stale (the
		// coordinator unloads the slot: txn.Coordinator.staleSlot); 47: the producer moved to a
		// newer epoch. No resend can change either: the saga fails and leaves the entry prepared
		// for whoever owns the slot now.
		mMarkerFailed.Inc()
		w.log.Warn("transaction marker refused", zap.String("topic", m.req.Topic), zap.Int32("partition", m.req.Partition),
			zap.Int64("producerId", m.req.ProducerID), zap.Int16("producerEpoch", m.req.ProducerEpoch),
			zap.Int32("leader", o.Broker), zap.Int16("code", code))
		m.done(code)
	}
}

// retry parks m until the owner of its partition differs from was (broker or epoch), or until
// m's backoff ends, then routes it again. One poller goroutine serves every parked marker (it
// exists only while some are parked), so a leader failure that parks a thousand markers costs
// one ticker, not a thousand. A broker that is closing fails m instead.
func (w *ClusterMarkerWriter) retry(m *remoteMarker, was topology.Owner) {
	mMarkerRetries.Inc()
	m.backoff = min(max(2*m.backoff, markerRetryMin), markerRetryMax)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		m.done(codec.CodeCoordinatorNotAvailable)
		return
	}
	w.parked = append(w.parked, parkedMarker{m: m, was: was, until: time.Now().Add(m.backoff)})
	start := !w.polling
	w.polling = true
	w.mu.Unlock()
	if start {
		go w.pollParked()
	}
}

// parkedMarker is a marker waiting for its partition's owner to change or its backoff to end.
type parkedMarker struct {
	m     *remoteMarker
	was   topology.Owner
	until time.Time
}

// pollParked routes again every parked marker whose owner changed or whose backoff ended, each
// markerPoll, until none is parked; at close it fails them all.
func (w *ClusterMarkerWriter) pollParked() {
	t := time.NewTicker(markerPoll)
	defer t.Stop()
	for {
		var now time.Time
		select {
		case <-w.stop:
			w.mu.Lock()
			ps := w.parked
			w.parked, w.polling = nil, false
			w.mu.Unlock()
			for _, pm := range ps {
				pm.m.done(codec.CodeCoordinatorNotAvailable)
			}
			return
		case now = <-t.C:
		}
		w.mu.Lock()
		ps := w.parked
		w.parked = nil
		w.mu.Unlock()
		var keep, ready []parkedMarker
		for _, pm := range ps {
			o := topology.PartitionOwner(w.topo, pm.m.req.Topic, pm.m.req.Partition)
			if (o.Known && (o.Broker != pm.was.Broker || o.Epoch != pm.was.Epoch)) || !now.Before(pm.until) {
				ready = append(ready, pm)
			} else {
				keep = append(keep, pm)
			}
		}
		w.mu.Lock()
		w.parked = append(keep, w.parked...)
		idle := len(w.parked) == 0
		if idle {
			w.polling = false
		}
		w.mu.Unlock()
		for _, pm := range ready {
			w.route(pm.m)
		}
		if idle {
			return
		}
	}
}

// peer returns the sender (the queue) for broker id. The connection to it is the pool's
// (InterBroker.Broker): a broker that came back at another address gets a new client there,
// while its queue, and the one-request-in-flight rule, stay.
func (w *ClusterMarkerWriter) peer(id int32) (*markerPeer, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, errors.New("marker writer closed")
	}
	p := w.queues[id]
	if p == nil {
		p = newMarkerPeer(w, id)
		w.queues[id] = p
	}
	return p, nil
}

// markerPeer is the sender to one broker: a queue and at most one request in flight.
type markerPeer struct {
	w    *ClusterMarkerWriter
	id   int32
	sent *metrics.Counter

	mu       sync.Mutex
	queue    []queuedMarker
	inflight bool
	closed   bool
	pending  *atomic.Int64 // markers queued or in flight to this broker (the gauge)
}

type queuedMarker struct {
	m *remoteMarker
	o topology.Owner // the owner it was sent for (retry compares against it)
}

func newMarkerPeer(w *ClusterMarkerWriter, id int32) *markerPeer {
	return &markerPeer{w: w, id: id, pending: markerInflight(id),
		sent: metrics.GetOrCreateCounter(fmt.Sprintf(`kaas_txn_marker_requests_sent_total{broker="%d"}`, id))}
}

// markerInflightBy holds, per destination broker id, the markers queued or in flight to it (one
// gauge per destination, registered by whoever creates the count first; every sender to that
// broker in the process adds to it).
var markerInflightBy sync.Map // int32 → *atomic.Int64

func markerInflight(id int32) *atomic.Int64 {
	if v, ok := markerInflightBy.Load(id); ok {
		return v.(*atomic.Int64)
	}
	n := new(atomic.Int64)
	v, loaded := markerInflightBy.LoadOrStore(id, n)
	if !loaded {
		metrics.NewGauge(fmt.Sprintf(`kaas_txn_marker_inflight{broker="%d"}`, id), func() float64 { return float64(n.Load()) })
	}
	return v.(*atomic.Int64)
}

func (p *markerPeer) enqueue(m *remoteMarker, o topology.Owner) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.w.retry(m, o)
		return
	}
	p.queue = append(p.queue, queuedMarker{m, o})
	p.pending.Add(1)
	start := !p.inflight
	p.inflight = true
	p.mu.Unlock()
	if start {
		go p.run()
	}
}

// close stops the peer: what is queued is routed again (or failed, if the writer is closing).
func (p *markerPeer) close() {
	p.mu.Lock()
	p.closed = true
	q := p.queue
	p.queue = nil
	p.mu.Unlock()
	p.pending.Add(-int64(len(q)))
	for _, qm := range q {
		p.w.retry(qm.m, qm.o)
	}
}

// run sends requests until the queue is empty: ONE in flight; everything queued meanwhile
// goes in the next one.
func (p *markerPeer) run() {
	for {
		p.mu.Lock()
		if len(p.queue) == 0 || p.closed {
			p.inflight = false
			p.mu.Unlock()
			return
		}
		take := p.queue
		if len(take) > markerRequestMax {
			mMarkerRequestSplit.Inc()
			take = take[:markerRequestMax]
		}
		batch := append([]queuedMarker(nil), take...)
		p.queue = append(p.queue[:0:0], p.queue[len(take):]...)
		p.mu.Unlock()
		p.send(batch)
		p.pending.Add(-int64(len(batch)))
	}
}

// markerKey is what one WriteTxnMarkers marker entry shares.
type markerKey struct {
	pid        int64
	epoch      int16
	commit     bool
	coordEpoch int32
	prepareSeq uint64
}

// send builds one WriteTxnMarkers v1 for batch, sends it and settles every marker.
func (p *markerPeer) send(batch []queuedMarker) {
	req := kmsg.NewPtrWriteTxnMarkersRequest()
	req.Version = 1
	entries := map[markerKey]int{}      // → index in req.Markers
	topicAt := map[int]map[string]int{} // marker index → topic → index in its Topics
	// A response is matched by (producer id, topic, partition): Apache merges a response's
	// markers per producer id, so two entries for one producer in one request are not sent;
	// the second waits for the next request.
	byPID := map[int64]markerKey{}
	type where struct {
		pid   int64
		topic string
		part  int32
	}
	targets := map[where][]queuedMarker{}
	var deferred []queuedMarker
	for _, qm := range batch {
		r := &qm.m.req
		k := markerKey{r.ProducerID, r.ProducerEpoch, r.Commit, r.CoordinatorEpoch, r.PrepareSeq}
		if prev, ok := byPID[r.ProducerID]; ok && prev != k {
			deferred = append(deferred, qm)
			continue
		}
		byPID[r.ProducerID] = k
		wh := where{r.ProducerID, r.Topic, r.Partition}
		if _, dup := targets[wh]; dup {
			targets[wh] = append(targets[wh], qm) // the same marker twice (a re-drive): one answer
			continue
		}
		targets[wh] = []queuedMarker{qm}
		mi, ok := entries[k]
		if !ok {
			mi = len(req.Markers)
			entries[k] = mi
			e := kmsg.NewWriteTxnMarkersRequestMarker()
			e.ProducerID, e.ProducerEpoch, e.Committed, e.CoordinatorEpoch = k.pid, k.epoch, k.commit, k.coordEpoch
			setMarkerPrepareSeq(&e, k.prepareSeq) // the leader's dedup of late copies
			req.Markers = append(req.Markers, e)
			topicAt[mi] = map[string]int{}
		}
		ti, ok := topicAt[mi][r.Topic]
		if !ok {
			ti = len(req.Markers[mi].Topics)
			topicAt[mi][r.Topic] = ti
			t := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
			t.Topic = r.Topic
			req.Markers[mi].Topics = append(req.Markers[mi].Topics, t)
		}
		req.Markers[mi].Topics[ti].Partitions = append(req.Markers[mi].Topics[ti].Partitions, r.Partition)
	}
	if len(deferred) > 0 {
		p.mu.Lock()
		p.queue = append(deferred, p.queue...)
		p.mu.Unlock()
		p.pending.Add(int64(len(deferred))) // still pending: run subtracts the whole batch
	}
	p.sent.Inc()
	ctx, cancel := context.WithTimeout(context.Background(), markerRequestTimeout)
	kresp, err := p.request(ctx, req)
	cancel()
	codes := map[where]int16{}
	if err == nil {
		resp := kresp.(*kmsg.WriteTxnMarkersResponse)
		for _, rm := range resp.Markers {
			for _, rt := range rm.Topics {
				for _, rp := range rt.Partitions {
					codes[where{rm.ProducerID, rt.Topic, rp.Partition}] = rp.ErrorCode
				}
			}
		}
	} else {
		p.w.log.Info("WriteTxnMarkers request failed; resending", zap.Int32("broker", p.id), zap.Error(err))
	}
	for wh, qms := range targets {
		code, ok := codes[wh]
		if !ok {
			code = codec.CodeRequestTimedOut // no answer for it (transport error, short answer): resend
		}
		for _, qm := range qms {
			p.w.settle(qm.m, qm.o, code)
		}
	}
}

// request sends one WriteTxnMarkers to the peer through the broker's inter-broker client,
// counting (and logging) a refusal of this broker's CLUSTER_ACTION.
func (p *markerPeer) request(ctx context.Context, req *kmsg.WriteTxnMarkersRequest) (kmsg.Response, error) {
	b, err := p.w.peers.Broker(p.id)
	if err != nil {
		return nil, err
	}
	kresp, err := b.Request(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp, ok := kresp.(*kmsg.WriteTxnMarkersResponse); ok {
		refused := false
		for _, rm := range resp.Markers {
			for _, rt := range rm.Topics {
				for _, rp := range rt.Partitions {
					refused = refused || rp.ErrorCode == codec.CodeClusterAuthorizationFailed
				}
			}
		}
		if refused {
			p.w.peers.noteClusterAuthz("WriteTxnMarkers", p.id, codec.CodeClusterAuthorizationFailed)
		}
	}
	return kresp, nil
}
