package server

// OffsetFetch: v1-9
//
// Behavior:
//   - DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) and ownership (NOT_COORDINATOR); per
//     topic DESCRIBE (TOPIC_AUTHORIZATION_FAILED for a requested topic; unauthorized topics are
//     left out of an all-topics answer).
//   - Committed offsets are returned whatever the group's state and whether or not any member
//     ever rejoined after a restart (the store is loaded at start). An uncommitted partition
//     answers offset -1, leader epoch -1, metadata "" and no error (Apache).
//   - require_stable (KIP-447, v7+): a partition with pending transactional offsets answers
//     UNSTABLE_OFFSET_COMMIT (88) so the consumer retries rather than start from a stale position.
//   - Group-level errors: v1 on every requested partition, v2-7 in the top-level error_code, v8+
//     per group.
//
// Version notes:
//   - v2: null topics = all, top-level error; v3: throttle; v5: committed_leader_epoch;
//   - v6: flexible; v7: require_stable; v8: batched groups (KIP-709); v9: member id/epoch
//     (KIP-848: a consumer group answers UNKNOWN_MEMBER_ID or STALE_MEMBER_EPOCH for a member
//     that is not current; not validated for classic groups, nor without a member, as Apache).
//     v10 (topic ids) is not served.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.OffsetFetch, 1, 9, handleOffsetFetch) }

// offsetFetchPart is one partition answer, version-neutral.
type offsetFetchPart struct {
	partition   int32
	offset      int64
	leaderEpoch int32
	metadata    string
	code        int16
}

type offsetFetchMember struct {
	id    *string
	epoch int32
}

type offsetFetchTopic struct {
	topic string
	parts []offsetFetchPart
}

// fetchGroupOffsets answers one group: topics nil means all. The group-level code is NONE unless
// the whole group failed.
//
// member, when set (v9+), is the requesting consumer-group member: a KIP-848 group checks its id
// and epoch (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH).
func (rc *reqCtx) fetchGroupOffsets(groupID string, member *offsetFetchMember, topics map[string][]int32, order []string, all, requireStable bool) (int16, []offsetFetchTopic) {
	if code := rc.groupGate(OpDescribe, groupID); code != codec.CodeNone {
		return code, nil
	}
	if member != nil {
		if code := rc.s.deps.Groups.ValidateOffsetFetch(groupID, member.id, member.epoch); code != codec.CodeNone {
			return code, nil
		}
	}
	var out []offsetFetchTopic
	if all {
		_, got := rc.s.deps.Groups.FetchOffsets(groupID, nil, requireStable)
		idx := map[string]int{}
		for _, o := range got {
			if !rc.authorized(OpDescribe, ResTopic, o.Topic) {
				continue
			}
			i, ok := idx[o.Topic]
			if !ok {
				i = len(out)
				idx[o.Topic] = i
				out = append(out, offsetFetchTopic{topic: o.Topic})
			}
			out[i].parts = append(out[i].parts, offsetFetchPart{o.Partition, o.Offset, o.LeaderEpoch, o.Metadata, o.Code})
		}
		return codec.CodeNone, out
	}
	var parts []storage.GroupPartition
	for _, t := range order {
		if !rc.authorized(OpDescribe, ResTopic, t) {
			continue
		}
		for _, p := range topics[t] {
			parts = append(parts, storage.GroupPartition{Topic: t, Partition: p})
		}
	}
	code, got := rc.s.deps.Groups.FetchOffsets(groupID, parts, requireStable)
	if code != codec.CodeNone {
		return code, nil
	}
	k := 0
	for _, t := range order {
		ft := offsetFetchTopic{topic: t}
		authorized := rc.authorized(OpDescribe, ResTopic, t)
		for _, p := range topics[t] {
			if !authorized {
				ft.parts = append(ft.parts, offsetFetchPart{p, -1, -1, "", codec.CodeTopicAuthorizationFailed})
				continue
			}
			o := got[k]
			k++
			ft.parts = append(ft.parts, offsetFetchPart{o.Partition, o.Offset, o.LeaderEpoch, o.Metadata, o.Code})
		}
		out = append(out, ft)
	}
	return codec.CodeNone, out
}

func handleOffsetFetch(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.OffsetFetchRequest)
	resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
	if req.Version >= 8 {
		for _, rg := range req.Groups {
			topics, order := map[string][]int32{}, []string(nil)
			for _, t := range rg.Topics {
				if _, ok := topics[t.Topic]; !ok {
					order = append(order, t.Topic)
				}
				topics[t.Topic] = append(topics[t.Topic], t.Partitions...)
			}
			var member *offsetFetchMember
			if req.Version >= 9 {
				member = &offsetFetchMember{id: rg.MemberID, epoch: rg.MemberEpoch}
			}
			code, res := rc.fetchGroupOffsets(rg.Group, member, topics, order, rg.Topics == nil, req.RequireStable)
			g := kmsg.NewOffsetFetchResponseGroup()
			g.Group = rg.Group
			g.ErrorCode = code
			for _, ft := range res {
				t := kmsg.NewOffsetFetchResponseGroupTopic()
				t.Topic = ft.topic
				for _, fp := range ft.parts {
					p := kmsg.NewOffsetFetchResponseGroupTopicPartition()
					md := fp.metadata
					p.Partition, p.Offset, p.LeaderEpoch, p.Metadata, p.ErrorCode = fp.partition, fp.offset, fp.leaderEpoch, &md, fp.code
					t.Partitions = append(t.Partitions, p)
				}
				g.Topics = append(g.Topics, t)
			}
			resp.Groups = append(resp.Groups, g)
		}
		return resp, nil
	}
	topics, order := map[string][]int32{}, []string(nil)
	for _, t := range req.Topics {
		if _, ok := topics[t.Topic]; !ok {
			order = append(order, t.Topic)
		}
		topics[t.Topic] = append(topics[t.Topic], t.Partitions...)
	}
	all := req.Topics == nil && req.Version >= 2
	code, res := rc.fetchGroupOffsets(req.Group, nil, topics, order, all, req.Version >= 7 && req.RequireStable)
	if code != codec.CodeNone {
		if req.Version >= 2 {
			resp.ErrorCode = code
			return resp, nil
		}
		// v1 has no top-level error: every requested partition carries it.
		res = nil
		for _, t := range order {
			ft := offsetFetchTopic{topic: t}
			for _, p := range topics[t] {
				ft.parts = append(ft.parts, offsetFetchPart{p, -1, -1, "", code})
			}
			res = append(res, ft)
		}
	}
	for _, ft := range res {
		t := kmsg.NewOffsetFetchResponseTopic()
		t.Topic = ft.topic
		for _, fp := range ft.parts {
			p := kmsg.NewOffsetFetchResponseTopicPartition()
			md := fp.metadata
			p.Partition, p.Offset, p.LeaderEpoch, p.Metadata, p.ErrorCode = fp.partition, fp.offset, fp.leaderEpoch, &md, fp.code
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	return resp, nil
}
