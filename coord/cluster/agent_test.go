package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kaas-go/kaas/coord/topology"
)

// resCall is one call an agent made of its Resources.
type resCall struct {
	op     string // acquire | release
	id     ResourceID
	epoch  int32
	h      Handover
	record []byte
}

// fakeRes is a Resources that records calls, keeps what it holds, can block a Release until
// the test lets it go, and checks the preconditions every Acquire relies on.
type fakeRes struct {
	broker int32
	check  func(r Resource, epoch int32, h Handover) error // Rule S oracle, called inside Acquire

	mu       sync.Mutex
	calls    []resCall
	held     map[ResourceID]int32
	topics   map[string]TopicMeta
	gates    map[ResourceID]chan struct{}
	blocked  map[ResourceID]bool
	failNext map[ResourceID]int
	problems []string
}

func newFakeRes(broker int32) *fakeRes {
	return &fakeRes{broker: broker, held: map[ResourceID]int32{}, topics: map[string]TopicMeta{},
		gates: map[ResourceID]chan struct{}{}, blocked: map[ResourceID]bool{}, failNext: map[ResourceID]int{}}
}

func (f *fakeRes) problem(format string, args ...any) {
	f.problems = append(f.problems, fmt.Sprintf("broker %d: ", f.broker)+fmt.Sprintf(format, args...))
}

func (f *fakeRes) Acquire(ctx context.Context, r Resource, epoch int32, h Handover) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.id()
	if r.Kind == KindPartition {
		if t, ok := f.topics[r.Topic]; !ok || t.ID != r.TopicID || r.Partition >= t.Partitions {
			f.problem("Acquire(%v) before TopicChanged", id)
		}
	}
	if _, ok := f.held[id]; ok {
		f.problem("Acquire(%v, %d) while holding it", id, epoch)
	}
	if f.check != nil {
		if err := f.check(r, epoch, h); err != nil {
			f.problem("Acquire(%v, %d): %v", id, epoch, err)
		}
	}
	if f.failNext[id] > 0 {
		f.failNext[id]--
		return fmt.Errorf("injected failure")
	}
	f.held[id] = epoch
	f.calls = append(f.calls, resCall{op: "acquire", id: id, epoch: epoch, h: h})
	return nil
}

func (f *fakeRes) Release(ctx context.Context, r Resource) ([]byte, error) {
	id := r.id()
	f.mu.Lock()
	gate := f.gates[id]
	f.blocked[id] = gate != nil
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocked[id] = false
	epoch, ok := f.held[id]
	if !ok {
		f.problem("Release(%v) of something not held", id)
	}
	delete(f.held, id)
	rec := []byte(fmt.Sprintf("rec/%d/%v/%d", f.broker, id, epoch))
	f.calls = append(f.calls, resCall{op: "release", id: id, epoch: epoch, record: rec})
	return rec, nil
}

func (f *fakeRes) TopicChanged(t TopicMeta) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.topics[t.Name] = t
}

func (f *fakeRes) TopicDeleted(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.topics[name]; ok {
		for id := range f.held {
			if id.Kind == KindPartition && id.TopicID == t.ID {
				delete(f.held, id)
			}
		}
	}
	delete(f.topics, name)
}

func (f *fakeRes) holding() map[ResourceID]int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[ResourceID]int32, len(f.held))
	for k, v := range f.held {
		out[k] = v
	}
	return out
}

func (f *fakeRes) acquisitions(id ResourceID) []resCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []resCall
	for _, c := range f.calls {
		if c.op == "acquire" && c.id == id {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeRes) releases() map[ResourceID][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[ResourceID][]byte{}
	for _, c := range f.calls {
		if c.op == "release" {
			out[c.id] = c.record
		}
	}
	return out
}

func (f *fakeRes) problemList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.problems...)
}

// testLog logs to the test when KAAS_TEST_LOG is set.
func testLog(t *testing.T) *zap.Logger {
	if os.Getenv("KAAS_TEST_LOG") == "" {
		return zap.NewNop()
	}
	return zaptest.NewLogger(t)
}

// tnode is one in-process broker: its etcd client, membership, table, resources, agent and a
// controller candidate.
type tnode struct {
	id      int32
	cli     Backend
	m       *Member
	fs      *failStops
	tab     *topology.Table
	res     *fakeRes
	agent   *Agent
	stopCtl context.CancelFunc
	ctlDone chan struct{}
	crashed bool
}

type tcluster struct {
	t      *testing.T
	clk    *ManualClock // nil: real time (etcd)
	f      Backend      // the test's own client, for reads and topic changes
	client func() Backend
	nodes  []*tnode
	noCtl  bool // the test writes assignments itself
}

const (
	tSession   = 3 * time.Second
	tHeartbeat = time.Second
	tMargin    = 300 * time.Millisecond
)

// newCluster starts n brokers on one Fake, each with an agent and a controller candidate.
func newCluster(t *testing.T, n int, movesPerTick int) *tcluster {
	t.Helper()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	return startCluster(t, &tcluster{t: t, clk: clk, f: f, client: func() Backend { return f.Client() }}, n, movesPerTick)
}

func startCluster(t *testing.T, c *tcluster, n, movesPerTick int) *tcluster {
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			c.stop(nd)
		}
	})
	for i := 1; i <= n; i++ {
		c.nodes = append(c.nodes, c.start(int32(i), movesPerTick))
	}
	return c
}

func (c *tcluster) start(id int32, movesPerTick int) *tnode {
	t := c.t
	ctx := context.Background()
	nd := &tnode{id: id, cli: c.client(), fs: &failStops{}, res: newFakeRes(id)}
	nd.res.check = c.ruleS
	var clk Clock = RealClock
	if c.clk != nil {
		clk = c.clk
	}
	m, err := Join(ctx, nd.cli, MemberConfig{
		Prefix: testPrefix, BrokerID: id, ClusterID: "cid-1",
		Info:           BrokerInfo{Endpoints: []topology.Endpoint{{Listener: "PLAINTEXT", Host: "127.0.0.1", Port: 9090 + id}}},
		SessionTimeout: tSession, Heartbeat: tHeartbeat, FenceMargin: tMargin, Clock: clk, FailStop: nd.fs.call,
	})
	if err != nil {
		t.Fatal(err)
	}
	nd.m = m
	nd.tab = topology.NewTable(topology.Broker{ID: id})
	nd.agent, err = StartAgent(ctx, nd.cli, AgentConfig{Prefix: testPrefix, BrokerID: id, Member: m, Table: nd.tab, Res: nd.res, SessionTimeout: tSession, Logger: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	nd.stopCtl, nd.ctlDone = cancel, make(chan struct{})
	if c.noCtl {
		close(nd.ctlDone)
		return nd
	}
	go func() {
		defer close(nd.ctlDone)
		RunController(cctx, nd.cli, ControllerConfig{Prefix: testPrefix, BrokerID: id, Member: m, MovesPerTick: movesPerTick,
			Tick: 20 * time.Millisecond, SessionTimeout: tSession, Logger: testLog(t)})
	}()
	return nd
}

func (c *tcluster) stop(nd *tnode) {
	nd.stopCtl()
	<-nd.ctlDone
	nd.agent.Close()
	if !nd.crashed {
		_ = nd.m.Leave(context.Background())
	}
}

// crash makes a broker vanish the way kill -9 does: its etcd client stops answering, its agent
// and controller stop, nothing is released and its lease runs out on its own.
func (c *tcluster) crash(nd *tnode) {
	nd.crashed = true
	if f, ok := nd.cli.(*Fake); ok {
		f.SetUnavailable(true)
	} else {
		_ = nd.cli.Close() // a real etcd client: the connection is gone, keepalives fail
	}
	nd.stopCtl()
	<-nd.ctlDone
	nd.agent.Close()
}

// ruleS is the oracle every fake Acquire consults: a takeover from a previous holder is legal
// only if etcd has that holder's release record for the previous epoch (and, when the record
// came from a real Release, that holder's fakeRes no longer holds it), or the holder's lease
// is gone at etcd (brokers/<prev> absent or another incarnation).
func (c *tcluster) ruleS(r Resource, epoch int32, h Handover) error {
	if h.PrevBroker < 0 {
		if epoch != 1 {
			return fmt.Errorf("first assignment at epoch %d", epoch)
		}
		return nil
	}
	if h.PrevEpoch != epoch-1 {
		return fmt.Errorf("prev epoch %d, want %d", h.PrevEpoch, epoch-1)
	}
	ctx := context.Background()
	kvs, _, err := c.f.Get(ctx, releaseKey(testPrefix, r.id(), h.PrevEpoch), false)
	if err != nil {
		return err
	}
	if len(kvs) == 1 {
		rv, err := decodeRelease(kvs[0].Value)
		if err != nil || rv.Inc != h.PrevInc || string(rv.Record) != string(h.Release) || (rv.Record == nil) != (h.Release == nil) {
			return fmt.Errorf("release record %s does not match the handover %+v", kvs[0].Value, h)
		}
		if nd := c.nodeByID(h.PrevBroker); nd != nil {
			if e, ok := nd.res.holding()[r.id()]; ok && e == h.PrevEpoch {
				return fmt.Errorf("broker %d still holds epoch %d", nd.id, e)
			}
		}
		return nil
	}
	if h.Release != nil {
		return fmt.Errorf("a release record in the handover but none in etcd: %+v", h)
	}
	kvs, _, err = c.f.Get(ctx, BrokerKey(testPrefix, h.PrevBroker), false)
	if err != nil {
		return err
	}
	if len(kvs) == 1 {
		if br, err := ParseBrokerKV(testPrefix, kvs[0]); err == nil && br.Inc == h.PrevInc {
			return fmt.Errorf("crash takeover while broker %d (inc %s) is still registered", h.PrevBroker, h.PrevInc)
		}
	}
	return nil
}

// advance moves the manual clock by d in heartbeat-sized steps, each once every live member's
// two loops are parked on the clock, so live members renew and a dead one's lease runs out.
func (c *tcluster) advance(d time.Duration) {
	c.t.Helper()
	const step = 250 * time.Millisecond
	for d > 0 {
		live := 0
		for _, nd := range c.nodes {
			if !nd.crashed {
				live++
			}
		}
		waitUntil(c.t, "members parked on the clock", func() bool { return c.clk.Pending() >= 2*live })
		s := min(step, d)
		c.clk.Advance(s)
		d -= s
	}
}

func (c *tcluster) alive() []*tnode {
	var out []*tnode
	for _, nd := range c.nodes {
		if !nd.crashed {
			out = append(out, nd)
		}
	}
	return out
}

// allResources is every resource of the cluster given its topics.
func allResources(topics ...TopicMeta) []ResourceID {
	var out []ResourceID
	for _, t := range topics {
		for p := int32(0); p < t.Partitions; p++ {
			out = append(out, ResourceID{Kind: KindPartition, TopicID: t.ID, N: p})
		}
	}
	for n := int32(0); n < topology.NumTxnSlots; n++ {
		out = append(out, ResourceID{Kind: KindTxnSlot, N: n})
	}
	for n := int32(0); n < topology.NumGroupShards; n++ {
		out = append(out, ResourceID{Kind: KindGroupShard, N: n})
	}
	return out
}

// holders maps each resource to the nodes (among nodes) whose Resources hold it.
func holders(nodes []*tnode) map[ResourceID][]int32 {
	out := map[ResourceID][]int32{}
	for _, nd := range nodes {
		for id := range nd.res.holding() {
			out[id] = append(out[id], nd.id)
		}
	}
	return out
}

// settled reports whether every resource has exactly one holder among the live nodes, every
// live node's Table agrees (owner, epoch, Local only on the holder), and the Held counters
// match; it returns a reason when not.
func (c *tcluster) settled(topics ...TopicMeta) string {
	live := c.alive()
	hs := holders(live)
	ids := allResources(topics...)
	if len(hs) != len(ids) {
		return fmt.Sprintf("%d resources held, want %d; %s", len(hs), len(ids), c.dump())
	}
	names := map[[16]byte]string{}
	for _, t := range topics {
		names[t.ID] = t.Name
	}
	for _, id := range ids {
		h := hs[id]
		if len(h) != 1 {
			return fmt.Sprintf("%v held by %v", id, h)
		}
		epoch := c.nodeByID(h[0]).res.holding()[id]
		for _, nd := range live {
			var o topology.Owner
			switch id.Kind {
			case KindPartition:
				o = nd.tab.Partition(names[id.TopicID], id.N)
			case KindTxnSlot:
				o = nd.tab.TxnSlot(int(id.N))
			default:
				o = nd.tab.GroupShard(int(id.N))
			}
			if want := (topology.Owner{Broker: h[0], Epoch: epoch, Known: true, Local: nd.id == h[0]}); o != want {
				return fmt.Sprintf("broker %d's table says %v is %+v, want %+v", nd.id, id, o, want)
			}
		}
	}
	for _, nd := range live {
		p, s, g := nd.agent.Held()
		if p+s+g != len(nd.res.holding()) {
			return fmt.Sprintf("broker %d Held() = %d+%d+%d, its resources hold %d", nd.id, p, s, g, len(nd.res.holding()))
		}
	}
	return ""
}

func (c *tcluster) waitSettled(topics ...TopicMeta) {
	c.t.Helper()
	waitFor(c.t, "every resource to have exactly one holder", func() string { return c.settled(topics...) })
}

// waitBalanced waits until the cluster is settled and every live broker holds its share
// (within one) of each kind.
func (c *tcluster) waitBalanced(topics ...TopicMeta) {
	c.t.Helper()
	c.waitBalancedWithin(10*time.Second, topics...)
}

func (c *tcluster) waitBalancedWithin(d time.Duration, topics ...TopicMeta) {
	c.t.Helper()
	waitForWithin(c.t, d, "a settled, balanced cluster", func() string {
		if why := c.settled(topics...); why != "" {
			return why
		}
		var lo, hi [numKinds]int
		for i, nd := range c.alive() {
			p, s, g := nd.agent.Held()
			for k, n := range [numKinds]int{p, s, g} {
				if i == 0 || n < lo[k] {
					lo[k] = n
				}
				if i == 0 || n > hi[k] {
					hi[k] = n
				}
			}
		}
		for k := range lo {
			if hi[k]-lo[k] > 1 {
				return fmt.Sprintf("%v loads from %d to %d", ResourceKind(k), lo[k], hi[k])
			}
		}
		return ""
	})
}

// waitFor polls cond until it returns "" or 10 s pass, then fails with the last reason.
func waitFor(t testing.TB, what string, cond func() string) {
	t.Helper()
	waitForWithin(t, 10*time.Second, what, cond)
}

func waitForWithin(t testing.TB, d time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, why)
		}
		time.Sleep(time.Millisecond)
	}
}

// dump describes what etcd assigns and what each agent is doing, for failure messages.
func (c *tcluster) dump() string {
	kvs, _, _ := c.f.Get(context.Background(), testPrefix+pfxAssign, true)
	by := map[int32]int{}
	for _, kv := range kvs {
		if a, err := decodeAssignment(kv.Value); err == nil {
			by[a.Broker]++
		}
	}
	out := fmt.Sprintf("etcd: %d assignments by broker %v;", len(kvs), by)
	for _, nd := range c.nodes {
		nd.agent.mu.Lock()
		phases := map[phase]int{}
		for _, st := range nd.agent.res {
			phases[st.phase]++
		}
		out += fmt.Sprintf(" broker %d: %d assigns seen, %d brokers seen, phases %v, queue %d, closed %v;",
			nd.id, len(nd.agent.assigns), len(nd.agent.brokers), phases, len(nd.agent.queue), nd.agent.closed)
		nd.agent.mu.Unlock()
	}
	return out
}

func (c *tcluster) nodeByID(id int32) *tnode {
	for _, nd := range c.nodes {
		if nd.id == id {
			return nd
		}
	}
	return nil
}

func (c *tcluster) noProblems() {
	c.t.Helper()
	for _, nd := range c.nodes {
		if ps := nd.res.problemList(); len(ps) > 0 {
			c.t.Fatalf("Resources saw %d problems, first: %s", len(ps), ps[0])
		}
	}
}

func createTopic(t *testing.T, b Backend, name string, parts int32, idByte byte) TopicMeta {
	t.Helper()
	tm := TopicMeta{Name: name, ID: [16]byte{idByte, 1}, Partitions: parts, RF: 1}
	if err := CreateTopic(context.Background(), b, testPrefix, tm); err != nil {
		t.Fatal(err)
	}
	return tm
}

func TestAgentsGiveEveryResourceExactlyOneHolder(t *testing.T) {
	c := newCluster(t, 3, 64)
	ta := createTopic(t, c.f, "a", 6, 0xa)
	// Broker 1 joined first and got everything; the controller smooths to ±1 per kind.
	waitFor(t, "a settled, balanced cluster", func() string {
		if why := c.settled(ta); why != "" {
			return why
		}
		for _, nd := range c.nodes {
			if p, s, g := nd.agent.Held(); p != 2 || s < 16 || s > 17 || g < 16 || g > 17 {
				return fmt.Sprintf("broker %d holds %d partitions, %d slots, %d shards; want 2 and 16..17 each", nd.id, p, s, g)
			}
		}
		return ""
	})
	c.noProblems()
	for _, nd := range c.nodes {
		for _, id := range allResources(ta) {
			for _, call := range nd.res.acquisitions(id) {
				if call.h.PrevBroker == -1 && call.epoch != 1 {
					t.Fatalf("first acquisition of %v at epoch %d, want 1", id, call.epoch)
				}
				if call.h.PrevBroker != -1 && call.h.Release == nil {
					t.Fatalf("smoothing move of %v without a release record: %+v", id, call.h)
				}
			}
		}
	}
	ctl, err := ControllerOf(context.Background(), c.f, testPrefix)
	if err != nil || ctl < 1 || ctl > 3 {
		t.Fatalf("ControllerOf = %d, %v", ctl, err)
	}
	waitUntil(t, "every table to name the controller", func() bool {
		for _, nd := range c.nodes {
			if nd.tab.Controller() != ctl || len(nd.tab.Brokers()) != 3 {
				return false
			}
		}
		return true
	})

	// A grown topic: the new partitions are placed, TopicChanged comes first (fakeRes checks).
	if err := SetPartitions(context.Background(), c.f, testPrefix, "a", 9); err != nil {
		t.Fatal(err)
	}
	ta.Partitions = 9
	c.waitSettled(ta)
	// A deleted topic: its assignments go, every broker forgets its partitions.
	if _, err := DeleteTopic(context.Background(), c.f, testPrefix, "a"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "deleted topic forgotten", func() bool {
		kvs, _, _ := c.f.Get(context.Background(), testPrefix+pfxAssign+segPartition, true)
		if len(kvs) != 0 {
			return false
		}
		for _, nd := range c.nodes {
			if p, _, _ := nd.agent.Held(); p != 0 || nd.tab.Partition("a", 0) != topology.NoOwner {
				return false
			}
		}
		return true
	})
	c.noProblems()
}

func TestCrashedBrokerResourcesMoveOnlyAfterLeaseExpiry(t *testing.T) {
	c := newCluster(t, 3, 64)
	ta := createTopic(t, c.f, "a", 6, 0xa)
	c.waitBalanced(ta)
	victim := c.nodes[2]
	before := victim.res.holding()
	if len(before) < 30 {
		t.Fatalf("victim holds %d resources, want its third", len(before))
	}
	inc := victim.m.Incarnation()
	c.crash(victim)

	// Inside the session timeout the victim is still registered: nothing may move (the oracle
	// in every Acquire fails the test otherwise), and the table still names it.
	c.advance(tSession - tMargin - tHeartbeat)
	if hs := holders(c.alive()); len(hs) != len(allResources(ta))-len(before) {
		t.Fatalf("before expiry %d resources held by survivors, want %d", len(hs), len(allResources(ta))-len(before))
	}
	// Past the TTL the fake etcd expires the lease and deletes brokers/3.
	waitUntil(t, "victim's lease to expire", func() bool {
		c.advance(250 * time.Millisecond)
		kvs, _, _ := c.f.Get(context.Background(), BrokerKey(testPrefix, victim.id), false)
		return len(kvs) == 0
	})
	c.waitSettled(ta)
	c.noProblems()
	hs := holders(c.alive())
	for id, e := range before {
		h := hs[id]
		nd := c.nodeByID(h[0])
		calls := nd.res.acquisitions(id)
		last := calls[len(calls)-1]
		if last.epoch != e+1 || last.h.PrevBroker != victim.id || last.h.PrevInc != inc || last.h.PrevEpoch != e || last.h.Release != nil {
			t.Fatalf("%v taken over at %d with %+v, want epoch %d from broker %d (inc %s) with no release record", id, last.epoch, last.h, e+1, victim.id, inc)
		}
	}
	if victim.fs.n.Load() == 0 {
		t.Fatal("the victim's member did not fail-stop after its deadline")
	}
}

func TestDrainHandsOverWithReleaseRecords(t *testing.T) {
	c := newCluster(t, 3, 8) // 8 graceful moves per tick: the drain takes several ticks
	ta := createTopic(t, c.f, "a", 6, 0xa)
	c.waitBalanced(ta)
	d := c.nodes[1]
	before := d.res.holding()
	if len(before) < 30 {
		t.Fatalf("draining broker holds %d resources, want its third", len(before))
	}
	// Hold one release back to see Rule S keep its successor waiting.
	slot := ResourceID{Kind: KindTxnSlot, N: -1}
	for id := range before {
		if id.Kind == KindTxnSlot && (slot.N < 0 || id.N < slot.N) {
			slot = id
		}
	}
	gate := make(chan struct{})
	d.res.mu.Lock()
	d.res.gates[slot] = gate
	d.res.mu.Unlock()

	if err := d.m.SetState(context.Background(), StateDraining); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gated release to start", func() bool {
		d.res.mu.Lock()
		defer d.res.mu.Unlock()
		return d.res.blocked[slot]
	})
	// The successor is assigned (epoch+1) but must wait for the release record.
	waitUntil(t, "the gated slot to be reassigned", func() bool {
		kvs, _, _ := c.f.Get(context.Background(), assignKey(testPrefix, slot), false)
		a, err := decodeAssignment(kvs[0].Value)
		return err == nil && a.Broker != d.id && a.Epoch == before[slot]+1
	})
	for _, nd := range c.nodes {
		// Only the handover's epoch counts: the slot may have lived on this broker before
		// the balancer first moved it to the draining one.
		for _, call := range nd.res.acquisitions(slot) {
			if nd != d && call.epoch > before[slot] {
				t.Fatalf("broker %d acquired %v at epoch %d before the release record", nd.id, slot, call.epoch)
			}
		}
		if o := nd.tab.TxnSlot(int(slot.N)); o.Local {
			t.Fatalf("broker %d's table serves %v during the handover: %+v", nd.id, slot, o)
		}
	}
	close(gate)

	select {
	case <-d.agent.Drained():
	case <-time.After(10 * time.Second):
		t.Fatalf("drain did not finish; held %v", d.res.holding())
	}
	if p, s, g := d.agent.Held(); p+s+g != 0 {
		t.Fatalf("drained broker still holds %d+%d+%d", p, s, g)
	}
	rel := d.res.releases()
	// Every resource moved with its release record, at epoch+1, to a non-draining broker.
	others := []*tnode{c.nodes[0], c.nodes[2]}
	waitUntil(t, "the other two to hold everything", func() bool { return len(holders(others)) == len(allResources(ta)) })
	hs := holders(others)
	for id, e := range before {
		h := hs[id]
		if len(h) != 1 {
			t.Fatalf("%v held by %v", id, h)
		}
		calls := c.nodeByID(h[0]).res.acquisitions(id)
		last := calls[len(calls)-1]
		if last.epoch != e+1 || last.h.PrevBroker != d.id || last.h.PrevInc != d.m.Incarnation() || string(last.h.Release) != string(rel[id]) || rel[id] == nil {
			t.Fatalf("%v acquired at %d with %+v; want epoch %d from broker %d with record %q", id, last.epoch, last.h, e+1, d.id, rel[id])
		}
	}
	c.noProblems()
}

func TestAcquireErrorIsRetried(t *testing.T) {
	c := newCluster(t, 1, 64)
	nd := c.nodes[0]
	shard := ResourceID{Kind: KindGroupShard, N: 7}
	nd.res.mu.Lock()
	nd.res.failNext[shard] = 2
	nd.res.mu.Unlock()
	c.waitSettled()
	if o := nd.tab.GroupShard(7); !o.Local || o.Epoch != 1 {
		t.Fatalf("shard 7 after retries: %+v", o)
	}
}

// A controller whose election key is gone (its session expired while it was cut off) has its
// writes refused by etcd itself, whatever it computed.
func TestStaleControllerWritesAreRefused(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	fs := &failStops{}
	cfgM := testMemberConfig(clk, fs)
	m, err := Join(ctx, f, cfgM)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Leave(ctx) }()
	cliA := f.Client()
	actx, stopA := context.WithCancel(ctx)
	doneA := make(chan struct{})
	ccfg := ControllerConfig{Prefix: testPrefix, BrokerID: 1, Tick: 20 * time.Millisecond, SessionTimeout: tSession}
	go func() { defer close(doneA); RunController(actx, cliA, ccfg) }()
	waitUntil(t, "first assignments", func() bool {
		kvs, _, _ := f.Get(ctx, testPrefix+pfxAssign, true)
		return len(kvs) == topology.NumTxnSlots+topology.NumGroupShards
	})
	cands, _, _ := f.Get(ctx, testPrefix+pfxController, true)
	if len(cands) != 1 {
		t.Fatalf("candidates %v", cands)
	}
	stale := Compare{Key: cands[0].Key, Field: CreateRevision, Rev: cands[0].CreateRev}

	// Cut A off and let its session expire; stop it (its resign cannot reach etcd).
	cliA.SetUnavailable(true)
	stopA()
	<-doneA
	waitUntil(t, "A's election key to expire", func() bool {
		waitUntil(t, "member parked", func() bool { return clk.Pending() >= 2 })
		clk.Advance(250 * time.Millisecond)
		kvs, _, _ := f.Get(ctx, cands[0].Key, false)
		return len(kvs) == 0
	})
	cliA.SetUnavailable(false)

	// A topic appears; A, still believing it leads, computes and writes its placement.
	tb := createTopic(t, f, "late", 3, 0xb)
	kvs, _, _ := f.Get(ctx, testPrefix, true)
	a := &controller{b: cliA, cfg: ControllerConfig{Prefix: testPrefix, MovesPerTick: 64}, log: zap.NewNop()}
	done, err := a.tick(ctx, stale, kvs, 64)
	if !errors.Is(err, errNotLeader) || done {
		t.Fatalf("stale tick: done=%v err=%v, want refused with errNotLeader", done, err)
	}
	if kvs, _, _ := f.Get(ctx, testPrefix+pfxAssign+segPartition, true); len(kvs) != 0 {
		t.Fatalf("stale controller wrote %d assignments", len(kvs))
	}
	if ctl, _ := ControllerOf(ctx, f, testPrefix); ctl != -1 {
		t.Fatalf("ControllerOf = %d with no candidate, want -1", ctl)
	}

	// A new controller is elected and places the topic.
	bctx, stopB := context.WithCancel(ctx)
	doneB := make(chan struct{})
	ccfg.BrokerID = 2
	go func() { defer close(doneB); RunController(bctx, f.Client(), ccfg) }()
	defer func() { stopB(); <-doneB }()
	waitUntil(t, "the new controller to place the topic", func() bool {
		kvs, _, _ := f.Get(ctx, testPrefix+pfxAssign+segPartition, true)
		return len(kvs) == int(tb.Partitions)
	})
	if ctl, _ := ControllerOf(ctx, f, testPrefix); ctl != 2 {
		t.Fatalf("ControllerOf = %d, want 2", ctl)
	}
}

// countingBackend records the size of every Txn.
type countingBackend struct {
	Backend
	mu     sync.Mutex
	maxOps int
	maxIfs int
	txns   atomic.Int32
}

func (b *countingBackend) Txn(ctx context.Context, ifs []Compare, then []Op) (bool, int64, error) {
	b.mu.Lock()
	b.maxOps = max(b.maxOps, len(then))
	b.maxIfs = max(b.maxIfs, len(ifs))
	b.mu.Unlock()
	b.txns.Add(1)
	return b.Backend.Txn(ctx, ifs, then)
}

func TestControllerBatchesWritesUnderEtcdTxnLimit(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	m, err := Join(ctx, f, testMemberConfig(clk, &failStops{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Leave(ctx) }()
	createTopic(t, f, "big", 300, 0xc)
	cb := &countingBackend{Backend: f.Client()}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunController(cctx, cb, ControllerConfig{Prefix: testPrefix, BrokerID: 1, Tick: 20 * time.Millisecond, SessionTimeout: tSession})
	}()
	defer func() { stop(); <-done }()
	want := 300 + topology.NumTxnSlots + topology.NumGroupShards
	waitUntil(t, "every resource placed", func() bool {
		kvs, _, _ := f.Get(ctx, testPrefix+pfxAssign, true)
		return len(kvs) == want
	})
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.maxOps > maxTxnWrites || cb.maxIfs > maxTxnWrites+1 {
		t.Fatalf("largest txn: %d ops, %d compares; etcd allows 128 and we batch %d", cb.maxOps, cb.maxIfs, maxTxnWrites)
	}
	if n := int(cb.txns.Load()); n < (want+maxTxnWrites-1)/maxTxnWrites {
		t.Fatalf("%d txns for %d writes", n, want)
	}
}

// compactingBackend answers the first Watch with ErrCompacted, as etcd does when the agent
// fell behind the compaction point.
type compactingBackend struct {
	Backend
	once atomic.Bool
}

func (b *compactingBackend) Watch(ctx context.Context, prefix string, fromRev int64) <-chan WatchResponse {
	if b.once.CompareAndSwap(false, true) {
		ch := make(chan WatchResponse, 1)
		ch <- WatchResponse{Err: ErrCompacted}
		close(ch)
		return ch
	}
	return b.Backend.Watch(ctx, prefix, fromRev)
}

func TestAgentRelistsAfterCompaction(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	m, err := Join(ctx, f, testMemberConfig(clk, &failStops{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Leave(ctx) }()
	res := newFakeRes(1)
	tab := topology.NewTable(topology.Broker{ID: 1})
	ag, err := StartAgent(ctx, &compactingBackend{Backend: f}, AgentConfig{Prefix: testPrefix, BrokerID: 1, Member: m, Table: tab, Res: res})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunController(cctx, f.Client(), ControllerConfig{Prefix: testPrefix, BrokerID: 5, Tick: 20 * time.Millisecond, SessionTimeout: tSession})
	}()
	defer func() { stop(); <-done }()
	waitUntil(t, "the agent to follow assignments after re-listing", func() bool {
		_, s, g := ag.Held()
		return s == topology.NumTxnSlots && g == topology.NumGroupShards
	})
	waitUntil(t, "the table to name the controller", func() bool { return tab.Controller() == 5 })
	if !tab.TxnSlot(0).Local {
		t.Fatalf("table: slot 0 %+v controller %d", tab.TxnSlot(0), tab.Controller())
	}
}

// A resource moved on again before its assignee acquired it: the assignee never touches it but
// owes its successor a release record, and forwards the previous holder's (design note §2.2
// Rule S would otherwise wait forever on a live broker that will never release).
func TestMovedBeforeAcquireForwardsTheRelease(t *testing.T) {
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	c := startCluster(t, &tcluster{t: t, clk: clk, f: f, client: func() Backend { return f.Client() }, noCtl: true}, 3, 0)
	ctx := context.Background()
	slot := ResourceID{Kind: KindTxnSlot, N: 0}
	holder := func(nd *tnode, epoch int32) Holder {
		return Holder{Broker: nd.id, Inc: nd.m.Incarnation(), Epoch: epoch}
	}
	put := func(a Assignment) {
		t.Helper()
		if _, _, err := f.Txn(ctx, nil, []Op{{Key: assignKey(testPrefix, slot), Value: encodeAssignment(slot.Kind, a)}}); err != nil {
			t.Fatal(err)
		}
	}
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	put(Assignment{Holder: holder(n1, 1), Prev: noHolder})
	waitUntil(t, "broker 1 to hold the slot", func() bool { return n1.tab.TxnSlot(0).Local })

	gate := make(chan struct{})
	n1.res.mu.Lock()
	n1.res.gates[slot] = gate
	n1.res.mu.Unlock()
	put(Assignment{Holder: holder(n2, 2), Prev: holder(n1, 1)})
	waitUntil(t, "broker 1's release to start", func() bool {
		n1.res.mu.Lock()
		defer n1.res.mu.Unlock()
		return n1.res.blocked[slot]
	})
	put(Assignment{Holder: holder(n3, 3), Prev: holder(n2, 2)})
	waitUntil(t, "broker 2 and 3 to see epoch 3", func() bool {
		return n2.tab.TxnSlot(0).Epoch == 3 && n3.tab.TxnSlot(0).Epoch == 3
	})
	if len(n2.res.acquisitions(slot)) != 0 || len(n3.res.acquisitions(slot)) != 0 {
		t.Fatal("acquired while broker 1 still held the slot")
	}
	close(gate)
	waitUntil(t, "broker 3 to hold the slot", func() bool { return n3.tab.TxnSlot(0).Local })
	rec := n1.res.releases()[slot]
	calls := n3.res.acquisitions(slot)
	if len(calls) != 1 || calls[0].epoch != 3 || calls[0].h.PrevBroker != n2.id || calls[0].h.PrevEpoch != 2 ||
		calls[0].h.PrevInc != n2.m.Incarnation() || string(calls[0].h.Release) != string(rec) || rec == nil {
		t.Fatalf("broker 3 acquired with %+v, want epoch 3 from broker 2 carrying broker 1's record %q", calls, rec)
	}
	if len(n2.res.acquisitions(slot)) != 0 {
		t.Fatal("broker 2 acquired a slot that had moved on")
	}
	c.noProblems()
}

// guardedBackend records whether any Txn succeeded after a point the test marks.
type guardedBackend struct {
	Backend
	after   atomic.Bool
	okAfter atomic.Int32
	refused atomic.Int32
}

func (b *guardedBackend) Txn(ctx context.Context, ifs []Compare, then []Op) (bool, int64, error) {
	ok, rev, err := b.Backend.Txn(ctx, ifs, then)
	if b.after.Load() && err == nil {
		if ok {
			b.okAfter.Add(1)
		} else {
			b.refused.Add(1)
		}
	}
	return ok, rev, err
}

// The same at the RunController level: a controller cut off from etcd for longer than its
// session comes back, finds its leadership gone, writes nothing, and campaigns again behind the
// new controller.
func TestControllerCutOffPastItsSessionStopsWriting(t *testing.T) {
	ctx := context.Background()
	clk := NewManualClock(time.Time{})
	f := NewFake(clk)
	m, err := Join(ctx, f, testMemberConfig(clk, &failStops{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Leave(ctx) }()
	rawA := f.Client()
	a := &guardedBackend{Backend: rawA}
	run := func(b Backend, id int32) func() {
		cctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			RunController(cctx, b, ControllerConfig{Prefix: testPrefix, BrokerID: id, Tick: 5 * time.Millisecond, SessionTimeout: tSession})
		}()
		return func() { stop(); <-done }
	}
	defer run(a, 7)()
	waitUntil(t, "A to lead", func() bool { ctl, _ := ControllerOf(ctx, f, testPrefix); return ctl == 7 })
	rawA.SetUnavailable(true)
	waitUntil(t, "A's election key to expire", func() bool {
		waitUntil(t, "member parked", func() bool { return clk.Pending() >= 2 })
		clk.Advance(250 * time.Millisecond)
		ctl, _ := ControllerOf(ctx, f, testPrefix)
		return ctl == -1
	})
	a.after.Store(true)
	defer run(f.Client(), 8)()
	waitUntil(t, "B to lead", func() bool { ctl, _ := ControllerOf(ctx, f, testPrefix); return ctl == 8 })
	createTopic(t, f, "late", 4, 0xd)
	rawA.SetUnavailable(false)
	waitUntil(t, "B to place the topic and A to campaign again", func() bool {
		kvs, _, _ := f.Get(ctx, testPrefix+pfxAssign+segPartition, true)
		cands, _, _ := f.Get(ctx, testPrefix+pfxController, true)
		return len(kvs) == 4 && len(cands) == 2
	})
	if ctl, _ := ControllerOf(ctx, f, testPrefix); ctl != 8 {
		t.Fatalf("controller %d after A came back, want 8", ctl)
	}
	if n := a.okAfter.Load(); n != 0 {
		t.Fatalf("the stale controller committed %d transactions after losing its election key", n)
	}
}
