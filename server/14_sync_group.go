package server

// SyncGroup: v0-5
//
// Behavior:
//   - READ on the group, ownership, then the coordinator. The leader's assignments are opaque
//     bytes: copied and handed to each member, never parsed; a member the leader left out gets a
//     real empty assignment. Followers wait (deferred reply) until the leader's SyncGroup lands.
//   - v5 protocol_type / protocol_name must match the group's (INCONSISTENT_GROUP_PROTOCOL).
//
// Version notes:
//   - v3: group_instance_id; v4: flexible; v5: protocol_type and protocol_name (KIP-559).

import "github.com/twmb/franz-go/pkg/kmsg"

func init() { register(kmsg.SyncGroup, 0, 5, handleSyncGroup) }

func handleSyncGroup(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.SyncGroupRequest)
	if code := rc.groupGate(OpRead, req.Group); code != 0 {
		resp := req.ResponseKind().(*kmsg.SyncGroupResponse)
		resp.ErrorCode = code
		return resp, nil
	}
	rc.deferReply()
	rc.s.deps.Groups.SyncGroup(req, func(resp *kmsg.SyncGroupResponse) { rc.reply(resp) })
	return nil, nil
}
