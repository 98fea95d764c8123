package group

// Reconciliation of one KIP-848 member towards its target assignment, as Apache's
// CurrentAssignmentBuilder does it. The group's target assignment (assignor.go) says where every
// partition should be at the target assignment epoch; a member gets there one heartbeat at a time,
// and a partition is given to its new owner only once its previous owner has said (in a
// heartbeat's owned Topics) that it no longer holds it: revoke before assign, so no partition is
// ever consumed by two members at once.
//
//	compute (nextAssignment) leads to one of three states (left); each goes back to compute on
//	its trigger (right):
//
//	  nothing to revoke and  ┌──────────┐  a heartbeat while the target epoch   ──▶ compute
//	  every new one free ──▶ │  Stable  │  is above the member epoch
//	  (epoch = target)       └──────────┘
//
//	  something to revoke    ┌─────────────────────┐  a heartbeat whose owned partitions ──▶ compute
//	  (epoch unchanged;  ──▶ │ UnrevokedPartitions │  hold none of the revoked ones
//	  assigned = kept)       └─────────────────────┘
//	                           │ rebalance timeout: the member is fenced (removed)
//	                           ▼
//	                         (gone; its partitions are free)
//
//	  new ones still held    ┌──────────────────────┐  every heartbeat (the holders may ──▶ compute
//	  by others          ──▶ │ UnreleasedPartitions │  have released them)
//	  (epoch = target)       └──────────────────────┘
//
// The member epoch only moves to the target epoch once nothing is left to revoke: a member's
// epoch says "I hold exactly what the target of this epoch gives me, or a subset while others
// release". A member in UnrevokedPartitions keeps its epoch, so OffsetCommit at that epoch still
// works for the partitions it is revoking (it commits them in OnPartitionsRevoked).

// memberState is a KIP-848 member's reconciliation state (Apache MemberState).
type memberState int8

const (
	memberStable memberState = iota
	memberUnrevokedPartitions
	memberUnreleasedPartitions
)

func (s memberState) String() string {
	switch s {
	case memberStable:
		return "Stable"
	case memberUnrevokedPartitions:
		return "UnrevokedPartitions"
	case memberUnreleasedPartitions:
		return "UnreleasedPartitions"
	}
	return "Unknown"
}

// reconcileState is what reconciliation changes on a member.
type reconcileState struct {
	state    memberState
	epoch    int32
	assigned assignment // what the member holds (or is given) now
	revoking assignment // what it must give up before it moves on
}

// reconcile is one step of the state machine above for a member that heartbeats. owned is the
// member's owned partitions from the heartbeat (nil when the heartbeat did not say: the member
// is then assumed to hold what it held). heldByOther reports whether another member still holds
// (assigned or revoking) a partition.
//
// Apache returns from UnrevokedPartitions to Stable at the member's old epoch and reaches the
// target on the next heartbeat; here both steps happen in one call, which gets the member the
// same state one heartbeat sooner.
func reconcile(cur reconcileState, targetEpoch int32, target assignment, owned assignment, heldByOther func(topicID, int32) bool) reconcileState {
	switch cur.state {
	case memberStable:
		if cur.epoch == targetEpoch {
			return cur
		}
	case memberUnrevokedPartitions:
		if owned == nil || owned.overlaps(cur.revoking) {
			return cur // still revoking
		}
		cur = reconcileState{state: memberStable, epoch: cur.epoch, assigned: cur.assigned}
	case memberUnreleasedPartitions:
	}
	return nextAssignment(cur, targetEpoch, target, heldByOther)
}

// nextAssignment is Apache computeNextAssignment: keep what the target still gives the member,
// revoke the rest first; only with nothing to revoke take the new partitions that are free.
func nextAssignment(cur reconcileState, targetEpoch int32, target assignment, heldByOther func(topicID, int32) bool) reconcileState {
	kept := cur.assigned.intersect(target)
	revoke := cur.assigned.minus(target)
	if revoke.size() > 0 {
		return reconcileState{state: memberUnrevokedPartitions, epoch: cur.epoch, assigned: kept, revoking: revoke}
	}
	next := kept.parts()
	unreleased := false
	for _, tp := range target.minus(cur.assigned).parts() {
		if heldByOther(tp.topic, tp.partition) {
			unreleased = true
			continue
		}
		next = append(next, tp)
	}
	st := memberStable
	if unreleased {
		st = memberUnreleasedPartitions
	}
	return reconcileState{state: st, epoch: targetEpoch, assigned: fromParts(next)}
}
