package server

// DescribeTransactions: v0 (KIP-664)
//
// Behavior:
//   - Per transactional.id: DESCRIBE on the TransactionalId (else 53), ownership (else
//     NOT_COORDINATOR 16), a running coordinator (else 15), unknown id → TRANSACTIONAL_ID_NOT_FOUND
//     (105). Otherwise state (Apache's names: Empty, Ongoing, PrepareCommit, ...), timeout, start
//     timestamp (-1 when no transaction is open), producer id/epoch and the transaction's
//     partitions; topics the caller may not DESCRIBE are left out, as Apache does.
//
// Version notes: v0 only, flexible.

import (
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/txn"
)

func init() { register(kmsg.DescribeTransactions, 0, 0, handleDescribeTransactions) }

func handleDescribeTransactions(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeTransactionsRequest)
	resp := req.ResponseKind().(*kmsg.DescribeTransactionsResponse)
	resp.TransactionStates = make([]kmsg.DescribeTransactionsResponseTransactionState, len(req.TransactionalIDs))
	var left atomic.Int32
	left.Store(int32(len(req.TransactionalIDs)) + 1)
	rc.deferReply()
	done := func() {
		if left.Add(-1) == 0 {
			rc.reply(resp)
		}
	}
	for i, tid := range req.TransactionalIDs {
		st := &resp.TransactionStates[i]
		*st = kmsg.NewDescribeTransactionsResponseTransactionState()
		st.TransactionalID = tid
		st.ProducerID, st.ProducerEpoch, st.StartTimestamp = -1, -1, -1
		code := codec.CodeNone
		switch {
		case !rc.authorized(OpDescribe, ResTransactionalID, tid):
			code = codec.CodeTransactionalIDAuthorization
		case !rc.s.txnOwner(tid).Local:
			code = codec.CodeNotCoordinator
		case rc.s.deps.Txn == nil:
			code = codec.CodeCoordinatorNotAvailable
		}
		if code != codec.CodeNone {
			st.ErrorCode = code
			done()
			continue
		}
		rc.s.deps.Txn.Describe(tid, func(res txn.DescribeResult, err error) {
			defer rc.guard()
			if err != nil {
				st.ErrorCode = txn.ErrorCode(err)
				done()
				return
			}
			st.ErrorCode = res.Code
			if res.Code == codec.CodeNone {
				st.State, st.TimeoutMillis, st.StartTimestamp = res.State, res.TimeoutMs, res.StartTimeMs
				st.ProducerID, st.ProducerEpoch = res.ProducerID, res.ProducerEpoch
				for _, tp := range res.Topics {
					if !rc.authorized(OpDescribe, ResTopic, tp.Topic) {
						continue
					}
					t := kmsg.NewDescribeTransactionsResponseTransactionStateTopic()
					t.Topic, t.Partitions = tp.Topic, tp.Partitions
					st.Topics = append(st.Topics, t)
				}
			}
			done()
		})
	}
	done()
	return nil, nil
}
