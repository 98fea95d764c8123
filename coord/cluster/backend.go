package cluster

import (
	"context"
	"errors"
	"time"
)

// LeaseID names an etcd lease. Its hex form is a broker's incarnation.
type LeaseID int64

// KV is one key as read from the backend.
type KV struct {
	Key       string
	Value     []byte
	CreateRev int64 // revision of the put that created the key; 0 for a deleted key in an event
	ModRev    int64 // revision of the last put (or, in a delete event, of the delete)
	Lease     LeaseID
}

// CompareField selects which revision of a key a Compare checks.
type CompareField uint8

const (
	CreateRevision CompareField = iota
	ModRevision
)

// Compare is an equality guard of a Txn: Field of Key must equal Rev. Rev 0 means the key is
// absent (etcd reports revision 0 for a key that does not exist).
type Compare struct {
	Key   string
	Field CompareField
	Rev   int64
}

// Op is a write of a Txn: a put (with an optional lease) or a delete (Prefix: every key under Key).
type Op struct {
	Key    string
	Value  []byte
	Lease  LeaseID
	Delete bool
	Prefix bool // delete only
}

// EventType is a watch event's kind.
type EventType uint8

const (
	EventPut EventType = iota
	EventDelete
)

// Event is one change seen by a watch. Prev is the key before the change, when it existed.
type Event struct {
	Type EventType
	KV   KV
	Prev *KV
}

// WatchResponse carries the events of one or more revisions, in order. Err == ErrCompacted
// means the requested start revision is gone: re-list with Get, then watch from its rev+1.
type WatchResponse struct {
	Events []Event
	Rev    int64
	Err    error
}

var (
	// ErrLeaseNotFound: the lease expired or was revoked (etcd "requested lease not found").
	ErrLeaseNotFound = errors.New("lease not found")
	// ErrCompacted: a watch asked for a revision older than the compaction point.
	ErrCompacted = errors.New("required revision has been compacted")
)

// Backend is the part of etcd kaas uses. Two implementations: NewEtcd (go.etcd.io/etcd/client/v3)
// and NewFake (in memory, on a ManualClock, for unit tests).
type Backend interface {
	Grant(ctx context.Context, ttl time.Duration) (LeaseID, error)
	// KeepAliveOnce renews the lease once and returns the TTL the server granted from now on.
	// ErrLeaseNotFound when the lease is gone.
	KeepAliveOnce(ctx context.Context, id LeaseID) (ttl time.Duration, err error)
	Revoke(ctx context.Context, id LeaseID) error
	Get(ctx context.Context, key string, prefix bool) (kvs []KV, rev int64, err error)
	// Txn applies then iff every compare holds, atomically, at one revision.
	Txn(ctx context.Context, ifs []Compare, then []Op) (ok bool, rev int64, err error)
	// Watch streams every change under prefix from revision fromRev (0: from now on). The
	// channel is closed when ctx ends (or after a response carrying Err).
	Watch(ctx context.Context, prefix string, fromRev int64) <-chan WatchResponse
	// Campaign blocks until value's candidate (created under prefix with its own session lease of
	// ttl) is the oldest candidate. Leadership.Done is closed when the candidacy is lost (its
	// lease expired, its key was deleted, Resign, or ctx ended).
	Campaign(ctx context.Context, prefix string, value []byte, ttl time.Duration) (*Leadership, error)
	Close() error
}

// Leadership is a won election. Key and Rev (its CreateRevision) are the fencing token every
// controller write compares: Compare{Key, CreateRevision, Rev}.
type Leadership struct {
	Key    string
	Rev    int64
	Done   <-chan struct{}
	Resign func(context.Context) error
}
