package storage

import (
	"encoding/binary"

	"github.com/kaas-go/kaas/storage/framelog"
)

// Consumer-group metadata (op 8, consumerGroupMeta): what a KIP-848 consumer group's coordinator
// needs to go on after a restart or a shard move without a rebalance: the group epoch, the target
// assignment and its epoch, and every member's subscription, epoch and current assignment.
// Apache keeps the same content in __consumer_offsets as its ConsumerGroupMetadata,
// ConsumerGroupMemberMetadata, ConsumerGroupTargetAssignment* and ConsumerGroupCurrentMemberAssignment
// records; here the last op 8 of a group carries all of it.
//
//	op 8 = group str, epoch varint, assignmentEpoch varint, assignor str,
//	       nTopics uvarint × (name str, topicID 16 bytes, partitions varint),
//	       nMembers uvarint × member
//	member = memberID str, instanceID str, rackID str, clientID str, clientHost str,
//	         rebalanceTimeoutMs varint, nNames uvarint × str, regex str, serverAssignor str,
//	         state u8, epoch varint, previousEpoch varint, assigned parts, revoking parts, target parts
//	parts  = n uvarint × (topicID 16 bytes, m uvarint × partition varint)
//
// Presence byte 2 (written when some member joined with the classic protocol, KIP-848 online
// migration) appends to every member: classic u8 (0 or 1), and for 1 sessionTimeoutMs varint,
// nProtocols uvarint × (name str, metadata str). Presence 1 is read as before, with no classic
// members, so a log written before stays readable.
//
// A group with no members keeps its op 8 (an empty consumer group stays a consumer group at its
// epoch, as in Apache); the tombstone (nil) makes it a plain group again (DeleteGroups, or an
// empty consumer group converted to a classic one). deleteGroup drops it with the offsets.

// ConsumerGroupMeta is one KIP-848 consumer group's persisted state.
type ConsumerGroupMeta struct {
	Epoch           int32
	AssignmentEpoch int32
	Assignor        string
	Subscribed      []ConsumerTopic // the subscribed topics' metadata at the last epoch bump
	Members         []ConsumerMember
}

// ConsumerTopic is a subscribed topic as the group last saw it.
type ConsumerTopic struct {
	Name       string
	ID         [16]byte
	Partitions int32
}

// ConsumerMember is one persisted member.
type ConsumerMember struct {
	MemberID, InstanceID, RackID, ClientID, ClientHost string
	RebalanceTimeoutMs                                 int32
	TopicNames                                         []string
	Regex, ServerAssignor                              string
	State                                              uint8 // the coordinator's reconciliation state
	Epoch, PreviousEpoch                               int32
	Assigned, Revoking, Target                         []ConsumerPartitions
	// Classic is set for a member that uses the classic protocol (JoinGroup/SyncGroup) inside
	// the consumer group; nil for a ConsumerGroupHeartbeat member.
	Classic *ConsumerClassic
}

// ConsumerClassic is a classic-protocol member's JoinGroup state: its session timeout and the
// protocols (name, ConsumerProtocolSubscription) it offered, in its order of preference.
type ConsumerClassic struct {
	SessionTimeoutMs int32
	Protocols        []ConsumerClassicProtocol
}

// ConsumerClassicProtocol is one protocol of a JoinGroup.
type ConsumerClassicProtocol struct {
	Name     string
	Metadata []byte
}

// ConsumerPartitions is one topic's partitions of an assignment.
type ConsumerPartitions struct {
	TopicID    [16]byte
	Partitions []int32
}

const gsOpConsumerMeta = 8

func gsAppendConsumerMeta(b []byte, m *ConsumerGroupMeta) []byte {
	if m == nil {
		return append(b, 0) // tombstone
	}
	classic := false
	for i := range m.Members {
		classic = classic || m.Members[i].Classic != nil
	}
	if classic {
		b = append(b, 2)
	} else {
		b = append(b, 1)
	}
	b = binary.AppendVarint(b, int64(m.Epoch))
	b = binary.AppendVarint(b, int64(m.AssignmentEpoch))
	b = framelog.AppendStr(b, m.Assignor)
	b = binary.AppendUvarint(b, uint64(len(m.Subscribed)))
	for _, t := range m.Subscribed {
		b = framelog.AppendStr(b, t.Name)
		b = append(b, t.ID[:]...)
		b = binary.AppendVarint(b, int64(t.Partitions))
	}
	b = binary.AppendUvarint(b, uint64(len(m.Members)))
	for i := range m.Members {
		mm := &m.Members[i]
		for _, s := range []string{mm.MemberID, mm.InstanceID, mm.RackID, mm.ClientID, mm.ClientHost} {
			b = framelog.AppendStr(b, s)
		}
		b = binary.AppendVarint(b, int64(mm.RebalanceTimeoutMs))
		b = binary.AppendUvarint(b, uint64(len(mm.TopicNames)))
		for _, n := range mm.TopicNames {
			b = framelog.AppendStr(b, n)
		}
		b = framelog.AppendStr(b, mm.Regex)
		b = framelog.AppendStr(b, mm.ServerAssignor)
		b = append(b, mm.State)
		b = binary.AppendVarint(b, int64(mm.Epoch))
		b = binary.AppendVarint(b, int64(mm.PreviousEpoch))
		for _, ps := range [][]ConsumerPartitions{mm.Assigned, mm.Revoking, mm.Target} {
			b = gsAppendConsumerParts(b, ps)
		}
		if !classic {
			continue
		}
		if mm.Classic == nil {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = binary.AppendVarint(b, int64(mm.Classic.SessionTimeoutMs))
		b = binary.AppendUvarint(b, uint64(len(mm.Classic.Protocols)))
		for _, p := range mm.Classic.Protocols {
			b = framelog.AppendStr(b, p.Name)
			b = framelog.AppendStr(b, string(p.Metadata))
		}
	}
	return b
}

func gsAppendConsumerParts(b []byte, ps []ConsumerPartitions) []byte {
	b = binary.AppendUvarint(b, uint64(len(ps)))
	for _, p := range ps {
		b = append(b, p.TopicID[:]...)
		b = binary.AppendUvarint(b, uint64(len(p.Partitions)))
		for _, n := range p.Partitions {
			b = binary.AppendVarint(b, int64(n))
		}
	}
	return b
}

func gsReadTopicID(r *framelog.Reader) [16]byte {
	var id [16]byte
	for i := range id {
		id[i] = r.Byte("topic id")
	}
	return id
}

func gsReadConsumerParts(r *framelog.Reader) []ConsumerPartitions {
	n := r.Count("topic count")
	var out []ConsumerPartitions
	for i := 0; i < n && r.Err == nil; i++ {
		p := ConsumerPartitions{TopicID: gsReadTopicID(r)}
		k := r.Count("partition count")
		for j := 0; j < k && r.Err == nil; j++ {
			p.Partitions = append(p.Partitions, int32(r.VarintIn("partition", 0, 1<<31-1)))
		}
		out = append(out, p)
	}
	return out
}

// gsReadConsumerMeta reads op 8's body; nil is the tombstone.
func gsReadConsumerMeta(r *framelog.Reader) *ConsumerGroupMeta {
	classic := false
	switch r.Byte("consumer meta presence") {
	case 0:
		return nil
	case 1:
	case 2:
		classic = true
	default:
		r.Fail("bad consumer meta presence")
		return nil
	}
	m := &ConsumerGroupMeta{}
	m.Epoch = int32(r.VarintIn("group epoch", -1<<31, 1<<31-1))
	m.AssignmentEpoch = int32(r.VarintIn("assignment epoch", -1<<31, 1<<31-1))
	m.Assignor = r.Str("assignor")
	nt := r.Count("subscribed topic count")
	for i := 0; i < nt && r.Err == nil; i++ {
		t := ConsumerTopic{Name: r.Str("topic")}
		t.ID = gsReadTopicID(r)
		t.Partitions = int32(r.VarintIn("partitions", 0, 1<<31-1))
		m.Subscribed = append(m.Subscribed, t)
	}
	n := r.Count("member count")
	for i := 0; i < n && r.Err == nil; i++ {
		var mm ConsumerMember
		mm.MemberID = r.Str("member id")
		mm.InstanceID = r.Str("instance id")
		mm.RackID = r.Str("rack id")
		mm.ClientID = r.Str("client id")
		mm.ClientHost = r.Str("client host")
		mm.RebalanceTimeoutMs = int32(r.VarintIn("rebalance timeout", -1<<31, 1<<31-1))
		k := r.Count("topic name count")
		for j := 0; j < k && r.Err == nil; j++ {
			mm.TopicNames = append(mm.TopicNames, r.Str("topic name"))
		}
		mm.Regex = r.Str("regex")
		mm.ServerAssignor = r.Str("server assignor")
		mm.State = r.Byte("member state")
		mm.Epoch = int32(r.VarintIn("member epoch", -1<<31, 1<<31-1))
		mm.PreviousEpoch = int32(r.VarintIn("previous member epoch", -1<<31, 1<<31-1))
		mm.Assigned = gsReadConsumerParts(r)
		mm.Revoking = gsReadConsumerParts(r)
		mm.Target = gsReadConsumerParts(r)
		if classic {
			switch r.Byte("classic member flag") {
			case 0:
			case 1:
				c := &ConsumerClassic{SessionTimeoutMs: int32(r.VarintIn("classic session timeout", 0, 1<<31-1))}
				np := r.Count("classic protocol count")
				for j := 0; j < np && r.Err == nil; j++ {
					c.Protocols = append(c.Protocols, ConsumerClassicProtocol{Name: r.Str("classic protocol"), Metadata: []byte(r.Str("classic protocol metadata"))})
				}
				mm.Classic = c
			default:
				r.Fail("bad classic member flag")
			}
		}
		m.Members = append(m.Members, mm)
	}
	return m
}

// StoreConsumerGroupAsync durably records m as group's consumer-group state (nil: the tombstone)
// and calls done once it is fsync'd (nil) or could not be (nothing changed). m must not be
// modified after the call. Ordered with every other operation; done runs on the writer goroutine
// and must not block.
func (s *GroupStore) StoreConsumerGroupAsync(group string, m *ConsumerGroupMeta, done func(error)) {
	s.enqueue(&gsOp{kind: gsOpConsumerMeta, group: group, cmeta: m, done: done})
}

// StoreConsumerGroup is the blocking form of StoreConsumerGroupAsync.
func (s *GroupStore) StoreConsumerGroup(group string, m *ConsumerGroupMeta) error {
	ch := make(chan error, 1)
	s.StoreConsumerGroupAsync(group, m, func(err error) { ch <- err })
	return <-ch
}

// ConsumerGroup returns group's durable consumer-group state, if it is a consumer group. The
// result is shared and must not be modified.
func (s *GroupStore) ConsumerGroup(group string) (*ConsumerGroupMeta, bool) {
	s.mu.RLock()
	m := s.cmeta[group]
	s.mu.RUnlock()
	return m, m != nil
}
