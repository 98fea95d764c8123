package group

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

const waitFor = 5 * time.Second

type harness struct {
	t     *testing.T
	dir   string
	store *storage.GroupStore
	c     *Coordinator
	cfg   Config
}

func newHarness(t *testing.T, mods ...func(*Config)) *harness {
	t.Helper()
	cfg := Config{
		InitialRebalanceDelay: 20 * time.Millisecond,
		MinSessionTimeout:     10 * time.Millisecond,
		MaxSessionTimeout:     time.Minute,
		MaxSize:               100,
	}
	for _, m := range mods {
		m(&cfg)
	}
	h := &harness{t: t, dir: t.TempDir(), cfg: cfg}
	h.open()
	t.Cleanup(h.close)
	return h
}

func (h *harness) open() {
	st, err := storage.OpenGroupStore(h.dir, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.store = st
	h.c = New(h.cfg, st, nil)
	if err := h.c.Start(); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) close() {
	if h.c == nil {
		return
	}
	h.c.Close()
	if err := h.store.Close(); err != nil {
		h.t.Error(err)
	}
	h.c = nil
}

func (h *harness) restart() {
	h.close()
	h.open()
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("no %s response within %v", what, waitFor)
	}
	var zero T
	return zero
}

func noRecv[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("unexpected %s response %+v", what, v)
	default:
	}
}

type joinOpt func(*kmsg.JoinGroupRequest)

func withInstance(id string) joinOpt {
	return func(r *kmsg.JoinGroupRequest) { r.InstanceID = &id }
}
func withVersion(v int16) joinOpt { return func(r *kmsg.JoinGroupRequest) { r.Version = v } }
func withSession(d time.Duration) joinOpt {
	return func(r *kmsg.JoinGroupRequest) { r.SessionTimeoutMillis = int32(d.Milliseconds()) }
}
func withRebalance(d time.Duration) joinOpt {
	return func(r *kmsg.JoinGroupRequest) { r.RebalanceTimeoutMillis = int32(d.Milliseconds()) }
}
func withProtocols(names ...string) joinOpt {
	return func(r *kmsg.JoinGroupRequest) {
		r.Protocols = nil
		for _, n := range names {
			p := kmsg.NewJoinGroupRequestProtocol()
			p.Name = n
			p.Metadata = []byte("meta-" + n)
			r.Protocols = append(r.Protocols, p)
		}
	}
}
func withMeta(b []byte) joinOpt {
	return func(r *kmsg.JoinGroupRequest) { r.Protocols[0].Metadata = b }
}

func (h *harness) joinAsync(group, member string, opts ...joinOpt) <-chan *kmsg.JoinGroupResponse {
	r := kmsg.NewPtrJoinGroupRequest()
	r.Version = 9
	r.Group = group
	r.MemberID = member
	r.SessionTimeoutMillis = 10000
	r.RebalanceTimeoutMillis = 2000
	r.ProtocolType = "consumer"
	withProtocols("range")(r)
	for _, o := range opts {
		o(r)
	}
	ch := make(chan *kmsg.JoinGroupResponse, 1)
	h.c.JoinGroup(r, "client", "/127.0.0.1", func(resp *kmsg.JoinGroupResponse) {
		if resp.Version != r.Version {
			h.t.Errorf("response version %d for request version %d", resp.Version, r.Version)
		}
		ch <- resp
	})
	return ch
}

func (h *harness) join(group, member string, opts ...joinOpt) *kmsg.JoinGroupResponse {
	h.t.Helper()
	return recv(h.t, h.joinAsync(group, member, opts...), "JoinGroup")
}

// joinNew does the KIP-394 two-step join of a new dynamic member.
func (h *harness) joinNew(group string, opts ...joinOpt) <-chan *kmsg.JoinGroupResponse {
	h.t.Helper()
	r := h.join(group, "", opts...)
	if r.ErrorCode != codec.CodeMemberIDRequired || r.MemberID == "" {
		h.t.Fatalf("first join: code %d id %q, want MEMBER_ID_REQUIRED with an id", r.ErrorCode, r.MemberID)
	}
	return h.joinAsync(group, r.MemberID, opts...)
}

func (h *harness) syncAsync(group, member string, gen int32, instance string, assign map[string][]byte) <-chan *kmsg.SyncGroupResponse {
	r := kmsg.NewPtrSyncGroupRequest()
	r.Version = 5
	r.Group, r.MemberID, r.Generation = group, member, gen
	if instance != "" {
		r.InstanceID = &instance
	}
	for m, a := range assign {
		ga := kmsg.NewSyncGroupRequestGroupAssignment()
		ga.MemberID, ga.MemberAssignment = m, a
		r.GroupAssignment = append(r.GroupAssignment, ga)
	}
	ch := make(chan *kmsg.SyncGroupResponse, 1)
	h.c.SyncGroup(r, func(resp *kmsg.SyncGroupResponse) { ch <- resp })
	return ch
}

func (h *harness) sync(group, member string, gen int32, assign map[string][]byte) *kmsg.SyncGroupResponse {
	h.t.Helper()
	return recv(h.t, h.syncAsync(group, member, gen, "", assign), "SyncGroup")
}

func (h *harness) heartbeat(group, member string, gen int32, instance string) int16 {
	h.t.Helper()
	r := kmsg.NewPtrHeartbeatRequest()
	r.Version = 4
	r.Group, r.MemberID, r.Generation = group, member, gen
	if instance != "" {
		r.InstanceID = &instance
	}
	ch := make(chan *kmsg.HeartbeatResponse, 1)
	h.c.Heartbeat(r, func(resp *kmsg.HeartbeatResponse) { ch <- resp })
	return recv(h.t, ch, "Heartbeat").ErrorCode
}

func (h *harness) commit(cm Commit, offs ...storage.GroupOffset) int16 {
	h.t.Helper()
	ch := make(chan int16, 1)
	h.c.CommitOffsets(cm, offs, func(code int16) { ch <- code })
	return recv(h.t, ch, "OffsetCommit")
}

func (h *harness) describe(group string) kmsg.DescribeGroupsResponseGroup {
	h.t.Helper()
	ch := make(chan kmsg.DescribeGroupsResponseGroup, 1)
	h.c.DescribeGroup(group, func(d kmsg.DescribeGroupsResponseGroup) { ch <- d })
	return recv(h.t, ch, "DescribeGroups")
}

func (h *harness) leave(version int16, group string, members ...string) *kmsg.LeaveGroupResponse {
	h.t.Helper()
	r := kmsg.NewPtrLeaveGroupRequest()
	r.Version = version
	r.Group = group
	if version <= 2 {
		r.MemberID = members[0]
	} else {
		for _, m := range members {
			lm := kmsg.NewLeaveGroupRequestMember()
			lm.MemberID = m
			r.Members = append(r.Members, lm)
		}
	}
	ch := make(chan *kmsg.LeaveGroupResponse, 1)
	h.c.LeaveGroup(r, func(resp *kmsg.LeaveGroupResponse) { ch <- resp })
	return recv(h.t, ch, "LeaveGroup")
}

// inspect runs fn on the group's goroutine and waits for it.
func (h *harness) inspect(id string, fn func(g *group)) {
	h.t.Helper()
	h.c.mu.Lock()
	g := h.c.groups[id]
	h.c.mu.Unlock()
	if g == nil {
		h.t.Fatalf("no group %q", id)
	}
	done := make(chan struct{})
	g.do(func() { fn(g); close(done) })
	recv(h.t, done, "inspect")
}

// poll retries fn until it returns nil or the deadline passes.
func poll(t *testing.T, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		<-time.After(5 * time.Millisecond)
	}
}

func gp(topic string, p int32) storage.GroupPartition {
	return storage.GroupPartition{Topic: topic, Partition: p}
}

func wantCode(t *testing.T, what string, got, want int16) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: error code %d, want %d", what, got, want)
	}
}

// stableSingle brings a one-member group to Stable and returns (member id, generation).
func (h *harness) stableSingle(group string, opts ...joinOpt) (string, int32) {
	h.t.Helper()
	jr := recv(h.t, h.joinNew(group, opts...), "JoinGroup")
	wantCode(h.t, "join", jr.ErrorCode, 0)
	sr := h.sync(group, jr.MemberID, jr.Generation, map[string][]byte{jr.MemberID: []byte("a1")})
	wantCode(h.t, "sync", sr.ErrorCode, 0)
	return jr.MemberID, jr.Generation
}

func TestMemberIDRequired(t *testing.T) {
	h := newHarness(t)
	r := h.join("g", "")
	wantCode(t, "v9 first join", r.ErrorCode, codec.CodeMemberIDRequired)
	if r.MemberID == "" || r.MemberID[:7] != "client-" {
		t.Fatalf("member id %q", r.MemberID)
	}
	// v3 has no KIP-394: the member is added straight away.
	r = h.join("g3", "", withVersion(3))
	wantCode(t, "v3 join", r.ErrorCode, 0)
	if r.LeaderID != r.MemberID || r.Generation != 1 || len(r.Members) != 1 {
		t.Fatalf("v3 join: %+v", r)
	}
	// The pending id expires after its session timeout; rejoining with it then is unknown.
	r = h.join("g4", "", withSession(30*time.Millisecond))
	pendingID := r.MemberID
	poll(t, func() error {
		n := 0
		h.inspect("g4", func(g *group) { n = len(g.pending) })
		if n != 0 {
			return fmt.Errorf("%d pending members", n)
		}
		return nil
	})
	wantCode(t, "join with an expired pending id", h.join("g4", pendingID).ErrorCode, codec.CodeUnknownMemberID)
}

func TestJoinSyncHeartbeatLifecycle(t *testing.T) {
	h := newHarness(t)
	ch1 := h.joinNew("g")
	j1 := recv(t, ch1, "join 1")
	wantCode(t, "join 1", j1.ErrorCode, 0)
	if j1.LeaderID != j1.MemberID || j1.Generation != 1 || len(j1.Members) != 1 || *j1.Protocol != "range" || *j1.ProtocolType != "consumer" {
		t.Fatalf("join 1: %+v", j1)
	}
	if string(j1.Members[0].ProtocolMetadata) != "meta-range" {
		t.Fatalf("metadata %q", j1.Members[0].ProtocolMetadata)
	}
	if d := h.describe("g"); d.State != "CompletingRebalance" {
		t.Fatalf("state %s", d.State)
	}
	wantCode(t, "commit while completing", h.commit(Commit{Group: "g", Generation: 1, MemberID: j1.MemberID}, storage.GroupOffset{Topic: "t", Offset: 1}), codec.CodeRebalanceInProgress)
	s1 := h.sync("g", j1.MemberID, 1, map[string][]byte{j1.MemberID: []byte("A1")})
	wantCode(t, "sync 1", s1.ErrorCode, 0)
	if string(s1.MemberAssignment) != "A1" || *s1.Protocol != "range" {
		t.Fatalf("sync 1: %+v", s1)
	}
	wantCode(t, "heartbeat", h.heartbeat("g", j1.MemberID, 1, ""), 0)

	// A second member joins: the group rebalances; the first learns it from its heartbeat.
	ch2 := h.joinNew("g")
	poll(t, func() error {
		if c := h.heartbeat("g", j1.MemberID, 1, ""); c != codec.CodeRebalanceInProgress {
			return fmt.Errorf("heartbeat code %d, want REBALANCE_IN_PROGRESS", c)
		}
		return nil
	})
	noRecv(t, ch2, "join 2 before the leader rejoined")
	ch1 = h.joinAsync("g", j1.MemberID)
	j1 = recv(t, ch1, "rejoin 1")
	j2 := recv(t, ch2, "join 2")
	wantCode(t, "rejoin 1", j1.ErrorCode, 0)
	wantCode(t, "join 2", j2.ErrorCode, 0)
	if j1.Generation != 2 || j2.Generation != 2 || j1.LeaderID != j1.MemberID || j2.LeaderID != j1.MemberID {
		t.Fatalf("generation 2: %+v / %+v", j1, j2)
	}
	if len(j1.Members) != 2 || len(j2.Members) != 0 {
		t.Fatalf("only the leader gets the members: %d / %d", len(j1.Members), len(j2.Members))
	}
	// The follower syncs first and waits; the leader leaves it out of the assignment, so it
	// gets a real empty assignment.
	sc2 := h.syncAsync("g", j2.MemberID, 2, "", nil)
	noRecv(t, sc2, "follower sync before the leader's")
	s1 = h.sync("g", j1.MemberID, 2, map[string][]byte{j1.MemberID: []byte("A2"), "stranger": []byte("x")})
	s2 := recv(t, sc2, "follower sync")
	wantCode(t, "follower sync", s2.ErrorCode, 0)
	if string(s1.MemberAssignment) != "A2" || s2.MemberAssignment == nil || len(s2.MemberAssignment) != 0 {
		t.Fatalf("assignments %q %v", s1.MemberAssignment, s2.MemberAssignment)
	}
	d := h.describe("g")
	if d.State != "Stable" || d.Protocol != "range" || len(d.Members) != 2 || string(d.Members[0].MemberAssignment) != "A2" || d.Members[0].ClientHost != "/127.0.0.1" {
		t.Fatalf("describe: %+v", d)
	}

	// The follower leaves; the leader must rejoin alone.
	lr := h.leave(4, "g", j2.MemberID)
	wantCode(t, "leave", lr.Members[0].ErrorCode, 0)
	wantCode(t, "heartbeat after leave", h.heartbeat("g", j1.MemberID, 2, ""), codec.CodeRebalanceInProgress)
	j1 = h.join("g", j1.MemberID)
	if j1.ErrorCode != 0 || j1.Generation != 3 || len(j1.Members) != 1 {
		t.Fatalf("rejoin alone: %+v", j1)
	}
}

func TestErrorCodes(t *testing.T) {
	h := newHarness(t)
	id, gen := h.stableSingle("g")

	wantCode(t, "join empty group id", h.join("", "").ErrorCode, codec.CodeInvalidGroupID)
	wantCode(t, "join bad session", h.join("g", "", withSession(time.Millisecond)).ErrorCode, codec.CodeInvalidSessionTimeout)
	wantCode(t, "join unknown group with member id", h.join("nope", "m-1").ErrorCode, codec.CodeUnknownMemberID)
	wantCode(t, "join unknown member", h.join("g", "m-1").ErrorCode, codec.CodeUnknownMemberID)
	wantCode(t, "join other protocol type", h.join("g", "", func(r *kmsg.JoinGroupRequest) { r.ProtocolType = "connect" }).ErrorCode, codec.CodeInconsistentGroupProtocol)
	wantCode(t, "join no common protocol", h.join("g", "", withProtocols("roundrobin")).ErrorCode, codec.CodeInconsistentGroupProtocol)
	wantCode(t, "join empty protocol type", h.join("fresh", "", func(r *kmsg.JoinGroupRequest) { r.ProtocolType = "" }).ErrorCode, codec.CodeInconsistentGroupProtocol)

	wantCode(t, "heartbeat unknown group", h.heartbeat("nope", id, gen, ""), codec.CodeUnknownMemberID)
	wantCode(t, "heartbeat unknown member", h.heartbeat("g", "m-1", gen, ""), codec.CodeUnknownMemberID)
	wantCode(t, "heartbeat old generation", h.heartbeat("g", id, gen-1, ""), codec.CodeIllegalGeneration)
	wantCode(t, "heartbeat unknown instance", h.heartbeat("g", id, gen, "inst"), codec.CodeUnknownMemberID)

	wantCode(t, "sync unknown group", h.sync("nope", id, gen, nil).ErrorCode, codec.CodeUnknownMemberID)
	wantCode(t, "sync unknown member", h.sync("g", "m-1", gen, nil).ErrorCode, codec.CodeUnknownMemberID)
	wantCode(t, "sync future generation", h.sync("g", id, gen+1, nil).ErrorCode, codec.CodeIllegalGeneration)
	pt := "connect"
	sr := kmsg.NewPtrSyncGroupRequest()
	sr.Version, sr.Group, sr.MemberID, sr.Generation, sr.ProtocolType = 5, "g", id, gen, &pt
	ch := make(chan *kmsg.SyncGroupResponse, 1)
	h.c.SyncGroup(sr, func(r *kmsg.SyncGroupResponse) { ch <- r })
	wantCode(t, "sync wrong protocol type", recv(t, ch, "sync").ErrorCode, codec.CodeInconsistentGroupProtocol)

	// Offset commits: member validation, simple commits, unknown groups.
	off := storage.GroupOffset{Topic: "t", Partition: 0, Offset: 7, LeaderEpoch: 2, Metadata: "md"}
	wantCode(t, "commit member", h.commit(Commit{Group: "g", Generation: gen, MemberID: id}, off), 0)
	wantCode(t, "commit old generation", h.commit(Commit{Group: "g", Generation: gen - 1, MemberID: id}, off), codec.CodeIllegalGeneration)
	wantCode(t, "commit unknown member", h.commit(Commit{Group: "g", Generation: gen, MemberID: "m-1"}, off), codec.CodeUnknownMemberID)
	wantCode(t, "simple commit to a group with members", h.commit(Commit{Group: "g", Generation: -1}, off), codec.CodeUnknownMemberID)
	wantCode(t, "commit with generation to an unknown group", h.commit(Commit{Group: "nope", Generation: 3, MemberID: "m"}, off), codec.CodeIllegalGeneration)
	wantCode(t, "simple commit to a new group", h.commit(Commit{Group: "manual", Generation: -1}, off), 0)
	wantCode(t, "commit with member id to a simple group", h.commit(Commit{Group: "manual", Generation: -1, MemberID: "m"}, off), codec.CodeUnknownMemberID)

	code, got := h.c.FetchOffsets("manual", []storage.GroupPartition{gp("t", 0), gp("t", 1)}, true)
	if code != 0 || got[0].Offset != 7 || got[0].LeaderEpoch != 2 || got[0].Metadata != "md" || got[1].Offset != -1 || got[1].LeaderEpoch != -1 {
		t.Fatalf("fetch: %d %+v", code, got)
	}
	if _, all := h.c.FetchOffsets("g", nil, false); len(all) != 1 || all[0].Offset != 7 {
		t.Fatalf("fetch all: %+v", all)
	}

	// LeaveGroup: v0-2 report the member error at the top level; v3+ per member.
	wantCode(t, "leave v1 unknown", h.leave(1, "g", "m-1").ErrorCode, codec.CodeUnknownMemberID)
	lr := h.leave(3, "g", "m-1", id)
	if lr.ErrorCode != 0 || lr.Members[0].ErrorCode != codec.CodeUnknownMemberID || lr.Members[1].ErrorCode != 0 {
		t.Fatalf("leave v3: %+v", lr)
	}
	lr = h.leave(5, "nope", "m-1")
	if lr.ErrorCode != 0 || lr.Members[0].ErrorCode != codec.CodeUnknownMemberID {
		t.Fatalf("leave unknown group: %+v", lr)
	}
	poll(t, func() error {
		if d := h.describe("g"); d.State != "Empty" {
			return fmt.Errorf("state %s after the last member left", d.State)
		}
		return nil
	})
	// Now Empty: a simple commit is allowed, a stale member is not.
	wantCode(t, "simple commit to empty group", h.commit(Commit{Group: "g", Generation: -1}, off), 0)
	wantCode(t, "stale member commit to empty group", h.commit(Commit{Group: "g", Generation: gen, MemberID: id}, off), codec.CodeUnknownMemberID)
}

func TestStaticMemberRestartWithoutRebalance(t *testing.T) {
	h := newHarness(t)
	inst := withInstance("instance-1")
	j := h.join("g", "", inst)
	wantCode(t, "static join", j.ErrorCode, 0) // static members skip MEMBER_ID_REQUIRED
	s := h.sync("g", j.MemberID, j.Generation, map[string][]byte{j.MemberID: []byte("mine")})
	wantCode(t, "sync", s.ErrorCode, 0)
	oldID, gen := j.MemberID, j.Generation

	for _, v := range []int16{8, 9} {
		// The process restarts: it joins with no member id and the same instance id.
		j = h.join("g", "", inst, withVersion(v))
		wantCode(t, "static rejoin", j.ErrorCode, 0)
		if j.MemberID == oldID || j.Generation != gen {
			t.Fatalf("v%d rejoin: id %q gen %d (old %q gen %d)", v, j.MemberID, j.Generation, oldID, gen)
		}
		if v < 9 && (j.LeaderID != oldID || j.SkipAssignment) {
			t.Fatalf("v%d: leader %q skip %v; want the old leader id so no assignment runs", v, j.LeaderID, j.SkipAssignment)
		}
		if v >= 9 && (j.LeaderID != j.MemberID || !j.SkipAssignment || len(j.Members) != 1) {
			t.Fatalf("v9 (KIP-814): leader %q skip %v members %d", j.LeaderID, j.SkipAssignment, len(j.Members))
		}
		if d := h.describe("g"); d.State != "Stable" {
			t.Fatalf("state %s: a static rejoin must not rebalance", d.State)
		}
		s = recv(t, h.syncAsync("g", j.MemberID, j.Generation, "instance-1", nil), "sync")
		if s.ErrorCode != 0 || string(s.MemberAssignment) != "mine" {
			t.Fatalf("assignment after restart: %d %q", s.ErrorCode, s.MemberAssignment)
		}
		// The old incarnation is fenced.
		wantCode(t, "old incarnation heartbeat", h.heartbeat("g", oldID, gen, "instance-1"), codec.CodeFencedInstanceID)
		wantCode(t, "old incarnation commit", h.commit(Commit{Group: "g", Generation: gen, MemberID: oldID, InstanceID: "instance-1"}), codec.CodeFencedInstanceID)
		wantCode(t, "new incarnation heartbeat", h.heartbeat("g", j.MemberID, gen, "instance-1"), 0)
		oldID = j.MemberID
	}
	// Admin removal by instance id (KIP-345).
	r := kmsg.NewPtrLeaveGroupRequest()
	r.Version, r.Group = 5, "g"
	lm := kmsg.NewLeaveGroupRequestMember()
	id := "instance-1"
	lm.InstanceID = &id
	r.Members = append(r.Members, lm)
	ch := make(chan *kmsg.LeaveGroupResponse, 1)
	h.c.LeaveGroup(r, func(resp *kmsg.LeaveGroupResponse) { ch <- resp })
	if resp := recv(t, ch, "leave"); resp.Members[0].ErrorCode != 0 {
		t.Fatalf("leave by instance: %+v", resp)
	}
	poll(t, func() error {
		if d := h.describe("g"); d.State != "Empty" {
			return fmt.Errorf("state %s", d.State)
		}
		return nil
	})
}

// A static member that rejoins while its previous incarnation is parked in JoinGroup fences it.
func TestStaticDuplicateFenced(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.InitialRebalanceDelay = time.Hour })
	first := h.joinAsync("g", "", withInstance("i"))
	noRecv(t, first, "join during the initial delay")
	second := h.joinAsync("g", "", withInstance("i"))
	r := recv(t, first, "fenced join")
	wantCode(t, "fenced", r.ErrorCode, codec.CodeFencedInstanceID)
	noRecv(t, second, "join during the initial delay")
	h.close()
	wantCode(t, "parked join on close", recv(t, second, "join").ErrorCode, codec.CodeNotCoordinator)
}

func TestSessionExpiryAndRebalanceTimeout(t *testing.T) {
	h := newHarness(t)
	// A member that stops heartbeating is removed after its session timeout.
	id, gen := h.stableSingle("g", withSession(50*time.Millisecond))
	poll(t, func() error {
		if d := h.describe("g"); d.State != "Empty" || len(d.Members) != 0 {
			return fmt.Errorf("state %s members %d", d.State, len(d.Members))
		}
		return nil
	})
	wantCode(t, "expired member heartbeat", h.heartbeat("g", id, gen, ""), codec.CodeUnknownMemberID)

	// A member that does not rejoin within the rebalance timeout is dropped from the rebalance,
	// and the group completes with the others.
	a := recv(t, h.joinNew("r", withRebalance(100*time.Millisecond)), "join a")
	wantCode(t, "sync a", h.sync("r", a.MemberID, a.Generation, nil).ErrorCode, 0)
	bch := h.joinNew("r", withRebalance(100*time.Millisecond))
	b := recv(t, bch, "join b")
	wantCode(t, "join b", b.ErrorCode, 0)
	if b.Generation != a.Generation+1 || b.LeaderID != b.MemberID || len(b.Members) != 1 {
		t.Fatalf("b after a timed out: %+v", b)
	}
	wantCode(t, "dropped member heartbeat", h.heartbeat("r", a.MemberID, b.Generation, ""), codec.CodeUnknownMemberID)

	// A member that joins but never syncs is removed after the rebalance timeout.
	s := recv(t, h.joinNew("s", withRebalance(50*time.Millisecond)), "join s")
	wantCode(t, "join s", s.ErrorCode, 0)
	poll(t, func() error {
		if d := h.describe("s"); d.State != "Empty" {
			return fmt.Errorf("state %s", d.State)
		}
		return nil
	})
}

func TestInitialRebalanceDelayGathersMembers(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.InitialRebalanceDelay = 100 * time.Millisecond })
	var chans []<-chan *kmsg.JoinGroupResponse
	for i := 0; i < 3; i++ {
		chans = append(chans, h.joinNew("g"))
	}
	var leaderMembers int
	for _, ch := range chans {
		r := recv(t, ch, "join")
		wantCode(t, "join", r.ErrorCode, 0)
		if r.Generation != 1 {
			t.Fatalf("generation %d: the initial delay should gather all three into generation 1", r.Generation)
		}
		if r.LeaderID == r.MemberID {
			leaderMembers = len(r.Members)
		}
	}
	if leaderMembers != 3 {
		t.Fatalf("leader saw %d members", leaderMembers)
	}
}

func TestMaxSizeAndProtocolSelection(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxSize = 2; c.InitialRebalanceDelay = 50 * time.Millisecond })
	a := h.joinNew("g", withProtocols("cooperative-sticky", "range"))
	b := h.joinNew("g", withProtocols("range", "cooperative-sticky"))
	// A third member is turned away while two are already waiting in the rebalance.
	wantCode(t, "third member", h.join("g", "", withProtocols("range")).ErrorCode, codec.CodeGroupMaxSizeReached)
	var codes []int16
	var proto string
	for _, ch := range []<-chan *kmsg.JoinGroupResponse{a, b} {
		r := recv(t, ch, "join")
		codes = append(codes, r.ErrorCode)
		if r.ErrorCode == 0 {
			proto = *r.Protocol
		}
	}
	if fmt.Sprint(codes) != "[0 0]" {
		t.Fatalf("codes %v", codes)
	}
	// a and b each vote for their first choice; the tie goes to the first member's preference.
	if proto != "cooperative-sticky" {
		t.Fatalf("selected %q", proto)
	}
}

func TestMalformedAssignmentPassedThrough(t *testing.T) {
	h := newHarness(t)
	garbage := []byte{0xff, 0xff, 0xff, 0xff, 0x00, 0x01}
	j := recv(t, h.joinNew("g", withMeta(garbage)), "join")
	if string(j.Members[0].ProtocolMetadata) != string(garbage) {
		t.Fatalf("metadata %x", j.Members[0].ProtocolMetadata)
	}
	s := h.sync("g", j.MemberID, j.Generation, map[string][]byte{j.MemberID: garbage})
	if s.ErrorCode != 0 || string(s.MemberAssignment) != string(garbage) {
		t.Fatalf("sync %+v", s)
	}
	if d := h.describe("g"); string(d.Members[0].MemberAssignment) != string(garbage) {
		t.Fatalf("describe %+v", d)
	}
	// OffsetDelete's subscription guard cannot parse the metadata, so it treats every topic as
	// subscribed rather than crash or delete.
	ch := make(chan []int16, 1)
	h.c.DeleteOffsets("g", []storage.GroupPartition{gp("t", 0)}, func(code int16, parts []int16) { ch <- parts })
	if p := recv(t, ch, "offset delete"); p[0] != codec.CodeGroupSubscribedToTopic {
		t.Fatalf("offset delete %v", p)
	}
}

func TestDeleteGroupsOffsetDeleteAndList(t *testing.T) {
	h := newHarness(t)
	id, gen := h.stableSingle("busy")
	off := storage.GroupOffset{Topic: "t", Partition: 0, Offset: 5}
	wantCode(t, "commit", h.commit(Commit{Group: "busy", Generation: gen, MemberID: id}, off), 0)
	wantCode(t, "simple commit", h.commit(Commit{Group: "idle", Generation: -1}, off, storage.GroupOffset{Topic: "u", Offset: 9}), 0)

	del := func(g string) int16 {
		ch := make(chan int16, 1)
		h.c.DeleteGroup(g, func(c int16) { ch <- c })
		return recv(t, ch, "delete group")
	}
	delOffs := func(g string, parts ...storage.GroupPartition) (int16, []int16) {
		type res struct {
			c int16
			p []int16
		}
		ch := make(chan res, 1)
		h.c.DeleteOffsets(g, parts, func(c int16, p []int16) { ch <- res{c, p} })
		r := recv(t, ch, "offset delete")
		return r.c, r.p
	}
	wantCode(t, "delete non-empty", del("busy"), codec.CodeNonEmptyGroup)
	wantCode(t, "delete unknown", del("nope"), codec.CodeGroupIDNotFound)
	if c, _ := delOffs("nope", gp("t", 0)); c != codec.CodeGroupIDNotFound {
		t.Fatalf("offset delete unknown group: %d", c)
	}
	// "busy" subscribes (consumer protocol) to nothing we can parse ("meta-range"), so its
	// offsets are guarded.
	if c, p := delOffs("busy", gp("t", 0)); c != 0 || p[0] != codec.CodeGroupSubscribedToTopic {
		t.Fatalf("offset delete busy: %d %v", c, p)
	}
	if c, p := delOffs("idle", gp("u", 0)); c != 0 || p[0] != 0 {
		t.Fatalf("offset delete idle: %d %v", c, p)
	}

	// Restart: groups with offsets are listed and described without anyone rejoining; "busy"
	// comes back Stable from its persisted metadata.
	h.restart()
	got := fmt.Sprint(h.c.ListGroups(nil))
	if got != "[{busy consumer Stable classic} {idle  Empty classic}]" {
		t.Fatalf("list after restart: %s", got)
	}
	if got := fmt.Sprint(h.c.ListGroups([]string{"stable"})); got != "[{busy consumer Stable classic}]" {
		t.Fatalf("state filter: %v", got)
	}
	if d := h.describe("idle"); d.State != "Empty" || d.ErrorCode != 0 {
		t.Fatalf("describe idle: %+v", d)
	}
	if d := h.describe("nope"); d.State != "Dead" || d.ErrorCode != 0 {
		t.Fatalf("describe unknown: %+v", d)
	}
	if _, f := h.c.FetchOffsets("busy", nil, false); len(f) != 1 || f[0].Offset != 5 {
		t.Fatalf("fetch after restart: %+v", f)
	}
	if _, f := h.c.FetchOffsets("idle", []storage.GroupPartition{gp("u", 0), gp("t", 0)}, false); f[0].Offset != -1 || f[1].Offset != 5 {
		t.Fatalf("fetch idle after restart: %+v", f)
	}
	wantCode(t, "delete idle", del("idle"), 0)
	wantCode(t, "delete idle again", del("idle"), codec.CodeGroupIDNotFound)
	if _, f := h.c.FetchOffsets("idle", []storage.GroupPartition{gp("t", 0)}, false); f[0].Offset != -1 {
		t.Fatalf("offsets survive delete: %+v", f)
	}
	if d := h.describe("idle"); d.State != "Dead" {
		t.Fatalf("describe deleted: %+v", d)
	}
	// A fresh group with the deleted id starts from scratch.
	wantCode(t, "recreate", h.commit(Commit{Group: "idle", Generation: -1}, off), 0)
	h.restart()
	if got := fmt.Sprint(h.c.ListGroups([]string{"EMPTY"})); got != "[{idle  Empty classic}]" {
		t.Fatalf("list: %s", got)
	}
}

func TestListGroupsInMemory(t *testing.T) {
	h := newHarness(t)
	h.stableSingle("a")
	got := h.c.ListGroups(nil)
	if len(got) != 1 || got[0].State != "Stable" || got[0].ProtocolType != "consumer" {
		t.Fatalf("list: %+v", got)
	}
	if got := h.c.ListGroups([]string{"Empty"}); len(got) != 0 {
		t.Fatalf("filtered: %+v", got)
	}
}
