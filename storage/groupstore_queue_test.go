package storage

import (
	"errors"
	"sync"
	"testing"
)

// TestGroupStoreQueueFullIsBusy guards the bound on queued offset writes: while the writer is
// held, gsMaxQueuedOps writes queue, the next is refused with ErrGroupStoreBusy without touching
// the disk, and every queued write is acknowledged once the writer moves again.
func TestGroupStoreQueueFullIsBusy(t *testing.T) {
	s := gsOpen(t, t.TempDir())
	defer s.Close()
	hold := make(chan struct{})
	held := make(chan struct{})
	// The writer acknowledges on its own goroutine, so a blocking callback holds it.
	s.CommitAsync("g", []GroupOffset{{Topic: "t", Offset: 1}}, func(err error) {
		close(held)
		<-hold
	})
	<-held
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []error
	wg.Add(gsMaxQueuedOps)
	for i := 0; i < gsMaxQueuedOps; i++ {
		s.CommitAsync("g", []GroupOffset{{Topic: "t", Offset: int64(i + 2)}}, func(err error) {
			if err != nil {
				mu.Lock()
				failed = append(failed, err)
				mu.Unlock()
			}
			wg.Done()
		})
	}
	busy := make(chan error, 1)
	s.CommitAsync("g", []GroupOffset{{Topic: "t", Offset: -5}}, func(err error) { busy <- err })
	if err := <-busy; !errors.Is(err, ErrGroupStoreBusy) {
		t.Fatalf("write past the bound: %v, want ErrGroupStoreBusy", err)
	}
	close(hold)
	wg.Wait()
	if len(failed) != 0 {
		t.Fatalf("%d queued writes failed, first: %v", len(failed), failed[0])
	}
	if o, _ := s.Offset("g", "t", 0); o.Offset != gsMaxQueuedOps+1 {
		t.Fatalf("offset %d after the queue drained, want %d", o.Offset, gsMaxQueuedOps+1)
	}
}
