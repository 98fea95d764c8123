package server

// JoinGroup: v0-9
//
// Behavior:
//   - READ on the group (GROUP_AUTHORIZATION_FAILED) and ownership (NOT_COORDINATOR) are checked
//     here; everything else is the classic coordinator (coord/group), which answers through a
//     callback after the rebalance: the handler defers its reply and never blocks the executor.
//   - KIP-394 MEMBER_ID_REQUIRED on a v4+ first join; KIP-345 static members (v5+); KIP-800
//     reasons (v8+) are logged; KIP-814 skip_assignment (v9) for a static leader's rejoin.
//   - A JoinGroup to a KIP-848 consumer group with members joins it as a classic-protocol member
//     (online migration, coord/group/migration.go): answered at once, with no leader and the
//     server's assignment in SyncGroup; INCONSISTENT_GROUP_PROTOCOL unless its protocol type is
//     "consumer" with a protocol the other classic members share.
//
// Version notes:
//   - v1: rebalance_timeout_ms; v4: MEMBER_ID_REQUIRED; v5: group_instance_id; v6: flexible;
//   - v7: protocol_type in the response; v8: reason; v9: skip_assignment.

import (
	"net"
	"strings"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.JoinGroup, 0, 9, handleJoinGroup) }

func handleJoinGroup(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.JoinGroupRequest)
	if code := rc.groupGate(OpRead, req.Group); code != codec.CodeNone {
		resp := req.ResponseKind().(*kmsg.JoinGroupResponse)
		resp.ErrorCode, resp.MemberID, resp.Generation = code, req.MemberID, -1
		return resp, nil
	}
	clientID := ""
	if rc.hdr.ClientID != nil {
		clientID = *rc.hdr.ClientID
	}
	rc.deferReply()
	rc.s.deps.Groups.JoinGroup(req, clientID, rc.clientHost(), func(resp *kmsg.JoinGroupResponse) { rc.reply(resp) })
	return nil, nil
}

// ---- helpers shared by the group handlers (08, 09, 10-16, 42, 47) ----

// groupGate is the common prologue of the group APIs: ACL on the group, a coordinator present,
// ownership of the group, and its shard loaded.
func (rc *reqCtx) groupGate(op Operation, groupID string) int16 {
	if !rc.authorized(op, ResGroup, groupID) {
		return codec.CodeGroupAuthorizationFailed
	}
	if rc.s.deps.Groups == nil {
		return codec.CodeCoordinatorNotAvailable
	}
	if !rc.s.groupOwner(groupID).Local {
		return codec.CodeNotCoordinator
	}
	// The group's shard must be loaded here (14 while it loads, 16 once released).
	return rc.s.deps.Groups.Serving(groupID)
}

// clientHost is the member's host as Kafka reports it in DescribeGroups ("/127.0.0.1").
func (rc *reqCtx) clientHost() string {
	h, _, err := net.SplitHostPort(rc.c.addr)
	if err != nil {
		h = rc.c.addr
	}
	return "/" + h
}

// fanIn counts down asynchronous parts of one request; the last one to finish replies.
type fanIn struct {
	left atomic.Int32
	done func()
}

func newFanIn(n int, done func()) *fanIn {
	f := &fanIn{done: done}
	f.left.Store(int32(n))
	if n == 0 {
		done()
	}
	return f
}

func (f *fanIn) finish() {
	if f.left.Add(-1) == 0 {
		f.done()
	}
}

// GroupConfig maps the broker's group.* settings onto the coordinator's configuration (cmd and
// tests wire the coordinator with it).
// The KIP-848 consumer groups' topic list is wired by the caller (Config.Topics, see
// consumerTopics).
func GroupConfig(cfg configs.Config) group.Config {
	assignors, _ := cfg.ConsumerAssignorNames() // validated with the config
	return group.Config{
		InitialRebalanceDelay: cfg.GroupInitialRebalanceDelay,
		MinSessionTimeout:     cfg.GroupMinSessionTimeout,
		MaxSessionTimeout:     cfg.GroupMaxSessionTimeout,
		MaxSize:               cfg.GroupMaxSize,
		Consumer: group.ConsumerConfig{
			SessionTimeout:    cfg.ConsumerSessionTimeout,
			HeartbeatInterval: cfg.ConsumerHeartbeatInterval,
			MaxSize:           cfg.ConsumerMaxSize,
			Assignors:         assignors,
			MigrationPolicy:   strings.ToLower(cfg.ConsumerMigrationPolicy),
		},
	}
}

// consumerTopics lists the store's topics for KIP-848 subscriptions (name, id, partitions).
func consumerTopics(st *storage.Store) func() []group.TopicInfo {
	return func() []group.TopicInfo {
		ts := st.Topics()
		out := make([]group.TopicInfo, 0, len(ts))
		for _, t := range ts {
			out = append(out, group.TopicInfo{Name: t.Name, ID: t.ID, Partitions: t.NumPartitions()})
		}
		return out
	}
}
