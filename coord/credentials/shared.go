package credentials

import (
	"fmt"
	"sort"
	"sync/atomic"
)

// Record is one stored credential in a document several brokers share (cluster mode: the etcd
// key <prefix>security/scram). Byte fields travel as base64 through encoding/json.
type Record struct {
	User       string `json:"user"`
	Mechanism  string `json:"mechanism"`
	Salt       []byte `json:"salt"`
	Iterations int    `json:"iterations"`
	StoredKey  []byte `json:"stored_key"`
	ServerKey  []byte `json:"server_key"`
}

// Records is the shared document behind a SharedStore; *cluster.Doc[Record] implements it.
type Records interface {
	Load() ([]Record, error)
	// Update applies fn to the stored records with compare-and-swap, re-running fn when another
	// writer got in between; it returns the records now stored and their revision.
	Update(fn func(cur []Record) (next []Record, changed bool, err error)) (stored []Record, rev int64, err error)
}

// SharedStore is the Store of a cluster: every broker holds an immutable snapshot of the shared
// document, which its own Apply and Replace (each version the etcd watch delivers, from whichever
// broker wrote it) swap atomically, never to an older revision. Lookup, on the SASL path, is
// one atomic load and two map reads: no lock and no round trip to etcd per authentication, as
// Apache's brokers answer from the credential cache their metadata log replay fills.
//
// Lock order: none (writers are serialised by the document's CAS, readers take no lock).
type SharedStore struct {
	doc  Records
	snap atomic.Pointer[userSnapshot]
}

type userSnapshot struct {
	rev   int64
	users map[string]map[Mechanism]Credential
}

// OpenSharedStore loads the document. A record that does not validate refuses to open, as a
// FileStore refuses an unparsable file: guessing would lock every user out or let one in.
func OpenSharedStore(doc Records) (*SharedStore, error) {
	recs, err := doc.Load()
	if err != nil {
		return nil, fmt.Errorf("cannot load shared credentials: %w", err)
	}
	users, err := usersOf(recs)
	if err != nil {
		return nil, err
	}
	s := &SharedStore{doc: doc}
	s.snap.Store(&userSnapshot{users: users})
	return s, nil
}

func usersOf(recs []Record) (map[string]map[Mechanism]Credential, error) {
	users := make(map[string]map[Mechanism]Credential, len(recs))
	for _, r := range recs {
		c, err := fileCred{Mechanism: r.Mechanism, Salt: r.Salt, Iterations: r.Iterations, StoredKey: r.StoredKey, ServerKey: r.ServerKey}.credential(r.User)
		if err != nil {
			return nil, fmt.Errorf("cannot read shared credentials: %w", err)
		}
		if users[r.User] == nil {
			users[r.User] = map[Mechanism]Credential{}
		}
		users[r.User][c.Mechanism] = c
	}
	return users, nil
}

// RecordsOf flattens users (as Store.Users returns them) into records, sorted by user and
// mechanism: the form a shared document is seeded with from a single broker's FileStore.
func RecordsOf(users map[string][]Credential) []Record {
	var out []Record
	for u, cs := range users {
		for _, c := range cs {
			out = append(out, Record{User: u, Mechanism: c.Mechanism.String(), Salt: c.Salt, Iterations: c.Iterations, StoredKey: c.StoredKey, ServerKey: c.ServerKey})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].User != out[j].User {
			return out[i].User < out[j].User
		}
		return out[i].Mechanism < out[j].Mechanism
	})
	return out
}

func recordsOfMap(users map[string]map[Mechanism]Credential) []Record {
	flat := make(map[string][]Credential, len(users))
	for u, ms := range users {
		for _, m := range Mechanisms {
			if c, ok := ms[m]; ok {
				flat[u] = append(flat[u], c)
			}
		}
	}
	return RecordsOf(flat)
}

// Lookup implements Store.
func (s *SharedStore) Lookup(user string, m Mechanism) (Credential, bool, error) {
	c, ok := s.snap.Load().users[user][m]
	return c, ok, nil
}

// Users implements Store.
func (s *SharedStore) Users() (map[string][]Credential, error) {
	snap := s.snap.Load()
	out := make(map[string][]Credential, len(snap.users))
	for u, ms := range snap.users {
		for _, m := range Mechanisms {
			if c, ok := ms[m]; ok {
				out[u] = append(out[u], c)
			}
		}
	}
	return out, nil
}

// Apply implements Store: the changes apply to the document's current version (read again on a
// conflict, so a change made through another broker at the same time is kept), all or nothing.
func (s *SharedStore) Apply(changes []Change) error {
	stored, rev, err := s.doc.Update(func(cur []Record) ([]Record, bool, error) {
		users, err := usersOf(cur)
		if err != nil {
			return nil, false, err
		}
		if err := applyChanges(users, changes); err != nil {
			return nil, false, err
		}
		return recordsOfMap(users), true, nil
	})
	if err != nil {
		return fmt.Errorf("cannot apply %d SCRAM credential changes: %w", len(changes), err)
	}
	return s.Replace(stored, rev)
}

// Replace installs recs, the document at revision rev, unless a later revision is installed
// already. Records that do not validate are refused whole; the previous snapshot stays.
func (s *SharedStore) Replace(recs []Record, rev int64) error {
	users, err := usersOf(recs)
	if err != nil {
		return fmt.Errorf("cannot apply shared credentials (revision %d): %w", rev, err)
	}
	next := &userSnapshot{rev: rev, users: users}
	for {
		cur := s.snap.Load()
		if rev < cur.rev || s.snap.CompareAndSwap(cur, next) {
			return nil
		}
	}
}

// Revision is the document revision the current snapshot was read at.
func (s *SharedStore) Revision() int64 { return s.snap.Load().rev }
