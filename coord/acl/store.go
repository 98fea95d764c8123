package acl

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kaas-go/kaas/storage"
)

// FileStore keeps the whole binding set in one JSON file, replaced atomically (temp file, fsync,
// rename, directory fsync) on every change: ACL changes are rare admin operations, and a crash
// leaves either the old or the new set, never a mix.
type FileStore struct {
	dir, name string
}

// NewFileStore stores the bindings in dir/acls.json (dir is created if missing).
func NewFileStore(dir string) *FileStore { return &FileStore{dir: dir, name: "acls.json"} }

type fileFormat struct {
	Version  int       `json:"version"`
	Bindings []Binding `json:"bindings"`
}

// Load reads the stored set; a missing file is the empty set.
func (s *FileStore) Load() ([]Binding, error) {
	path := filepath.Join(s.dir, s.name)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read ACL file (%s): %w", path, err)
	}
	var f fileFormat
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("cannot parse ACL file (%s, fix or remove it): %w", path, err)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("cannot parse ACL file (%s): unknown version %d", path, f.Version)
	}
	return f.Bindings, nil
}

// Save replaces the stored set durably.
func (s *FileStore) Save(bs []Binding) error {
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("cannot create ACL dir (%s): %w", s.dir, err)
	}
	data, err := json.Marshal(fileFormat{Version: 1, Bindings: bs})
	if err != nil {
		return err
	}
	if err := storage.WriteFileAtomic(s.dir, s.name, data); err != nil {
		return fmt.Errorf("cannot write ACL file (%s): %w", filepath.Join(s.dir, s.name), err)
	}
	return nil
}
