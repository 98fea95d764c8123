package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
)

// ledBy returns a partition of topic (of n) whose loaded leader is broker id, or -1.
func (tc *testCluster) ledBy(topic string, n int32, id int32) int32 {
	tc.t.Helper()
	for p := int32(0); p < n; p++ {
		if tc.owner(topic, p).Broker == id {
			return p
		}
	}
	return -1
}

// TestClusterTxnCoordinatorCrashMovesSlot: a franz-go transactional producer commits and aborts
// transactions through the coordinator of its slot; the coordinator's broker crashes (lease left
// to expire, journal left as written), the slot moves to another broker at a higher epoch, which
// replays the crashed holder's journal, and the same producer goes on committing there.
// read_committed then sees exactly the committed records. Every transaction writes only to a
// partition its coordinator leads, so the markers stay local.
func TestClusterTxnCoordinatorCrashMovesSlot(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic, parts = "txmove", 6
	tc.createTopic(topic, parts, 3)
	const tid = "txmove-producer"
	slot := int32(topology.TxnSlot(tid))
	first := tc.owner(topology.TxnTopic, slot)
	p1 := tc.ledBy(topic, parts, first.Broker)
	if p1 < 0 {
		t.Fatalf("coordinator broker %d leads no partition of %s", first.Broker, topic)
	}

	prod := tc.client(kgo.TransactionalID(tid), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionTimeout(30*time.Second))
	committed, aborted := map[int]bool{}, map[int]bool{}
	next := 0
	// runTxn runs one transaction of 5 records on partition p and commits (or aborts) it.
	runTxn := func(p int32, commit bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := prod.BeginTransaction(); err != nil {
			t.Fatalf("begin: %v", err)
		}
		var vals []int
		var produceErr error
		for i := 0; i < 5; i++ {
			next++
			vals = append(vals, next)
			if err := prod.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte(strconv.Itoa(next))}).FirstErr(); err != nil {
				produceErr = err
				break
			}
		}
		if produceErr != nil {
			commit = false
		}
		if err := prod.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatalf("end transaction (commit %v, produce error %v): %v", commit, produceErr, err)
		}
		for _, v := range vals {
			if commit {
				committed[v] = true
			} else {
				aborted[v] = true
			}
		}
	}
	for i := 0; i < 6; i++ {
		runTxn(p1, i%3 != 2)
	}

	tc.crash(first.Broker)
	// A crash leaves the holder's journal as written (no final checkpoint past the lease
	// deadline): the successor must replay it.
	ents, err := os.ReadDir(filepath.Join(tc.dir, "__cluster", txn.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	left := false
	for _, e := range ents {
		left = left || strings.HasPrefix(e.Name(), fmt.Sprintf("journal-b%d-i", first.Broker))
	}
	if !left {
		t.Fatalf("the crashed coordinator %d left no journal", first.Broker)
	}
	second := tc.owner(topology.TxnTopic, slot)
	if second.Broker == first.Broker || second.Epoch <= first.Epoch {
		t.Fatalf("after the crash of %d slot %d is at %+v, want another broker at a higher epoch than %+v", first.Broker, slot, second, first)
	}
	p2 := tc.ledBy(topic, parts, second.Broker)
	if p2 < 0 {
		t.Fatalf("new coordinator broker %d leads no partition of %s", second.Broker, topic)
	}
	for i := 0; i < 6; i++ {
		runTxn(p2, i%3 != 1)
	}

	// read_committed over every partition: exactly the committed values, each once.
	offsets := map[int32]kgo.Offset{}
	for p := int32(0); p < parts; p++ {
		offsets[p] = kgo.NewOffset().AtStart()
	}
	cons := tc.client(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(200*time.Millisecond))
	seen := map[int]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(seen) < len(committed) {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d committed records before the deadline", len(seen), len(committed))
		}
		fs.EachRecord(func(r *kgo.Record) {
			v, err := strconv.Atoi(string(r.Value))
			if err != nil {
				t.Fatalf("bad record value %q", r.Value)
			}
			seen[v]++
		})
	}
	var bad []string
	for v, n := range seen {
		switch {
		case aborted[v]:
			bad = append(bad, fmt.Sprintf("aborted %d visible", v))
		case !committed[v]:
			bad = append(bad, fmt.Sprintf("unknown %d", v))
		case n != 1:
			bad = append(bad, fmt.Sprintf("%d read %d times", v, n))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("read_committed after the coordinator moved: %v", bad)
	}
	t.Logf("coordinator of slot %d moved %d (epoch %d) → %d (epoch %d); %d committed, %d aborted records",
		slot, first.Broker, first.Epoch, second.Broker, second.Epoch, len(committed), len(aborted))
}
