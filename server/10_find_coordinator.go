package server

// FindCoordinator: v0-5
//
// Behavior:
//   - key_type 0 (group) and 1 (transaction) are answered with this broker (advertised host/port,
//     broker.id) when the Ownership seam says we coordinate the key, else NOT_COORDINATOR; a
//     single broker owns everything, cluster mode plugs its routing in behind Ownership.
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
)

func init() { register(kmsg.FindCoordinator, 0, 5, handleFindCoordinator) }

const (
	coordinatorKeyGroup int8 = 0
	coordinatorKeyTxn   int8 = 1
)

func handleFindCoordinator(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.FindCoordinatorRequest)
	resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
	host, port := rc.s.advertised()
	find := func(key string) (code int16, node int32, h string, p int32) {
		switch req.CoordinatorType {
		case coordinatorKeyGroup:
			if !rc.authorized(OpDescribe, ResGroup, key) {
				return codec.CodeGroupAuthorizationFailed, -1, "", -1
			}
			if !rc.s.deps.Owner.OwnsGroup(key) {
				return codec.CodeNotCoordinator, -1, "", -1
			}
		case coordinatorKeyTxn:
			if !rc.authorized(OpDescribe, ResTransactionalID, key) {
				return codec.CodeTransactionalIDAuthorization, -1, "", -1
			}
			if !rc.s.deps.Owner.OwnsTransactionalID(key) {
				return codec.CodeNotCoordinator, -1, "", -1
			}
		default:
			return codec.CodeInvalidRequest, -1, "", -1
		}
		return codec.CodeNone, rc.s.cfg.BrokerID, host, port
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
