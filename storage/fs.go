package storage

import (
	"io"
	"os"
	"path/filepath"
)

// File is the subset of *os.File the log uses for segment data. It exists so tests can inject
// ENOSPC / EIO without filling a disk (see Config.FS).
type File interface {
	io.ReaderAt
	io.WriterAt
	Truncate(size int64) error
	Sync() error
	Stat() (os.FileInfo, error)
	Close() error
}

// FS opens segment log files. The default is the OS file system.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// SyncDir fsyncs a directory so that a create, rename or unlink inside it survives a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteFileSynced creates (or truncates) path, writes data and fsyncs it before closing.
func WriteFileSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteFileAtomic replaces dir/name with data: write a temp file, fsync it, rename it over the
// target, fsync the directory. A crash leaves either the old or the new content, never a mix.
// Every small state file of the broker (topic metadata, index files, slot files, cluster id)
// goes through it.
func WriteFileAtomic(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	err := WriteFileSynced(tmp, data)
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return SyncDir(dir)
}
