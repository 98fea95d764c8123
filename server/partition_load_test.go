package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
)

// A partition released and reloaded (at a bumped leader epoch) in the middle of idempotent
// acks=all produce traffic: while it is released every partition API answers
// NOT_LEADER_OR_FOLLOWER (the client retries through it), and afterwards every acknowledged record
// is there exactly once, in order, and the reloaded epoch is what Metadata, Fetch and ListOffsets
// check against.
func TestPartitionReleaseReloadUnderProduce(t *testing.T) {
	cfg := testConfig(t)
	tbl := topology.NewTable(topology.Broker{ID: cfg.BrokerID})
	tb := startTestBroker(t, cfg, BrokerOptions{Topology: tbl})
	defer tb.stop(t)
	addr := tb.srv.Addr().String()
	cl := fxClient(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordRetries(1000), kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond }))
	fxCreateTopic(t, cl, "moving", 2)

	var (
		stop  atomic.Bool
		wg    sync.WaitGroup
		mu    sync.Mutex
		acked = map[string]bool{}
		fails atomic.Int64
	)
	for p := int32(0); p < 2; p++ {
		wg.Add(1)
		go func(p int32) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				v := fmt.Sprintf("p%d-%06d", p, i)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := cl.ProduceSync(ctx, &kgo.Record{Topic: "moving", Partition: p, Value: []byte(v)}).FirstErr()
				cancel()
				if err != nil {
					fails.Add(1)
					continue
				}
				mu.Lock()
				acked[v] = true
				mu.Unlock()
			}
		}(p)
	}
	nAcked := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	waitMore := func(what string, n int) {
		base := nAcked()
		checkFor(t, 15*time.Second, 5*time.Millisecond, func() error {
			if got := nAcked() - base; got < n {
				return fmt.Errorf("%s: %d more records acknowledged, want %d", what, got, n)
			}
			return nil
		})
	}
	waitMore("before the release", 50)

	if err := tb.store.ReleasePartition("moving", 0); err != nil {
		t.Fatal(err)
	}
	raw := dialRaw(t, addr)
	if code := tpProduce(t, raw, "moving", 0); code != codec.CodeNotLeaderForPartition {
		t.Fatalf("produce to a released partition: %d, want NOT_LEADER_OR_FOLLOWER", code)
	}
	if fp := tpFetch(t, raw, "moving", 0, 0, -1); fp.ErrorCode != codec.CodeNotLeaderForPartition {
		t.Fatalf("fetch from a released partition: %d, want NOT_LEADER_OR_FOLLOWER", fp.ErrorCode)
	}
	if lo := tpListOffsets(t, raw, "moving", 0, -1, -1); lo.ErrorCode != codec.CodeNotLeaderForPartition {
		t.Fatalf("list offsets of a released partition: %d, want NOT_LEADER_OR_FOLLOWER", lo.ErrorCode)
	}
	// The other partition keeps serving meanwhile.
	if code := tpProduce(t, raw, "moving", 1); code != codec.CodeNone {
		t.Fatalf("produce to the untouched partition: %d", code)
	}

	// Reload at epoch 1, the way a leadership move would: storage first, then the topology.
	if err := tb.store.LoadPartition("moving", 0, 1); err != nil {
		t.Fatal(err)
	}
	tbl.SetPartition("moving", 0, topology.Owner{Broker: cfg.BrokerID, Epoch: 1, Known: true})
	waitMore("after the reload", 100)
	if fp := tpFetch(t, raw, "moving", 0, 0, 0); fp.ErrorCode != codec.CodeFencedLeaderEpoch {
		t.Fatalf("fetch with the old epoch: %d, want FENCED_LEADER_EPOCH", fp.ErrorCode)
	}
	if lo := tpListOffsets(t, raw, "moving", 0, -1, 1); lo.ErrorCode != codec.CodeNone || lo.LeaderEpoch != 1 {
		t.Fatalf("list offsets at epoch 1: code %d epoch %d", lo.ErrorCode, lo.LeaderEpoch)
	}
	stop.Store(true)
	wg.Wait()

	// OffsetForLeaderEpoch answers from the partition's epoch cache: epoch 0 ends where epoch 1
	// began (the log end at the reload, somewhere inside the log), epoch 1 ends at the log end.
	leo := tpListOffsets(t, raw, "moving", 0, -1, 1).Offset
	e0 := tpOffsetForEpoch(t, raw, "moving", 0, 1, 0)
	if e0.ErrorCode != codec.CodeNone || e0.LeaderEpoch != 0 || e0.EndOffset <= 0 || e0.EndOffset >= leo {
		t.Fatalf("end of epoch 0: %+v (log end %d)", e0, leo)
	}
	if e1 := tpOffsetForEpoch(t, raw, "moving", 0, 1, 1); e1.ErrorCode != codec.CodeNone || e1.LeaderEpoch != 1 || e1.EndOffset != leo {
		t.Fatalf("end of epoch 1: %+v, want 1/%d", e1, leo)
	}

	// Every acknowledged record once, per partition in production order.
	hw := map[int32]int64{}
	for p := int32(0); p < 2; p++ {
		hw[p] = tpListOffsets(t, raw, "moving", p, -1, -1).Offset
	}
	cons := fxClient(t, addr, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
		"moving": {0: kgo.NewOffset().AtStart(), 1: kgo.NewOffset().AtStart()}}))
	seen := map[string]int{}
	last := map[int32]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for read := map[int32]int64{}; read[0] < hw[0] || read[1] < hw[1]; {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %v of %v: %v", read, hw, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			read[r.Partition] = r.Offset + 1
			v := string(r.Value)
			seen[v]++
			if len(v) == len("p0-000000") && v[0] == 'p' { // the raw tpProduce batches carry other values
				if prev := last[r.Partition]; prev != "" && v <= prev {
					t.Errorf("partition %d: %q after %q", r.Partition, v, prev)
				}
				last[r.Partition] = v
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	for v := range acked {
		if seen[v] != 1 {
			t.Fatalf("acknowledged record %q read %d times", v, seen[v])
		}
	}
	if fails.Load() > 0 {
		t.Logf("%d produce calls failed (retried by the loop; none acknowledged)", fails.Load())
	}
	t.Logf("%d records acknowledged across the release and reload", len(acked))
}
