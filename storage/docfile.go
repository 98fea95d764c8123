package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
