package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/storage"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestClusterCleanerRunsOnLeaderAcrossMoves: on a 3-broker cluster the leader of a compacted
// topic cleans it (keyed transactional produce with aborts); the partition is drained to
// another broker, whose leader is then killed; every new leader serves exactly the latest
// committed value per key to a read_committed consumer, and the last one cleans further.
func TestClusterCleanerRunsOnLeaderAcrossMoves(t *testing.T) {
	tc := startTestClusterWith(t, 3, func(_ int32, cfg *configs.Config, _ *BrokerOptions) {
		cfg.LogCleanerEnable = true
		cfg.LogCleanerBackoff = 50 * time.Millisecond
	})
	const topic = "ccmp"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	adm := kadm.NewClient(tc.client())
	r, err := adm.CreateTopic(ctx, 1, 3, map[string]*string{
		"cleanup.policy":            kadm.StringPtr("compact"),
		"segment.bytes":             kadm.StringPtr("1024"),
		"min.cleanable.dirty.ratio": kadm.StringPtr("0.01"),
	}, topic)
	if err != nil || r.Err != nil {
		t.Fatalf("create topic: %v %v", err, r.Err)
	}
	first := tc.owner(topic, 0)
	prod := tc.client(kgo.TransactionalID("ccmp-tid"), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0), kgo.RequestRetries(1<<20), kgo.RetryTimeout(3*time.Minute))
	latest := map[string]string{}
	produce := func(from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			if err := prod.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			commit := i%4 != 3
			batch := map[string]string{}
			for j := 0; j < 5; j++ {
				k, v := fmt.Sprintf("k%02d", (i*5+j*3)%20), fmt.Sprintf("v%d-%d", i, j)
				if err := prod.ProduceSync(ctx, &kgo.Record{Partition: 0, Key: []byte(k), Value: []byte(v)}).FirstErr(); err != nil {
					t.Fatalf("transaction %d: %v", i, err)
				}
				batch[k] = v
			}
			if err := prod.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
				t.Fatalf("end of transaction %d: %v", i, err)
			}
			if commit {
				for k, v := range batch {
					latest[k] = v
				}
			}
		}
	}
	leaderPart := func(broker int32) *storage.Partition { return tc.broker(broker).Store.Topic(topic).Partition(0) }
	waitCleanedPast := func(broker int32, past int64) int64 {
		t.Helper()
		var got int64
		checkFor(t, 90*time.Second, 20*time.Millisecond, func() error {
			if got = leaderPart(broker).FirstDirtyOffset(); got <= past {
				return fmt.Errorf("broker %d: first dirty offset %d, want past %d", broker, got, past)
			}
			return nil
		})
		return got
	}
	// consume writes a sentinel record (non-transactional) and reads the partition
	// read_committed from the start up to it: every key has its latest committed value.
	plain := tc.client(kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	sentinels := 0
	consume := func(what string) {
		t.Helper()
		sentinels++
		sk, sv := fmt.Sprintf("sentinel-%d", sentinels), what
		if err := plain.ProduceSync(ctx, &kgo.Record{Partition: 0, Key: []byte(sk), Value: []byte(sv)}).FirstErr(); err != nil {
			t.Fatalf("%s: sentinel: %v", what, err)
		}
		latest[sk] = sv
		cons := tc.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(200*time.Millisecond))
		defer cons.Close()
		got := map[string]string{}
		cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
		defer ccancel()
		for got[sk] != sv {
			fs := cons.PollFetches(cctx)
			if err := cctx.Err(); err != nil {
				t.Fatalf("%s: sentinel not read: %v (read %d keys)", what, err, len(got))
			}
			fs.EachError(func(_ string, _ int32, err error) { t.Logf("%s: fetch: %v (retried)", what, err) })
			fs.EachRecord(func(r *kgo.Record) { got[string(r.Key)] = string(r.Value) })
		}
		if len(got) != len(latest) {
			t.Fatalf("%s: %d keys, want %d", what, len(got), len(latest))
		}
		for k, v := range latest {
			if got[k] != v {
				t.Fatalf("%s: key %s = %q, want %q", what, k, got[k], v)
			}
		}
	}

	produce(0, 60)
	end1 := waitCleanedPast(first.Broker, 0)
	consume("first leader after its clean")

	tc.stop(first.Broker) // drain: graceful handover
	second := tc.owner(topic, 0)
	if second.Broker == first.Broker || second.Epoch <= first.Epoch {
		t.Fatalf("after draining %d the partition is at %+v", first.Broker, second)
	}
	if got := leaderPart(second.Broker).FirstDirtyOffset(); got < end1 {
		t.Fatalf("second leader's first dirty offset %d, the first cleaned to %d", got, end1)
	}
	consume("second leader")
	tc.start(first.Broker) // back as a new incarnation

	tc.crash(second.Broker)
	third := tc.owner(topic, 0)
	if third.Broker == second.Broker || third.Epoch <= second.Epoch {
		t.Fatalf("after the crash of %d the partition is at %+v", second.Broker, third)
	}
	consume("third leader after a crash")
	before := leaderPart(third.Broker).FirstDirtyOffset()
	produce(60, 40)
	end3 := waitCleanedPast(third.Broker, before)
	consume("third leader after its clean")
	t.Logf("cleaned to %d by broker %d (epoch %d), kept by %d (epoch %d), cleaned from %d to %d by %d (epoch %d)",
		end1, first.Broker, first.Epoch, second.Broker, second.Epoch, before, end3, third.Broker, third.Epoch)
}
