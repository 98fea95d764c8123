package storage

import (
	"os"

	"golang.org/x/sys/unix"
)

func (f osFile) Datasync() error { return Fdatasync(f.File) }

// WriteBack may race a Close of f (the zeroer does not hold zmu for it): RawConn.Control keeps
// the descriptor from being closed (and reused) during the call.
func (f osFile) WriteBack(off, n int64) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	cerr := rc.Control(func(fd uintptr) {
		for {
			err = unix.SyncFileRange(int(fd), off, n,
				unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
			if err != unix.EINTR {
				return
			}
		}
	})
	if cerr != nil {
		return cerr
	}
	return err
}

// Fdatasync calls fdatasync(2) on f, retrying on EINTR. The caller keeps f open for the call.
func Fdatasync(f *os.File) error {
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
