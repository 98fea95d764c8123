// Package quota holds the client quotas of KIP-13 / KIP-55 / KIP-124 (producer_byte_rate,
// consumer_byte_rate, request_percentage per user, client-id or user + client-id, with
// defaults), their durable store, and the rate sensors that turn a client's usage into the
// throttle time of KIP-219.
//
// Resolution (Apache's ClientQuotaManager order; per quota key, the first level that sets it):
//
//	1 user=U, client-id=C        5 user=<default>, client-id=<default>
//	2 user=U, client-id=<default> 6 user=<default>
//	3 user=U                     7 client-id=C
//	4 user=<default>, client-id=C 8 client-id=<default>
//
// A default applies to each user / client-id on its own: the sensor is keyed by the actual
// names of the components the matched level has (user=alice under user=<default> gets its own
// bucket), as Apache tags its quota metrics.
//
// Throttling (Apache's Rate over quota.window.num=11 samples of quota.window.size.seconds=1):
//
//	record(v) ─▶ rate = Σ samples / max(elapsed, 10 s)
//	             rate > bound ─▶ throttle = (rate − bound) / bound × elapsed, at most 11 s
//
// The broker answers at once with throttle_time_ms and then reads nothing more from the
// connection for that long (KIP-219 channel muting).
package quota

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Quota keys (Kafka's QuotaConfig names).
const (
	ProducerByteRate  = "producer_byte_rate"
	ConsumerByteRate  = "consumer_byte_rate"
	RequestPercentage = "request_percentage"
)

// Entity types (Kafka's ClientQuotaEntity names).
const (
	TypeUser     = "user"
	TypeClientID = "client-id"
)

// Kind is the usage a sensor measures.
type Kind int

const (
	Produce Kind = iota // record-batch bytes produced (producer_byte_rate)
	Fetch               // response bytes fetched (consumer_byte_rate)
	Request             // handler time, as a percentage of one thread (request_percentage)
	numKinds
)

var kindKey = [numKinds]string{ProducerByteRate, ConsumerByteRate, RequestPercentage}
var kindName = [numKinds]string{"produce", "fetch", "request"}

// Name is one component of an entity: absent, the <default>, or a name.
type Name struct {
	Present bool
	Default bool
	Name    string
}

// Entity is a quota entity: a user, a client-id, or both (each possibly the <default>).
type Entity struct {
	User   Name
	Client Name
}

func (e Entity) String() string {
	part := func(t string, n Name) string {
		if n.Default {
			return t + "=<default>"
		}
		return t + "=" + n.Name
	}
	switch {
	case e.User.Present && e.Client.Present:
		return part(TypeUser, e.User) + "," + part(TypeClientID, e.Client)
	case e.User.Present:
		return part(TypeUser, e.User)
	}
	return part(TypeClientID, e.Client)
}

// Values are the quota keys set on an entity.
type Values map[string]float64

// ErrInvalid marks an alteration Kafka answers INVALID_REQUEST for.
var ErrInvalid = errors.New("invalid client quota")

// ValidateValue checks a quota value as Apache does: the byte rates are positive whole numbers,
// request_percentage a positive number. Unsupported keys are refused.
func ValidateValue(key string, v float64) error {
	switch key {
	case ProducerByteRate, ConsumerByteRate:
		if v <= 0 || v != math.Trunc(v) || v > math.MaxInt64 {
			return fmt.Errorf("%w: %s must be a positive whole number, got %v", ErrInvalid, key, v)
		}
	case RequestPercentage:
		if v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return fmt.Errorf("%w: %s must be positive, got %v", ErrInvalid, key, v)
		}
	default:
		return fmt.Errorf("%w: quota key %q is not supported (producer_byte_rate, consumer_byte_rate, request_percentage)", ErrInvalid, key)
	}
	return nil
}

// Entry is one stored entity with its values.
type Entry struct {
	Entity Entity
	Values Values
}

// Store keeps the quotas durable: a file on a single broker, a *cluster.Doc[Entry] (one etcd
// key, CAS-guarded) in cluster mode.
type Store interface {
	Load() ([]Entry, error)
	// Update applies fn to the stored entries and stores its result (when fn reports a change)
	// atomically, returning once it is durable. A store shared by several brokers re-reads and
	// re-runs fn when another writer got in between, so fn must depend on its input only. It
	// returns the entries now stored and their revision (0 for a store without revisions).
	Update(fn func(cur []Entry) (next []Entry, changed bool, err error)) (stored []Entry, rev int64, err error)
}

// Config tunes the sensors (Apache's quota.window.num and quota.window.size.seconds).
type Config struct {
	Samples int
	Window  time.Duration
}

// Manager resolves and enforces the quotas. Checks read an immutable snapshot; with no quota
// configured a check is one atomic load. A snapshot carries the store revision it was built from;
// Alter (this broker's change) and Replace (a version another broker wrote, from the etcd watch)
// both swap one in, and neither ever installs an older revision than the current one.
//
// Locks: mu (Alter, held across Store.Update; then the store's own locks), sensorsMu (sensor inserts and expiry) and each sensor's
// mu (its samples). None is taken while another is held, so there is no order to keep.
type Manager struct {
	cfg   Config
	store Store

	mu   sync.Mutex
	snap atomic.Pointer[snapshot]

	// sensors maps sensorKey → *sensor; lookups take no lock, inserts and expiry hold
	// sensorsMu so the count stays exact.
	sensorsMu sync.Mutex
	sensors   sync.Map
	nSensors  int

	now func() time.Time
}

// New loads the stored quotas.
func New(cfg Config, store Store) (*Manager, error) {
	if cfg.Samples < 2 {
		cfg.Samples = 11
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	m := &Manager{cfg: cfg, store: store, now: time.Now}
	es, err := store.Load()
	if err != nil {
		return nil, fmt.Errorf("cannot load client quotas: %w", err)
	}
	snap, err := snapshotOf(es, 0)
	if err != nil {
		return nil, err
	}
	m.snap.Store(snap)
	return m, nil
}

// snapshotOf validates es and builds their snapshot.
func snapshotOf(es []Entry, rev int64) (*snapshot, error) {
	vals := make(map[Entity]Values, len(es))
	for _, e := range es {
		for k, v := range e.Values {
			if err := ValidateValue(k, v); err != nil {
				return nil, fmt.Errorf("cannot load client quota (%s, revision %d): %w", e.Entity, rev, err)
			}
		}
		vals[e.Entity] = e.Values
	}
	return newSnapshot(vals, rev), nil
}

// Replace installs es, the entries stored at revision rev, unless the snapshot already reflects
// a later revision (cluster mode: every version the etcd watch delivers). Entries with an
// invalid value are refused whole and the snapshot stays as it was.
func (m *Manager) Replace(es []Entry, rev int64) error {
	snap, err := snapshotOf(es, rev)
	if err != nil {
		return err
	}
	m.install(snap)
	return nil
}

// Revision is the store revision the current snapshot was built from.
func (m *Manager) Revision() int64 { return m.snap.Load().rev }

func (m *Manager) install(snap *snapshot) {
	for {
		cur := m.snap.Load()
		if snap.rev < cur.rev || m.snap.CompareAndSwap(cur, snap) {
			return
		}
	}
}

// Op is one change of an Alter entry: set Key to Value, or remove it.
type Op struct {
	Key    string
	Value  float64
	Remove bool
}

// Alter applies ops to entity and makes the result durable (unless validateOnly).
func (m *Manager) Alter(e Entity, ops []Op, validateOnly bool) error {
	seen := map[string]bool{}
	for _, op := range ops {
		if seen[op.Key] {
			return fmt.Errorf("%w: key %q appears more than once", ErrInvalid, op.Key)
		}
		seen[op.Key] = true
		v := op.Value
		if op.Remove {
			v = 1 // a removal names a supported key; its value is ignored
		}
		if err := ValidateValue(op.Key, v); err != nil {
			return err
		}
	}
	if validateOnly {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	stored, rev, err := m.store.Update(func(cur []Entry) ([]Entry, bool, error) {
		next := make(map[Entity]Values, len(cur)+1)
		for _, c := range cur {
			next[c.Entity] = c.Values
		}
		vals := Values{}
		for k, v := range next[e] {
			vals[k] = v
		}
		for _, op := range ops {
			if op.Remove {
				delete(vals, op.Key)
			} else {
				vals[op.Key] = op.Value
			}
		}
		_, had := next[e]
		if len(vals) == 0 {
			delete(next, e)
		} else {
			next[e] = vals
		}
		return entries(next), had || len(vals) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("cannot save client quotas (%s): %w", e, err)
	}
	snap, err := snapshotOf(stored, rev)
	if err != nil {
		return err
	}
	m.install(snap)
	return nil
}

func entries(m map[Entity]Values) []Entry {
	out := make([]Entry, 0, len(m))
	for e, v := range m {
		out = append(out, Entry{Entity: e, Values: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Entity.String() < out[j].Entity.String() })
	return out
}

// Entries lists every entity with quotas, sorted.
func (m *Manager) Entries() []Entry { return entries(m.snap.Load().vals) }

// snapshot is the immutable quota set checks read, with, per kind, a bit for each of the eight
// levels that some entity sets: resolve looks up only levels that can match.
type snapshot struct {
	rev    int64 // store revision of vals
	vals   map[Entity]Values
	levels [numKinds]uint8
}

func newSnapshot(vals map[Entity]Values, rev int64) *snapshot {
	s := &snapshot{rev: rev, vals: vals}
	for e, v := range vals {
		l := level(e)
		for k := Kind(0); k < numKinds; k++ {
			if _, ok := v[kindKey[k]]; ok {
				s.levels[k] |= 1 << l
			}
		}
	}
	return s
}

// level is the entity's position in the resolution order (package comment), 0..7.
func level(e Entity) int {
	switch {
	case e.User.Present && !e.User.Default:
		if !e.Client.Present {
			return 2
		}
		if e.Client.Default {
			return 1
		}
		return 0
	case e.User.Present:
		if !e.Client.Present {
			return 5
		}
		if e.Client.Default {
			return 4
		}
		return 3
	case e.Client.Default:
		return 7
	}
	return 6
}

// resolve finds the bound for kind for (user, client) and the sensor it is measured by.
func (m *Manager) resolve(snap *snapshot, k Kind, user, client string) (float64, sensorKey, bool) {
	key := kindKey[k]
	bits := snap.levels[k]
	if bits == 0 {
		return 0, sensorKey{}, false
	}
	u, ud := Name{Present: true, Name: user}, Name{Present: true, Default: true}
	c, cd := Name{Present: true, Name: client}, Name{Present: true, Default: true}
	levels := [...]Entity{
		{User: u, Client: c}, {User: u, Client: cd}, {User: u},
		{User: ud, Client: c}, {User: ud, Client: cd}, {User: ud},
		{Client: c}, {Client: cd},
	}
	for i, e := range levels {
		if bits&(1<<i) == 0 {
			continue
		}
		v, ok := snap.vals[e][key]
		if !ok {
			continue
		}
		sk := sensorKey{kind: k}
		if e.User.Present {
			sk.user, sk.hasUser = user, true
		}
		if e.Client.Present {
			sk.client, sk.hasClient = client, true
		}
		return v, sk, true
	}
	return 0, sensorKey{}, false
}

// Record adds v to the kind's usage of (user, client) and returns how long the client is to be
// throttled (0 when under its quota or without one).
func (m *Manager) Record(k Kind, user, client string, v float64) time.Duration {
	snap := m.snap.Load()
	if len(snap.vals) == 0 {
		return 0
	}
	bound, sk, ok := m.resolve(snap, k, user, client)
	if !ok {
		return 0
	}
	now := m.now()
	s := m.sensor(sk, now)
	d := s.record(v, bound, now, m.cfg)
	if d > 0 {
		mThrottled[k].Inc()
		s.throttledMs.Add(d.Milliseconds())
	}
	return d
}

// Active reports whether any quota is configured (callers skip measuring otherwise).
func (m *Manager) Active() bool { return len(m.snap.Load().vals) > 0 }

type sensorKey struct {
	kind               Kind
	user, client       string
	hasUser, hasClient bool
}

// maxSensors bounds the live sensors (a client-id default quota meets arbitrary client ids);
// idle sensors are dropped first, and refusals are counted.
const maxSensors = 10000

// sensorIdle is how long an unused sensor is kept (Apache expires quota sensors after an hour).
const sensorIdle = time.Hour

func (m *Manager) sensor(k sensorKey, now time.Time) *sensor {
	if v, ok := m.sensors.Load(k); ok {
		s := v.(*sensor)
		s.lastUsed.Store(now.UnixNano())
		return s
	}
	m.sensorsMu.Lock()
	defer m.sensorsMu.Unlock()
	if v, ok := m.sensors.Load(k); ok {
		return v.(*sensor)
	}
	if m.nSensors >= maxSensors {
		m.expireLocked(now)
	}
	s := &sensor{samples: make([]sample, m.cfg.Samples)}
	s.lastUsed.Store(now.UnixNano())
	if m.nSensors < maxSensors {
		m.sensors.Store(k, s)
		m.nSensors++
	} else {
		mSensorsFull.Inc() // measured, but not kept: it throttles this call only
	}
	return s
}

func (m *Manager) expireLocked(now time.Time) {
	cut := now.Add(-sensorIdle).UnixNano()
	m.sensors.Range(func(k, v any) bool {
		if v.(*sensor).lastUsed.Load() < cut {
			m.sensors.Delete(k)
			m.nSensors--
		}
		return true
	})
}

type sample struct {
	start int64 // unix nanos
	sum   float64
}

// sensor is Apache's Rate: a ring of samples, each covering one window.
type sensor struct {
	mu          sync.Mutex
	samples     []sample
	cur         int
	lastRate    float64
	lastBound   float64
	throttledMs atomic.Int64
	lastUsed    atomic.Int64
}

func (s *sensor) record(v, bound float64, now time.Time, cfg Config) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, w := int64(len(s.samples)), int64(cfg.Window)
	t := now.UnixNano()
	if c := &s.samples[s.cur]; c.start == 0 || t >= c.start+w {
		s.cur = (s.cur + 1) % len(s.samples)
		s.samples[s.cur] = sample{start: t}
	}
	s.samples[s.cur].sum += v
	var sum float64
	oldest := t
	for i := range s.samples {
		sm := &s.samples[i]
		if sm.start == 0 || sm.start+n*w <= t { // expired (Apache purges obsolete samples)
			continue
		}
		sum += sm.sum
		if sm.start < oldest {
			oldest = sm.start
		}
	}
	elapsed := t - oldest
	if min := (n - 1) * w; elapsed < min {
		elapsed = min
	}
	rate := sum / (float64(elapsed) / float64(time.Second))
	s.lastRate, s.lastBound = rate, bound
	if rate <= bound {
		return 0
	}
	d := time.Duration((rate - bound) / bound * float64(elapsed))
	if max := time.Duration(n * w); d > max {
		d = max
	}
	return d
}
