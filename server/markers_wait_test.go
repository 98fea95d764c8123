package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/txn"
)

func endTxnCode(t *testing.T, rc *rawConn, tid string, pid int64, epoch int16, commit bool) int16 {
	t.Helper()
	e := kmsg.NewPtrEndTxnRequest()
	e.Version = 3
	e.TransactionalID, e.ProducerID, e.ProducerEpoch, e.Commit = tid, pid, epoch, commit
	return fxRoundTrip[*kmsg.EndTxnResponse](t, rc, e).ErrorCode
}

// TestClusterEndTxnAnswers15WhileLeaderDownThenCommits: one of the transaction's remote leaders
// is down (crashed, its lease not yet expired), so its marker cannot be written. EndTxn answers
// COORDINATOR_NOT_AVAILABLE once the (shortened) marker wait has passed, while the coordinator
// keeps sending; meanwhile AddPartitionsToTxn, AddOffsetsToTxn, KIP-890 verification and
// InitProducerId for the id answer CONCURRENT_TRANSACTIONS, so no later transaction overtakes the markers. Once the
// partition has a new leader the marker lands, and a retried EndTxn answers NONE (51 until then);
// both partitions are then stable, read_committed sees the records, and one more retry of the
// completed commit answers NONE too.
func TestClusterEndTxnAnswers15WhileLeaderDownThenCommits(t *testing.T) {
	const wait = 500 * time.Millisecond
	tc := startTestClusterWith(t, 3, func(_ int32, _ *configs.Config, opts *BrokerOptions) { opts.EndTxnMarkerWait = wait })
	const topic = "mkw"
	tc.createTopic(topic, 3, 3)
	tid, c, parts := tc.txnPlacement("mkw", topic)
	p1, p2 := parts[0], parts[1]
	rc := dialRaw(t, tc.broker(c).Addr().String())
	pid, epoch := rawInit(t, rc, tid)
	rawAddPartition(t, rc, tid, pid, epoch, topic, p1)
	rawAddPartition(t, rc, tid, pid, epoch, topic, p2)
	tc.appendTxnData(topic, p1, pid, epoch, 0, "w1")
	tc.appendTxnData(topic, p2, pid, epoch, 0, "w2")
	down := tc.owner(topic, p1)
	tc.crash(down.Broker)

	// The takeover needs the crashed leader's lease to expire (the session timeout, 6 s), far
	// longer than the wait: EndTxn answers 15 first.
	rc = dialRaw(t, tc.broker(c).Addr().String())
	start := time.Now()
	if code := endTxnCode(t, rc, tid, pid, epoch, true); code != codec.CodeCoordinatorNotAvailable {
		t.Fatalf("EndTxn with a leader down: %v, want COORDINATOR_NOT_AVAILABLE after the marker wait", kerr.ErrorForCode(code))
	}
	if took := time.Since(start); took < wait {
		t.Fatalf("EndTxn answered 15 after %v, before the marker wait of %v", took, wait)
	}

	// Nothing may start the next transaction meanwhile.
	ap := kmsg.NewPtrAddPartitionsToTxnRequest()
	ap.Version = 3
	ap.TransactionalID, ap.ProducerID, ap.ProducerEpoch = tid, pid, epoch
	ap.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: topic, Partitions: []int32{p1}}}
	if r := fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, ap); r.Topics[0].Partitions[0].ErrorCode != codec.CodeConcurrentTransactions {
		t.Fatalf("AddPartitionsToTxn while the markers are pending: %v, want 51", kerr.ErrorForCode(r.Topics[0].Partitions[0].ErrorCode))
	}
	ao := kmsg.NewPtrAddOffsetsToTxnRequest()
	ao.Version = 3
	ao.TransactionalID, ao.ProducerID, ao.ProducerEpoch, ao.Group = tid, pid, epoch, "mkw-g"
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, ao); r.ErrorCode != codec.CodeConcurrentTransactions {
		t.Fatalf("AddOffsetsToTxn while the markers are pending: %v, want 51", kerr.ErrorForCode(r.ErrorCode))
	}
	// KIP-890 verification, as a partition leader asks it before a first transactional write.
	vr := kmsg.NewPtrAddPartitionsToTxnRequest()
	vr.Version = 5
	vt := kmsg.NewAddPartitionsToTxnRequestTransaction()
	vt.TransactionalID, vt.ProducerID, vt.ProducerEpoch, vt.VerifyOnly = tid, pid, epoch, true
	vt.Topics = []kmsg.AddPartitionsToTxnRequestTransactionTopic{{Topic: topic, Partitions: []int32{p2}}}
	vr.Transactions = []kmsg.AddPartitionsToTxnRequestTransaction{vt}
	if r := fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, vr); r.ErrorCode != 0 ||
		r.Transactions[0].Topics[0].Partitions[0].ErrorCode != codec.CodeConcurrentTransactions {
		t.Fatalf("verification while the markers are pending: top-level %v, partition %v; want 51 on the partition",
			kerr.ErrorForCode(r.ErrorCode), kerr.ErrorForCode(r.Transactions[0].Topics[0].Partitions[0].ErrorCode))
	}
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.Version = 4
	ip.TransactionalID = kmsg.StringPtr(tid)
	ip.TransactionTimeoutMillis = 60000
	ip.ProducerID, ip.ProducerEpoch = pid, epoch
	if r := fxRoundTrip[*kmsg.InitProducerIDResponse](t, rc, ip); r.ErrorCode != codec.CodeConcurrentTransactions {
		t.Fatalf("InitProducerId while the markers are pending: %v, want 51", kerr.ErrorForCode(r.ErrorCode))
	}

	// The client retries EndTxn: 51 while the markers are pending, NONE once Complete* is durable.
	checkFor(t, 90*time.Second, 100*time.Millisecond, func() error {
		code := endTxnCode(t, dialRaw(t, tc.broker(c).Addr().String()), tid, pid, epoch, true)
		switch code {
		case codec.CodeNone:
			return nil
		case codec.CodeConcurrentTransactions:
			return fmt.Errorf("retried EndTxn: still pending")
		}
		t.Fatalf("retried EndTxn: %v, want 51 or NONE", kerr.ErrorForCode(code))
		return nil
	})
	if o := tc.owner(topic, p1); o.Broker == down.Broker {
		t.Fatalf("partition %d still led by the crashed broker %d", p1, down.Broker)
	}
	tc.stableAt(topic, p1, 2)
	tc.stableAt(topic, p2, 2)
	equalValues(t, "partition 1 on its new leader", tc.readCommittedOnce(topic, p1), "w1")
	equalValues(t, "partition 2", tc.readCommittedOnce(topic, p2), "w2")
	if code := endTxnCode(t, dialRaw(t, tc.broker(c).Addr().String()), tid, pid, epoch, true); code != codec.CodeNone {
		t.Fatalf("retry of the completed commit: %v, want NONE", kerr.ErrorForCode(code))
	}
}

// TestClusterLateMarkerCopyDoesNotCloseNextTransaction: a copy of transaction 1's COMMIT marker
// (as the coordinator sent it, with its prepare sequence) reaches the remote leader after the
// producer's next transaction (TV1: same epoch) has written there. The leader answers NONE and
// writes nothing: transaction 2 stays open and invisible to read_committed. A marker without the
// tag (what an Apache coordinator or kafka-transactions.sh abort sends) still closes it, and the
// coordinator's own abort of transaction 2 afterwards is not written twice.
func TestClusterLateMarkerCopyDoesNotCloseNextTransaction(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "mkd"
	tc.createTopic(topic, 3, 3)
	tid, c, parts := tc.txnPlacement("mkd", topic)
	part := parts[0]
	leader := tc.owner(topic, part).Broker
	rc := dialRaw(t, tc.broker(c).Addr().String())
	pid, epoch := rawInit(t, rc, tid)
	rawAddPartition(t, rc, tid, pid, epoch, topic, part)
	tc.appendTxnData(topic, part, pid, epoch, 0, "t1")
	rawEndTxn(t, rc, tid, pid, epoch, true)
	ch := make(chan *txn.Entry, 1)
	tc.broker(c).Txn.Snapshot(tid, func(e *txn.Entry, err error) {
		if err != nil {
			t.Error(err)
		}
		ch <- e
	})
	e := <-ch
	if e == nil || e.State != txn.CompleteCommit || e.PrepareSeq == 0 {
		t.Fatalf("coordinator entry after the commit: %+v", e)
	}

	rawAddPartition(t, rc, tid, pid, epoch, topic, part)
	tc.appendTxnData(topic, part, pid, epoch, 1, "t2")
	p := tc.broker(leader).Store.Topic(topic).Partition(part)
	if leo, lso := p.LogEndOffset(), p.LastStableOffset(); leo != 3 || lso != 2 {
		t.Fatalf("before the late copy: LEO %d LSO %d, want 3 and 2", leo, lso)
	}
	marker := func(seq uint64, commit bool) int16 {
		wm := kmsg.NewPtrWriteTxnMarkersRequest()
		wm.Version = 1
		m := kmsg.NewWriteTxnMarkersRequestMarker()
		m.ProducerID, m.ProducerEpoch, m.Committed, m.CoordinatorEpoch = pid, epoch, commit, e.CoordinatorEpoch
		m.Topics = []kmsg.WriteTxnMarkersRequestMarkerTopic{{Topic: topic, Partitions: []int32{part}}}
		setMarkerPrepareSeq(&m, seq)
		wm.Markers = []kmsg.WriteTxnMarkersRequestMarker{m}
		r := fxRoundTrip[*kmsg.WriteTxnMarkersResponse](t, dialRaw(t, tc.broker(leader).Addr().String()), wm)
		return r.Markers[0].Topics[0].Partitions[0].ErrorCode
	}
	if code := marker(e.PrepareSeq, true); code != codec.CodeNone {
		t.Fatalf("late copy of transaction 1's marker: %v, want NONE", kerr.ErrorForCode(code))
	}
	if leo, lso := p.LogEndOffset(), p.LastStableOffset(); leo != 3 || lso != 2 {
		t.Fatalf("after the late copy: LEO %d LSO %d, want 3 and 2 (nothing written, transaction 2 open)", leo, lso)
	}
	equalValues(t, "read_committed with transaction 2 open", tc.readCommittedOnce(topic, part), "t1")

	// Wire compatibility: an untagged ABORT (kafka-transactions.sh abort) closes transaction 2.
	if code := marker(0, false); code != codec.CodeNone {
		t.Fatalf("untagged abort marker: %v", kerr.ErrorForCode(code))
	}
	if leo, lso := p.LogEndOffset(), p.LastStableOffset(); leo != 4 || lso != 4 {
		t.Fatalf("after the untagged abort: LEO %d LSO %d, want 4 and 4", leo, lso)
	}
	// The coordinator's own abort of transaction 2 closes nothing more and is not written.
	rawEndTxn(t, rc, tid, pid, epoch, false)
	if leo := p.LogEndOffset(); leo != 4 {
		t.Fatalf("after the coordinator's abort: LEO %d, want 4", leo)
	}
	equalValues(t, "read_committed after the abort", tc.readCommittedOnce(topic, part), "t1")
}
