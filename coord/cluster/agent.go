package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/coord/topology"
)

// The agent runs on every broker. It watches the cluster prefix, keeps the broker's
// topology.Table equal to etcd's view, and takes over and gives up the resources the controller
// assigns, through the server's Resources callbacks.
//
// The life of one resource on this broker (one resState):
//
//	(not here)
//	    │ assign/<r> names this broker + incarnation at epoch E, prev {H, inc, E−1}
//	    ▼
//	assigned ─── Rule S (wait) ───────────────────────────────────────────────────────────┐
//	    │  release/<r>/<E−1> exists carrying H's inc, or brokers/H is absent or has        │
//	    │  another inc (H's lease is gone). A first assignment (no prev) waits for nobody. │
//	    │                                                                                   │ assign/<r> moved on before
//	    ▼                                                                                   │ Acquire started: once Rule S
//	acquiring ── Acquire(r, E, Handover) in a worker; the Table says Known, not Local       │ holds, forward E−1's record
//	    │ ▲                                                                                 │ (nil if H crashed)
//	    │ └─ error: backoff, again                                                          │
//	    ▼ nil                                                                               │
//	held ─────── the Table says Local                                                       │
//	    │ assign/<r> names another holder (or this one at a later epoch)                    │
//	    ▼ the Table stops saying Local first                                                │
//	releasing ── Release(r) in a worker                                                     │
//	    │ ▲                                                                                 │
//	    │ └─ error: backoff, again                                                          │
//	    ▼ record                                                                            │
//	published ── Put release/<r>/<E> {inc, record} ◄────────────────────────────────────────┘
//	    │        only while Member.Publishable and this broker's registration exists (a
//	    │        compare on its CreateRevision); otherwise nothing is written and the
//	    ▼        successor waits out the lease instead
//	released (forgotten)
//
// A partition of a deleted topic leaves from any state without Release: Resources.TopicDeleted
// drops it, and no successor will ever ask for its release record.
//
// Concurrency: one goroutine reads the watch and applies events; a fixed pool of workers runs
// the blocking callbacks (Acquire, Release, the release Put), at most one per resource at a time,
// taking resources from a FIFO. Every decision is made from the current state under a.mu, so a
// worker that finishes late (an Acquire that returned after the assignment moved on) simply
// finds the next step to take.

const agentWorkers = 4

var (
	mMoves     = metrics.NewCounter(`kaas_cluster_leadership_moves_total`) // acquisitions that took over from a previous holder
	mTakeover  = metrics.NewHistogram(`kaas_cluster_takeover_seconds`)
	mAcqErrors = metrics.NewCounter(`kaas_cluster_acquire_errors_total`)
	mRelErrors = metrics.NewCounter(`kaas_cluster_release_errors_total`)
	mRelFenced = metrics.NewCounter(`kaas_cluster_release_records_unpublished_total`) // past the lease deadline (Rule P)
	mRelisted  = metrics.NewCounter(`kaas_cluster_agent_relists_total`)
	mHeld      = [numKinds]*metrics.Gauge{
		metrics.NewGauge(`kaas_cluster_held{kind="partition"}`, nil),
		metrics.NewGauge(`kaas_cluster_held{kind="txn_slot"}`, nil),
		metrics.NewGauge(`kaas_cluster_held{kind="group_shard"}`, nil),
	}
)

// Handover tells Acquire what it takes over from.
type Handover struct {
	PrevBroker int32  // −1: a first assignment (nothing to take over; epoch-0 files are the single-broker ones)
	PrevInc    string // the previous holder's incarnation (names its WAL and journals)
	PrevEpoch  int32
	Release    []byte // the previous holder's release record; nil: it crashed (its lease is gone)
}

// Resources is what the agent drives; the server implements it. Every call may block (storage
// and journal I/O), so the agent calls them from its workers, never from the watch loop, except
// TopicChanged and TopicDeleted which it calls in event order before any partition of the topic
// is acquired.
type Resources interface {
	Acquire(ctx context.Context, r Resource, epoch int32, h Handover) error
	Release(ctx context.Context, r Resource) (record []byte, err error) // record goes to release/<r>/<epoch>
	TopicChanged(t TopicMeta)                                           // created, partitions grown or configs changed (idempotent)
	TopicDeleted(name string)
}

// AgentConfig configures StartAgent.
type AgentConfig struct {
	Prefix         string
	BrokerID       int32
	Member         *Member // this broker's membership: its incarnation and Publishable (Rule P)
	Table          *topology.Table
	Res            Resources
	Logger         *zap.Logger
	SessionTimeout time.Duration
}

type phase uint8

const (
	phaseAssigned  phase = iota // assigned here, not acquired (waiting for Rule S or a worker)
	phaseAcquiring              // Acquire running
	phaseHeld                   // Acquire returned nil
	phaseReleasing              // Release running, or its record not yet published
)

type resState struct {
	phase    phase
	as       Assignment // phaseAssigned: the assignment that names this broker
	epoch    int32      // epoch acquired or being acquired
	busy     bool       // a worker is on it
	queued   bool
	retry    bool // a backoff timer will queue it
	backoff  *backoff
	released bool   // Release returned; record (possibly nil) waits to be published
	record   []byte // the release record to publish
}

// Agent is one broker's view of the cluster and the driver of its holdings.
type Agent struct {
	b     Backend
	cfg   AgentConfig
	log   *zap.Logger
	inc   string
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	ready chan struct{} // closed after the first list was applied

	// mu guards everything below. Lock order: Agent.mu → topology.Table.mu (the Table is
	// published under mu, so it changes in event order); no callback runs under mu.
	mu         sync.Mutex
	work       *sync.Cond // signalled when queue grows or the agent closes
	closed     bool
	brokers    map[int32]BrokerRecord
	topics     map[string]TopicMeta
	topicByID  map[[16]byte]string
	told       map[string]TopicMeta // what Resources has been told (TopicChanged), by name
	assigns    map[ResourceID]Assignment
	releases   map[ResourceID]map[int32]releaseValue
	candidates map[string]KV
	res        map[ResourceID]*resState
	queue      []ResourceID
	published  map[ResourceID]topology.Owner
	held       [numKinds]int
	drained    chan struct{}
	isDrained  bool
}

// StartAgent reads the cluster state once (so the Table is complete when it returns), then
// follows it. The Table is switched to RequireLoad: nothing is Local until acquired. ctx bounds
// the start only; the agent runs until Close or until Member is done.
func StartAgent(ctx context.Context, b Backend, cfg AgentConfig) (*Agent, error) {
	if cfg.Member == nil || cfg.Table == nil || cfg.Res == nil {
		return nil, errors.New("cannot start cluster agent: Member, Table and Res are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	actx, stop := context.WithCancel(context.Background())
	a := &Agent{
		b: b, cfg: cfg, inc: cfg.Member.Incarnation(), ctx: actx, stop: stop,
		log:     cfg.Logger.With(zap.Int32("broker", cfg.BrokerID)),
		ready:   make(chan struct{}),
		drained: make(chan struct{}),
		res:     map[ResourceID]*resState{}, published: map[ResourceID]topology.Owner{},
		told: map[string]TopicMeta{},
	}
	a.work = sync.NewCond(&a.mu)
	a.resetLocked()
	cfg.Table.RequireLoad()
	kvs, rev, err := b.Get(ctx, cfg.Prefix, true)
	if err != nil {
		stop()
		return nil, fmt.Errorf("cannot list cluster state (%s): %w", cfg.Prefix, err)
	}
	a.wg.Add(1 + agentWorkers)
	for i := 0; i < agentWorkers; i++ {
		go a.worker()
	}
	go a.watch(kvs, rev)
	go func() {
		select {
		case <-cfg.Member.Done():
			a.Close()
		case <-actx.Done():
		}
	}()
	select {
	case <-a.ready:
	case <-ctx.Done():
		a.Close()
		return nil, fmt.Errorf("cannot start cluster agent (broker %d): %w", cfg.BrokerID, ctx.Err())
	case <-cfg.Member.Done():
		// Fail-stop (or Leave) before the first listing was applied: Close above ends the
		// watch, and ready would never close.
		a.Close()
		return nil, fmt.Errorf("cannot start cluster agent (broker %d): the member's lease ended", cfg.BrokerID)
	}
	return a, nil
}

// Held counts what this broker holds (acquired and not released).
func (a *Agent) Held() (partitions, slots, shards int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held[KindPartition], a.held[KindTxnSlot], a.held[KindGroupShard]
}

// Drained is closed once this broker's record is draining, it holds nothing and nothing is
// assigned to it: every successor has its release record, so the broker can leave.
func (a *Agent) Drained() <-chan struct{} { return a.drained }

// Close stops the watch and the workers. It releases nothing: a broker that leaves without
// draining is a crash as far as the others can tell.
func (a *Agent) Close() {
	a.mu.Lock()
	a.closed = true
	a.work.Broadcast()
	a.mu.Unlock()
	a.stop()
	a.wg.Wait()
	a.mu.Lock()
	for k := range a.held {
		mHeld[k].Add(-float64(a.held[k]))
		a.held[k] = 0
	}
	a.mu.Unlock()
}

func (a *Agent) resetLocked() {
	a.brokers = map[int32]BrokerRecord{}
	a.topics = map[string]TopicMeta{}
	a.topicByID = map[[16]byte]string{}
	a.assigns = map[ResourceID]Assignment{}
	a.releases = map[ResourceID]map[int32]releaseValue{}
	a.candidates = map[string]KV{}
}

// watch applies the listed state, then follows the watch; on ErrCompacted (or a broken
// stream) it lists again and rebuilds the maps from scratch.
func (a *Agent) watch(kvs []KV, rev int64) {
	defer a.wg.Done()
	first := true
	bo := newBackoff()
	for a.ctx.Err() == nil {
		if !first {
			var err error
			kvs, rev, err = a.b.Get(a.ctx, a.cfg.Prefix, true)
			if err != nil {
				if a.ctx.Err() == nil {
					a.log.Warn("cannot list cluster state", zap.Error(err))
					bo.wait(a.ctx)
				}
				continue
			}
			mRelisted.Inc()
		}
		bo.reset()
		a.mu.Lock()
		a.resetLocked()
		for _, kv := range kvs {
			a.applyLocked(Event{Type: EventPut, KV: kv})
		}
		a.mu.Unlock()
		a.settle()
		if first {
			close(a.ready)
			first = false
		}
		wctx, wcancel := context.WithCancel(a.ctx)
		for wr := range a.b.Watch(wctx, a.cfg.Prefix, rev+1) {
			if wr.Err != nil {
				if !errors.Is(wr.Err, ErrCompacted) {
					a.log.Warn("cluster watch broke; listing again", zap.Error(wr.Err))
				}
				break
			}
			a.mu.Lock()
			for _, e := range wr.Events {
				a.applyLocked(e)
			}
			a.mu.Unlock()
			a.settle()
		}
		wcancel()
	}
}

// applyLocked folds one event into the maps.
func (a *Agent) applyLocked(e Event) {
	p := a.cfg.Prefix
	rest := strings.TrimPrefix(e.KV.Key, p)
	del := e.Type == EventDelete
	switch {
	case strings.HasPrefix(rest, pfxBrokers):
		if del {
			if id, ok := brokerIDOfKey(p, e.KV.Key); ok {
				delete(a.brokers, id)
			}
		} else if br, ok := brokerFromKV(p, e.KV); ok {
			a.brokers[br.ID] = br
		}
	case strings.HasPrefix(rest, pfxTopics):
		name := strings.TrimPrefix(rest, pfxTopics)
		if old, ok := a.topics[name]; ok {
			delete(a.topicByID, old.ID)
			delete(a.topics, name)
		}
		if !del {
			if t, ok := topicFromKV(p, e.KV); ok {
				a.topics[t.Name] = t
				a.topicByID[t.ID] = t.Name
			}
		}
	case strings.HasPrefix(rest, pfxAssign):
		id, ok := parseAssignKey(p, e.KV.Key)
		if !ok {
			return
		}
		if del {
			delete(a.assigns, id)
		} else if as, err := decodeAssignment(e.KV.Value); err == nil {
			a.assigns[id] = as
		} else {
			a.log.Warn("ignoring undecodable assignment", zap.String("key", e.KV.Key), zap.Error(err))
			delete(a.assigns, id)
		}
		a.touchLocked(id)
	case strings.HasPrefix(rest, pfxRelease):
		id, epoch, ok := parseReleaseKey(p, e.KV.Key)
		if !ok {
			return
		}
		if del {
			if m := a.releases[id]; m != nil {
				delete(m, epoch)
				if len(m) == 0 {
					delete(a.releases, id)
				}
			}
		} else if rv, err := decodeRelease(e.KV.Value); err == nil {
			if a.releases[id] == nil {
				a.releases[id] = map[int32]releaseValue{}
			}
			a.releases[id][epoch] = rv
		}
	case strings.HasPrefix(rest, pfxController):
		if del {
			delete(a.candidates, e.KV.Key)
		} else {
			a.candidates[e.KV.Key] = e.KV
		}
	}
}

// touchLocked makes sure an assignment naming this broker has a state to be evaluated.
func (a *Agent) touchLocked(id ResourceID) {
	as, ok := a.assigns[id]
	if !ok || !a.mineLocked(as) {
		return
	}
	if st := a.res[id]; st != nil {
		if st.phase == phaseAssigned {
			st.as = as
		}
		return
	}
	if _, known := a.resourceLocked(id); !known {
		return // a partition of a topic not (or no longer) known: nothing to act on
	}
	a.res[id] = &resState{phase: phaseAssigned, as: as, backoff: newBackoff()}
}

func (a *Agent) mineLocked(as Assignment) bool {
	return as.Broker == a.cfg.BrokerID && as.Inc == a.inc
}

// settle runs after a batch of events: it tells Resources about topic changes (before any of
// their partitions can be acquired), publishes the Table, and queues every resource with a
// step to take.
func (a *Agent) settle() {
	a.mu.Lock()
	var changed []TopicMeta
	var deleted []TopicMeta
	for name, t := range a.told {
		if now, ok := a.topics[name]; !ok || now.ID != t.ID {
			deleted = append(deleted, t) // gone, or deleted and re-created under the same name
		}
	}
	for _, t := range deleted {
		delete(a.told, t.Name)
	}
	for name, t := range a.topics {
		if old, ok := a.told[name]; !ok || t.Partitions > old.Partitions || !maps.Equal(t.Configs, old.Configs) {
			changed = append(changed, t)
		}
	}
	a.mu.Unlock()

	// In event order, outside mu: a deleted topic first (a re-created one reuses the name).
	for _, t := range deleted {
		a.cfg.Res.TopicDeleted(t.Name)
	}
	for _, t := range changed {
		a.cfg.Res.TopicChanged(t)
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range deleted {
		a.cfg.Table.ForgetTopic(t.Name)
		for id := range a.published {
			if id.Kind == KindPartition && id.TopicID == t.ID {
				delete(a.published, id)
			}
		}
	}
	for _, t := range changed {
		a.told[t.Name] = t
	}
	for id := range a.assigns {
		a.touchLocked(id)
	}
	a.publishLocked()
	for id := range a.res {
		a.kickLocked(id)
	}
	a.checkDrainedLocked()
}

// resourceLocked names id for the callbacks. A partition is known only once its topic is
// known and Resources was told about enough partitions.
func (a *Agent) resourceLocked(id ResourceID) (Resource, bool) {
	r := Resource{Kind: id.Kind, Partition: id.N}
	if id.Kind != KindPartition {
		return r, true
	}
	name, ok := a.topicByID[id.TopicID]
	if !ok {
		return r, false
	}
	t, ok := a.told[name]
	if !ok || t.ID != id.TopicID || id.N >= t.Partitions {
		return r, false
	}
	r.Topic, r.TopicID = name, id.TopicID
	return r, true
}

// ownerLocked is what the Table says about id: the assigned broker and epoch when that broker
// is registered with the assigned incarnation (else nobody: Metadata answers leader −1), Local
// only once this broker acquired it at that epoch.
func (a *Agent) ownerLocked(id ResourceID) topology.Owner {
	as, ok := a.assigns[id]
	if !ok {
		return topology.NoOwner
	}
	if br, ok := a.brokers[as.Broker]; !ok || br.Inc != as.Inc {
		return topology.NoOwner
	}
	o := topology.Owner{Broker: as.Broker, Epoch: as.Epoch, Known: true}
	if st := a.res[id]; st != nil && a.mineLocked(as) && st.phase == phaseHeld && st.epoch == as.Epoch {
		o.Local = true
	}
	return o
}

// publishLocked brings the Table up to date: brokers, controller, and every owner that changed.
func (a *Agent) publishLocked() {
	bs := make([]topology.Broker, 0, len(a.brokers))
	for _, br := range a.brokers {
		bs = append(bs, topology.Broker{ID: br.ID, Rack: br.Info.Rack, Endpoints: br.Info.Endpoints})
	}
	if !sameBrokers(bs, a.cfg.Table.Brokers()) {
		a.cfg.Table.SetBrokers(bs)
	}
	cands := make([]KV, 0, len(a.candidates))
	for _, kv := range a.candidates {
		cands = append(cands, kv)
	}
	if ctl, err := oldestCandidate(cands); err == nil && ctl != a.cfg.Table.Controller() {
		a.cfg.Table.SetController(ctl)
	}
	parts := map[topology.TopicPartition]topology.Owner{}
	for name, t := range a.told {
		for p := int32(0); p < t.Partitions; p++ {
			id := ResourceID{Kind: KindPartition, TopicID: t.ID, N: p}
			if o := a.ownerLocked(id); o != a.published[id] || !a.isPublished(id) {
				parts[topology.TopicPartition{Topic: name, Partition: p}] = o
				a.published[id] = o
			}
		}
	}
	if len(parts) > 0 {
		a.cfg.Table.SetPartitions(parts)
	}
	for n := int32(0); n < topology.NumTxnSlots; n++ {
		id := ResourceID{Kind: KindTxnSlot, N: n}
		if o := a.ownerLocked(id); o != a.published[id] || !a.isPublished(id) {
			a.cfg.Table.SetTxnSlot(int(n), o)
			a.published[id] = o
		}
	}
	for n := int32(0); n < topology.NumGroupShards; n++ {
		id := ResourceID{Kind: KindGroupShard, N: n}
		if o := a.ownerLocked(id); o != a.published[id] || !a.isPublished(id) {
			a.cfg.Table.SetGroupShard(int(n), o)
			a.published[id] = o
		}
	}
}

func (a *Agent) isPublished(id ResourceID) bool { _, ok := a.published[id]; return ok }

func sameBrokers(a, b []topology.Broker) bool {
	if len(a) != len(b) {
		return false
	}
	byID := make(map[int32]topology.Broker, len(b))
	for _, x := range b {
		byID[x.ID] = x
	}
	for _, x := range a {
		y, ok := byID[x.ID]
		if !ok || x.Rack != y.Rack || len(x.Endpoints) != len(y.Endpoints) {
			return false
		}
		for i := range x.Endpoints {
			if x.Endpoints[i] != y.Endpoints[i] {
				return false
			}
		}
	}
	return true
}

type step uint8

const (
	stepNone    step = iota
	stepAcquire      // Rule S holds: take it over
	stepRelease      // held here, assigned elsewhere
	stepPublish      // released, record not yet in etcd
	stepForward      // moved on before it was acquired: publish release/<r>/<E> passing on E−1's record
	stepDrop         // forget it (its topic is gone)
)

// decideLocked is the state machine of the package comment: the next step for id.
func (a *Agent) decideLocked(id ResourceID, st *resState) (step, Resource, Handover) {
	r, known := a.resourceLocked(id)
	as, assigned := a.assigns[id]
	mine := assigned && known && a.mineLocked(as)
	switch st.phase {
	case phaseAssigned:
		if !known || !assigned {
			return stepDrop, r, Handover{}
		}
		if mine {
			if h, ok := a.ruleSLocked(id, as); ok {
				return stepAcquire, r, h
			}
			break
		}
		// Moved on before this broker acquired it. Its successor waits for release/<r>/<E> from
		// this broker (Rule S), so this broker still owes one: once Rule S for E holds, it
		// forwards what it would have taken over (the previous holder's record, or nil when
		// that holder crashed) without ever touching the resource.
		if h, ok := a.ruleSLocked(id, st.as); ok {
			return stepForward, r, h
		}
	case phaseHeld:
		if !known {
			return stepDrop, r, Handover{}
		}
		if !mine || as.Epoch != st.epoch {
			return stepRelease, r, Handover{}
		}
	case phaseReleasing:
		if !known {
			return stepDrop, r, Handover{}
		}
		if st.released {
			return stepPublish, r, Handover{}
		}
		return stepRelease, r, Handover{}
	}
	return stepNone, r, Handover{}
}

// ruleSLocked is design note §2.2 Rule S: take over at E only after the holder of E−1 released
// it (its release record, from the incarnation the assignment names), or its lease is gone
// (brokers/H absent, or carrying another incarnation). A first assignment has nobody to wait for.
func (a *Agent) ruleSLocked(id ResourceID, as Assignment) (Handover, bool) {
	p := as.Prev
	h := Handover{PrevBroker: p.Broker, PrevInc: p.Inc, PrevEpoch: p.Epoch}
	if p.Broker < 0 {
		return h, true
	}
	if rv, ok := a.releases[id][p.Epoch]; ok && rv.Inc == p.Inc {
		// nil only when the record was forwarded by a holder that never acquired, from a
		// predecessor that crashed: the takeover is then a crash takeover.
		h.Release = rv.Record
		return h, true
	}
	if br, ok := a.brokers[p.Broker]; !ok || br.Inc != p.Inc {
		return h, true
	}
	return h, false
}

// kickLocked queues id for a worker when it has a step to take and nobody is on it.
func (a *Agent) kickLocked(id ResourceID) {
	st := a.res[id]
	if st == nil || st.busy || st.queued || st.retry || a.closed {
		return
	}
	if s, _, _ := a.decideLocked(id, st); s == stepNone {
		return
	}
	st.queued = true
	a.queue = append(a.queue, id)
	a.work.Signal()
}

func (a *Agent) worker() {
	defer a.wg.Done()
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		for len(a.queue) == 0 && !a.closed {
			a.work.Wait()
		}
		if a.closed {
			return
		}
		id := a.queue[0]
		a.queue = a.queue[1:]
		st := a.res[id]
		if st == nil {
			continue
		}
		st.queued = false
		a.runLocked(id, st)
		a.touchLocked(id)
		a.kickLocked(id)
		a.checkDrainedLocked()
	}
}

// runLocked takes one step for id; it releases mu around the callbacks.
func (a *Agent) runLocked(id ResourceID, st *resState) {
	s, r, h := a.decideLocked(id, st)
	switch s {
	case stepDrop:
		a.dropLocked(id, st)
	case stepAcquire:
		epoch := a.assigns[id].Epoch
		st.busy, st.phase, st.epoch = true, phaseAcquiring, epoch
		a.mu.Unlock()
		t0 := time.Now()
		err := a.cfg.Res.Acquire(a.ctx, r, epoch, h)
		a.mu.Lock()
		st.busy = false
		if err != nil {
			st.phase = phaseAssigned
			mAcqErrors.Inc()
			if a.ctx.Err() == nil {
				a.log.Warn("cannot acquire; retrying", zap.Stringer("resource", id), zap.Int32("epoch", epoch), zap.Error(err))
			}
			a.retryLocked(id, st)
			return
		}
		mTakeover.UpdateDuration(t0)
		if h.PrevBroker >= 0 {
			mMoves.Inc()
		}
		st.phase = phaseHeld
		st.backoff.reset()
		a.countLocked(id.Kind, +1)
		a.log.Info("acquired", zap.Stringer("resource", id), zap.Int32("epoch", epoch),
			zap.Int32("prev", h.PrevBroker), zap.Bool("release", h.Release != nil), zap.Duration("took", time.Since(t0)))
		a.publishOneLocked(id)
	case stepRelease:
		// The Table already names the new holder (published when the assignment event was
		// applied, before this step was queued), so nothing is served locally from here on.
		st.busy, st.phase = true, phaseReleasing
		a.mu.Unlock()
		rec, err := a.cfg.Res.Release(a.ctx, r)
		a.mu.Lock()
		st.busy = false
		if err != nil {
			mRelErrors.Inc()
			if a.ctx.Err() == nil {
				a.log.Warn("cannot release; retrying", zap.Stringer("resource", id), zap.Int32("epoch", st.epoch), zap.Error(err))
			}
			a.retryLocked(id, st)
			return
		}
		a.countLocked(id.Kind, -1)
		if rec == nil {
			rec = []byte{} // a graceful release: non-nil even when Resources has nothing to say
		}
		st.released, st.record = true, rec
		a.publishReleaseLocked(id, st)
	case stepForward:
		st.phase, st.epoch, st.released, st.record = phaseReleasing, st.as.Epoch, true, h.Release
		a.log.Info("forwarding release of a resource moved on before it was acquired", zap.Stringer("resource", id),
			zap.Int32("epoch", st.epoch), zap.Int32("prev", h.PrevBroker), zap.Bool("record", h.Release != nil))
		a.publishReleaseLocked(id, st)
	case stepPublish:
		a.publishReleaseLocked(id, st)
	}
}

// publishReleaseLocked writes release/<r>/<epoch>. Rule P: only while the lease deadline has
// not passed, and guarded by this broker's own registration (its CreateRevision), so etcd
// itself refuses the record once the lease is gone; in both cases the successor waits for the
// lease to expire instead, which is safe.
func (a *Agent) publishReleaseLocked(id ResourceID, st *resState) {
	if !a.cfg.Member.Publishable() {
		mRelFenced.Inc()
		a.log.Warn("release record not published: past the lease deadline", zap.Stringer("resource", id), zap.Int32("epoch", st.epoch))
		a.dropLocked(id, st)
		return
	}
	ifs := []Compare{{Key: BrokerKey(a.cfg.Prefix, a.cfg.BrokerID), Field: CreateRevision, Rev: a.cfg.Member.CreateRev()}}
	key := releaseKey(a.cfg.Prefix, id, st.epoch)
	val := encodeRelease(a.inc, st.record)
	st.busy = true
	a.mu.Unlock()
	ok, _, err := a.b.Txn(a.ctx, ifs, []Op{{Key: key, Value: val}})
	a.mu.Lock()
	st.busy = false
	switch {
	case err != nil:
		if a.ctx.Err() == nil {
			a.log.Warn("cannot publish release record; retrying", zap.String("key", key), zap.Error(err))
		}
		a.retryLocked(id, st)
	case !ok:
		mRelFenced.Inc()
		a.log.Warn("release record refused: this broker's registration is gone", zap.String("key", key))
		a.dropLocked(id, st)
	default:
		a.log.Info("released", zap.Stringer("resource", id), zap.Int32("epoch", st.epoch))
		a.dropLocked(id, st)
	}
}

func (a *Agent) dropLocked(id ResourceID, st *resState) {
	if st.phase == phaseHeld || (st.phase == phaseReleasing && !st.released) {
		a.countLocked(id.Kind, -1)
	}
	if a.res[id] == st {
		delete(a.res, id)
	}
	a.publishOneLocked(id)
}

// publishOneLocked updates the Table for one resource whose local state changed.
func (a *Agent) publishOneLocked(id ResourceID) {
	o := a.ownerLocked(id)
	if old, ok := a.published[id]; ok && old == o {
		return
	}
	switch id.Kind {
	case KindPartition:
		r, known := a.resourceLocked(id)
		if !known {
			return // its topic is gone: ForgetTopic already dropped it
		}
		a.cfg.Table.SetPartition(r.Topic, id.N, o)
	case KindTxnSlot:
		a.cfg.Table.SetTxnSlot(int(id.N), o)
	case KindGroupShard:
		a.cfg.Table.SetGroupShard(int(id.N), o)
	}
	a.published[id] = o
}

func (a *Agent) countLocked(k ResourceKind, d int) {
	a.held[k] += d
	mHeld[k].Add(float64(d))
}

// retryLocked queues id again after its backoff.
func (a *Agent) retryLocked(id ResourceID, st *resState) {
	st.retry = true
	time.AfterFunc(st.backoff.next(), func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		st.retry = false
		if a.res[id] == st {
			a.kickLocked(id)
		}
	})
}

func (a *Agent) checkDrainedLocked() {
	if a.isDrained {
		return
	}
	me, ok := a.brokers[a.cfg.BrokerID]
	if !ok || me.Inc != a.inc || me.State != StateDraining || len(a.res) != 0 {
		return
	}
	for _, as := range a.assigns {
		if a.mineLocked(as) {
			return
		}
	}
	a.isDrained = true
	close(a.drained)
}

func brokerIDOfKey(prefix, key string) (int32, bool) {
	s, ok := strings.CutPrefix(key, prefix+pfxBrokers)
	if !ok {
		return 0, false
	}
	var id int32
	if _, err := fmt.Sscan(s, &id); err != nil {
		return 0, false
	}
	return id, true
}
