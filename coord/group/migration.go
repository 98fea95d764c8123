package group

// KIP-848 online migration between the classic protocol and the consumer protocol
// (group.consumer.migration.policy), following Apache's GroupMetadataManager: a rolling restart of
// consumers from group.protocol=classic to consumer (or back) keeps the group consuming.
//
//	             first ConsumerGroupHeartbeat (epoch 0), policy upgrade|bidirectional,
//	             protocol type "consumer", members < group.consumer.max.size
//	 ┌─────────┐ ────────────────────────────────────────────────────────────────▶ ┌──────────┐
//	 │ classic │                                                                  │ consumer │
//	 │  group  │ ◀──────────────────────────────────────────────────────────────── │  group   │
//	 └─────────┘  the last consumer-protocol member leaves (or is fenced), classic   └──────────┘
//	              members remain, policy downgrade|bidirectional, <= group.max.size:
//	              converted, then rebalanced (PreparingRebalance)
//
// Upgrade: every classic member becomes a classic-protocol member of the consumer group at member
// epoch = the classic generation, Stable, holding the partitions its last SyncGroup gave it
// (decoded from ConsumerProtocolAssignment; the owned partitions of its subscription when a
// restarted rebalance cleared that assignment), subscribed to the topics of its JoinGroup metadata
// (ConsumerProtocolSubscription); the target of that epoch is what each holds. The joining member
// then moves the group epoch, and the server-side assignor computes a target for everybody. A
// partition still moves only once its holder has revoked it (reconcile.go), so nothing is
// consumed by two members at once.
//
// A classic member inside a consumer group (Apache's classicGroup*ToConsumerGroup):
//   - JoinGroup updates its subscription from the metadata, reconciles it against the owned
//     partitions it reports, and answers at once with generation = its member epoch, no leader
//     (nobody runs a client-side assignment) and the first protocol it offered;
//   - SyncGroup returns its current assignment, computed by the server;
//   - Heartbeat answers REBALANCE_IN_PROGRESS while it must rejoin to move on: the group epoch is
//     past its epoch (and it is not in the middle of a revocation it already rejoined for), or
//     partitions it waits for have been released;
//   - OffsetCommit is checked with generation = member epoch (ILLEGAL_GENERATION otherwise);
//   - its session timeout is the JoinGroup's; a member told to rejoin that does not within its
//     rebalance timeout, or that does not SyncGroup within it after a join, is removed.

import (
	"sort"
	"strconv"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

var (
	mMigrationUpgrades   = metrics.NewCounter(`kaas_group_consumer_online_upgrades_total`)
	mMigrationDowngrades = metrics.NewCounter(`kaas_group_consumer_online_downgrades_total`)
	// mMigrationRefused counts online upgrades refused (policy, protocol type, size, metadata).
	mMigrationRefused = metrics.NewCounter(`kaas_group_consumer_online_upgrade_refusals_total`)
)

const consumerProtocolType = "consumer"

// classicMember is the classic-protocol side of a consumer-group member that uses JoinGroup.
type classicMember struct {
	sessionTimeout time.Duration
	protocols      []protocol // as offered in its last JoinGroup, in its order of preference
	joinTimer      timer      // told to rejoin: must within its rebalance timeout
	syncTimer      timer      // joined: must SyncGroup within its rebalance timeout
}

func (c *Coordinator) upgradeEnabled() bool {
	p := c.cfg.Consumer.MigrationPolicy
	return p == "" || p == "bidirectional" || p == "upgrade"
}

func (c *Coordinator) downgradeEnabled() bool {
	p := c.cfg.Consumer.MigrationPolicy
	return p == "" || p == "bidirectional" || p == "downgrade"
}

// decodeSubscription reads the first protocol whose metadata is a ConsumerProtocolSubscription.
func decodeSubscription(ps []protocol) (*kmsg.ConsumerMemberMetadata, bool) {
	for _, p := range ps {
		var md kmsg.ConsumerMemberMetadata
		if err := md.ReadFrom(p.metadata); err == nil {
			return &md, true
		}
	}
	return nil, false
}

// namedToAssignment maps (topic name, partitions) to ids; unknown topics are dropped (a deleted
// topic's partitions cannot be consumed anyway).
func namedToAssignment(topics *topicSnapshot, names func(yield func(string, []int32))) assignment {
	var ps []topicPart
	names(func(name string, parts []int32) {
		t, ok := topics.byName[name]
		if !ok {
			return
		}
		for _, p := range parts {
			if p >= 0 && p < t.Partitions {
				ps = append(ps, topicPart{t.ID, p})
			}
		}
	})
	return fromParts(ps)
}

// encodeAssignment is a ConsumerProtocolAssignment of a, as SyncGroup hands it to the member.
func encodeAssignment(topics *topicSnapshot, a assignment) []byte {
	var ma kmsg.ConsumerMemberAssignment
	ma.Default()
	ma.Version = 1
	for _, t := range sortedTopics(partitionCounts(a)) {
		name, ok := topics.byID[t]
		if !ok {
			continue
		}
		ma.Topics = append(ma.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: name, Partitions: append([]int32(nil), a[t]...)})
	}
	return ma.AppendTo(nil)
}

// tryUpgrade converts g, a classic group with members, into a consumer group for a
// ConsumerGroupHeartbeat joining it (Apache validateOnlineUpgrade + ConsumerGroup.fromClassicGroup).
// It answers a refusal, or nil once g.cg is set.
func (g *group) tryUpgrade(hr *cgHeartbeat) *kmsg.ConsumerGroupHeartbeatResponse {
	refuse := func(code int16, msg string) *kmsg.ConsumerGroupHeartbeatResponse {
		mMigrationRefused.Inc()
		g.log.Info("cannot upgrade the classic group to a consumer group", zap.String("reason", msg))
		return cghResp(hr.version, code, msg)
	}
	notConsumer := "Group " + g.id + " is not a consumer group."
	switch {
	case hr.epoch != 0:
		return cghResp(hr.version, codec.CodeGroupIDNotFound, notConsumer)
	case !g.c.upgradeEnabled():
		return refuse(codec.CodeGroupIDNotFound, notConsumer+" Online upgrade is disabled.")
	case g.protocolType != consumerProtocolType:
		return refuse(codec.CodeGroupIDNotFound, notConsumer+" It does not use the consumer embedded protocol.")
	case g.static[hr.instanceID] != "" && hr.instanceID != "":
		// The instance is a live classic member: the joining one would be refused after the
		// conversion (Apache writes nothing then), so the group is left classic.
		return cghResp(hr.version, codec.CodeUnreleasedInstanceID, "Static member with instance id "+hr.instanceID+" is not released yet.")
	case g.members[hr.memberID] != nil:
		return cghResp(hr.version, codec.CodeUnknownMemberID, "Member "+hr.memberID+" uses the classic protocol.")
	case len(g.members) >= g.c.cfg.Consumer.MaxSize:
		mConsumerMaxSize.Inc()
		return refuse(codec.CodeGroupMaxSizeReached, "Cannot upgrade classic group "+g.id+
			" to a consumer group: it has "+strconv.Itoa(len(g.members))+" members and group.consumer.max.size is "+
			strconv.Itoa(g.c.cfg.Consumer.MaxSize)+".")
	}
	topics := g.c.topicSnapshot()
	cg := newConsumerGroup()
	cg.epoch, cg.assignmentEpoch = g.generation, g.generation
	for _, om := range g.sortedMembers() {
		// The metadata of the generation's protocol, else the first that reads (a member that
		// joined a rebalance in progress may not offer it).
		md, ok := decodeSubscription([]protocol{{name: g.protocol, metadata: om.metadataFor(g.protocol)}})
		if !ok {
			md, ok = decodeSubscription(om.protocols)
		}
		if !ok {
			return refuse(codec.CodeGroupIDNotFound, notConsumer+" Member "+om.id+"'s subscription cannot be read.")
		}
		held := assignment{}
		if om.assignment == nil {
			// No assignment on record: a rebalance restarted while completing cleared it, or the
			// group was loaded mid-rebalance. A cooperative member goes on consuming what it owns
			// and says so in its subscription (an eager one revoked everything before it
			// rejoined), so that is what it holds: the new member must not be handed it.
			held = namedToAssignment(topics, func(yield func(string, []int32)) {
				for _, t := range md.OwnedPartitions {
					yield(t.Topic, t.Partitions)
				}
			})
		} else if len(om.assignment) > 0 {
			var ma kmsg.ConsumerMemberAssignment
			if err := ma.ReadFrom(om.assignment); err != nil {
				return refuse(codec.CodeGroupIDNotFound, notConsumer+" Member "+om.id+"'s assignment cannot be read.")
			}
			held = namedToAssignment(topics, func(yield func(string, []int32)) {
				for _, t := range ma.Topics {
					yield(t.Topic, t.Partitions)
				}
			})
		}
		names := append([]string(nil), md.Topics...)
		sort.Strings(names)
		cg.nextSeq++
		m := &consumerMember{
			id: om.id, instanceID: om.instanceID, rackID: derefOr(md.Rack), clientID: om.clientID, clientHost: om.clientHost,
			rebalanceTimeout: om.rebalanceTimeout, topicNames: dedupSorted(names), prevEpoch: g.generation, seq: cg.nextSeq,
			classic: &classicMember{sessionTimeout: om.sessionTimeout, protocols: om.protocols},
		}
		cg.members[m.id] = m
		if m.instanceID != "" {
			cg.static[m.instanceID] = m.id
		}
		cg.target[m.id] = held
		cg.setHolding(m, reconcileState{state: memberStable, epoch: g.generation, assigned: held})
	}
	// The classic group's parked requests are told to rejoin: their members now answer to the
	// consumer group.
	for _, om := range g.members {
		if om.awaitingJoin != nil {
			om.awaitingJoin.reply(g.joinError(om.awaitingJoin, om.id, codec.CodeRebalanceInProgress))
			om.awaitingJoin = nil
		}
		if om.awaitingSync != nil {
			om.awaitingSync.reply(syncError(om.awaitingSync, codec.CodeRebalanceInProgress))
			om.awaitingSync = nil
		}
		g.stop(&om.hb)
	}
	for id, t := range g.pending {
		g.stop(t)
		delete(g.pending, id)
	}
	g.stop(&g.join)
	g.stop(&g.syncTimer)
	g.log.Info("classic group upgraded to a consumer group", zap.Int32("generation", g.generation),
		zap.Int("members", len(g.members)))
	mMigrationUpgrades.Inc()
	g.members = make(map[string]*member)
	g.static = make(map[string]string)
	g.pendingSync = make(map[string]struct{})
	g.leader, g.protocol, g.assignPending = "", "", false
	g.transition(Empty)
	g.persistMeta("upgraded to a consumer group") // the classic metadata's tombstone
	cg.topicsPrint = topics.print
	cg.subscribed = cg.resolveSubscriptions(topics)
	g.cg = cg
	g.cgDirty = true
	for _, m := range cg.members {
		g.armSession(m)
	}
	return nil
}

// maybeDowngrade converts g back to a classic group when leaving is the last consumer-protocol
// member and classic members remain (Apache validateOnlineDowngrade + ClassicGroup.fromConsumerGroup),
// then rebalances it. It reports whether it did; leaving is then gone too.
func (g *group) maybeDowngrade(leaving *consumerMember) bool {
	cg := g.cg
	if leaving.classic != nil || !g.c.downgradeEnabled() || len(cg.members) < 2 {
		return false
	}
	for _, m := range cg.members {
		if m != leaving && m.classic == nil {
			return false
		}
	}
	if len(cg.members)-1 > g.c.cfg.MaxSize {
		g.log.Info("cannot downgrade the consumer group: more classic members than group.max.size")
		return false
	}
	topics := g.c.topicSnapshot()
	cg.unload(g)
	g.cg = nil
	g.cgDirty = true // the consumer state's tombstone
	g.generation = cg.epoch
	g.protocolType = consumerProtocolType
	for _, cm := range cg.sortedMembers() {
		if cm == leaving {
			continue
		}
		g.stop(&cm.classic.joinTimer)
		g.stop(&cm.classic.syncTimer)
		g.nextSeq++
		m := &member{
			id: cm.id, instanceID: cm.instanceID, clientID: cm.clientID, clientHost: cm.clientHost,
			rebalanceTimeout: cm.rebalanceTimeout, sessionTimeout: cm.classic.sessionTimeout,
			protocolType: consumerProtocolType, protocols: cm.classic.protocols,
			assignment: encodeAssignment(topics, cm.assigned), seq: g.nextSeq,
		}
		g.members[m.id] = m
		if m.static() {
			g.static[m.instanceID] = m.id
		}
		if g.leader == "" {
			g.leader = m.id
		}
	}
	g.protocol = g.selectProtocol()
	g.log.Info("consumer group downgraded to a classic group", zap.Int32("generation", g.generation),
		zap.Int("members", len(g.members)), zap.String("left", leaving.id))
	mMigrationDowngrades.Inc()
	g.transition(Stable)
	for _, m := range g.members {
		g.scheduleHeartbeat(m, m.sessionTimeout)
	}
	g.persistConsumer("downgraded to a classic group")
	g.prepareRebalance("downgrade from a consumer group: member " + leaving.id + " left")
	g.persistMeta("downgraded to a classic group")
	return true
}

// classicMemberOf is the classic-protocol member named by a JoinGroup/SyncGroup/Heartbeat
// (Apache validateConsumerGroupMember + throwIfMemberDoesNotUseClassicProtocol).
func (cg *consumerGroup) classicMemberOf(memberID, instanceID string) (*consumerMember, int16) {
	if instanceID != "" {
		cur, ok := cg.static[instanceID]
		if !ok {
			return nil, codec.CodeUnknownMemberID
		}
		if cur != memberID {
			return nil, codec.CodeFencedInstanceID
		}
	}
	m := cg.members[memberID]
	if m == nil || m.classic == nil {
		return nil, codec.CodeUnknownMemberID
	}
	return m, codec.CodeNone
}

// classicMustRejoin reports whether a classic member must rejoin to move on: the group epoch is
// past its epoch (unless it is revoking, which it rejoins for by itself once done, as Apache's
// throwIfRebalanceInProgress), or it waits for partitions that are now free.
func (g *group) classicMustRejoin(m *consumerMember) bool {
	cg := g.cg
	if cg.epoch > m.epoch && m.state != memberUnrevokedPartitions {
		return true
	}
	if m.state == memberUnreleasedPartitions {
		for _, tp := range cg.target[m.id].minus(m.assigned).parts() {
			if _, held := cg.holder[tp]; !held {
				return true
			}
		}
	}
	return false
}

// askRejoin answers REBALANCE_IN_PROGRESS and gives m its rebalance timeout to rejoin.
func (g *group) askRejoin(m *consumerMember) int16 {
	if m.classic.joinTimer.t == nil {
		cg := g.cg
		d := m.rebalanceTimeout
		g.arm(&m.classic.joinTimer, d, func() {
			if cg != g.cg || cg.members[m.id] != m {
				return
			}
			g.log.Info("classic member did not rejoin within its rebalance timeout; removing it", zap.String("member", m.id))
			mConsumerFenced.Inc()
			g.removeConsumerMember(m, "classic member "+m.id+" did not rejoin")
			g.persistConsumer("classic member did not rejoin")
			g.publish()
		})
	}
	return codec.CodeRebalanceInProgress
}

// classicHeartbeat is Heartbeat from a classic member of a consumer group.
func (g *group) classicHeartbeat(gen int32, memberID, instanceID string) int16 {
	m, code := g.cg.classicMemberOf(memberID, instanceID)
	if code != codec.CodeNone {
		return code
	}
	if gen != m.epoch {
		return codec.CodeIllegalGeneration
	}
	g.armSession(m)
	if g.classicMustRejoin(m) {
		return g.askRejoin(m)
	}
	g.stop(&m.classic.joinTimer)
	return codec.CodeNone
}

// classicSync is SyncGroup from a classic member of a consumer group: the assignment is the
// server's (the request's assignments, if any, are ignored).
func (g *group) classicSync(sr *syncReq, gen int32, memberID, instanceID string, protocolType, protocolName *string) *kmsg.SyncGroupResponse {
	m, code := g.cg.classicMemberOf(memberID, instanceID)
	if code != codec.CodeNone {
		return syncError(sr, code)
	}
	if gen != m.epoch {
		return syncError(sr, codec.CodeIllegalGeneration)
	}
	chosen := m.classic.protocols[0].name
	if (protocolType != nil && *protocolType != consumerProtocolType) || (protocolName != nil && *protocolName != chosen) {
		return syncError(sr, codec.CodeInconsistentGroupProtocol)
	}
	if g.classicMustRejoin(m) {
		return syncError(sr, g.askRejoin(m))
	}
	g.stop(&m.classic.joinTimer)
	g.stop(&m.classic.syncTimer)
	g.armSession(m)
	resp := kmsg.NewPtrSyncGroupResponse()
	resp.Version = sr.version
	pt := consumerProtocolType
	resp.ProtocolType = &pt
	resp.Protocol = &chosen
	resp.MemberAssignment = encodeAssignment(g.c.topicSnapshot(), m.assigned)
	return resp
}

// supportsClassicJoin is Apache ConsumerGroup.supportsClassicProtocols: protocol type "consumer",
// at least one protocol, and one protocol name every other classic member offered too.
func (cg *consumerGroup) supportsClassicJoin(memberID, protocolType string, ps []protocol) bool {
	if protocolType != consumerProtocolType || len(ps) == 0 {
		return false
	}
	for _, p := range ps {
		all := true
		for _, m := range cg.members {
			if m.classic == nil || m.id == memberID {
				continue
			}
			found := false
			for _, q := range m.classic.protocols {
				found = found || q.name == p.name
			}
			if !found {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// classicJoin is JoinGroup to a consumer group with members (Apache classicGroupJoinToConsumerGroup).
func (g *group) classicJoin(jr *joinReq) {
	cg := g.cg
	memberID := jr.memberID
	unknown := memberID == ""
	if unknown {
		memberID = newMemberID(jr.clientID)
		if jr.instanceID != "" {
			memberID = newMemberID(jr.instanceID)
		}
	}
	existing := cg.members[memberID]
	if jr.instanceID != "" {
		if cur, ok := cg.static[jr.instanceID]; ok {
			existing = cg.members[cur]
			if !unknown && cur != memberID {
				jr.reply(g.joinError(jr, jr.memberID, codec.CodeFencedInstanceID))
				return
			}
		}
	}
	if existing == nil && len(cg.members) >= g.c.cfg.Consumer.MaxSize {
		mConsumerMaxSize.Inc()
		jr.reply(g.joinError(jr, "", codec.CodeGroupMaxSizeReached))
		return
	}
	if !cg.supportsClassicJoin(memberID, jr.protocolType, jr.protocols) {
		jr.reply(g.joinError(jr, jr.memberID, codec.CodeInconsistentGroupProtocol))
		return
	}
	if existing != nil && existing.classic == nil {
		// A consumer-protocol member's id on the classic path (Apache: UNKNOWN_MEMBER_ID).
		jr.reply(g.joinError(jr, jr.memberID, codec.CodeUnknownMemberID))
		return
	}
	if unknown && jr.instanceID == "" && jr.version >= 4 {
		// KIP-394: the member comes back with this id; a consumer group creates members on
		// their join with an id, so nothing is kept pending.
		jr.reply(g.joinError(jr, memberID, codec.CodeMemberIDRequired))
		return
	}
	md, ok := decodeSubscription(jr.protocols)
	if !ok {
		jr.reply(g.joinError(jr, jr.memberID, codec.CodeInconsistentGroupProtocol))
		return
	}
	defer func() {
		if g.cgDirty {
			g.persistConsumer("classic join")
			g.publish()
		}
	}()
	topics := g.c.topicSnapshot()
	m := existing
	changed := false
	switch {
	case m == nil:
		cg.nextSeq++
		m = &consumerMember{id: memberID, instanceID: jr.instanceID, seq: cg.nextSeq,
			reconcileState: reconcileState{assigned: assignment{}}, classic: &classicMember{}}
		cg.members[m.id] = m
		if m.instanceID != "" {
			cg.static[m.instanceID] = m.id
		}
		changed = true
		g.log.Info("classic member joined the consumer group", zap.String("member", m.id), zap.String("instance", m.instanceID))
	case m.id != memberID:
		// A static member rejoining with an unknown member id takes the old one's place and
		// assignment (KIP-345).
		old := m
		epoch := old.epoch
		if epoch == leaveStaticEpoch {
			epoch = old.prevEpoch
		}
		g.stop(&old.classic.joinTimer)
		g.stop(&old.classic.syncTimer)
		m = g.replaceStatic(old, memberID)
		m.epoch = epoch
		m.classic = &classicMember{}
	}
	m.classic.sessionTimeout = jr.sessionTimeout
	m.classic.protocols = jr.protocols
	m.rebalanceTimeout = jr.rebalanceTimeout
	m.clientID, m.clientHost = jr.clientID, jr.clientHost
	if r := derefOr(md.Rack); r != m.rackID {
		m.rackID = r
	}
	m.serverAssignor = ""
	names := append([]string(nil), md.Topics...)
	sort.Strings(names)
	names = dedupSorted(names)
	if !equalStrings(names, m.topicNames) {
		m.topicNames, changed = names, true
	}
	g.cgDirty = true
	if changed || topics.print != cg.topicsPrint {
		cg.topicsPrint = topics.print
		if sub := cg.resolveSubscriptions(topics); changed || !equalMeta(sub, cg.subscribed) {
			cg.subscribed = sub
			g.bumpConsumerEpoch(topics, "classic member "+m.id+" joined or changed its subscription")
		}
	}
	owned := namedToAssignment(topics, func(yield func(string, []int32)) {
		for _, t := range md.OwnedPartitions {
			yield(t.Topic, t.Partitions)
		}
	})
	g.reconcileMember(m, owned)
	if m.state == memberUnrevokedPartitions && !owned.overlaps(m.revoking) {
		// An eager client revoked everything before it rejoined: the revocation is done.
		g.reconcileMember(m, owned)
	}
	g.stop(&m.classic.joinTimer)
	g.armSession(m)
	cgr := cg
	d := jr.rebalanceTimeout
	g.arm(&m.classic.syncTimer, d, func() {
		if cgr != g.cg || cgr.members[m.id] != m {
			return
		}
		g.log.Info("classic member did not SyncGroup within its rebalance timeout; removing it", zap.String("member", m.id))
		mConsumerFenced.Inc()
		g.removeConsumerMember(m, "classic member "+m.id+" did not sync")
		g.persistConsumer("classic member did not sync")
		g.publish()
	})
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.Version = jr.version
	resp.MemberID = m.id
	resp.Generation = m.epoch
	pt, proto := consumerProtocolType, m.classic.protocols[0].name
	resp.ProtocolType = &pt
	resp.Protocol = &proto
	jr.reply(resp)
}

// classicSnapshot is m's persisted classic side (nil for a consumer-protocol member).
func (m *consumerMember) classicSnapshot() *storage.ConsumerClassic {
	if m.classic == nil {
		return nil
	}
	c := &storage.ConsumerClassic{SessionTimeoutMs: int32(m.classic.sessionTimeout.Milliseconds())}
	for _, p := range m.classic.protocols {
		c.Protocols = append(c.Protocols, storage.ConsumerClassicProtocol{Name: p.name, Metadata: p.metadata})
	}
	return c
}

func restoreClassic(c *storage.ConsumerClassic) *classicMember {
	if c == nil {
		return nil
	}
	cm := &classicMember{sessionTimeout: time.Duration(c.SessionTimeoutMs) * time.Millisecond}
	for _, p := range c.Protocols {
		cm.protocols = append(cm.protocols, protocol{name: p.Name, metadata: p.Metadata})
	}
	if len(cm.protocols) == 0 {
		return nil // unusable: the member rejoins as a consumer-protocol member would
	}
	return cm
}
