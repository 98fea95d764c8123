package acl

import (
	"slices"
	"testing"
)

// memStore is a Store with revisions, like the cluster's etcd document. interloper, if set, is
// another broker's change that lands between the first read and the write of the next Update:
// the update then runs its change a second time on the newer set, as cluster.Doc does after a
// CAS conflict.
type memStore struct {
	bs         []Binding
	rev        int64
	interloper func([]Binding) []Binding
}

func (s *memStore) Load() ([]Binding, error) { return slices.Clone(s.bs), nil }

func (s *memStore) Update(fn func([]Binding) ([]Binding, bool, error)) ([]Binding, int64, error) {
	if il := s.interloper; il != nil {
		s.interloper = nil
		if _, _, err := fn(slices.Clone(s.bs)); err != nil { // the losing attempt
			return nil, 0, err
		}
		s.bs, s.rev = il(s.bs), s.rev+1
	}
	next, changed, err := fn(slices.Clone(s.bs))
	if err != nil || !changed {
		return s.bs, s.rev, err
	}
	s.bs, s.rev = next, s.rev+1
	return next, s.rev, nil
}

// TestReplaceNeverInstallsAnOlderRevision: the watch and the broker's own writes may deliver
// versions in any order; the index only moves forward, and an invalid set is refused whole.
func TestReplaceNeverInstallsAnOlderRevision(t *testing.T) {
	const alice = "User:alice"
	readT := lit(ResourceTopic, "t", alice, OpRead, PermAllow)
	denyT := lit(ResourceTopic, "t", alice, OpRead, PermDeny)
	a, err := New(Config{}, &memStore{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Replace([]Binding{readT}, 5); err != nil || !a.Authorize(alice, "h", OpRead, ResourceTopic, "t") || a.Revision() != 5 {
		t.Fatalf("revision 5 not installed: %v, rev %d", err, a.Revision())
	}
	if err := a.Replace([]Binding{denyT}, 3); err != nil || !a.Authorize(alice, "h", OpRead, ResourceTopic, "t") || a.Revision() != 5 {
		t.Fatalf("older revision 3 installed over 5 (rev %d, %v)", a.Revision(), err)
	}
	bad := readT
	bad.Host = ""
	if err := a.Replace([]Binding{denyT, bad}, 9); err == nil || a.Revision() != 5 || !a.Authorize(alice, "h", OpRead, ResourceTopic, "t") {
		t.Fatalf("a set with an invalid binding was applied (rev %d, %v)", a.Revision(), err)
	}
	// This broker's own write returns revision 1 of a store that is behind the watch: the
	// index keeps the newer version it already has.
	if err := a.Create([]Binding{denyT}); err != nil {
		t.Fatal(err)
	}
	if !a.Authorize(alice, "h", OpRead, ResourceTopic, "t") || a.Revision() != 5 {
		t.Fatalf("a write at an older revision replaced revision 5 (rev %d)", a.Revision())
	}
}

// TestDeleteReportsWhatTheWinningAttemptMatched: when another broker's change lands between a
// deletion's read and its write, the deletion runs again on the newer set, removes what that set
// holds and reports exactly that.
func TestDeleteReportsWhatTheWinningAttemptMatched(t *testing.T) {
	const alice = "User:alice"
	b1 := lit(ResourceTopic, "a", alice, OpRead, PermAllow)
	b2 := lit(ResourceTopic, "b", alice, OpRead, PermAllow)
	s := &memStore{bs: []Binding{b1}, rev: 1}
	a, err := New(Config{}, s)
	if err != nil {
		t.Fatal(err)
	}
	s.interloper = func(cur []Binding) []Binding { return append(slices.Clone(cur), b2) }
	p := alice
	out, err := a.Delete([]Filter{{ResourceType: ResourceTopic, PatternType: PatternAny, Principal: &p, Operation: OpAny, Permission: PermAny}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || !slices.Equal(out[0], []Binding{b1, b2}) {
		t.Fatalf("deletion reported %v, want both bindings", out)
	}
	if len(s.bs) != 0 || len(a.Describe(Filter{ResourceType: ResourceAny, PatternType: PatternAny, Operation: OpAny, Permission: PermAny})) != 0 || a.Revision() != s.rev {
		t.Fatalf("after the deletion: store %v, index rev %d (store %d)", s.bs, a.Revision(), s.rev)
	}
}
