//go:build unix

package storage

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

var errWouldBlock = unix.EWOULDBLOCK

// flockExclusive takes flock(LOCK_EX|LOCK_NB). flock locks belong to the open file
// description, so two opens in one process conflict as two processes do.
func flockExclusive(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
