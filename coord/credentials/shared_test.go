package credentials

import (
	"errors"
	"slices"
	"testing"
)

// memRecords is a Records with revisions; other, if set, is a change another broker makes
// between the first read and the write of the next Update (which then runs its change again).
type memRecords struct {
	recs  []Record
	rev   int64
	other func([]Record) []Record
}

func (m *memRecords) Load() ([]Record, error) { return slices.Clone(m.recs), nil }

func (m *memRecords) Update(fn func([]Record) ([]Record, bool, error)) ([]Record, int64, error) {
	if o := m.other; o != nil {
		m.other = nil
		if _, _, err := fn(slices.Clone(m.recs)); err != nil {
			return nil, 0, err
		}
		m.recs, m.rev = o(m.recs), m.rev+1
	}
	next, changed, err := fn(slices.Clone(m.recs))
	if err != nil {
		return nil, 0, err
	}
	if !changed {
		return m.recs, m.rev, nil
	}
	m.recs, m.rev = next, m.rev+1
	return next, m.rev, nil
}

// TestSharedStoreKeepsConcurrentChangesAndFollowsReplace: an Apply racing another broker's
// change keeps both; Replace installs newer versions only; a bad record is refused whole; a
// deletion of a missing credential is ErrNotFound and changes nothing.
func TestSharedStoreKeepsConcurrentChangesAndFollowsReplace(t *testing.T) {
	doc := &memRecords{}
	s, err := OpenSharedStore(doc)
	if err != nil {
		t.Fatal(err)
	}
	bob := mustCred(t, SHA512, "bob-pw", 4096)
	doc.other = func(cur []Record) []Record {
		return append(cur, RecordsOf(map[string][]Credential{"bob": {bob}})...)
	}
	if err := s.Apply([]Change{{User: "alice", Mechanism: SHA256, Cred: mustCred(t, SHA256, "alice-pw", 4096)}}); err != nil {
		t.Fatal(err)
	}
	users, _ := s.Users()
	if len(users) != 2 || len(doc.recs) != 2 || s.Revision() != doc.rev {
		t.Fatalf("after racing changes: users %v, document %d records, rev %d/%d", users, len(doc.recs), s.Revision(), doc.rev)
	}
	if c, ok, err := s.Lookup("bob", SHA512); !ok || err != nil || !c.VerifyPassword("bob-pw") {
		t.Fatalf("bob (added by the other broker): %v %v", ok, err)
	}
	if err := s.Apply([]Change{{User: "nobody", Mechanism: SHA256, Delete: true}}); !errors.Is(err, ErrNotFound) || len(doc.recs) != 2 {
		t.Fatalf("deleting a missing credential: %v, %d records", err, len(doc.recs))
	}

	// Another broker deletes alice: the watch delivers the new version.
	only := RecordsOf(map[string][]Credential{"bob": {bob}})
	if err := s.Replace(only, doc.rev+5); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Lookup("alice", SHA256); ok {
		t.Fatal("alice still authenticates after a newer version without her")
	}
	if err := s.Replace(nil, doc.rev); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Lookup("bob", SHA512); !ok {
		t.Fatal("an older version replaced a newer one")
	}
	bad := slices.Clone(only)
	bad[0].Iterations = 1
	if err := s.Replace(bad, doc.rev+9); err == nil {
		t.Fatal("a record below the minimum iterations was accepted")
	}
	if _, ok, _ := s.Lookup("bob", SHA512); !ok {
		t.Fatal("a refused version changed the credentials")
	}
}
