package acl

import "github.com/kaas-go/kaas/storage"

// FileStore keeps the whole binding set in dir/acls.json, replaced atomically on every change:
// ACL changes are rare admin operations, and a crash leaves either the old or the new set, never
// a mix (storage.DocFile).
type FileStore struct{ doc storage.DocFile[Binding] }

// NewFileStore stores the bindings in dir/acls.json (dir is created if missing).
func NewFileStore(dir string) *FileStore {
	return &FileStore{doc: storage.DocFile[Binding]{Dir: dir, Name: "acls.json", Key: "bindings", What: "ACL"}}
}

// Load reads the stored set; a missing file is the empty set.
func (s *FileStore) Load() ([]Binding, error) { return s.doc.Load() }

// Save replaces the stored set durably.
func (s *FileStore) Save(bs []Binding) error { return s.doc.Save(bs) }
