package group

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// stablePair makes a Stable group of two members with assignments "a-<leader>" / "a-<follower>"
// and returns (leader, follower, generation).
func (h *harness) stablePair(group string) (string, string, int32) {
	h.t.Helper()
	c1, c2 := h.joinNew(group), h.joinNew(group)
	j1, j2 := recv(h.t, c1, "JoinGroup"), recv(h.t, c2, "JoinGroup")
	wantCode(h.t, "join 1", j1.ErrorCode, 0)
	wantCode(h.t, "join 2", j2.ErrorCode, 0)
	if j1.Generation != j2.Generation {
		h.t.Fatalf("generations %d and %d", j1.Generation, j2.Generation)
	}
	leader, follower := j1.MemberID, j2.MemberID
	if j1.LeaderID != leader {
		leader, follower = follower, leader
	}
	fs := h.syncAsync(group, follower, j1.Generation, "", nil)
	assign := map[string][]byte{leader: []byte("a-" + leader), follower: []byte("a-" + follower)}
	wantCode(h.t, "leader sync", h.sync(group, leader, j1.Generation, assign).ErrorCode, 0)
	wantCode(h.t, "follower sync", recv(h.t, fs, "SyncGroup").ErrorCode, 0)
	return leader, follower, j1.Generation
}

// wantStable checks that group is Stable with exactly the two members and their assignments.
func wantStablePair(t *testing.T, h *harness, group, leader, follower string) {
	t.Helper()
	d := h.describe(group)
	if d.State != "Stable" || d.Protocol != "range" || len(d.Members) != 2 {
		t.Fatalf("group %s: state %s protocol %q with %d members, want Stable/range with 2", group, d.State, d.Protocol, len(d.Members))
	}
	for _, m := range d.Members {
		if (m.MemberID != leader && m.MemberID != follower) || !bytes.Equal(m.MemberAssignment, []byte("a-"+m.MemberID)) ||
			m.ClientID != "client" || m.ClientHost != "/127.0.0.1" || !bytes.Equal(m.ProtocolMetadata, []byte("meta-range")) {
			t.Fatalf("group %s: member %+v", group, m)
		}
	}
}

// TestRestartKeepsStableGroup: a broker restart brings a Stable group back Stable at the same
// generation, leader, members and assignments: heartbeats, commits and a follower's SyncGroup at
// that generation succeed and nothing rebalances.
func TestRestartKeepsStableGroup(t *testing.T) {
	h := newHarness(t)
	leader, follower, gen := h.stablePair("g")
	h.restart()
	rebalances := mRebalances.Get()
	wantStablePair(t, h, "g", leader, follower)
	wantCode(t, "leader heartbeat", h.heartbeat("g", leader, gen, ""), codec.CodeNone)
	wantCode(t, "follower heartbeat", h.heartbeat("g", follower, gen, ""), codec.CodeNone)
	wantCode(t, "commit at the generation", h.commit(Commit{Group: "g", Generation: gen, MemberID: follower}, off("t", 0, 5)), codec.CodeNone)
	sr := h.sync("g", follower, gen, nil)
	if sr.ErrorCode != 0 || string(sr.MemberAssignment) != "a-"+follower {
		t.Fatalf("follower SyncGroup after restart: code %d assignment %q", sr.ErrorCode, sr.MemberAssignment)
	}
	wantCode(t, "older generation", h.heartbeat("g", leader, gen-1, ""), codec.CodeIllegalGeneration)
	if got := mRebalances.Get(); got != rebalances {
		t.Fatalf("%d rebalances after the restart", got-rebalances)
	}
	// A restarted broker keeps the group's leader: a rejoin of the leader rebalances as usual
	// and the generation continues from the persisted one.
	jc, fc := h.joinAsync("g", leader), h.joinAsync("g", follower)
	jr, fj := recv(t, jc, "leader rejoin"), recv(t, fc, "follower rejoin")
	if jr.ErrorCode != 0 || jr.Generation != gen+1 || jr.LeaderID != leader || fj.Generation != gen+1 {
		t.Fatalf("rejoin after restart: %+v / %+v, want generation %d led by %s", jr, fj, gen+1, leader)
	}
}

// TestRestartAfterLeaveRebalances: a member's leave is persisted with the remaining members; after
// a restart the group is rebalancing, so the remaining member is told to rejoin rather than
// served a generation whose assignment lost a member.
func TestRestartAfterLeaveRebalances(t *testing.T) {
	h := newHarness(t)
	leader, follower, gen := h.stablePair("g")
	if r := h.leave(3, "g", follower); r.ErrorCode != 0 || r.Members[0].ErrorCode != 0 {
		t.Fatalf("leave: %+v", r)
	}
	h.restart()
	d := h.describe("g")
	if d.State != "PreparingRebalance" || len(d.Members) != 1 || d.Members[0].MemberID != leader {
		t.Fatalf("after restart: state %s members %+v, want PreparingRebalance with %s", d.State, d.Members, leader)
	}
	wantCode(t, "leader heartbeat", h.heartbeat("g", leader, gen, ""), codec.CodeRebalanceInProgress)
	wantCode(t, "the member that left", h.heartbeat("g", follower, gen, ""), codec.CodeUnknownMemberID)
	jr := recv(t, h.joinAsync("g", leader), "rejoin")
	if jr.ErrorCode != 0 || jr.Generation != gen+1 || len(jr.Members) != 1 {
		t.Fatalf("rejoin: %+v", jr)
	}
	// Everyone gone: the tombstone; the group comes back Empty (its offsets only).
	if r := h.leave(3, "g", leader); r.ErrorCode != 0 {
		t.Fatalf("leave: %+v", r)
	}
	poll(t, func() error {
		if _, ok := h.store.GroupMeta("g"); ok {
			return errors.New("metadata still persisted after the last member left")
		}
		return nil
	})
}

// failingMetaStore fails every metadata write.
type failingMetaStore struct{ *storage.GroupStore }

func (s failingMetaStore) StoreGroupMetaAsync(_ string, _ *storage.GroupMeta, done func(error)) {
	done(errors.New("cannot persist group metadata: input/output error"))
}

// TestSyncGroupAssignmentNotHandedOutUntilDurable: the leader's assignment is given out only once
// it is persisted (Apache storeGroup): a failed write answers the SyncGroups with the error and
// the group rebalances.
func TestSyncGroupAssignmentNotHandedOutUntilDurable(t *testing.T) {
	h := newHarness(t)
	h.c.Close()
	h.c = New(h.cfg, failingMetaStore{h.store}, nil)
	jr := recv(t, h.joinNew("g"), "JoinGroup")
	wantCode(t, "join", jr.ErrorCode, 0)
	sr := h.sync("g", jr.MemberID, jr.Generation, map[string][]byte{jr.MemberID: []byte("a")})
	wantCode(t, "leader sync with a failing store", sr.ErrorCode, codec.CodeNotCoordinator)
	if d := h.describe("g"); d.State != "PreparingRebalance" {
		t.Fatalf("after a failed assignment write: state %s, want PreparingRebalance", d.State)
	}
}

// newClusterHarness is a coordinator over a cluster-mode store of (broker, inc) in dir, owning
// no shard.
func newClusterHarness(t *testing.T, dir string, broker int32, inc string) *harness {
	t.Helper()
	cfg := Config{
		InitialRebalanceDelay: 20 * time.Millisecond,
		MinSessionTimeout:     10 * time.Millisecond,
		MaxSessionTimeout:     time.Minute,
		MaxSize:               100,
		ShardsUnowned:         true,
	}
	st, err := storage.OpenGroupStoreCluster(dir, broker, inc, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: dir, store: st, cfg: cfg, c: New(cfg, st, nil)}
	t.Cleanup(h.close)
	return h
}

// TestShardMoveKeepsGeneration: a group shard moves between brokers (three cluster-mode stores
// on one directory): after a graceful release the next coordinator serves the group Stable at
// its generation; after that coordinator "crashes" (no release) the third one does too, and sees
// the commits the second acknowledged.
func TestShardMoveKeepsGeneration(t *testing.T) {
	dir := t.TempDir()
	const n = 4
	g := groupsInShard(n, 1)[0]
	h1 := newClusterHarness(t, dir, 1, "a1")
	if err := recv(t, h1.loadShard(n, 1), "LoadShard"); err != nil {
		t.Fatal(err)
	}
	leader, follower, gen := h1.stablePair(g)
	wantCode(t, "commit on broker 1", h1.commit(Commit{Group: g, Generation: gen, MemberID: leader}, off("t", 0, 10)), codec.CodeNone)
	if err := h1.releaseShard(n); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "heartbeat on the old coordinator", h1.heartbeat(g, leader, gen, ""), codec.CodeNotCoordinator)

	h2 := newClusterHarness(t, dir, 2, "b2")
	if err := recv(t, h2.loadShard(n, 2), "LoadShard"); err != nil {
		t.Fatal(err)
	}
	rebalances := mRebalances.Get()
	wantStablePair(t, h2, g, leader, follower)
	wantCode(t, "leader heartbeat after the move", h2.heartbeat(g, leader, gen, ""), codec.CodeNone)
	wantCode(t, "follower commit after the move", h2.commit(Commit{Group: g, Generation: gen, MemberID: follower}, off("t", 1, 20)), codec.CodeNone)
	if got := h2.fetch1(g, "t", 0, false); got.Offset != 10 {
		t.Fatalf("offset after the move %d, want 10", got.Offset)
	}
	if ep, ok := h2.c.ShardEpoch(n); !ok || ep != 2 {
		t.Fatalf("shard epoch %d %v, want 2", ep, ok)
	}

	// Broker 2 dies without releasing; broker 3 loads at epoch 3.
	h3 := newClusterHarness(t, dir, 3, "c3")
	if err := recv(t, h3.loadShard(n, 3), "LoadShard"); err != nil {
		t.Fatal(err)
	}
	wantStablePair(t, h3, g, leader, follower)
	wantCode(t, "follower heartbeat after the crash move", h3.heartbeat(g, follower, gen, ""), codec.CodeNone)
	if got := h3.fetch1(g, "t", 1, false); got.Offset != 20 {
		t.Fatalf("offset committed on broker 2, read on broker 3: %d, want 20", got.Offset)
	}
	if got := mRebalances.Get(); got != rebalances {
		t.Fatalf("%d rebalances across the moves", got-rebalances)
	}
}

// TestRestartKeepsStaticMember: a static member's instance id survives a broker restart; its
// process restarting afterwards (a rejoin with no member id) is the KIP-345 replacement with no
// rebalance, and the replaced member id is what the next restart restores.
func TestRestartKeepsStaticMember(t *testing.T) {
	h := newHarness(t)
	inst := withInstance("instance-1")
	j := h.join("g", "", inst)
	wantCode(t, "static join", j.ErrorCode, 0)
	wantCode(t, "sync", h.sync("g", j.MemberID, j.Generation, map[string][]byte{j.MemberID: []byte("mine")}).ErrorCode, 0)
	gen := j.Generation
	h.restart()
	wantCode(t, "heartbeat with the instance id", h.heartbeat("g", j.MemberID, gen, "instance-1"), 0)
	wantCode(t, "another member id for the instance", h.heartbeat("g", "someone-else", gen, "instance-1"), codec.CodeFencedInstanceID)

	j2 := h.join("g", "", inst, withVersion(8))
	if j2.ErrorCode != 0 || j2.MemberID == j.MemberID || j2.Generation != gen {
		t.Fatalf("static rejoin after restart: %+v", j2)
	}
	if d := h.describe("g"); d.State != "Stable" {
		t.Fatalf("state %s: a static rejoin must not rebalance", d.State)
	}
	h.restart()
	wantCode(t, "the replaced member id after a second restart", h.heartbeat("g", j2.MemberID, gen, "instance-1"), 0)
	wantCode(t, "the old member id", h.heartbeat("g", j.MemberID, gen, "instance-1"), codec.CodeFencedInstanceID)
	s := h.sync("g", j2.MemberID, gen, nil)
	if s.ErrorCode != 0 || string(s.MemberAssignment) != "mine" {
		t.Fatalf("assignment after two restarts: %d %q", s.ErrorCode, s.MemberAssignment)
	}
}
