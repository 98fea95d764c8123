package server

// OffsetDelete: v0
//
// Behavior (KIP-496):
//   - DELETE on the group (top-level GROUP_AUTHORIZATION_FAILED), ownership (NOT_COORDINATOR);
//     per partition READ on the topic (TOPIC_AUTHORIZATION_FAILED) and the partition must exist
//     (UNKNOWN_TOPIC_OR_PARTITION).
//   - The coordinator answers GROUP_ID_NOT_FOUND for an unknown group, NON_EMPTY_GROUP for a
//     non-consumer group with members, and GROUP_SUBSCRIBED_TO_TOPIC for partitions of topics a
//     member of an active consumer group subscribes to; the others are durably deleted first.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.OffsetDelete, 0, 0, handleOffsetDelete) }

func handleOffsetDelete(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.OffsetDeleteRequest)
	resp := req.ResponseKind().(*kmsg.OffsetDeleteResponse)
	if code := rc.groupGate(OpDelete, req.Group); code != codec.CodeNone {
		resp.ErrorCode = code
		return resp, nil
	}
	type slot struct{ t, p int }
	var slots []slot
	var parts []storage.GroupPartition
	for _, rt := range req.Topics {
		st := kmsg.NewOffsetDeleteResponseTopic()
		st.Topic = rt.Topic
		code := codec.CodeNone
		var topic *storage.Topic
		if !rc.authorized(OpRead, ResTopic, rt.Topic) {
			code = codec.CodeTopicAuthorizationFailed
		} else if topic = rc.s.deps.Store.Topic(rt.Topic); topic == nil {
			code = codec.CodeUnknownTopicOrPartition
		}
		for _, rp := range rt.Partitions {
			sp := kmsg.NewOffsetDeleteResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code
			if code == codec.CodeNone {
				if rp.Partition < 0 || rp.Partition >= topic.NumPartitions() {
					sp.ErrorCode = codec.CodeUnknownTopicOrPartition
				} else {
					slots = append(slots, slot{len(resp.Topics), len(st.Partitions)})
					parts = append(parts, storage.GroupPartition{Topic: rt.Topic, Partition: rp.Partition})
				}
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	rc.deferReply()
	rc.s.deps.Groups.DeleteOffsets(req.Group, parts, func(code int16, partCodes []int16) {
		defer rc.guard()
		if code != codec.CodeNone {
			// A group-level error carries no partitions (Apache).
			resp.ErrorCode = code
			resp.Topics = nil
		} else {
			for i, s := range slots {
				resp.Topics[s.t].Partitions[s.p].ErrorCode = partCodes[i]
			}
		}
		rc.reply(resp)
	})
	return nil, nil
}
