// Package mailbox is the one bounded work queue of kaas: a FIFO drained by at most one goroutine
// at a time, which exists only while the queue has work. A group, a connection's executor or a
// store writer each own one; an idle owner costs no goroutine.
//
//	producers ── TryPush (bounded: false when full, counted) ──┐
//	          └─ Push    (continuations of admitted work) ──────┤
//	                                                            ▼
//	                                  items ──(one drainer goroutine, started on the
//	                                           first push into an empty, idle queue)──▶ handler
//
// Why two push calls: a bound only helps where the caller can answer "busy". Work that enters
// from outside (a request) uses TryPush and maps false to a Kafka error or a closed connection.
// A continuation of work already admitted (a timer firing, an fsync callback coming back to the
// owner) must not be lost, or the owner's state machine stops; Push accepts it even past the
// bound. Continuations are bounded by the admitted work that spawned them, so the queue stays
// bounded as a whole.
//
// Metrics: every queue with the same name shares kaas_queue_rejected_total{queue="<name>"} (items
// TryPush refused) and kaas_queue_depth{queue="<name>"} (items queued now, summed over the
// queues of that name).
//
// Ordering: items are handed to the handler in push order; the handler is never called
// concurrently with itself for one queue, and everything a handler wrote is visible to the next
// call (the queue's mutex orders them), so the owner's state needs no lock of its own.
package mailbox

import (
	"fmt"
	"sync"

	"github.com/VictoriaMetrics/metrics"
)

// Config sizes a queue.
type Config[T any] struct {
	// Name labels the queue's metrics; queues of one kind share a name ("group", "conn").
	Name string
	// MaxLen bounds the items TryPush admits; <= 0 means no length bound.
	MaxLen int
	// MaxBytes bounds the sum of Size over queued items for TryPush; <= 0 (or a nil Size) means
	// no byte bound. An item larger than MaxBytes is still admitted into an empty queue, so one
	// oversized item cannot starve forever.
	MaxBytes int64
	// Size reports an item's size for MaxBytes.
	Size func(T) int64
	// Batch makes the drainer hand everything queued to the handler at once (a store writer
	// that writes one frame per batch); otherwise items are handed one at a time.
	Batch bool
}

// Queue is a bounded FIFO with an on-demand drainer. Build it with New.
type Queue[T any] struct {
	cfg    Config[T]
	handle func([]T)

	rejected *metrics.Counter
	depth    *metrics.Gauge

	mu      sync.Mutex
	items   []T
	bytes   int64
	running bool
	idle    *sync.Cond // signalled when the drainer exits; lazily built by Wait

	one [1]T // the drainer's single-item batch (one drainer at a time, so no allocation per drain)
}

// New builds a queue whose drainer calls handle. Without Config.Batch, the slice holds exactly
// one item. handle must not keep the slice.
func New[T any](cfg Config[T], handle func(batch []T)) *Queue[T] {
	if cfg.Name == "" {
		panic("BUG: mailbox without a name")
	}
	m := metricsFor(cfg.Name)
	return &Queue[T]{cfg: cfg, handle: handle, rejected: m.rejected, depth: m.depth}
}

type queueMetrics struct {
	rejected *metrics.Counter
	depth    *metrics.Gauge
}

var byName sync.Map // queue name → *queueMetrics; queues are created per group and connection

func metricsFor(name string) *queueMetrics {
	if m, ok := byName.Load(name); ok {
		return m.(*queueMetrics)
	}
	m, _ := byName.LoadOrStore(name, &queueMetrics{
		rejected: metrics.GetOrCreateCounter(fmt.Sprintf(`kaas_queue_rejected_total{queue=%q}`, name)),
		depth:    metrics.GetOrCreateGauge(fmt.Sprintf(`kaas_queue_depth{queue=%q}`, name), nil),
	})
	return m.(*queueMetrics)
}

// TryPush queues v unless the queue is at its bound; false (counted in
// kaas_queue_rejected_total) means v was not queued and the caller must answer for it.
func (q *Queue[T]) TryPush(v T) bool {
	return q.push(v, true)
}

// Push queues v regardless of the bound. Use it only for continuations of admitted work.
func (q *Queue[T]) Push(v T) {
	q.push(v, false)
}

func (q *Queue[T]) push(v T, bounded bool) bool {
	var sz int64
	if q.cfg.Size != nil {
		sz = q.cfg.Size(v)
	}
	q.mu.Lock()
	if bounded && q.full(sz) {
		q.mu.Unlock()
		q.rejected.Inc()
		return false
	}
	q.items = append(q.items, v)
	q.bytes += sz
	start := !q.running
	q.running = true
	q.mu.Unlock()
	q.depth.Inc()
	if start {
		go q.drain()
	}
	return true
}

func (q *Queue[T]) full(sz int64) bool {
	n := len(q.items)
	if q.cfg.MaxLen > 0 && n >= q.cfg.MaxLen {
		return true
	}
	return q.cfg.MaxBytes > 0 && q.cfg.Size != nil && n > 0 && q.bytes+sz > q.cfg.MaxBytes
}

// Len is the number of queued items (not counting what the handler is running now).
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// Wait blocks until the queue is empty and no drainer runs. Items pushed meanwhile are drained
// first; a handler must not call Wait on its own queue.
func (q *Queue[T]) Wait() {
	q.mu.Lock()
	for q.running {
		if q.idle == nil {
			q.idle = sync.NewCond(&q.mu)
		}
		q.idle.Wait()
	}
	q.mu.Unlock()
}

func (q *Queue[T]) drain() {
	for {
		q.mu.Lock()
		if len(q.items) == 0 {
			q.running = false
			if cap(q.items) > 64 {
				q.items = nil // let a burst's backing array go
			} else {
				q.items = q.items[:0]
			}
			if q.idle != nil {
				q.idle.Broadcast()
			}
			q.mu.Unlock()
			return
		}
		var batch []T
		if q.cfg.Batch {
			batch = q.items
			q.items = nil
			q.bytes = 0
		} else {
			q.one[0] = q.items[0]
			var zero T
			q.items[0] = zero
			q.items = q.items[1:]
			if q.cfg.Size != nil {
				q.bytes -= q.cfg.Size(q.one[0])
			}
			batch = q.one[:]
		}
		q.mu.Unlock()
		q.depth.Add(-float64(len(batch)))
		q.handle(batch)
		if !q.cfg.Batch {
			var zero T
			q.one[0] = zero
		}
	}
}
