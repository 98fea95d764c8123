package server

// AddPartitionsToTxn: v0-5
//
// Behavior:
//   - v0-3 (the client shape, TV1): one transaction. WRITE on the TransactionalId (else 53 on every
//     partition, before routing is revealed), then WRITE on each topic (29) and topic existence
//     (3); if any partition fails those checks the others answer OPERATION_NOT_ATTEMPTED (55) and
//     the coordinator is not called (Apache's handleAddPartitionsToTxnRequest). Then ownership
//     (16), a running coordinator (15) and the coordinator's add; the response has no top-level
//     error field, so a top-level outcome is repeated on every requested partition.
//   - v4+ (the broker shape, KIP-890): batched Transactions[]. CLUSTER_ACTION on the cluster is
//     required (else top-level CLUSTER_AUTHORIZATION_FAILED, 31), then per transaction the same
//     WRITE / ownership / topic gates. VerifyOnly=true is KIP-890 part-1 verification (read-only: a
//     partition not in the transaction answers TRANSACTION_ABORTABLE at v5, INVALID_TXN_STATE at
//     v4); VerifyOnly=false is the TV2 implicit add a leader performs for Produce v12 (Apache's
//     transactionVersionForAddPartitionsToTxn: version > 3 ⇒ TV2).
//   - Coordinator errors: 49 unknown id / pid mismatch, 90 (v2+; 47 before) epoch mismatch, 51
//     while a transaction is Prepare* (its markers are being written), 48 invalid transition.
//
// Version notes: v1 = v0; v2 PRODUCER_FENCED; v3 flexible; v4 batched + VerifyOnly (broker only,
// the Java client builder caps clients at v3); v5 TRANSACTION_ABORTABLE.

import (
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/txn"
)

func init() { register(kmsg.AddPartitionsToTxn, 0, 5, handleAddPartitionsToTxn) }

func handleAddPartitionsToTxn(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.AddPartitionsToTxnRequest)
	resp := req.ResponseKind().(*kmsg.AddPartitionsToTxnResponse)
	if req.Version >= 4 {
		return addPartitionsBatched(rc, req, resp)
	}

	tps := make([]txn.TopicPartitions, len(req.Topics))
	for i, t := range req.Topics {
		tps[i] = txn.TopicPartitions{Topic: t.Topic, Partitions: t.Partitions}
	}
	answer := func(codeOf func(topic string, p int32) int16) {
		resp.Topics = make([]kmsg.AddPartitionsToTxnResponseTopic, len(req.Topics))
		for i, t := range req.Topics {
			rt := kmsg.NewAddPartitionsToTxnResponseTopic()
			rt.Topic = t.Topic
			rt.Partitions = make([]kmsg.AddPartitionsToTxnResponseTopicPartition, len(t.Partitions))
			for j, p := range t.Partitions {
				rp := kmsg.NewAddPartitionsToTxnResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p, codeOf(t.Topic, p)
				rt.Partitions[j] = rp
			}
			resp.Topics[i] = rt
		}
	}
	repeat := func(code int16) func(string, int32) int16 { return func(string, int32) int16 { return code } }

	if !rc.authorized(OpWrite, ResTransactionalID, req.TransactionalID) {
		answer(repeat(codec.CodeTransactionalIDAuthorization))
		return resp, nil
	}
	if bad := topicGate(rc, tps); bad != nil {
		answer(func(topic string, _ int32) int16 {
			if c, ok := bad[topic]; ok {
				return c
			}
			return codec.CodeOperationNotAttempted
		})
		return resp, nil
	}
	if code := txnCoordinatorGate(rc, req.TransactionalID); code != codec.CodeNone {
		answer(repeat(code))
		return resp, nil
	}
	rc.deferReply()
	rc.s.deps.Txn.AddPartitions(txn.AddPartitionsParams{TransactionalID: req.TransactionalID,
		ProducerID: req.ProducerID, ProducerEpoch: req.ProducerEpoch, Partitions: tps, Version: req.Version},
		func(res txn.AddPartitionsResult, err error) {
			defer rc.guard()
			code := res.Code
			if err != nil {
				code = txn.ErrorCode(err)
			}
			answer(repeat(code))
			rc.reply(resp)
		})
	return nil, nil
}

// topicGate checks WRITE and existence for every topic of an add; nil when all pass, else
// topic → error (TOPIC_AUTHORIZATION_FAILED before UNKNOWN_TOPIC_OR_PARTITION, as Apache).
func topicGate(rc *reqCtx, tps []txn.TopicPartitions) map[string]int16 {
	return topicGateAuth(rc, tps, true)
}

// topicExistsGate is topicGate without the WRITE check (v4+, broker-originated).
func topicExistsGate(rc *reqCtx, tps []txn.TopicPartitions) map[string]int16 {
	return topicGateAuth(rc, tps, false)
}

func topicGateAuth(rc *reqCtx, tps []txn.TopicPartitions, auth bool) map[string]int16 {
	var bad map[string]int16
	for _, tp := range tps {
		code := codec.CodeNone
		switch t := rc.s.deps.Store.Topic(tp.Topic); {
		case auth && !rc.authorized(OpWrite, ResTopic, tp.Topic):
			code = codec.CodeTopicAuthorizationFailed
		case t == nil:
			code = codec.CodeUnknownTopicOrPartition
		default:
			for _, p := range tp.Partitions {
				if t.Partition(p) == nil {
					code = codec.CodeUnknownTopicOrPartition
				}
			}
		}
		if code != codec.CodeNone {
			if bad == nil {
				bad = map[string]int16{}
			}
			bad[tp.Topic] = code
		}
	}
	return bad
}

// addPartitionsBatched serves v4+: every transaction of the batch is handled independently and
// the response is sent once all have answered.
func addPartitionsBatched(rc *reqCtx, req *kmsg.AddPartitionsToTxnRequest, resp *kmsg.AddPartitionsToTxnResponse) (kmsg.Response, error) {
	if !rc.authorized(OpClusterAction, ResCluster, clusterResource) {
		resp.ErrorCode = codec.CodeClusterAuthorizationFailed
		return resp, nil
	}
	resp.Transactions = make([]kmsg.AddPartitionsToTxnResponseTransaction, len(req.Transactions))
	fill := func(i int, tps []txn.TopicPartitions, codeAt func(k int) int16) {
		rt := kmsg.NewAddPartitionsToTxnResponseTransaction()
		rt.TransactionalID = req.Transactions[i].TransactionalID
		k := 0
		for _, tp := range tps {
			t := kmsg.NewAddPartitionsToTxnResponseTransactionTopic()
			t.Topic = tp.Topic
			for _, p := range tp.Partitions {
				rp := kmsg.NewAddPartitionsToTxnResponseTransactionTopicPartition()
				rp.Partition, rp.ErrorCode = p, codeAt(k)
				k++
				t.Partitions = append(t.Partitions, rp)
			}
			rt.Topics = append(rt.Topics, t)
		}
		resp.Transactions[i] = rt
	}
	var left atomic.Int32
	left.Store(int32(len(req.Transactions)) + 1)
	rc.deferReply()
	doneOne := func() {
		if left.Add(-1) == 0 {
			rc.reply(resp)
		}
	}
	for i := range req.Transactions {
		rt := &req.Transactions[i]
		tps := make([]txn.TopicPartitions, len(rt.Topics))
		for j, t := range rt.Topics {
			tps[j] = txn.TopicPartitions{Topic: t.Topic, Partitions: t.Partitions}
		}
		// v4+ comes from a broker that holds CLUSTER_ACTION (checked above): as in Apache's
		// KafkaApis, no WRITE on the transactional id or the topics is asked of it; those were
		// the producer's to hold at its own leader.
		if code := txnOwnerGate(rc, rt.TransactionalID); code != codec.CodeNone {
			fill(i, tps, func(int) int16 { return code })
			doneOne()
			continue
		}
		if bad := topicExistsGate(rc, tps); bad != nil {
			fill(i, tps, func(k int) int16 {
				if c, ok := bad[topicAt(tps, k)]; ok {
					return c
				}
				return codec.CodeOperationNotAttempted
			})
			doneOne()
			continue
		}
		results := func(code int16, prs []txn.PartitionResult, err error) {
			defer rc.guard()
			if err != nil {
				code = txn.ErrorCode(err)
			}
			fill(i, tps, func(k int) int16 {
				if code != codec.CodeNone || k >= len(prs) {
					return code
				}
				return prs[k].Code
			})
			doneOne()
		}
		if rt.VerifyOnly {
			rc.s.deps.Txn.Verify(txn.VerifyParams{TransactionalID: rt.TransactionalID, ProducerID: rt.ProducerID,
				ProducerEpoch: rt.ProducerEpoch, Partitions: tps, Abortable: req.Version >= 5},
				func(res txn.VerifyResult, err error) { results(res.Code, res.Results, err) })
			continue
		}
		rc.s.deps.Txn.AddPartitions(txn.AddPartitionsParams{TransactionalID: rt.TransactionalID, ProducerID: rt.ProducerID,
			ProducerEpoch: rt.ProducerEpoch, Partitions: tps, Version: req.Version, Implicit: true},
			func(res txn.AddPartitionsResult, err error) { results(res.Code, res.Results, err) })
	}
	doneOne()
	return nil, nil
}

// topicAt is the topic of the k-th partition of tps (in request order).
func topicAt(tps []txn.TopicPartitions, k int) string {
	for _, tp := range tps {
		if k < len(tp.Partitions) {
			return tp.Topic
		}
		k -= len(tp.Partitions)
	}
	return ""
}
