package server

// DescribeProducers: v0 (KIP-664)
//
// Behavior:
//   - Per requested partition, answered by its leader: READ on the topic (else
//     TOPIC_AUTHORIZATION_FAILED, 29), UNKNOWN_TOPIC_OR_PARTITION (3), NOT_LEADER_OR_FOLLOWER (6)
//     (the shared check of topology.go; a partition of an internal topic lists no producers),
//     else every producer the partition holds state for: id, epoch, last sequence, last timestamp,
//     the coordinator epoch of its last marker and the first offset of its ongoing transaction
//     (-1 if none) — what kafka-transactions.sh describe-producers / find-hanging read.
//
// Version notes: v0 only, flexible.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.DescribeProducers, 0, 0, handleDescribeProducers) }

func handleDescribeProducers(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeProducersRequest)
	resp := req.ResponseKind().(*kmsg.DescribeProducersResponse)
	for _, rt := range req.Topics {
		ot := kmsg.NewDescribeProducersResponseTopic()
		ot.Topic = rt.Topic
		tr := rc.lookupTopic(OpRead, rt.Topic)
		for _, pn := range rt.Partitions {
			op := kmsg.NewDescribeProducersResponseTopicPartition()
			op.Partition = pn
			lp, code := rc.localPartition(&tr, pn, -1)
			switch {
			case code != codec.CodeNone:
				op.ErrorCode = code
			case lp.p == nil:
				// An internal topic's partition holds no producer state here (no log).
			default:
				for _, pi := range lp.p.Producers() {
					ap := kmsg.NewDescribeProducersResponseTopicPartitionActiveProducer()
					ap.ProducerID = pi.ProducerID
					ap.ProducerEpoch = int32(pi.Epoch)
					ap.LastSequence = pi.LastSequence
					ap.LastTimestamp = pi.LastTimestamp
					ap.CoordinatorEpoch = pi.CoordinatorEpoch
					ap.CurrentTxnStartOffset = pi.CurrentTxnStartOffset
					op.ActiveProducers = append(op.ActiveProducers, ap)
				}
			}
			ot.Partitions = append(ot.Partitions, op)
		}
		resp.Topics = append(resp.Topics, ot)
	}
	return resp, nil
}
