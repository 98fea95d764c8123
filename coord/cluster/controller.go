package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
)

// The controller: one broker, elected through the etcd election under <prefix>controller/,
// places every partition, transaction slot and group shard (Balance) and writes the result to
// assign/. It never touches data; the agents on the holders do (agent.go).
//
// Fencing. Every write is a Txn whose first compare is the election key's CreateRevision
// (design note §1). etcd evaluates it atomically with the write, so a controller that lost its
// election (its session lease expired while it was paused or cut off) has every write refused,
// even one it sent before it noticed. Each assignment write also compares the key's
// ModRevision as read, so a write computed from a stale view (another controller, or a key
// deleted with its topic) fails and the tick recomputes from a fresh read.
//
// One tick: read the whole prefix at one revision, Balance, write in batches. Ticks run on
// every change under the prefix (broker joined, left or draining; topic created or grown) and
// every Tick. Graceful moves (a draining holder, smoothing) are granted a MovesPerTick budget
// at most once per Tick; placements that have no live holder to hand over from (new
// resources, a dead holder's resources) happen on every tick, so a crash is handled as soon as
// its lease expiry is seen.

var (
	mControllerElected   = metrics.NewCounter(`kaas_cluster_controller_elected_total`)
	mControllerWrites    = metrics.NewCounter(`kaas_cluster_controller_assignment_writes_total`)
	mControllerConflicts = metrics.NewCounter(`kaas_cluster_controller_txn_conflicts_total`)
	mBalanceDeferred     = metrics.NewCounter(`kaas_cluster_balance_deferred_moves_total`) // moves held back by MovesPerTick
)

// errNotLeader: the election key a write was guarded by no longer exists.
var errNotLeader = errors.New("not the controller: election key gone")

// maxTxnWrites bounds the writes of one Txn. etcd refuses a Txn with more than 128 compares or
// 128 ops (embed.DefaultMaxTxnOps); a batch of 64 writes has 65 compares (the election guard
// plus one per key) and at most 64 ops.
const maxTxnWrites = 64

// ControllerConfig configures RunController.
type ControllerConfig struct {
	Prefix         string // "/kaas/<cluster.name>/"
	BrokerID       int32
	Member         *Member // optional: the controller stops when the member fails-stop or leaves
	MovesPerTick   int     // graceful moves per Tick; 0 means 64 (design note §7)
	Tick           time.Duration
	Logger         *zap.Logger
	SessionTimeout time.Duration // TTL of the election session
}

// RunController campaigns for the controller role and acts while it is the leader; when its
// leadership ends (Leadership.Done) it stops writing and campaigns again. It returns when ctx
// ends (resigning, so the next controller need not wait out the TTL) or when Member is done.
func RunController(ctx context.Context, b Backend, cfg ControllerConfig) {
	if cfg.MovesPerTick <= 0 {
		cfg.MovesPerTick = 64
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 6 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Member != nil {
		go func() {
			select {
			case <-cfg.Member.Done():
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	c := &controller{b: b, cfg: cfg, log: cfg.Logger.With(zap.Int32("broker", cfg.BrokerID))}
	backoff := newBackoff()
	for ctx.Err() == nil {
		lead, err := b.Campaign(ctx, cfg.Prefix+strings.TrimSuffix(pfxController, "/"), encodeCandidate(cfg.BrokerID), cfg.SessionTimeout)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("cannot campaign for controller", zap.Error(err))
				backoff.wait(ctx)
			}
			continue
		}
		backoff.reset()
		mControllerElected.Inc()
		c.log.Info("elected controller", zap.String("key", lead.Key), zap.Int64("rev", lead.Rev))
		c.lead(ctx, lead)
		if ctx.Err() != nil {
			rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
			if err := lead.Resign(rctx); err != nil {
				c.log.Warn("cannot resign controller", zap.Error(err))
			}
			rcancel()
			return
		}
		c.log.Warn("lost controller leadership", zap.String("key", lead.Key))
	}
}

// ControllerOf is the broker id of the current controller: the value of the oldest election
// candidate, or −1 when there is none.
func ControllerOf(ctx context.Context, b Backend, prefix string) (int32, error) {
	kvs, _, err := b.Get(ctx, prefix+pfxController, true)
	if err != nil {
		return -1, fmt.Errorf("cannot read controller candidates (%s): %w", prefix, err)
	}
	return oldestCandidate(kvs)
}

func oldestCandidate(kvs []KV) (int32, error) {
	var best *KV
	for i := range kvs {
		if best == nil || kvs[i].CreateRev < best.CreateRev {
			best = &kvs[i]
		}
	}
	if best == nil {
		return -1, nil
	}
	return decodeCandidate(best.Value)
}

type controller struct {
	b   Backend
	cfg ControllerConfig
	log *zap.Logger
}

// lead runs ticks until the leadership or ctx ends.
func (c *controller) lead(ctx context.Context, lead *Leadership) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lead.Done:
			cancel()
		case <-lctx.Done():
		}
	}()
	ticker := time.NewTicker(c.cfg.Tick)
	defer ticker.Stop()
	guard := Compare{Key: lead.Key, Field: CreateRevision, Rev: lead.Rev}
	var lastBudget time.Time
	backoff := newBackoff()
	for lctx.Err() == nil {
		kvs, rev, err := c.b.Get(lctx, c.cfg.Prefix, true)
		if err != nil {
			if lctx.Err() == nil {
				c.log.Warn("cannot read cluster state", zap.Error(err))
				backoff.wait(lctx)
			}
			continue
		}
		wctx, wcancel := context.WithCancel(lctx)
		c.ticks(lctx, guard, c.b.Watch(wctx, c.cfg.Prefix, rev+1), kvs, ticker, &lastBudget, backoff)
		wcancel()
	}
}

// ticks runs ticks on one watch until it breaks (closed or compacted), a read fails or the
// leadership ends.
func (c *controller) ticks(lctx context.Context, guard Compare, wch <-chan WatchResponse, kvs []KV, ticker *time.Ticker, lastBudget *time.Time, backoff *backoff) {
	for lctx.Err() == nil {
		budget := 0
		if time.Since(*lastBudget) >= c.cfg.Tick {
			budget = c.cfg.MovesPerTick
		}
		done, err := c.tick(lctx, guard, kvs, budget)
		switch {
		case errors.Is(err, errNotLeader):
			c.log.Warn("controller election key is gone; stepping down", zap.String("key", guard.Key))
			return
		case err != nil:
			if lctx.Err() == nil {
				c.log.Warn("controller tick failed", zap.Error(err))
				backoff.wait(lctx)
			}
		case done:
			backoff.reset()
			if budget > 0 {
				*lastBudget = time.Now()
			}
			// Wait for a change or the next tick.
			select {
			case wr, ok := <-wch:
				if !ok || wr.Err != nil {
					return // closed or compacted: re-list and re-watch
				}
			case <-ticker.C:
			case <-lctx.Done():
				return
			}
			drain(wch)
		default:
			// Refused by a concurrent change: re-read and recompute, after a short pause so a
			// storm of changes cannot make the controller spin.
			backoff.wait(lctx)
		}
		if kvs, _, err = c.b.Get(lctx, c.cfg.Prefix, true); err != nil {
			return
		}
	}
}

// drain takes whatever watch responses are already queued, so a burst of events costs one tick.
func drain(wch <-chan WatchResponse) {
	for {
		select {
		case _, ok := <-wch:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// clusterView is what a tick reads from one Get of the prefix.
type clusterView struct {
	in       BalanceInput
	releases []releaseRef
}

type releaseRef struct {
	id    ResourceID
	epoch int32
	key   string
}

func (c *controller) read(kvs []KV) clusterView {
	v := clusterView{in: BalanceInput{Current: map[ResourceID]StoredAssignment{}}}
	p := c.cfg.Prefix
	for _, kv := range kvs {
		rest := strings.TrimPrefix(kv.Key, p)
		switch {
		case strings.HasPrefix(rest, pfxBrokers):
			if br, ok := brokerFromKV(p, kv); ok {
				v.in.Brokers = append(v.in.Brokers, BrokerState{ID: br.ID, Inc: br.Inc, Draining: br.State == StateDraining})
			}
		case strings.HasPrefix(rest, pfxTopics):
			if t, ok := topicFromKV(p, kv); ok {
				v.in.Topics = append(v.in.Topics, TopicPartitions{ID: t.ID, Partitions: t.Partitions})
			}
		case strings.HasPrefix(rest, pfxAssign):
			id, ok := parseAssignKey(p, kv.Key)
			if !ok {
				continue
			}
			a, err := decodeAssignment(kv.Value)
			if err != nil {
				// An undecodable value is treated as absent but its ModRevision is kept, so the
				// controller overwrites it with a first placement.
				c.log.Warn("cannot decode assignment", zap.String("key", kv.Key), zap.Error(err))
				a = Assignment{Holder: Holder{Broker: -1}, Prev: noHolder}
			}
			v.in.Current[id] = StoredAssignment{Assignment: a, ModRev: kv.ModRev}
		case strings.HasPrefix(rest, pfxRelease):
			if id, e, ok := parseReleaseKey(p, kv.Key); ok {
				v.releases = append(v.releases, releaseRef{id: id, epoch: e, key: kv.Key})
			}
		}
	}
	return v
}

// tick balances one view and writes the result. done is false when a guarded write was
// refused (a concurrent change or a lost election): the caller re-reads at once.
func (c *controller) tick(ctx context.Context, guard Compare, kvs []KV, budget int) (done bool, err error) {
	v := c.read(kvs)
	v.in.MovesPerTick = budget
	res := Balance(v.in)
	if budget > 0 && res.Deferred > 0 {
		mBalanceDeferred.Add(res.Deferred)
	}
	type write struct {
		cmp *Compare
		op  Op
	}
	var ws []write
	for _, w := range res.Writes {
		key := assignKey(c.cfg.Prefix, w.ID)
		cmp := &Compare{Key: key, Field: ModRevision, Rev: w.ModRev}
		if w.New == nil {
			ws = append(ws, write{cmp, Op{Key: key, Delete: true}})
			continue
		}
		ws = append(ws, write{cmp, Op{Key: key, Value: encodeAssignment(w.ID.Kind, *w.New)}})
	}
	for _, r := range staleReleases(v) {
		ws = append(ws, write{nil, Op{Key: r.key, Delete: true}})
	}
	for start := 0; start < len(ws); start += maxTxnWrites {
		end := min(start+maxTxnWrites, len(ws))
		ifs := []Compare{guard}
		then := make([]Op, 0, end-start)
		for _, w := range ws[start:end] {
			if w.cmp != nil {
				ifs = append(ifs, *w.cmp)
			}
			then = append(then, w.op)
		}
		ok, _, err := c.b.Txn(ctx, ifs, then)
		if err != nil {
			return false, fmt.Errorf("cannot write assignments (%d ops): %w", len(then), err)
		}
		if !ok {
			mControllerConflicts.Inc()
			// Either a key changed under us (recompute) or the election key is gone (a stale
			// controller: stop). Only the second makes every later write fail too.
			kvs, _, err := c.b.Get(ctx, guard.Key, false)
			if err == nil && (len(kvs) == 0 || kvs[0].CreateRev != guard.Rev) {
				return false, errNotLeader
			}
			c.log.Debug("assignment write refused; recomputing", zap.Int("ops", len(then)))
			return false, nil
		}
		mControllerWrites.Add(len(then))
	}
	if len(res.Writes) > 0 {
		c.log.Info("assignments written", zap.Int("writes", len(res.Writes)), zap.Int("deferred", res.Deferred))
	}
	return true, nil
}

// staleReleases are release records no successor can need any more. release/<r>/<e> is read
// by the assignee of e+1 (Rule S): to take over, or, when r moved on before that broker got to
// it, to forward the record as release/<r>/<e+1>. So the record is garbage once r's assignment
// is past e+1 AND release/<r>/<e+1> exists (that assignee has released or forwarded), or once r
// is gone with its topic. Deleting it as soon as the assignment passed e+1 would strand an
// assignee that has not forwarded yet: it would wait for a record that is gone, on a holder
// that is still alive, and every later assignee would wait on it (found under -race load).
func staleReleases(v clusterView) []releaseRef {
	topics := map[[16]byte]int32{}
	for _, t := range v.in.Topics {
		topics[t.ID] = t.Partitions
	}
	type idEpoch struct {
		id    ResourceID
		epoch int32
	}
	have := make(map[idEpoch]bool, len(v.releases))
	for _, r := range v.releases {
		have[idEpoch{r.id, r.epoch}] = true
	}
	var out []releaseRef
	for _, r := range v.releases {
		cur, ok := v.in.Current[r.id]
		switch {
		case ok && cur.Epoch > r.epoch+1 && have[idEpoch{r.id, r.epoch + 1}]:
			out = append(out, r)
		case !ok && r.id.Kind == KindPartition && r.id.N >= topics[r.id.TopicID]:
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// backoff is a capped exponential wait for retrying etcd calls and callbacks.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 50 * time.Millisecond} }

func (b *backoff) reset() { b.d = 50 * time.Millisecond }

func (b *backoff) next() time.Duration {
	d := b.d
	b.d = min(2*b.d, 2*time.Second)
	return d
}

func (b *backoff) wait(ctx context.Context) {
	t := time.NewTimer(b.next())
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
