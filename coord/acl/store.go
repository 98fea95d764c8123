package acl

import (
	"sync"

	"github.com/kaas-go/kaas/storage"
)

// FileStore keeps the whole binding set in dir/acls.json, replaced atomically on every change:
// ACL changes are rare admin operations, and a crash leaves either the old or the new set, never
// a mix (storage.DocFile). It serves one broker process; cluster mode keeps the set in etcd
// (coord/cluster.Doc) instead, because two brokers rewriting one file would lose each other's
// changes.
//
// Lock order: mu is a leaf (held across the file's read-modify-write).
type FileStore struct {
	doc storage.DocFile[Binding]
	mu  sync.Mutex
}

// NewFileStore stores the bindings in dir/acls.json (dir is created if missing).
func NewFileStore(dir string) *FileStore {
	return &FileStore{doc: storage.DocFile[Binding]{Dir: dir, Name: "acls.json", Key: "bindings", What: "ACL"}}
}

// Load reads the stored set; a missing file is the empty set.
func (s *FileStore) Load() ([]Binding, error) { return s.doc.Load() }

// Save replaces the stored set durably.
func (s *FileStore) Save(bs []Binding) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.doc.Save(bs)
}

// Update implements Store. A file has no revisions: it reports revision 0, which a single
// process needs no more than (its writers are serialised by the Authorizer).
func (s *FileStore) Update(fn func(cur []Binding) ([]Binding, bool, error)) ([]Binding, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.doc.Load()
	if err != nil {
		return nil, 0, err
	}
	next, changed, err := fn(cur)
	if err != nil {
		return nil, 0, err
	}
	if !changed {
		return cur, 0, nil
	}
	if err := s.doc.Save(next); err != nil {
		return nil, 0, err
	}
	return next, 0, nil
}
