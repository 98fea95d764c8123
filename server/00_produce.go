package server

// Produce: v3-11
//
// Behavior:
//   - acks must be -1, 0 or 1 (else INVALID_REQUIRED_ACKS for every partition).
//   - Each partition's records must be exactly one valid v2 batch (codec.ValidateProduce):
//     CORRUPT_MESSAGE / INVALID_RECORD / MESSAGE_TOO_LARGE / INVALID_TIMESTAMP otherwise, and
//     nothing of that partition is written. Other partitions of the request are unaffected.
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
//   - Transactional batches belong to the transactions work; until then they are refused with
//     INVALID_TXN_STATE, as Apache refuses a transactional write it cannot verify.
//
// Version notes: v3 transactional id + magic 2 only; v5 LogStartOffset; v8 record errors;
// v9 flexible; v10 leader hints (KIP-951, unused: we are the only leader); v11 TRANSACTION_ABORTABLE.

import (
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.Produce, 3, 11, handleProduce) }

// produceTxnHook lets the transaction coordinator check transactional batches (KIP-890 part 1
// verification) before they are appended. nil refuses them.
var produceTxnHook func(rc *reqCtx, topic string, partition int32, p *storage.Partition, b codec.Batch) int16

func handleProduce(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	store := rc.s.deps.Store
	now := time.Now().UnixMilli()
	acksOK := req.Acks == -1 || req.Acks == 0 || req.Acks == 1

	type pending struct {
		p   *storage.Partition
		out *kmsg.ProduceResponseTopicPartition
		end int64
	}
	var waits []pending

	resp.Topics = make([]kmsg.ProduceResponseTopic, len(req.Topics))
	for i := range req.Topics {
		rt := &req.Topics[i]
		ot := &resp.Topics[i]
		*ot = kmsg.NewProduceResponseTopic()
		ot.Topic = rt.Topic
		ot.Partitions = make([]kmsg.ProduceResponseTopicPartition, len(rt.Partitions))
		t := store.Topic(rt.Topic)
		writeOK := rc.authorized(OpWrite, ResTopic, rt.Topic)
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			op := &ot.Partitions[j]
			*op = kmsg.NewProduceResponseTopicPartition()
			op.Partition = rp.Partition
			op.BaseOffset, op.LogAppendTime, op.LogStartOffset = -1, -1, -1
			switch {
			case !acksOK:
				op.ErrorCode = codec.CodeInvalidRequiredAcks
				continue
			case !writeOK:
				op.ErrorCode = codec.CodeTopicAuthorizationFailed
				continue
			case t == nil:
				op.ErrorCode = codec.CodeUnknownTopicOrPartition
				continue
			}
			p := t.Partition(rp.Partition)
			if p == nil {
				op.ErrorCode = codec.CodeUnknownTopicOrPartition
				continue
			}
			if !rc.s.deps.Owner.LeadsPartition(rt.Topic, rp.Partition) {
				op.ErrorCode = codec.CodeNotLeaderForPartition
				continue
			}
			cfg := t.Config()
			b, code := codec.ValidateProduce(rp.Records, codec.ValidateOptions{
				MaxMessageBytes:      cfg.MaxMessageBytes,
				TimestampBeforeMaxMs: cfg.TimestampBeforeMaxMs,
				TimestampAfterMaxMs:  cfg.TimestampAfterMaxMs,
				NowMs:                now,
			})
			if code == codec.CodeNone && b.IsTransactional() {
				if produceTxnHook == nil {
					code = codec.CodeInvalidTxnState
				} else {
					code = produceTxnHook(rc, rt.Topic, rp.Partition, p, b)
				}
			}
			if code != codec.CodeNone {
				op.ErrorCode = code
				mProduceRejected.Inc()
				continue
			}
			res := p.Append(b, now)
			op.ErrorCode = res.Code
			if res.Code != codec.CodeNone {
				continue
			}
			op.BaseOffset = res.BaseOffset
			op.LogAppendTime = res.LogAppendTime
			op.LogStartOffset = res.LogStartOffset
			waits = append(waits, pending{p: p, out: op, end: res.LastOffset + 1})
		}
	}

	if req.Acks == 0 {
		// No response, but durability still runs its course in the background.
		for _, w := range waits {
			w.p.Sync(w.end, func(error) {})
		}
		rc.noReply()
		return nil, nil
	}
	if len(waits) == 0 {
		return resp, nil
	}
	// Answer once every appended partition is durable. Callbacks run on flusher goroutines and
	// only record the outcome; the last one sends the response.
	rc.deferReply()
	var left atomic.Int32
	left.Store(int32(len(waits)))
	for _, w := range waits {
		w := w
		w.p.Sync(w.end, func(err error) {
			if err != nil {
				w.out.ErrorCode = codec.CodeKafkaStorageError
				w.out.BaseOffset = -1
			}
			if left.Add(-1) == 0 {
				rc.reply(resp)
			}
		})
	}
	return nil, nil
}
