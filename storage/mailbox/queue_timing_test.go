package mailbox

import (
	"sync"
	"testing"
)

// handRolled is the mailbox loop the Queue replaced (group.do, the connection executor): a
// mutex-guarded slice and a goroutine started on the first push into an idle queue.
type handRolled struct {
	mu      sync.Mutex
	queue   []func()
	running bool
}

func (h *handRolled) do(fn func()) {
	h.mu.Lock()
	h.queue = append(h.queue, fn)
	start := !h.running
	h.running = true
	h.mu.Unlock()
	if start {
		go h.run()
	}
}

func (h *handRolled) run() {
	for {
		h.mu.Lock()
		if len(h.queue) == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		fn := h.queue[0]
		h.queue[0] = nil
		h.queue = h.queue[1:]
		h.mu.Unlock()
		fn()
	}
}

// BenchmarkMailbox pushes b.N closures from one producer and waits for the last; "burst" keeps
// the drainer busy (one goroutine for many items), "pingpong" waits for each item (a goroutine
// start per item, the idle-group case).
func BenchmarkMailbox(b *testing.B) {
	b.Run("queue/burst", func(b *testing.B) {
		q := New(Config[func()]{Name: "bench", MaxLen: 1 << 30}, func(fs []func()) { fs[0]() })
		var wg sync.WaitGroup
		fn := func() { wg.Done() }
		b.ReportAllocs()
		wg.Add(b.N)
		for i := 0; i < b.N; i++ {
			q.TryPush(fn)
		}
		wg.Wait()
	})
	b.Run("handrolled/burst", func(b *testing.B) {
		h := &handRolled{}
		var wg sync.WaitGroup
		fn := func() { wg.Done() }
		b.ReportAllocs()
		wg.Add(b.N)
		for i := 0; i < b.N; i++ {
			h.do(fn)
		}
		wg.Wait()
	})
	b.Run("queue/pingpong", func(b *testing.B) {
		q := New(Config[func()]{Name: "bench", MaxLen: 1 << 30}, func(fs []func()) { fs[0]() })
		done := make(chan struct{})
		fn := func() { done <- struct{}{} }
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			q.TryPush(fn)
			<-done
		}
	})
	b.Run("handrolled/pingpong", func(b *testing.B) {
		h := &handRolled{}
		done := make(chan struct{})
		fn := func() { done <- struct{}{} }
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			h.do(fn)
			<-done
		}
	})
}
