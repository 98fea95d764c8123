package group

// Persisted KIP-848 consumer-group state (storage.ConsumerGroupMeta, op 8 of the offset store).
//
// What is written, and when (from the group's goroutine, ordered by the store): after every
// heartbeat, leave, session expiry or fencing that changed the group (a member joined, left,
// changed its subscription, moved epoch or assignment; the group epoch moved), the whole group:
// group epoch, target assignment and its epoch, every member's subscription, reconciliation state
// and current assignment. Apache writes the same content as records to __consumer_offsets. The
// heartbeat is answered without waiting for the write (as classic metadata writes do here): a
// write lost in a crash leaves the previous state in force, whose member epochs are older, so the
// affected members are fenced (FENCED_MEMBER_EPOCH) and rejoin; a partition is still only given
// to a member once its holder in that older state has revoked it. A group converted back to a
// classic group writes the tombstone.
//
// What a load rebuilds (restoreConsumer): the same group epoch, target and member epochs, so
// members' next heartbeats and commits at their epochs succeed without a rebalance; every member
// gets a fresh session (and a member still revoking a fresh rebalance timeout), so a member that
// died during the move expires one session after the load.

import (
	"regexp"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/storage"
)

func toStoredParts(a assignment) []storage.ConsumerPartitions {
	if len(a) == 0 {
		return nil
	}
	out := make([]storage.ConsumerPartitions, 0, len(a))
	for _, t := range sortedTopics(partitionCounts(a)) {
		out = append(out, storage.ConsumerPartitions{TopicID: t, Partitions: append([]int32(nil), a[t]...)})
	}
	return out
}

func fromStoredParts(ps []storage.ConsumerPartitions) assignment {
	out := assignment{}
	for _, p := range ps {
		if len(p.Partitions) > 0 {
			out[p.TopicID] = append(out[p.TopicID], p.Partitions...)
		}
	}
	for t := range out {
		sort.Slice(out[t], func(a, b int) bool { return out[t][a] < out[t][b] })
	}
	return out
}

// snapshotConsumer is the group's consumer state as persisted.
func (cg *consumerGroup) snapshot() *storage.ConsumerGroupMeta {
	m := &storage.ConsumerGroupMeta{Epoch: cg.epoch, AssignmentEpoch: cg.assignmentEpoch, Assignor: cg.assignor}
	names := make([]string, 0, len(cg.subscribed))
	for n := range cg.subscribed {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := cg.subscribed[n]
		m.Subscribed = append(m.Subscribed, storage.ConsumerTopic{Name: n, ID: t.id, Partitions: t.partitions})
	}
	for _, mm := range cg.sortedMembers() {
		m.Members = append(m.Members, storage.ConsumerMember{
			MemberID: mm.id, InstanceID: mm.instanceID, RackID: mm.rackID, ClientID: mm.clientID, ClientHost: mm.clientHost,
			RebalanceTimeoutMs: int32(mm.rebalanceTimeout.Milliseconds()),
			TopicNames:         append([]string(nil), mm.topicNames...),
			Regex:              mm.regex, ServerAssignor: mm.serverAssignor,
			State: uint8(mm.state), Epoch: mm.epoch, PreviousEpoch: mm.prevEpoch,
			Assigned: toStoredParts(mm.assigned), Revoking: toStoredParts(mm.revoking), Target: toStoredParts(cg.target[mm.id]),
			Classic: mm.classicSnapshot(),
		})
	}
	return m
}

// persistConsumer writes the group's consumer state if it changed since the last write. Fire
// and forget (see the file comment); a failed write is logged and written again on the next
// change or at unload.
func (g *group) persistConsumer(reason string) {
	if !g.cgDirty {
		return
	}
	if !g.c.beginStore(g) {
		return // the shard is being released: unload writes the final state
	}
	var m *storage.ConsumerGroupMeta
	if g.cg != nil {
		m = g.cg.snapshot()
	}
	g.writeConsumer(m, reason)
}

// writeConsumer writes m (nil: the tombstone); the caller admitted the write.
func (g *group) writeConsumer(m *storage.ConsumerGroupMeta, reason string) {
	g.cgDirty = false
	g.c.store.StoreConsumerGroupAsync(g.id, m, func(err error) {
		defer g.c.endStore(g)
		if err != nil {
			g.log.Warn("cannot persist consumer group state", zap.String("reason", reason), zap.Error(err))
			g.do(func() { g.cgDirty = true })
		}
	})
}

// persistConsumerFinal is unload's write of a changed consumer group, admitted even though the
// shard no longer serves (ReleaseShard and Close wait for it).
func (g *group) persistConsumerFinal() {
	if !g.cgDirty || g.state == Dead {
		return
	}
	var m *storage.ConsumerGroupMeta
	if g.cg != nil {
		m = g.cg.snapshot()
	} else if _, ok := g.c.store.ConsumerGroup(g.id); !ok {
		return
	}
	g.c.beginFinalStore(g)
	g.writeConsumer(m, "unload")
}

// restoreConsumer rebuilds g's consumer group from persisted state (see the file comment). Called
// before g is visible; the timers it arms run on its goroutine.
func (g *group) restoreConsumer(pm *storage.ConsumerGroupMeta) {
	cg := newConsumerGroup()
	g.cg = cg
	cg.epoch, cg.assignmentEpoch, cg.assignor = pm.Epoch, pm.AssignmentEpoch, pm.Assignor
	for _, t := range pm.Subscribed {
		cg.subscribed[t.Name] = topicMeta{id: t.ID, partitions: t.Partitions}
	}
	for _, p := range pm.Members {
		cg.nextSeq++
		m := &consumerMember{
			id: p.MemberID, instanceID: p.InstanceID, rackID: p.RackID, clientID: p.ClientID, clientHost: p.ClientHost,
			rebalanceTimeout: time.Duration(p.RebalanceTimeoutMs) * time.Millisecond,
			topicNames:       p.TopicNames, regex: p.Regex, serverAssignor: p.ServerAssignor,
			prevEpoch: p.PreviousEpoch, seq: cg.nextSeq, classic: restoreClassic(p.Classic),
		}
		if m.regex != "" {
			m.re, _ = regexp.Compile(m.regex) // it compiled when the member sent it
		}
		cg.members[m.id] = m
		if m.instanceID != "" {
			cg.static[m.instanceID] = m.id
		}
		cg.target[m.id] = fromStoredParts(p.Target)
		cg.setHolding(m, reconcileState{state: memberState(p.State), epoch: p.Epoch,
			assigned: fromStoredParts(p.Assigned), revoking: fromStoredParts(p.Revoking)})
	}
	for _, m := range cg.members {
		g.armSession(m)
		if m.state == memberUnrevokedPartitions {
			g.armRevocation(m)
		}
	}
	g.cgDirty = false
	g.publish()
	g.log.Info("consumer group restored", zap.Int32("epoch", cg.epoch), zap.Int("members", len(cg.members)))
}
