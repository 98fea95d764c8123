// Package topology answers "who owns X, where, and at which epoch?" for the three things a
// broker can own: a topic partition (it leads it), a transaction slot and a group shard (it
// coordinates them). It replaces the yes/no ownership seam: cluster mode on a shared volume moves
// ownership between brokers by bumping epochs, and every handler must be able to tell a client
// both "not me" and "ask broker N at host:port".
//
// Kafka's model, which this follows: transaction state lives in partition N of
// __transaction_state and group state in partition N of __consumer_offsets, and the coordinator
// of a key is the leader of its partition, at that partition's leader epoch. Here a slot or shard
// is such a partition without the log behind it (the state lives in kaas's own journals), so
// Partition, TxnSlot and GroupShard all answer the same kind of Owner.
//
// The single-broker implementation is a Table that owns everything at epoch 0. It imports only
// the standard library so that server and every coord package can use it.
package topology

import (
	"sort"
	"sync"
	"sync/atomic"
)

// NumTxnSlots and NumGroupShards are Apache's transaction.state.log.num.partitions and
// offsets.topic.num.partitions defaults. They are part of the on-disk layout (a slot's journal
// and a shard's offsets are found by number): changing them makes existing state unreachable.
const (
	NumTxnSlots    = 50
	NumGroupShards = 50
)

// The internal topics whose partitions are the slots and shards. Clients see them in Metadata
// with is_internal=true, as in Apache.
const (
	GroupsTopic = "__consumer_offsets"
	TxnTopic    = "__transaction_state"
)

// FNV1a32 is FNV-1a over the bytes of s (offset basis 2166136261, prime 16777619). Unlike
// Java's String.hashCode it does not depend on UTF-16, so any client of the on-disk layout can
// recompute it.
func FNV1a32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// TxnSlot is the transaction slot of a transactional.id: fnv1a32(id) % 50.
func TxnSlot(transactionalID string) int { return int(FNV1a32(transactionalID) % NumTxnSlots) }

// GroupShard is the group shard of a group id: fnv1a32(group) % 50.
func GroupShard(group string) int { return int(FNV1a32(group) % NumGroupShards) }

// InternalPartitions reports the partition count of an internal topic, or false for any other
// name. The first-byte test keeps the common case (a user topic) to one comparison.
func InternalPartitions(topic string) (int32, bool) {
	if len(topic) < 2 || topic[0] != '_' {
		return 0, false
	}
	switch topic {
	case GroupsTopic:
		return NumGroupShards, true
	case TxnTopic:
		return NumTxnSlots, true
	}
	return 0, false
}

// Endpoint is one listener of a broker (Kafka's advertised.listeners entry).
type Endpoint struct {
	Listener string
	Host     string
	Port     int32
}

// Broker is a live broker.
type Broker struct {
	ID        int32
	Rack      string // "" = no rack
	Endpoints []Endpoint
}

// Endpoint returns b's endpoint on the named listener. Apache omits a broker from the answers
// given on a listener it does not have, so callers skip it when ok is false.
func (b Broker) Endpoint(listener string) (Endpoint, bool) {
	for _, e := range b.Endpoints {
		if e.Listener == listener {
			return e, true
		}
	}
	return Endpoint{}, false
}

// Owner is the answer for one partition, slot or shard.
type Owner struct {
	Broker int32 // owner's broker id; -1 when !Known
	Epoch  int32 // leader / coordinator epoch; -1 when !Known
	Local  bool  // this broker owns it now
	Known  bool  // false: no owner is registered (Kafka: no leader)
}

// NoOwner is the Owner of something no broker owns.
var NoOwner = Owner{Broker: -1, Epoch: -1}

// Topology is what a handler asks. Implementations must be safe for concurrent use and cheap:
// Partition runs once per partition of every Produce and Fetch.
type Topology interface {
	LocalID() int32
	Brokers() []Broker // live brokers, sorted by id; shared, callers must not modify
	Controller() int32
	Partition(topic string, partition int32) Owner
	TxnSlot(slot int) Owner
	GroupShard(shard int) Owner
}

// PartitionOwner answers for any partition a client can name: partition N of __consumer_offsets
// is group shard N, partition N of __transaction_state is transaction slot N (their leaders are
// the coordinators, as in Apache), every other partition is asked of Partition. Out-of-range
// internal partitions have no owner.
func PartitionOwner(t Topology, topic string, partition int32) Owner {
	if n, ok := InternalPartitions(topic); ok {
		if partition < 0 || partition >= n {
			return NoOwner
		}
		if topic == GroupsTopic {
			return t.GroupShard(int(partition))
		}
		return t.TxnSlot(int(partition))
	}
	return t.Partition(topic, partition)
}

// TopicPartition names one partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Table is a mutable Topology: every key is owned by the local broker at epoch 0 until a setter
// says otherwise. The single broker uses it as is; cluster mode (watching the assignment store)
// and tests call the setters.
//
// Reads never lock: they load an immutable snapshot through an atomic pointer, and with no
// partition overrides (the single broker) Partition does no map lookup at all. Writers copy the
// snapshot, change the copy and publish it under mu; a setter therefore costs O(overrides), so
// bulk changes go through SetPartitions.
//
// Lock order: mu is a leaf. Nothing else is locked while it is held, and no reader takes it, so a
// handler may ask the topology while holding any of its own locks.
type Table struct {
	mu   sync.Mutex // serialises writers; readers use snap only
	snap atomic.Pointer[snapshot]
}

type snapshot struct {
	local      int32
	controller int32
	brokers    []Broker
	local0     Owner // the default of a partition without override: local broker, epoch 0 (NoOwner after RequireLoad)
	// loadGated (set by RequireLoad): Owner.Local is kept as the setter passed it, for the
	// local broker only, instead of being derived from Broker == local.
	loadGated bool
	parts     map[TopicPartition]Owner
	slots     [NumTxnSlots]Owner
	shards    [NumGroupShards]Owner
}

// NewTable builds the single-broker topology: local is the only live broker and the controller,
// and it owns every partition, slot and shard at epoch 0.
func NewTable(local Broker) *Table {
	s := &snapshot{local: local.ID, controller: local.ID, brokers: []Broker{cloneBroker(local)}}
	s.local0 = Owner{Broker: local.ID, Epoch: 0, Local: true, Known: true}
	for i := range s.slots {
		s.slots[i] = s.local0
	}
	for i := range s.shards {
		s.shards[i] = s.local0
	}
	t := &Table{}
	t.snap.Store(s)
	return t
}

// LocalID implements Topology.
func (t *Table) LocalID() int32 { return t.snap.Load().local }

// Brokers implements Topology.
func (t *Table) Brokers() []Broker { return t.snap.Load().brokers }

// Controller implements Topology.
func (t *Table) Controller() int32 { return t.snap.Load().controller }

// Partition implements Topology.
func (t *Table) Partition(topic string, partition int32) Owner {
	s := t.snap.Load()
	if len(s.parts) == 0 {
		return s.local0
	}
	if o, ok := s.parts[TopicPartition{topic, partition}]; ok {
		return o
	}
	return s.local0
}

// TxnSlot implements Topology; an out-of-range slot has no owner.
func (t *Table) TxnSlot(slot int) Owner {
	if slot < 0 || slot >= NumTxnSlots {
		return NoOwner
	}
	return t.snap.Load().slots[slot]
}

// GroupShard implements Topology; an out-of-range shard has no owner.
func (t *Table) GroupShard(shard int) Owner {
	if shard < 0 || shard >= NumGroupShards {
		return NoOwner
	}
	return t.snap.Load().shards[shard]
}

// normalize makes o consistent with the table: Local is derived (Known and Broker == local), and
// an unknown owner is NoOwner whatever else was passed.
func (s *snapshot) normalize(o Owner) Owner {
	if !o.Known {
		return NoOwner
	}
	if s.loadGated {
		o.Local = o.Local && o.Broker == s.local
	} else {
		o.Local = o.Broker == s.local
	}
	return o
}

// RequireLoad switches the table to cluster mode: from now on nothing is owned unless a setter
// says so (every partition, slot and shard without an override is NoOwner), and a setter's
// Owner.Local is kept as passed (and only ever true for the local broker). A cluster broker is
// assigned a resource some time before it has loaded it (it waits for the previous holder's
// release, then takes over the files); in between the resource is Known, names this broker and
// its new epoch, and is not Local, so handlers answer NOT_LEADER / COORDINATOR_LOAD_IN_PROGRESS
// instead of serving state that is not there yet.
func (t *Table) RequireLoad() {
	t.update(func(s *snapshot) {
		s.loadGated = true
		s.local0 = NoOwner
		for i := range s.slots {
			s.slots[i] = NoOwner
		}
		for i := range s.shards {
			s.shards[i] = NoOwner
		}
	})
}

// update publishes a changed copy of the current snapshot.
func (t *Table) update(fn func(s *snapshot)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.snap.Load()
	next := *cur // arrays copy by value; brokers and parts are replaced, never mutated
	fn(&next)
	t.snap.Store(&next)
}

// SetPartition sets the owner of one partition. Owner.Local is derived from Owner.Broker.
func (t *Table) SetPartition(topic string, partition int32, o Owner) {
	t.SetPartitions(map[TopicPartition]Owner{{topic, partition}: o})
}

// SetPartitions sets the owners of many partitions in one copy.
func (t *Table) SetPartitions(owners map[TopicPartition]Owner) {
	t.update(func(s *snapshot) {
		parts := make(map[TopicPartition]Owner, len(s.parts)+len(owners))
		for k, v := range s.parts {
			parts[k] = v
		}
		for k, v := range owners {
			parts[k] = s.normalize(v)
		}
		s.parts = parts
	})
}

// ForgetTopic drops every override of a topic's partitions (a deleted topic): they fall back to
// the default, owned by the local broker at epoch 0.
func (t *Table) ForgetTopic(topic string) {
	t.update(func(s *snapshot) {
		parts := make(map[TopicPartition]Owner, len(s.parts))
		for k, v := range s.parts {
			if k.Topic != topic {
				parts[k] = v
			}
		}
		if len(parts) == 0 {
			parts = nil
		}
		s.parts = parts
	})
}

// SetTxnSlot sets the owner of a transaction slot (0 <= slot < NumTxnSlots, else ignored).
func (t *Table) SetTxnSlot(slot int, o Owner) {
	if slot < 0 || slot >= NumTxnSlots {
		return
	}
	t.update(func(s *snapshot) { s.slots[slot] = s.normalize(o) })
}

// SetGroupShard sets the owner of a group shard (0 <= shard < NumGroupShards, else ignored).
func (t *Table) SetGroupShard(shard int, o Owner) {
	if shard < 0 || shard >= NumGroupShards {
		return
	}
	t.update(func(s *snapshot) { s.shards[shard] = s.normalize(o) })
}

// SetBrokers replaces the live broker list (stored sorted by id, deep-copied).
func (t *Table) SetBrokers(brokers []Broker) {
	bs := make([]Broker, len(brokers))
	for i, b := range brokers {
		bs[i] = cloneBroker(b)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].ID < bs[j].ID })
	t.update(func(s *snapshot) { s.brokers = bs })
}

// SetController sets the controller's broker id.
func (t *Table) SetController(id int32) {
	t.update(func(s *snapshot) { s.controller = id })
}

// SetLocalEndpoint sets (or replaces) the local broker's endpoint on ep.Listener, adding the local
// broker to the live list if it is missing. A listener bound to port 0 learns its address only
// after binding; this is how it is published.
func (t *Table) SetLocalEndpoint(ep Endpoint) {
	t.update(func(s *snapshot) {
		bs := make([]Broker, 0, len(s.brokers)+1)
		found := false
		for _, b := range s.brokers {
			b = cloneBroker(b)
			if b.ID == s.local {
				found = true
				b.Endpoints = withEndpoint(b.Endpoints, ep)
			}
			bs = append(bs, b)
		}
		if !found {
			bs = append(bs, Broker{ID: s.local, Endpoints: []Endpoint{ep}})
			sort.Slice(bs, func(i, j int) bool { return bs[i].ID < bs[j].ID })
		}
		s.brokers = bs
	})
}

func withEndpoint(eps []Endpoint, ep Endpoint) []Endpoint {
	for i := range eps {
		if eps[i].Listener == ep.Listener {
			eps[i] = ep
			return eps
		}
	}
	return append(eps, ep)
}

func cloneBroker(b Broker) Broker {
	b.Endpoints = append([]Endpoint(nil), b.Endpoints...)
	return b
}
