package txn

import (
	"os"

	"golang.org/x/sys/unix"
)

// datasync is fdatasync(2), retried on EINTR. Journal appends land in blocks that were written
// (zeros) and fsync'd when the generation was created, so there is no size or block-map change
// to commit: fdatasync skips the file system journal commit an fsync would pay for the inode
// timestamps (the same reasoning as storage's pre-zeroed segments, storage/segment.go).
func datasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}
