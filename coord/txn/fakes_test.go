package txn

import (
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeParts is the test PartitionWriter and GroupCompleter. Fences are applied at once. Marker
// writes and group completions are held (queued on calls / groups for the test to answer) unless
// auto is set, in which case they are answered at once with markerCode / groupErr.
type fakeParts struct {
	fences chan FenceRequest
	calls  chan *markerCall
	groups chan *groupCall

	autoMarkers atomic.Bool
	autoGroups  atomic.Bool
	markerCode  atomic.Int32
	groupErr    atomic.Pointer[error]

	mu        sync.Mutex
	written   []MarkerRequest // every marker answered NONE in auto mode
	nCalls    int             // WriteMarkers calls
	completed []groupCall     // every group completion answered in auto mode
}

type markerCall struct {
	reqs []MarkerRequest
	done func([]MarkerResult)
}

// answer answers every marker of the call with code.
func (m *markerCall) answer(code int16) {
	res := make([]MarkerResult, len(m.reqs))
	for i := range res {
		res[i].Code = code
	}
	m.done(res)
}

type groupCall struct {
	group  string
	pid    int64
	epoch  int16
	commit bool
	done   func(error)
}

func newFakeParts() *fakeParts {
	return &fakeParts{fences: make(chan FenceRequest, 1<<14), calls: make(chan *markerCall, 1<<14), groups: make(chan *groupCall, 1<<14)}
}

func (f *fakeParts) Fence(batch []FenceRequest, done func(error)) {
	for _, fr := range batch {
		select {
		case f.fences <- fr:
		default:
		}
	}
	done(nil)
}

func (f *fakeParts) WriteMarkers(batch []MarkerRequest, done func([]MarkerResult)) {
	f.mu.Lock()
	f.nCalls++
	f.mu.Unlock()
	c := &markerCall{reqs: batch, done: done}
	if !f.autoMarkers.Load() {
		f.calls <- c
		return
	}
	code := int16(f.markerCode.Load())
	if code == 0 {
		f.mu.Lock()
		f.written = append(f.written, batch...)
		f.mu.Unlock()
	}
	c.answer(code)
}

func (f *fakeParts) CompleteTxnOffsets(group string, pid int64, epoch int16, commit bool, done func(error)) {
	g := &groupCall{group: group, pid: pid, epoch: epoch, commit: commit, done: done}
	if !f.autoGroups.Load() {
		f.groups <- g
		return
	}
	var err error
	if p := f.groupErr.Load(); p != nil {
		err = *p
	}
	if err == nil {
		f.mu.Lock()
		f.completed = append(f.completed, *g)
		f.mu.Unlock()
	}
	done(err)
}

// calls0 is the number of WriteMarkers calls so far.
func (f *fakeParts) calls0() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nCalls
}

// auto answers everything at once: markers NONE, groups nil.
func (f *fakeParts) auto() {
	f.autoMarkers.Store(true)
	f.autoGroups.Store(true)
}

func (f *fakeParts) writtenMarkers() []MarkerRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]MarkerRequest(nil), f.written...)
}

// nextCall waits for the next held marker write.
func (f *fakeParts) nextCall(t testing.TB) *markerCall {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no marker write")
		return nil
	}
}

// nextGroup waits for the next held group completion.
func (f *fakeParts) nextGroup(t testing.TB) *groupCall {
	t.Helper()
	select {
	case g := <-f.groups:
		return g
	case <-time.After(5 * time.Second):
		t.Fatal("no group completion")
		return nil
	}
}

// barrier returns once every worker has processed everything queued before it (and dispatched
// the sagas that started).
func (tc *testCoord) barrier(t testing.TB) {
	t.Helper()
	var wg sync.WaitGroup
	for _, w := range tc.workers {
		wg.Add(1)
		tc.enqueue(&op{slot: w.id, internal: true, done: func(any, error) { wg.Done() }, ctl: func(*worker) { wg.Done() }})
	}
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("workers did not reach the barrier")
	}
}

// heldActions drains the held marker writes queued so far (keeping them in tc.held to be
// answered) and reassembles one Action per transactional.id from them and the fences seen.
func (tc *testCoord) heldActions() []Action {
	fences := map[int64]FenceRequest{}
	for {
		select {
		case fr := <-tc.parts.fences:
			fences[fr.ProducerID] = fr
			continue
		default:
		}
		break
	}
	byID := map[string]*Action{}
	for {
		var c *markerCall
		select {
		case c = <-tc.parts.calls:
		default:
		}
		if c == nil {
			break
		}
		tc.held = append(tc.held, c)
		for _, r := range c.reqs {
			a := byID[r.TransactionalID]
			if a == nil {
				a = &Action{TransactionalID: r.TransactionalID, Markers: &Markers{TransactionalID: r.TransactionalID,
					ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch, Commit: r.Commit,
					CoordinatorEpoch: r.CoordinatorEpoch, TxnVersion: r.TxnVersion}}
				if fr, ok := fences[r.ProducerID]; ok {
					a.Fence = &Fence{ProducerID: fr.ProducerID, OldEpoch: NoProducerEpoch, NewEpoch: fr.Epoch}
				}
				byID[r.TransactionalID] = a
			}
			m := a.Markers
			if n := len(m.Partitions); n > 0 && m.Partitions[n-1].Topic == r.Topic {
				m.Partitions[n-1].Partitions = append(m.Partitions[n-1].Partitions, r.Partition)
			} else {
				m.Partitions = append(m.Partitions, TopicPartitions{Topic: r.Topic, Partitions: []int32{r.Partition}})
			}
		}
	}
	out := make([]Action, 0, len(byID))
	for _, a := range byID {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TransactionalID < out[j].TransactionalID })
	return out
}
