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
		r := newEOSCopyRun(t, addr, eosCopyCfg{in: "eos-in", out: "eos-out", group: "eos-grp", txnPrefix: "eos-copier-",
			inParts: 4, outParts: 3, n: 4000, opts: []kgo.Opt{kgo.SessionTimeout(3 * time.Second)}})
		// Copier 0 starts alone; 1 and 2 join mid-stream; 1 leaves; 0 and 2 finish.
		r.start(0)
		r.waitOut(r.cfg.n / 5)
		r.start(1)
		r.start(2)
		r.waitOut(r.cfg.n / 2)
		r.stop(1)
		r.checkExactlyOnce(0, 2)
	})
}

// eosCopyCfg is one consume-transform-produce run of eosCopyRun.
type eosCopyCfg struct {
	in, out, group, txnPrefix string
	inParts, outParts         int32
	n                         int
	opts                      []kgo.Opt // extra options of every copier (group protocol, timeouts)
}

// eosCopyRun drives GroupTransactSession copiers in one group from cfg.in to cfg.out: the input
// is seeded with the values 0..n-1, copiers start and stop on the test's cue, and
// checkExactlyOnce asserts every value in the read_committed output exactly once and the group's
// committed offsets at the input's end.
type eosCopyRun struct {
	t     *testing.T
	ctx   context.Context
	addr  string
	cfg   eosCopyCfg
	adm   *kadm.Client
	stops map[int]chan struct{}
	dones map[int]chan error
}

func newEOSCopyRun(t *testing.T, addr string, cfg eosCopyCfg) *eosCopyRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	r := &eosCopyRun{t: t, ctx: ctx, addr: addr, cfg: cfg, adm: kadm.NewClient(fxClient(t, addr)),
		stops: map[int]chan struct{}{}, dones: map[int]chan error{}}
	if _, err := r.adm.CreateTopic(ctx, cfg.inParts, 1, nil, cfg.in); err != nil {
		t.Fatal(err)
	}
	if _, err := r.adm.CreateTopic(ctx, cfg.outParts, 1, nil, cfg.out); err != nil {
		t.Fatal(err)
	}
	seed := fxClient(t, addr, kgo.DefaultProduceTopic(cfg.in))
	for i := 0; i < cfg.n; i += 500 {
		var rs []*kgo.Record
		for j := i; j < min(i+500, cfg.n); j++ {
			rs = append(rs, &kgo.Record{Key: []byte(strconv.Itoa(j)), Value: []byte(strconv.Itoa(j))})
		}
		if err := seed.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *eosCopyRun) copier(id int, stop <-chan struct{}, done chan<- error) {
	ctx := r.ctx
	sess, err := kgo.NewGroupTransactSession(append([]kgo.Opt{
		kgo.SeedBrokers(r.addr),
		kgo.TransactionalID(fmt.Sprintf("%s%d", r.cfg.txnPrefix, id)),
		kgo.ConsumerGroup(r.cfg.group),
		kgo.ConsumeTopics(r.cfg.in),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DefaultProduceTopic(r.cfg.out),
		kgo.RebalanceTimeout(5 * time.Second),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.TransactionTimeout(20 * time.Second),
	}, r.cfg.opts...)...)
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
		fs.EachRecord(func(rec *kgo.Record) {
			sess.Produce(ctx, &kgo.Record{Key: rec.Key, Value: rec.Value}, nil)
		})
		// A rebalance mid-transaction makes End abort (committed=false); the records are then
		// re-read from the committed offsets by whoever owns the partition.
		if _, err := sess.End(ctx, kgo.TryCommit); err != nil {
			done <- fmt.Errorf("end: %w", err)
			return
		}
	}
}

func (r *eosCopyRun) start(i int) {
	r.stops[i], r.dones[i] = make(chan struct{}), make(chan error, 1)
	go r.copier(i, r.stops[i], r.dones[i])
}

func (r *eosCopyRun) stop(i int) {
	r.t.Helper()
	close(r.stops[i])
	if err := <-r.dones[i]; err != nil {
		r.t.Fatalf("copier %d: %v", i, err)
	}
}

// waitOut polls until the output holds at least want records (committed or not).
func (r *eosCopyRun) waitOut(want int) {
	r.t.Helper()
	checkFor(r.t, time.Minute, 20*time.Millisecond, func() error {
		offs, err := r.adm.ListEndOffsets(r.ctx, r.cfg.out)
		if err != nil {
			return err
		}
		var total int64
		offs.Each(func(o kadm.ListedOffset) { total += o.Offset })
		if total < int64(want) {
			return fmt.Errorf("out has %d", total)
		}
		return nil
	})
}

// checkExactlyOnce reads the output under read_committed until every input value is there, stops
// the copiers still running (last), drains what they committed after the last poll (a duplicate
// would show up there), and checks exactly-once and the committed offsets.
func (r *eosCopyRun) checkExactlyOnce(last ...int) {
	t, ctx, n := r.t, r.ctx, r.cfg.n
	t.Helper()
	reader := fxClient(t, r.addr, kgo.ConsumeTopics(r.cfg.out), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	seen := map[string]int{}
	for len(seen) < n {
		fs := reader.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("reading out: %v (have %d of %d)", err, len(seen), n)
		}
		fs.EachRecord(func(rec *kgo.Record) { seen[string(rec.Value)]++ })
	}
	for _, i := range last {
		r.stop(i)
	}
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		fs := reader.PollFetches(pctx)
		pcancel()
		if fs.Empty() {
			break
		}
		fs.EachRecord(func(rec *kgo.Record) { seen[string(rec.Value)]++ })
	}
	for i := 0; i < n; i++ {
		if c := seen[strconv.Itoa(i)]; c != 1 {
			t.Fatalf("value %d seen %d times under read_committed", i, c)
		}
	}
	if len(seen) != n {
		t.Fatalf("out holds %d distinct values, want %d", len(seen), n)
	}
	committed, err := r.adm.FetchOffsets(ctx, r.cfg.group)
	if err != nil {
		t.Fatal(err)
	}
	ends, err := r.adm.ListEndOffsets(ctx, r.cfg.in)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if c, ok := committed.Lookup(r.cfg.in, o.Partition); !ok || c.At != o.Offset {
			t.Errorf("%s/%d: committed %v, end %d", r.cfg.in, o.Partition, c.At, o.Offset)
		}
	})
}
