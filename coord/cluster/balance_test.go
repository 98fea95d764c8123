package cluster

import (
	"reflect"
	"testing"

	"github.com/kaas-go/kaas/coord/topology"
)

var (
	topicA = [16]byte{0xa}
	topicB = [16]byte{0xb}
)

func pid(t [16]byte, p int32) ResourceID { return ResourceID{Kind: KindPartition, TopicID: t, N: p} }

func brokers(ids ...int32) []BrokerState {
	var bs []BrokerState
	for _, id := range ids {
		bs = append(bs, BrokerState{ID: id, Inc: incOf(id)})
	}
	return bs
}

func incOf(id int32) string { return "i" + string(rune('0'+id)) }

// applyWrites plays a tick's writes onto current, bumping ModRevs as etcd would.
func applyWrites(cur map[ResourceID]StoredAssignment, ws []Write, rev *int64) {
	for _, w := range ws {
		if w.New == nil {
			delete(cur, w.ID)
			continue
		}
		*rev++
		cur[w.ID] = StoredAssignment{Assignment: *w.New, ModRev: *rev}
	}
}

func loads(cur map[ResourceID]StoredAssignment, k ResourceKind) map[int32]int {
	m := map[int32]int{}
	for id, a := range cur {
		if id.Kind == k {
			m[a.Broker]++
		}
	}
	return m
}

// converge runs ticks until a tick writes nothing and returns how many ticks wrote something.
func converge(t *testing.T, in BalanceInput, maxTicks int) int {
	t.Helper()
	var rev int64 = 1000
	for tick := 0; tick < maxTicks; tick++ {
		res := Balance(in)
		if len(res.Writes) == 0 {
			return tick
		}
		moves := 0
		for _, w := range res.Writes {
			if w.New != nil && w.New.Prev.Broker >= 0 {
				if reg := findBroker(in.Brokers, w.New.Prev.Broker); reg != nil && reg.Inc == w.New.Prev.Inc {
					moves++ // a graceful move (live or draining holder)
				}
			}
		}
		if in.MovesPerTick > 0 && moves > in.MovesPerTick {
			t.Fatalf("tick %d: %d graceful moves > MovesPerTick %d", tick, moves, in.MovesPerTick)
		}
		applyWrites(in.Current, res.Writes, &rev)
	}
	t.Fatalf("no convergence in %d ticks", maxTicks)
	return 0
}

func findBroker(bs []BrokerState, id int32) *BrokerState {
	for i := range bs {
		if bs[i].ID == id {
			return &bs[i]
		}
	}
	return nil
}

func assertSpread(t *testing.T, cur map[ResourceID]StoredAssignment, alive []int32) {
	t.Helper()
	for k := ResourceKind(0); k < numKinds; k++ {
		l := loads(cur, k)
		lo, hi := -1, -1
		for _, b := range alive {
			if lo < 0 || l[b] < lo {
				lo = l[b]
			}
			if l[b] > hi {
				hi = l[b]
			}
		}
		if hi-lo > 1 {
			t.Fatalf("%v loads %v not within ±1 over %v", k, l, alive)
		}
		for b := range l {
			found := false
			for _, a := range alive {
				found = found || a == b
			}
			if !found {
				t.Fatalf("%v: broker %d still holds %d after convergence", k, b, l[b])
			}
		}
	}
}

func TestBalanceFirstPlacementSpreadsAtEpochOne(t *testing.T) {
	in := BalanceInput{Brokers: brokers(1, 2, 3), Topics: []TopicPartitions{{topicA, 6}}, Current: map[ResourceID]StoredAssignment{}}
	res := Balance(in) // MovesPerTick 0: first placements are not moves
	if n := len(res.Writes); n != 6+topology.NumTxnSlots+topology.NumGroupShards {
		t.Fatalf("%d writes, want every resource placed", n)
	}
	for i, w := range res.Writes {
		if w.New == nil || w.New.Epoch != 1 || w.New.Prev != noHolder || w.ModRev != 0 || w.New.Inc != incOf(w.New.Broker) {
			t.Fatalf("write %d = %+v %+v, want epoch 1, no prev, key absent, holder's inc", i, w, w.New)
		}
		if i > 0 && !res.Writes[i-1].ID.less(w.ID) {
			t.Fatalf("writes not sorted at %d", i)
		}
	}
	var rev int64
	applyWrites(in.Current, res.Writes, &rev)
	if l := loads(in.Current, KindPartition); l[1] != 2 || l[2] != 2 || l[3] != 2 {
		t.Fatalf("partition loads %v", l)
	}
	if l := loads(in.Current, KindTxnSlot); l[1] != 17 || l[2] != 17 || l[3] != 16 {
		t.Fatalf("slot loads %v", l)
	}
	if again := Balance(in); len(again.Writes) != 0 {
		t.Fatalf("a balanced cluster rewrote %d assignments", len(again.Writes))
	}
}

func TestBalanceKeepsLiveHoldersInPlace(t *testing.T) {
	// Everything on broker 1, but broker 2 exists: only smoothing may move, within the budget,
	// and nothing placed on a live holder moves otherwise.
	in := BalanceInput{Brokers: brokers(1, 2), Topics: []TopicPartitions{{topicA, 4}}, Current: map[ResourceID]StoredAssignment{}, MovesPerTick: 0}
	var rev int64
	applyWrites(in.Current, Balance(BalanceInput{Brokers: brokers(1), Topics: in.Topics, Current: map[ResourceID]StoredAssignment{}}).Writes, &rev)
	res := Balance(in)
	if len(res.Writes) != 0 || res.Deferred == 0 {
		t.Fatalf("budget 0: writes %d deferred %d, want 0 and >0", len(res.Writes), res.Deferred)
	}
}

func TestBalanceDeadBrokerOrphansMoveAtOnceWithEpochPlusOne(t *testing.T) {
	in := BalanceInput{Brokers: brokers(1, 2, 3), Topics: []TopicPartitions{{topicA, 9}}, Current: map[ResourceID]StoredAssignment{}}
	var rev int64
	applyWrites(in.Current, Balance(in).Writes, &rev)
	held3 := map[ResourceID]StoredAssignment{}
	for id, a := range in.Current {
		if a.Broker == 3 {
			held3[id] = a
		}
	}
	in.Brokers = brokers(1, 2) // 3's lease expired
	in.MovesPerTick = 1        // does not bound crash takeovers
	res := Balance(in)
	if len(res.Writes) != len(held3) {
		t.Fatalf("%d writes, want the %d orphans of broker 3", len(res.Writes), len(held3))
	}
	for _, w := range res.Writes {
		old, ok := held3[w.ID]
		if !ok || w.New == nil {
			t.Fatalf("unexpected write %+v", w)
		}
		if w.New.Epoch != old.Epoch+1 || w.New.Prev != old.Holder || w.ModRev != old.ModRev || w.New.Broker == 3 {
			t.Fatalf("%v: %+v from %+v, want epoch+1, prev = old holder, guarded by its ModRev", w.ID, w.New, old)
		}
	}
	applyWrites(in.Current, res.Writes, &rev)
	assertSpread(t, in.Current, []int32{1, 2})
}

func TestBalanceRestartedIncarnationIsNotTheHolder(t *testing.T) {
	in := BalanceInput{Brokers: brokers(1, 2), Topics: []TopicPartitions{{topicA, 2}}, Current: map[ResourceID]StoredAssignment{}}
	var rev int64
	applyWrites(in.Current, Balance(in).Writes, &rev)
	in.Brokers[1].Inc = "new" // broker 2 restarted: a new lease, holding nothing
	res := Balance(in)
	moved := 0
	for _, w := range res.Writes {
		if w.New.Prev.Broker == 2 && w.New.Prev.Inc == incOf(2) {
			moved++
			if w.New.Broker == 2 && w.New.Inc != "new" {
				t.Fatalf("reassigned to the old incarnation: %+v", w.New)
			}
		}
	}
	if want := 1 + 25 + 25; moved != want {
		t.Fatalf("%d orphans of the old incarnation moved, want %d", moved, want)
	}
}

func TestBalanceDrainingBrokerMovesInBoundedBatches(t *testing.T) {
	in := BalanceInput{Brokers: brokers(1, 2, 3), Topics: []TopicPartitions{{topicA, 30}}, Current: map[ResourceID]StoredAssignment{}}
	var rev int64
	applyWrites(in.Current, Balance(in).Writes, &rev)
	in.Brokers[1].Draining = true
	in.MovesPerTick = 8
	total := 10 + 17 + 17 // broker 2's partitions, slots and shards
	res := Balance(in)
	if len(res.Writes) != 8 || res.Deferred != total-8 {
		t.Fatalf("first drain tick: %d writes, %d deferred; want 8 and %d", len(res.Writes), res.Deferred, total-8)
	}
	for _, w := range res.Writes {
		if w.New.Prev.Broker != 2 || w.New.Broker == 2 {
			t.Fatalf("drain moved %+v", w.New)
		}
	}
	ticks := converge(t, in, 20)
	if ticks < total/8 {
		t.Fatalf("drain took %d ticks, the bound allows no fewer than %d", ticks, total/8)
	}
	assertSpread(t, in.Current, []int32{1, 3})
}

func TestBalanceNewcomerFillsGradually(t *testing.T) {
	in := BalanceInput{Brokers: brokers(1, 2), Topics: []TopicPartitions{{topicA, 8}, {topicB, 4}}, Current: map[ResourceID]StoredAssignment{}}
	var rev int64
	applyWrites(in.Current, Balance(in).Writes, &rev)
	in.Brokers = brokers(1, 2, 3)
	in.MovesPerTick = 2
	before := map[ResourceID]StoredAssignment{}
	for k, v := range in.Current {
		before[k] = v
	}
	ticks := converge(t, in, 100)
	// Broker 3 ends with 4 partitions, 16 or 17 slots and shards, about 37 moves at 2 a tick.
	if ticks < 18 {
		t.Fatalf("newcomer converged in %d ticks: the bound of 2 moves per tick was not applied", ticks)
	}
	assertSpread(t, in.Current, []int32{1, 2, 3})
	// Only moves to the newcomer happened: 1 and 2 kept everything they did not give away.
	for id, now := range in.Current {
		was := before[id]
		if now.Broker != was.Broker && now.Broker != 3 {
			t.Fatalf("%v moved %d → %d, want only moves to the newcomer", id, was.Broker, now.Broker)
		}
		if now.Broker != was.Broker && now.Epoch != was.Epoch+1 {
			t.Fatalf("%v moved once but epoch %d → %d", id, was.Epoch, now.Epoch)
		}
	}
}

func TestBalanceDeletesAssignmentsOfDeletedTopics(t *testing.T) {
	in := BalanceInput{Brokers: brokers(1), Topics: []TopicPartitions{{topicA, 2}, {topicB, 1}}, Current: map[ResourceID]StoredAssignment{}}
	var rev int64
	applyWrites(in.Current, Balance(in).Writes, &rev)
	in.Topics = in.Topics[:1]
	res := Balance(in)
	if len(res.Writes) != 1 || res.Writes[0].ID != pid(topicB, 0) || res.Writes[0].New != nil || res.Writes[0].ModRev != in.Current[pid(topicB, 0)].ModRev {
		t.Fatalf("writes %+v, want one guarded delete of topic B's partition", res.Writes)
	}
}

func TestBalanceWithNoAliveBrokerChangesNothing(t *testing.T) {
	in := BalanceInput{Brokers: brokers(1), Topics: []TopicPartitions{{topicA, 2}}, Current: map[ResourceID]StoredAssignment{}}
	var rev int64
	applyWrites(in.Current, Balance(in).Writes, &rev)
	in.Brokers[0].Draining = true
	in.MovesPerTick = 64
	if res := Balance(in); len(res.Writes) != 0 {
		t.Fatalf("the only broker is draining: %d writes, want none (it keeps serving)", len(res.Writes))
	}
	in.Brokers = nil
	if res := Balance(in); len(res.Writes) != 0 {
		t.Fatalf("no broker: %d writes, want none", len(res.Writes))
	}
}

func TestBalanceIsDeterministic(t *testing.T) {
	mk := func() BalanceInput {
		in := BalanceInput{Brokers: brokers(1, 2), Topics: []TopicPartitions{{topicB, 5}, {topicA, 7}}, Current: map[ResourceID]StoredAssignment{}}
		var rev int64
		applyWrites(in.Current, Balance(in).Writes, &rev)
		in.Brokers = []BrokerState{{ID: 4, Inc: "x"}, {ID: 1, Inc: incOf(1)}, {ID: 3, Inc: "y"}}
		in.MovesPerTick = 5
		return in
	}
	first := Balance(mk())
	for i := 0; i < 20; i++ {
		if got := Balance(mk()); !reflect.DeepEqual(got, first) {
			t.Fatalf("run %d differs", i)
		}
	}
}

func TestAssignmentWireFormat(t *testing.T) {
	a := Assignment{Holder: Holder{Broker: 2, Inc: "abc", Epoch: 4}, Prev: Holder{Broker: 0, Inc: "def", Epoch: 3}}
	p := string(encodeAssignment(KindPartition, a))
	if p != `{"leader":2,"inc":"abc","epoch":4,"prev":{"leader":0,"inc":"def","epoch":3}}` {
		t.Fatalf("partition value %s", p)
	}
	g := string(encodeAssignment(KindGroupShard, Assignment{Holder: a.Holder, Prev: noHolder}))
	if g != `{"owner":2,"inc":"abc","epoch":4}` {
		t.Fatalf("shard value %s", g)
	}
	for _, v := range []string{p, g} {
		back, err := decodeAssignment([]byte(v))
		if err != nil {
			t.Fatal(err)
		}
		want := a
		if v == g {
			want.Prev = noHolder
		}
		if back != want {
			t.Fatalf("%s decoded as %+v", v, back)
		}
	}
	if _, err := decodeAssignment([]byte(`{"inc":"x"}`)); err == nil {
		t.Fatal("an assignment without a holder decoded")
	}
}

func TestKeysRoundTrip(t *testing.T) {
	const pfx = "/kaas/c/"
	for _, id := range []ResourceID{pid(topicA, 7), {Kind: KindTxnSlot, N: 49}, {Kind: KindGroupShard, N: 0}} {
		k := assignKey(pfx, id)
		if got, ok := parseAssignKey(pfx, k); !ok || got != id {
			t.Fatalf("%s → %v %v", k, got, ok)
		}
		r := releaseKey(pfx, id, 12)
		if got, e, ok := parseReleaseKey(pfx, r); !ok || got != id || e != 12 {
			t.Fatalf("%s → %v %d %v", r, got, e, ok)
		}
		if _, ok := parseAssignKey(pfx, r); ok {
			t.Fatalf("release key %s parsed as an assignment", r)
		}
	}
	if k := assignKey(pfx, pid(topicA, 3)); k != "/kaas/c/assign/p/0a000000000000000000000000000000/3" {
		t.Fatalf("key %s", k)
	}
	for _, bad := range []string{"/kaas/c/assign/p/zz/1", "/kaas/c/assign/txn/x", "/kaas/c/assign/grp/-1", "/kaas/c/assign/other/1"} {
		if _, ok := parseAssignKey(pfx, bad); ok {
			t.Fatalf("%s parsed", bad)
		}
	}
}

func TestStaleReleasesAreTheOnesNoSuccessorNeeds(t *testing.T) {
	v := clusterView{
		in: BalanceInput{
			Topics: []TopicPartitions{{topicA, 2}},
			Current: map[ResourceID]StoredAssignment{
				pid(topicA, 0):                {Assignment: Assignment{Holder: Holder{Broker: 1, Epoch: 5}}},
				{Kind: KindTxnSlot, N: 3}:     {Assignment: Assignment{Holder: Holder{Broker: 1, Epoch: 2}}},
				{Kind: KindGroupShard, N: 49}: {Assignment: Assignment{Holder: Holder{Broker: 1, Epoch: 9}}},
			},
		},
		releases: []releaseRef{
			{id: pid(topicA, 0), epoch: 4, key: "a4"},                      // read by the holder of 5: keep
			{id: pid(topicA, 0), epoch: 3, key: "a3"},                      // superseded: drop
			{id: ResourceID{Kind: KindTxnSlot, N: 3}, epoch: 1, key: "s1"}, // keep
			// The assignee of 3 has neither released nor forwarded (no release 3): it still
			// needs release 2 even though the assignment is at 9 (the stranded-forward case).
			{id: ResourceID{Kind: KindGroupShard, N: 49}, epoch: 2, key: "g2"},
			{id: ResourceID{Kind: KindGroupShard, N: 49}, epoch: 7, key: "g7"}, // release 8 exists: drop
			{id: ResourceID{Kind: KindGroupShard, N: 49}, epoch: 8, key: "g8"}, // read by the holder of 9: keep
			{id: pid(topicB, 0), epoch: 1, key: "b1"},                          // topic gone
		},
	}
	var got []string
	for _, r := range staleReleases(v) {
		got = append(got, r.key)
	}
	if want := []string{"a3", "b1", "g7"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("stale releases %v, want %v", got, want)
	}
}
