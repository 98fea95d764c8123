// Package txn is the core of the transaction coordinator: the per-transactional.id state machine
// (pure transition functions, one per API, with Apache Kafka's TransactionCoordinator semantics),
// the state store that replaces Apache's __transaction_state topic — a write-ahead journal per
// worker (the durability point of every batch: one write, one fdatasync) checkpointed into
// readable slot files in the background — and the sharded worker pool that applies operations
// with group commit and exactly one writer per slot. README.md documents the formats and the
// recovery rules.
//
// The package also runs the commit saga (saga.go): an operation that requires fencing or markers
// returns an Action from its pure transition, and the coordinator carries it out through its
// PartitionWriter and GroupCompleter before it answers (EndTxn) or in the background (reaper).
package txn

import (
	"encoding/json"
	"fmt"
)

// State is the transaction state of one transactional.id, named exactly as Apache prints it in
// DescribeTransactions / ListTransactions (KIP-664).
//
//	                 InitProducerId (first call: fresh pid, epoch 0; later: epoch+1 or new pid)
//	                         │
//	                         ▼
//	  ┌──────────────────► Empty ──────────────────────────────┐ EndTxn(abort) v5 at current
//	  │                      │ AddPartitions / AddOffsets /    │ epoch (TV2 empty abort)
//	  │                      │ implicit add (TV2)              │
//	  │                      ▼                                 │
//	  │   ┌─────────────── Ongoing ◄──── Add* (union) ───┐     │
//	  │   │                 │  │  └─────────────────────-┘     │
//	  │   │ EndTxn(commit)  │  │ InitProducerId (rejoin) │     │
//	  │   ▼                 │  ▼                         │     │
//	  │ PrepareCommit       │ PrepareEpochFence          │     │
//	  │   │                 │  │ (transient, never       │     │
//	  │   │   EndTxn(abort) │  │  persisted: the fence   │     │
//	  │   │   or reaper     ▼  ▼  bump, then the abort)  │     │
//	  │   │              PrepareAbort ◄──────────────────┼─────┘
//	  │   │ markers         │ markers durable
//	  │   │ durable         │ (Complete)
//	  │   ▼ (Complete)      ▼
//	  │ CompleteCommit   CompleteAbort
//	  │   │                 │   EndTxn(abort) v5 at current epoch (TV2) ──► PrepareAbort
//	  │   └───────┬─────────┘   Add* ──► Ongoing (a new transaction)
//	  └───────────┘ InitProducerId (epoch+1 / rotate)
//
//	Empty / Complete* ──► Dead: transactional.id.expiration.ms (the reaper removes the entry; Dead
//	is never persisted, the journal records a deletion).
//
// Prepare* states carry the partition and group lists: they are the durable record of which
// markers are still owed, so a crash between prepare and complete is finished by the reconcile
// pass on the next Load.
type State int8

const (
	Empty State = iota
	Ongoing
	PrepareCommit
	PrepareAbort
	CompleteCommit
	CompleteAbort
	PrepareEpochFence
	Dead
)

var stateNames = [...]string{
	Empty:             "Empty",
	Ongoing:           "Ongoing",
	PrepareCommit:     "PrepareCommit",
	PrepareAbort:      "PrepareAbort",
	CompleteCommit:    "CompleteCommit",
	CompleteAbort:     "CompleteAbort",
	PrepareEpochFence: "PrepareEpochFence",
	Dead:              "Dead",
}

// String returns Apache's state name (TransactionState.name), used on the wire by KIP-664.
func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int8(s))
}

// ParseState maps an Apache state name back to a State.
func ParseState(name string) (State, bool) {
	for i, n := range stateNames {
		if n == name {
			return State(i), true
		}
	}
	return 0, false
}

// IsPrepare reports whether markers are owed for the transaction.
func (s State) IsPrepare() bool { return s == PrepareCommit || s == PrepareAbort }

// IsComplete reports a finished transaction (markers written).
func (s State) IsComplete() bool { return s == CompleteCommit || s == CompleteAbort }

// IsOpen reports a transaction that has started and not completed: it pins the LSO of its
// partitions until its markers are durable.
func (s State) IsOpen() bool { return s == Ongoing || s.IsPrepare() || s == PrepareEpochFence }

// MarshalJSON stores the state by name so a slot file is readable and an enum reorder cannot
// silently change the meaning of a persisted entry.
func (s State) MarshalJSON() ([]byte, error) {
	if s < 0 || int(s) >= len(stateNames) {
		return nil, fmt.Errorf("cannot encode transaction state %d", int8(s))
	}
	return json.Marshal(stateNames[s])
}

// UnmarshalJSON refuses unknown names: a slot file with a state we do not understand must stop
// the load rather than be guessed at.
func (s *State) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err != nil {
		return err
	}
	st, ok := ParseState(name)
	if !ok {
		return fmt.Errorf("unknown transaction state %q", name)
	}
	*s = st
	return nil
}

// validTransition is the table of legal state changes, Apache's TransactionState.validPreviousStates
// read forwards. Self-transitions that change only data (Ongoing→Ongoing when partitions are added,
// Empty→Empty on an epoch bump, Complete*→Empty on InitProducerId) are listed explicitly.
func validTransition(from, to State) bool {
	switch to {
	case Empty:
		// InitProducerId: first call, epoch bump, or pid rotation.
		return from == Empty || from.IsComplete()
	case Ongoing:
		return from == Empty || from == Ongoing || from.IsComplete()
	case PrepareCommit:
		return from == Ongoing
	case PrepareAbort:
		// Ongoing: EndTxn(abort) or reaper; PrepareEpochFence: rejoin during Ongoing;
		// Empty / Complete*: TV2 empty abort (EndTxn v5 at the current epoch).
		return from == Ongoing || from == PrepareEpochFence || from == Empty || from.IsComplete()
	case CompleteCommit:
		return from == PrepareCommit
	case CompleteAbort:
		return from == PrepareAbort
	case PrepareEpochFence:
		return from == Ongoing
	case Dead:
		return from == Empty || from.IsComplete()
	}
	return false
}

// mustTransition panics on an illegal transition. Every mutation in ops.go goes through it, so a
// bug in a transition function is caught by the tests rather than persisted.
func mustTransition(from, to State) {
	if !validTransition(from, to) {
		panic(fmt.Sprintf("BUG: illegal transaction state transition %s -> %s", from, to))
	}
}
