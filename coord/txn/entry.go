package txn

import (
	"slices"
	"sort"
)

// NoProducerID / NoProducerEpoch are Kafka's RecordBatch.NO_PRODUCER_ID / NO_PRODUCER_EPOCH.
const (
	NoProducerID    int64 = -1
	NoProducerEpoch int16 = -1
)

// Entry is the coordinator state of one transactional.id (Apache's TransactionMetadata). Entries
// are values: the transition functions never mutate their input, they return a modified copy, so
// the worker can roll a batch back by restoring the previous pointers.
//
// Field-by-field layout of the persisted form: coord/txn/README.md.
type Entry struct {
	TransactionalID string `json:"transactionalId"`
	ProducerID      int64  `json:"producerId"`
	ProducerEpoch   int16  `json:"producerEpoch"`
	// LastProducerID is the producer id before the last rotation (Apache previousProducerId), so
	// a retried InitProducerId / EndTxn v5 that lost its response after an epoch-exhaustion
	// rotation is recognised (KIP-360, TV2 retryOnOverflow). -1 if never rotated.
	LastProducerID int64 `json:"lastProducerId"`
	// LastProducerEpoch is the epoch before the last client-visible bump (KIP-360 retry detection;
	// TV2: the epoch the last EndTxn was sent with). -1 when a fence made retries impossible.
	LastProducerEpoch int16 `json:"lastProducerEpoch"`
	// NextProducerID is set only in Prepare* under TV2 when the epoch is exhausted: the id the
	// producer continues with once the markers (which still carry the old id) are durable.
	NextProducerID int64 `json:"nextProducerId"`
	State          State `json:"state"`
	TimeoutMs      int32 `json:"timeoutMs"`
	// TxnStartMs is when the transaction became Ongoing (first partition or group add; TV2 starts
	// the clock at the first implicit add, which is the same moment). The reaper's clock. 0 when no
	// transaction is open.
	TxnStartMs   int64 `json:"txnStartMs"`
	LastUpdateMs int64 `json:"lastUpdateMs"`
	// Partitions is topic → sorted partitions of the transaction in progress; in Prepare* it is
	// the dispatch set of the markers.
	Partitions map[string][]int32 `json:"partitions,omitempty"`
	// Groups are the consumer groups whose offsets the transaction commits (Apache records the
	// __consumer_offsets partition; we record the group id so Complete can name them). Sorted.
	Groups []string `json:"groups,omitempty"`
	// TxnVersion is 1 or 2: the transaction version of the transaction in progress, taken from the
	// request that started it (AddPartitionsToTxn <= v3 / AddOffsetsToTxn → 1, implicit add → 2).
	TxnVersion int8 `json:"txnVersion"`
	// CoordinatorEpoch is the slot's coordinator epoch as of the last load; markers carry it so a
	// partition leader can reject markers from a deposed coordinator incarnation.
	CoordinatorEpoch int32 `json:"coordinatorEpoch"`
	// PrepareSeq is the slot's journal sequence of the record that last made the entry Prepare*
	// (kept through Complete*, 0 if never known): unique per prepared transaction of the id and
	// increasing, since a slot's seq only grows across generations, checkpoints, restarts and
	// holders, and a seq a marker carried was durable and so is never handed out again. Markers
	// carry it (MarkerRequest.PrepareSeq) so a leader tells a late resend from the next
	// transaction of the same producer epoch (TV1). Not a field of the journal record: replay
	// derives it from the record's seq (startsPrepare); the slot file stores it.
	PrepareSeq uint64 `json:"prepareSeq,omitempty"`

	// pending is in memory only: markers for this Prepare* entry are being written right now (the
	// Prepare → Complete transition is in flight). Conflicting operations answer
	// CONCURRENT_TRANSACTIONS while it is set (Apache pendingTransitionInProgress).
	pending bool
}

// Pending reports whether a marker write for the entry is in flight.
func (e *Entry) Pending() bool { return e.pending }

// clone returns a deep copy (partition slices and group slice included).
func (e *Entry) clone() *Entry {
	c := *e
	if e.Partitions != nil {
		c.Partitions = make(map[string][]int32, len(e.Partitions))
		for t, ps := range e.Partitions {
			c.Partitions[t] = slices.Clone(ps)
		}
	}
	c.Groups = slices.Clone(e.Groups)
	return &c
}

// TopicPartitions is one topic's partitions in a request or a marker dispatch set.
type TopicPartitions struct {
	Topic      string
	Partitions []int32
}

// hasPartition reports whether topic/p is in the entry's partition set.
func (e *Entry) hasPartition(topic string, p int32) bool {
	ps := e.Partitions[topic]
	_, ok := slices.BinarySearch(ps, p)
	return ok
}

// containsAll reports whether every requested partition is already recorded.
func (e *Entry) containsAll(tps []TopicPartitions) bool {
	for _, tp := range tps {
		for _, p := range tp.Partitions {
			if !e.hasPartition(tp.Topic, p) {
				return false
			}
		}
	}
	return true
}

// addPartitions unions tps into e (which must be a private copy), keeping each list sorted.
func (e *Entry) addPartitions(tps []TopicPartitions) {
	if e.Partitions == nil {
		e.Partitions = make(map[string][]int32, len(tps))
	}
	for _, tp := range tps {
		ps := e.Partitions[tp.Topic]
		for _, p := range tp.Partitions {
			if i, ok := slices.BinarySearch(ps, p); !ok {
				ps = slices.Insert(ps, i, p)
			}
		}
		e.Partitions[tp.Topic] = ps
	}
}

// hasGroup reports whether the group is recorded.
func (e *Entry) hasGroup(g string) bool {
	_, ok := slices.BinarySearch(e.Groups, g)
	return ok
}

// addGroup inserts g keeping Groups sorted and unique (e must be a private copy).
func (e *Entry) addGroup(g string) {
	if i, ok := slices.BinarySearch(e.Groups, g); !ok {
		e.Groups = slices.Insert(e.Groups, i, g)
	}
}

// partitionList returns the partition set as a sorted slice (by topic), a fresh copy.
func (e *Entry) partitionList() []TopicPartitions {
	if len(e.Partitions) == 0 {
		return nil
	}
	out := make([]TopicPartitions, 0, len(e.Partitions))
	for t, ps := range e.Partitions {
		out = append(out, TopicPartitions{Topic: t, Partitions: slices.Clone(ps)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	return out
}

// startsPrepare reports whether next, replacing prev (the durable entry before it), is a new
// prepared transaction, whose journal record's seq becomes its PrepareSeq.
func startsPrepare(prev, next *Entry) bool {
	return next != nil && next.State.IsPrepare() && (prev == nil || !prev.State.IsPrepare() ||
		prev.ProducerID != next.ProducerID || prev.ProducerEpoch != next.ProducerEpoch)
}

// persistedEqual reports whether a and b have the same persisted fields (pending is ignored):
// the worker writes a slot only when some entry's persisted form changed.
func persistedEqual(a, b *Entry) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.TransactionalID != b.TransactionalID || a.ProducerID != b.ProducerID ||
		a.ProducerEpoch != b.ProducerEpoch || a.LastProducerID != b.LastProducerID ||
		a.LastProducerEpoch != b.LastProducerEpoch || a.NextProducerID != b.NextProducerID ||
		a.State != b.State || a.TimeoutMs != b.TimeoutMs || a.TxnStartMs != b.TxnStartMs ||
		a.LastUpdateMs != b.LastUpdateMs || a.TxnVersion != b.TxnVersion ||
		a.CoordinatorEpoch != b.CoordinatorEpoch || !slices.Equal(a.Groups, b.Groups) ||
		len(a.Partitions) != len(b.Partitions) {
		return false
	}
	for t, ps := range a.Partitions {
		if qs, ok := b.Partitions[t]; !ok || !slices.Equal(ps, qs) {
			return false
		}
	}
	return true
}
