package cluster

import (
	"sort"

	"github.com/kaas-go/kaas/coord/topology"
)

// The balancer: a pure function from what the controller read from etcd to the assignment
// writes of one tick. It follows the reference placement (design note §1):
//
//  1. keep every resource whose holder is registered with the same incarnation and alive;
//  2. first placements and orphans of a dead holder go to the least-loaded alive broker, all of
//     them in one tick: nobody serves them until they are placed, and there is no live holder
//     to hand over from, so delaying them only lengthens the outage;
//  3. orphans of a draining holder go to the least-loaded alive broker, bounded by MovesPerTick:
//     each is a graceful handover (design note §2.4) that makes the resource briefly
//     unavailable, so a drain proceeds in batches (§7 "Rolling restart");
//  4. smooth to ±1 per broker, moving from the most- to the least-loaded broker, within the
//     same MovesPerTick budget. A newcomer therefore fills up gradually over several ticks.
//
// Partitions, transaction slots and group shards are counted separately: a broker coordinating
// many slots is not thereby considered full of partitions.
//
// Epochs: a first assignment gets epoch 1 with no prev; epoch 0 is what single-broker files
// are read at, so a migrated single-broker data dir is simply epoch 0's holder. Every move sets
// epoch = current + 1 and prev = the current holder, the fencing token every file name and
// Kafka leader epoch carries.
//
// Ties are broken by broker id (lowest first for "least loaded", highest first for "most
// loaded") and resources are visited in sorted order, so a tick is deterministic: two
// controllers racing on the same input would write the same values (and the guard rejects the
// loser anyway).

// BrokerState is a registered broker as the balancer sees it.
type BrokerState struct {
	ID       int32
	Inc      string
	Draining bool
}

// TopicPartitions is a registered topic as the balancer sees it.
type TopicPartitions struct {
	ID         [16]byte
	Partitions int32
}

// StoredAssignment is an assignment with the etcd ModRevision it was read at, which the
// controller's write compares against.
type StoredAssignment struct {
	Assignment
	ModRev int64
}

// BalanceInput is one tick's view of etcd.
type BalanceInput struct {
	Brokers      []BrokerState
	Topics       []TopicPartitions
	Current      map[ResourceID]StoredAssignment
	MovesPerTick int // <= 0: no graceful moves (orphans of dead holders and first placements still happen)
}

// Write is one assignment change. New == nil deletes the assignment (its topic is gone).
type Write struct {
	ID     ResourceID
	New    *Assignment
	ModRev int64 // the ModRevision the key must still have (0: the key must be absent)
}

// BalanceResult is what one tick writes.
type BalanceResult struct {
	Writes   []Write
	Deferred int // graceful moves that the MovesPerTick bound pushed to a later tick
}

type balancer struct {
	in       BalanceInput
	alive    []int32 // non-draining broker ids, sorted
	reg      map[int32]BrokerState
	budget   int
	writes   []Write
	deferred int
}

// Balance computes one tick's assignment writes, sorted by resource.
func Balance(in BalanceInput) BalanceResult {
	b := &balancer{in: in, reg: make(map[int32]BrokerState, len(in.Brokers)), budget: in.MovesPerTick}
	for _, br := range in.Brokers {
		b.reg[br.ID] = br
		if !br.Draining {
			b.alive = append(b.alive, br.ID)
		}
	}
	sort.Slice(b.alive, func(i, j int) bool { return b.alive[i] < b.alive[j] })

	want := make(map[ResourceID]bool)
	var byKind [numKinds][]ResourceID
	topics := append([]TopicPartitions(nil), in.Topics...)
	sort.Slice(topics, func(i, j int) bool { return string(topics[i].ID[:]) < string(topics[j].ID[:]) })
	for _, t := range topics {
		for p := int32(0); p < t.Partitions; p++ {
			id := ResourceID{Kind: KindPartition, TopicID: t.ID, N: p}
			byKind[KindPartition] = append(byKind[KindPartition], id)
			want[id] = true
		}
	}
	for n := int32(0); n < topology.NumTxnSlots; n++ {
		id := ResourceID{Kind: KindTxnSlot, N: n}
		byKind[KindTxnSlot] = append(byKind[KindTxnSlot], id)
		want[id] = true
	}
	for n := int32(0); n < topology.NumGroupShards; n++ {
		id := ResourceID{Kind: KindGroupShard, N: n}
		byKind[KindGroupShard] = append(byKind[KindGroupShard], id)
		want[id] = true
	}

	// Assignments of deleted topics (or of partitions beyond a topic's count, which only a
	// hand-edited etcd can produce) are deleted: nobody may keep serving them.
	for id, cur := range in.Current {
		if !want[id] {
			b.writes = append(b.writes, Write{ID: id, ModRev: cur.ModRev})
		}
	}
	for k := range byKind {
		b.kind(byKind[k])
	}
	sort.Slice(b.writes, func(i, j int) bool { return b.writes[i].ID.less(b.writes[j].ID) })
	return BalanceResult{Writes: b.writes, Deferred: b.deferred}
}

// kind balances the resources of one kind (ids sorted).
func (b *balancer) kind(ids []ResourceID) {
	if len(b.alive) == 0 {
		// Nowhere to put anything: leave every assignment as it is. A draining broker keeps
		// serving what it holds, and a dead holder's resources wait for a broker to join.
		return
	}
	load := make(map[int32]int, len(b.alive))
	kept := make(map[int32][]ResourceID, len(b.alive))
	for _, id := range b.alive {
		load[id] = 0
	}
	var fresh, dead, draining []ResourceID
	for _, id := range ids {
		cur, ok := b.in.Current[id]
		if !ok {
			fresh = append(fresh, id)
			continue
		}
		br, reg := b.reg[cur.Broker]
		switch {
		case !reg || br.Inc != cur.Inc:
			// The holder's lease is gone (or it came back as a new incarnation, which holds
			// nothing): an orphan.
			dead = append(dead, id)
		case br.Draining:
			draining = append(draining, id)
		default:
			load[cur.Broker]++
			kept[cur.Broker] = append(kept[cur.Broker], id)
		}
	}
	for _, id := range fresh {
		to := b.leastLoaded(load)
		load[to]++
		b.put(id, Assignment{Holder: Holder{Broker: to, Inc: b.reg[to].Inc, Epoch: 1}, Prev: noHolder}, 0)
	}
	for _, id := range dead {
		to := b.leastLoaded(load)
		load[to]++
		b.move(id, to)
	}
	for i, id := range draining {
		if b.budget <= 0 {
			b.deferred += len(draining) - i
			break
		}
		to := b.leastLoaded(load)
		load[to]++
		b.move(id, to)
		b.budget--
	}
	// Smoothing moves only resources that stay in place this tick; anything placed above
	// already went to a least-loaded broker.
	for {
		hi, lo := b.mostLoaded(load), b.leastLoaded(load)
		if load[hi]-load[lo] <= 1 || len(kept[hi]) == 0 {
			return
		}
		if b.budget <= 0 {
			b.deferred++
			return
		}
		// Move the last of hi's resources in sorted order, so low-numbered resources stay
		// where they are across ticks.
		ks := kept[hi]
		id := ks[len(ks)-1]
		kept[hi] = ks[:len(ks)-1]
		load[hi]--
		load[lo]++
		b.move(id, lo)
		b.budget--
	}
}

// move reassigns id to broker to at the next epoch, with the current holder as prev.
func (b *balancer) move(id ResourceID, to int32) {
	cur := b.in.Current[id]
	b.put(id, Assignment{
		Holder: Holder{Broker: to, Inc: b.reg[to].Inc, Epoch: cur.Epoch + 1},
		Prev:   cur.Holder,
	}, cur.ModRev)
}

func (b *balancer) put(id ResourceID, a Assignment, modRev int64) {
	b.writes = append(b.writes, Write{ID: id, New: &a, ModRev: modRev})
}

// leastLoaded is the alive broker with the lowest load, lowest id first.
func (b *balancer) leastLoaded(load map[int32]int) int32 {
	best := b.alive[0]
	for _, id := range b.alive[1:] {
		if load[id] < load[best] {
			best = id
		}
	}
	return best
}

// mostLoaded is the alive broker with the highest load, highest id first.
func (b *balancer) mostLoaded(load map[int32]int) int32 {
	best := b.alive[0]
	for _, id := range b.alive[1:] {
		if load[id] >= load[best] {
			best = id
		}
	}
	return best
}
