package server

// DescribeProducers: v0 (KIP-664)
//
// Behavior:
//   - Per requested partition, answered by its leader: READ on the topic (else
//     TOPIC_AUTHORIZATION_FAILED, 29), UNKNOWN_TOPIC_OR_PARTITION (3), NOT_LEADER_OR_FOLLOWER (6),
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
		readOK := rc.authorized(OpRead, ResTopic, rt.Topic)
		t := rc.s.deps.Store.Topic(rt.Topic)
		for _, pn := range rt.Partitions {
			op := kmsg.NewDescribeProducersResponseTopicPartition()
			op.Partition = pn
			switch {
			case !readOK:
				op.ErrorCode = codec.CodeTopicAuthorizationFailed
			case t == nil || t.Partition(pn) == nil:
				op.ErrorCode = codec.CodeUnknownTopicOrPartition
			case !rc.s.deps.Owner.LeadsPartition(rt.Topic, pn):
				op.ErrorCode = codec.CodeNotLeaderForPartition
			default:
				for _, pi := range t.Partition(pn).Producers() {
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
