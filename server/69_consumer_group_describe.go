package server

// ConsumerGroupDescribe: v0-1
//
// Behavior:
//   - KIP-848: per group, DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) and ownership
//     (NOT_COORDINATOR), then the coordinator: group epoch, target assignment epoch, assignor,
//     and every member with its epoch, subscription, current and target assignment (topic ids
//     and names). GROUP_ID_NOT_FOUND for a group that does not exist or is a classic group.
//   - include_authorized_operations: the group operations the principal holds; otherwise
//     INT32_MIN.
//
// Version notes:
//   - v1: member_type (1: a consumer-protocol member).

import (
	"math"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.ConsumerGroupDescribe, 0, 1, handleConsumerGroupDescribe) }

func handleConsumerGroupDescribe(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ConsumerGroupDescribeRequest)
	resp := req.ResponseKind().(*kmsg.ConsumerGroupDescribeResponse)
	groups := append([]string(nil), req.Groups...)
	resp.Groups = make([]kmsg.ConsumerGroupDescribeResponseGroup, len(groups))
	rc.deferReply()
	f := newFanIn(len(groups), func() { rc.reply(resp) })
	for i, id := range groups {
		ops := int32(math.MinInt32)
		if req.IncludeAuthorizedOperations {
			ops = rc.authorizedOps(ResGroup, id, groupOps)
		}
		if code := rc.groupGate(OpDescribe, id); code != codec.CodeNone {
			d := kmsg.NewConsumerGroupDescribeResponseGroup()
			d.Group, d.ErrorCode, d.AuthorizedOperations = id, code, ops
			resp.Groups[i] = d
			f.finish()
			continue
		}
		rc.s.deps.Groups.DescribeConsumerGroup(id, func(d kmsg.ConsumerGroupDescribeResponseGroup) {
			defer rc.guard()
			d.AuthorizedOperations = ops
			resp.Groups[i] = d
			f.finish()
		})
	}
	return nil, nil
}
