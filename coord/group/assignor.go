package group

// Server-side assignors of KIP-848 consumer groups (group.consumer.assignors): "uniform" and
// "range", the two Apache 4.1 ships. An assignor is a pure function from the group's members
// (their resolved subscriptions and their current target assignment) and the subscribed topics'
// partition counts to a new target assignment. The coordinator then moves every member towards
// its target with the reconciliation of reconcile.go.

import (
	"bytes"
	"sort"
)

// topicID is a topic's 16-byte id, the key of every KIP-848 assignment.
type topicID = [16]byte

// assignment maps a topic id to its partitions, sorted ascending. A member's assignment never
// has a topic with an empty partition list.
type assignment map[topicID][]int32

// topicPart is one partition of a topic.
type topicPart struct {
	topic     topicID
	partition int32
}

// assignMember is one member as an assignor sees it.
type assignMember struct {
	id         string
	instanceID string
	topics     map[topicID]bool // resolved subscription (only topics that exist)
	current    assignment       // its current target assignment, for stickiness
}

// assignor computes a target assignment: every partition of a subscribed topic goes to exactly
// one member subscribed to it; members with no partitions get an empty assignment.
type assignor interface {
	name() string
	assign(members []assignMember, partitions map[topicID]int32) map[string]assignment
}

func assignorByName(name string) assignor {
	switch name {
	case "uniform":
		return uniformAssignor{}
	case "range":
		return rangeAssignor{}
	}
	return nil
}

// uniformAssignor spreads the partitions evenly over the members, as Apache's UniformAssignor
// does, and keeps each member's current partitions where it can (sticky): with identical
// subscriptions every member ends with ⌊P/N⌋ or ⌈P/N⌉ partitions, and a rebalance moves only the
// partitions it must to reach that (those of departed members, new partitions, and the excess of
// members above the new quota). With different subscriptions it balances each partition among
// the members subscribed to its topic as far as the subscriptions allow.
type uniformAssignor struct{}

func (uniformAssignor) name() string { return "uniform" }

func (uniformAssignor) assign(members []assignMember, partitions map[topicID]int32) map[string]assignment {
	ms := sortedAssignMembers(members)
	owner := make(map[topicPart]int) // partition → index into ms
	load := make([]int, len(ms))
	owned := make([][]topicPart, len(ms))
	// 1. Stickiness: each member keeps the current partitions that are still valid for it and
	// not already kept by another member.
	for i, m := range ms {
		for _, tp := range m.current.parts() {
			n, ok := partitions[tp.topic]
			if !ok || tp.partition >= n || !m.topics[tp.topic] {
				continue
			}
			if _, taken := owner[tp]; taken {
				continue
			}
			owner[tp] = i
			owned[i] = append(owned[i], tp)
			load[i]++
		}
	}
	// 2. Every unowned partition goes to the least-loaded member subscribed to its topic.
	for _, tp := range allParts(partitions) {
		if _, ok := owner[tp]; ok {
			continue
		}
		best := -1
		for i, m := range ms {
			if m.topics[tp.topic] && (best < 0 || load[i] < load[best]) {
				best = i
			}
		}
		if best < 0 {
			continue // nobody subscribes to this topic
		}
		owner[tp] = best
		owned[best] = append(owned[best], tp)
		load[best]++
	}
	// 3. Balance: move one partition at a time from a member to an eligible member with at
	// least two fewer, until no such move exists. Each move lowers the sum of squared loads, so
	// this ends; with identical subscriptions it ends at max-min <= 1, having moved only
	// partitions of members above the quota. Members give away their highest partitions first,
	// so what a member keeps does not depend on the order it got it in.
	for moved := true; moved; {
		moved = false
		order := make([]int, len(ms))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return load[order[a]] > load[order[b]] })
		for _, from := range order {
			sortParts(owned[from])
			for k := len(owned[from]) - 1; k >= 0 && !moved; k-- {
				tp := owned[from][k]
				to := -1
				for i, m := range ms {
					if i != from && m.topics[tp.topic] && load[i] <= load[from]-2 && (to < 0 || load[i] < load[to]) {
						to = i
					}
				}
				if to < 0 {
					continue
				}
				owned[from] = append(owned[from][:k], owned[from][k+1:]...)
				owned[to] = append(owned[to], tp)
				owner[tp] = to
				load[from]--
				load[to]++
				moved = true
			}
			if moved {
				break
			}
		}
	}
	out := make(map[string]assignment, len(ms))
	for i, m := range ms {
		out[m.id] = fromParts(owned[i])
	}
	return out
}

// rangeAssignor assigns each topic on its own in contiguous ranges, as Apache's RangeAssignor:
// the members subscribed to the topic, ordered by group.instance.id (static members) or member
// id, get ⌊P/N⌋ partitions each and the first P mod N one more. Members with the same
// subscriptions therefore get the same partition numbers of every topic (co-partitioning), and
// a static member that rejoins gets its range back.
type rangeAssignor struct{}

func (rangeAssignor) name() string { return "range" }

func (rangeAssignor) assign(members []assignMember, partitions map[topicID]int32) map[string]assignment {
	out := make(map[string]assignment, len(members))
	for _, m := range members {
		out[m.id] = assignment{}
	}
	ms := append([]assignMember(nil), members...)
	sort.Slice(ms, func(a, b int) bool { return rangeKey(ms[a]) < rangeKey(ms[b]) })
	for _, t := range sortedTopics(partitions) {
		var subs []assignMember
		for _, m := range ms {
			if m.topics[t] {
				subs = append(subs, m)
			}
		}
		if len(subs) == 0 {
			continue
		}
		n := int(partitions[t])
		base, extra := n/len(subs), n%len(subs)
		next := int32(0)
		for i, m := range subs {
			cnt := base
			if i < extra {
				cnt++
			}
			if cnt == 0 {
				continue
			}
			ps := make([]int32, cnt)
			for k := range ps {
				ps[k] = next
				next++
			}
			out[m.id][t] = ps
		}
	}
	return out
}

func rangeKey(m assignMember) string {
	if m.instanceID != "" {
		return "0" + m.instanceID // static members first, in instance order, then dynamic ones
	}
	return "1" + m.id
}

func sortedAssignMembers(members []assignMember) []assignMember {
	ms := append([]assignMember(nil), members...)
	sort.Slice(ms, func(a, b int) bool { return ms[a].id < ms[b].id })
	return ms
}

func sortedTopics(partitions map[topicID]int32) []topicID {
	ts := make([]topicID, 0, len(partitions))
	for t := range partitions {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(a, b int) bool { return bytes.Compare(ts[a][:], ts[b][:]) < 0 })
	return ts
}

func allParts(partitions map[topicID]int32) []topicPart {
	var out []topicPart
	for _, t := range sortedTopics(partitions) {
		for p := int32(0); p < partitions[t]; p++ {
			out = append(out, topicPart{t, p})
		}
	}
	return out
}

func sortParts(ps []topicPart) {
	sort.Slice(ps, func(a, b int) bool {
		if c := bytes.Compare(ps[a].topic[:], ps[b].topic[:]); c != 0 {
			return c < 0
		}
		return ps[a].partition < ps[b].partition
	})
}

// parts lists a's partitions in (topic id, partition) order.
func (a assignment) parts() []topicPart {
	var out []topicPart
	for t, ps := range a {
		for _, p := range ps {
			out = append(out, topicPart{t, p})
		}
	}
	sortParts(out)
	return out
}

func (a assignment) size() int {
	n := 0
	for _, ps := range a {
		n += len(ps)
	}
	return n
}

func (a assignment) has(t topicID, p int32) bool {
	for _, q := range a[t] {
		if q == p {
			return true
		}
	}
	return false
}

func fromParts(ps []topicPart) assignment {
	out := assignment{}
	for _, tp := range ps {
		out[tp.topic] = append(out[tp.topic], tp.partition)
	}
	for t := range out {
		sort.Slice(out[t], func(a, b int) bool { return out[t][a] < out[t][b] })
	}
	return out
}

// equal reports whether a and b hold the same partitions.
func (a assignment) equal(b assignment) bool {
	if a.size() != b.size() {
		return false
	}
	for t, ps := range a {
		for _, p := range ps {
			if !b.has(t, p) {
				return false
			}
		}
	}
	return true
}

// intersect is a ∩ b; minus is a \ b.
func (a assignment) intersect(b assignment) assignment {
	var out []topicPart
	for _, tp := range a.parts() {
		if b.has(tp.topic, tp.partition) {
			out = append(out, tp)
		}
	}
	return fromParts(out)
}

func (a assignment) minus(b assignment) assignment {
	var out []topicPart
	for _, tp := range a.parts() {
		if !b.has(tp.topic, tp.partition) {
			out = append(out, tp)
		}
	}
	return fromParts(out)
}

// overlaps reports whether a and b share a partition.
func (a assignment) overlaps(b assignment) bool {
	for t, ps := range a {
		for _, p := range ps {
			if b.has(t, p) {
				return true
			}
		}
	}
	return false
}
