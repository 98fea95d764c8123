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
//   - The log keeps no epoch cache. On a shared volume a leader change never truncates the log
//     (every leader appends to the same files), so for every epoch up to the current one E the
//     answer "it ends at the log end offset" is one no consumer can mistake for truncation: its
//     position never lies past the log end. endOffsetFor(requested):
//     requested == -1 (UNDEFINED)          → epoch -1, offset -1
//     0 <= requested <= E                  → epoch = requested, log end offset (for E itself this
//     is exactly Apache's answer: the leader's LEO)
//     requested > E (beyond the latest)    → epoch -1, offset -1 (no higher entry exists)
//     requested < -1 (below the first)     → epoch = requested, log start offset (Apache's "floor
//     entry missing" branch; no real client sends this)
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
			var logStart, logEnd int64 // an internal topic's partition is an empty log
			if lp.p != nil {
				logStart, logEnd = lp.p.LogStartOffset(), lp.p.LogEndOffset()
			}
			switch {
			case rp.LeaderEpoch >= 0 && rp.LeaderEpoch <= lp.epoch:
				op.LeaderEpoch, op.EndOffset = rp.LeaderEpoch, logEnd
			case rp.LeaderEpoch < -1:
				op.LeaderEpoch, op.EndOffset = rp.LeaderEpoch, logStart
			default: // -1 (undefined) or an epoch beyond ours
				op.LeaderEpoch, op.EndOffset = -1, -1
			}
		}
	}
	return resp, nil
}
