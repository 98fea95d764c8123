package group

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// subscriptionMeta is a ConsumerProtocolSubscription (v1) of topics, owning owned of "t".
func subscriptionMeta(owned []int32, topics ...string) []byte {
	var md kmsg.ConsumerMemberMetadata
	md.Default()
	md.Version = 1
	md.Topics = topics
	if len(owned) > 0 {
		md.OwnedPartitions = []kmsg.ConsumerMemberMetadataOwnedPartition{{Topic: "t", Partitions: owned}}
	}
	return md.AppendTo(nil)
}

func assignmentMeta(parts ...int32) []byte {
	var ma kmsg.ConsumerMemberAssignment
	ma.Default()
	ma.Topics = []kmsg.ConsumerMemberAssignmentTopic{{Topic: "t", Partitions: parts}}
	return ma.AppendTo(nil)
}

func decodedParts(t *testing.T, b []byte) map[int32]bool {
	t.Helper()
	var ma kmsg.ConsumerMemberAssignment
	if err := ma.ReadFrom(b); err != nil {
		t.Fatalf("assignment: %v", err)
	}
	out := map[int32]bool{}
	for _, tp := range ma.Topics {
		for _, p := range tp.Partitions {
			out[p] = true
		}
	}
	return out
}

// TestClassicMembersInsideConsumerGroup: a classic group of two upgrades on a
// ConsumerGroupHeartbeat; the classic members keep their partitions (member epoch = generation),
// are told REBALANCE_IN_PROGRESS, rejoin and get the server's assignment through SyncGroup one
// revocation at a time; their commits are checked at generation = member epoch; a non-"consumer"
// protocol type is refused; the group survives a restart; and when the consumer-protocol member
// leaves, the group is classic again and rebalances.
func TestClassicMembersInsideConsumerGroup(t *testing.T) {
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: tid(1), Partitions: 4})
	h := ch.harness
	h.cfg.Consumer.MaxSize = 10
	h.restart()
	meta := func(owned ...int32) joinOpt { return withMeta(subscriptionMeta(owned, "t")) }
	ja := h.joinNew("g", meta())
	jb := h.joinNew("g", meta())
	ra, rb := recv(t, ja, "join a"), recv(t, jb, "join b")
	leader, other := ra, rb
	if rb.LeaderID == rb.MemberID {
		leader, other = rb, ra
	}
	a, b := leader.MemberID, other.MemberID
	sb := h.syncAsync("g", b, other.Generation, "", nil)
	if r := h.sync("g", a, leader.Generation, map[string][]byte{a: assignmentMeta(0, 1), b: assignmentMeta(2, 3)}); r.ErrorCode != 0 {
		t.Fatalf("leader sync: %d", r.ErrorCode)
	}
	recv(t, sb, "sync b")
	gen := leader.Generation

	// The KIP-848 member joins: the group converts, and c waits for partitions a and b hold.
	rc := ch.hb(cgJoinReq("c", "t"))
	if rc.ErrorCode != 0 || rc.MemberEpoch != gen+1 {
		t.Fatalf("848 join of the classic group: code %d epoch %d", rc.ErrorCode, rc.MemberEpoch)
	}
	if got := respAssignment(rc); got.size() != 0 {
		t.Fatalf("c was given %v while a and b still hold everything", got)
	}
	d := ch.describe(t)
	types := map[string]int8{}
	for _, m := range d.Members {
		types[m.MemberID] = m.MemberType
	}
	if len(d.Members) != 3 || types[a] != 0 || types[b] != 0 || types["c"] != 1 {
		t.Fatalf("describe after the upgrade: %+v", d.Members)
	}
	if dg := h.describe("g"); dg.State != "Dead" || dg.ErrorMessage == nil {
		t.Fatalf("DescribeGroups of the converted group (Apache: Dead, not a classic group): %+v", dg)
	}

	// The classic members: ILLEGAL_GENERATION off their epoch, REBALANCE_IN_PROGRESS at it.
	if c := h.heartbeat("g", a, gen+7, ""); c != codec.CodeIllegalGeneration {
		t.Fatalf("heartbeat at a wrong generation: %d", c)
	}
	if c := h.heartbeat("g", a, gen, ""); c != codec.CodeRebalanceInProgress {
		t.Fatalf("heartbeat of a member that must rejoin: %d", c)
	}
	if c := h.commit(Commit{Group: "g", MemberID: a, Generation: gen, Version: 7}, storage.GroupOffset{Topic: "t", Partition: 0, Offset: 5}); c != 0 {
		t.Fatalf("classic commit at the member epoch: %d", c)
	}
	if c := h.commit(Commit{Group: "g", MemberID: a, Generation: gen + 1, Version: 7}, storage.GroupOffset{Topic: "t", Partition: 0, Offset: 6}); c != codec.CodeIllegalGeneration {
		t.Fatalf("classic commit off the member epoch: %d", c)
	}
	if r := h.join("g", "", withProtocols("range"), withMeta(subscriptionMeta(nil, "t")), func(r *kmsg.JoinGroupRequest) { r.ProtocolType = "connect" }); r.ErrorCode != codec.CodeInconsistentGroupProtocol {
		t.Fatalf("join with protocol type connect: %d", r.ErrorCode)
	}

	// Cooperative rejoins: each keeps what the target leaves it, revokes the rest, then rejoins.
	held := map[string]map[int32]bool{a: {0: true, 1: true}, b: {2: true, 3: true}}
	gens := map[string]int32{a: gen, b: gen}
	for round := 0; round < 3; round++ {
		for _, id := range []string{a, b} {
			var owned []int32
			for p := range held[id] {
				owned = append(owned, p)
			}
			r := h.join("g", id, meta(owned...))
			if r.ErrorCode != 0 || r.LeaderID != "" || r.Protocol == nil || *r.Protocol != "range" {
				t.Fatalf("rejoin of %s: %+v", id, r)
			}
			s := h.sync("g", id, r.Generation, nil)
			if s.ErrorCode != 0 {
				t.Fatalf("sync of %s at %d: %d", id, r.Generation, s.ErrorCode)
			}
			held[id] = decodedParts(t, s.MemberAssignment)
			gens[id] = r.Generation
		}
		rc = ch.hb(hbReq("c", rc.MemberEpoch, respAssignment(rc)))
		if rc.ErrorCode != 0 {
			t.Fatalf("c heartbeat: %d", rc.ErrorCode)
		}
		if got := respAssignment(rc); got != nil {
			held["c"] = map[int32]bool{}
			for _, p := range got[tid(1)] {
				held["c"][p] = true
			}
		}
		// Never two holders of one partition.
		seen := map[int32]string{}
		for id, ps := range held {
			for p := range ps {
				if o, ok := seen[p]; ok {
					t.Fatalf("round %d: partition %d held by %s and %s", round, p, o, id)
				}
				seen[p] = id
			}
		}
	}
	if d := ch.describe(t); d.State != "Stable" || len(held["c"]) == 0 || len(held[a])+len(held[b])+len(held["c"]) != 4 {
		t.Fatalf("after reconciliation: %s, held %v", d.State, held)
	}
	if c := h.heartbeat("g", a, gens[a], ""); c != 0 {
		t.Fatalf("heartbeat of a reconciled classic member: %d", c)
	}

	// A restart keeps the converted group, its classic members and their epochs.
	ch.restart()
	d = ch.describe(t)
	if len(d.Members) != 3 || d.State != "Stable" {
		t.Fatalf("after restart: %+v", d)
	}
	if c := h.heartbeat("g", a, gens[a], ""); c != 0 {
		t.Fatalf("classic heartbeat after restart: %d", c)
	}
	if s := h.sync("g", b, gens[b], nil); s.ErrorCode != 0 || len(decodedParts(t, s.MemberAssignment)) != len(held[b]) {
		t.Fatalf("classic sync after restart: %d", s.ErrorCode)
	}

	// The consumer-protocol member leaves: the group is classic again and rebalances.
	leave := hbReq("c", rc.MemberEpoch, nil)
	leave.MemberEpoch = leaveEpoch
	if r := ch.hb(leave); r.ErrorCode != 0 {
		t.Fatalf("leave of c: %d", r.ErrorCode)
	}
	out := make(chan kmsg.ConsumerGroupDescribeResponseGroup, 1)
	ch.c.DescribeConsumerGroup("g", func(d kmsg.ConsumerGroupDescribeResponseGroup) { out <- d })
	if d := recv(t, out, "ConsumerGroupDescribe"); d.ErrorCode != codec.CodeGroupIDNotFound {
		t.Fatalf("ConsumerGroupDescribe after the downgrade: %d", d.ErrorCode)
	}
	dg := h.describe("g")
	if dg.ErrorCode != 0 || dg.State != "PreparingRebalance" || dg.ProtocolType != "consumer" || len(dg.Members) != 2 {
		t.Fatalf("classic group after the downgrade: %+v", dg)
	}
	ja, jb = h.joinAsync("g", a, meta()), h.joinAsync("g", b, meta())
	ra, rb = recv(t, ja, "rejoin a"), recv(t, jb, "rejoin b")
	if ra.ErrorCode != 0 || rb.ErrorCode != 0 || ra.Generation != rb.Generation || ra.Generation <= gens[a] {
		t.Fatalf("classic rebalance after the downgrade: %+v %+v", ra, rb)
	}
}

// TestOnlineUpgradeLeavesGroupClassicWhenJoinIsRefused: a KIP-848 join that would be refused
// after the conversion (its instance id belongs to a live classic static member) leaves the
// classic group as it is, as Apache writes nothing for a refused heartbeat.
func TestOnlineUpgradeLeavesGroupClassicWhenJoinIsRefused(t *testing.T) {
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: tid(1), Partitions: 2})
	h := ch.harness
	jr := h.join("g", "", withInstance("i1"), withMeta(subscriptionMeta(nil, "t")))
	if jr.ErrorCode != 0 {
		t.Fatalf("static join: %d", jr.ErrorCode)
	}
	if sr := h.sync("g", jr.MemberID, jr.Generation, map[string][]byte{jr.MemberID: assignmentMeta(0, 1)}); sr.ErrorCode != 0 {
		t.Fatalf("sync: %d", sr.ErrorCode)
	}
	req := cgJoinReq("c", "t")
	inst := "i1"
	req.InstanceID = &inst
	if r := ch.hb(req); r.ErrorCode != codec.CodeUnreleasedInstanceID {
		t.Fatalf("848 join with a live classic member's instance id: %d", r.ErrorCode)
	}
	if d := h.describe("g"); d.State != "Stable" || len(d.Members) != 1 {
		t.Fatalf("the classic group after the refusal: %+v", d)
	}
	if c := h.heartbeat("g", jr.MemberID, jr.Generation, "i1"); c != 0 {
		t.Fatalf("classic heartbeat after the refusal: %d", c)
	}
}

// TestOnlineUpgradeKeepsPartitionsOfARestartedRebalance: a classic rebalance restarted while
// completing clears the members' assignments, yet cooperative members keep consuming what they
// own (and report it in their JoinGroup metadata). An upgrade at that moment must count those
// partitions as held, or the joining KIP-848 member is handed partitions another member consumes.
func TestOnlineUpgradeKeepsPartitionsOfARestartedRebalance(t *testing.T) {
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: tid(1), Partitions: 4})
	h := ch.harness
	h.cfg.Consumer.MaxSize = 10
	h.restart()
	meta := func(owned ...int32) joinOpt { return withMeta(subscriptionMeta(owned, "t")) }
	ja0, jb0 := h.joinNew("g", meta()), h.joinNew("g", meta())
	ra, rb := recv(t, ja0, "join a"), recv(t, jb0, "join b")
	leader, other := ra, rb
	if rb.LeaderID == rb.MemberID {
		leader, other = rb, ra
	}
	a, b := leader.MemberID, other.MemberID
	sb := h.syncAsync("g", b, other.Generation, "", nil)
	if r := h.sync("g", a, leader.Generation, map[string][]byte{a: assignmentMeta(0, 1), b: assignmentMeta(2, 3)}); r.ErrorCode != 0 {
		t.Fatalf("leader sync: %d", r.ErrorCode)
	}
	if r := recv(t, sb, "sync b"); r.ErrorCode != 0 {
		t.Fatalf("sync b: %d", r.ErrorCode)
	}
	// A cooperative rebalance: both rejoin owning their partitions; the join completes.
	ja := h.joinAsync("g", a, meta(0, 1))
	if d := h.describe("g"); d.State != "PreparingRebalance" {
		t.Fatalf("after the leader's rejoin: %s", d.State)
	}
	jb := h.joinAsync("g", b, meta(2, 3))
	if r1, r2 := recv(t, ja, "rejoin a"), recv(t, jb, "rejoin b"); r1.ErrorCode != 0 || r2.ErrorCode != 0 {
		t.Fatalf("rejoins: %d %d", r1.ErrorCode, r2.ErrorCode)
	}
	// Before the leader syncs, a new member restarts the rebalance: the assignments are cleared.
	jd := h.joinNew("g", meta())
	// The KIP-848 member joins now: a and b still consume every partition.
	rc := ch.hb(cgJoinReq("c", "t"))
	if rc.ErrorCode != 0 {
		t.Fatalf("848 join: %d", rc.ErrorCode)
	}
	if got := respAssignment(rc); got.size() != 0 {
		t.Fatalf("c was given %v while a and b still own every partition", got)
	}
	recv(t, jd, "parked join of d")
}
