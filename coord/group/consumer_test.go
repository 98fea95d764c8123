package group

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func tid(b byte) topicID { return topicID{b} }

func subs(ts ...topicID) map[topicID]bool {
	m := make(map[topicID]bool)
	for _, t := range ts {
		m[t] = true
	}
	return m
}

// checkComplete fails unless every partition of partitions is assigned exactly once, to a member
// subscribed to its topic.
func checkComplete(t *testing.T, members []assignMember, partitions map[topicID]int32, got map[string]assignment) {
	t.Helper()
	seen := make(map[topicPart]string)
	for _, m := range members {
		for _, tp := range got[m.id].parts() {
			if !m.topics[tp.topic] {
				t.Fatalf("member %s got %v of a topic it does not subscribe to", m.id, tp)
			}
			if o, dup := seen[tp]; dup {
				t.Fatalf("partition %v assigned to %s and %s", tp, o, m.id)
			}
			seen[tp] = m.id
		}
	}
	for _, tp := range allParts(partitions) {
		if _, ok := seen[tp]; !ok {
			t.Fatalf("partition %v is not assigned", tp)
		}
	}
}

func TestUniformAssignorBalancesWithinOne(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7} {
		for _, p := range []int32{1, 6, 10, 13, 32} {
			parts := map[topicID]int32{tid(1): p, tid(2): p / 2}
			var ms []assignMember
			for i := 0; i < n; i++ {
				ms = append(ms, assignMember{id: fmt.Sprintf("m%d", i), topics: subs(tid(1), tid(2))})
			}
			got := uniformAssignor{}.assign(ms, parts)
			checkComplete(t, ms, parts, got)
			lo, hi := 1<<30, -1
			for _, m := range ms {
				s := got[m.id].size()
				lo, hi = min(lo, s), max(hi, s)
			}
			if hi-lo > 1 {
				t.Fatalf("n=%d p=%d: loads range %d..%d, want within one", n, p, lo, hi)
			}
		}
	}
}

// TestUniformAssignorIsSticky: a member joining takes only the partitions needed to balance, and
// a member leaving moves only its own partitions.
func TestUniformAssignorIsSticky(t *testing.T) {
	parts := map[topicID]int32{tid(1): 12}
	ms := []assignMember{{id: "a", topics: subs(tid(1))}, {id: "b", topics: subs(tid(1))}}
	first := uniformAssignor{}.assign(ms, parts)
	for i := range ms {
		ms[i].current = first[ms[i].id]
	}
	ms = append(ms, assignMember{id: "c", topics: subs(tid(1))})
	second := uniformAssignor{}.assign(ms, parts)
	checkComplete(t, ms, parts, second)
	moved := 0
	for _, id := range []string{"a", "b"} {
		moved += first[id].minus(second[id]).size()
	}
	if moved != 4 || second["c"].size() != 4 {
		t.Fatalf("join of a third member moved %d partitions (c has %d), want 4 and 4", moved, second["c"].size())
	}
	// b leaves: a and c keep everything they had and split b's four.
	ms2 := []assignMember{{id: "a", topics: subs(tid(1)), current: second["a"]}, {id: "c", topics: subs(tid(1)), current: second["c"]}}
	third := uniformAssignor{}.assign(ms2, parts)
	checkComplete(t, ms2, parts, third)
	for _, id := range []string{"a", "c"} {
		if lost := second[id].minus(third[id]).size(); lost != 0 {
			t.Fatalf("member %s lost %d partitions when another left", id, lost)
		}
		if third[id].size() != 6 {
			t.Fatalf("member %s has %d partitions, want 6", id, third[id].size())
		}
	}
}

func TestUniformAssignorHeterogeneousSubscriptions(t *testing.T) {
	parts := map[topicID]int32{tid(1): 4, tid(2): 4}
	ms := []assignMember{
		{id: "a", topics: subs(tid(1))},
		{id: "b", topics: subs(tid(1), tid(2))},
		{id: "c", topics: subs(tid(2))},
	}
	got := uniformAssignor{}.assign(ms, parts)
	checkComplete(t, ms, parts, got)
	for _, m := range ms {
		if s := got[m.id].size(); s < 2 || s > 3 {
			t.Fatalf("member %s has %d partitions, want 2 or 3 (%v)", m.id, s, got)
		}
	}
}

func TestRangeAssignorPerTopic(t *testing.T) {
	parts := map[topicID]int32{tid(1): 3, tid(2): 5}
	ms := []assignMember{
		{id: "b", topics: subs(tid(1), tid(2))},
		{id: "a", topics: subs(tid(1), tid(2))},
	}
	got := rangeAssignor{}.assign(ms, parts)
	checkComplete(t, ms, parts, got)
	want := map[string]assignment{
		"a": {tid(1): {0, 1}, tid(2): {0, 1, 2}},
		"b": {tid(1): {2}, tid(2): {3, 4}},
	}
	for id, w := range want {
		if !got[id].equal(w) {
			t.Fatalf("member %s: got %v, want %v", id, got[id], w)
		}
	}
	// A topic only one member subscribes to goes wholly to it.
	ms = append(ms, assignMember{id: "c", topics: subs(tid(3))})
	parts[tid(3)] = 2
	got = rangeAssignor{}.assign(ms, parts)
	checkComplete(t, ms, parts, got)
	if !got["c"].equal(assignment{tid(3): {0, 1}}) {
		t.Fatalf("member c: got %v", got["c"])
	}
}

func TestReconcileRevokesBeforeAssigning(t *testing.T) {
	t1 := tid(1)
	held := map[topicPart]string{}
	heldByOther := func(me string) func(topicID, int32) bool {
		return func(t topicID, p int32) bool { h, ok := held[topicPart{t, p}]; return ok && h != me }
	}
	// a holds 0..3 at epoch 1; the target of epoch 2 gives a {0,1} and b {2,3}.
	a := reconcileState{state: memberStable, epoch: 1, assigned: assignment{t1: {0, 1, 2, 3}}}
	for p := int32(0); p < 4; p++ {
		held[topicPart{t1, p}] = "a"
	}
	b := reconcileState{state: memberStable, epoch: 0, assigned: assignment{}}
	targetA, targetB := assignment{t1: {0, 1}}, assignment{t1: {2, 3}}

	b = reconcile(b, 2, targetB, assignment{}, heldByOther("b"))
	if b.state != memberUnreleasedPartitions || b.epoch != 2 || b.assigned.size() != 0 {
		t.Fatalf("b before a revoked: %+v, want UnreleasedPartitions at epoch 2 with nothing", b)
	}
	a = reconcile(a, 2, targetA, assignment{t1: {0, 1, 2, 3}}, heldByOther("a"))
	if a.state != memberUnrevokedPartitions || a.epoch != 1 || !a.assigned.equal(targetA) || !a.revoking.equal(targetB) {
		t.Fatalf("a: %+v, want UnrevokedPartitions at epoch 1 keeping {0,1}, revoking {2,3}", a)
	}
	// a's heartbeat without owned partitions (or still owning 2) changes nothing.
	if a2 := reconcile(a, 2, targetA, nil, heldByOther("a")); a2.state != memberUnrevokedPartitions {
		t.Fatalf("a without owned partitions moved on: %+v", a2)
	}
	if a2 := reconcile(a, 2, targetA, assignment{t1: {0, 1, 2}}, heldByOther("a")); a2.state != memberUnrevokedPartitions {
		t.Fatalf("a still owning 2 moved on: %+v", a2)
	}
	a = reconcile(a, 2, targetA, assignment{t1: {0, 1}}, heldByOther("a"))
	if a.state != memberStable || a.epoch != 2 || !a.assigned.equal(targetA) {
		t.Fatalf("a after revoking: %+v, want Stable at epoch 2", a)
	}
	delete(held, topicPart{t1, 2})
	delete(held, topicPart{t1, 3})
	b = reconcile(b, 2, targetB, assignment{}, heldByOther("b"))
	if b.state != memberStable || b.epoch != 2 || !b.assigned.equal(targetB) {
		t.Fatalf("b after a revoked: %+v, want Stable at epoch 2 with {2,3}", b)
	}
}

// cgHarness drives a coordinator's consumer groups over a fixed topic list.
type cgHarness struct {
	*harness
	topics []TopicInfo
}

func newCGHarness(t *testing.T, topics ...TopicInfo) *cgHarness {
	ch := &cgHarness{topics: topics}
	ch.harness = newHarness(t, func(c *Config) {
		c.Consumer = ConsumerConfig{SessionTimeout: time.Minute, HeartbeatInterval: time.Second, MaxSize: 3, Assignors: []string{"uniform", "range"}}
		c.Topics = func() []TopicInfo { return ch.topics }
	})
	return ch
}

func (ch *cgHarness) hb(req *kmsg.ConsumerGroupHeartbeatRequest) *kmsg.ConsumerGroupHeartbeatResponse {
	ch.t.Helper()
	req.Version = 1
	if req.Group == "" {
		req.Group = "g"
	}
	ch2 := make(chan *kmsg.ConsumerGroupHeartbeatResponse, 1)
	ch.c.ConsumerGroupHeartbeat(req, "client", "/127.0.0.1", nil, func(r *kmsg.ConsumerGroupHeartbeatResponse) { ch2 <- r })
	select {
	case r := <-ch2:
		return r
	case <-time.After(waitFor):
		ch.t.Fatal("no heartbeat response")
		return nil
	}
}

func cgJoinReq(member string, topics ...string) *kmsg.ConsumerGroupHeartbeatRequest {
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.MemberID = member
	req.MemberEpoch = 0
	req.RebalanceTimeoutMillis = 60000
	req.SubscribedTopicNames = topics
	req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	return req
}

func hbReq(member string, epoch int32, owned assignment) *kmsg.ConsumerGroupHeartbeatRequest {
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.MemberID = member
	req.MemberEpoch = epoch
	req.RebalanceTimeoutMillis = -1
	if owned != nil {
		req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		for t, ps := range owned {
			rt := kmsg.NewConsumerGroupHeartbeatRequestTopic()
			rt.TopicID, rt.Partitions = t, ps
			req.Topics = append(req.Topics, rt)
		}
	}
	return req
}

func respAssignment(r *kmsg.ConsumerGroupHeartbeatResponse) assignment {
	if r.Assignment == nil {
		return nil
	}
	a := assignment{}
	for _, t := range r.Assignment.Topics {
		if len(t.Partitions) > 0 {
			a[t.TopicID] = t.Partitions
		}
	}
	return a
}

func TestConsumerHeartbeatReconciliation(t *testing.T) {
	t1 := tid(1)
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: t1, Partitions: 4})
	ra := ch.hb(cgJoinReq("a", "t"))
	if ra.ErrorCode != 0 || ra.MemberEpoch != 1 || respAssignment(ra).size() != 4 {
		t.Fatalf("first join: %+v", ra)
	}
	rb := ch.hb(cgJoinReq("b", "t"))
	if rb.ErrorCode != 0 || rb.MemberEpoch != 2 || respAssignment(rb).size() != 0 {
		t.Fatalf("second join must wait for a to revoke: code %d epoch %d assignment %v", rb.ErrorCode, rb.MemberEpoch, respAssignment(rb))
	}
	// a learns of the revocation: keeps two, epoch stays 1.
	ra = ch.hb(hbReq("a", 1, assignment{t1: {0, 1, 2, 3}}))
	kept := respAssignment(ra)
	if ra.ErrorCode != 0 || ra.MemberEpoch != 1 || kept.size() != 2 {
		t.Fatalf("a's revocation: code %d epoch %d assignment %v", ra.ErrorCode, ra.MemberEpoch, kept)
	}
	// b still gets nothing while a holds them.
	if rb = ch.hb(hbReq("b", 2, assignment{})); respAssignment(rb).size() != 0 {
		t.Fatalf("b got %v before a revoked", respAssignment(rb))
	}
	// A commit by a at its epoch works; at another it is stale.
	commit := func(member string, epoch int32) int16 {
		done := make(chan int16, 1)
		ch.c.CommitOffsets(Commit{Group: "g", Generation: epoch, MemberID: member, Version: 9},
			[]storage.GroupOffset{{Topic: "t", Partition: 0, Offset: 1}}, func(c int16) { done <- c })
		return <-done
	}
	if c := commit("a", 1); c != 0 {
		t.Fatalf("commit at a's epoch: %d", c)
	}
	if c := commit("a", 2); c != codec.CodeStaleMemberEpoch {
		t.Fatalf("commit at a wrong epoch: %d, want STALE_MEMBER_EPOCH", c)
	}
	if c := commit("zz", 1); c != codec.CodeUnknownMemberID {
		t.Fatalf("commit by an unknown member: %d, want UNKNOWN_MEMBER_ID", c)
	}
	ra = ch.hb(hbReq("a", 1, kept))
	if ra.MemberEpoch != 2 {
		t.Fatalf("a after revoking: epoch %d, want 2", ra.MemberEpoch)
	}
	rb = ch.hb(hbReq("b", 2, assignment{}))
	got := respAssignment(rb)
	if got.size() != 2 || got.overlaps(kept) {
		t.Fatalf("b after a revoked: %v (a kept %v)", got, kept)
	}
	// A heartbeat at a future epoch is fenced; an unknown member is unknown.
	if r := ch.hb(hbReq("a", 7, nil)); r.ErrorCode != codec.CodeFencedMemberEpoch {
		t.Fatalf("future epoch: %d, want FENCED_MEMBER_EPOCH", r.ErrorCode)
	}
	if r := ch.hb(hbReq("nobody", 2, nil)); r.ErrorCode != codec.CodeUnknownMemberID {
		t.Fatalf("unknown member: %d", r.ErrorCode)
	}
	// b leaves: a gets everything back at epoch 3.
	leave := hbReq("b", -1, nil)
	if r := ch.hb(leave); r.ErrorCode != 0 || r.MemberEpoch != -1 {
		t.Fatalf("leave: %+v", r)
	}
	ra = ch.hb(hbReq("a", 2, kept))
	if ra.MemberEpoch != 3 || respAssignment(ra).size() != 4 {
		t.Fatalf("a after b left: epoch %d assignment %v", ra.MemberEpoch, respAssignment(ra))
	}
}

func TestConsumerStaticMemberRejoinKeepsAssignment(t *testing.T) {
	t1 := tid(1)
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: t1, Partitions: 4})
	inst := "i1"
	j := cgJoinReq("a", "t")
	j.InstanceID = &inst
	ra := ch.hb(j)
	ch.hb(cgJoinReq("b", "t"))
	ra = ch.hb(hbReq("a", ra.MemberEpoch, respAssignment(ra)))
	held := respAssignment(ra) // the two it keeps
	if ra = ch.hb(hbReq("a", ra.MemberEpoch, held)); ra.ErrorCode != 0 || ra.MemberEpoch != 2 || held.size() != 2 {
		t.Fatalf("static member at epoch %d holds %v", ra.MemberEpoch, held)
	}
	// Another process with the same instance id is refused while a is in.
	j2 := cgJoinReq("a2", "t")
	j2.InstanceID = &inst
	if r := ch.hb(j2); r.ErrorCode != codec.CodeUnreleasedInstanceID {
		t.Fatalf("second instance: %d, want UNRELEASED_INSTANCE_ID", r.ErrorCode)
	}
	leave := hbReq("a", -2, nil)
	leave.InstanceID = &inst
	if r := ch.hb(leave); r.ErrorCode != 0 || r.MemberEpoch != -2 {
		t.Fatalf("static leave: %+v", r)
	}
	epochBefore := ch.describe(t).Epoch
	r := ch.hb(j2)
	if r.ErrorCode != 0 || !respAssignment(r).equal(held) {
		t.Fatalf("static rejoin: code %d assignment %v, want %v", r.ErrorCode, respAssignment(r), held)
	}
	if d := ch.describe(t); d.Epoch != epochBefore {
		t.Fatalf("static rejoin moved the group epoch %d → %d", epochBefore, d.Epoch)
	}
}

func (ch *cgHarness) describe(t *testing.T) kmsg.ConsumerGroupDescribeResponseGroup {
	t.Helper()
	out := make(chan kmsg.ConsumerGroupDescribeResponseGroup, 1)
	ch.c.DescribeConsumerGroup("g", func(d kmsg.ConsumerGroupDescribeResponseGroup) { out <- d })
	d := <-out
	if d.ErrorCode != 0 {
		t.Fatalf("describe: %d", d.ErrorCode)
	}
	return d
}

func TestConsumerHeartbeatValidation(t *testing.T) {
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: tid(1), Partitions: 1})
	bad := cgJoinReq("a", "t")
	bad.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{{TopicID: tid(1), Partitions: []int32{0}}}
	if r := ch.hb(bad); r.ErrorCode != codec.CodeInvalidRequest {
		t.Fatalf("join with owned partitions: %d", r.ErrorCode)
	}
	a := "nope"
	bad = cgJoinReq("a", "t")
	bad.ServerAssignor = &a
	if r := ch.hb(bad); r.ErrorCode != codec.CodeUnsupportedAssignor {
		t.Fatalf("unknown assignor: %d", r.ErrorCode)
	}
	re := "("
	bad = cgJoinReq("a")
	bad.SubscribedTopicNames = nil
	bad.SubscribedTopicRegex = &re
	if r := ch.hb(bad); r.ErrorCode != codec.CodeInvalidRegularExpression {
		t.Fatalf("bad regex: %d", r.ErrorCode)
	}
	if r := ch.hb(hbReq("a", 3, nil)); r.ErrorCode != codec.CodeGroupIDNotFound {
		t.Fatalf("heartbeat for an unknown group: %d", r.ErrorCode)
	}
	for _, m := range []string{"a", "b", "c"} {
		if r := ch.hb(cgJoinReq(m, "t")); r.ErrorCode != 0 {
			t.Fatalf("join %s: %d", m, r.ErrorCode)
		}
	}
	if r := ch.hb(cgJoinReq("d", "t")); r.ErrorCode != codec.CodeGroupMaxSizeReached {
		t.Fatalf("join past group.consumer.max.size: %d", r.ErrorCode)
	}
	// A classic JoinGroup for a full consumer group is refused GROUP_MAX_SIZE_REACHED (Apache
	// checks the size before the protocol).
	jr := kmsg.NewPtrJoinGroupRequest()
	jr.Group, jr.ProtocolType, jr.SessionTimeoutMillis, jr.RebalanceTimeoutMillis = "g", "consumer", 10000, 10000
	jr.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{0}}}
	done := make(chan int16, 1)
	ch.c.JoinGroup(jr, "c", "/h", func(r *kmsg.JoinGroupResponse) { done <- r.ErrorCode })
	if c := <-done; c != codec.CodeGroupMaxSizeReached {
		t.Fatalf("classic join of a full consumer group: %d", c)
	}
	if ls := ch.c.ListGroups(nil); len(ls) != 1 || ls[0].Type != "consumer" || ls[0].ProtocolType != "consumer" {
		t.Fatalf("ListGroups: %+v", ls)
	}
}

// TestConsumerGroupSurvivesRestart: the group epoch, member epochs and assignments come back
// after a restart, so members go on heartbeating and committing at their epochs.
func TestConsumerGroupSurvivesRestart(t *testing.T) {
	t1 := tid(1)
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: t1, Partitions: 4})
	ra := ch.hb(cgJoinReq("a", "t"))
	rb := ch.hb(cgJoinReq("b", "t"))
	ra = ch.hb(hbReq("a", ra.MemberEpoch, respAssignment(ra)))
	keptA := respAssignment(ra)
	ra = ch.hb(hbReq("a", ra.MemberEpoch, keptA))
	rb = ch.hb(hbReq("b", rb.MemberEpoch, assignment{}))
	gotB := respAssignment(rb)
	if ra.MemberEpoch != 2 || rb.MemberEpoch != 2 || keptA.size() != 2 || gotB.size() != 2 {
		t.Fatalf("before restart: a at %d with %v, b at %d with %v", ra.MemberEpoch, keptA, rb.MemberEpoch, gotB)
	}
	before := ch.describe(t)
	ch.restart()
	after := ch.describe(t)
	if after.Epoch != before.Epoch || after.AssignmentEpoch != before.AssignmentEpoch || len(after.Members) != 2 || after.State != "Stable" {
		t.Fatalf("after restart: %+v, before %+v", after, before)
	}
	// Heartbeats at the members' epochs go on without a fence; a full heartbeat gets the same
	// assignment back.
	full := hbReq("b", 2, gotB)
	full.RebalanceTimeoutMillis = 60000
	full.SubscribedTopicNames = []string{"t"}
	r := ch.hb(full)
	if r.ErrorCode != 0 || r.MemberEpoch != 2 || !respAssignment(r).equal(gotB) {
		t.Fatalf("b after restart: code %d epoch %d assignment %v", r.ErrorCode, r.MemberEpoch, respAssignment(r))
	}
	done := make(chan int16, 1)
	ch.c.CommitOffsets(Commit{Group: "g", Generation: 2, MemberID: "a", Version: 9},
		[]storage.GroupOffset{{Topic: "t", Partition: keptA.parts()[0].partition, Offset: 3}}, func(c int16) { done <- c })
	if c := <-done; c != 0 {
		t.Fatalf("commit at a's epoch after restart: %d", c)
	}
	if d := ch.describe(t); d.Epoch != before.Epoch {
		t.Fatalf("the group epoch moved after the restart: %d → %d", before.Epoch, d.Epoch)
	}
}

// TestConsumerGroupRebalancesOnAddedPartitions: partitions added to a subscribed topic move the
// group epoch and reach the members.
func TestConsumerGroupRebalancesOnAddedPartitions(t *testing.T) {
	t1 := tid(1)
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: t1, Partitions: 2})
	r := ch.hb(cgJoinReq("a", "t"))
	if r.MemberEpoch != 1 || respAssignment(r).size() != 2 {
		t.Fatalf("join: %+v", r)
	}
	// Safe without a lock: hb waits for each answer, so the group goroutine is not reading.
	ch.topics = []TopicInfo{{Name: "t", ID: t1, Partitions: 5}}
	r = ch.hb(hbReq("a", 1, respAssignment(r)))
	if r.ErrorCode != 0 || r.MemberEpoch != 2 || respAssignment(r).size() != 5 {
		t.Fatalf("after partitions were added: code %d epoch %d assignment %v", r.ErrorCode, r.MemberEpoch, respAssignment(r))
	}
}

// TestConsumerMemberFencedWhenRevocationTimesOut: a member that does not revoke within its
// rebalance timeout is removed, and the partitions go to the member waiting for them.
func TestConsumerMemberFencedWhenRevocationTimesOut(t *testing.T) {
	t1 := tid(1)
	ch := newCGHarness(t, TopicInfo{Name: "t", ID: t1, Partitions: 2})
	slow := cgJoinReq("slow", "t")
	slow.RebalanceTimeoutMillis = 100
	rs := ch.hb(slow)
	ch.hb(cgJoinReq("b", "t"))
	// slow learns it must give one partition up, and never does.
	if r := ch.hb(hbReq("slow", rs.MemberEpoch, respAssignment(rs))); respAssignment(r).size() != 1 {
		t.Fatalf("slow was not asked to revoke: %v", respAssignment(r))
	}
	poll(t, func() error {
		d := ch.describe(t)
		if len(d.Members) != 1 || d.Members[0].MemberID != "b" {
			return fmt.Errorf("members %d", len(d.Members))
		}
		return nil
	})
	r := ch.hb(hbReq("b", 2, assignment{}))
	if r.ErrorCode != 0 || respAssignment(r).size() != 2 {
		t.Fatalf("b after slow was fenced: code %d epoch %d assignment %v", r.ErrorCode, r.MemberEpoch, respAssignment(r))
	}
	if r := ch.hb(hbReq("slow", rs.MemberEpoch, nil)); r.ErrorCode != codec.CodeUnknownMemberID {
		t.Fatalf("fenced member's heartbeat: %d, want UNKNOWN_MEMBER_ID", r.ErrorCode)
	}
}
