package quota

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kaas-go/kaas/storage"
)

// FileStore keeps every quota entity in one JSON file, replaced atomically on each change
// (quota changes are rare admin operations).
type FileStore struct{ dir, name string }

// NewFileStore stores the quotas in dir/client_quotas.json.
func NewFileStore(dir string) *FileStore { return &FileStore{dir: dir, name: "client_quotas.json"} }

type fileFormat struct {
	Version int     `json:"version"`
	Entries []Entry `json:"entries"`
}

// Load reads the stored quotas; a missing file is none.
func (s *FileStore) Load() ([]Entry, error) {
	path := filepath.Join(s.dir, s.name)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read client quota file (%s): %w", path, err)
	}
	var f fileFormat
	if err := json.Unmarshal(data, &f); err != nil || f.Version != 1 {
		return nil, fmt.Errorf("cannot parse client quota file (%s, version %d, fix or remove it): %v", path, f.Version, err)
	}
	return f.Entries, nil
}

// Save replaces the stored quotas durably.
func (s *FileStore) Save(es []Entry) error {
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("cannot create client quota dir (%s): %w", s.dir, err)
	}
	data, err := json.Marshal(fileFormat{Version: 1, Entries: es})
	if err != nil {
		return err
	}
	if err := storage.WriteFileAtomic(s.dir, s.name, data); err != nil {
		return fmt.Errorf("cannot write client quota file (%s): %w", filepath.Join(s.dir, s.name), err)
	}
	return nil
}
