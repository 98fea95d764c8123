//go:build !linux

package storage

import "os"

// Fdatasync falls back to fsync where fdatasync(2) is not available: correct, only slower. The
// txn journal and tests call it there; osFile has no Datasync method outside Linux.
func Fdatasync(f *os.File) error { return f.Sync() }
