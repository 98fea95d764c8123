package server

// Produce: v3-12
//
// Behavior:
//   - acks must be -1, 0 or 1 (else INVALID_REQUIRED_ACKS for every partition).
//   - Per partition, the shared check (topology.go): TOPIC_AUTHORIZATION_FAILED (Write on the
//     topic), UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION for __consumer_offsets and
//     __transaction_state (only their coordinators write there, as in Apache), then
//     NOT_LEADER_OR_FOLLOWER when the topology says another broker leads the partition.
//   - Each partition's records must be exactly one valid v2 batch (codec.ValidateProduceBatch):
//     CORRUPT_MESSAGE / INVALID_RECORD / MESSAGE_TOO_LARGE / INVALID_TIMESTAMP otherwise, and
//     nothing of that partition is written. Other partitions of the request are unaffected.
//     Compressed batches are decompressed (at most codec.DefaultMaxUncompressedBytes, else
//     MESSAGE_TOO_LARGE, counted in kaas_produce_decompress_limit_total) and every record is
//     checked as Apache's LogValidator does; a record-level error names the record in
//     ErrorRecords (v8+) with its message.
//   - compression.type other than producer: a batch in another codec is recompressed (new
//     batch, new CRC; producer id, epoch, sequence and transactional bit kept) before it is
//     appended, and must still fit max.message.bytes.
//   - The batch is appended (offsets assigned in place), then the answer waits until the
//     partition's fsync covers it: an acks=all answer means the bytes are on disk, and the high
//     watermark consumers read from never passes fsync'd data. acks=1 waits for the same fsync
//     (there are no followers, so acks=1 and acks=all are the same promise); a topic with
//     flush.messages > 1 trades that away explicitly.
//   - The wait is deferred: the connection's executor moves on to the next pipelined request
//     while the fsync runs, and one fsync answers every producer waiting on that partition.
//   - acks=0 sends no response at all (Kafka's contract); the ordering window still advances.
//   - Idempotence (storage): a duplicate batch gets its original offsets and error 0;
//     OUT_OF_ORDER_SEQUENCE_NUMBER (45) / INVALID_PRODUCER_EPOCH (47) otherwise.
//   - Transactional batches: WRITE on the request's TransactionalId is required (Apache answers
//     TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the whole request, also when the id is null). A
//     producer's first transactional write to a partition in a transaction is verified against
//     the coordinator before it is appended (KIP-890; produceTxn below); a write for a partition
//     the transaction does not include is rejected, not appended.
//
// Version notes: v3 transactional id + magic 2 only; v5 LogStartOffset; v8 record errors;
// v9 flexible; v10 leader hints (KIP-951: CurrentLeader and the leader's endpoint on
// NOT_LEADER_OR_FOLLOWER, from the topology); v11 TRANSACTION_ABORTABLE;
// v12 TV2: the leader adds the partition to the transaction itself (KIP-890 part 2), advertised
// only while transaction.version 2 is served.

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/quota"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

func init() {
	maxVersion := int16(11)
	if transactionVersionServed >= 2 {
		maxVersion = 12
	}
	register(kmsg.Produce, 3, maxVersion, handleProduce)
}

// produceAppend is one validated partition batch waiting to be appended.
type produceAppend struct {
	p     *storage.Partition
	topic string
	out   *kmsg.ProduceResponseTopicPartition
	b     codec.Batch
	v     codec.Validated // owns b's buffer when the broker rebuilt the batch
	txn   bool
	guard uint64 // KIP-890 verification guard (transactional, not yet ongoing here)
	// verify: the coordinator must confirm the partition is in the transaction first.
	verify bool
}

// produceOp is one Produce request from validation to reply.
type produceOp struct {
	rc      *reqCtx
	req     *kmsg.ProduceRequest
	resp    *kmsg.ProduceResponse
	appends []produceAppend
	nVerify int
	guarded bool // takeGuards ran
	// async: the reply was deferred because the op waits for verification or for an earlier
	// request of the connection (produceChain); the op then answers through rc.reply.
	async bool
	waits []produceWait
}

type produceWait struct {
	p   *storage.Partition
	out *kmsg.ProduceResponseTopicPartition
	end int64
}

func handleProduce(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	now := time.Now().UnixMilli()
	acksOK := req.Acks == -1 || req.Acks == 0 || req.Acks == 1
	op := &produceOp{rc: rc, req: req, resp: resp}
	nParts := 0
	for i := range req.Topics {
		nParts += len(req.Topics[i].Partitions)
	}
	op.appends = make([]produceAppend, 0, nParts)
	if q := rc.s.deps.Quotas; q != nil && q.Active() {
		// producer_byte_rate counts the record bytes of the request, as Apache's produce quota.
		var n int
		for i := range req.Topics {
			for j := range req.Topics[i].Partitions {
				n += len(req.Topics[i].Partitions[j].Records)
			}
		}
		rc.recordUsage(quota.Produce, float64(n))
	}
	txnAuth := int8(0) // 0 unknown, 1 allowed, -1 denied: checked once, only if a batch is transactional
	var hints *leaderHints

	resp.Topics = make([]kmsg.ProduceResponseTopic, len(req.Topics))
	for i := range req.Topics {
		rt := &req.Topics[i]
		ot := &resp.Topics[i]
		*ot = kmsg.NewProduceResponseTopic()
		ot.Topic = rt.Topic
		ot.Partitions = make([]kmsg.ProduceResponseTopicPartition, len(rt.Partitions))
		var tr topicRef
		if acksOK {
			tr = rc.lookupTopic(OpWrite, rt.Topic)
		}
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			out := &ot.Partitions[j]
			*out = kmsg.NewProduceResponseTopicPartition()
			out.Partition = rp.Partition
			out.BaseOffset, out.LogAppendTime, out.LogStartOffset = -1, -1, -1
			if !acksOK {
				out.ErrorCode = codec.CodeInvalidRequiredAcks
				continue
			}
			// Internal topics answer INVALID_TOPIC_EXCEPTION here (localPartition: OpWrite).
			lp, code := rc.localPartition(&tr, rp.Partition, -1)
			if code != codec.CodeNone {
				out.ErrorCode = code
				if code == codec.CodeNotLeaderForPartition && req.Version >= 10 {
					if hints == nil {
						hints = &leaderHints{s: rc.s, listener: rc.c.ln.name}
					}
					out.CurrentLeader.LeaderID, out.CurrentLeader.LeaderEpoch = hints.hint(rt.Topic, rp.Partition)
				}
				continue
			}
			p, t := lp.p, tr.t
			cfg := t.Config()
			vo := codec.ValidateOptions{
				MaxMessageBytes:      cfg.MaxMessageBytes,
				TimestampBeforeMaxMs: cfg.TimestampBeforeMaxMs,
				TimestampAfterMaxMs:  cfg.TimestampAfterMaxMs,
				NowMs:                now,
				LogAppendTime:        cfg.TimestampType == storage.TimestampLogAppendTime,
				Compacted:            strings.Contains(cfg.CleanupPolicy, "compact"),
			}
			vo.TargetCompression, vo.TargetLevel, vo.Recompress = cfg.Recompression()
			v := codec.ValidateProduceBatch(rp.Records, vo)
			if v.Code != codec.CodeNone {
				rejectProduce(out, &v, req.Version)
				continue
			}
			if v.Batch.Compression() != codec.CompressionNone || v.Recompressed {
				mProduceDecompressedBytes.Add(v.UncompressedBytes)
			}
			if v.Recompressed {
				mProduceRecompressed.Inc()
			}
			b := v.Batch
			a := produceAppend{p: p, topic: rt.Topic, out: out, b: b, v: v}
			if b.IsTransactional() {
				if txnAuth == 0 {
					txnAuth = -1
					if req.TransactionID != nil && rc.authorized(OpWrite, ResTransactionalID, *req.TransactionID) {
						txnAuth = 1
					}
				}
				if txnAuth < 0 {
					out.ErrorCode = codec.CodeTransactionalIDAuthorization
					mProduceRejected.Inc()
					a.v.Release()
					continue
				}
				a.txn = true
			}
			op.appends = append(op.appends, a)
		}
	}

	hints.each(func(id int32, host string, port int32, rack *string) {
		nb := kmsg.NewProduceResponseBroker()
		nb.NodeID, nb.Host, nb.Port, nb.Rack = id, host, port, rack
		resp.Brokers = append(resp.Brokers, nb)
	})

	// Ordering across pipelined requests of one connection. The executor runs a connection's
	// requests one at a time, so without verification appends happen in request order. A request
	// that must wait for the coordinator (KIP-890) cannot block the executor, so it parks its
	// appends and marks the connection's produceChain busy; every later Produce request of the
	// connection then queues its appends behind it (whether it needs verification or not) and the
	// chain runs them in order once the earlier one has appended. This keeps a producer's batches
	// for one partition in sequence order (a reordering would answer OUT_OF_ORDER_SEQUENCE_NUMBER
	// or, worse, append a later batch first). Apache gets the same guarantee by muting a
	// connection until its response is sent. Other request types are not ordered behind it
	// (Kafka orders responses, which conn.go does, not side effects across APIs).
	if ch := lockedChain(rc.c, false); ch != nil {
		if ch.busy {
			op.async = true
			rc.deferReply()
			ch.queue = append(ch.queue, op)
			ch.mu.Unlock()
			return nil, nil
		}
		ch.mu.Unlock()
	}
	op.takeGuards()
	if op.nVerify > 0 {
		ch := lockedChain(rc.c, true)
		ch.busy = true
		ch.mu.Unlock()
		op.async = true
		rc.deferReply()
		if op.run(ch) {
			return nil, nil
		}
		ch.release(rc.c)
		return nil, nil
	}
	op.appendReady(time.Now().UnixMilli())
	return op.finish(), nil
}

// rejectProduce answers a batch validation failed, with Apache's record-level detail (Produce v8
// RecordErrors): like Apache's LogValidator, one entry (batch index and message) per invalid
// record of the batch, not only the first (up to codec.MaxRecordErrors; the rest are counted).
func rejectProduce(out *kmsg.ProduceResponseTopicPartition, v *codec.Validated, version int16) {
	out.ErrorCode = v.Code
	mProduceRejected.Inc()
	if v.DecompressLimited {
		mProduceDecompressLimited.Inc()
	}
	if v.RecordErrorsDropped > 0 {
		mProduceRecordErrorsDropped.Add(v.RecordErrorsDropped)
	}
	if version < 8 || v.Message == "" {
		return
	}
	msg := v.Message
	out.ErrorMessage = &msg
	if len(v.RecordErrors) > 0 {
		out.ErrorRecords = make([]kmsg.ProduceResponseTopicPartitionErrorRecord, len(v.RecordErrors))
		for i := range v.RecordErrors {
			re := &out.ErrorRecords[i]
			re.Default()
			re.RelativeOffset = v.RecordErrors[i].Index
			re.ErrorMessage = &v.RecordErrors[i].Message
		}
	}
}

// run appends what needs no verification and starts the verification of the rest. It returns
// true if verification is in flight (the chain is released when it ends), false if the op has
// finished (all appended and answered).
func (op *produceOp) run(ch *produceChain) bool {
	if !op.guarded {
		op.takeGuards()
	}
	op.appendReady(time.Now().UnixMilli())
	if op.nVerify == 0 {
		op.finish()
		return false
	}
	op.verifyAll(func() {
		op.appendVerified(time.Now().UnixMilli())
		op.finish()
		ch.release(op.rc.c)
	})
	return true
}

// takeGuards decides, per transactional batch, whether the coordinator must be asked first: not
// if the producer already has an ongoing transaction on the partition at this epoch (the common
// case after its first batch), else a KIP-890 guard is taken now, before asking — a marker or
// fence landing while we wait invalidates it, so a stale "yes" cannot open a transaction (the ABA
// race verify → abort → new transaction → append). A request queued behind a verification takes
// its guards only when it runs, so it usually finds the transaction already ongoing.
func (op *produceOp) takeGuards() {
	op.guarded = true
	for i := range op.appends {
		a := &op.appends[i]
		if !a.txn {
			continue
		}
		guard, ongoing := a.p.VerificationGuard(a.b.ProducerID(), a.b.ProducerEpoch())
		a.guard, a.verify = guard, !ongoing
		if a.verify {
			op.nVerify++
		}
	}
}

// appendReady appends every batch that needs no verification.
func (op *produceOp) appendReady(now int64) {
	for i := range op.appends {
		a := &op.appends[i]
		if !a.verify {
			op.append(a, now)
		}
	}
}

// appendVerified appends the verified batches (their out.ErrorCode is NONE when the coordinator
// confirmed the partition; otherwise the translated error is already set).
func (op *produceOp) appendVerified(now int64) {
	for i := range op.appends {
		a := &op.appends[i]
		if a.verify && a.out.ErrorCode == codec.CodeNone {
			op.append(a, now)
		} else if a.verify {
			a.v.Release()
		}
	}
}

func (op *produceOp) append(a *produceAppend, now int64) {
	var res storage.AppendResult
	if a.txn {
		res = a.p.AppendTxn(a.b, now, a.guard)
	} else {
		res = a.p.Append(a.b, now)
	}
	// Storage copied the bytes (segment and WAL); a rebuilt batch's buffer goes back.
	a.v.Release()
	a.b = nil
	a.out.ErrorCode = res.Code
	if res.Code != codec.CodeNone {
		return
	}
	a.out.BaseOffset = res.BaseOffset
	a.out.LogAppendTime = res.LogAppendTime
	a.out.LogStartOffset = res.LogStartOffset
	if op.waits == nil {
		op.waits = make([]produceWait, 0, len(op.appends))
	}
	op.waits = append(op.waits, produceWait{p: a.p, out: a.out, end: res.LastOffset + 1})
}

// finish answers once every appended partition is durable. Synchronous ops return the response
// (or nil after deferring); async ops always answer through rc.reply and return nil.
func (op *produceOp) finish() kmsg.Response {
	rc := op.rc
	if op.req.Acks == 0 {
		// No response, but durability still runs its course in the background.
		for _, w := range op.waits {
			w.p.Sync(w.end, func(error) {})
		}
		if op.async {
			rc.reply(nil) // completes the request without a response
		} else {
			rc.noReply()
		}
		return nil
	}
	if len(op.waits) == 0 {
		if op.async {
			rc.reply(op.resp)
			return nil
		}
		return op.resp
	}
	// Answer once every appended partition is durable. Callbacks run on flusher goroutines and
	// only record the outcome; the last one sends the response.
	if !op.async {
		rc.deferReply()
	}
	var left atomic.Int32
	left.Store(int32(len(op.waits)))
	for _, w := range op.waits {
		w := w
		w.p.Sync(w.end, func(err error) {
			defer rc.guard()
			if err != nil {
				w.out.ErrorCode = codec.CodeKafkaStorageError
				w.out.BaseOffset = -1
			}
			if left.Add(-1) == 0 {
				rc.reply(op.resp)
			}
		})
	}
	return nil
}

// verifyAll asks the coordinator about every batch marked verify, one call per (producer id,
// epoch) — normally one per request — and records the translated outcome in each batch's
// out.ErrorCode. then runs once all have answered, on a fresh goroutine (coordinator callbacks
// must not block, and appending is I/O).
//
//   - TV1 (Produce <= v11): KIP-890 part 1 verification (AddPartitionsToTxn VerifyOnly semantics):
//     the partition must already be in the transaction.
//   - TV2 (Produce v12): the leader adds the partition itself (AddPartitionsToTxn v5
//     VerifyOnly=false semantics, the coordinator keys TV2 on that version).
//
// The coordinator is called directly when it runs here, else through one AddPartitionsToTxn
// v4+ request per coordinator broker (verify_remote.go); both give the same codes.
func (op *produceOp) verifyAll(then func()) {
	type key struct {
		pid   int64
		epoch int16
	}
	groups := map[key][]int{}
	for i := range op.appends {
		a := &op.appends[i]
		if a.verify {
			k := key{a.b.ProducerID(), a.b.ProducerEpoch()}
			groups[k] = append(groups[k], i)
		}
	}
	var left atomic.Int32
	left.Store(int32(len(groups)))
	oneDone := func() {
		if left.Add(-1) == 0 {
			go then()
		}
	}
	version := op.req.Version
	setAll := func(idx []int, code int16) {
		for _, i := range idx {
			op.appends[i].out.ErrorCode = translateVerifyError(code, version)
		}
	}
	rc := op.rc
	tc := rc.s.deps.Txn
	tid := ""
	if op.req.TransactionID != nil {
		tid = *op.req.TransactionID
	}
	for k, idx := range groups {
		switch {
		case tc == nil:
			setAll(idx, codec.CodeCoordinatorNotAvailable)
			oneDone()
			continue
		}
		tps := make([]txn.TopicPartitions, len(idx))
		for j, i := range idx {
			a := &op.appends[i]
			tps[j] = txn.TopicPartitions{Topic: a.topic, Partitions: []int32{a.out.Partition}}
		}
		if owner := rc.s.txnOwner(tid); !owner.Local && owner.Broker != rc.s.deps.Topology.LocalID() {
			// The coordinator is another broker (cluster mode): ask it, batched per broker
			// (verify_remote.go). No known owner is Apache's COORDINATOR_NOT_AVAILABLE. A slot
			// this broker is still loading goes to the local coordinator, which answers 14.
			if !owner.Known {
				setAll(idx, codec.CodeCoordinatorNotAvailable)
				oneDone()
				continue
			}
			rc.s.verifier.verify(owner.Broker, tid, k.pid, k.epoch, version < 12, tps, func(codes []int16) {
				defer rc.guard()
				for j, i := range idx {
					op.appends[i].out.ErrorCode = translateVerifyError(codes[j], version)
				}
				oneDone()
			})
			continue
		}
		results := func(code int16, prs []txn.PartitionResult, err error) {
			defer rc.guard()
			if err != nil {
				code = txn.ErrorCode(err)
			}
			for j, i := range idx {
				c := code
				if c == codec.CodeNone && j < len(prs) {
					c = prs[j].Code
				}
				op.appends[i].out.ErrorCode = translateVerifyError(c, version)
			}
			oneDone()
		}
		if version >= 12 {
			tc.AddPartitions(txn.AddPartitionsParams{TransactionalID: tid, ProducerID: k.pid, ProducerEpoch: k.epoch,
				Partitions: tps, Version: 5, Implicit: true},
				func(res txn.AddPartitionsResult, err error) { results(res.Code, res.Results, err) })
		} else {
			tc.Verify(txn.VerifyParams{TransactionalID: tid, ProducerID: k.pid, ProducerEpoch: k.epoch,
				Partitions: tps, Abortable: true},
				func(res txn.VerifyResult, err error) { results(res.Code, res.Results, err) })
		}
	}
}

// translateVerifyError maps a coordinator answer to what the producer understands, as Apache's
// AddPartitionsToTxnManager does (KIP-890):
//   - PRODUCER_FENCED → INVALID_PRODUCER_EPOCH (Produce never returns 90; 47 is abortable);
//   - TRANSACTION_ABORTABLE → INVALID_TXN_STATE unless Produce >= v11 understands it;
//   - CONCURRENT_TRANSACTIONS on Produce v12 stays CONCURRENT_TRANSACTIONS (KAFKA-18662: a TV2
//     producer's next transaction can race the previous markers, and the client retries 51);
//   - otherwise the retriable coordinator errors (CONCURRENT_TRANSACTIONS, NOT_COORDINATOR,
//     COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS) → NOT_ENOUGH_REPLICAS, so old
//     clients retry without a metadata refresh;
//   - CLUSTER_AUTHORIZATION_FAILED (the leader may not talk to the coordinator) → INVALID_TXN_STATE;
//   - NETWORK_EXCEPTION (the remote coordinator did not answer) passes through: it is retriable
//     for every producer, as in Apache.
func translateVerifyError(code, produceVersion int16) int16 {
	switch code {
	case codec.CodeProducerFenced:
		return codec.CodeInvalidProducerEpoch
	case codec.CodeTransactionAbortable:
		if produceVersion >= 11 {
			return code
		}
		return codec.CodeInvalidTxnState
	case codec.CodeConcurrentTransactions:
		if produceVersion >= 12 {
			return code
		}
		return codec.CodeNotEnoughReplicas
	case codec.CodeNotCoordinator, codec.CodeCoordinatorNotAvailable, codec.CodeCoordinatorLoadInProgress:
		return codec.CodeNotEnoughReplicas
	case codec.CodeClusterAuthorizationFailed:
		return codec.CodeInvalidTxnState
	}
	return code
}

// produceChain orders a connection's Produce appends while one of them waits for the
// coordinator. It exists only while busy (so the common path costs one atomic load); the
// executor is the only creator, the last release deletes it.
type produceChain struct {
	mu    sync.Mutex
	busy  bool
	dead  bool
	queue []*produceOp
}

var (
	produceChains      sync.Map     // *conn → *produceChain
	produceChainsAlive atomic.Int64 // number of chains in produceChains (fast-path skip)
)

// lockedChain returns c's chain locked, creating it if create; nil if none exists.
func lockedChain(c *conn, create bool) *produceChain {
	if !create && produceChainsAlive.Load() == 0 {
		return nil
	}
	for {
		var v any
		if create {
			nc := &produceChain{}
			var loaded bool
			v, loaded = produceChains.LoadOrStore(c, nc)
			if !loaded {
				produceChainsAlive.Add(1)
			}
		} else {
			var ok bool
			if v, ok = produceChains.Load(c); !ok {
				return nil
			}
		}
		ch := v.(*produceChain)
		ch.mu.Lock()
		if !ch.dead {
			return ch
		}
		ch.mu.Unlock()
		if !create {
			return nil
		}
	}
}

// release runs the ops queued behind the one that just finished, in order, until one of them
// waits for verification again (it releases the chain when done) or the queue is empty (the chain
// is retired).
func (ch *produceChain) release(c *conn) {
	for {
		ch.mu.Lock()
		if len(ch.queue) == 0 {
			ch.busy, ch.dead = false, true
			if produceChains.CompareAndDelete(c, ch) {
				produceChainsAlive.Add(-1)
			}
			ch.mu.Unlock()
			return
		}
		op := ch.queue[0]
		ch.queue[0] = nil
		ch.queue = ch.queue[1:]
		ch.mu.Unlock()
		if op.rc.c.closed.Load() {
			// The connection is gone: drop the parked request (its frame goes back to the pool).
			op.rc.r.release()
			continue
		}
		if op.run(ch) {
			return
		}
	}
}
