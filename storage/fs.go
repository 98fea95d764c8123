package storage

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
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

// datasyncer is implemented by files that can fdatasync(2): write back the data and only the
// metadata needed to read it back (size, block allocation), not timestamps. The flusher uses it
// for bytes that lie entirely in a segment's pre-zeroed region (see segment.zeroTo); a File
// without it is always fsync'd.
type datasyncer interface {
	Datasync() error
}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// rangeWriter is implemented by files that can write back a byte range synchronously
// (sync_file_range(2): data only, no metadata, no durability guarantee). The zeroer uses it to
// keep at most one chunk of zeros dirty: fsync and fdatasync wait for the writeback of every
// dirty page of the file, so a flush racing a zero extension would otherwise wait for megabytes
// of zeros to reach the disk.
type rangeWriter interface {
	WriteBack(off, n int64) error
}

// osFile is an *os.File; on Linux it can also fdatasync and write back a range (fs_linux.go).
// Elsewhere every flush is an fsync.
type osFile struct{ *os.File }

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
//
// The temp name is unique to this process and call (name.<pid>-<n>.tmp): on a shared volume two
// brokers may replace the same file (__cluster/features.json), and a shared temp name let one
// broker rename the other's half-written file away. Leftovers still end in .tmp, which is what
// every open-time cleanup matches.
func WriteFileAtomic(dir, name string, data []byte) error {
	n := atomicTmpSeq.Add(1)
	return writeFileAtomicTmp(dir, name, name+"."+tmpPID+"-"+strconv.FormatUint(n, 10)+".tmp", data)
}

var (
	atomicTmpSeq atomic.Uint64
	tmpPID       = strconv.Itoa(os.Getpid())
)

// writeFileAtomicTmp is WriteFileAtomic through the temporary file dir/tmpName (cluster mode:
// a name of the writer's own, so two brokers writing one file never share a temp file).
func writeFileAtomicTmp(dir, name, tmpName string, data []byte) error {
	tmp := filepath.Join(dir, tmpName)
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
