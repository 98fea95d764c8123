package acl

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

var (
	mDenied  = metrics.NewCounter(`kaas_acl_denied_total`)
	mAllowed = metrics.NewCounter(`kaas_acl_allowed_total`)
	mChanges = metrics.NewCounter(`kaas_acl_changes_total`)
	// mBindings is a snapshot gauge of the stored bindings (set on every change).
	mBindingsN atomic.Int64
	_          = metrics.NewGauge(`kaas_acl_bindings`, func() float64 { return float64(mBindingsN.Load()) })
)

// Config is the authorizer's broker configuration.
type Config struct {
	// SuperUsers are principals (Type:name) allowed everything, whatever the ACLs say.
	SuperUsers []string
	// AllowIfNoACL is allow.everyone.if.no.acl.found: a resource no binding covers is allowed.
	AllowIfNoACL bool
}

// Store keeps the bindings durable. The file store (FileStore) serves a single broker; in
// cluster mode a *cluster.Doc[Binding] (one etcd key, CAS-guarded) implements the same calls.
type Store interface {
	Load() ([]Binding, error)
	// Update applies fn to the stored set and stores its result (when fn reports a change)
	// atomically, returning once it is durable. A store shared by several brokers re-reads and
	// re-runs fn when another writer got in between, so fn must depend on its input only. It
	// returns the set now stored and its revision (0 for a store without revisions).
	Update(fn func(cur []Binding) (next []Binding, changed bool, err error)) (stored []Binding, rev int64, err error)
}

// Authorizer answers checks from an immutable index swapped atomically on every change, so a
// check takes no lock and sees a change on the next request of every connection. A change
// reaches the index two ways: this broker's own Create/Delete, and Replace with a version
// another broker wrote (cluster mode: the etcd watch). Each index carries the store revision it
// was built from and a swap never installs an older one, so the two paths may race in any order.
//
// Lock order: mu (writers only: Create/Delete, held across Store.Update so the durable set and
// the index move together) → the store's own locks. Replace takes no lock.
type Authorizer struct {
	cfg   Config
	super map[string]bool
	store Store

	mu  sync.Mutex
	idx atomic.Pointer[index]
}

// New loads the stored bindings.
func New(cfg Config, store Store) (*Authorizer, error) {
	a := &Authorizer{cfg: cfg, super: map[string]bool{}, store: store}
	for _, u := range cfg.SuperUsers {
		a.super[u] = true
	}
	bs, err := store.Load()
	if err != nil {
		return nil, fmt.Errorf("cannot load ACL bindings: %w", err)
	}
	for _, b := range bs {
		if err := b.Validate(); err != nil {
			return nil, fmt.Errorf("cannot load ACL binding (%+v): %w", b, err)
		}
	}
	a.idx.Store(buildIndex(bs, 0))
	mBindingsN.Store(int64(len(bs)))
	return a, nil
}

// Replace installs bs, the set stored at revision rev, unless the index already reflects a
// later revision (cluster mode: every version the etcd watch delivers). A set holding an
// invalid binding is refused whole and the index stays as it was: applying part of a set could
// turn a DENY off.
func (a *Authorizer) Replace(bs []Binding, rev int64) error {
	for _, b := range bs {
		if err := b.Validate(); err != nil {
			return fmt.Errorf("cannot apply ACL bindings (revision %d, %+v): %w", rev, b, err)
		}
	}
	a.install(bs, rev)
	return nil
}

// Revision is the store revision the current index was built from.
func (a *Authorizer) Revision() int64 { return a.idx.Load().rev }

// install swaps in the index of bs unless a later revision is already installed; it reports
// whether it did.
func (a *Authorizer) install(bs []Binding, rev int64) bool {
	ix := buildIndex(bs, rev)
	for {
		cur := a.idx.Load()
		if rev < cur.rev {
			return false
		}
		if a.idx.CompareAndSwap(cur, ix) {
			mBindingsN.Store(int64(len(bs)))
			return true
		}
	}
}

// ParseSuperUsers parses super.users: principals separated by ';' (Apache's format).
func ParseSuperUsers(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ";") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// index groups the bindings by resource type, then by pattern: exact literal names in a map,
// the "*" literal on its own, and prefixes in a map keyed by the prefix with the distinct prefix
// lengths kept sorted. A check does one map lookup for the literal, one for "*", and one per
// distinct prefix length no longer than the name: its cost depends on the name's length and on
// the bindings on that very resource, never on how many bindings exist in total.
type index struct {
	rev   int64 // store revision of all
	all   []Binding
	types [ResourceUser + 1]typeIndex
}

type typeIndex struct {
	literal    map[string][]Binding
	wildcard   []Binding
	prefixed   map[string][]Binding
	prefixLens []int // ascending, distinct
	n          int
}

func buildIndex(bs []Binding, rev int64) *index {
	ix := &index{rev: rev, all: bs}
	for _, b := range bs {
		t := &ix.types[b.ResourceType]
		t.n++
		switch {
		case b.PatternType == PatternLiteral && b.ResourceName == Wildcard:
			t.wildcard = append(t.wildcard, b)
		case b.PatternType == PatternLiteral:
			if t.literal == nil {
				t.literal = map[string][]Binding{}
			}
			t.literal[b.ResourceName] = append(t.literal[b.ResourceName], b)
		case b.PatternType == PatternPrefixed:
			if t.prefixed == nil {
				t.prefixed = map[string][]Binding{}
			}
			if _, ok := t.prefixed[b.ResourceName]; !ok {
				t.prefixLens = append(t.prefixLens, len(b.ResourceName))
			}
			t.prefixed[b.ResourceName] = append(t.prefixed[b.ResourceName], b)
		}
	}
	for i := range ix.types {
		t := &ix.types[i]
		sort.Ints(t.prefixLens)
		t.prefixLens = dedupe(t.prefixLens)
	}
	return ix
}

func dedupe(s []int) []int {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// verdict of one binding list for a request.
type verdict int8

const (
	vNone verdict = iota
	vAllow
	vDeny
)

// implies reports whether an ALLOW of granted covers a request for op.
func implies(granted, op Operation) bool {
	if granted == op || granted == OpAll {
		return true
	}
	switch op {
	case OpDescribe:
		return granted == OpRead || granted == OpWrite || granted == OpDelete || granted == OpAlter
	case OpDescribeConfigs:
		return granted == OpAlterConfigs
	}
	return false
}

func scan(bs []Binding, principal, host string, op Operation, v verdict) verdict {
	for i := range bs {
		b := &bs[i]
		if b.Principal != principal && b.Principal != WildcardPrincipal {
			continue
		}
		if b.Host != host && b.Host != Wildcard {
			continue
		}
		if b.Permission == PermDeny {
			if b.Operation == op || b.Operation == OpAll {
				return vDeny
			}
			continue
		}
		if implies(b.Operation, op) {
			v = vAllow
		}
	}
	return v
}

// Authorize is the per-request check. host is the client's IP address as text.
func (a *Authorizer) Authorize(principal, host string, op Operation, rt ResourceType, name string) bool {
	if a.super[principal] {
		mAllowed.Inc()
		return true
	}
	ok := a.idx.Load().check(principal, host, op, rt, name, a.cfg.AllowIfNoACL)
	if ok {
		mAllowed.Inc()
	} else {
		mDenied.Inc()
	}
	return ok
}

func (ix *index) check(principal, host string, op Operation, rt ResourceType, name string, allowIfNone bool) bool {
	if rt < 0 || int(rt) >= len(ix.types) {
		return false
	}
	t := &ix.types[rt]
	v, covered := vNone, false
	if bs := t.literal[name]; len(bs) > 0 {
		covered = true
		if v = scan(bs, principal, host, op, v); v == vDeny {
			return false
		}
	}
	if len(t.wildcard) > 0 {
		covered = true
		if v = scan(t.wildcard, principal, host, op, v); v == vDeny {
			return false
		}
	}
	for _, l := range t.prefixLens {
		if l > len(name) {
			break
		}
		if bs := t.prefixed[name[:l]]; len(bs) > 0 {
			covered = true
			if v = scan(bs, principal, host, op, v); v == vDeny {
				return false
			}
		}
	}
	if v == vAllow {
		return true
	}
	return !covered && allowIfNone
}

// AuthorizeByResourceType is Apache's Authorizer.authorizeByResourceType: may the principal
// perform op on at least one resource of type rt? Used where Kafka asks "any topic?" (the
// idempotent InitProducerId of KIP-679). An ALLOW counts unless a DENY for the same literal or a
// DENY prefix of it (or a "*" DENY) dominates it. This walks the bindings of one resource type;
// it runs once per idempotent producer start, not per record batch.
func (a *Authorizer) AuthorizeByResourceType(principal, host string, op Operation, rt ResourceType) bool {
	// A super user (or allow.everyone on an uncovered name) passes, as Apache's hard-coded probe.
	if a.Authorize(principal, host, op, rt, "hardcode") {
		return true
	}
	ix := a.idx.Load()
	if rt < 0 || int(rt) >= len(ix.types) {
		return false
	}
	denyLit, denyPre := map[string]bool{}, map[string]bool{}
	var allowLit, allowPre []string
	wildAllow := false
	for _, b := range ix.all {
		if b.ResourceType != rt || (b.Host != host && b.Host != Wildcard) ||
			(b.Principal != principal && b.Principal != WildcardPrincipal) ||
			(b.Operation != op && b.Operation != OpAll) {
			continue
		}
		lit := b.PatternType == PatternLiteral
		switch {
		case b.Permission == PermDeny && lit && b.ResourceName == Wildcard:
			return false
		case b.Permission == PermDeny && lit:
			denyLit[b.ResourceName] = true
		case b.Permission == PermDeny:
			denyPre[b.ResourceName] = true
		case lit && b.ResourceName == Wildcard:
			wildAllow = true
		case lit:
			allowLit = append(allowLit, b.ResourceName)
		default:
			allowPre = append(allowPre, b.ResourceName)
		}
	}
	if wildAllow {
		return true
	}
	dominated := func(s string) bool {
		for i := 1; i <= len(s); i++ {
			if denyPre[s[:i]] {
				return true
			}
		}
		return false
	}
	for _, s := range allowLit {
		if !denyLit[s] && !dominated(s) {
			return true
		}
	}
	for _, s := range allowPre {
		if !dominated(s) {
			return true
		}
	}
	return false
}

// Create adds bindings (each already validated); duplicates of stored bindings are kept once.
// It returns once the new set is durable; on a store error nothing changes.
func (a *Authorizer) Create(bs []Binding) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	changed := false
	stored, rev, err := a.store.Update(func(cur []Binding) ([]Binding, bool, error) {
		have := make(map[Binding]bool, len(cur)+len(bs))
		for _, b := range cur {
			have[b] = true
		}
		next := append([]Binding(nil), cur...)
		for _, b := range bs {
			if !have[b] {
				have[b] = true
				next = append(next, b)
			}
		}
		changed = len(next) != len(cur)
		return next, changed, nil
	})
	if err != nil {
		return fmt.Errorf("cannot save ACL bindings (%d new): %w", len(bs), err)
	}
	a.install(stored, rev)
	if changed {
		mChanges.Inc()
	}
	return nil
}

// Describe lists the bindings f matches.
func (a *Authorizer) Describe(f Filter) []Binding {
	var out []Binding
	for _, b := range a.idx.Load().all {
		if f.Matches(b) {
			out = append(out, b)
		}
	}
	return out
}

// Delete removes every binding any filter matches and returns, per filter, what it matched.
// A binding two filters match is reported for both, as Apache does. What matched is taken from
// the stored set the deletion applied to (in cluster mode, possibly newer than this broker's
// index).
func (a *Authorizer) Delete(fs []Filter) ([][]Binding, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out [][]Binding
	changed := false
	stored, rev, err := a.store.Update(func(cur []Binding) ([]Binding, bool, error) {
		out = make([][]Binding, len(fs))
		var next []Binding
		for _, b := range cur {
			hit := false
			for i, f := range fs {
				if f.Matches(b) {
					out[i] = append(out[i], b)
					hit = true
				}
			}
			if !hit {
				next = append(next, b)
			}
		}
		changed = len(next) != len(cur)
		return next, changed, nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot save ACL bindings (%d filters): %w", len(fs), err)
	}
	a.install(stored, rev)
	if changed {
		mChanges.Inc()
	}
	return out, nil
}
