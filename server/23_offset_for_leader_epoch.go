package server

// OffsetForLeaderEpoch: v2-4
//
// Java consumers use this after a metadata change to validate their position (KIP-320): they
// ask for the end offset of the epoch of their last consumed record and reset / report
// truncation if their position lies past it. Advertising it with wrong answers is worse than not
// advertising it (clients retry forever), so the semantics below follow Apache exactly for a log
// that has had a single leader epoch (a single broker), and never report a truncation that did
// not happen otherwise.
//
// Behavior (Apache's Partition.lastOffsetForLeaderEpoch → LeaderEpochFileCache.endOffsetFor):
//   - TOPIC_AUTHORIZATION_FAILED without Describe on the topic (v2+ requires Describe; CLUSTER_ACTION
//     on the cluster, the inter-broker grant, covers every topic), then
//     UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, then the CurrentLeaderEpoch check
//     against the topology's leader epoch (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH, -1 skips
//     it): the shared check of topology.go.
//   - The answer comes from the partition's leader-epoch cache (storage leader-epoch-checkpoint:
//     the start offset of every epoch the partition was led at), as Apache's endOffsetFor:
//     requested == -1 (UNDEFINED)          → epoch -1, offset -1
//     requested >= the log's latest epoch,
//       up to the topology's epoch E       → epoch = requested, log end offset (Apache's answer
//                                            for the current epoch: the leader's LEO)
//     requested > E (beyond the latest)    → epoch -1, offset -1 (no higher entry exists)
//     an older epoch                       → the largest cached epoch <= requested and the start
//                                            offset of the epoch after it
//     requested below every cached epoch   → epoch = requested, start of the first epoch
//                                            (Apache's "floor entry missing" branch)
//     The topology may announce an epoch before the partition has appended at it (the log's
//     latest epoch lags E): every epoch in between ends at the log end, which no consumer can
//     mistake for a truncation.
//   - __consumer_offsets / __transaction_state (internal, no storage log) answer as an empty
//     log: log start = end = 0.
//
// Version notes: v2 CurrentLeaderEpoch, ThrottleMillis; v3 ReplicaID (consumers send -1;
// followers are not supported, we answer them like consumers); v4 flexible.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.OffsetForLeaderEpoch, 2, 4, handleOffsetForLeaderEpoch) }

func handleOffsetForLeaderEpoch(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.OffsetForLeaderEpochRequest)
	resp := req.ResponseKind().(*kmsg.OffsetForLeaderEpochResponse)

	resp.Topics = make([]kmsg.OffsetForLeaderEpochResponseTopic, len(req.Topics))
	// Apache: the API began inter-broker (CLUSTER_ACTION on the cluster covers every topic);
	// KIP-320 consumers need only DESCRIBE per topic.
	topicOp := OpDescribe
	if rc.authorized(OpClusterAction, ResCluster, clusterResource) {
		topicOp = opCallerAuthorized
	}
	for i := range req.Topics {
		rt := &req.Topics[i]
		ot := &resp.Topics[i]
		*ot = kmsg.NewOffsetForLeaderEpochResponseTopic()
		ot.Topic = rt.Topic
		tr := rc.lookupTopic(topicOp, rt.Topic)
		ot.Partitions = make([]kmsg.OffsetForLeaderEpochResponseTopicPartition, len(rt.Partitions))
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			op := &ot.Partitions[j]
			*op = kmsg.NewOffsetForLeaderEpochResponseTopicPartition()
			op.Partition = rp.Partition
			lp, code := rc.localPartition(&tr, rp.Partition, rp.CurrentLeaderEpoch)
			if code != codec.CodeNone {
				op.ErrorCode = code
				continue
			}
			switch {
			case rp.LeaderEpoch == -1 || rp.LeaderEpoch > lp.epoch:
				op.LeaderEpoch, op.EndOffset = -1, -1
			case lp.p == nil: // an internal topic's partition is an empty log
				op.LeaderEpoch, op.EndOffset = rp.LeaderEpoch, 0
			case rp.LeaderEpoch >= lp.p.LeaderEpoch():
				op.LeaderEpoch, op.EndOffset = rp.LeaderEpoch, lp.p.LogEndOffset()
			default:
				op.LeaderEpoch, op.EndOffset = lp.p.EndOffsetForEpoch(rp.LeaderEpoch)
			}
		}
	}
	return resp, nil
}
