package quota

import "github.com/kaas-go/kaas/storage"

// FileStore keeps every quota entity in dir/client_quotas.json, replaced atomically on each change
// (quota changes are rare admin operations; storage.DocFile).
type FileStore struct{ doc storage.DocFile[Entry] }

// NewFileStore stores the quotas in dir/client_quotas.json.
func NewFileStore(dir string) *FileStore {
	return &FileStore{doc: storage.DocFile[Entry]{Dir: dir, Name: "client_quotas.json", Key: "entries", What: "client quota"}}
}

// Load reads the stored quotas; a missing file is none.
func (s *FileStore) Load() ([]Entry, error) { return s.doc.Load() }

// Save replaces the stored quotas durably.
func (s *FileStore) Save(es []Entry) error { return s.doc.Save(es) }
