package server

// Heartbeat: v0-4
//
// Behavior:
//   - READ on the group, ownership, then the coordinator: UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID
//     (static), ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS while preparing a rebalance (how members
//     learn they must rejoin). A heartbeat restarts the member's session timeout.
//
// Version notes:
//   - v3: group_instance_id (KIP-345); v4: flexible.

import "github.com/twmb/franz-go/pkg/kmsg"

func init() { register(kmsg.Heartbeat, 0, 4, handleHeartbeat) }

func handleHeartbeat(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.HeartbeatRequest)
	if code := rc.groupGate(OpRead, req.Group); code != 0 {
		resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = code
		return resp, nil
	}
	rc.deferReply()
	rc.s.deps.Groups.Heartbeat(req, func(resp *kmsg.HeartbeatResponse) { rc.reply(resp) })
	return nil, nil
}
