package cluster

import (
	"context"
	"errors"
	"testing"
	"time"
)

// waitUntil polls cond until it holds or 10 s of real time pass (waitForWithin's loop, with a
// yes/no condition).
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, 10*time.Second, what, func() string {
		if cond() {
			return ""
		}
		return "not yet"
	})
}

func recvWatch(t testing.TB, ch <-chan WatchResponse) WatchResponse {
	t.Helper()
	select {
	case wr, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return wr
	case <-time.After(10 * time.Second):
		t.Fatal("no watch response within 10s")
	}
	return WatchResponse{}
}

func TestFakeRevisionsAndTxnCompares(t *testing.T) {
	ctx := context.Background()
	f := NewFake(NewManualClock(time.Time{}))
	ok, rev, err := f.Txn(ctx, []Compare{{Key: "/a", Field: CreateRevision, Rev: 0}}, []Op{{Key: "/a", Value: []byte("1")}})
	if err != nil || !ok || rev != 1 {
		t.Fatalf("create /a: ok=%v rev=%d err=%v, want true 1 nil", ok, rev, err)
	}
	// A second create-if-absent fails and writes nothing, not even the other op.
	ok, rev, err = f.Txn(ctx, []Compare{{Key: "/a", Field: CreateRevision, Rev: 0}},
		[]Op{{Key: "/a", Value: []byte("2")}, {Key: "/b", Value: []byte("x")}})
	if err != nil || ok || rev != 1 {
		t.Fatalf("second create: ok=%v rev=%d err=%v, want false 1 nil", ok, rev, err)
	}
	if kvs, _, _ := f.Get(ctx, "/b", false); len(kvs) != 0 {
		t.Fatalf("failed txn wrote /b: %v", kvs)
	}
	// Update guarded by ModRevision keeps CreateRev and bumps ModRev.
	ok, rev, _ = f.Txn(ctx, []Compare{{Key: "/a", Field: ModRevision, Rev: 1}}, []Op{{Key: "/a", Value: []byte("3")}, {Key: "/ab", Value: []byte("y")}})
	if !ok || rev != 2 {
		t.Fatalf("update: ok=%v rev=%d, want true 2", ok, rev)
	}
	kvs, rev, _ := f.Get(ctx, "/a", true)
	if rev != 2 || len(kvs) != 2 || kvs[0].Key != "/a" || kvs[0].CreateRev != 1 || kvs[0].ModRev != 2 || string(kvs[0].Value) != "3" || kvs[1].Key != "/ab" {
		t.Fatalf("prefix get = %+v rev %d", kvs, rev)
	}
	ok, _, _ = f.Txn(ctx, []Compare{{Key: "/a", Field: ModRevision, Rev: 1}}, []Op{{Key: "/a", Delete: true}})
	if ok {
		t.Fatal("stale ModRevision compare succeeded")
	}
	ok, rev, _ = f.Txn(ctx, nil, []Op{{Key: "/a", Delete: true, Prefix: true}})
	if !ok || rev != 3 {
		t.Fatalf("prefix delete: ok=%v rev=%d, want true 3", ok, rev)
	}
	if kvs, _, _ := f.Get(ctx, "/", true); len(kvs) != 0 {
		t.Fatalf("after prefix delete: %v", kvs)
	}
}

func TestFakeLeaseExpiryDeletesKeysAndNotifiesWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	id, err := f.Grant(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := f.Txn(ctx, nil, []Op{{Key: "/p/k", Value: []byte("v"), Lease: id}}); !ok || err != nil {
		t.Fatalf("put with lease: %v %v", ok, err)
	}
	w := f.Watch(ctx, "/p/", 0)
	clk.Advance(2 * time.Second)
	if ttl, err := f.KeepAliveOnce(ctx, id); err != nil || ttl != 3*time.Second {
		t.Fatalf("keepalive: %v %v", ttl, err)
	}
	clk.Advance(2 * time.Second) // 4 s after grant, 2 s after the renewal: still alive
	if kvs, _, _ := f.Get(ctx, "/p/k", false); len(kvs) != 1 {
		t.Fatal("key gone although the lease was renewed")
	}
	clk.Advance(time.Second)
	wr := recvWatch(t, w)
	if len(wr.Events) != 1 || wr.Events[0].Type != EventDelete || wr.Events[0].KV.Key != "/p/k" || wr.Events[0].Prev == nil || string(wr.Events[0].Prev.Value) != "v" {
		t.Fatalf("expiry event = %+v", wr)
	}
	if _, err := f.KeepAliveOnce(ctx, id); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("keepalive after expiry: %v, want ErrLeaseNotFound", err)
	}
}

func TestFakeWatchFromRevisionAndCompaction(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := NewFake(NewManualClock(time.Time{}))
	for _, k := range []string{"/w/1", "/x/1", "/w/2"} {
		f.Txn(ctx, nil, []Op{{Key: k, Value: []byte(k)}})
	}
	w := f.Watch(ctx, "/w/", 2)
	wr := recvWatch(t, w)
	if wr.Rev != 3 || wr.Events[0].KV.Key != "/w/2" {
		t.Fatalf("replay from rev 2 = %+v, want /w/2 at rev 3", wr)
	}
	f.Compact(3)
	c := f.Watch(ctx, "/w/", 1)
	if wr := recvWatch(t, c); !errors.Is(wr.Err, ErrCompacted) {
		t.Fatalf("watch before compaction = %+v, want ErrCompacted", wr)
	}
	if _, ok := <-c; ok {
		t.Fatal("compacted watch not closed")
	}
}

func TestFakeCampaignOldestWinsAndDiesWithLease(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f1 := NewFake(clk)
	f2 := f1.Client()
	l1, err := f1.Campaign(ctx, "/e", []byte("1"), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan *Leadership, 1)
	go func() {
		l, err := f2.Campaign(ctx, "/e", []byte("2"), 3*time.Second)
		if err != nil {
			t.Error(err)
		}
		won <- l
	}()
	// The first candidate's session renews while its client is reachable.
	clk.Advance(10 * time.Second)
	select {
	case <-won:
		t.Fatal("second candidate won while the first is alive")
	case <-l1.Done:
		t.Fatal("first leadership lost while reachable")
	default:
	}
	f1.SetUnavailable(true)
	clk.Advance(4 * time.Second)
	<-l1.Done
	l2 := <-won
	if l2 == nil || l2.Rev <= l1.Rev {
		t.Fatalf("second leadership = %+v after %+v", l2, l1)
	}
	if err := l2.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	<-l2.Done
}

func TestFakeUnavailableFailsEveryCall(t *testing.T) {
	ctx := context.Background()
	f := NewFake(NewManualClock(time.Time{}))
	f.SetUnavailable(true)
	if _, err := f.Grant(ctx, time.Second); !errors.Is(err, ErrFakeUnavailable) {
		t.Fatalf("Grant: %v", err)
	}
	if _, _, err := f.Get(ctx, "/", true); !errors.Is(err, ErrFakeUnavailable) {
		t.Fatalf("Get: %v", err)
	}
	if _, _, err := f.Txn(ctx, nil, []Op{{Key: "/k"}}); !errors.Is(err, ErrFakeUnavailable) {
		t.Fatalf("Txn: %v", err)
	}
	if wr := recvWatch(t, f.Watch(ctx, "/", 0)); !errors.Is(wr.Err, ErrFakeUnavailable) {
		t.Fatalf("Watch: %+v", wr)
	}
	f.SetUnavailable(false)
	if ok, _, err := f.Txn(ctx, nil, []Op{{Key: "/k"}}); !ok || err != nil {
		t.Fatalf("Txn after recovery: %v %v", ok, err)
	}
}

// A client cut off from etcd keeps its watch but sees nothing until it is back; then it gets
// every change it missed, in order.
func TestFakeUnavailableClientWatchPausesThenCatchesUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := NewFake(NewManualClock(time.Time{}))
	other := f.Client()
	w := f.Watch(ctx, "/k/", 0)
	f.SetUnavailable(true)
	other.Txn(ctx, nil, []Op{{Key: "/k/1", Value: []byte("a")}})
	other.Txn(ctx, nil, []Op{{Key: "/k/2", Value: []byte("b")}})
	select {
	case wr := <-w:
		t.Fatalf("partitioned client saw %+v", wr)
	default:
	}
	f.SetUnavailable(false)
	a, b := recvWatch(t, w), recvWatch(t, w)
	if a.Events[0].KV.Key != "/k/1" || b.Events[0].KV.Key != "/k/2" || a.Rev >= b.Rev {
		t.Fatalf("after recovery got %+v then %+v", a, b)
	}
}
