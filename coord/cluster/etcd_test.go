package cluster

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kaas-go/kaas/coord/cluster/etcdtest"
)

func newEtcdBackend(t *testing.T, s *etcdtest.Server) Backend {
	t.Helper()
	b, err := NewEtcd([]string{s.Endpoint}, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestNewEtcdUnreachableFailsFast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	start := time.Now()
	b, err := NewEtcd([]string{"http://" + addr}, 500*time.Millisecond, nil)
	took := time.Since(start)
	if err == nil {
		b.Close()
		t.Fatal("NewEtcd succeeded against a closed port")
	}
	if !strings.Contains(err.Error(), "cannot reach etcd") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %q does not say which etcd is unreachable", err)
	}
	if took > 3*time.Second {
		t.Fatalf("NewEtcd took %s to fail with a 500ms dial timeout", took)
	}
}

func TestEtcdBackendSemantics(t *testing.T) {
	s := etcdtest.Start(t)
	b := newEtcdBackend(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ok, rev1, err := b.Txn(ctx, []Compare{{Key: "/s/a", Field: CreateRevision, Rev: 0}}, []Op{{Key: "/s/a", Value: []byte("1")}})
	if err != nil || !ok {
		t.Fatalf("create: %v %v", ok, err)
	}
	if ok, _, _ := b.Txn(ctx, []Compare{{Key: "/s/a", Field: CreateRevision, Rev: 0}}, []Op{{Key: "/s/b", Value: []byte("x")}}); ok {
		t.Fatal("second create-if-absent succeeded")
	}
	if ok, _, _ := b.Txn(ctx, []Compare{{Key: "/s/a", Field: ModRevision, Rev: rev1}}, []Op{{Key: "/s/a", Value: []byte("2")}}); !ok {
		t.Fatal("ModRevision CAS failed")
	}
	kvs, _, err := b.Get(ctx, "/s/", true)
	if err != nil || len(kvs) != 1 || kvs[0].CreateRev != rev1 || kvs[0].ModRev <= rev1 || string(kvs[0].Value) != "2" {
		t.Fatalf("get = %+v %v", kvs, err)
	}

	// A lease's keys go with it, as a delete event carrying the previous value.
	lease, err := b.Grant(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ttl, err := b.KeepAliveOnce(ctx, lease); err != nil || ttl != 3*time.Second {
		t.Fatalf("keepalive: %v %v", ttl, err)
	}
	_, rev, _ := b.Txn(ctx, nil, []Op{{Key: "/s/l", Value: []byte("v"), Lease: lease}})
	w := b.Watch(ctx, "/s/l", rev+1)
	if err := b.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	wr := recvWatch(t, w)
	if wr.Err != nil || len(wr.Events) != 1 || wr.Events[0].Type != EventDelete || wr.Events[0].Prev == nil || string(wr.Events[0].Prev.Value) != "v" {
		t.Fatalf("watch after revoke = %+v", wr)
	}
	if _, err := b.KeepAliveOnce(ctx, lease); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("keepalive of a revoked lease: %v, want ErrLeaseNotFound", err)
	}

	// Compaction maps to ErrCompacted.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	_, cur, _ := b.Get(ctx, "/s/a", false)
	if _, err := cli.Compact(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if wr := recvWatch(t, b.Watch(ctx, "/s/", rev1)); !errors.Is(wr.Err, ErrCompacted) {
		t.Fatalf("watch from a compacted revision = %+v, want ErrCompacted", wr)
	}

	// Campaign: the first candidate leads, the second waits until it resigns.
	l1, err := b.Campaign(ctx, "/s/ctl", []byte("1"), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan *Leadership, 1)
	go func() {
		l, err := b.Campaign(ctx, "/s/ctl", []byte("2"), 3*time.Second)
		if err != nil {
			t.Error(err)
		}
		won <- l
	}()
	// A write guarded by the leadership key succeeds; by a wrong revision it does not.
	if ok, _, err := b.Txn(ctx, []Compare{{Key: l1.Key, Field: CreateRevision, Rev: l1.Rev}}, []Op{{Key: "/s/assign", Value: []byte("x")}}); !ok || err != nil {
		t.Fatalf("guarded write by the leader: %v %v", ok, err)
	}
	if err := l1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l1.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after Resign")
	}
	var l2 *Leadership
	select {
	case l2 = <-won:
	case <-time.After(10 * time.Second):
		t.Fatal("second candidate did not win after the first resigned")
	}
	if l2 == nil || l2.Rev <= l1.Rev {
		t.Fatalf("second leadership %+v", l2)
	}
	if ok, _, _ := b.Txn(ctx, []Compare{{Key: l1.Key, Field: CreateRevision, Rev: l1.Rev}}, []Op{{Key: "/s/assign", Value: []byte("stale")}}); ok {
		t.Fatal("a write guarded by the resigned leadership succeeded")
	}
	l2.Resign(ctx)
}

func TestTopicCreateCASOneWinnerEtcd(t *testing.T) {
	checkTopicCAS(t, newEtcdBackend(t, etcdtest.Start(t)))
}

func TestJoinRefusesClusterIDMismatchEtcd(t *testing.T) {
	b := newEtcdBackend(t, etcdtest.Start(t))
	ctx := context.Background()
	b.Txn(ctx, nil, []Op{{Key: ClusterIDKey(testPrefix), Value: []byte("cid-other")}})
	_, err := Join(ctx, b, testMemberConfig(RealClock, &failStops{}))
	if err == nil || !strings.Contains(err.Error(), `"cid-other"`) || !strings.Contains(err.Error(), `"cid-1"`) {
		t.Fatalf("Join error = %v, want a refusal naming both ids", err)
	}
}

// An etcd outage shorter than the session timeout must not fence a healthy broker: etcd keeps
// (and on recovery extends) the lease, the next keepalive succeeds, and D never passes.
func TestMemberSurvivesEtcdRestartShorterThanSession(t *testing.T) {
	s := etcdtest.Start(t)
	b := newEtcdBackend(t, s)
	ctx := context.Background()
	fs := &failStops{}
	m, err := Join(ctx, b, testMemberConfig(RealClock, fs))
	if err != nil {
		t.Fatal(err)
	}
	d0 := m.Deadline()
	waitUntil(t, "a first renewal", func() bool { return m.Deadline().After(d0) })

	var notPublishable atomic.Int32
	stop := make(chan struct{})
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if !m.Publishable() {
				notPublishable.Add(1)
			}
		}
	}()
	restartStart := time.Now()
	s.Restart()
	restarted := time.Now()
	t.Logf("etcd restart took %s", restarted.Sub(restartStart))
	// A renewal sent after the restart moves D past restarted + TTL − margin − heartbeat.
	waitUntil(t, "a renewal after the restart", func() bool {
		return m.Deadline().After(restarted.Add(3*time.Second - 300*time.Millisecond - time.Second))
	})
	close(stop)
	<-checked
	if n := notPublishable.Load(); n != 0 {
		t.Fatalf("member was not publishable at %d checks across a restart of %s", n, restarted.Sub(restartStart))
	}
	if n := fs.n.Load(); n != 0 {
		t.Fatalf("FailStop called across a short etcd restart: %s", fs.last())
	}
	bs, _, err := ListBrokers(ctx, b, testPrefix)
	if err != nil || len(bs) != 1 || bs[0].Inc != m.Incarnation() {
		t.Fatalf("brokers after restart = %+v %v", bs, err)
	}
	// A graceful exit revokes the lease: the key goes at once, not after the TTL.
	if err := m.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if bs, _, err := ListBrokers(ctx, b, testPrefix); err != nil || len(bs) != 0 {
		t.Fatalf("brokers after Leave = %+v %v", bs, err)
	}
}

// Losing etcd for longer than the session timeout fail-stops the member with a reason.
func TestMemberFailStopsWhenEtcdStaysDown(t *testing.T) {
	s := etcdtest.Start(t)
	b := newEtcdBackend(t, s)
	ctx := context.Background()
	fs := &failStops{}
	m, err := Join(ctx, b, testMemberConfig(RealClock, fs))
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	waitUntil(t, "fail-stop", func() bool { return fs.n.Load() == 1 })
	if m.Publishable() {
		t.Fatal("publishable after fail-stop")
	}
	if r := fs.last(); !strings.Contains(r, "lease deadline passed: etcd unreachable for") {
		t.Fatalf("reason %q", r)
	}
}
