package server

// OffsetForLeaderEpoch: v2-4
//
// Java consumers use this after a metadata change to validate their position (KIP-320): they
// ask for the end offset of the epoch of their last consumed record and reset / report
// truncation if their position lies past it. Advertising it with wrong answers is worse than not
// advertising it (clients retry forever), so the semantics below follow Apache exactly for a log
// with a single leader epoch.
//
// Behavior (Apache's Partition.lastOffsetForLeaderEpoch → LeaderEpochFileCache.endOffsetFor):
//   - TOPIC_AUTHORIZATION_FAILED without Describe on the topic (v2+ requires Describe), then
//     UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, then the CurrentLeaderEpoch check
//     (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH, -1 skips it).
//   - Our epoch cache has exactly one entry: epoch 0 starting at the log start offset (Apache
//     assigns the leader epoch's start offset when the partition becomes leader and truncates
//     the cache's head with retention). endOffsetFor(requested):
//     requested == -1 (UNDEFINED)       → epoch -1, offset -1
//     requested == 0 (the latest epoch) → epoch 0, log end offset (the leader's LEO, as Apache)
//     requested > 0 (beyond the latest) → epoch -1, offset -1 (no higher entry exists)
//     requested < -1 (below the first)  → epoch = requested, offset = start of epoch 0 (Apache's
//     "floor entry missing" branch; no real client sends this)
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
	store := rc.s.deps.Store

	resp.Topics = make([]kmsg.OffsetForLeaderEpochResponseTopic, len(req.Topics))
	for i := range req.Topics {
		rt := &req.Topics[i]
		ot := &resp.Topics[i]
		*ot = kmsg.NewOffsetForLeaderEpochResponseTopic()
		ot.Topic = rt.Topic
		authorized := rc.authorized(OpDescribe, ResTopic, rt.Topic)
		t := store.Topic(rt.Topic)
		ot.Partitions = make([]kmsg.OffsetForLeaderEpochResponseTopicPartition, len(rt.Partitions))
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			op := &ot.Partitions[j]
			*op = kmsg.NewOffsetForLeaderEpochResponseTopicPartition()
			op.Partition = rp.Partition
			if !authorized {
				op.ErrorCode = codec.CodeTopicAuthorizationFailed
				continue
			}
			if t == nil {
				op.ErrorCode = codec.CodeUnknownTopicOrPartition
				continue
			}
			p := t.Partition(rp.Partition)
			switch {
			case p == nil:
				op.ErrorCode = codec.CodeUnknownTopicOrPartition
			case !rc.s.deps.Owner.LeadsPartition(rt.Topic, rp.Partition):
				op.ErrorCode = codec.CodeNotLeaderForPartition
			default:
				if code := checkLeaderEpoch(rp.CurrentLeaderEpoch); code != codec.CodeNone {
					op.ErrorCode = code
					continue
				}
				switch {
				case rp.LeaderEpoch == partitionLeaderEpoch:
					op.LeaderEpoch, op.EndOffset = partitionLeaderEpoch, p.LogEndOffset()
				case rp.LeaderEpoch < -1:
					op.LeaderEpoch, op.EndOffset = rp.LeaderEpoch, p.LogStartOffset()
				default: // -1 (undefined) or an epoch we never had
					op.LeaderEpoch, op.EndOffset = -1, -1
				}
			}
		}
	}
	return resp, nil
}
