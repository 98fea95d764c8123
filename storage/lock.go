package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// LockFileName is the data directory's lock file (see LockDir).
const LockFileName = ".lock"

// ErrDirLocked is wrapped by LockDir's error when another holder has the lock.
var ErrDirLocked = errors.New("data directory is locked by another process")

// DirLock is an exclusive lock on a data directory, held until Close (or the process exits:
// the kernel drops a flock with the last descriptor of its open file description).
type DirLock struct {
	f    *os.File
	path string
}

// LockDir takes an exclusive, non-blocking lock on dir/.lock and writes the holder's pid into
// it. It must come before anything reads or writes dir: a second broker on the same directory
// would otherwise replay the live broker's journal, delete its WAL generations, truncate its
// active segments and issue the same producer ids (Kafka refuses the same way with its
// `.lock` file per log directory). A refusal touches nothing: the file is opened without
// O_TRUNC and written only once the lock is held. The error names the directory and the pid
// the holder wrote.
func LockDir(dir string) (*DirLock, error) {
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cannot open data dir lock (%s): %w", path, err)
	}
	if err := flockExclusive(f); err != nil {
		holder := "unknown"
		if buf, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(string(bytes.TrimSpace(buf))); perr == nil {
				holder = strconv.Itoa(pid)
			}
		}
		_ = f.Close()
		if errors.Is(err, errWouldBlock) {
			lockRefusalsTotal.Inc()
			return nil, fmt.Errorf("cannot lock data dir (%s): %w: held by pid %s", dir, ErrDirLocked, holder)
		}
		return nil, fmt.Errorf("cannot lock data dir (%s): %w", dir, err)
	}
	l := &DirLock{f: f, path: path}
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(pid, 0)
	}
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("cannot write data dir lock (%s): %w", path, err)
	}
	return l, nil
}

// Close releases the lock. The file stays (removing it would let a third process lock a new
// inode while a second one still waits on the old one).
func (l *DirLock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
