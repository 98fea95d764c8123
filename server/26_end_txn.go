package server

// EndTxn: v0-5
//
// Behavior:
//   - WRITE on the TransactionalId (53, before routing is revealed), ownership (16), a running
//     coordinator (15), then the coordinator's EndTxn: TV1 for v0-4, TV2 for v5 (Apache's
//     transactionVersionForEndTxn keys on the request version, not on the finalized feature).
//   - Two-phase, as Apache: the coordinator durably moves Ongoing → Prepare{Commit,Abort} keeping
//     the partition and group lists; then (coord/txn/saga.go) the old epoch is fenced (TV2 bumps the
//     epoch on every EndTxn), COMMIT/ABORT markers are written to every partition and made
//     durable, the staged group offsets are committed or discarded durably, and the coordinator
//     durably completes the transaction.
//   - The answer is sent only after all of that: markers durable, group offsets completed AND the
//     Complete* record durable. Apache answers right after the prepare is logged and lets the
//     next transaction's Add* calls spin on CONCURRENT_TRANSACTIONS until the markers land; waiting
//     costs the producer one marker fsync + one journal sync of latency but means that when
//     commitTransaction() returns, read_committed consumers can already see the data (the LSO has
//     moved) and the committed offsets are fetchable — no window in which the producer believes
//     the transaction done while its effects are still invisible.
//   - A marker or completion failure answers the retriable COORDINATOR_NOT_AVAILABLE (15); the
//     coordinator keeps the transaction prepared and re-drives it (reaper tick or the client's
//     retry, which answers CONCURRENT_TRANSACTIONS while the re-drive is in flight), so a retry in
//     the same direction is idempotent and ends with NONE.
//   - v5 (TV2) answers the producer's next (producerId, producerEpoch): the bumped epoch, or a new
//     id at epoch 0 when the epoch is exhausted. -1/-1 on errors and below v5.
//   - Latency is kaas_request_duration_seconds{api="EndTxn"}, request to answer, like every API.
//
// Version notes: v1 = v0; v2 PRODUCER_FENCED; v3 flexible; v4 TRANSACTION_ABORTABLE;
// v5 ProducerId/ProducerEpoch in the response (KIP-890 part 2).

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/txn"
)

func init() { register(kmsg.EndTxn, 0, 5, handleEndTxn) }

func handleEndTxn(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.EndTxnRequest)
	resp := req.ResponseKind().(*kmsg.EndTxnResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if code := txnCoordinatorGate(rc, req.TransactionalID); code != codec.CodeNone {
		resp.ErrorCode = code
		return resp, nil
	}
	p := txn.EndTxnParams{TransactionalID: req.TransactionalID, ProducerID: req.ProducerID,
		ProducerEpoch: req.ProducerEpoch, Commit: req.Commit, Version: req.Version}
	rc.deferReply()
	// The whole saga runs in the coordinator; this callback is its final answer.
	rc.s.deps.Txn.EndTxn(p, func(res txn.EndTxnResult, err error) {
		defer rc.guard()
		resp.ErrorCode = res.Code
		if err != nil {
			resp.ErrorCode = txn.ErrorCode(err)
		}
		if resp.ErrorCode == codec.CodeNone && req.Version >= 5 {
			resp.ProducerID, resp.ProducerEpoch = res.ProducerID, res.ProducerEpoch
		}
		rc.reply(resp)
	})
	return nil, nil
}
