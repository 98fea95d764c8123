//go:build !unix

package storage

import (
	"errors"
	"os"
)

var errWouldBlock = errors.New("lock held")

// flockExclusive: kaas supports Unix-like systems only for the data directory lock; elsewhere
// LockDir refuses rather than run unprotected.
func flockExclusive(*os.File) error {
	return errors.New("data directory locking is not supported on this platform")
}
