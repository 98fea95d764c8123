package mailbox

import (
	"sync"
	"testing"
	"time"
)

// taken returns a channel and a function for a handler to call when it has taken items: the
// first call closes the channel, so a test waits on the drainer's progress with no polling.
func taken() (<-chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	return ch, func() { once.Do(func() { close(ch) }) }
}

// await waits for ch with a deadline.
func await(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestQueueRunsInOrderOneAtATime(t *testing.T) {
	var mu sync.Mutex
	var got []int
	running := 0
	maxRunning := 0
	q := New(Config[int]{Name: "test_order"}, func(b []int) {
		mu.Lock()
		running++
		if running > maxRunning {
			maxRunning = running
		}
		if len(b) != 1 {
			t.Errorf("non-batch handler got %d items", len(b))
		}
		got = append(got, b...)
		mu.Unlock()
		mu.Lock()
		running--
		mu.Unlock()
	})
	for i := 0; i < 1000; i++ {
		q.Push(i)
	}
	q.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1000 || maxRunning != 1 {
		t.Fatalf("got %d items, max concurrent handlers %d; want 1000 and 1", len(got), maxRunning)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("item %d is %d: order broken", i, v)
		}
	}
}

func TestQueueTryPushRejectsWhenFullAndCounts(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	q := New(Config[int]{Name: "test_full", MaxLen: 2}, func([]int) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
	})
	if !q.TryPush(0) {
		t.Fatal("first push refused")
	}
	<-started // the drainer holds item 0; the queue itself is empty again
	if !q.TryPush(1) || !q.TryPush(2) {
		t.Fatal("pushes under the bound refused")
	}
	before := q.rejected.Get()
	if q.TryPush(3) {
		t.Fatal("push past MaxLen admitted")
	}
	if got := q.rejected.Get() - before; got != 1 {
		t.Fatalf("rejected counter moved by %d, want 1", got)
	}
	if q.depth.Get() < 2 {
		t.Fatalf("depth gauge %v, want >= 2", q.depth.Get())
	}
	q.Push(4) // continuations pass the bound
	if q.Len() != 3 {
		t.Fatalf("Len %d, want 3", q.Len())
	}
	close(release)
	q.Wait()
	if q.Len() != 0 {
		t.Fatalf("Len %d after Wait", q.Len())
	}
}

func TestQueueByteBound(t *testing.T) {
	release := make(chan struct{})
	started, took := taken()
	q := New(Config[[]byte]{Name: "test_bytes", MaxBytes: 10, Size: func(b []byte) int64 { return int64(len(b)) }},
		func([][]byte) { took(); <-release })
	q.Push([]byte("x")) // occupies the drainer
	await(t, "drainer to take the first item", started)
	if !q.TryPush(make([]byte, 64)) {
		t.Fatal("an oversized item must be admitted into an empty queue")
	}
	if q.TryPush([]byte("y")) {
		t.Fatal("push past MaxBytes admitted")
	}
	close(release)
	q.Wait()
	if !q.TryPush(make([]byte, 8)) || !q.TryPush([]byte("zz")) {
		t.Fatal("pushes within MaxBytes refused after the queue drained")
	}
	q.Wait()
}

func TestQueueBatchHandsEverythingQueued(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	started, took := taken()
	q := New(Config[int]{Name: "test_batch", Batch: true}, func(b []int) {
		took()
		mu.Lock()
		sizes = append(sizes, len(b))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-release
		}
	})
	q.Push(0)
	await(t, "drainer to take the first batch", started)
	for i := 1; i <= 5; i++ {
		q.Push(i)
	}
	close(release)
	q.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 2 || sizes[0] != 1 || sizes[1] != 5 {
		t.Fatalf("batch sizes %v, want [1 5]", sizes)
	}
}

// TestQueueIdleHasNoGoroutine guards the property the owners rely on: an idle queue holds no
// goroutine, and a push into it starts exactly one.
func TestQueueIdleHasNoGoroutine(t *testing.T) {
	q := New(Config[int]{Name: "test_idle"}, func([]int) {})
	q.Push(1)
	q.Wait()
	q.mu.Lock()
	running := q.running
	q.mu.Unlock()
	if running {
		t.Fatal("drainer still marked running after the queue drained")
	}
}
