package server

// LeaveGroup: v0-5
//
// Behavior:
//   - READ on the group, ownership, then the coordinator. v3+ batches members, which may be named
//     by group.instance.id alone (KIP-345 admin removal); each gets its own error. For v0-2 the
//     single member's error is the top-level error (Apache LeaveGroupResponse does the same).
//
// Version notes:
//   - v3: members batch; v4: flexible; v5: reason (KIP-800).

import "github.com/twmb/franz-go/pkg/kmsg"

func init() { register(kmsg.LeaveGroup, 0, 5, handleLeaveGroup) }

func handleLeaveGroup(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.LeaveGroupRequest)
	if code := rc.groupGate(OpRead, req.Group); code != 0 {
		resp := req.ResponseKind().(*kmsg.LeaveGroupResponse)
		resp.ErrorCode = code
		return resp, nil
	}
	rc.deferReply()
	rc.s.deps.Groups.LeaveGroup(req, func(resp *kmsg.LeaveGroupResponse) { rc.reply(resp) })
	return nil, nil
}
