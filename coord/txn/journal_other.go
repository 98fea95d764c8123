//go:build !linux

package txn

import "os"

// datasync falls back to fsync where fdatasync(2) is not available, as storage does
// (storage/fs_other.go): correct everywhere, only slower.
func datasync(f *os.File) error { return f.Sync() }
