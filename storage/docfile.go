package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// DocFile is a small versioned JSON document kept whole in one file and replaced atomically on
// every save (WriteFileAtomic: temp file, fsync, rename, directory fsync), so a crash leaves the
// old or the new document, never a mix. It suits rare administrative state (ACL bindings, client
// quotas): the whole set is rewritten per change. The file is {"version":1,"<Key>":[...]}.
type DocFile[T any] struct {
	Dir, Name string
	Key       string // the JSON field holding the items
	What      string // for error messages ("ACL", "client quota")
}

// Load reads the items; a missing file is none. A file that does not parse, or of another version,
// is an error naming it: the caller refuses to start rather than forget stored state.
func (d DocFile[T]) Load() ([]T, error) {
	path := filepath.Join(d.Dir, d.Name)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read %s file (%s): %w", d.What, path, err)
	}
	var doc map[string]json.RawMessage
	var version int
	var items []T
	err = json.Unmarshal(data, &doc)
	if err == nil {
		err = json.Unmarshal(doc["version"], &version)
	}
	if err == nil && version != 1 {
		err = fmt.Errorf("unknown version %d", version)
	}
	if raw, ok := doc[d.Key]; err == nil && ok {
		err = json.Unmarshal(raw, &items)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot parse %s file (%s, fix or remove it): %w", d.What, path, err)
	}
	return items, nil
}

// Save replaces the stored items durably.
func (d DocFile[T]) Save(items []T) error {
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return fmt.Errorf("cannot create %s dir (%s): %w", d.What, d.Dir, err)
	}
	data, err := json.Marshal(map[string]any{"version": 1, d.Key: items})
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(d.Dir, d.Name, data); err != nil {
		return fmt.Errorf("cannot write %s file (%s): %w", d.What, filepath.Join(d.Dir, d.Name), err)
	}
	return nil
}

// SharedDocFile is a DocFile whose saves and read-modify-write updates are serialised within
// one process (the single broker's ACL and client-quota stores). A file has no revisions:
// Update reports revision 0. Cluster mode keeps such documents in etcd instead, because two
// processes rewriting one file would lose each other's changes.
//
// Lock order: mu is a leaf (held across the file's read-modify-write).
type SharedDocFile[T any] struct {
	Doc DocFile[T]
	mu  sync.Mutex
}

// Load reads the items; a missing file is none.
func (s *SharedDocFile[T]) Load() ([]T, error) { return s.Doc.Load() }

// Save replaces the items durably.
func (s *SharedDocFile[T]) Save(items []T) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Doc.Save(items)
}

// Update reads the items, lets fn compute the next set and saves it when fn reports a change.
func (s *SharedDocFile[T]) Update(fn func(cur []T) ([]T, bool, error)) ([]T, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.Doc.Load()
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
	if err := s.Doc.Save(next); err != nil {
		return nil, 0, err
	}
	return next, 0, nil
}
