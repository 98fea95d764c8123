package crashfs

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func readVia(t *testing.T, h *Host, path string) []byte {
	t.Helper()
	f, err := h.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, fi.Size())
	if n, err := f.ReadAt(buf, 0); err != nil && err != io.EOF || int64(n) != fi.Size() {
		t.Fatalf("read %d of %d: %v", n, fi.Size(), err)
	}
	return buf
}

func TestUnsyncedWritesAreVisibleOnlyToTheirHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	fs := New()
	a, b := fs.Host("a"), fs.Host("b")
	f, err := a.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if got := readVia(t, a, path); string(got) != "hello" {
		t.Fatalf("writer sees %q", got)
	}
	if got := readVia(t, b, path); len(got) != 0 {
		t.Fatalf("other host sees unsynced %q", got)
	}
	if got, _ := os.ReadFile(path); len(got) != 0 {
		t.Fatalf("the volume holds unsynced %q", got)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := readVia(t, b, path); string(got) != "hello" {
		t.Fatalf("other host after sync sees %q", got)
	}
	// A cached truncation and a write past it: zeros in between, the old bytes gone.
	if err := f.Truncate(2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("!"), 4); err != nil {
		t.Fatal(err)
	}
	if got := readVia(t, a, path); !bytes.Equal(got, []byte("he\x00\x00!")) {
		t.Fatalf("writer sees %q", got)
	}
	if got := readVia(t, b, path); string(got) != "hello" {
		t.Fatalf("other host sees %q before the close", got)
	}
	if err := f.Close(); err != nil { // close-to-open: close writes back
		t.Fatal(err)
	}
	if got := readVia(t, b, path); !bytes.Equal(got, []byte("he\x00\x00!")) {
		t.Fatalf("other host after close sees %q", got)
	}
}

func TestCrashDropsUnsyncedAndZombieWritesBack(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	fs := New()
	a := fs.Host("a")
	f, err := a.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("durable"), 0)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("-lost"), 7)
	if fs.Unsynced("a") != 5 {
		t.Fatalf("unsynced %d", fs.Unsynced("a"))
	}
	fs.Crash("a")
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, ErrCrashed) {
		t.Fatalf("write after crash: %v", err)
	}
	if err := f.Sync(); !errors.Is(err, ErrCrashed) {
		t.Fatalf("sync after crash: %v", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "durable" {
		t.Fatalf("after crash the file holds %q", got)
	}
	// Renamed while open: the cache follows the file, not the name.
	moved := filepath.Join(dir, "g")
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	fs.Zombie("a")
	if _, err := f.WriteAt([]byte("+late"), 7); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(moved); string(got) != "durable+late" {
		t.Fatalf("zombie write-back: %q", got)
	}
	f.Close()
	ro, err := fs.Host("b").OpenFile(moved, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("write through a read-only handle succeeded")
	}
}
