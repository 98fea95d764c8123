package server

// ListTransactions: v0-1 (KIP-664, KIP-994)
//
// Behavior:
//   - Lists the transactions this broker coordinates, filtered by state names, producer ids and
//     (v1) DurationFilterMillis (only transactions open at least that long; <= 0 = no filter).
//     Unknown state names are echoed in UnknownStateFilters and match nothing (Apache).
//   - Entries whose TransactionalId the caller may not DESCRIBE are left out (Apache filters
//     silently, no error). No coordinator → COORDINATOR_NOT_AVAILABLE (15).
//   - Cluster mode: while a transaction slot assigned to this broker is not loaded yet (the
//     agent marks it Local only once the load is done), the answer is
//     COORDINATOR_LOAD_IN_PROGRESS (14) and no list, as Apache's listTransactionStates answers
//     while any of its partitions loads; the admin client retries. A list without that slot
//     would leave its transactions out of `kafka-transactions.sh list` right after a move.
//
// Version notes: v1 DurationFilterMillis. (v2 TransactionalIdPattern, KIP-1152, not served.)

import (
	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
)

var mListTxnsLoading = metrics.NewCounter(`kaas_list_transactions_load_in_progress_total`)

func init() { register(kmsg.ListTransactions, 0, 1, handleListTransactions) }

func handleListTransactions(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ListTransactionsRequest)
	resp := req.ResponseKind().(*kmsg.ListTransactionsResponse)
	tc := rc.s.deps.Txn
	if tc == nil {
		resp.ErrorCode = codec.CodeCoordinatorNotAvailable
		return resp, nil
	}
	topo := rc.s.deps.Topology
	for n := 0; n < topology.NumTxnSlots; n++ {
		if o := topo.TxnSlot(n); o.Known && o.Broker == topo.LocalID() && !o.Local {
			mListTxnsLoading.Inc()
			resp.ErrorCode = codec.CodeCoordinatorLoadInProgress
			return resp, nil
		}
	}
	f := txn.ListFilter{States: req.StateFilters, ProducerIDs: req.ProducerIDFilters, DurationMs: -1}
	if req.Version >= 1 {
		f.DurationMs = req.DurationFilterMillis
	}
	rc.deferReply()
	tc.List(f, func(txns []txn.ListedTxn, unknown []string, err error) {
		defer rc.guard()
		if err != nil {
			resp.ErrorCode = txn.ErrorCode(err)
		}
		resp.UnknownStateFilters = unknown
		for _, lt := range txns {
			if !rc.authorized(OpDescribe, ResTransactionalID, lt.TransactionalID) {
				continue
			}
			st := kmsg.NewListTransactionsResponseTransactionState()
			st.TransactionalID, st.ProducerID, st.TransactionState = lt.TransactionalID, lt.ProducerID, lt.State
			resp.TransactionStates = append(resp.TransactionStates, st)
		}
		rc.reply(resp)
	})
	return nil, nil
}
