package storage

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestPIDAllocator(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenPIDAllocator(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := a.Next()
	if first != 1<<40 {
		t.Fatalf("first pid %d", first)
	}
	last := first
	for i := 0; i < 2500; i++ { // crosses two block boundaries
		pid, err := a.Next()
		if err != nil || pid != last+1 {
			t.Fatalf("pid %d after %d: %v", pid, last, err)
		}
		last = pid
	}
	// Reopen (as after a crash): never reuses, skips to a fresh block past the persisted mark.
	a, err = OpenPIDAllocator(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := a.Next()
	if pid <= last || (pid-(1<<40))%pidBlockSize != 0 {
		t.Fatalf("after reopen pid %d, last was %d", pid, last)
	}
	// Another broker has its own range.
	b, err := OpenPIDAllocator(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if pid, _ := b.Next(); pid != 4<<40 {
		t.Fatalf("broker 3 pid %d", pid)
	}
	// Concurrent Next calls are unique.
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				pid, err := a.Next()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[pid] {
					t.Errorf("duplicate pid %d", pid)
				}
				seen[pid] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != 3200 {
		t.Fatalf("%d unique pids", len(seen))
	}
}

func TestPIDAllocatorCorruptFileRefuses(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "producer_ids", "broker-1.json")
	os.MkdirAll(filepath.Dir(path), 0o755)
	for _, content := range []string{"{not json", `{"nextBlock":-5}`, ""} {
		os.WriteFile(path, []byte(content), 0o644)
		if _, err := OpenPIDAllocator(dir, 1); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("content %q: %v", content, err)
		}
	}
}

func TestPIDAllocatorPersistFailure(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenPIDAllocator(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < pidBlockSize; i++ {
		if _, err := a.Next(); err != nil {
			t.Fatal(err)
		}
	}
	// Make the directory unwritable by replacing it with a file: the next block cannot be
	// persisted, so no pid may be handed out.
	pdir := filepath.Join(dir, "producer_ids")
	os.RemoveAll(pdir)
	os.WriteFile(pdir, []byte("x"), 0o644)
	if pid, err := a.Next(); err == nil {
		t.Fatalf("handed out unpersisted pid %d", pid)
	}
}
