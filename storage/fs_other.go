//go:build !linux

package storage

import "os"

// fdatasync falls back to fsync where fdatasync(2) is not available (only tests call it there:
// osFile has no Datasync method outside Linux).
func fdatasync(f *os.File) error { return f.Sync() }
