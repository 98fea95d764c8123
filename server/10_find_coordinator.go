package server

// FindCoordinator: v0-5
//
// Behavior:
//   - key_type 0 (group) and 1 (transaction) answer the owner of the key's group shard /
//     transaction slot in the topology (GroupShard / TxnSlot of fnv1a32(key) % 50): its broker id
//     and its host and port on our listener, whether that is this broker or another one. This is
//     Apache's KafkaApis.getCoordinator: the coordinator is the leader of the key's internal
//     topic partition, which any broker can name; NOT_COORDINATOR is what the coordinator APIs
//     (JoinGroup, InitProducerId, ...) answer on a broker that is not it.
//   - No owner registered (Known=false), or an owner that is not a live broker with an endpoint
//     on our listener: COORDINATOR_NOT_AVAILABLE (15), node -1, as Apache when the partition has
//     no leader. The client retries FindCoordinator.
//   - DESCRIBE on the group / transactional id is checked like Apache: GROUP_AUTHORIZATION_FAILED
//     or TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
//   - Any other key type is INVALID_REQUEST.
//
// Version notes:
//   - v1: key_type, error_message; v3: flexible;
//   - v4: batched coordinator_keys with a result per key (KIP-699); v5: TRANSACTION_ABORTABLE.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
)

func init() { register(kmsg.FindCoordinator, 0, 5, handleFindCoordinator) }

const (
	coordinatorKeyGroup int8 = 0
	coordinatorKeyTxn   int8 = 1
)

func handleFindCoordinator(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.FindCoordinatorRequest)
	resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
	var brokers []liveBroker // listed once per request, on the first key that needs it
	find := func(key string) (code int16, node int32, h string, p int32) {
		var o topology.Owner
		switch req.CoordinatorType {
		case coordinatorKeyGroup:
			if !rc.authorized(OpDescribe, ResGroup, key) {
				return codec.CodeGroupAuthorizationFailed, -1, "", -1
			}
			o = rc.s.groupOwner(key)
		case coordinatorKeyTxn:
			if !rc.authorized(OpDescribe, ResTransactionalID, key) {
				return codec.CodeTransactionalIDAuthorization, -1, "", -1
			}
			o = rc.s.txnOwner(key)
		default:
			return codec.CodeInvalidRequest, -1, "", -1
		}
		if !o.Known {
			return codec.CodeCoordinatorNotAvailable, -1, "", -1
		}
		if brokers == nil {
			brokers = rc.s.liveBrokers(rc.c.ln.name)
		}
		b, ok := findBroker(brokers, o.Broker)
		if !ok {
			return codec.CodeCoordinatorNotAvailable, -1, "", -1
		}
		return codec.CodeNone, b.id, b.host, b.port
	}
	if req.Version < 4 {
		resp.ErrorCode, resp.NodeID, resp.Host, resp.Port = find(req.CoordinatorKey)
		return resp, nil
	}
	for _, key := range req.CoordinatorKeys {
		c := kmsg.NewFindCoordinatorResponseCoordinator()
		c.Key = key
		c.ErrorCode, c.NodeID, c.Host, c.Port = find(key)
		resp.Coordinators = append(resp.Coordinators, c)
	}
	return resp, nil
}
