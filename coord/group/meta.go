package group

// Persisted group metadata (storage.GroupMeta, op 7 of the offset store).
//
// What is written, and when (always from the group's goroutine, ordered by the store):
//   - the leader's SyncGroup: the generation with every member's assignment, as Stable. The
//     assignment is handed out only once that write is durable, as Apache's GroupCoordinator does
//     (doSyncGroup → storeGroup → setAndPropagateAssignment), so every assignment a member holds
//     can be served by the next coordinator;
//   - a static member replaced in a Stable group without a rebalance (its new member id);
//   - a membership change ending (leave, session expiry, pending-sync expiry): the remaining
//     members, as Rebalancing;
//   - the group becoming Empty: the tombstone (offsets stay);
//   - unload (ReleaseShard, Close): the group as it is, unless unchanged since the last write.
//
// What a load rebuilds (restoreGroup): Stable groups at the same generation, leader, protocol
// and assignments, so a consumer's next Heartbeat or OffsetCommit at its generation succeeds with
// no rebalance; Rebalancing groups in PreparingRebalance with their members, who rejoin. Every
// member gets a fresh session (Apache's loadGroup does the same), so a member that died during the
// move expires one session timeout after the load and the group rebalances without it.

import (
	"time"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/storage"
)

// snapshotMeta is what the group persists in its current state; nil (the tombstone) for an
// Empty or Dead group.
func (g *group) snapshotMeta() *storage.GroupMeta { return g.snapshotMetaAs(g.state) }

// snapshotMetaAs is snapshotMeta as if the group were in state.
func (g *group) snapshotMetaAs(state State) *storage.GroupMeta {
	var st storage.GroupMetaState
	switch state {
	case Stable:
		st = storage.GroupMetaStable
	case PreparingRebalance, CompletingRebalance:
		st = storage.GroupMetaRebalancing
	default:
		return nil
	}
	if len(g.members) == 0 {
		return nil
	}
	m := &storage.GroupMeta{
		State:        st,
		Generation:   g.generation,
		ProtocolType: g.protocolType,
		Protocol:     g.protocol,
		Leader:       g.leader,
		Members:      make([]storage.GroupMember, 0, len(g.members)),
	}
	for _, mm := range g.sortedMembers() {
		if mm.isNew {
			// It never completed a join: no generation of its to keep. Its client learns
			// NOT_COORDINATOR and joins the next coordinator afresh.
			continue
		}
		pm := storage.GroupMember{
			MemberID:           mm.id,
			InstanceID:         mm.instanceID,
			ClientID:           mm.clientID,
			ClientHost:         mm.clientHost,
			SessionTimeoutMs:   int32(mm.sessionTimeout.Milliseconds()),
			RebalanceTimeoutMs: int32(mm.rebalanceTimeout.Milliseconds()),
			Subscription:       mm.metadataFor(g.protocol),
		}
		if st == storage.GroupMetaStable {
			pm.Assignment = mm.assignment
		}
		m.Members = append(m.Members, pm)
	}
	if len(m.Members) == 0 {
		return nil
	}
	return m
}

// persistMeta writes the group's metadata if it changed since the last write. Fire and forget:
// a failed write is logged and leaves the previous metadata in force (the next coordinator then
// serves an older view, which costs a rebalance, never a wrong assignment).
func (g *group) persistMeta(reason string) {
	m := g.snapshotMeta()
	if m.Equal(g.written) {
		return
	}
	if !g.c.beginStore(g) {
		return // the shard is being released: unload writes the final metadata
	}
	g.writeMeta(m, reason)
}

// writeMeta writes m; the caller admitted the write (beginStore or beginFinalStore).
func (g *group) writeMeta(m *storage.GroupMeta, reason string) {
	g.written = m
	g.c.store.StoreGroupMetaAsync(g.id, m, func(err error) {
		defer g.c.endStore(g)
		if err != nil {
			g.log.Warn("cannot persist group metadata", zap.String("reason", reason), zap.Error(err))
			g.do(func() {
				if g.written == m {
					g.written = metaUnknown // write again on the next change or at unload
				}
			})
		}
	})
}

// metaUnknown marks the persisted metadata as unknown after a failed write (Equal to nothing
// real, so the next persistMeta writes).
var metaUnknown = &storage.GroupMeta{Generation: -2, Members: []storage.GroupMember{{MemberID: "\x00unknown"}}}

// persistFinal is unload's write: the group as it is now, admitted even though the shard no
// longer serves (ReleaseShard and Close wait for it before the store lets go of the shard).
func (g *group) persistFinal() {
	m := g.snapshotMeta()
	if m.Equal(g.written) || g.state == Dead {
		return
	}
	if m == nil {
		if _, ok := g.c.store.GroupMeta(g.id); !ok {
			return
		}
	}
	g.c.beginFinalStore(g)
	g.writeMeta(m, "unload")
}

// materialize builds the in-memory group for id from the store: restored from its persisted
// metadata, else Empty. c.mu held; the group is not yet visible to anyone.
func (c *Coordinator) materialize(id string) *group {
	g := newGroup(c, id)
	if m, ok := c.store.GroupMeta(id); ok {
		g.restore(m)
	} else if m, ok := c.store.ConsumerGroup(id); ok {
		g.restoreConsumer(m)
	}
	return g
}

// restore rebuilds g from persisted metadata (see the file comment). Called before g is
// visible, so nothing else runs on it yet; the timers it arms run on its goroutine.
func (g *group) restore(pm *storage.GroupMeta) {
	g.generation = pm.Generation
	g.protocolType = pm.ProtocolType
	g.protocol = pm.Protocol
	for _, p := range pm.Members {
		g.nextSeq++
		m := &member{
			id:               p.MemberID,
			instanceID:       p.InstanceID,
			clientID:         p.ClientID,
			clientHost:       p.ClientHost,
			sessionTimeout:   time.Duration(p.SessionTimeoutMs) * time.Millisecond,
			rebalanceTimeout: time.Duration(p.RebalanceTimeoutMs) * time.Millisecond,
			protocolType:     pm.ProtocolType,
			protocols:        []protocol{{name: pm.Protocol, metadata: p.Subscription}},
			seq:              g.nextSeq,
		}
		if pm.State == storage.GroupMetaStable {
			m.assignment = p.Assignment
			if m.assignment == nil {
				m.assignment = []byte{}
			}
		}
		g.members[m.id] = m
		if m.static() {
			g.static[m.instanceID] = m.id
		}
	}
	g.leader = pm.Leader
	if g.members[g.leader] == nil {
		g.leader = ""
		if ms := g.sortedMembers(); len(ms) > 0 {
			g.leader = ms[0].id
		}
	}
	g.computeSubscribed()
	g.written = pm
	for _, m := range g.members {
		g.scheduleHeartbeat(m, m.sessionTimeout)
	}
	if pm.State == storage.GroupMetaStable {
		g.transition(Stable)
		g.log.Info("group restored", zap.Stringer("state", g.state), zap.Int32("generation", g.generation),
			zap.Int("members", len(g.members)))
		return
	}
	// The rebalance the previous coordinator had begun goes on here: members learn of it from
	// their next heartbeat (REBALANCE_IN_PROGRESS) and rejoin within the rebalance timeout.
	g.transition(PreparingRebalance)
	g.initialDelay = false
	g.arm(&g.join, g.rebalanceTimeout(), g.completeJoin)
	g.log.Info("group restored", zap.Stringer("state", g.state), zap.Int32("generation", g.generation),
		zap.Int("members", len(g.members)))
}

// storeAssignment persists the generation with the leader's assignment and, once durable, moves
// the group to Stable and answers the parked SyncGroups. A failed write answers them with the
// store's error and rebalances (Apache: resetAndPropagateAssignmentError + maybePrepareRebalance).
// Called in CompletingRebalance with every member's assignment set.
func (g *group) storeAssignment() {
	m := g.snapshotMetaAs(Stable)
	if !g.c.beginStore(g) {
		return // the shard is being released: unload answers the parked SyncGroups
	}
	gen := g.generation
	g.assignPending, g.assignGen = true, gen
	g.written = m
	g.c.store.StoreGroupMetaAsync(g.id, m, func(err error) {
		defer g.c.endStore(g)
		g.do(func() {
			if g.assignGen == gen {
				g.assignPending = false
			}
			if err != nil && g.written == m {
				g.written = metaUnknown
			}
			if g.unloaded || g.generation != gen || g.state != CompletingRebalance {
				return
			}
			if err != nil {
				g.log.Warn("cannot persist the group's assignment", zap.Int32("generation", gen), zap.Error(err))
				g.resetAndPropagateAssignmentError(storeErrorCode(err))
				g.maybePrepareRebalance("cannot persist the assignment")
				return
			}
			g.transition(Stable)
			g.propagateAssignment()
		})
	})
}
