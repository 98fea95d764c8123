package quota

import (
	"sync"

	"github.com/kaas-go/kaas/storage"
)

// FileStore keeps every quota entity in dir/client_quotas.json, replaced atomically on each change
// (quota changes are rare admin operations; storage.DocFile). It serves one broker process;
// cluster mode keeps the entries in etcd (coord/cluster.Doc), so two brokers never rewrite one
// file.
//
// Lock order: mu is a leaf (held across the file's read-modify-write).
type FileStore struct {
	doc storage.DocFile[Entry]
	mu  sync.Mutex
}

// NewFileStore stores the quotas in dir/client_quotas.json.
func NewFileStore(dir string) *FileStore {
	return &FileStore{doc: storage.DocFile[Entry]{Dir: dir, Name: "client_quotas.json", Key: "entries", What: "client quota"}}
}

// Load reads the stored quotas; a missing file is none.
func (s *FileStore) Load() ([]Entry, error) { return s.doc.Load() }

// Save replaces the stored quotas durably.
func (s *FileStore) Save(es []Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.doc.Save(es)
}

// Update implements Store; a file has no revisions and reports 0.
func (s *FileStore) Update(fn func(cur []Entry) ([]Entry, bool, error)) ([]Entry, int64, error) {
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
