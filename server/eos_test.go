package server

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestEOSGroupTransactSessionUnderRebalances is KIP-447 consume-transform-produce with franz-go's
// GroupTransactSession: copiers in one group read `in` (read_committed), write `out` and commit
// their input offsets inside the same transaction. Copiers join and leave mid-stream (so
// partitions move between transactional producers), and every input record must appear in `out`
// exactly once under read_committed — under transaction.version 2 and 1.
func TestEOSGroupTransactSessionUnderRebalances(t *testing.T) {
	txnVersions(t, func(t *testing.T, tv int16) {
		addr, _ := newTestBroker(t, withTV(tv), fastGroups)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		adm := kadm.NewClient(fxClient(t, addr))
		if _, err := adm.CreateTopic(ctx, 4, 1, nil, "eos-in"); err != nil {
			t.Fatal(err)
		}
		if _, err := adm.CreateTopic(ctx, 3, 1, nil, "eos-out"); err != nil {
			t.Fatal(err)
		}
		const n = 4000
		seed := fxClient(t, addr, kgo.DefaultProduceTopic("eos-in"))
		for i := 0; i < n; i += 500 {
			var rs []*kgo.Record
			for j := i; j < i+500; j++ {
				rs = append(rs, &kgo.Record{Key: []byte(strconv.Itoa(j)), Value: []byte(strconv.Itoa(j))})
			}
			if err := seed.ProduceSync(ctx, rs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}

		runCopier := func(id int, stop <-chan struct{}, done chan<- error) {
			sess, err := kgo.NewGroupTransactSession(
				kgo.SeedBrokers(addr),
				kgo.TransactionalID(fmt.Sprintf("eos-copier-%d", id)),
				kgo.ConsumerGroup("eos-grp"),
				kgo.ConsumeTopics("eos-in"),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()),
				kgo.RequireStableFetchOffsets(),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.DefaultProduceTopic("eos-out"),
				kgo.SessionTimeout(3*time.Second),
				kgo.RebalanceTimeout(5*time.Second),
				kgo.FetchMaxWait(100*time.Millisecond),
				kgo.TransactionTimeout(20*time.Second),
			)
			if err != nil {
				done <- err
				return
			}
			defer sess.Close()
			for {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
				fs := sess.PollFetches(pctx)
				pcancel()
				if ctx.Err() != nil {
					done <- ctx.Err()
					return
				}
				if fs.Empty() {
					continue
				}
				if err := sess.Begin(); err != nil {
					done <- fmt.Errorf("begin: %w", err)
					return
				}
				fs.EachRecord(func(r *kgo.Record) {
					sess.Produce(ctx, &kgo.Record{Key: r.Key, Value: r.Value}, nil)
				})
				// A rebalance mid-transaction makes End abort (committed=false); the records
				// are then re-read from the committed offsets by whoever owns the partition.
				if _, err := sess.End(ctx, kgo.TryCommit); err != nil {
					done <- fmt.Errorf("end: %w", err)
					return
				}
			}
		}

		// Copier 0 starts alone; 1 and 2 join mid-stream; 1 leaves; 0 and 2 finish.
		stops := make([]chan struct{}, 3)
		dones := make([]chan error, 3)
		start := func(i int) {
			stops[i], dones[i] = make(chan struct{}), make(chan error, 1)
			go runCopier(i, stops[i], dones[i])
		}
		stopCopier := func(i int) {
			close(stops[i])
			if err := <-dones[i]; err != nil {
				t.Fatalf("copier %d: %v", i, err)
			}
		}
		outCount := func() int64 {
			offs, err := adm.ListEndOffsets(ctx, "eos-out")
			if err != nil {
				return -1
			}
			var total int64
			offs.Each(func(o kadm.ListedOffset) { total += o.Offset })
			return total
		}
		start(0)
		checkFor(t, time.Minute, 20*time.Millisecond, func() error {
			if c := outCount(); c < n/5 {
				return fmt.Errorf("out has %d", c)
			}
			return nil
		})
		start(1)
		start(2)
		checkFor(t, time.Minute, 20*time.Millisecond, func() error {
			if c := outCount(); c < n/2 {
				return fmt.Errorf("out has %d", c)
			}
			return nil
		})
		stopCopier(1)

		// Read `out` under read_committed until every input value is there.
		reader := fxClient(t, addr, kgo.ConsumeTopics("eos-out"), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
		seen := map[string]int{}
		for len(seen) < n {
			fs := reader.PollFetches(ctx)
			if err := fs.Err0(); err != nil {
				t.Fatalf("reading out: %v (have %d of %d)", err, len(seen), n)
			}
			fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++ })
		}
		stopCopier(0)
		stopCopier(2)
		// Drain whatever was committed after the last poll (a duplicate would show up here),
		// then check exactly-once.
		for {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			fs := reader.PollFetches(pctx)
			pcancel()
			if fs.Empty() {
				break
			}
			fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++ })
		}
		for i := 0; i < n; i++ {
			if c := seen[strconv.Itoa(i)]; c != 1 {
				t.Fatalf("value %d seen %d times under read_committed", i, c)
			}
		}
		if len(seen) != n {
			t.Fatalf("out holds %d distinct values, want %d", len(seen), n)
		}
		// The group's committed offsets cover the whole input.
		committed, err := adm.FetchOffsets(ctx, "eos-grp")
		if err != nil {
			t.Fatal(err)
		}
		ends, err := adm.ListEndOffsets(ctx, "eos-in")
		if err != nil {
			t.Fatal(err)
		}
		ends.Each(func(o kadm.ListedOffset) {
			c, ok := committed.Lookup("eos-in", o.Partition)
			if !ok || c.At != o.Offset {
				t.Errorf("eos-in/%d: committed %v, end %d", o.Partition, c.At, o.Offset)
			}
		})
	})
}
