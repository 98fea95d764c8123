package server

// ConsumerGroupHeartbeat: v0-1
//
// Behavior:
//   - KIP-848: READ on the group (GROUP_AUTHORIZATION_FAILED), DESCRIBE on every topic subscribed
//     by name (TOPIC_AUTHORIZATION_FAILED) and ownership (NOT_COORDINATOR) here; a regex only
//     resolves to topics the member may DESCRIBE (re-resolved when subscriptions or topics
//     change, not when ACLs do). The rest is coord/group (consumer.go): joins (member epoch 0), leaves (-1, and -2 for
//     a static member's temporary leave), reconciliation towards the server-side assignor's
//     target (uniform or range, group.consumer.assignors), FENCED_MEMBER_EPOCH,
//     UNKNOWN_MEMBER_ID, UNRELEASED_INSTANCE_ID, FENCED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR,
//     INVALID_REGULAR_EXPRESSION, GROUP_MAX_SIZE_REACHED (group.consumer.max.size).
//   - KIP-848 online upgrade (group.consumer.migration.policy): the first join of a classic group
//     with members using protocol type "consumer" converts it, keeping every member's assignment
//     (GROUP_MAX_SIZE_REACHED when it would exceed group.consumer.max.size); see
//     coord/group/migration.go.
//   - The heartbeat interval and session timeout are the broker's group.consumer.* settings.
//   - The answer never waits for a rebalance: the group's goroutine answers at once.
//   - Consumer-group state (epochs, members, target and current assignments) is persisted with
//     the offsets, so a restart or a group-shard move keeps the epochs and assignments.
//
// Version notes:
//   - v0: the coordinator names a joining member; v1: the member names itself (MemberId must
//     be set) and subscribed_topic_regex (RE2 here, as Apache's re2j).

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.ConsumerGroupHeartbeat, 0, 1, handleConsumerGroupHeartbeat) }

func handleConsumerGroupHeartbeat(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ConsumerGroupHeartbeatRequest)
	code := rc.groupGate(OpRead, req.Group)
	if code == codec.CodeNone {
		// Apache: a member may only subscribe by name to topics it may DESCRIBE, so the group
		// cannot tell it about topics it is not allowed to see.
		for _, t := range req.SubscribedTopicNames {
			if !rc.authorized(OpDescribe, ResTopic, t) {
				code = codec.CodeTopicAuthorizationFailed
				break
			}
		}
	}
	if code != codec.CodeNone {
		resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		resp.ErrorCode, resp.MemberEpoch = code, -1
		return resp, nil
	}
	clientID := ""
	if rc.hdr.ClientID != nil {
		clientID = *rc.hdr.ClientID
	}
	// The regex's ACL filter keeps the principal, not the request (which is gone once answered).
	authz, principal, host := rc.s.deps.Authz, rc.c.principal(), rc.c.host()
	canDescribe := func(topic string) bool { return authz.Authorize(principal, host, OpDescribe, ResTopic, topic) }
	rc.deferReply()
	rc.s.deps.Groups.ConsumerGroupHeartbeat(req, clientID, rc.clientHost(), canDescribe, func(resp *kmsg.ConsumerGroupHeartbeatResponse) {
		rc.reply(resp)
	})
	return nil, nil
}
