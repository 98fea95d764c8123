package group

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// MaxMetadataBytes is offset.metadata.max.bytes (Apache default 4096): longer commit metadata is
// answered OFFSET_METADATA_TOO_LARGE for that partition.
const MaxMetadataBytes = 4096

// Commit identifies who commits: a group member (generation >= 0 or a member id / instance id)
// is validated against the group; generation -1 with no member id is a "simple" commit from a
// manual-assign consumer, allowed only while the group has no members.
//
// For a KIP-848 consumer group, Generation is the member epoch, and Version is the OffsetCommit
// version (a consumer-protocol member must commit with v9+ outside a transaction).
type Commit struct {
	Group      string
	Generation int32
	MemberID   string
	InstanceID string
	Version    int16
}

// CommitOffsets validates the committer and durably stores offs; done gets one code for the whole
// request (Apache answers every partition with the same validation or storage error): NONE only
// after the offsets are fsync'd. done may run on another goroutine.
func (c *Coordinator) CommitOffsets(cm Commit, offs []storage.GroupOffset, done func(code int16)) {
	if idsTooLong(cm.Group, cm.MemberID, cm.InstanceID) {
		done(codec.CodeInvalidRequest)
		return
	}
	g, code := c.lookup(cm.Group, false)
	if code == codec.CodeNone && g == nil {
		if cm.Generation >= 0 {
			// A generation for a group we do not know: a member of a generation that is gone.
			done(codec.CodeIllegalGeneration)
			return
		}
		g, code = c.lookup(cm.Group, true)
	}
	if code != codec.CodeNone {
		done(code)
		return
	}
	stampCommitTime(offs)
	if !g.tryDo(func() {
		if g.unloaded {
			done(codec.CodeNotCoordinator)
			return
		}
		if code := g.validateCommit(cm, false); code != codec.CodeNone {
			done(code)
			return
		}
		switch g.state {
		case Empty:
		case Stable, PreparingRebalance:
			// Still allowed while preparing: the member learns of the rebalance from its next
			// heartbeat. A commit counts as a sign of life.
			m := g.members[cm.MemberID]
			g.scheduleHeartbeat(m, m.sessionTimeout)
		case CompletingRebalance:
			// The member has the new generation from JoinGroup but no assignment yet.
			done(codec.CodeRebalanceInProgress)
			return
		default:
			done(codec.CodeCoordinatorNotAvailable)
			return
		}
		if !c.beginStore(g) {
			done(codec.CodeNotCoordinator)
			return
		}
		c.store.CommitAsync(g.id, offs, func(err error) {
			defer c.endStore(g)
			if err != nil {
				mCommitFailures.Inc()
				g.log.Warn("offset commit failed", zap.Error(err))
			}
			done(storeErrorCode(err))
		})
	}) {
		done(codec.CodeCoordinatorNotAvailable)
	}
}

// validateCommit is Apache validateOffsetCommit. transactional relaxes the "only members may
// commit to a non-empty group" rule (TxnOffsetCommit v0-2 carry no member; txn_offsets.go).
func (g *group) validateCommit(cm Commit, transactional bool) int16 {
	if g.state == Dead {
		return codec.CodeCoordinatorNotAvailable
	}
	if g.cg != nil {
		return g.cg.validateCommit(cm.MemberID, cm.Generation, transactional, cm.Version)
	}
	if cm.Generation >= 0 || cm.MemberID != "" || cm.InstanceID != "" {
		if code := g.validateMember(cm.MemberID, cm.InstanceID); code != codec.CodeNone {
			return code
		}
		if cm.Generation != g.generation {
			return codec.CodeIllegalGeneration
		}
		return codec.CodeNone
	}
	if !transactional && g.state != Empty {
		return codec.CodeUnknownMemberID
	}
	return codec.CodeNone
}

// FetchedOffset is one OffsetFetch partition result.
type FetchedOffset struct {
	Topic       string
	Partition   int32
	Offset      int64 // -1 when nothing is committed
	LeaderEpoch int32 // -1 when unknown
	Metadata    string
	Code        int16
}

// FetchOffsets answers OffsetFetch for one group: parts nil means every committed partition.
// Offsets are returned whatever the group's state (Apache: the group may not use Kafka for
// membership at all). With requireStable (KIP-447), a partition with pending transactional
// offsets answers UNSTABLE_OFFSET_COMMIT so the consumer retries instead of reading a stale
// position. It does not block: it reads the store's durable in-memory set.
func (c *Coordinator) FetchOffsets(group string, parts []storage.GroupPartition, requireStable bool) (int16, []FetchedOffset) {
	if idsTooLong(group) {
		return codec.CodeInvalidRequest, nil
	}
	if code := c.Serving(group); code != codec.CodeNone {
		return code, nil
	}
	var out []FetchedOffset
	res := func(o storage.GroupOffset, ok bool, topic string, partition int32) FetchedOffset {
		if requireStable && c.store.HasPending(group, topic, partition) {
			return FetchedOffset{Topic: topic, Partition: partition, Offset: -1, LeaderEpoch: -1, Code: codec.CodeUnstableOffsetCommit}
		}
		if !ok {
			return FetchedOffset{Topic: topic, Partition: partition, Offset: -1, LeaderEpoch: -1}
		}
		return FetchedOffset{Topic: topic, Partition: partition, Offset: o.Offset, LeaderEpoch: o.LeaderEpoch, Metadata: o.Metadata}
	}
	if parts == nil {
		for _, o := range c.store.Offsets(group) {
			out = append(out, res(o, true, o.Topic, o.Partition))
		}
		return codec.CodeNone, out
	}
	out = make([]FetchedOffset, 0, len(parts))
	for _, p := range parts {
		o, ok := c.store.Offset(group, p.Topic, p.Partition)
		out = append(out, res(o, ok, p.Topic, p.Partition))
	}
	return codec.CodeNone, out
}

// DeleteOffsets serves OffsetDelete (KIP-496): an Empty group may drop any offsets; a consumer
// group with members may drop only those of topics no member subscribes to (others get
// GROUP_SUBSCRIBED_TO_TOPIC); a non-consumer group with members gets NON_EMPTY_GROUP. done gets the
// group-level code and, when that is NONE, a code per requested partition.
func (c *Coordinator) DeleteOffsets(group string, parts []storage.GroupPartition, done func(code int16, partCodes []int16)) {
	if idsTooLong(group) {
		done(codec.CodeInvalidRequest, nil)
		return
	}
	g, code := c.lookup(group, false)
	if code == codec.CodeNone && g == nil {
		code = codec.CodeGroupIDNotFound
	}
	if code != codec.CodeNone {
		done(code, nil)
		return
	}
	if !g.tryDo(func() {
		if g.unloaded {
			done(codec.CodeNotCoordinator, nil)
			return
		}
		codes := make([]int16, len(parts))
		var eligible []storage.GroupPartition
		switch {
		case g.state == Dead:
			done(codec.CodeGroupIDNotFound, nil)
			return
		case g.cg != nil && len(g.cg.members) > 0:
			// Apache ConsumerGroup.isSubscribedToTopic: the topics some member subscribes to.
			for i, p := range parts {
				if _, ok := g.cg.subscribed[p.Topic]; ok {
					codes[i] = codec.CodeGroupSubscribedToTopic
				} else {
					eligible = append(eligible, p)
				}
			}
		case g.state == Empty:
			eligible = parts
		default:
			if g.protocolType != "consumer" {
				done(codec.CodeNonEmptyGroup, nil)
				return
			}
			for i, p := range parts {
				if g.isSubscribedTo(p.Topic) {
					codes[i] = codec.CodeGroupSubscribedToTopic
				} else {
					eligible = append(eligible, p)
				}
			}
		}
		if len(eligible) == 0 {
			done(codec.CodeNone, codes)
			return
		}
		if !c.beginStore(g) {
			done(codec.CodeNotCoordinator, nil)
			return
		}
		c.store.DeleteOffsetsAsync(g.id, eligible, func(err error) {
			defer c.endStore(g)
			if err != nil {
				g.log.Warn("offset delete failed", zap.Error(err))
				done(storeErrorCode(err), nil)
				return
			}
			done(codec.CodeNone, codes)
		})
	}) {
		done(codec.CodeCoordinatorNotAvailable, nil)
	}
}

// DeleteGroup serves DeleteGroups for one group: only an Empty group may be deleted (else
// NON_EMPTY_GROUP); its offsets are removed durably before done(NONE). Pending transactional
// offsets do not block the delete (Apache decides on membership only) and are discarded with the
// group, as Apache's classic coordinator drops the whole group (pending commits included) from its
// cache: a later CompleteTxnOffsets(commit) for that producer materialises nothing. (Apache 4.0's
// new coordinator drops only the pending offsets of partitions that had committed offsets; we do
// not copy that half-deleted state.)
func (c *Coordinator) DeleteGroup(group string, done func(code int16)) {
	if idsTooLong(group) {
		done(codec.CodeInvalidRequest)
		return
	}
	g, code := c.lookup(group, false)
	if code == codec.CodeNone && g == nil {
		code = codec.CodeGroupIDNotFound
	}
	if code != codec.CodeNone {
		done(code)
		return
	}
	if !g.tryDo(func() {
		switch {
		case g.unloaded:
			done(codec.CodeNotCoordinator)
			return
		case g.state == Dead:
			done(codec.CodeGroupIDNotFound)
			return
		case g.state != Empty, g.cg != nil && len(g.cg.members) > 0:
			done(codec.CodeNonEmptyGroup)
			return
		}
		if !c.beginStore(g) {
			done(codec.CodeNotCoordinator)
			return
		}
		// Dead until the delete is durable: requests racing with it get
		// COORDINATOR_NOT_AVAILABLE and retry against a fresh group afterwards.
		g.transition(Dead)
		g.stop(&g.join)
		g.stop(&g.syncTimer)
		c.store.DeleteGroupAsync(g.id, func(err error) {
			defer c.endStore(g)
			if err != nil {
				g.log.Warn("group delete failed", zap.Error(err))
				g.do(func() {
					if g.state == Dead {
						g.transition(Empty)
					}
				})
				done(storeErrorCode(err))
				return
			}
			c.forget(g)
			done(codec.CodeNone)
		})
	}) {
		done(codec.CodeCoordinatorNotAvailable)
	}
}

// DescribeGroup serves DescribeGroups for one group. Unknown groups, and consumer groups (which
// the classic API does not describe), are described as Dead with no error (Apache,
// DescribeGroups v0-5); ErrorMessage then says why, for v6. Member metadata and assignments are
// included only when Stable, as Apache does.
func (c *Coordinator) DescribeGroup(group string, done func(kmsg.DescribeGroupsResponseGroup)) {
	dead := func() kmsg.DescribeGroupsResponseGroup {
		d := kmsg.NewDescribeGroupsResponseGroup()
		d.Group = group
		d.State = Dead.String()
		return d
	}
	if idsTooLong(group) {
		d := dead()
		d.ErrorCode = codec.CodeInvalidRequest
		done(d)
		return
	}
	g, code := c.lookup(group, false)
	if g == nil {
		d := dead()
		d.ErrorCode = code
		done(d)
		return
	}
	if !g.tryDo(func() {
		if g.unloaded {
			d := dead()
			d.ErrorCode = codec.CodeNotCoordinator
			done(d)
			return
		}
		if g.cg != nil && g.state != Dead {
			// The classic API describes classic groups only. Apache 4.1 answers a consumer
			// (KIP-848) group as Dead, which DescribeGroups v6 (KIP-1043) turns into
			// GROUP_ID_NOT_FOUND with this message; clients describe it with
			// ConsumerGroupDescribe instead (Kafka's Admin, kafka-consumer-groups).
			d := dead()
			msg := "Group " + group + " is not a classic group."
			d.ErrorMessage = &msg
			done(d)
			return
		}
		d := kmsg.NewDescribeGroupsResponseGroup()
		d.Group = g.id
		d.State = g.state.String()
		d.ProtocolType = g.protocolType
		if g.state == Stable {
			d.Protocol = g.protocol
		}
		if g.state != Dead {
			for _, m := range g.sortedMembers() {
				dm := kmsg.NewDescribeGroupsResponseGroupMember()
				dm.MemberID = m.id
				if m.static() {
					inst := m.instanceID
					dm.InstanceID = &inst
				}
				dm.ClientID = m.clientID
				dm.ClientHost = m.clientHost
				if g.state == Stable {
					dm.ProtocolMetadata = m.metadataFor(g.protocol)
					dm.MemberAssignment = m.assignment
				}
				d.Members = append(d.Members, dm)
			}
		}
		done(d)
	}) {
		d := dead()
		d.ErrorCode = codec.CodeCoordinatorNotAvailable
		done(d)
	}
}

// stampCommitTime sets the commit time of offsets that carry none (the broker's clock, as Apache
// stamps commits it receives).
func stampCommitTime(offs []storage.GroupOffset) {
	now := time.Now().UnixMilli()
	for i := range offs {
		if offs[i].CommitTimeMs == 0 {
			offs[i].CommitTimeMs = now
		}
	}
}
