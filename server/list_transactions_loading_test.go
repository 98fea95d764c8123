package server

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
)

// TestListTransactionsAnswersLoadInProgressWhileAnAssignedSlotLoads guards kafka-transactions.sh
// list right after a slot moved: the new owner must not answer a list without the slot it is
// still loading (its transactions would be missing from every broker's answer) but
// COORDINATOR_LOAD_IN_PROGRESS, which the admin client retries, as Apache does.
func TestListTransactionsAnswersLoadInProgressWhileAnAssignedSlotLoads(t *testing.T) {
	tb, tbl, rc := tpBroker(t)
	local := tb.cfg.BrokerID
	tbl.RequireLoad()
	for n := 0; n < topology.NumTxnSlots; n++ {
		tbl.SetTxnSlot(n, topology.Owner{Broker: local, Epoch: 1, Known: true, Local: true})
	}
	list := func() int16 {
		t.Helper()
		return fxRoundTrip[*kmsg.ListTransactionsResponse](t, rc, kmsg.NewPtrListTransactionsRequest()).ErrorCode
	}
	if code := list(); code != codec.CodeNone {
		t.Fatalf("every slot loaded: ListTransactions code %d, want 0", code)
	}
	tbl.SetTxnSlot(7, topology.Owner{Broker: local, Epoch: 2, Known: true, Local: false}) // assigned, loading
	if code := list(); code != codec.CodeCoordinatorLoadInProgress {
		t.Fatalf("slot 7 assigned here and loading: ListTransactions code %d, want %d", code, codec.CodeCoordinatorLoadInProgress)
	}
	tbl.SetTxnSlot(7, topology.Owner{Broker: 2, Epoch: 2, Known: true}) // another broker's: not ours to wait for
	if code := list(); code != codec.CodeNone {
		t.Fatalf("slot 7 owned by broker 2: ListTransactions code %d, want 0", code)
	}
	tbl.SetTxnSlot(7, topology.Owner{Broker: local, Epoch: 3, Known: true, Local: true})
	if code := list(); code != codec.CodeNone {
		t.Fatalf("slot 7 loaded: ListTransactions code %d, want 0", code)
	}
}
