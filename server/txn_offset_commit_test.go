package server

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

// denyAuthz denies exactly the listed (op, resource type, name) triples.
type denyAuthz map[[3]string]bool

func (d denyAuthz) Authorize(_, _ string, op Operation, rt ResourceType, name string) bool {
	return !d[[3]string{string(rune('0' + op)), string(rune('0' + rt)), name}]
}

func deny(op Operation, rt ResourceType, name string) [3]string {
	return [3]string{string(rune('0' + op)), string(rune('0' + rt)), name}
}

type txnBroker struct {
	addr string
	deps Deps
}

// startTxnBroker is a broker with the group coordinator and (withTxn) a transaction coordinator of
// its own: the marker path is wired by the transaction engineer, so these tests complete
// transactions through Groups.CompleteTxnOffsets directly, which is what that path calls.
func startTxnBroker(t *testing.T, authz Authorizer, withTxn bool) *txnBroker {
	t.Helper()
	cfg := configs.Default()
	cfg.Listeners = "127.0.0.1:0"
	cfg.MetricsAddr = ""
	cfg.DataDir = t.TempDir()
	cfg.NumEventLoops = 2
	cfg.GroupInitialRebalanceDelay = 0
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	clusterDir := filepath.Join(cfg.DataDir, "__cluster")
	pids, err := storage.OpenPIDAllocator(clusterDir, cfg.BrokerID)
	if err != nil {
		t.Fatal(err)
	}
	store, err := storage.Open(storage.Config{Dir: cfg.DataDir, Defaults: TopicDefaults(cfg), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	deps := Deps{Store: store, PIDs: pids, Authz: authz}
	closeGroups := wireGroups(t, cfg, log, &deps)
	var tc *txn.Coordinator
	if withTxn {
		tc, err = txn.New(txn.Config{ClusterDir: clusterDir, AllocPID: pids.Next, Logger: log, ReaperInterval: time.Hour,
			Partitions: NewMarkerWriter(store, nil, log)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tc.Start(); err != nil {
			t.Fatal(err)
		}
		deps.Txn = tc
	}
	srv := New(cfg, log, deps, "test-cluster-id")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("server close: %v", err)
		}
		if tc != nil {
			tc.Close()
		}
		closeGroups()
		if err := store.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
	})
	return &txnBroker{addr: srv.Addr().String(), deps: srv.deps}
}

// pinned is a client that speaks at most version v of key.
func pinned(t *testing.T, addr string, key kmsg.Key, v int16, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(key), v)
	cl := grpClient(t, addr, append([]kgo.Opt{kgo.MaxVersions(vs)}, opts...)...)
	t.Cleanup(cl.Close)
	return cl
}

func (b *txnBroker) initProducer(t *testing.T, tid string) (int64, int16) {
	t.Helper()
	ch := make(chan txn.InitProducerIDResult, 1)
	b.deps.Txn.InitProducerID(txn.InitProducerIDParams{TransactionalID: tid, TimeoutMs: 60000, ProducerID: -1, ProducerEpoch: -1, Version: 4},
		func(r txn.InitProducerIDResult, err error) {
			if err != nil {
				t.Error(err)
			}
			ch <- r
		})
	r := <-ch
	if r.Code != 0 {
		t.Fatalf("InitProducerId %s: %d", tid, r.Code)
	}
	return r.ProducerID, r.ProducerEpoch
}

func (b *txnBroker) addOffsets(t *testing.T, tid string, pid int64, epoch int16, grp string) {
	t.Helper()
	ch := make(chan int16, 1)
	b.deps.Txn.AddOffsets(txn.AddOffsetsParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Group: grp, Version: 3},
		func(r txn.AddOffsetsResult, err error) {
			if err != nil {
				t.Error(err)
			}
			ch <- r.Code
		})
	if c := <-ch; c != 0 {
		t.Fatalf("AddOffsetsToTxn: %d", c)
	}
}

func (b *txnBroker) complete(t *testing.T, grp string, pid int64, commit bool) {
	t.Helper()
	ch := make(chan error, 1)
	b.deps.Groups.CompleteTxnOffsets(grp, pid, commit, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
}

type tocPart struct {
	topic  string
	part   int32
	offset int64
}

// txnOffsetCommit sends one TxnOffsetCommit and returns topic/partition → code.
func txnOffsetCommit(t *testing.T, cl *kgo.Client, tid, grp string, pid int64, epoch int16, gen int32, member string, parts ...tocPart) map[tocPart]int16 {
	t.Helper()
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = tid, grp, pid, epoch
	req.Generation, req.MemberID = gen, member
	for _, p := range parts {
		i := slices.IndexFunc(req.Topics, func(rt kmsg.TxnOffsetCommitRequestTopic) bool { return rt.Topic == p.topic })
		if i < 0 {
			rt := kmsg.NewTxnOffsetCommitRequestTopic()
			rt.Topic = p.topic
			req.Topics = append(req.Topics, rt)
			i = len(req.Topics) - 1
		}
		rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset = p.part, p.offset
		md := "txn"
		rp.Metadata = &md
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	out := map[tocPart]int16{}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			out[tocPart{topic: rt.Topic, part: rp.Partition}] = rp.ErrorCode
		}
	}
	return out
}

// wantAll checks every partition of a TxnOffsetCommit answer.
func wantAll(t *testing.T, what string, got map[tocPart]int16, want int16) {
	t.Helper()
	if len(got) == 0 {
		t.Fatalf("%s: empty response", what)
	}
	for p, c := range got {
		if c != want {
			t.Fatalf("%s: %s/%d answered %d, want %d (all: %v)", what, p.topic, p.part, c, want, got)
		}
	}
}

// fetchStable is OffsetFetch v7 for one partition.
func fetchStable(t *testing.T, cl *kgo.Client, grp, topic string, p int32, requireStable bool) (int64, int16) {
	t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group, req.RequireStable = grp, requireStable
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = topic, []int32{p}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Version != 7 {
		t.Fatalf("OffsetFetch v%d, want v7", resp.Version)
	}
	if resp.ErrorCode != 0 {
		t.Fatalf("OffsetFetch group error %d", resp.ErrorCode)
	}
	rp := resp.Topics[0].Partitions[0]
	return rp.Offset, rp.ErrorCode
}

// TV1 (v0-4): the group must be in the producer's ongoing transaction; then staging, fencing,
// require_stable, and the commit making the offsets visible.
func TestTxnOffsetCommitTV1(t *testing.T) {
	b := startTxnBroker(t, nil, true)
	adm := kadm.NewClient(grpClient(t, b.addr))
	defer adm.Close()
	grpCreateTopic(t, adm, "t", 2)
	v3 := pinned(t, b.addr, kmsg.TxnOffsetCommit, 3)
	v4 := pinned(t, b.addr, kmsg.TxnOffsetCommit, 4)
	of := pinned(t, b.addr, kmsg.OffsetFetch, 7)
	pid, epoch := b.initProducer(t, "tx1")
	p0 := tocPart{topic: "t", part: 0, offset: 10}

	wantAll(t, "no AddOffsetsToTxn (v3)", txnOffsetCommit(t, v3, "tx1", "g", pid, epoch, -1, "", p0), codec.CodeInvalidTxnState)
	wantAll(t, "unknown transactional id", txnOffsetCommit(t, v3, "nope", "g", pid, epoch, -1, "", p0), codec.CodeInvalidProducerIDMapping)
	b.addOffsets(t, "tx1", pid, epoch, "g")
	wantAll(t, "other group (v4)", txnOffsetCommit(t, v4, "tx1", "other", pid, epoch, -1, "", p0), codec.CodeTransactionAbortable)
	wantAll(t, "other group (v3)", txnOffsetCommit(t, v3, "tx1", "other", pid, epoch, -1, "", p0), codec.CodeInvalidTxnState)
	wantAll(t, "stale producer epoch", txnOffsetCommit(t, v3, "tx1", "g", pid, epoch-1, -1, "", p0), codec.CodeInvalidProducerEpoch)
	wantAll(t, "KIP-447 member of no generation", txnOffsetCommit(t, v3, "tx1", "g", pid, epoch, 4, "ghost", p0), codec.CodeUnknownMemberID)

	got := txnOffsetCommit(t, v3, "tx1", "g", pid, epoch, -1, "", p0,
		tocPart{topic: "t", part: 9, offset: 1}, tocPart{topic: "missing", part: 0, offset: 1})
	if got[tocPart{topic: "t", part: 0}] != 0 || got[tocPart{topic: "t", part: 9}] != codec.CodeUnknownTopicOrPartition ||
		got[tocPart{topic: "missing", part: 0}] != codec.CodeUnknownTopicOrPartition {
		t.Fatalf("staging: %v", got)
	}
	if o, c := fetchStable(t, of, "g", "t", 0, true); c != codec.CodeUnstableOffsetCommit || o != -1 {
		t.Fatalf("require_stable while pending: offset %d code %d", o, c)
	}
	if o, c := fetchStable(t, of, "g", "t", 1, true); c != 0 || o != -1 {
		t.Fatalf("require_stable, partition not staged: offset %d code %d", o, c)
	}
	if o, c := fetchStable(t, of, "g", "t", 0, false); c != 0 || o != -1 {
		t.Fatalf("plain fetch while pending must not see the staged offset: offset %d code %d", o, c)
	}
	b.complete(t, "g", pid, true)
	if o, c := fetchStable(t, of, "g", "t", 0, true); c != 0 || o != 10 {
		t.Fatalf("after commit: offset %d code %d", o, c)
	}
}

// TV2 (v5): the group is added to the transaction implicitly; fencing errors are translated for
// the client; abort discards.
func TestTxnOffsetCommitTV2ImplicitAdd(t *testing.T) {
	b := startTxnBroker(t, nil, true)
	adm := kadm.NewClient(grpClient(t, b.addr))
	defer adm.Close()
	grpCreateTopic(t, adm, "t", 1)
	v5 := pinned(t, b.addr, kmsg.TxnOffsetCommit, 5)
	of := pinned(t, b.addr, kmsg.OffsetFetch, 7)
	pid, epoch := b.initProducer(t, "tx2")
	p0 := tocPart{topic: "t", part: 0, offset: 7}

	wantAll(t, "fenced epoch", txnOffsetCommit(t, v5, "tx2", "g5", pid, epoch+1, -1, "", p0), codec.CodeInvalidProducerEpoch)
	wantAll(t, "implicit add", txnOffsetCommit(t, v5, "tx2", "g5", pid, epoch, -1, "", p0), 0)
	ch := make(chan []string, 1)
	b.deps.Txn.Snapshot("tx2", func(e *txn.Entry, err error) {
		if err != nil || e == nil {
			t.Errorf("snapshot: %+v %v", e, err)
			ch <- nil
			return
		}
		if e.State != txn.Ongoing {
			ch <- nil
			return
		}
		ch <- e.Groups
	})
	if g := <-ch; !slices.Equal(g, []string{"g5"}) {
		t.Fatalf("transaction groups after the implicit add: %v", g)
	}
	if _, c := fetchStable(t, of, "g5", "t", 0, true); c != codec.CodeUnstableOffsetCommit {
		t.Fatalf("require_stable while pending: %d", c)
	}
	b.complete(t, "g5", pid, false)
	if o, c := fetchStable(t, of, "g5", "t", 0, true); c != 0 || o != -1 {
		t.Fatalf("after abort: offset %d code %d", o, c)
	}
}

// Gates in Apache's order, and no transaction coordinator → COORDINATOR_NOT_AVAILABLE.
func TestTxnOffsetCommitGates(t *testing.T) {
	authz := denyAuthz{
		deny(OpWrite, ResTransactionalID, "denied-tid"): true,
		deny(OpRead, ResGroup, "denied-group"):          true,
		deny(OpRead, ResTopic, "secret"):                true,
	}
	b := startTxnBroker(t, authz, true)
	adm := kadm.NewClient(grpClient(t, b.addr))
	defer adm.Close()
	grpCreateTopic(t, adm, "t", 1)
	grpCreateTopic(t, adm, "secret", 1)
	v3 := pinned(t, b.addr, kmsg.TxnOffsetCommit, 3)
	pid, epoch := b.initProducer(t, "tx3")
	b.addOffsets(t, "tx3", pid, epoch, "g")
	p0 := tocPart{topic: "t", part: 0, offset: 1}
	s0 := tocPart{topic: "secret", part: 0, offset: 1}

	wantAll(t, "transactional id denied (before the group)", txnOffsetCommit(t, v3, "denied-tid", "denied-group", pid, epoch, -1, "", p0, s0), codec.CodeTransactionalIDAuthorization)
	wantAll(t, "group denied", txnOffsetCommit(t, v3, "tx3", "denied-group", pid, epoch, -1, "", p0, s0), codec.CodeGroupAuthorizationFailed)
	got := txnOffsetCommit(t, v3, "tx3", "g", pid, epoch, -1, "", p0, s0)
	if got[tocPart{topic: "t", part: 0}] != 0 || got[tocPart{topic: "secret", part: 0}] != codec.CodeTopicAuthorizationFailed {
		t.Fatalf("topic gate: %v", got)
	}
	of := pinned(t, b.addr, kmsg.OffsetFetch, 7)
	if _, c := fetchStable(t, of, "g", "t", 0, true); c != codec.CodeUnstableOffsetCommit {
		t.Fatalf("authorized partition not staged: %d", c)
	}
	if _, c := fetchStable(t, of, "g", "secret", 0, true); c != 0 {
		t.Fatalf("denied partition staged: %d", c)
	}

	nb := startTxnBroker(t, nil, false)
	nadm := kadm.NewClient(grpClient(t, nb.addr))
	defer nadm.Close()
	grpCreateTopic(t, nadm, "t", 1)
	wantAll(t, "no transaction coordinator", txnOffsetCommit(t, pinned(t, nb.addr, kmsg.TxnOffsetCommit, 3, kgo.RetryTimeout(time.Millisecond)), "tx", "g", 1, 0, -1, "", p0),
		codec.CodeCoordinatorNotAvailable)
}
