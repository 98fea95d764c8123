package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// ErrFakeUnavailable is what every call of a Fake returns while SetUnavailable(true) is in force.
var ErrFakeUnavailable = errors.New("fake etcd: unavailable")

// Fake is an in-memory Backend with the etcd semantics kaas depends on:
//   - one global revision, bumped once per write transaction; CreateRev/ModRev per key;
//   - Txn compares on CreateRevision/ModRevision ("=", 0 = absent), all-or-nothing;
//   - leases with a TTL on a ManualClock: Advance past the expiry deletes the attached keys in one
//     revision (delete events), and KeepAliveOnce then answers ErrLeaseNotFound;
//   - prefix watches from any revision not older than Compact, with PrevKV;
//   - Campaign: candidates under prefix+"/", the oldest CreateRev leads; a candidacy's session
//     lease is renewed on every Advance while its client is available and open, so it dies the
//     way a concurrency.Session does: when its client cannot reach etcd for longer than the TTL.
//
// Several clients can share one store (Client), each with its own SetUnavailable, to model one
// broker losing etcd while the others keep it: its calls fail, its watches deliver nothing
// until it is back (then everything missed, in order), and its campaign sessions stop renewing.
type Fake struct {
	s           *fakeStore
	mu          sync.Mutex // Lock order: fakeStore.mu → Fake.mu
	unavailable bool
	closed      bool
	kaDelay     time.Duration
}

type fakeStore struct {
	clock *ManualClock

	mu        sync.Mutex // Lock order: fakeStore.mu → Fake.mu → watcher.mu
	rev       int64
	compacted int64
	kvs       map[string]KV
	leases    map[LeaseID]*fakeLease
	nextLease LeaseID
	history   []WatchResponse // one entry per revision, Events non-empty
	watchers  map[*fakeWatcher]struct{}
	changed   chan struct{}            // closed and replaced on every write (Campaign waits on it)
	deleteCh  map[string]chan struct{} // closed when the key is deleted (Leadership.Done)
}

type fakeLease struct {
	ttl    time.Duration
	expiry time.Time
	keys   map[string]struct{}
	owner  *Fake // non-nil: a campaign session lease, renewed on ticks while owner is reachable
}

// NewFake returns a fresh store on clock and its first client.
func NewFake(clock *ManualClock) *Fake {
	s := &fakeStore{
		clock:     clock,
		kvs:       map[string]KV{},
		leases:    map[LeaseID]*fakeLease{},
		nextLease: 0x1000,
		watchers:  map[*fakeWatcher]struct{}{},
		changed:   make(chan struct{}),
		deleteCh:  map[string]chan struct{}{},
	}
	clock.onTick(s.tick)
	return &Fake{s: s}
}

// Client returns another client of the same store (another broker's connection).
func (f *Fake) Client() *Fake { return &Fake{s: f.s} }

// SetUnavailable makes every call of this client fail with ErrFakeUnavailable (down=true) until
// called again with false. Server-side time still runs: leases keep expiring on Advance.
func (f *Fake) SetUnavailable(down bool) {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	// Campaign sessions renew continuously while reachable: they were alive until now.
	s.expireLocked(s.clock.Now())
	f.mu.Lock()
	f.unavailable = down
	f.mu.Unlock()
	s.signalWatchersLocked(f)
}

func (s *fakeStore) signalWatchersLocked(owner *Fake) {
	for w := range s.watchers {
		if w.owner == owner {
			select {
			case w.signal <- struct{}{}:
			default:
			}
		}
	}
}

// SetKeepAliveDelay makes each KeepAliveOnce of this client advance the clock by d after the
// server renewed the lease and before the answer returns: a slow response.
func (f *Fake) SetKeepAliveDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kaDelay = d
}

// Compact drops the history before rev: a Watch from an older revision gets ErrCompacted.
func (f *Fake) Compact(rev int64) {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev > s.rev+1 {
		rev = s.rev + 1
	}
	if rev <= s.compacted {
		return
	}
	s.compacted = rev
	i := sort.Search(len(s.history), func(i int) bool { return s.history[i].Rev >= rev })
	s.history = append([]WatchResponse(nil), s.history[i:]...)
}

// Rev is the store's current revision.
func (f *Fake) Rev() int64 {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	return f.s.rev
}

func (f *Fake) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("fake etcd: client closed")
	}
	if f.unavailable {
		return ErrFakeUnavailable
	}
	return nil
}

func (f *Fake) reachable() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.closed && !f.unavailable
}

// Grant creates a lease expiring ttl from now.
func (f *Fake) Grant(ctx context.Context, ttl time.Duration) (LeaseID, error) {
	if err := f.check(ctx); err != nil {
		return 0, err
	}
	return f.s.grant(ttl, nil), nil
}

func (s *fakeStore) grant(ttl time.Duration, owner *Fake) LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextLease++
	id := s.nextLease
	s.leases[id] = &fakeLease{ttl: ttl, expiry: s.clock.Now().Add(ttl), keys: map[string]struct{}{}, owner: owner}
	return id
}

// KeepAliveOnce renews the lease to a full TTL from now.
func (f *Fake) KeepAliveOnce(ctx context.Context, id LeaseID) (time.Duration, error) {
	if err := f.check(ctx); err != nil {
		return 0, err
	}
	s := f.s
	s.mu.Lock()
	s.expireLocked(s.clock.Now())
	l, ok := s.leases[id]
	if !ok {
		s.mu.Unlock()
		return 0, ErrLeaseNotFound
	}
	l.expiry = s.clock.Now().Add(l.ttl)
	ttl := l.ttl
	s.mu.Unlock()
	f.mu.Lock()
	d := f.kaDelay
	f.mu.Unlock()
	if d > 0 {
		s.clock.Advance(d)
	}
	return ttl, nil
}

// Revoke deletes the lease and its keys.
func (f *Fake) Revoke(ctx context.Context, id LeaseID) error {
	if err := f.check(ctx); err != nil {
		return err
	}
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.clock.Now())
	if _, ok := s.leases[id]; !ok {
		return ErrLeaseNotFound
	}
	s.dropLeaseLocked(id)
	return nil
}

// Get reads key, or every key under it when prefix, sorted by key.
func (f *Fake) Get(ctx context.Context, key string, prefix bool) ([]KV, int64, error) {
	if err := f.check(ctx); err != nil {
		return nil, 0, err
	}
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.clock.Now())
	var out []KV
	if !prefix {
		if kv, ok := s.kvs[key]; ok {
			out = append(out, copyKV(kv))
		}
		return out, s.rev, nil
	}
	for k, kv := range s.kvs {
		if strings.HasPrefix(k, key) {
			out = append(out, copyKV(kv))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, s.rev, nil
}

// Txn evaluates ifs and, when all hold, applies then at one new revision.
func (f *Fake) Txn(ctx context.Context, ifs []Compare, then []Op) (bool, int64, error) {
	if err := f.check(ctx); err != nil {
		return false, 0, err
	}
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.clock.Now())
	for _, c := range ifs {
		kv := s.kvs[c.Key] // zero KV (revisions 0) when absent
		got := kv.CreateRev
		if c.Field == ModRevision {
			got = kv.ModRev
		}
		if got != c.Rev {
			return false, s.rev, nil
		}
	}
	for _, op := range then {
		if !op.Delete && op.Lease != 0 {
			if _, ok := s.leases[op.Lease]; !ok {
				return false, s.rev, fmt.Errorf("cannot put %s with lease %x: %w", op.Key, op.Lease, ErrLeaseNotFound)
			}
		}
	}
	s.applyLocked(then)
	return true, s.rev, nil
}

// applyLocked applies ops at revision rev+1; the revision is consumed only if something changed.
func (s *fakeStore) applyLocked(ops []Op) {
	rev := s.rev + 1
	var evs []Event
	del := func(k string) {
		old, ok := s.kvs[k]
		if !ok {
			return
		}
		delete(s.kvs, k)
		if l := s.leases[old.Lease]; l != nil {
			delete(l.keys, k)
		}
		p := copyKV(old)
		evs = append(evs, Event{Type: EventDelete, KV: KV{Key: k, ModRev: rev}, Prev: &p})
		if ch, ok := s.deleteCh[k]; ok {
			close(ch)
			delete(s.deleteCh, k)
		}
	}
	for _, op := range ops {
		switch {
		case op.Delete && op.Prefix:
			var keys []string
			for k := range s.kvs {
				if strings.HasPrefix(k, op.Key) {
					keys = append(keys, k)
				}
			}
			sort.Strings(keys)
			for _, k := range keys {
				del(k)
			}
		case op.Delete:
			del(op.Key)
		default:
			old, had := s.kvs[op.Key]
			kv := KV{Key: op.Key, Value: append([]byte(nil), op.Value...), CreateRev: rev, ModRev: rev, Lease: op.Lease}
			var prev *KV
			if had {
				kv.CreateRev = old.CreateRev
				p := copyKV(old)
				prev = &p
				if l := s.leases[old.Lease]; l != nil && old.Lease != op.Lease {
					delete(l.keys, op.Key)
				}
			}
			if l := s.leases[op.Lease]; l != nil {
				l.keys[op.Key] = struct{}{}
			}
			s.kvs[op.Key] = kv
			evs = append(evs, Event{Type: EventPut, KV: copyKV(kv), Prev: prev})
		}
	}
	if len(evs) == 0 {
		return
	}
	s.rev = rev
	wr := WatchResponse{Events: evs, Rev: rev}
	s.history = append(s.history, wr)
	for w := range s.watchers {
		w.offer(wr)
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *fakeStore) dropLeaseLocked(id LeaseID) {
	l := s.leases[id]
	delete(s.leases, id)
	keys := make([]string, 0, len(l.keys))
	for k := range l.keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ops := make([]Op, len(keys))
	for i, k := range keys {
		ops[i] = Op{Key: k, Delete: true}
	}
	s.applyLocked(ops)
}

// tick runs inside ManualClock.Advance: campaign sessions of reachable clients renew, then every
// lease past its expiry is dropped with its keys.
func (s *fakeStore) tick(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
}

func (s *fakeStore) expireLocked(now time.Time) {
	var dead []LeaseID
	for id, l := range s.leases {
		if l.owner != nil && l.owner.reachable() {
			l.expiry = now.Add(l.ttl) // a session keeps its lease alive continuously
			continue
		}
		if now.Before(l.expiry) {
			continue
		}
		dead = append(dead, id)
	}
	sort.Slice(dead, func(i, j int) bool { return dead[i] < dead[j] })
	for _, id := range dead {
		s.dropLeaseLocked(id)
	}
}

func copyKV(kv KV) KV {
	kv.Value = append([]byte(nil), kv.Value...)
	return kv
}

// fakeWatcher queues responses without bound so the store never blocks on a slow reader.
type fakeWatcher struct {
	owner  *Fake
	prefix string
	minRev int64
	mu     sync.Mutex // Lock order: leaf
	queue  []WatchResponse
	signal chan struct{}
}

func (w *fakeWatcher) offer(wr WatchResponse) {
	if wr.Rev < w.minRev {
		return
	}
	var evs []Event
	for _, e := range wr.Events {
		if strings.HasPrefix(e.KV.Key, w.prefix) {
			evs = append(evs, e)
		}
	}
	if len(evs) == 0 {
		return
	}
	w.mu.Lock()
	w.queue = append(w.queue, WatchResponse{Events: evs, Rev: wr.Rev})
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// Watch streams changes under prefix from fromRev (0: after the current revision).
func (f *Fake) Watch(ctx context.Context, prefix string, fromRev int64) <-chan WatchResponse {
	out := make(chan WatchResponse)
	if err := f.check(ctx); err != nil {
		go func() {
			defer close(out)
			select {
			case out <- WatchResponse{Err: err}:
			case <-ctx.Done():
			}
		}()
		return out
	}
	s := f.s
	w := &fakeWatcher{owner: f, prefix: prefix, signal: make(chan struct{}, 1)}
	s.mu.Lock()
	if fromRev <= 0 {
		fromRev = s.rev + 1
	}
	w.minRev = fromRev
	if fromRev < s.compacted {
		rev := s.compacted
		s.mu.Unlock()
		go func() {
			defer close(out)
			select {
			case out <- WatchResponse{Err: ErrCompacted, Rev: rev}:
			case <-ctx.Done():
			}
		}()
		return out
	}
	for _, h := range s.history {
		if h.Rev >= fromRev {
			w.offer(h)
		}
	}
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	go func() {
		defer close(out)
		defer func() {
			s.mu.Lock()
			delete(s.watchers, w)
			s.mu.Unlock()
		}()
		for {
			f.mu.Lock()
			closed, down := f.closed, f.unavailable
			f.mu.Unlock()
			if closed {
				return
			}
			if !down {
				// An unavailable client keeps its watches (etcd's client retries a broken
				// stream) but sees nothing until it is back, like a partitioned broker.
				w.mu.Lock()
				q := w.queue
				w.queue = nil
				w.mu.Unlock()
				for _, wr := range q {
					select {
					case out <- wr:
					case <-ctx.Done():
						return
					}
				}
			}
			select {
			case <-w.signal:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Campaign enters an election under prefix with its own session lease of ttl and waits until
// it is the oldest candidate.
func (f *Fake) Campaign(ctx context.Context, prefix string, value []byte, ttl time.Duration) (*Leadership, error) {
	if err := f.check(ctx); err != nil {
		return nil, err
	}
	s := f.s
	id := s.grant(ttl, f)
	key := fmt.Sprintf("%s/%x", prefix, id)
	s.mu.Lock()
	s.applyLocked([]Op{{Key: key, Value: value, Lease: id}})
	myRev := s.kvs[key].CreateRev
	done := make(chan struct{})
	s.deleteCh[key] = done
	s.mu.Unlock()
	resign := func(ctx context.Context) error {
		if err := f.check(ctx); err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.leases[id]; ok {
			s.dropLeaseLocked(id)
		}
		return nil
	}
	for {
		s.mu.Lock()
		s.expireLocked(s.clock.Now())
		if _, ok := s.kvs[key]; !ok {
			s.mu.Unlock()
			return nil, fmt.Errorf("cannot campaign (%s): candidacy lost while waiting: %w", key, ErrLeaseNotFound)
		}
		oldest := true
		for k, kv := range s.kvs {
			if strings.HasPrefix(k, prefix+"/") && kv.CreateRev < myRev {
				oldest = false
				break
			}
		}
		changed := s.changed
		s.mu.Unlock()
		if oldest {
			// As with the etcd backend, the leadership ends with ctx.
			go func() {
				select {
				case <-ctx.Done():
					_ = resign(context.Background())
				case <-done:
				}
			}()
			return &Leadership{Key: key, Rev: myRev, Done: done, Resign: resign}, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			_ = resign(context.Background())
			return nil, ctx.Err()
		}
	}
}

// Close ends this client: its calls fail, its watches close, its campaign sessions stop renewing
// (their leases expire after the TTL, as a dead process's would).
func (f *Fake) Close() error {
	s := f.s
	s.mu.Lock()
	s.expireLocked(s.clock.Now())
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	s.signalWatchersLocked(f)
	s.mu.Unlock()
	return nil
}

var _ Backend = (*Fake)(nil)
