package server

// InitProducerId: v0-5
//
// Behavior:
//   - Null or empty transactional.id is the idempotent path: any broker answers with a fresh
//     producer id from the persisted block allocator at epoch 0. Like Apache, a KIP-360 request
//     that carries the producer's current id/epoch still gets a brand-new id (Apache's
//     TransactionCoordinator.handleInitProducerId "blindly" allocates for a null id). Its ACL
//     gate is Apache 4.1's, relaxed by KIP-679 so that idempotence (on by default since 3.0)
//     needs no extra grant: IDEMPOTENT_WRITE on the cluster OR WRITE on at least one topic (an
//     authorizeByResourceType question), else CLUSTER_AUTHORIZATION_FAILED. A principal that may
//     write somewhere is never refused; Produce's per-topic WRITE is the real enforcement point.
//   - An allocator failure answers COORDINATOR_NOT_AVAILABLE (retriable): we never hand out a PID
//     whose block was not persisted first.
//   - A non-empty transactional.id belongs to the transaction coordinator
//     (initTransactionalProducer below): WRITE on the TransactionalId (else
//     TRANSACTIONAL_ID_AUTHORIZATION_FAILED, before routing is revealed), ownership (else
//     NOT_COORDINATOR), a running coordinator (else COORDINATOR_NOT_AVAILABLE), then the
//     coordinator's InitProducerId (KIP-98 / KIP-360 / Apache's fence-on-init: an Ongoing
//     transaction is aborted and the caller gets CONCURRENT_TRANSACTIONS until the abort is done).
//     Every epoch bump is fenced on every partition before the answer leaves, so the old session's
//     writes are rejected from the moment the new one holds its epoch.
//
// Version notes:
//   - v2: flexible; v3: ProducerID/ProducerEpoch in the request (KIP-360);
//   - v4: PRODUCER_FENCED; v5: TRANSACTION_ABORTABLE.

import (
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/txn"
)

func init() { register(kmsg.InitProducerID, 0, 5, handleInitProducerID) }

func handleInitProducerID(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.InitProducerIDRequest)
	resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if req.TransactionalID != nil && *req.TransactionalID != "" {
		return initTransactionalProducer(rc, req, resp)
	}
	if !rc.authorized(OpIdempotentWrite, ResCluster, clusterResource) && !rc.authorizedAny(OpWrite, ResTopic) {
		resp.ErrorCode = codec.CodeClusterAuthorizationFailed
		return resp, nil
	}
	pid, err := rc.s.deps.PIDs.Next()
	if err != nil {
		rc.s.log.Error("cannot allocate producer id", zap.Error(err))
		resp.ErrorCode = codec.CodeCoordinatorNotAvailable
		return resp, nil
	}
	resp.ProducerID, resp.ProducerEpoch = pid, 0
	return resp, nil
}

// initTransactionalProducer is the coordinator path of InitProducerId.
var initTransactionalProducer = func(rc *reqCtx, req *kmsg.InitProducerIDRequest, resp *kmsg.InitProducerIDResponse) (kmsg.Response, error) {
	tid := *req.TransactionalID
	if code := txnCoordinatorGate(rc, tid); code != codec.CodeNone {
		resp.ErrorCode = code
		return resp, nil
	}
	tc := rc.s.deps.Txn
	p := txn.InitProducerIDParams{TransactionalID: tid, TimeoutMs: req.TransactionTimeoutMillis,
		ProducerID: -1, ProducerEpoch: -1, Version: req.Version}
	if req.Version >= 3 {
		p.ProducerID, p.ProducerEpoch = req.ProducerID, req.ProducerEpoch
	}
	rc.deferReply()
	tc.InitProducerID(p, func(res txn.InitProducerIDResult, err error) {
		defer rc.guard()
		if err != nil {
			resp.ErrorCode = txn.ErrorCode(err)
			rc.reply(resp)
			return
		}
		// The coordinator has fenced the old epoch before answering; the abort markers of a
		// rejoin complete in the background (the client retries its CONCURRENT_TRANSACTIONS).
		resp.ErrorCode = res.Code
		if res.Code == codec.CodeNone {
			resp.ProducerID, resp.ProducerEpoch = res.ProducerID, res.ProducerEpoch
		}
		rc.reply(resp)
	})
	return nil, nil
}

// txnCoordinatorGate is the shared front of the coordinator-side transactional handlers (22, 24,
// 25, 26), in Apache's order: WRITE on the TransactionalId first, so an unauthorized caller
// learns nothing about routing (53); then ownership (16); then a running coordinator (15).
func txnCoordinatorGate(rc *reqCtx, tid string) int16 {
	if !rc.authorized(OpWrite, ResTransactionalID, tid) {
		return codec.CodeTransactionalIDAuthorization
	}
	return txnOwnerGate(rc, tid)
}

// txnOwnerGate is txnCoordinatorGate without the WRITE check (requests a broker sends under
// CLUSTER_ACTION).
func txnOwnerGate(rc *reqCtx, tid string) int16 {
	if !rc.s.txnOwner(tid).Local {
		return codec.CodeNotCoordinator
	}
	if rc.s.deps.Txn == nil {
		return codec.CodeCoordinatorNotAvailable
	}
	return codec.CodeNone
}
