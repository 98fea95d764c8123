package server

// AddOffsetsToTxn: v0-4
//
// Behavior:
//   - WRITE on the TransactionalId (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53, before routing
//     is revealed), then READ on the group (else GROUP_AUTHORIZATION_FAILED, 30), then ownership
//     (NOT_COORDINATOR, 16) and a running coordinator (COORDINATOR_NOT_AVAILABLE, 15) — Apache's
//     handleAddOffsetsToTxnRequest order.
//   - The coordinator records the group in the transaction (either Add* call can open it); EndTxn
//     later commits or discards the offsets TxnOffsetCommit staged for it. A Prepare* transaction
//     answers CONCURRENT_TRANSACTIONS (51).
//   - Single top-level error code.
//   - The broker form (cluster mode, txn_offsets_remote.go): a group coordinator on another
//     broker sends v3+ with the tagged field tagTxnOffsetCommitVersion to run the transaction
//     check of a TxnOffsetCommit it serves (v5: the implicit add of the group; v0-4: the group
//     must be in the Ongoing transaction). CLUSTER_ACTION is required (else
//     CLUSTER_AUTHORIZATION_FAILED), then ownership (16) and a running coordinator (15); the
//     answer is the code the TxnOffsetCommit client is to see.
//
// Version notes: v1 = v0; v2 PRODUCER_FENCED; v3 flexible; v4 TRANSACTION_ABORTABLE (TV2 clients
// use TxnOffsetCommit v5 instead and never send this).

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/txn"
)

func init() { register(kmsg.AddOffsetsToTxn, 0, 4, handleAddOffsetsToTxn) }

func handleAddOffsetsToTxn(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.AddOffsetsToTxnRequest)
	resp := req.ResponseKind().(*kmsg.AddOffsetsToTxnResponse)
	if v, ok := txnOffsetCommitTag(req); ok {
		return serveTxnOffsetCommitCheck(rc, req, resp, v) // a group coordinator's TxnOffsetCommit check
	}
	switch {
	case !rc.authorized(OpWrite, ResTransactionalID, req.TransactionalID):
		resp.ErrorCode = codec.CodeTransactionalIDAuthorization
		return resp, nil
	case !rc.authorized(OpRead, ResGroup, req.Group):
		resp.ErrorCode = codec.CodeGroupAuthorizationFailed
		return resp, nil
	}
	if code := txnCoordinatorGate(rc, req.TransactionalID); code != codec.CodeNone {
		resp.ErrorCode = code
		return resp, nil
	}
	rc.deferReply()
	rc.s.deps.Txn.AddOffsets(txn.AddOffsetsParams{TransactionalID: req.TransactionalID, ProducerID: req.ProducerID,
		ProducerEpoch: req.ProducerEpoch, Group: req.Group, Version: req.Version},
		func(res txn.AddOffsetsResult, err error) {
			defer rc.guard()
			resp.ErrorCode = res.Code
			if err != nil {
				resp.ErrorCode = txn.ErrorCode(err)
			}
			rc.reply(resp)
		})
	return nil, nil
}
