package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/coord/topology"
)

// Broker states carried in brokers/<id>.
const (
	StateAlive    = "alive"
	StateDraining = "draining"
)

var (
	mLeaseSlack        = metrics.NewGauge(`kaas_cluster_lease_deadline_slack_seconds`, nil)
	mKeepAliveFailures = metrics.NewCounter(`kaas_cluster_keepalive_failures_total`)
	mFailStops         = metrics.NewCounter(`kaas_cluster_failstop_total`)
	mJoinRefusedHeld   = metrics.NewCounter(`kaas_cluster_join_refused_id_held_total`)
)

// MemberConfig configures Join.
type MemberConfig struct {
	Prefix    string // "/kaas/<cluster.name>/"
	BrokerID  int32
	ClusterID string // the volume's __cluster/cluster.json id
	Info      BrokerInfo

	SessionTimeout, Heartbeat, FenceMargin time.Duration

	Clock  Clock // nil: RealClock
	Logger *zap.Logger
	// FailStop is called once when the lease deadline passes or the lease is gone. nil: log at
	// error and os.Exit(3) (the supervisor restarts the broker with a new incarnation).
	FailStop func(reason string)
}

// BrokerInfo is what brokers/<id> carries besides inc and state.
type BrokerInfo struct {
	Rack      string
	Endpoints []topology.Endpoint
}

// BrokerRecord is one registered broker as read from brokers/<id>.
type BrokerRecord struct {
	ID        int32
	Inc       string
	State     string // StateAlive | StateDraining
	Info      BrokerInfo
	CreateRev int64
}

type endpointJSON struct {
	Listener string `json:"listener"`
	Host     string `json:"host"`
	Port     int32  `json:"port"`
}

type brokerJSON struct {
	Inc       string         `json:"inc"`
	State     string         `json:"state"`
	Rack      string         `json:"rack"`
	Endpoints []endpointJSON `json:"endpoints"`
}

func encodeBroker(inc, state string, info BrokerInfo) []byte {
	j := brokerJSON{Inc: inc, State: state, Rack: info.Rack, Endpoints: []endpointJSON{}}
	for _, e := range info.Endpoints {
		j.Endpoints = append(j.Endpoints, endpointJSON(e))
	}
	b, _ := json.Marshal(j) // plain strings and ints: cannot fail
	return b
}

// ClusterIDKey is <prefix>cluster-id.
func ClusterIDKey(prefix string) string { return prefix + "cluster-id" }

// BrokersPrefix is <prefix>brokers/ (watch it to follow membership).
func BrokersPrefix(prefix string) string { return prefix + "brokers/" }

// BrokerKey is <prefix>brokers/<id>.
func BrokerKey(prefix string, id int32) string {
	return BrokersPrefix(prefix) + strconv.FormatInt(int64(id), 10)
}

// ParseBrokerKV decodes a brokers/<id> key (as returned by Get or a put event).
func ParseBrokerKV(prefix string, kv KV) (BrokerRecord, error) {
	idText, ok := strings.CutPrefix(kv.Key, BrokersPrefix(prefix))
	if !ok {
		return BrokerRecord{}, fmt.Errorf("cannot parse broker key %q: not under %s", kv.Key, BrokersPrefix(prefix))
	}
	id, err := strconv.ParseInt(idText, 10, 32)
	if err != nil {
		return BrokerRecord{}, fmt.Errorf("cannot parse broker key %q: %w", kv.Key, err)
	}
	var j brokerJSON
	if err := json.Unmarshal(kv.Value, &j); err != nil {
		return BrokerRecord{}, fmt.Errorf("cannot parse broker record %q: %w", kv.Key, err)
	}
	r := BrokerRecord{ID: int32(id), Inc: j.Inc, State: j.State, Info: BrokerInfo{Rack: j.Rack}, CreateRev: kv.CreateRev}
	for _, e := range j.Endpoints {
		r.Info.Endpoints = append(r.Info.Endpoints, topology.Endpoint(e))
	}
	return r, nil
}

// ListBrokers reads every registered broker, sorted by id, and the revision of the read (watch
// BrokersPrefix from rev+1 to follow changes).
func ListBrokers(ctx context.Context, b Backend, prefix string) ([]BrokerRecord, int64, error) {
	kvs, rev, err := b.Get(ctx, BrokersPrefix(prefix), true)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot list brokers (%s): %w", prefix, err)
	}
	out := make([]BrokerRecord, 0, len(kvs))
	for _, kv := range kvs {
		r, err := ParseBrokerKV(prefix, kv)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, r)
	}
	sortBrokers(out)
	return out, rev, nil
}

func sortBrokers(rs []BrokerRecord) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].ID < rs[j].ID })
}

// Member is this broker's registration: its lease, its brokers/<id> key and the lease deadline D
// that gates publication (Rule P).
//
//	Join ──► live ──(now ≥ D | lease not found)──► failed  (FailStop once, Done closed)
//	           │
//	           └──(Leave)──► left  (own lease revoked, Done closed)
type Member struct {
	b     Backend
	cfg   MemberConfig
	clock Clock
	log   *zap.Logger

	lease     LeaseID
	inc       string
	key       string
	createRev int64

	// Deadlines are nanoseconds since base, a Clock reading taken at Join. With RealClock the
	// subtraction uses the monotonic reading, so a wall-clock step cannot move D.
	base     time.Time
	deadline atomic.Int64 // D; only moves forward
	lastSent atomic.Int64 // send time of the last answered keepalive (or the Grant)
	stopped  atomic.Bool  // failed or left: never publishable again

	stop    chan struct{} // closed once by end; ends both loops
	done    chan struct{}
	endOnce sync.Once
	wg      sync.WaitGroup
	cancel  context.CancelFunc // aborts an in-flight keepalive at Leave

	mu      sync.Mutex // Lock order: leaf. Guards lastErr and state.
	lastErr error
	state   string
}

// Join registers cfg.BrokerID in the cluster and starts the lease loop. It refuses, with an
// error naming the cause and without writing brokers/<id>, when etcd is unreachable, when the
// cluster-id in etcd differs from cfg.ClusterID (the key is created when absent), or when
// brokers/<id> is still held after holderWait (a dead predecessor's key is deleted within its
// TTL plus etcd's sweep, so only a live incarnation holds it that long).
func Join(ctx context.Context, b Backend, cfg MemberConfig) (*Member, error) {
	if cfg.Clock == nil {
		cfg.Clock = RealClock
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	id := cfg.BrokerID
	switch {
	case cfg.Prefix == "" || !strings.HasSuffix(cfg.Prefix, "/"):
		return nil, fmt.Errorf("cannot join cluster as broker %d: prefix %q must end in /", id, cfg.Prefix)
	case cfg.ClusterID == "":
		return nil, fmt.Errorf("cannot join cluster (%s) as broker %d: empty cluster id", cfg.Prefix, id)
	case cfg.SessionTimeout <= 0 || cfg.Heartbeat <= 0 || cfg.FenceMargin < 0 ||
		cfg.Heartbeat+cfg.FenceMargin >= cfg.SessionTimeout:
		// A renewal sent every Heartbeat must land before D = send + TTL − margin, or the
		// broker fail-stops on a healthy etcd.
		return nil, fmt.Errorf("cannot join cluster (%s) as broker %d: need heartbeat (%s) + fence margin (%s) < session timeout (%s)",
			cfg.Prefix, id, cfg.Heartbeat, cfg.FenceMargin, cfg.SessionTimeout)
	}
	clock := cfg.Clock

	cidKey := ClusterIDKey(cfg.Prefix)
	ok, _, err := b.Txn(ctx, []Compare{{Key: cidKey, Field: CreateRevision, Rev: 0}}, []Op{{Key: cidKey, Value: []byte(cfg.ClusterID)}})
	if err != nil {
		return nil, fmt.Errorf("cannot join cluster (%s) as broker %d: etcd unreachable: %w", cfg.Prefix, id, err)
	}
	if !ok {
		kvs, _, err := b.Get(ctx, cidKey, false)
		if err != nil {
			return nil, fmt.Errorf("cannot join cluster (%s) as broker %d: etcd unreachable: %w", cfg.Prefix, id, err)
		}
		if len(kvs) != 1 || string(kvs[0].Value) != cfg.ClusterID {
			have := ""
			if len(kvs) == 1 {
				have = string(kvs[0].Value)
			}
			return nil, fmt.Errorf("cannot join cluster (%s) as broker %d: etcd has cluster-id %q but the volume has %q (the volume belongs to another cluster)",
				cfg.Prefix, id, have, cfg.ClusterID)
		}
	}

	m := &Member{b: b, cfg: cfg, clock: clock, log: cfg.Logger.With(zap.Int32("broker", id)),
		key: BrokerKey(cfg.Prefix, id), stop: make(chan struct{}), done: make(chan struct{}), state: StateAlive}
	if err := m.register(ctx); err != nil {
		return nil, err
	}
	if !m.Publishable() {
		_ = b.Revoke(context.WithoutCancel(ctx), m.lease)
		return nil, fmt.Errorf("cannot join cluster (%s) as broker %d: registration took longer than the session timeout %s", cfg.Prefix, id, cfg.SessionTimeout)
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.wg.Add(2)
	go m.renewLoop(loopCtx)
	go m.watchdog()
	m.log.Info("joined cluster", zap.String("inc", m.inc), zap.Time("deadline", m.Deadline()))
	return m, nil
}

// holderWait bounds how long register waits for a predecessor's brokers/<id> to vanish. A dead
// predecessor's lease runs out at most SessionTimeout after its last keepalive, but etcd deletes
// an expired lease's keys lazily: its lessor sweeps every 500 ms and the revoke is one more raft
// round (lessor.runLoop; a loaded etcd takes longer still). So a broker restarted right after a
// kill -9 can find the key still there past SessionTimeout+FenceMargin, and a bound that tight
// refused it. A live holder (the same broker.id configured twice) renews every heartbeat and
// keeps its key for ever, so a second SessionTimeout of grace costs nothing in telling the two
// apart.
func holderWait(cfg MemberConfig) time.Duration { return 2*cfg.SessionTimeout + cfg.FenceMargin }

// register writes brokers/<id> under a fresh lease, waiting up to holderWait for a
// predecessor's key to vanish.
func (m *Member) register(ctx context.Context) error {
	cfg, b, id := m.cfg, m.b, m.cfg.BrokerID
	var waitUntil time.Time
	for {
		kvs, rev, err := b.Get(ctx, m.key, false)
		if err != nil {
			return fmt.Errorf("cannot join cluster (%s) as broker %d: etcd unreachable: %w", cfg.Prefix, id, err)
		}
		if len(kvs) == 0 {
			done, err := m.tryRegister(ctx)
			if err != nil || done {
				return err
			}
			continue // somebody registered in between: wait for it like for any holder
		}
		holder := "?"
		if r, err := ParseBrokerKV(cfg.Prefix, kvs[0]); err == nil {
			holder = r.Inc
		}
		now := m.clock.Now()
		if waitUntil.IsZero() {
			waitUntil = now.Add(holderWait(cfg))
			m.log.Info("broker id held; waiting for the previous incarnation's lease to expire",
				zap.String("holder", holder), zap.Duration("max_wait", holderWait(cfg)))
		}
		if !now.Before(waitUntil) {
			mJoinRefusedHeld.Inc()
			return fmt.Errorf("cannot join cluster (%s) as broker %d: broker.id %d is held by live incarnation %s (still registered after twice the session timeout %s + fence margin %s)",
				cfg.Prefix, id, id, holder, cfg.SessionTimeout, cfg.FenceMargin)
		}
		if err := m.waitGone(ctx, rev, waitUntil.Sub(now)); err != nil {
			return err
		}
	}
}

// tryRegister grants a lease and creates brokers/<id> If(CreateRevision==0). false: the key
// appeared in between (the lease is revoked again).
func (m *Member) tryRegister(ctx context.Context) (bool, error) {
	cfg, b, id := m.cfg, m.b, m.cfg.BrokerID
	t0 := m.clock.Now()
	lease, err := b.Grant(ctx, cfg.SessionTimeout)
	if err != nil {
		return false, fmt.Errorf("cannot join cluster (%s) as broker %d: cannot grant lease: %w", cfg.Prefix, id, err)
	}
	inc := fmt.Sprintf("%x", int64(lease))
	ok, rev, err := b.Txn(ctx, []Compare{{Key: m.key, Field: CreateRevision, Rev: 0}},
		[]Op{{Key: m.key, Value: encodeBroker(inc, StateAlive, cfg.Info), Lease: lease}})
	if err != nil || !ok {
		_ = b.Revoke(context.WithoutCancel(ctx), lease)
		if err != nil {
			return false, fmt.Errorf("cannot join cluster (%s) as broker %d: cannot register: %w", cfg.Prefix, id, err)
		}
		return false, nil
	}
	m.lease, m.inc, m.createRev = lease, inc, rev
	m.base = t0
	// The lease was granted by a server that received the request after t0, so it expires no
	// earlier than t0 + TTL: D counts from the send time (see doc.go).
	m.deadline.Store(int64(cfg.SessionTimeout - cfg.FenceMargin))
	m.lastSent.Store(0)
	return true, nil
}

// waitGone waits up to d for a delete of m.key after rev (or any watch trouble: the caller
// re-reads).
func (m *Member) waitGone(ctx context.Context, rev int64, d time.Duration) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := m.b.Watch(wctx, m.key, rev+1)
	timer := m.clock.After(d)
	for {
		select {
		case wr, ok := <-w:
			if !ok || wr.Err != nil {
				return nil
			}
			for _, e := range wr.Events {
				if e.KV.Key == m.key && e.Type == EventDelete {
					return nil
				}
			}
		case <-timer:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("cannot join cluster (%s) as broker %d: %w", m.cfg.Prefix, m.cfg.BrokerID, ctx.Err())
		}
	}
}

func (m *Member) since(t time.Time) int64 { return int64(t.Sub(m.base)) }

// renewLoop sends one keepalive every Heartbeat and moves D to send time + TTL − margin. After
// a failed keepalive it retries every Heartbeat/4: an etcd restart or leader election shorter
// than the slack then costs nothing, where waiting a full heartbeat could run past D.
func (m *Member) renewLoop(ctx context.Context) {
	defer m.wg.Done()
	wait := m.cfg.Heartbeat
	for {
		select {
		case <-m.stop:
			return
		case <-m.clock.After(wait):
		}
		if m.renewOnce(ctx) {
			wait = m.cfg.Heartbeat
		} else {
			wait = m.cfg.Heartbeat / 4
		}
	}
}

// renewOnce sends one keepalive; false when it failed.
func (m *Member) renewOnce(ctx context.Context) bool {
	t0 := m.clock.Now()
	// A keepalive that takes longer than a heartbeat is useless (the next one is due); the
	// watchdog, not this call, decides when D has passed.
	rctx, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
	ttl, err := m.b.KeepAliveOnce(rctx, m.lease)
	cancel()
	if errors.Is(err, ErrLeaseNotFound) {
		m.failStop(fmt.Sprintf("lease %s not found at etcd (expired or revoked): another broker may already own this broker's resources", m.inc))
		return false
	}
	if err != nil {
		if m.stopped.Load() {
			return false
		}
		mKeepAliveFailures.Inc()
		m.mu.Lock()
		m.lastErr = err
		m.mu.Unlock()
		m.log.Warn("lease keepalive failed", zap.String("inc", m.inc), zap.Error(err),
			zap.Duration("deadline_in", m.Deadline().Sub(m.clock.Now())))
		return false
	}
	d := m.since(t0) + int64(ttl-m.cfg.FenceMargin)
	for {
		cur := m.deadline.Load()
		if d <= cur || m.deadline.CompareAndSwap(cur, d) {
			break
		}
	}
	if s := m.since(t0); s > m.lastSent.Load() {
		m.lastSent.Store(s)
	}
	mLeaseSlack.Set(time.Duration(m.deadline.Load() - m.since(m.clock.Now())).Seconds())
	return true
}

// watchdog fail-stops the broker once the clock reaches D.
func (m *Member) watchdog() {
	defer m.wg.Done()
	for {
		now := m.clock.Now()
		left := time.Duration(m.deadline.Load() - m.since(now))
		if left <= 0 {
			m.mu.Lock()
			lastErr := m.lastErr
			m.mu.Unlock()
			sent := m.base.Add(time.Duration(m.lastSent.Load()))
			m.failStop(fmt.Sprintf("lease deadline passed: etcd unreachable for %s since the last answered keepalive was sent (session timeout %s, fence margin %s; last error: %v)",
				now.Sub(sent).Round(time.Millisecond), m.cfg.SessionTimeout, m.cfg.FenceMargin, lastErr))
			return
		}
		select {
		case <-m.stop:
			return
		case <-m.clock.After(left):
		}
	}
}

func (m *Member) failStop(reason string) {
	m.endOnce.Do(func() {
		m.stopped.Store(true)
		close(m.stop)
		m.cancel()
		mFailStops.Inc()
		m.log.Error("fail-stop: this broker stops publishing and exits", zap.String("inc", m.inc), zap.String("reason", reason))
		close(m.done)
		if m.cfg.FailStop != nil {
			m.cfg.FailStop(reason)
			return
		}
		_ = m.log.Sync()
		os.Exit(3)
	})
}

// Incarnation is the lease id in hex; it names this process's WAL dir, journals and epoch files.
func (m *Member) Incarnation() string { return m.inc }

// Lease is the liveness lease (brokers/<id> is attached to it).
func (m *Member) Lease() LeaseID { return m.lease }

// CreateRev is the revision that created this incarnation's brokers/<id>.
func (m *Member) CreateRev() int64 { return m.createRev }

// Publishable is Rule P's lease half: true while Clock.Now() < D and the member has neither
// failed nor left. Lock-free; call it after the durability point, before exposing the effect.
func (m *Member) Publishable() bool {
	if m.stopped.Load() {
		return false
	}
	return m.since(m.clock.Now()) < m.deadline.Load()
}

// Deadline is D = send time of the last answered keepalive + TTL − margin.
func (m *Member) Deadline() time.Time { return m.base.Add(time.Duration(m.deadline.Load())) }

// SetState rewrites brokers/<id> with state (StateAlive | StateDraining) under the same lease,
// guarded by this incarnation's CreateRevision.
func (m *Member) SetState(ctx context.Context, state string) error {
	if state != StateAlive && state != StateDraining {
		return fmt.Errorf("cannot set state of broker %d (inc %s): unknown state %q", m.cfg.BrokerID, m.inc, state)
	}
	ok, _, err := m.b.Txn(ctx, []Compare{{Key: m.key, Field: CreateRevision, Rev: m.createRev}},
		[]Op{{Key: m.key, Value: encodeBroker(m.inc, state, m.cfg.Info), Lease: m.lease}})
	if err != nil {
		return fmt.Errorf("cannot set state of broker %d (inc %s) to %s: %w", m.cfg.BrokerID, m.inc, state, err)
	}
	if !ok {
		return fmt.Errorf("cannot set state of broker %d (inc %s) to %s: %s is no longer this incarnation's", m.cfg.BrokerID, m.inc, state, m.key)
	}
	m.mu.Lock()
	m.state = state
	m.mu.Unlock()
	return nil
}

// Leave stops the lease loop and revokes this incarnation's own lease, which deletes
// brokers/<id> at once (a graceful exit; successors need not wait for the TTL). It never
// touches another incarnation's lease: that process may still be inside its own D.
func (m *Member) Leave(ctx context.Context) error {
	first := false
	m.endOnce.Do(func() {
		first = true
		m.stopped.Store(true)
		close(m.stop)
		close(m.done)
	})
	if !first {
		// Already failed-stop (possibly Leave is called from inside FailStop, on the loop's
		// goroutine): the lease is gone or going, and waiting for the loops could deadlock.
		return nil
	}
	m.cancel()
	m.wg.Wait()
	if err := m.b.Revoke(ctx, m.lease); err != nil && !errors.Is(err, ErrLeaseNotFound) {
		return fmt.Errorf("cannot revoke lease of broker %d (inc %s): %w", m.cfg.BrokerID, m.inc, err)
	}
	m.log.Info("left cluster", zap.String("inc", m.inc))
	return nil
}

// Abandon stops renewing the lease without revoking it and stops publishing: what a crash
// (kill -9, host loss) looks like to etcd and to the other brokers, whose successors then wait
// for the lease to expire (Rule S). In-process tests crash brokers with it.
func (m *Member) Abandon() {
	first := false
	m.endOnce.Do(func() {
		first = true
		m.stopped.Store(true)
		close(m.stop)
		close(m.done)
	})
	if first {
		m.cancel()
		m.wg.Wait()
	}
}

// State is the state last written to brokers/<id> (StateAlive at Join).
func (m *Member) State() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

// Done is closed at fail-stop or Leave.
func (m *Member) Done() <-chan struct{} { return m.done }
