package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
)

// Cluster-wide documents: state every broker must apply at once, and that any broker may change
// (ACL bindings, SCRAM credentials, client quotas). Apache keeps these as records in its
// metadata log (AccessControlEntryRecord, UserScramCredentialRecord, ClientQuotaRecord) and
// every broker replays them; here each set is one etcd key holding the whole set as JSON:
//
//	<prefix>security/acls    {"version":1,"items":[binding, …]}
//	<prefix>security/scram   {"version":1,"items":[credential, …]}
//	<prefix>security/quotas  {"version":1,"items":[entry, …]}
//
// The sets are small admin state (hundreds of items, changed by hand or by a tool), so rewriting
// the whole set per change costs nothing and keeps a reader from ever seeing half a change.
//
// A change is a function of the current set, applied with compare-and-swap on the key's
// ModRevision and re-run on a conflict:
//
//	Get (items, ModRev m) ──fn──▶ next ──Txn If(ModRev == m) Put──▶ ok: stored at rev r
//	       ▲                                             │ conflict (another broker wrote)
//	       └─────────────────────────────────────────────┘ (at most docMaxAttempts times)
//
// so two brokers changing the set at once both land, in some order, as Apache's controller
// serialises two CreateAcls. Follow delivers every version to a broker, including its own writes
// (callers apply a version only when it is newer than the one they hold: revisions order them).

var (
	mDocConflicts = metrics.NewCounter(`kaas_cluster_doc_cas_conflicts_total`)
	mDocExhausted = metrics.NewCounter(`kaas_cluster_doc_cas_exhausted_total`) // docMaxAttempts conflicts in a row
	mDocRelists   = metrics.NewCounter(`kaas_cluster_doc_relists_total`)
	mDocBad       = metrics.NewCounter(`kaas_cluster_doc_undecodable_total`)
	mDocTooLarge  = metrics.NewCounter(`kaas_cluster_doc_too_large_total`) // writes refused by docMaxBytes
)

// docMaxBytes bounds one document. etcd refuses a request over --max-request-bytes (1.5 MiB by
// default); refusing here first gives the operator an error naming the set instead of a gRPC
// one. At about 150 bytes per ACL binding or 250 per SCRAM credential that is several thousand
// items, far beyond what kafka-acls and kafka-configs users keep.
const docMaxBytes = 1 << 20

// ErrDocTooLarge: a change would make the document larger than docMaxBytes.
var ErrDocTooLarge = errors.New("document too large")

// docMaxAttempts bounds the read-modify-write retries of one Update. Conflicts need another
// broker's write between our Get and Txn; this many in a row means a livelock or a runaway
// writer, and the caller gets an error rather than a hang.
const docMaxAttempts = 64

// docTimeout bounds each etcd round trip of Load and Update (their callers carry no context:
// the Store interfaces of coord/acl, coord/quota and coord/credentials predate cluster mode).
const docTimeout = 10 * time.Second

// ErrDocConflict: Update gave up after docMaxAttempts conflicting writes.
var ErrDocConflict = errors.New("too many concurrent changes")

// SecurityKey is <prefix>security/<name> (acls, scram, quotas).
func SecurityKey(prefix, name string) string { return prefix + "security/" + name }

// Doc is one cluster-wide versioned set of E, stored whole under one key. Its Load and Update
// methods have the shape the coord stores take (acl.Store, quota.Store, credentials.Records), so
// a *Doc[acl.Binding] is an acl.Store.
type Doc[E any] struct {
	b    Backend
	key  string
	what string // for errors and logs ("ACL", "SCRAM credential", "client quota")
}

// NewDoc is the document at key.
func NewDoc[E any](b Backend, key, what string) *Doc[E] { return &Doc[E]{b: b, key: key, what: what} }

// Key is the document's etcd key.
func (d *Doc[E]) Key() string { return d.key }

type docJSON[E any] struct {
	Version int `json:"version"`
	Items   []E `json:"items"`
}

func (d *Doc[E]) decode(v []byte) ([]E, error) {
	var j docJSON[E]
	if err := json.Unmarshal(v, &j); err != nil {
		return nil, fmt.Errorf("cannot decode %s document (%s): %w", d.what, d.key, err)
	}
	if j.Version != 1 {
		return nil, fmt.Errorf("cannot decode %s document (%s): unknown version %d", d.what, d.key, j.Version)
	}
	return j.Items, nil
}

func (d *Doc[E]) encode(items []E) ([]byte, error) {
	if items == nil {
		items = []E{}
	}
	v, err := json.Marshal(docJSON[E]{Version: 1, Items: items})
	if err != nil {
		return nil, fmt.Errorf("cannot encode %s document (%s): %w", d.what, d.key, err)
	}
	if len(v) > docMaxBytes {
		mDocTooLarge.Inc()
		return nil, fmt.Errorf("cannot write %s document (%s, %d items, %d bytes > %d): %w", d.what, d.key, len(items), len(v), docMaxBytes, ErrDocTooLarge)
	}
	return v, nil
}

// Get reads the document: its items, its ModRevision (0: absent, no items) and the store's
// revision at the read.
func (d *Doc[E]) Get(ctx context.Context) (items []E, modRev, rev int64, err error) {
	kvs, rev, err := d.b.Get(ctx, d.key, false)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("cannot read %s document (%s): %w", d.what, d.key, err)
	}
	if len(kvs) == 0 {
		return nil, 0, rev, nil
	}
	items, err = d.decode(kvs[0].Value)
	if err != nil {
		return nil, 0, 0, err
	}
	return items, kvs[0].ModRev, rev, nil
}

// Load reads the current items (none when the document does not exist).
func (d *Doc[E]) Load() ([]E, error) {
	ctx, cancel := context.WithTimeout(context.Background(), docTimeout)
	defer cancel()
	items, _, _, err := d.Get(ctx)
	return items, err
}

// Update applies fn to the current items and stores the result if fn reports a change, with a
// CAS on the ModRevision it read; on a conflict it reads again and re-runs fn, so fn must be a
// pure function of its input (it may run several times; only its last run counts). It returns
// the items stored (or, without a change, the items read) and their ModRevision. An error from
// fn is returned as is and writes nothing.
func (d *Doc[E]) Update(fn func(cur []E) (next []E, changed bool, err error)) ([]E, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), docTimeout)
	defer cancel()
	for attempt := 0; attempt < docMaxAttempts; attempt++ {
		cur, modRev, _, err := d.Get(ctx)
		if err != nil {
			return nil, 0, err
		}
		next, changed, err := fn(cur)
		if err != nil {
			return nil, 0, err
		}
		if !changed {
			return cur, modRev, nil
		}
		v, err := d.encode(next)
		if err != nil {
			return nil, 0, err
		}
		// ModRevision 0 is "absent" (Compare's convention), so the first write is a create.
		ok, rev, err := d.b.Txn(ctx, []Compare{{Key: d.key, Field: ModRevision, Rev: modRev}}, []Op{{Key: d.key, Value: v}})
		if err != nil {
			return nil, 0, fmt.Errorf("cannot write %s document (%s): %w", d.what, d.key, err)
		}
		if ok {
			return next, rev, nil
		}
		mDocConflicts.Inc()
	}
	mDocExhausted.Inc()
	return nil, 0, fmt.Errorf("cannot write %s document (%s) after %d attempts: %w", d.what, d.key, docMaxAttempts, ErrDocConflict)
}

// Seed creates the document with items if it does not exist yet (a CAS create: of several
// brokers seeding at once, one wins and the others keep what it wrote). It reports whether this
// call created it. Seeding with no items writes nothing.
func (d *Doc[E]) Seed(ctx context.Context, items []E) (bool, error) {
	if len(items) == 0 {
		return false, nil
	}
	v, err := d.encode(items)
	if err != nil {
		return false, err
	}
	ok, _, err := d.b.Txn(ctx, []Compare{{Key: d.key, Field: CreateRevision, Rev: 0}}, []Op{{Key: d.key, Value: v}})
	if err != nil {
		return false, fmt.Errorf("cannot seed %s document (%s): %w", d.what, d.key, err)
	}
	return ok, nil
}

// Follow calls apply with the document's current version and then with every later one, in
// revision order, until ctx ends; it blocks, so callers run it on a goroutine of its own (never
// an event loop: apply builds a new snapshot). A deleted document is delivered as no items. When
// the watch breaks or its start revision was compacted, Follow reads the document again and
// delivers that version (it may repeat one already delivered; revisions tell). A version that
// does not decode is logged, counted and skipped: the broker keeps the last good one rather
// than drop every binding or credential.
func (d *Doc[E]) Follow(ctx context.Context, log *zap.Logger, apply func(items []E, modRev int64)) {
	bo := newBackoff()
	for ctx.Err() == nil {
		kvs, rev, err := d.b.Get(ctx, d.key, false)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("cannot read cluster document; retrying", zap.String("key", d.key), zap.Error(err))
				bo.wait(ctx)
			}
			continue
		}
		bo.reset()
		if len(kvs) == 0 {
			apply(nil, 0)
		} else {
			d.deliver(log, kvs[0], apply)
		}
		wctx, wcancel := context.WithCancel(ctx)
		for wr := range d.b.Watch(wctx, d.key, rev+1) {
			if wr.Err != nil {
				if !errors.Is(wr.Err, ErrCompacted) {
					log.Warn("cluster document watch broke; reading again", zap.String("key", d.key), zap.Error(wr.Err))
				}
				break
			}
			for _, e := range wr.Events {
				if e.KV.Key != d.key { // the watch is a prefix watch: security/acls2 is not ours
					continue
				}
				if e.Type == EventDelete {
					apply(nil, e.KV.ModRev)
					continue
				}
				d.deliver(log, e.KV, apply)
			}
		}
		wcancel()
		if ctx.Err() == nil {
			mDocRelists.Inc()
		}
	}
}

func (d *Doc[E]) deliver(log *zap.Logger, kv KV, apply func([]E, int64)) {
	items, err := d.decode(kv.Value)
	if err != nil {
		mDocBad.Inc()
		log.Error("ignoring undecodable cluster document; keeping the previous version", zap.String("key", d.key), zap.Int64("mod_rev", kv.ModRev), zap.Error(err))
		return
	}
	apply(items, kv.ModRev)
}
