package server

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/coord/txn"
)

// TestTxnSlotReleaseReloadUnderProducers: franz-go transactional producers commit back to back
// while the transaction slots of their ids are released and reloaded; while a slot is released
// the coordinator answers NOT_COORDINATOR (16), the clients ride it out, and every transaction
// they saw committed is read back by a read_committed consumer exactly once.
func TestTxnSlotReleaseReloadUnderProducers(t *testing.T) {
	tb := startTestBroker(t, testConfig(t))
	t.Cleanup(func() { tb.stop(t) })
	addr := tb.srv.Addr().String()
	txnTopic(t, addr, "mv", 2)
	tids := []string{"mv-a", "mv-b"}
	var (
		stop  atomic.Bool
		mu    sync.Mutex
		acked = map[int32][]string{}
		count atomic.Int64
		wg    sync.WaitGroup
	)
	for i, tid := range tids {
		cl := txnProducer(t, addr, tid, kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond }),
			// A produce retried on NOT_ENOUGH_REPLICAS (the implicit add met a released slot) waits
			// for a metadata refresh, throttled to 5 s by default.
			kgo.MetadataMinAge(10*time.Millisecond))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := txnCtx(t)
			for n := 0; !stop.Load(); n++ {
				v := fmt.Sprintf("%s-%d", tid, n)
				if err := cl.BeginTransaction(); err != nil {
					t.Errorf("%s begin: %v", tid, err)
					return
				}
				if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "mv", Partition: int32(i), Value: []byte(v)}).FirstErr(); err != nil {
					t.Errorf("%s produce: %v", tid, err)
					return
				}
				if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
					t.Errorf("%s commit: %v", tid, err)
					return
				}
				mu.Lock()
				acked[int32(i)] = append(acked[int32(i)], v)
				mu.Unlock()
				count.Add(1)
			}
		}()
	}
	rc := dialRaw(t, addr)
	slots := []int{txn.SlotFor(tids[0]), txn.SlotFor(tids[1])}
	// A transactional.id of the first slot that no producer uses, for raw probes.
	probe := "mv-probe-0"
	for i := 1; txn.SlotFor(probe) != slots[0]; i++ {
		probe = fmt.Sprintf("mv-probe-%d", i)
	}
	sync1 := func(f func(func(error))) {
		t.Helper()
		ch := make(chan error, 1)
		f(func(err error) { ch <- err })
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("slot load / release did not finish")
		}
	}
	for round := 0; round < 4; round++ {
		target := count.Load() + 3
		checkFor(t, 20*time.Second, time.Millisecond, func() error {
			if c := count.Load(); c < target {
				return fmt.Errorf("%d commits, want %d", c, target)
			}
			return nil
		})
		for _, s := range slots {
			sync1(func(d func(error)) { tb.Txn.ReleaseSlot(s, d) })
		}
		req := kmsg.NewPtrInitProducerIDRequest()
		req.Version = 4
		req.TransactionalID = kmsg.StringPtr(probe)
		req.TransactionTimeoutMillis = 60000
		if r := fxRoundTrip[*kmsg.InitProducerIDResponse](t, rc, req); r.ErrorCode != int16(kerr.NotCoordinator.Code) {
			t.Fatalf("InitProducerId on a released slot: %v", kerr.ErrorForCode(r.ErrorCode))
		}
		for _, s := range slots {
			sync1(func(d func(error)) { tb.Txn.LoadSlot(s, int32(round+10), d) })
		}
	}
	target := count.Load() + 3
	checkFor(t, 20*time.Second, time.Millisecond, func() error {
		if c := count.Load(); c < target {
			return fmt.Errorf("%d commits after the last reload, want %d", c, target)
		}
		return nil
	})
	stop.Store(true)
	wg.Wait()
	sentinel(t, addr, "mv", 2)
	mu.Lock()
	defer mu.Unlock()
	equalParts(t, "read_committed after slot moves", consumeUntilEnd(t, addr, "mv", 2, true), acked)
	// The markers of the reloaded incarnation carry the epoch the slot was loaded with.
	ch := make(chan *txn.Entry, 1)
	tb.Txn.Snapshot(tids[0], func(e *txn.Entry, _ error) { ch <- e })
	if e := <-ch; e == nil || e.CoordinatorEpoch != 13 {
		t.Fatalf("entry after four reloads: %+v", e)
	}
}

// TestTxnTransactionalIDTooLong: a transactional.id longer than Short.MAX_VALUE bytes (possible in
// flexible versions' compact strings) is INVALID_REQUEST, as Apache refuses to store it.
func TestTxnTransactionalIDTooLong(t *testing.T) {
	addr, _ := newTestBroker(t)
	rc := dialRaw(t, addr)
	long := strings.Repeat("t", txn.MaxTransactionalIDLen+1)
	req := kmsg.NewPtrInitProducerIDRequest()
	req.Version = 4
	req.TransactionalID = kmsg.StringPtr(long)
	req.TransactionTimeoutMillis = 60000
	if r := fxRoundTrip[*kmsg.InitProducerIDResponse](t, rc, req); r.ErrorCode != int16(kerr.InvalidRequest.Code) {
		t.Fatalf("InitProducerId: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	end := kmsg.NewPtrEndTxnRequest()
	end.Version = 3
	end.TransactionalID, end.ProducerID, end.ProducerEpoch = long, 1, 0
	if r := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end); r.ErrorCode != int16(kerr.InvalidRequest.Code) {
		t.Fatalf("EndTxn: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	// The longest legal one is served.
	rawInit(t, rc, strings.Repeat("t", txn.MaxTransactionalIDLen))
}

// TestTxnCompletedStartTimeAndExpiration: DescribeTransactions of a committed transaction reports
// when it started; once transactional.id.expiration.ms passes without use the id is removed
// (TRANSACTIONAL_ID_NOT_FOUND).
func TestTxnCompletedStartTimeAndExpiration(t *testing.T) {
	cfg := testConfig(t)
	cfg.TransactionalIDExpiration = time.Second
	cfg.TransactionReapInterval = 20 * time.Millisecond
	tb := startTestBroker(t, cfg)
	t.Cleanup(func() { tb.stop(t) })
	addr := tb.srv.Addr().String()
	txnTopic(t, addr, "exp", 1)
	before := time.Now().UnixMilli()
	cl := txnProducer(t, addr, "exp-id")
	txnRun(t, cl, "exp", 0, true, "v")
	rc := dialRaw(t, addr)
	describe := func() kmsg.DescribeTransactionsResponseTransactionState {
		req := kmsg.NewPtrDescribeTransactionsRequest()
		req.TransactionalIDs = []string{"exp-id"}
		return fxRoundTrip[*kmsg.DescribeTransactionsResponse](t, rc, req).TransactionStates[0]
	}
	if d := describe(); d.ErrorCode != 0 || d.State != "CompleteCommit" || d.StartTimestamp < before || d.StartTimestamp > time.Now().UnixMilli() {
		t.Fatalf("completed transaction: %+v (started after %d)", d, before)
	}
	cl.Close()
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if d := describe(); d.ErrorCode != int16(kerr.TransactionalIDNotFound.Code) {
			return fmt.Errorf("not expired: %+v", d)
		}
		return nil
	})
}
