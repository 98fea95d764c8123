package server

// OffsetCommit: v2-9
//
// Behavior:
//   - READ on the group, else every partition GROUP_AUTHORIZATION_FAILED; NOT_COORDINATOR if we
//     do not own the group. Per partition: READ on the topic (TOPIC_AUTHORIZATION_FAILED), the
//     partition must exist (UNKNOWN_TOPIC_OR_PARTITION), metadata at most 4096 bytes
//     (OFFSET_METADATA_TOO_LARGE). Those partitions are answered here and the rest go to the
//     coordinator.
//   - The coordinator validates the committer like Apache: members need the current generation
//     and a known member id (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID,
//     REBALANCE_IN_PROGRESS while CompletingRebalance); generation -1 without a member id is a
//     simple commit, allowed while the group has no members.
//   - The answer comes only after the offsets are fsync'd (deferred reply; concurrent commits share
//     fsyncs). A failed write answers NOT_COORDINATOR (Apache's mapping of a storage error), never
//     success. committed_leader_epoch and metadata are stored and returned by OffsetFetch.
//
// Version notes:
//   - v2-4: retention_time_ms (ignored, as Apache does since 2.1: offsets.retention governs);
//   - v6: committed_leader_epoch; v7: group_instance_id; v8: flexible; v9: KIP-848 member epoch
//     (= generation for a classic group). v10 (topic ids) is not served.
//   - A KIP-848 consumer group checks the member id and member epoch instead: UNKNOWN_MEMBER_ID,
//     STALE_MEMBER_EPOCH (113) for any other epoch, UNSUPPORTED_VERSION below v9; a negative
//     epoch is a simple commit, allowed while the group has no members.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.OffsetCommit, 2, 9, handleOffsetCommit) }

func handleOffsetCommit(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.OffsetCommitRequest)
	resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	gate := rc.groupGate(OpRead, req.Group)
	type slot struct{ t, p int }
	var pending []slot
	var offs []storage.GroupOffset
	for _, rt := range req.Topics {
		st := kmsg.NewOffsetCommitResponseTopic()
		st.Topic = rt.Topic
		topicCode := gate
		var topic *storage.Topic
		if topicCode == codec.CodeNone {
			if !rc.authorized(OpRead, ResTopic, rt.Topic) {
				topicCode = codec.CodeTopicAuthorizationFailed
			} else if topic = rc.s.deps.Store.Topic(rt.Topic); topic == nil {
				topicCode = codec.CodeUnknownTopicOrPartition
			}
		}
		for _, rp := range rt.Partitions {
			sp := kmsg.NewOffsetCommitResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = topicCode
			if topicCode == codec.CodeNone {
				epoch := rp.LeaderEpoch
				if req.Version < 6 {
					epoch = -1
				}
				var o storage.GroupOffset
				if o, sp.ErrorCode = groupOffset(topic, rt.Topic, rp.Partition, rp.Offset, epoch, rp.Metadata); sp.ErrorCode == codec.CodeNone {
					offs = append(offs, o)
					pending = append(pending, slot{len(resp.Topics), len(st.Partitions)})
				}
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	if len(offs) == 0 {
		return resp, nil
	}
	cm := group.Commit{Group: req.Group, Generation: req.Generation, MemberID: req.MemberID, Version: req.Version}
	if req.InstanceID != nil {
		cm.InstanceID = *req.InstanceID
	}
	rc.deferReply()
	rc.s.deps.Groups.CommitOffsets(cm, offs, func(code int16) {
		defer rc.guard()
		for _, s := range pending {
			resp.Topics[s.t].Partitions[s.p].ErrorCode = code
		}
		rc.reply(resp)
	})
	return nil, nil
}

// groupOffset checks one partition of an OffsetCommit or TxnOffsetCommit (the partition exists,
// metadata within offset.metadata.max.bytes) and builds the offset to store.
func groupOffset(topic *storage.Topic, name string, partition int32, offset int64, epoch int32, metadata *string) (storage.GroupOffset, int16) {
	switch {
	case partition < 0 || partition >= topic.NumPartitions():
		return storage.GroupOffset{}, codec.CodeUnknownTopicOrPartition
	case metadata != nil && len(*metadata) > group.MaxMetadataBytes:
		return storage.GroupOffset{}, codec.CodeOffsetMetadataTooLarge
	}
	md := ""
	if metadata != nil {
		md = *metadata
	}
	return storage.GroupOffset{Topic: name, Partition: partition, Offset: offset, LeaderEpoch: epoch, Metadata: md}, codec.CodeNone
}
