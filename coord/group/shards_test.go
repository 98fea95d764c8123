package group

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// gatedStore holds LoadShard (the store's part of a shard load) until the test opens the gate,
// so "the shard is loading" is a state the test can observe instead of a race it must win.
type gatedStore struct {
	*storage.GroupStore
	gate atomic.Pointer[chan struct{}]
}

func (s *gatedStore) LoadShard(int, int32) error {
	if g := s.gate.Load(); g != nil {
		<-*g
	}
	return nil
}

func (s *gatedStore) ReleaseShard(int) error { return nil }

// newGatedHarness is newHarness with the coordinator over a gatedStore.
func newGatedHarness(t *testing.T) (*harness, *gatedStore) {
	h := newHarness(t)
	h.c.Close()
	gs := &gatedStore{GroupStore: h.store}
	h.c = New(h.cfg, gs, nil)
	return h, gs
}

// groupsInShard returns n group ids of shard.
func groupsInShard(shard, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("g-%d", i)
		if ShardFor(id) == shard {
			out = append(out, id)
		}
	}
	return out
}

func (h *harness) loadShard(n int, epoch int32) <-chan error {
	ch := make(chan error, 1)
	h.c.LoadShard(n, epoch, func(err error) { ch <- err })
	return ch
}

func (h *harness) releaseShard(n int) error {
	h.t.Helper()
	ch := make(chan error, 1)
	h.c.ReleaseShard(n, func(err error) { ch <- err })
	return recv(h.t, ch, "ReleaseShard")
}

func TestShardForMatchesFNV1a(t *testing.T) {
	// fnv1a32("") is the offset basis 2166136261; 2166136261 % 50 = 11.
	if got := ShardFor(""); got != 11 {
		t.Fatalf("ShardFor(\"\") = %d, want 11", got)
	}
	seen := map[int]bool{}
	for i := 0; i < 2000; i++ {
		s := ShardFor(fmt.Sprintf("group-%d", i))
		if s < 0 || s >= NumShards {
			t.Fatalf("shard %d out of range", s)
		}
		seen[s] = true
	}
	if len(seen) != NumShards {
		t.Fatalf("2000 groups hit %d shards, want all %d", len(seen), NumShards)
	}
}

// TestShardReleaseReloadKeepsAcknowledgedCommits releases and reloads a shard while members of
// several of its groups keep committing: every commit acknowledged NONE is what OffsetFetch
// answers after the reload, and meanwhile commits answer NOT_COORDINATOR (released) or
// COORDINATOR_LOAD_IN_PROGRESS (loading), never anything else.
func TestShardReleaseReloadKeepsAcknowledgedCommits(t *testing.T) {
	h, gs := newGatedHarness(t)
	const shard = 7
	groups := groupsInShard(shard, 4)
	other := groupsInShard(shard+1, 1)[0]

	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[string]int64{} // group → last offset acknowledged NONE
	seen := map[int16]int{}
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := int64(1); !stop.Load(); o++ {
				// The acknowledgement is recorded inside the callback, so once ReleaseShard has
				// returned every commit it let through is in acked.
				ch := make(chan struct{})
				h.c.CommitOffsets(Commit{Group: g, Generation: -1}, []storage.GroupOffset{off("t", 0, o)}, func(code int16) {
					mu.Lock()
					seen[code]++
					if code == codec.CodeNone {
						acked[g] = o
					}
					mu.Unlock()
					close(ch)
				})
				<-ch
			}
		}()
	}
	waitAcked := func(what string) {
		mu.Lock()
		base := seen[codec.CodeNone]
		mu.Unlock()
		poll(t, func() error {
			mu.Lock()
			defer mu.Unlock()
			if seen[codec.CodeNone] < base+20 {
				return fmt.Errorf("%s: only %d commits acknowledged", what, seen[codec.CodeNone]-base)
			}
			return nil
		})
	}
	waitCode := func(code int16) {
		poll(t, func() error {
			mu.Lock()
			defer mu.Unlock()
			if seen[code] == 0 {
				return fmt.Errorf("no commit answered %d yet (seen %v)", code, seen)
			}
			return nil
		})
	}
	waitAcked("before the release")

	if err := h.releaseShard(shard); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "serving after release", h.c.Serving(groups[0]), codec.CodeNotCoordinator)
	wantCode(t, "other shard after release", h.c.Serving(other), codec.CodeNone)
	code, _ := h.c.FetchOffsets(groups[0], nil, false)
	wantCode(t, "fetch after release", code, codec.CodeNotCoordinator)
	waitCode(codec.CodeNotCoordinator)
	mu.Lock()
	releasedAck := map[string]int64{}
	for g, o := range acked {
		releasedAck[g] = o
	}
	mu.Unlock()

	gate := make(chan struct{})
	gs.gate.Store(&gate)
	loaded := h.loadShard(shard, 3)
	poll(t, func() error {
		if c := h.c.Serving(groups[0]); c != codec.CodeCoordinatorLoadInProgress {
			return fmt.Errorf("serving %d while loading", c)
		}
		return nil
	})
	if !h.c.Loading() {
		t.Fatal("Loading() is false while a shard loads")
	}
	waitCode(codec.CodeCoordinatorLoadInProgress)
	mu.Lock()
	for g, o := range acked {
		if o != releasedAck[g] {
			t.Errorf("group %s: commit %d acknowledged while the shard was not served (last before release %d)", g, o, releasedAck[g])
		}
	}
	mu.Unlock()
	close(gate)
	if err := recv(t, loaded, "LoadShard"); err != nil {
		t.Fatal(err)
	}
	if e, ok := h.c.ShardEpoch(shard); !ok || e != 3 {
		t.Fatalf("ShardEpoch = %d, %v; want 3, true", e, ok)
	}
	waitAcked("after the reload")
	stop.Store(true)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	for code, n := range seen {
		switch code {
		case codec.CodeNone, codec.CodeNotCoordinator, codec.CodeCoordinatorLoadInProgress:
		default:
			t.Errorf("%d commits answered %d", n, code)
		}
	}
	for _, g := range groups {
		if got := h.fetch1(g, "t", 0, false); got.Offset != acked[g] {
			t.Errorf("group %s: fetched offset %d, last acknowledged %d", g, got.Offset, acked[g])
		}
	}
	// And after a restart from disk, the same.
	h.restart()
	for _, g := range groups {
		if got := h.fetch1(g, "t", 0, false); got.Offset != acked[g] {
			t.Errorf("group %s after restart: fetched offset %d, last acknowledged %d", g, got.Offset, acked[g])
		}
	}
}

// TestShardReleaseMembersRejoin: a release answers a parked JoinGroup NOT_COORDINATOR, later
// heartbeats NOT_COORDINATOR; the group was rebalancing, so after the reload it is
// PreparingRebalance with the member that had completed a join (not the new one whose join was
// parked), that member's heartbeat says REBALANCE_IN_PROGRESS and its rejoin starts the next
// generation. Staged transactional offsets survive the move and complete on the new load.
func TestShardReleaseMembersRejoin(t *testing.T) {
	h, _ := newGatedHarness(t)
	g := groupsInShard(3, 1)[0]
	member, gen := h.stableSingle(g)
	wantCode(t, "commit", h.commit(Commit{Group: g, Generation: gen, MemberID: member}, off("t", 0, 10)), codec.CodeNone)
	wantCode(t, "stage", h.txnCommit(simpleTxn(g, 42, 1), nil, off("t", 1, 77)), codec.CodeNone)
	// A second member's join parks (the group rebalances, waiting for the first to rejoin).
	parked := h.joinNew(g)
	noRecv(t, parked, "JoinGroup")

	if err := h.releaseShard(3); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "parked join after release", recv(t, parked, "JoinGroup").ErrorCode, codec.CodeNotCoordinator)
	wantCode(t, "heartbeat after release", h.heartbeat(g, member, gen, ""), codec.CodeNotCoordinator)
	wantCode(t, "join after release", h.join(g, "").ErrorCode, codec.CodeNotCoordinator)
	if err := h.completeTxn(g, 42, true); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("CompleteTxnOffsets on a released shard: %v, want ErrNotRunning", err)
	}
	for _, lg := range h.c.ListGroups(nil) {
		if lg.Group == g {
			t.Fatalf("released group %s still listed", g)
		}
	}

	if err := recv(t, h.loadShard(3, 1), "LoadShard"); err != nil {
		t.Fatal(err)
	}
	if d := h.describe(g); d.State != "PreparingRebalance" || len(d.Members) != 1 || d.Members[0].MemberID != member {
		t.Fatalf("reloaded group: state %s with members %+v, want PreparingRebalance with %s", d.State, d.Members, member)
	}
	wantCode(t, "heartbeat after reload", h.heartbeat(g, member, gen, ""), codec.CodeRebalanceInProgress)
	if got := h.fetch1(g, "t", 0, false); got.Offset != 10 {
		t.Fatalf("committed offset after reload %d, want 10", got.Offset)
	}
	wantCode(t, "require_stable on the staged partition", h.fetch1(g, "t", 1, true).Code, codec.CodeUnstableOffsetCommit)
	wantCode(t, "older epoch still fenced after reload", h.txnCommit(simpleTxn(g, 42, 0), nil, off("t", 1, 1)), codec.CodeInvalidProducerEpoch)
	if err := h.completeTxn(g, 42, true); err != nil {
		t.Fatal(err)
	}
	if got := h.fetch1(g, "t", 1, true); got.Offset != 77 {
		t.Fatalf("staged offset after reload and commit %d, want 77", got.Offset)
	}
	jr := recv(t, h.joinAsync(g, member), "rejoin")
	if jr.ErrorCode != codec.CodeNone || jr.Generation != gen+1 || jr.LeaderID != member {
		t.Fatalf("rejoin after reload: code %d generation %d leader %q, want generation %d led by %s",
			jr.ErrorCode, jr.Generation, jr.LeaderID, gen+1, member)
	}
}

func TestShardLoadReleaseTransitions(t *testing.T) {
	h, gs := newGatedHarness(t)
	if err := recv(t, h.loadShard(NumShards, 0), "LoadShard"); err == nil {
		t.Fatal("loading an out-of-range shard succeeded")
	}
	if err := recv(t, h.loadShard(5, 2), "LoadShard"); err != nil {
		t.Fatalf("re-loading a loaded shard at a newer epoch: %v", err)
	}
	if err := recv(t, h.loadShard(5, 1), "LoadShard"); err == nil {
		t.Fatal("loading at an older epoch than the loaded one succeeded")
	}
	if err := h.releaseShard(5); err != nil {
		t.Fatal(err)
	}
	if err := h.releaseShard(5); err != nil {
		t.Fatalf("releasing an unowned shard: %v", err)
	}
	gate := make(chan struct{})
	gs.gate.Store(&gate)
	loaded := h.loadShard(5, 3)
	poll(t, func() error {
		if !h.c.Loading() {
			return errors.New("shard not loading yet")
		}
		return nil
	})
	if err := h.releaseShard(5); !errors.Is(err, ErrShardBusy) {
		t.Fatalf("release while loading: %v, want ErrShardBusy", err)
	}
	close(gate)
	if err := recv(t, loaded, "LoadShard"); err != nil {
		t.Fatal(err)
	}
	// A coordinator built for cluster mode serves nothing until told to.
	c := New(Config{ShardsUnowned: true, MaxSessionTimeout: 1}, gs, nil)
	defer c.Close()
	wantCode(t, "unowned shard", c.Serving("g"), codec.CodeNotCoordinator)
}

// TestOversizedIDsInvalidRequest guards the 32767-byte cap on group, member and instance ids
// (Apache reads them as int16-length strings): longer answers INVALID_REQUEST and stores
// nothing; exactly 32767 is accepted.
func TestOversizedIDsInvalidRequest(t *testing.T) {
	h := newHarness(t)
	long := strings.Repeat("x", MaxIDBytes+1)
	maxID := strings.Repeat("y", MaxIDBytes)

	wantCode(t, "join long group", h.join(long, "").ErrorCode, codec.CodeInvalidRequest)
	wantCode(t, "join long member", h.join("g", long).ErrorCode, codec.CodeInvalidRequest)
	wantCode(t, "join long instance", h.join("g", "", withInstance(long)).ErrorCode, codec.CodeInvalidRequest)
	wantCode(t, "join max-length group", h.join(maxID, "").ErrorCode, codec.CodeMemberIDRequired)

	wantCode(t, "sync", recv(t, h.syncAsync(long, "m", 1, "", nil), "SyncGroup").ErrorCode, codec.CodeInvalidRequest)
	wantCode(t, "sync long instance", recv(t, h.syncAsync("g", "m", 1, long, nil), "SyncGroup").ErrorCode, codec.CodeInvalidRequest)
	wantCode(t, "heartbeat", h.heartbeat("g", long, 1, ""), codec.CodeInvalidRequest)
	wantCode(t, "leave v0", h.leave(0, "g", long).ErrorCode, codec.CodeInvalidRequest)
	wantCode(t, "leave v3", h.leave(3, "g", "ok", long).ErrorCode, codec.CodeInvalidRequest)
	wantCode(t, "commit long group", h.commit(Commit{Group: long, Generation: -1}, off("t", 0, 1)), codec.CodeInvalidRequest)
	wantCode(t, "commit long member", h.commit(Commit{Group: "g", Generation: 1, MemberID: long}, off("t", 0, 1)), codec.CodeInvalidRequest)
	code, _ := h.c.FetchOffsets(long, nil, false)
	wantCode(t, "fetch", code, codec.CodeInvalidRequest)
	wantCode(t, "txn commit", h.txnCommit(simpleTxn(long, 1, 0), nil, off("t", 0, 1)), codec.CodeInvalidRequest)
	del := make(chan int16, 1)
	h.c.DeleteGroup(long, func(c int16) { del <- c })
	wantCode(t, "delete group", recv(t, del, "DeleteGroups"), codec.CodeInvalidRequest)
	odel := make(chan int16, 1)
	h.c.DeleteOffsets(long, []storage.GroupPartition{gp("t", 0)}, func(c int16, _ []int16) { odel <- c })
	wantCode(t, "offset delete", recv(t, odel, "OffsetDelete"), codec.CodeInvalidRequest)
	wantCode(t, "describe", h.describe(long).ErrorCode, codec.CodeInvalidRequest)
	if h.store.HasGroup(long) {
		t.Fatal("a group with an oversized id reached the store")
	}
}

// TestGroupQueueFullAnswersCoordinatorNotAvailable: a group whose mailbox is full answers new
// requests COORDINATOR_NOT_AVAILABLE and counts them; timers and callbacks still get through.
func TestGroupQueueFullAnswersCoordinatorNotAvailable(t *testing.T) {
	h := newHarness(t)
	member, gen := h.stableSingle("g")
	h.c.mu.Lock()
	g := h.c.groups["g"]
	h.c.mu.Unlock()
	release := make(chan struct{})
	g.do(func() { <-release }) // hold the group's goroutine
	for g.tryDo(func() {}) {
	}
	if n := g.mbox.Len(); n != maxGroupQueue {
		t.Fatalf("queue holds %d, want %d", n, maxGroupQueue)
	}
	ch := make(chan *kmsg.HeartbeatResponse, 1)
	r := kmsg.NewPtrHeartbeatRequest()
	r.Version, r.Group, r.MemberID, r.Generation = 4, "g", member, gen
	h.c.Heartbeat(r, func(resp *kmsg.HeartbeatResponse) { ch <- resp })
	wantCode(t, "heartbeat on a full queue", recv(t, ch, "Heartbeat").ErrorCode, codec.CodeCoordinatorNotAvailable)
	wantCode(t, "commit on a full queue", func() int16 {
		c := make(chan int16, 1)
		h.c.CommitOffsets(Commit{Group: "g", Generation: gen, MemberID: member}, []storage.GroupOffset{off("t", 0, 1)}, func(code int16) { c <- code })
		return recv(t, c, "OffsetCommit")
	}(), codec.CodeCoordinatorNotAvailable)
	close(release)
	poll(t, func() error {
		if n := g.mbox.Len(); n != 0 {
			return fmt.Errorf("%d items still queued", n)
		}
		return nil
	})
	wantCode(t, "heartbeat after the queue drained", h.heartbeat("g", member, gen, ""), codec.CodeNone)
}

func TestStoreBusyAnswersCoordinatorNotAvailable(t *testing.T) {
	wantCode(t, "store queue full", storeErrorCode(fmt.Errorf("wrapped: %w", storage.ErrGroupStoreBusy)), codec.CodeCoordinatorNotAvailable)
	wantCode(t, "store failure", storeErrorCode(errors.New("EIO")), codec.CodeNotCoordinator)
	wantCode(t, "success", storeErrorCode(nil), codec.CodeNone)
}
