package server

// Fetch: v4-17
//
// Behavior (Apache's ReplicaManager.fetchMessages / readFromLog, consumer side):
//   - Partitions are read in request order (session order for incremental fetches). Each read
//     is bounded by the partition's PartitionMaxBytes and by what is left of the response budget,
//     min(request MaxBytes, fetch.max.bytes). Until some partition has returned records the read
//     may return one whole batch larger than those limits (KIP-74), so a consumer never gets
//     stuck behind a batch bigger than its limits; after that, only whole batches that fit.
//   - Records come from [fetch offset, upper bound): the high watermark at READ_UNCOMMITTED, the
//     last stable offset at READ_COMMITTED (fetchUpperBound). A fetch offset in
//     (upper bound, log end] returns no records and no error, like Apache.
//   - Per partition: HighWatermark, LastStableOffset, LogStartOffset, PreferredReadReplica -1.
//     AbortedTransactions is null at READ_UNCOMMITTED; at READ_COMMITTED it is a non-null list of
//     the aborted transactions overlapping the returned records (Apache's rule: lastOffset >=
//     fetch offset and firstOffset < end of the last returned batch), so the consumer drops their
//     data; empty when no records are returned.
//   - Errors, checked in Apache's order: UNKNOWN_TOPIC_ID (v13+, id not known),
//     TOPIC_AUTHORIZATION_FAILED (Read on the topic), UNKNOWN_TOPIC_OR_PARTITION,
//     NOT_LEADER_OR_FOLLOWER (the topology says another broker leads it),
//     FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH (v9+ CurrentLeaderEpoch older / newer than the
//     topology's leader epoch; -1 skips the check) — the shared check of topology.go — then
//     OFFSET_OUT_OF_RANGE (fetch offset < log start or > log end), UNSUPPORTED_COMPRESSION_TYPE
//     (zstd batches to a v<10 fetcher, KIP-110). Error partitions carry -1 offsets, except
//     OFFSET_OUT_OF_RANGE which keeps the partition's HWM / LSO / log start (Apache sends -1
//     there; the real values cost nothing and help whoever reads the response).
//   - Long-poll: when fewer than MinBytes were read, no partition has an error and MaxWaitMillis
//     > 0, the answer is deferred: a goroutine waits on the partitions' Changed() channels (the
//     HWM moved), re-reads when one fires and answers once MinBytes is reached, at MaxWaitMillis,
//     or when the connection / server goes away. The executor is never blocked.
//   - Sessions (KIP-227, v7+): see fetch_session.go.
//   - __consumer_offsets and __transaction_state (internal topics, no storage log: the state
//     they stand for lives in the coordinators' journals) read as an empty log: log start = HWM
//     = LSO = 0, no records, fetch offset 0 long-polls until MaxWaitMillis, any other offset is
//     OFFSET_OUT_OF_RANGE. Apache would return its coordinator records, which no client needs
//     (kgo and the Java consumer skip internal topics unless told otherwise).
//
// Version notes: v4 isolation level, LSO, aborted txns; v5 log start offset; v7 sessions;
// v9 CurrentLeaderEpoch; v10 zstd; v11 rack / preferred read replica; v12 flexible, diverging
// epoch tags (for followers; unused); v13 topic ids; v15 ReplicaState (followers only);
// v16 leader hints (KIP-951: CurrentLeader and the leader's endpoint on NOT_LEADER_OR_FOLLOWER /
// FENCED_LEADER_EPOCH, from the topology); v17 directory ids (followers only).

import (
	"errors"
	"reflect"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.Fetch, 4, 17, handleFetch) }

// fetchBufPool holds the buffers records are read into; a fetch owns one until its response is
// encoded.
var fetchBufPool bytebufferpool.Pool

// mFetchWaiting is the number of long-polling fetches now (deferred, waiting for data or MaxWaitMillis).
var mFetchWaiting = metrics.NewGauge(`kaas_fetch_requests_waiting`, nil)

// fetchCloseCheck is how often a waiting fetch looks whether its connection or the server has
// gone away (there is no close channel to select on).
const fetchCloseCheck = 250 * time.Millisecond

// isolationReadCommitted is Kafka's IsolationLevel.READ_COMMITTED.
const isolationReadCommitted int8 = 1

// lastStableOffset is the partition's LSO: the first offset of the oldest transaction that is
// still open (or whose marker is not durable yet), capped at the high watermark (storage keeps
// the open-transaction queue; see storage/txn.go).
func lastStableOffset(p *storage.Partition) int64 { return p.LastStableOffset() }

// fetchUpperBound is the exclusive end of what a consumer at the given isolation level may read
// (Kafka's FetchIsolation: HIGH_WATERMARK at READ_UNCOMMITTED, TXN_COMMITTED = LSO at
// READ_COMMITTED).
func fetchUpperBound(p *storage.Partition, isolation int8) int64 {
	if isolation == isolationReadCommitted {
		return lastStableOffset(p)
	}
	return p.HighWatermark()
}

// fetchPartReq is one requested partition, copied out of the request (which aliases the frame
// buffer, released when the reply is sent) or loaded from a session.
type fetchPartReq struct {
	topic              string // empty for v13+ (resolved from topicID on every read)
	topicID            [16]byte
	partition          int32
	fetchOffset        int64
	maxBytes           int32
	currentLeaderEpoch int32
}

func (p *fetchPartReq) key(usesIDs bool) fetchPartKey {
	if usesIDs {
		return fetchPartKey{topicID: p.topicID, partition: p.partition}
	}
	return fetchPartKey{topic: p.topic, partition: p.partition}
}

// fetchPartResult is what one read produced; records are buf[start:end] of the fetch's buffer.
type fetchPartResult struct {
	code     int16
	hwm      int64
	lso      int64
	logStart int64
	start    int
	end      int
	// aborted: READ_COMMITTED only — the aborted transactions overlapping the returned records.
	aborted []storage.AbortedTxn
}

func (r *fetchPartResult) size() int { return r.end - r.start }

// fetchOp is one fetch from request to reply.
type fetchOp struct {
	rc        *reqCtx
	version   int16
	isolation int8
	minBytes  int32
	maxBytes  int32 // already bounded by fetch.max.bytes
	maxWait   time.Duration
	ctx       *fetchContext

	buf     *bytebufferpool.ByteBuffer
	results []fetchPartResult
	waitOn  []<-chan struct{}
}

func handleFetch(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.FetchRequest)
	op := &fetchOp{
		rc:        rc,
		version:   req.Version,
		isolation: req.IsolationLevel,
		minBytes:  req.MinBytes,
		maxBytes:  req.MaxBytes,
		maxWait:   time.Duration(req.MaxWaitMillis) * time.Millisecond,
	}
	if op.maxBytes > rc.s.cfg.FetchMaxBytes && rc.s.cfg.FetchMaxBytes > 0 {
		op.maxBytes = rc.s.cfg.FetchMaxBytes
	}
	usesIDs := req.Version >= 13
	var parts []fetchPartReq
	for i := range req.Topics {
		t := &req.Topics[i]
		for j := range t.Partitions {
			p := &t.Partitions[j]
			fp := fetchPartReq{
				partition:          p.Partition,
				fetchOffset:        p.FetchOffset,
				maxBytes:           p.PartitionMaxBytes,
				currentLeaderEpoch: p.CurrentLeaderEpoch,
			}
			if usesIDs {
				fp.topicID = t.TopicID
			} else {
				fp.topic = t.Topic
			}
			parts = append(parts, fp)
		}
	}
	var forgotten []fetchPartKey
	for i := range req.ForgottenTopics {
		t := &req.ForgottenTopics[i]
		for _, p := range t.Partitions {
			k := fetchPartKey{partition: p}
			if usesIDs {
				k.topicID = t.TopicID
			} else {
				k.topic = t.Topic
			}
			forgotten = append(forgotten, k)
		}
	}
	op.ctx = rc.s.fetchSessions.newContext(req.Version, req.SessionID, req.SessionEpoch, parts, forgotten)
	// From here on nothing reads req: the reply (now or later) releases the frame it aliases.
	rc.deferReply()
	op.buf = fetchBufPool.Get()
	total, mustAnswer := op.read()
	if mustAnswer || total >= int(op.minBytes) || op.maxWait <= 0 || len(op.waitOn) == 0 {
		op.answer()
		return nil, nil
	}
	mFetchWaiting.Inc()
	go op.wait()
	return nil, nil
}

// read reads every partition of the fetch into op.buf / op.results. It returns the record bytes
// read and whether the fetch must be answered now (a partition has an error). Before reading a
// partition it takes its Changed() channel, so an advance that races with the read still wakes
// the waiter.
func (op *fetchOp) read() (total int, mustAnswer bool) {
	parts := op.ctx.parts
	if op.results == nil {
		op.results = make([]fetchPartResult, len(parts))
	}
	op.buf.B = op.buf.B[:0]
	op.waitOn = op.waitOn[:0]
	limit := int(op.maxBytes)
	if limit < 0 {
		limit = 0
	}
	minOne := true // KIP-74: the first non-empty partition may exceed the limits by one batch
	var memo fetchTopicMemo
	for i := range parts {
		fp := &parts[i]
		r := &op.results[i]
		*r = fetchPartResult{code: codec.CodeNone, hwm: -1, lso: -1, logStart: -1, start: len(op.buf.B), end: len(op.buf.B)}
		lp, code := op.resolve(fp, &memo)
		if code != codec.CodeNone {
			r.code = code
			mustAnswer = true
			continue
		}
		p := lp.p
		if p == nil {
			// A partition of an internal topic reads as an empty log (see the header).
			r.hwm, r.lso, r.logStart = 0, 0, 0
			op.waitOn = append(op.waitOn, neverChanged)
			if fp.fetchOffset != 0 {
				r.code = codec.CodeOffsetOutOfRange
				mustAnswer = true
			}
			continue
		}
		op.waitOn = append(op.waitOn, p.Changed())
		// One LSO computation serves both the reported LSO and, at READ_COMMITTED, the bound (the
		// HWM is read after it: it only grows, so LSO <= HWM holds in the answer).
		r.lso = lastStableOffset(p)
		r.hwm = p.HighWatermark()
		upTo := r.hwm
		if op.isolation == isolationReadCommitted {
			upTo = r.lso
		}
		r.logStart = p.LogStartOffset()
		leo := p.LogEndOffset()
		if fp.fetchOffset < r.logStart || fp.fetchOffset > leo {
			r.code = codec.CodeOffsetOutOfRange
			mustAnswer = true
			continue
		}
		if fp.fetchOffset >= upTo {
			continue
		}
		budget := min(int(max(fp.maxBytes, 0)), limit)
		if !minOne && budget == 0 {
			continue
		}
		start := len(op.buf.B)
		out, rcode := p.Read(op.buf.B, fp.fetchOffset, int32(budget), upTo)
		if rcode != codec.CodeNone {
			op.buf.B = out[:start]
			r.code = rcode
			mustAnswer = true
			continue
		}
		got := out[start:]
		keep := wholeBatchesWithin(got, budget)
		if keep == 0 && minOne && len(got) > 0 {
			keep = firstBatchLen(got)
		}
		if op.version < 10 && hasZstd(got[:keep]) {
			op.buf.B = out[:start]
			r.code = codec.CodeUnsupportedCompressionType
			mustAnswer = true
			continue
		}
		op.buf.B = out[:start+keep]
		r.end = len(op.buf.B)
		if op.isolation == isolationReadCommitted && keep > 0 {
			// Apache's overlap rule over what we actually return: every aborted transaction with
			// lastOffset >= fetchOffset and firstOffset < the end of the last returned batch (a
			// fetch that starts inside an aborted transaction must still learn about it: E).
			r.aborted = p.AbortedTransactions(fp.fetchOffset, lastBatchEnd(op.buf.B[r.start:r.end]))
		}
		if keep > 0 {
			minOne = false
			limit = max(limit-keep, 0)
			total += keep
		}
	}
	return total, mustAnswer
}

// fetchTopicMemo keeps the topic last looked up during one read pass, so consecutive partitions
// of a topic share the authorization and the lookup. It lives for one pass only: a long-poll
// re-read sees a deleted topic or a changed ACL.
type fetchTopicMemo struct {
	valid   bool
	topic   string
	topicID [16]byte
	idCode  int16 // UNKNOWN_TOPIC_ID: the id resolves to no topic
	tr      topicRef
}

// resolve finds the partition of fp through the shared check (topology.go). A v13+ fetch names
// topics by id: an unknown id answers UNKNOWN_TOPIC_ID before anything is authorized, as Apache.
func (op *fetchOp) resolve(fp *fetchPartReq, m *fetchTopicMemo) (leaderPart, int16) {
	rc := op.rc
	byID := op.ctx.topicID
	if !m.valid || (byID && m.topicID != fp.topicID) || (!byID && m.topic != fp.topic) {
		*m = fetchTopicMemo{valid: true, topic: fp.topic, topicID: fp.topicID}
		name := fp.topic
		if byID {
			var ok bool
			if name, ok = rc.s.topicNameByID(fp.topicID); !ok {
				m.idCode = codec.CodeUnknownTopicID
			}
		}
		if m.idCode == codec.CodeNone {
			m.tr = rc.lookupTopic(OpRead, name)
		}
	}
	if m.idCode != codec.CodeNone {
		return leaderPart{}, m.idCode
	}
	return rc.localPartition(&m.tr, fp.partition, fp.currentLeaderEpoch)
}

// neverChanged is the Changed() channel of an internal topic's partition: nothing is ever
// appended to it, so a long-poll on it waits out MaxWaitMillis like one on an idle partition.
var neverChanged = make(chan struct{})

// wait is the long-poll: it runs on its own goroutine and answers exactly once.
//
//	waiting ──Changed() fired──▶ re-read ──bytes ≥ MinBytes or error──▶ answer
//	   ▲                            │
//	   └──────── still short ───────┘
//	waiting ──MaxWaitMillis──▶ re-read ──▶ answer
//	waiting ──connection or server closed──▶ answer (dropped by the closed connection)
func (op *fetchOp) wait() {
	answered := false
	defer mFetchWaiting.Dec()
	defer func() {
		if p := recover(); p != nil {
			mPanics.Inc()
			op.rc.s.log.Error("panic in fetch wait", zap.Any("panic", p))
			if !answered {
				op.rc.fail(errPanicInFetch)
			}
		}
	}()
	timer := time.NewTimer(op.maxWait)
	defer timer.Stop()
	tick := time.NewTicker(fetchCloseCheck)
	defer tick.Stop()
	cases := make([]reflect.SelectCase, 0, len(op.waitOn)+2)
	for {
		cases = append(cases[:0],
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(tick.C)})
		for _, ch := range op.waitOn {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
		}
		chosen, _, _ := reflect.Select(cases)
		switch chosen {
		case 0:
			op.read()
			answered = true
			op.answer()
			return
		case 1:
			if op.rc.c.closed.Load() || op.serverClosed() {
				answered = true
				op.answer()
				return
			}
			continue
		}
		total, mustAnswer := op.read()
		if mustAnswer || total >= int(op.minBytes) || len(op.waitOn) == 0 {
			answered = true
			op.answer()
			return
		}
	}
}

var errPanicInFetch = errors.New("panic while waiting for fetch data")

func (op *fetchOp) serverClosed() bool {
	s := op.rc.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

var emptyRecords = []byte{}

// answer builds the response from the last read, replies, and recycles the buffer.
func (op *fetchOp) answer() {
	resp := kmsg.NewPtrFetchResponse()
	resp.Version = op.version
	sessionID, keep := op.ctx.finish(op.rc.s.fetchSessions, op.results)
	resp.SessionID = sessionID
	resp.ErrorCode = op.ctx.errCode
	if op.ctx.kind != fetchSessionError {
		usesIDs := op.ctx.topicID
		var cur *kmsg.FetchResponseTopic
		var hints *leaderHints
		for i := range op.ctx.parts {
			if !keep[i] {
				continue
			}
			fp := &op.ctx.parts[i]
			r := &op.results[i]
			// Consecutive partitions of one topic share a topic entry, as Apache builds it.
			if cur == nil || (usesIDs && cur.TopicID != fp.topicID) || (!usesIDs && cur.Topic != fp.topic) {
				resp.Topics = append(resp.Topics, kmsg.NewFetchResponseTopic())
				cur = &resp.Topics[len(resp.Topics)-1]
				if usesIDs {
					cur.TopicID = fp.topicID
				} else {
					cur.Topic = fp.topic
				}
			}
			rp := kmsg.NewFetchResponseTopicPartition()
			rp.Partition = fp.partition
			rp.ErrorCode = r.code
			if op.version >= 16 && (r.code == codec.CodeNotLeaderForPartition || r.code == codec.CodeFencedLeaderEpoch) {
				name := fp.topic
				if usesIDs {
					name, _ = op.rc.s.topicNameByID(fp.topicID)
				}
				if hints == nil {
					hints = &leaderHints{s: op.rc.s}
				}
				rp.CurrentLeader.LeaderID, rp.CurrentLeader.LeaderEpoch = hints.hint(name, fp.partition)
			}
			rp.HighWatermark = r.hwm
			rp.LastStableOffset = r.lso
			rp.LogStartOffset = r.logStart
			if op.isolation == isolationReadCommitted && r.code == codec.CodeNone {
				rp.AbortedTransactions = make([]kmsg.FetchResponseTopicPartitionAbortedTransaction, len(r.aborted))
				for k, a := range r.aborted {
					at := &rp.AbortedTransactions[k]
					*at = kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
					at.ProducerID, at.FirstOffset = a.ProducerID, a.FirstOffset
				}
			}
			// An empty partition carries zero-length records, never null: librdkafka treats a
			// null MessageSet (size -1) as a protocol error.
			rp.RecordBatches = emptyRecords
			if r.size() > 0 {
				rp.RecordBatches = op.buf.B[r.start:r.end]
			}
			cur.Partitions = append(cur.Partitions, rp)
		}
		hints.each(func(id int32, host string, port int32, rack *string) {
			nb := kmsg.NewFetchResponseBroker()
			nb.NodeID, nb.Host, nb.Port, nb.Rack = id, host, port, rack
			resp.Brokers = append(resp.Brokers, nb)
		})
	}
	op.rc.reply(resp) // encodes synchronously; the records are copied out of op.buf
	fetchBufPool.Put(op.buf)
	op.buf = nil
}

// lastBatchEnd is the offset after the last whole batch in b (b starts at a batch boundary).
func lastBatchEnd(b []byte) int64 {
	end := int64(-1)
	for len(b) >= codec.BatchHeaderSize {
		n := firstBatchLen(b)
		if n <= 0 || n > len(b) {
			break
		}
		end = codec.Batch(b[:n]).LastOffset() + 1
		b = b[n:]
	}
	return end
}

// wholeBatchesWithin is the length of the longest prefix of b made of whole batches whose total
// is at most limit.
func wholeBatchesWithin(b []byte, limit int) int {
	n := 0
	for n < len(b) {
		bt, ok, _ := codec.FrameBatch(b[n:])
		if !ok || n+len(bt) > limit {
			break
		}
		n += len(bt)
	}
	return n
}

// firstBatchLen is the length of the first whole batch in b (0 if there is none).
func firstBatchLen(b []byte) int {
	bt, ok, _ := codec.FrameBatch(b)
	if !ok {
		return 0
	}
	return len(bt)
}

// hasZstd reports whether any batch in b is zstd-compressed (codec 4).
func hasZstd(b []byte) bool {
	for len(b) > 0 {
		bt, ok, _ := codec.FrameBatch(b)
		if !ok || len(bt) < codec.BatchHeaderSize {
			return false
		}
		if bt.Compression() == 4 {
			return true
		}
		b = b[len(bt):]
	}
	return false
}
