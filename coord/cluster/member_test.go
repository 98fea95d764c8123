package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kaas-go/kaas/coord/topology"
)

const testPrefix = "/kaas/t/"

// failStops records FailStop calls.
type failStops struct {
	n      atomic.Int32
	mu     sync.Mutex
	reason string
}

func (f *failStops) call(reason string) {
	f.n.Add(1)
	f.mu.Lock()
	f.reason = reason
	f.mu.Unlock()
}

func (f *failStops) last() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reason
}

func testMemberConfig(clk Clock, fs *failStops) MemberConfig {
	return MemberConfig{
		Prefix: testPrefix, BrokerID: 1, ClusterID: "cid-1",
		Info:           BrokerInfo{Rack: "r1", Endpoints: []topology.Endpoint{{Listener: "PLAINTEXT", Host: "127.0.0.1", Port: 9092}}},
		SessionTimeout: 3 * time.Second, Heartbeat: time.Second, FenceMargin: 300 * time.Millisecond,
		Clock: clk, FailStop: fs.call,
	}
}

// advance moves the manual clock once both member loops are parked on it.
func advance(t *testing.T, clk *ManualClock, parked int, d time.Duration) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%d goroutines parked on the clock", parked), func() bool { return clk.Pending() >= parked })
	clk.Advance(d)
}

func TestJoinRegistersBrokerAndClusterID(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	fs := &failStops{}
	m, err := Join(ctx, f, testMemberConfig(clk, fs))
	if err != nil {
		t.Fatal(err)
	}
	if m.Incarnation() != fmt.Sprintf("%x", int64(m.Lease())) {
		t.Fatalf("incarnation %q is not the lease id in hex (%x)", m.Incarnation(), int64(m.Lease()))
	}
	kvs, _, _ := f.Get(ctx, ClusterIDKey(testPrefix), false)
	if len(kvs) != 1 || string(kvs[0].Value) != "cid-1" {
		t.Fatalf("cluster-id = %v", kvs)
	}
	bs, _, err := ListBrokers(ctx, f, testPrefix)
	if err != nil {
		t.Fatal(err)
	}
	want := BrokerRecord{ID: 1, Inc: m.Incarnation(), State: StateAlive, CreateRev: m.CreateRev(),
		Info: BrokerInfo{Rack: "r1", Endpoints: []topology.Endpoint{{Listener: "PLAINTEXT", Host: "127.0.0.1", Port: 9092}}}}
	if len(bs) != 1 || fmt.Sprint(bs[0]) != fmt.Sprint(want) {
		t.Fatalf("brokers = %+v, want [%+v]", bs, want)
	}
	if err := m.SetState(ctx, StateDraining); err != nil {
		t.Fatal(err)
	}
	bs, _, _ = ListBrokers(ctx, f, testPrefix)
	if len(bs) != 1 || bs[0].State != StateDraining || bs[0].CreateRev != m.CreateRev() || m.State() != StateDraining {
		t.Fatalf("after SetState: %+v", bs)
	}
	if !m.Publishable() {
		t.Fatal("fresh member not publishable")
	}
	if err := m.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	<-m.Done()
	if m.Publishable() {
		t.Fatal("publishable after Leave")
	}
	if bs, _, _ := ListBrokers(ctx, f, testPrefix); len(bs) != 0 {
		t.Fatalf("brokers after Leave = %+v", bs)
	}
	if fs.n.Load() != 0 {
		t.Fatalf("FailStop called on Leave: %s", fs.last())
	}
}

// The deadline must count from the keepalive's send time: a slow answer (400 ms here) must not
// extend D, because the server renewed the lease when it received the request, not when we
// received the answer.
func TestLeaseDeadlineCountsFromSendTime(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	start := clk.Now()
	f := NewFake(clk)
	fs := &failStops{}
	m, err := Join(ctx, f, testMemberConfig(clk, fs))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave(ctx)
	if got, want := m.Deadline(), start.Add(2700*time.Millisecond); !got.Equal(want) {
		t.Fatalf("initial D = +%s, want +%s (grant time + TTL - margin)", got.Sub(start), want.Sub(start))
	}
	f.SetKeepAliveDelay(400 * time.Millisecond)
	advance(t, clk, 2, time.Second)
	sent := start.Add(time.Second)
	want := sent.Add(3*time.Second - 300*time.Millisecond) // +3.7 s
	waitUntil(t, "D moved by the renewal", func() bool { return !m.Deadline().Equal(start.Add(2700 * time.Millisecond)) })
	if got := m.Deadline(); !got.Equal(want) {
		t.Fatalf("D after a keepalive sent at +1s and answered at +1.4s = +%s, want +%s (receive-based would be +4.1s)",
			got.Sub(start), want.Sub(start))
	}
	if clk.Now().Sub(start) != 1400*time.Millisecond {
		t.Fatalf("clock at +%s, the fake's delay did not apply", clk.Now().Sub(start))
	}
}

func TestFailStopWhenRenewalsFailPastDeadline(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	start := clk.Now()
	f := NewFake(clk)
	fs := &failStops{}
	m, err := Join(ctx, f, testMemberConfig(clk, fs))
	if err != nil {
		t.Fatal(err)
	}
	advance(t, clk, 2, time.Second)
	waitUntil(t, "renewal at +1s", func() bool { return m.Deadline().Equal(start.Add(3700 * time.Millisecond)) })
	failuresBefore := mKeepAliveFailures.Get()
	failStopsBefore := mFailStops.Get()
	f.SetUnavailable(true)
	advance(t, clk, 2, time.Second) // +2s: renewal fails
	waitUntil(t, "a keepalive failure counted", func() bool { return mKeepAliveFailures.Get() > failuresBefore })
	advance(t, clk, 2, time.Second) // +3s: fails again, still inside D (+3.7s)
	waitUntil(t, "second keepalive failure counted", func() bool { return mKeepAliveFailures.Get() > failuresBefore+1 })
	if !m.Publishable() || fs.n.Load() != 0 {
		t.Fatalf("at +3s (D +3.7s): publishable=%v failstops=%d", m.Publishable(), fs.n.Load())
	}
	advance(t, clk, 2, 800*time.Millisecond) // +3.8s: past D
	if m.Publishable() {
		t.Fatal("publishable past D")
	}
	waitUntil(t, "FailStop", func() bool { return fs.n.Load() > 0 })
	<-m.Done()
	if r := fs.last(); !strings.Contains(r, "lease deadline passed: etcd unreachable for") {
		t.Fatalf("fail-stop reason %q does not name the cause", r)
	}
	// More time and a recovered etcd change nothing: fail-stop is final and happens once.
	f.SetUnavailable(false)
	clk.Advance(5 * time.Second)
	if n := fs.n.Load(); n != 1 {
		t.Fatalf("FailStop called %d times, want 1", n)
	}
	if m.Publishable() {
		t.Fatal("publishable again after fail-stop")
	}
	if got := mFailStops.Get() - failStopsBefore; got != 1 {
		t.Fatalf("kaas_cluster_failstop_total grew by %d, want 1", got)
	}
	if err := m.Leave(ctx); err != nil {
		t.Fatalf("Leave after fail-stop: %v", err)
	}
}

func TestFailStopWhenLeaseNotFound(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	fs := &failStops{}
	m, err := Join(ctx, f, testMemberConfig(clk, fs))
	if err != nil {
		t.Fatal(err)
	}
	// The lease vanishes server-side (as after an expiry this process did not notice).
	if err := f.Client().Revoke(ctx, m.Lease()); err != nil {
		t.Fatal(err)
	}
	advance(t, clk, 2, time.Second)
	waitUntil(t, "FailStop", func() bool { return fs.n.Load() == 1 })
	if r := fs.last(); !strings.Contains(r, "not found") || !strings.Contains(r, m.Incarnation()) {
		t.Fatalf("reason %q", r)
	}
	if m.Publishable() {
		t.Fatal("publishable after lease loss")
	}
}

func TestJoinRefusesClusterIDMismatch(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	f.Txn(ctx, nil, []Op{{Key: ClusterIDKey(testPrefix), Value: []byte("cid-other")}})
	_, err := Join(ctx, f, testMemberConfig(clk, &failStops{}))
	if err == nil || !strings.Contains(err.Error(), "cid-other") || !strings.Contains(err.Error(), "cid-1") {
		t.Fatalf("Join error = %v, want a refusal naming both cluster ids", err)
	}
	if kvs, _, _ := f.Get(ctx, BrokersPrefix(testPrefix), true); len(kvs) != 0 {
		t.Fatalf("refused Join wrote %v", kvs)
	}
}

func TestJoinRefusesWhenEtcdUnavailable(t *testing.T) {
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	f.SetUnavailable(true)
	_, err := Join(context.Background(), f, testMemberConfig(clk, &failStops{}))
	if err == nil || !strings.Contains(err.Error(), "etcd unreachable") || !errors.Is(err, ErrFakeUnavailable) {
		t.Fatalf("Join error = %v, want etcd unreachable", err)
	}
}

// putHolder registers brokers/1 for another incarnation under its own lease.
func putHolder(t *testing.T, f *Fake) (LeaseID, string) {
	t.Helper()
	ctx := context.Background()
	id, err := f.Grant(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	inc := fmt.Sprintf("%x", int64(id))
	if ok, _, err := f.Txn(ctx, nil, []Op{{Key: BrokerKey(testPrefix, 1), Value: encodeBroker(inc, StateAlive, BrokerInfo{}), Lease: id}}); !ok || err != nil {
		t.Fatalf("put holder: %v %v", ok, err)
	}
	return id, inc
}

func TestJoinRefusesBrokerIDHeldByLiveIncarnation(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	holder, inc := putHolder(t, f)
	errc := make(chan error, 1)
	go func() {
		_, err := Join(ctx, f.Client(), testMemberConfig(clk, &failStops{}))
		errc <- err
	}()
	// The holder keeps renewing; Join waits twice the session timeout + margin (6.3 s), then
	// refuses.
	for i := 0; i < 7; i++ {
		advance(t, clk, 1, time.Second)
		if _, err := f.KeepAliveOnce(ctx, holder); err != nil {
			t.Fatalf("holder keepalive at +%ds: %v", i+1, err)
		}
	}
	var err error
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return")
	}
	if err == nil || !strings.Contains(err.Error(), "broker.id 1 is held by live incarnation "+inc) {
		t.Fatalf("Join error = %v, want refusal naming incarnation %s", err, inc)
	}
	bs, _, _ := ListBrokers(ctx, f, testPrefix)
	if len(bs) != 1 || bs[0].Inc != inc {
		t.Fatalf("brokers after refusal = %+v, want the holder untouched", bs)
	}
}

func TestJoinWaitsForDeadPredecessorLease(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	_, deadInc := putHolder(t, f) // never renewed: the previous process is gone
	type res struct {
		m   *Member
		err error
	}
	rc := make(chan res, 1)
	go func() {
		m, err := Join(ctx, f.Client(), testMemberConfig(clk, &failStops{}))
		rc <- res{m, err}
	}()
	advance(t, clk, 1, 3*time.Second) // the predecessor's lease expires; Join must not wait for its 6.3 s timer
	var r res
	select {
	case r = <-rc:
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.m.Leave(ctx)
	if r.m.Incarnation() == deadInc {
		t.Fatal("joined with the dead incarnation's id")
	}
	bs, _, _ := ListBrokers(ctx, f, testPrefix)
	if len(bs) != 1 || bs[0].Inc != r.m.Incarnation() {
		t.Fatalf("brokers = %+v, want the new incarnation %s", bs, r.m.Incarnation())
	}
}

// TestJoinWaitsForLazilyDeletedPredecessorKey guards a broker restarted right after a kill -9:
// etcd deletes an expired lease's keys only at its next sweep (every 500 ms, then a raft round),
// so the dead predecessor's brokers/<id> can outlive SessionTimeout+FenceMargin. Join must wait
// for it instead of refusing the restart. The fake expires leases exactly on time, so here the
// key is kept past 3.3 s by renewals and deleted at +4 s, as a late sweep would.
func TestJoinWaitsForLazilyDeletedPredecessorKey(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	holder, deadInc := putHolder(t, f)
	type res struct {
		m   *Member
		err error
	}
	rc := make(chan res, 1)
	go func() {
		m, err := Join(ctx, f.Client(), testMemberConfig(clk, &failStops{}))
		rc <- res{m, err}
	}()
	for i := 0; i < 4; i++ {
		advance(t, clk, 1, time.Second)
		if i < 3 {
			if _, err := f.KeepAliveOnce(ctx, holder); err != nil {
				t.Fatalf("holder keepalive at +%ds: %v", i+1, err)
			}
		}
	}
	// Join has seen +4 s with the key present: it either gave up (the bug) or waits again on the
	// clock. Only then does the key go.
	var r res
	var returned bool
	waitUntil(t, "Join waiting again or returning after +4s", func() bool {
		select {
		case r = <-rc:
			returned = true
			return true
		default:
			return clk.Pending() >= 1
		}
	})
	if returned {
		t.Fatalf("Join returned at +4s while the predecessor's key was still there: %v", r.err)
	}
	if err := f.Revoke(ctx, holder); err != nil {
		t.Fatalf("delete the predecessor's key at +4s: %v", err)
	}
	select {
	case r = <-rc:
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return")
	}
	if r.err != nil {
		t.Fatalf("Join refused a restart whose predecessor's key went at +4s: %v", r.err)
	}
	defer r.m.Leave(ctx)
	if r.m.Incarnation() == deadInc {
		t.Fatal("joined with the dead incarnation's id")
	}
}

// After a failed keepalive the member retries at Heartbeat/4, not a full heartbeat later, so a
// short etcd outage is bridged with most of the slack left.
func TestRenewalRetriesSoonAfterFailure(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	start := clk.Now()
	f := NewFake(clk)
	fs := &failStops{}
	m, err := Join(ctx, f, testMemberConfig(clk, fs))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave(ctx)
	failures := mKeepAliveFailures.Get()
	f.SetUnavailable(true)
	advance(t, clk, 2, time.Second)
	waitUntil(t, "the failed keepalive at +1s", func() bool { return mKeepAliveFailures.Get() > failures })
	f.SetUnavailable(false)
	advance(t, clk, 2, 250*time.Millisecond)
	want := start.Add(1250*time.Millisecond + 2700*time.Millisecond)
	waitUntil(t, "the retry at +1.25s", func() bool { return m.Deadline().Equal(want) })
	if !m.Publishable() || fs.n.Load() != 0 {
		t.Fatalf("publishable=%v failstops=%d", m.Publishable(), fs.n.Load())
	}
}
