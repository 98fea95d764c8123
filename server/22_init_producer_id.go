package server

// InitProducerId: v0-5
//
// Behavior:
//   - Null or empty transactional.id is the idempotent path: any broker answers with a fresh
//     producer id from the persisted block allocator at epoch 0. Like Apache, a KIP-360 request
//     that carries the producer's current id/epoch still gets a brand-new id (Apache's
//     TransactionCoordinator.handleInitProducerId "blindly" allocates for a null id). This path is
//     not ACL-gated (KIP-679); Produce's topic WRITE check is the enforcement point.
//   - An allocator failure answers COORDINATOR_NOT_AVAILABLE (retriable): we never hand out a PID
//     whose block was not persisted first.
//   - A non-empty transactional.id belongs to the transaction coordinator (issue 4); until it is
//     served the request is answered INVALID_REQUEST so a transactional producer fails fast
//     instead of retrying forever.
//
// Version notes:
//   - v2: flexible; v3: ProducerID/ProducerEpoch in the request (KIP-360);
//   - v4: PRODUCER_FENCED; v5: TRANSACTION_ABORTABLE.

import (
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.InitProducerID, 0, 5, handleInitProducerID) }

func handleInitProducerID(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.InitProducerIDRequest)
	resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if req.TransactionalID != nil && *req.TransactionalID != "" {
		if h := initTransactionalProducer; h != nil {
			return h(rc, req, resp)
		}
		resp.ErrorCode = codec.CodeInvalidRequest
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

// initTransactionalProducer is installed by the transaction coordinator wiring.
var initTransactionalProducer func(rc *reqCtx, req *kmsg.InitProducerIDRequest, resp *kmsg.InitProducerIDResponse) (kmsg.Response, error)
