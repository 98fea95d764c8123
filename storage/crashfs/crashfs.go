// Package crashfs is a file system wrapper for crash tests of a shared volume: each "host" has
// its own page cache. What a host writes is invisible to every other host (and to plain os
// calls) until that host syncs or closes the file, and Crash(host) drops whatever the host had
// not synced, as a power loss or a kill of the host's kernel does. A crashed host can be turned
// into a zombie: its writes are accepted again and really reach the files, which models a dead
// host's page cache being written back late into files a successor already read (design
// cluster.md §2.1). The idea is LazyFS's (dsrhaslab/lazyfs), in process.
//
// It wraps real files in a directory (t.TempDir()), so everything the code under test writes
// with plain os calls (small files written tmp + fsync + rename) is simply durable at once.
// Only files opened through a Host are cached. The storage package's FS interface is satisfied
// by Host (File's method set covers storage.File).
package crashfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
)

// ErrCrashed is returned for writes and syncs of a crashed host that is not a zombie.
var ErrCrashed = errors.New("crashfs: host crashed")

// File is what a Host opens.
type File interface {
	io.ReaderAt
	io.WriterAt
	Truncate(size int64) error
	Sync() error
	Stat() (os.FileInfo, error)
	Close() error
}

// FS holds the hosts and their page caches.
type FS struct {
	mu     sync.Mutex
	hosts  map[string]*host
	caches map[cacheKey]*cache
}

type host struct {
	crashed, zombie bool
}

type fileID struct{ dev, ino uint64 }

type cacheKey struct {
	host string
	id   fileID
}

// cache is one host's unsynced changes to one file, in the order they were made.
type cache struct {
	ops []op
}

type op struct {
	trunc bool // truncate to off
	off   int64
	data  []byte
}

// New returns an empty FS.
func New() *FS {
	return &FS{hosts: map[string]*host{}, caches: map[cacheKey]*cache{}}
}

// Host returns host name's view (created on first use).
func (fs *FS) Host(name string) *Host {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.hosts[name] == nil {
		fs.hosts[name] = &host{}
	}
	return &Host{fs: fs, name: name}
}

// Crash drops every unsynced change of host and makes its later writes and syncs fail with
// ErrCrashed (until Zombie).
func (fs *FS) Crash(name string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for k := range fs.caches {
		if k.host == name {
			delete(fs.caches, k)
		}
	}
	if h := fs.hosts[name]; h != nil {
		h.crashed = true
	}
}

// Zombie makes a crashed host write again: its writes and syncs reach the files as if its
// page cache were written back after the host was declared dead.
func (fs *FS) Zombie(name string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if h := fs.hosts[name]; h != nil {
		h.zombie = true
	}
}

// Unsynced returns how many bytes host has written and not yet synced.
func (fs *FS) Unsynced(name string) int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var n int64
	for k, c := range fs.caches {
		if k.host == name {
			for _, o := range c.ops {
				n += int64(len(o.data))
			}
		}
	}
	return n
}

// Host is one host's view of the files. It implements the storage package's FS.
type Host struct {
	fs   *FS
	name string
}

// OpenFile opens a real file; O_TRUNC is a cached change like any write.
func (h *Host) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	h.fs.mu.Lock()
	st := h.fs.hosts[h.name]
	dead := st.crashed && !st.zombie
	h.fs.mu.Unlock()
	if dead && flag&(os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_RDWR) != 0 {
		return nil, &os.PathError{Op: "open", Path: name, Err: ErrCrashed}
	}
	f, err := os.OpenFile(name, flag&^os.O_TRUNC, perm)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		_ = f.Close()
		return nil, fmt.Errorf("crashfs: no inode for %s", name)
	}
	cf := &file{h: h, f: f, key: cacheKey{host: h.name, id: fileID{dev: uint64(sys.Dev), ino: uint64(sys.Ino)}},
		readOnly: flag&(os.O_WRONLY|os.O_RDWR) == 0}
	if flag&os.O_TRUNC != 0 {
		if err := cf.Truncate(0); err != nil {
			_ = f.Close()
			return nil, err
		}
	}
	return cf, nil
}

type file struct {
	h        *Host
	f        *os.File
	key      cacheKey
	readOnly bool
}

// writable reports (under fs.mu) whether the host may write.
func (f *file) writableLocked() error {
	if f.readOnly {
		return &os.PathError{Op: "write", Path: f.f.Name(), Err: syscall.EBADF}
	}
	if st := f.h.fs.hosts[f.h.name]; st.crashed && !st.zombie {
		return &os.PathError{Op: "write", Path: f.f.Name(), Err: ErrCrashed}
	}
	return nil
}

func (f *file) cacheLocked() *cache {
	c := f.h.fs.caches[f.key]
	if c == nil {
		c = &cache{}
		f.h.fs.caches[f.key] = c
	}
	return c
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	f.h.fs.mu.Lock()
	defer f.h.fs.mu.Unlock()
	if err := f.writableLocked(); err != nil {
		return 0, err
	}
	c := f.cacheLocked()
	c.ops = append(c.ops, op{off: off, data: append([]byte(nil), p...)})
	return len(p), nil
}

func (f *file) Truncate(size int64) error {
	f.h.fs.mu.Lock()
	defer f.h.fs.mu.Unlock()
	if err := f.writableLocked(); err != nil {
		return err
	}
	c := f.cacheLocked()
	c.ops = append(c.ops, op{trunc: true, off: size})
	return nil
}

// sizeLocked is the file size this host sees.
func (f *file) sizeLocked() (int64, os.FileInfo, error) {
	fi, err := f.f.Stat()
	if err != nil {
		return 0, nil, err
	}
	size := fi.Size()
	if c := f.h.fs.caches[f.key]; c != nil {
		for _, o := range c.ops {
			if o.trunc {
				size = o.off
			} else {
				size = max(size, o.off+int64(len(o.data)))
			}
		}
	}
	return size, fi, nil
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	f.h.fs.mu.Lock()
	defer f.h.fs.mu.Unlock()
	size, _, err := f.sizeLocked()
	if err != nil {
		return 0, err
	}
	if off >= size {
		return 0, io.EOF
	}
	buf := make([]byte, len(p))
	if _, err := f.f.ReadAt(buf, off); err != nil && err != io.EOF {
		return 0, err
	}
	if c := f.h.fs.caches[f.key]; c != nil {
		end := off + int64(len(buf))
		for _, o := range c.ops {
			if o.trunc {
				if o.off < end {
					clear(buf[max(o.off-off, 0):])
				}
				continue
			}
			lo, hi := max(o.off, off), min(o.off+int64(len(o.data)), end)
			if lo < hi {
				copy(buf[lo-off:hi-off], o.data[lo-o.off:hi-o.off])
			}
		}
	}
	n := int(min(int64(len(p)), size-off))
	copy(p, buf[:n])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// writeBackLocked applies the host's cached changes to the real file.
func (f *file) writeBackLocked() error {
	c := f.h.fs.caches[f.key]
	if c == nil {
		return nil
	}
	for _, o := range c.ops {
		var err error
		if o.trunc {
			err = f.f.Truncate(o.off)
		} else {
			_, err = f.f.WriteAt(o.data, o.off)
		}
		if err != nil {
			return err
		}
	}
	delete(f.h.fs.caches, f.key)
	return nil
}

func (f *file) Sync() error {
	f.h.fs.mu.Lock()
	defer f.h.fs.mu.Unlock()
	if st := f.h.fs.hosts[f.h.name]; st.crashed && !st.zombie {
		return &os.PathError{Op: "sync", Path: f.f.Name(), Err: ErrCrashed}
	}
	if err := f.writeBackLocked(); err != nil {
		return err
	}
	return f.f.Sync()
}

// Close writes the cached changes back (close-to-open), unless the host crashed.
func (f *file) Close() error {
	f.h.fs.mu.Lock()
	var err error
	if st := f.h.fs.hosts[f.h.name]; !st.crashed || st.zombie {
		err = f.writeBackLocked()
	}
	f.h.fs.mu.Unlock()
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (f *file) Stat() (os.FileInfo, error) {
	f.h.fs.mu.Lock()
	defer f.h.fs.mu.Unlock()
	size, fi, err := f.sizeLocked()
	if err != nil {
		return nil, err
	}
	return sizedInfo{FileInfo: fi, size: size}, nil
}

type sizedInfo struct {
	os.FileInfo
	size int64
}

func (i sizedInfo) Size() int64        { return i.size }
func (i sizedInfo) ModTime() time.Time { return i.FileInfo.ModTime() }
