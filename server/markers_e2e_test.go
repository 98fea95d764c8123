package server

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kaas-go/kaas/coord/topology"
)

// Cross-broker transactions driven by franz-go clients end to end (issue 10 B1): the
// transaction coordinator, the partition leaders and the group coordinator on different
// brokers. These need the leaders' KIP-890 verification with a remote coordinator and the group
// coordinator's TxnOffsetCommit check (verify_remote.go, txn_offsets_remote.go) as well as the
// cross-broker markers (markers_remote.go).

func txnCommitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// produceTxn runs one transaction writing val to each partition and ends it.
func produceTxn(t *testing.T, cl *kgo.Client, topic string, parts []int32, commit bool, val string) {
	t.Helper()
	ctx := txnCommitCtx(t)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte(val)}).FirstErr(); err != nil {
			t.Fatalf("produce to %s-%d: %v", topic, p, err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction (commit=%v): %v", commit, err)
	}
}

// TestClusterKgoTxnVisibleWhenCommitReturns: a franz-go transactional producer whose coordinator
// leads none of the partitions it writes commits and aborts; the moment commitTransaction
// returns, LSO = HWM on each partition and a read_committed consumer's first poll has the
// committed records (and none of the aborted ones).
func TestClusterKgoTxnVisibleWhenCommitReturns(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "kgtx"
	tc.createTopic(topic, 3, 3)
	tid, c, parts := tc.txnPlacement("kgtx", topic)
	t.Logf("coordinator %d; partitions %v led by %d and %d", c, parts, tc.owner(topic, parts[0]).Broker, tc.owner(topic, parts[1]).Broker)
	cl := tc.client(kgo.TransactionalID(tid), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ps := parts[:]
	produceTxn(t, cl, topic, ps, true, "c1")
	for _, p := range ps {
		tc.stableAt(topic, p, 2)
	}
	for _, p := range ps {
		equalValues(t, fmt.Sprintf("partition %d, first read_committed poll", p), tc.readCommittedOnce(topic, p), "c1")
	}
	produceTxn(t, cl, topic, ps, false, "a2")
	produceTxn(t, cl, topic, ps, true, "c3")
	for _, p := range ps {
		tc.stableAt(topic, p, 6)
		equalValues(t, fmt.Sprintf("partition %d after commit, abort, commit", p), tc.readCommittedOnce(topic, p), "c1", "c3")
	}
}

// TestClusterKgoTxnCommitRidesLeaderCrash: a franz-go transaction's partition leader crashes
// after the data is acknowledged and before the commit; the marker is resent to the successor
// and commitTransaction returns with the transaction complete and visible.
func TestClusterKgoTxnCommitRidesLeaderCrash(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "kgtc"
	tc.createTopic(topic, 3, 3)
	tid, _, parts := tc.txnPlacement("kgtc", topic)
	cl := tc.client(kgo.TransactionalID(tid), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx := txnCommitCtx(t)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	before := tc.owner(topic, parts[0])
	retries := mMarkerRetries.Get()
	tc.crash(before.Broker)
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit across the leader's crash: %v", err)
	}
	if after := tc.owner(topic, parts[0]); after.Broker == before.Broker {
		t.Fatalf("partition %d still on the crashed broker %d", parts[0], before.Broker)
	}
	if mMarkerRetries.Get() == retries {
		t.Fatal("the commit completed without resending the crashed leader's marker")
	}
	for _, p := range parts {
		tc.stableAt(topic, p, 2)
		equalValues(t, fmt.Sprintf("partition %d", p), tc.readCommittedOnce(topic, p), "v")
	}
}

// TestClusterKgoGroupTransactSessionThreeBrokers: consume-transform-produce with
// kgo.GroupTransactSession where the transaction coordinator, the output partition's leader and
// the group coordinator are three different brokers: every input record appears exactly once
// in the read_committed output, and the group's committed offset is the input's end.
func TestClusterKgoGroupTransactSessionThreeBrokers(t *testing.T) {
	tc := startTestCluster(t, 3)
	const in, out = "ctp-in", "ctp-out"
	tc.createTopic(in, 1, 3)
	tc.createTopic(out, 3, 3)
	tid, c, parts := tc.txnPlacement("ctp", out)
	outPart := parts[0]
	l := tc.owner(out, outPart).Broker
	g := int32(6) - c - l // the third broker (ids 1..3)
	grp := ""
	for i := 0; grp == "" && i < 1000; i++ {
		if name := fmt.Sprintf("ctp-g-%d", i); tc.owner(topology.GroupsTopic, int32(topology.GroupShard(name))).Broker == g {
			grp = name
		}
	}
	if grp == "" {
		t.Fatalf("no group coordinated by broker %d", g)
	}
	t.Logf("transaction coordinator %d, output leader %d, group coordinator %d", c, l, g)

	const n = 30
	prod := tc.client(kgo.DefaultProduceTopic(in))
	for i := 0; i < n; i++ {
		if err := prod.ProduceSync(txnCommitCtx(t), &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := kgo.NewGroupTransactSession(kgo.SeedBrokers(tc.seeds()...), kgo.MetadataMinAge(50*time.Millisecond),
		kgo.TransactionalID(tid), kgo.ConsumerGroup(grp), kgo.ConsumeTopics(in),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(out))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	ctx := txnCommitCtx(t)
	done := 0
	for done < n {
		fs := sess.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("transformed %d of %d records before the deadline", done, n)
		}
		if err := sess.Begin(); err != nil {
			t.Fatal(err)
		}
		k := 0
		fs.EachRecord(func(r *kgo.Record) {
			sess.Produce(ctx, &kgo.Record{Partition: outPart, Value: r.Value}, nil)
			k++
		})
		committed, err := sess.End(ctx, kgo.TryCommit)
		if err != nil {
			t.Fatalf("end of a consume-transform-produce transaction: %v", err)
		}
		if committed {
			done += k
		}
	}
	got := tc.readCommittedOnce(out, outPart)
	seen := map[string]int{}
	for _, v := range got {
		seen[v]++
	}
	for i := 0; i < n; i++ {
		if seen[strconv.Itoa(i)] != 1 {
			t.Fatalf("input %d appears %d times in the read_committed output %v", i, seen[strconv.Itoa(i)], got)
		}
	}
	if len(got) != n {
		t.Fatalf("output has %d records, want %d", len(got), n)
	}
	if o := tc.committedOffset(grp, in, 0); o != n {
		t.Fatalf("committed offset of %s on %s-0: %d, want %d", grp, in, o, n)
	}
}
