package server

// DescribeGroups: v0-6
//
// Behavior:
//   - Per group: DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED), ownership (NOT_COORDINATOR),
//     then the coordinator, which answers from the group's own goroutine (deferred reply, fan-in).
//   - A group that only has committed offsets (for example after a restart, before anyone
//     rejoined) is Empty; an unknown group is Dead with no error (Apache, v0-5) and, from v6
//     (KIP-1043), GROUP_ID_NOT_FOUND with a message, so Kafka 4.x tools report it as such. A
//     consumer (KIP-848) group is answered the same way, with "Group <id> is not a classic
//     group." (Apache 4.1.1, measured): ConsumerGroupDescribe is the API that describes it. Member metadata
//     and assignments are filled only when Stable; client_id and client_host are the member's.
//   - v3+ include_authorized_operations: the bitfield of the group operations the principal holds
//     (READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS, as Apache 4.1)
//     on the group (Kafka AclOperation codes); otherwise INT32_MIN.
//
// Version notes:
//   - v3: authorized operations; v4: group_instance_id; v5: flexible; v6: GROUP_ID_NOT_FOUND and
//     ErrorMessage (KIP-1043).

import (
	"math"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.DescribeGroups, 0, 6, handleDescribeGroups) }

func handleDescribeGroups(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeGroupsRequest)
	resp := req.ResponseKind().(*kmsg.DescribeGroupsResponse)
	groups := append([]string(nil), req.Groups...)
	withOps := req.Version >= 3 && req.IncludeAuthorizedOperations
	resp.Groups = make([]kmsg.DescribeGroupsResponseGroup, len(groups))
	rc.deferReply()
	f := newFanIn(len(groups), func() { rc.reply(resp) })
	for i, id := range groups {
		ops := int32(math.MinInt32)
		if withOps {
			ops = rc.authorizedOps(ResGroup, id, groupOps)
		}
		if code := rc.groupGate(OpDescribe, id); code != codec.CodeNone {
			d := kmsg.NewDescribeGroupsResponseGroup()
			d.Group, d.ErrorCode, d.AuthorizedOperations = id, code, ops
			resp.Groups[i] = d
			f.finish()
			continue
		}
		rc.s.deps.Groups.DescribeGroup(id, func(d kmsg.DescribeGroupsResponseGroup) {
			defer rc.guard()
			d.AuthorizedOperations = ops
			switch {
			case req.Version >= 6 && d.ErrorCode == codec.CodeNone && d.State == "Dead":
				if d.ErrorMessage == nil { // else the coordinator's reason ("is not a classic group")
					msg := "Group " + id + " not found."
					d.ErrorMessage = &msg
				}
				d.ErrorCode = codec.CodeGroupIDNotFound
			case req.Version < 6:
				d.ErrorMessage = nil
			}
			resp.Groups[i] = d
			f.finish()
		})
	}
	return nil, nil
}
