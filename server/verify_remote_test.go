package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
)

// TestRemoteVerifierQueueRules: while a coordinator's request is in flight, entries for one
// transactional id follow Apache's AddPartitionsToTxnManager — a lower epoch is refused at once
// with INVALID_PRODUCER_EPOCH, a higher one fences the queued entry the same way — except that
// an equal one is merged rather than answered NETWORK_EXCEPTION; the queue is bounded; and a
// coordinator the topology has no address for answers COORDINATOR_NOT_AVAILABLE.
func TestRemoteVerifierQueueRules(t *testing.T) {
	srv := New(testConfig(t), zap.NewNop(), Deps{}, "test")
	rv := &srv.verifier
	const coord = 9 // not in the topology
	rv.queues = map[int32]*coordQueue{coord: {queued: map[string]*remoteVerification{}, inflight: true}}

	var mu sync.Mutex
	got := map[string][]int16{}
	cb := func(name string) func([]int16) {
		return func(codes []int16) {
			mu.Lock()
			defer mu.Unlock()
			if _, dup := got[name]; dup {
				t.Errorf("%s answered twice", name)
			}
			got[name] = codes
		}
	}
	answer := func(name string) ([]int16, bool) {
		mu.Lock()
		defer mu.Unlock()
		c, ok := got[name]
		return c, ok
	}
	tps := func(parts ...int32) []txn.TopicPartitions {
		var out []txn.TopicPartitions
		for _, p := range parts {
			out = append(out, txn.TopicPartitions{Topic: "t", Partitions: []int32{p}})
		}
		return out
	}

	rv.verify(coord, "a", 1, 5, true, tps(0), cb("a5"))
	rv.verify(coord, "a", 1, 5, true, tps(1, 2), cb("a5 merged"))
	if q := rv.queues[coord]; len(q.queued) != 1 || len(q.queued["a"].tps) != 3 {
		t.Fatalf("equal epoch not merged: %+v", q.queued["a"])
	}
	rv.verify(coord, "a", 1, 4, true, tps(3), cb("a4"))
	if c, ok := answer("a4"); !ok || !slices.Equal(c, []int16{codec.CodeInvalidProducerEpoch}) {
		t.Fatalf("lower epoch: %v %v, want [47] at once", c, ok)
	}
	rv.verify(coord, "a", 1, 6, true, tps(4), cb("a6"))
	for name, want := range map[string][]int16{"a5": {47}, "a5 merged": {47, 47}} {
		if c, ok := answer(name); !ok || !slices.Equal(c, want) {
			t.Fatalf("%s after a higher epoch: %v %v, want %v", name, c, ok, want)
		}
	}
	if _, ok := answer("a6"); ok {
		t.Fatal("the newest entry was answered while queued")
	}

	// The bound: one entry per transactional id, at most maxQueuedVerifications.
	for i := 1; i < maxQueuedVerifications; i++ {
		rv.verify(coord, fmt.Sprintf("fill-%d", i), 2, 0, false, tps(0), func([]int16) {})
	}
	full := mVerifyRemoteFull.Get()
	rv.verify(coord, "one too many", 3, 0, false, tps(0), cb("over"))
	if c, ok := answer("over"); !ok || !slices.Equal(c, []int16{codec.CodeCoordinatorNotAvailable}) || mVerifyRemoteFull.Get() != full+1 {
		t.Fatalf("over the bound: %v %v", c, ok)
	}

	// The in-flight request ends: the queue is sent; broker 9 has no address.
	rv.mu.Lock()
	q := rv.queues[coord]
	q.inflight = false
	batch := q.takeLocked()
	rv.mu.Unlock()
	rv.send(coord, batch)
	if c, ok := answer("a6"); !ok || !slices.Equal(c, []int16{codec.CodeCoordinatorNotAvailable}) {
		t.Fatalf("unknown coordinator: %v %v, want [15]", c, ok)
	}
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if _, ok := rv.queues[coord]; ok {
		t.Fatal("an idle coordinator queue was kept")
	}
}

// TestAddOffsetsToTxnBrokerFormRunsTheTxnOffsetCommitCheck: the tagged AddOffsetsToTxn a group
// coordinator sends for a TxnOffsetCommit needs CLUSTER_ACTION, and then answers what the local
// check answers: v5 adds the group (TV2), v4 refuses a group the transaction lacks
// (TRANSACTION_ABORTABLE) without adding it.
func TestAddOffsetsToTxnBrokerFormRunsTheTxnOffsetCommitCheck(t *testing.T) {
	tagged := func(tid string, pid int64, epoch int16, group string, version int16) *kmsg.AddOffsetsToTxnRequest {
		req := kmsg.NewPtrAddOffsetsToTxnRequest()
		req.Version = 4
		req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Group = tid, pid, epoch, group
		req.UnknownTags.Set(tagTxnOffsetCommitVersion, []byte{byte(version >> 8), byte(version)})
		return req
	}

	denied := startTestBroker(t, testConfig(t), BrokerOptions{Authz: txnDeny{denyKey(OpClusterAction, ResCluster, clusterResource): true}})
	t.Cleanup(func() { denied.stop(t) })
	rc := dialRaw(t, denied.srv.Addr().String())
	pid, epoch := rawInit(t, rc, "broker-form")
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, tagged("broker-form", pid, epoch, "g", 5)); r.ErrorCode != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("broker form without CLUSTER_ACTION: %v", kerr.ErrorForCode(r.ErrorCode))
	}

	tb := startTestBroker(t, testConfig(t))
	t.Cleanup(func() { tb.stop(t) })
	rc = dialRaw(t, tb.srv.Addr().String())
	entry := func(tid string) *txn.Entry {
		ch := make(chan *txn.Entry, 1)
		tb.srv.deps.Txn.Snapshot(tid, func(e *txn.Entry, _ error) { ch <- e })
		return <-ch
	}
	pid, epoch = rawInit(t, rc, "v4-check")
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, tagged("v4-check", pid, epoch, "g", 4)); r.ErrorCode != kerr.TransactionAbortable.Code {
		t.Fatalf("v4 check of a group outside the transaction: %v, want TRANSACTION_ABORTABLE", kerr.ErrorForCode(r.ErrorCode))
	}
	if e := entry("v4-check"); e == nil || e.State == txn.Ongoing || len(e.Groups) != 0 {
		t.Fatalf("the v4 check changed the entry: %+v", e)
	}
	pid, epoch = rawInit(t, rc, "v5-add")
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, tagged("v5-add", pid, epoch, "g", 5)); r.ErrorCode != 0 {
		t.Fatalf("v5 implicit add: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	if e := entry("v5-add"); e == nil || e.State != txn.Ongoing || e.TxnVersion != 2 || !slices.Equal(e.Groups, []string{"g"}) {
		t.Fatalf("after the v5 implicit add: %+v", e)
	}
	// The same request at a fenced epoch: PRODUCER_FENCED translated for the client.
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, tagged("v5-add", pid, epoch+1, "g", 5)); r.ErrorCode != kerr.InvalidProducerEpoch.Code {
		t.Fatalf("v5 at another epoch: %v, want INVALID_PRODUCER_EPOCH", kerr.ErrorForCode(r.ErrorCode))
	}
}

// TestInterBrokerSecuredListenerWithoutLoginRefused: a SASL inter-broker listener without this
// broker's JAAS login refuses the inter-broker pool (StartBroker refuses to start) with the key
// named; a Server built without a pool fails its inter-broker requests with the same reason.
func TestInterBrokerSecuredListenerWithoutLoginRefused(t *testing.T) {
	cfg := testConfig(t)
	cfg.Listeners = "SASL_PLAINTEXT://127.0.0.1:0"
	cfg.InterBrokerSASL = "SCRAM-SHA-256"
	_, err := NewInterBroker(cfg, nil, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config") {
		t.Fatalf("pool over a SASL inter-broker listener without a login: %v, want the JAAS key named", err)
	}
	srv := New(cfg, zap.NewNop(), Deps{}, "test")
	if _, err2 := srv.peers.Broker(2); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("server without a pool: %v, want %v", err2, err)
	}
}

// TestInterBrokerClientReplacedWhenPeerMoves: the pool keeps one client per peer and endpoint —
// asked again for the same peer it reuses it; when the topology lists the peer at another
// address (a restart on a new port) the next request gets a new client there; after Close every
// call fails.
func TestInterBrokerClientReplacedWhenPeerMoves(t *testing.T) {
	a, b := startTestBroker(t, testConfig(t)), startTestBroker(t, testConfig(t))
	aStopped := false
	t.Cleanup(func() {
		if !aStopped {
			a.stop(t)
		}
		b.stop(t)
	})
	at := func(tb *testBroker) topology.Broker {
		addr := tb.srv.Addr()
		return topology.Broker{ID: 7, Endpoints: []topology.Endpoint{{Listener: "PLAINTEXT", Host: addr.IP.String(), Port: int32(addr.Port)}}}
	}
	topo := topology.NewTable(topology.Broker{ID: 1})
	topo.SetBrokers([]topology.Broker{{ID: 1}, at(a)})
	p, err := NewInterBroker(testConfig(t), topo, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ping := func() {
		t.Helper()
		kb, err := p.Broker(7)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := kb.Request(ctx, kmsg.NewPtrApiVersionsRequest()); err != nil {
			t.Fatalf("ApiVersions through the pool: %v", err)
		}
	}
	created := mPeerClientsCreated.Get()
	ping()
	ping()
	if n := mPeerClientsCreated.Get() - created; n != 1 {
		t.Fatalf("two requests to one peer built %d clients, want 1", n)
	}
	a.stop(t)
	aStopped = true
	topo.SetBrokers([]topology.Broker{{ID: 1}, at(b)})
	ping()
	if n := mPeerClientsCreated.Get() - created; n != 2 {
		t.Fatalf("after the peer moved: %d clients built, want 2", n)
	}
	if _, err := p.Broker(8); !errors.Is(err, errPeerUnknown) {
		t.Fatalf("a broker the topology does not list: %v, want errPeerUnknown", err)
	}
	p.Close()
	if _, err := p.Broker(7); !errors.Is(err, errPeersClosed) {
		t.Fatalf("after Close: %v, want errPeersClosed", err)
	}
}
