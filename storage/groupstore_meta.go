package storage

import (
	"bytes"
	"encoding/binary"

	"github.com/kaas-go/kaas/storage/framelog"
)

// Group metadata (op 7, groupMeta): what a classic group's coordinator needs to serve the
// group's current generation without a rebalance after a restart or a coordinator move. Apache
// writes the same content to __consumer_offsets as the GroupMetadata record (key version 2) when
// a generation's assignment is stored (SyncGroup) and when the group becomes Empty, and its
// GroupMetadataManager.loadGroupsAndOffsets rebuilds Stable groups from it, each member with a
// fresh session.
//
//	op 7 = group str, state u8, generation varint, protocolType str, protocol str, leader str,
//	       n uvarint, n × (memberID str, instanceID str, clientID str, clientHost str,
//	       sessionTimeoutMs varint, rebalanceTimeoutMs varint, subscription str, assignment str)
//
// A groupMeta with no members is a tombstone: the group keeps only its offsets (Empty). The last
// groupMeta of a group wins; deleteGroup drops it with the offsets. Old logs have no op 7 and load
// as before (groups come back Empty).

// GroupMetaState is the state a persisted group comes back in.
type GroupMetaState uint8

const (
	// GroupMetaStable: the generation's assignment was stored; the group is served Stable at the
	// same generation, so members' heartbeats and commits at that generation succeed.
	GroupMetaStable GroupMetaState = iota
	// GroupMetaRebalancing: membership changed (a member left or expired) or the coordinator let
	// go of the group mid-rebalance; the group comes back PreparingRebalance with these members,
	// who learn of the rebalance from their next heartbeat and rejoin.
	GroupMetaRebalancing
)

// GroupMeta is one classic group's persisted metadata.
type GroupMeta struct {
	State        GroupMetaState
	Generation   int32
	ProtocolType string
	Protocol     string // the generation's selected protocol
	Leader       string
	Members      []GroupMember // in join order
}

// GroupMember is one member of a persisted group.
type GroupMember struct {
	MemberID           string
	InstanceID         string // group.instance.id (KIP-345); "" for a dynamic member
	ClientID           string
	ClientHost         string
	SessionTimeoutMs   int32
	RebalanceTimeoutMs int32
	Subscription       []byte // the member's metadata for Protocol
	Assignment         []byte
}

// Equal reports whether m and o persist the same thing (a nil GroupMeta equals one with no
// members: both are the tombstone).
func (m *GroupMeta) Equal(o *GroupMeta) bool {
	if m == nil || len(m.Members) == 0 || o == nil || len(o.Members) == 0 {
		return (m == nil || len(m.Members) == 0) && (o == nil || len(o.Members) == 0)
	}
	if m.State != o.State || m.Generation != o.Generation || m.ProtocolType != o.ProtocolType ||
		m.Protocol != o.Protocol || m.Leader != o.Leader || len(m.Members) != len(o.Members) {
		return false
	}
	for i := range m.Members {
		a, b := &m.Members[i], &o.Members[i]
		if a.MemberID != b.MemberID || a.InstanceID != b.InstanceID || a.ClientID != b.ClientID ||
			a.ClientHost != b.ClientHost || a.SessionTimeoutMs != b.SessionTimeoutMs ||
			a.RebalanceTimeoutMs != b.RebalanceTimeoutMs || !bytes.Equal(a.Subscription, b.Subscription) ||
			!bytes.Equal(a.Assignment, b.Assignment) {
			return false
		}
	}
	return true
}

func gsAppendMeta(b []byte, m *GroupMeta) []byte {
	if m == nil {
		m = &GroupMeta{}
	}
	b = append(b, byte(m.State))
	b = binary.AppendVarint(b, int64(m.Generation))
	b = framelog.AppendStr(b, m.ProtocolType)
	b = framelog.AppendStr(b, m.Protocol)
	b = framelog.AppendStr(b, m.Leader)
	b = binary.AppendUvarint(b, uint64(len(m.Members)))
	for i := range m.Members {
		mm := &m.Members[i]
		b = framelog.AppendStr(b, mm.MemberID)
		b = framelog.AppendStr(b, mm.InstanceID)
		b = framelog.AppendStr(b, mm.ClientID)
		b = framelog.AppendStr(b, mm.ClientHost)
		b = binary.AppendVarint(b, int64(mm.SessionTimeoutMs))
		b = binary.AppendVarint(b, int64(mm.RebalanceTimeoutMs))
		b = appendBytes(b, mm.Subscription)
		b = appendBytes(b, mm.Assignment)
	}
	return b
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func gsReadMeta(r *framelog.Reader) *GroupMeta {
	m := &GroupMeta{}
	st := r.Byte("group state")
	if st > byte(GroupMetaRebalancing) {
		r.Fail("bad group state")
		return nil
	}
	m.State = GroupMetaState(st)
	m.Generation = int32(r.VarintIn("generation", -1<<31, 1<<31-1))
	m.ProtocolType = r.Str("protocol type")
	m.Protocol = r.Str("protocol")
	m.Leader = r.Str("leader")
	n := r.Count("member count")
	if n > 0 {
		m.Members = make([]GroupMember, 0, n)
	}
	for i := 0; i < n && r.Err == nil; i++ {
		var mm GroupMember
		mm.MemberID = r.Str("member id")
		mm.InstanceID = r.Str("instance id")
		mm.ClientID = r.Str("client id")
		mm.ClientHost = r.Str("client host")
		mm.SessionTimeoutMs = int32(r.VarintIn("session timeout", -1<<31, 1<<31-1))
		mm.RebalanceTimeoutMs = int32(r.VarintIn("rebalance timeout", -1<<31, 1<<31-1))
		mm.Subscription = []byte(r.Str("subscription"))
		mm.Assignment = []byte(r.Str("assignment"))
		m.Members = append(m.Members, mm)
	}
	return m
}

// StoreGroupMetaAsync durably records m as group's metadata (nil or no members: the tombstone)
// and calls done once it is fsync'd (nil) or could not be (nothing changed). m must not be
// modified after the call. Ordered with every other operation; done runs on the writer goroutine
// and must not block.
func (s *GroupStore) StoreGroupMetaAsync(group string, m *GroupMeta, done func(error)) {
	if m != nil && len(m.Members) == 0 {
		m = nil
	}
	s.enqueue(&gsOp{kind: gsOpMeta, group: group, meta: m, done: done})
}

// StoreGroupMeta is the blocking form of StoreGroupMetaAsync.
func (s *GroupStore) StoreGroupMeta(group string, m *GroupMeta) error {
	ch := make(chan error, 1)
	s.StoreGroupMetaAsync(group, m, func(err error) { ch <- err })
	return <-ch
}

// GroupMeta returns group's durable metadata, if it has members. The result is shared and must
// not be modified.
func (s *GroupStore) GroupMeta(group string) (*GroupMeta, bool) {
	s.mu.RLock()
	m := s.meta[group]
	s.mu.RUnlock()
	return m, m != nil
}

// GroupShards is the number of group shards (Apache's offsets.topic.num.partitions default): a
// group belongs to shard GroupShardFor(id), partition N of __consumer_offsets.
const GroupShards = 50

// GroupShardFor is fnv1a32(group) % GroupShards, the same hash as transaction slots.
func GroupShardFor(group string) int {
	h := uint32(2166136261)
	for i := 0; i < len(group); i++ {
		h ^= uint32(group[i])
		h *= 16777619
	}
	return int(h % GroupShards)
}
