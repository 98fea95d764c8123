package group

// KIP-848 consumer groups (group.protocol=consumer): ConsumerGroupHeartbeat drives membership,
// the broker computes a target assignment with a server-side assignor (assignor.go) whenever the
// group epoch moves, and each member reconciles towards it one heartbeat at a time
// (reconcile.go). It follows Apache's GroupMetadataManager.consumerGroupHeartbeat.
//
// Epochs:
//   - the group epoch is bumped by every change that can change the assignment: a member joins,
//     leaves or is fenced, a member's subscription or server assignor changes, or the metadata of
//     a subscribed topic changes (a topic appears, for a regex too, or gains partitions);
//   - the target assignment epoch is the group epoch the target was computed at (the target is
//     computed at once, so the group is never left Assigning);
//   - a member's epoch is the target epoch it has reconciled to; a heartbeat at any other epoch is
//     FENCED_MEMBER_EPOCH (except the previous epoch with a subset of the current assignment: a
//     lost response), and an OffsetCommit at any other epoch is STALE_MEMBER_EPOCH.
//
// A consumer group lives in the same group object as a classic group (same id space, shard,
// mailbox and committed offsets): g.cg non-nil makes it a consumer group. An Empty classic group
// becomes a consumer group on its first ConsumerGroupHeartbeat, and an empty consumer group becomes
// a classic one on a JoinGroup, as Apache allows. A non-empty group migrates online
// (group.consumer.migration.policy): classic members live on inside a consumer group as
// classic-protocol members, and the group converts back when its last consumer-protocol member
// leaves (migration.go).
//
// Persistence (consumer_meta.go): the group epoch, target assignment and members are written to
// the offset store (op 8) after every change, so a restart or a shard move keeps the epochs and
// assignments.

import (
	"crypto/rand"
	"encoding/base64"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
)

// ConsumerConfig holds the group.consumer.* settings (configs.ConsumerGroup).
type ConsumerConfig struct {
	SessionTimeout    time.Duration // group.consumer.session.timeout.ms
	HeartbeatInterval time.Duration // group.consumer.heartbeat.interval.ms
	MaxSize           int           // group.consumer.max.size
	Assignors         []string      // group.consumer.assignors (short names); the first is the default
	// MigrationPolicy is group.consumer.migration.policy, lower case: disabled, upgrade,
	// downgrade or bidirectional ("" is bidirectional, Apache's default). See migration.go.
	MigrationPolicy string
}

// TopicInfo is one topic as consumer-group subscriptions see it.
type TopicInfo struct {
	Name       string
	ID         [16]byte
	Partitions int32
}

const (
	leaveEpoch       = -1 // MemberEpoch of a leave (and of a member that left)
	leaveStaticEpoch = -2 // MemberEpoch of a static member's temporary leave (KIP-345 for KIP-848)
)

var (
	mConsumerEpochBumps = metrics.NewCounter(`kaas_group_consumer_epoch_bumps_total`)
	mConsumerFenced     = metrics.NewCounter(`kaas_group_consumer_members_fenced_total`)
	// mConsumerMaxSize counts joins refused GROUP_MAX_SIZE_REACHED (group.consumer.max.size).
	mConsumerMaxSize = metrics.NewCounter(`kaas_group_consumer_max_size_refusals_total`)
)

// consumerGroup is a KIP-848 group's state, owned by the group's goroutine.
type consumerGroup struct {
	epoch           int32
	assignmentEpoch int32
	assignor        string // the assignor that computed the target
	members         map[string]*consumerMember
	static          map[string]string     // group.instance.id → member id
	target          map[string]assignment // member id → target assignment
	holder          map[topicPart]string  // partition → member holding it (assigned or revoking)
	subscribed      map[string]topicMeta  // subscribed topic name → its metadata at the last epoch bump
	topicsPrint     uint64                // fingerprint of the topic list subscriptions were last resolved against
	nextSeq         uint64
}

type topicMeta struct {
	id         topicID
	partitions int32
}

// consumerMember is one KIP-848 member.
type consumerMember struct {
	id, instanceID, rackID, clientID, clientHost string
	rebalanceTimeout                             time.Duration
	topicNames                                   []string // sorted
	regex                                        string
	re                                           *regexp.Regexp
	serverAssignor                               string
	canDescribe                                  func(string) bool // the regex's ACL filter; nil = every topic
	classic                                      *classicMember    // non-nil: uses JoinGroup/SyncGroup (migration.go)
	reconcileState
	prevEpoch int32
	session   timer
	revoke    timer // the rebalance timeout of a revocation
	seq       uint64
}

func newConsumerGroup() *consumerGroup {
	return &consumerGroup{
		members:    make(map[string]*consumerMember),
		static:     make(map[string]string),
		target:     make(map[string]assignment),
		holder:     make(map[topicPart]string),
		subscribed: make(map[string]topicMeta),
	}
}

// state is Apache's ConsumerGroupState.
func (cg *consumerGroup) state() string {
	if len(cg.members) == 0 {
		return "Empty"
	}
	if cg.epoch > cg.assignmentEpoch {
		return "Assigning"
	}
	for _, m := range cg.members {
		if m.epoch != cg.assignmentEpoch || m.state != memberStable {
			return "Reconciling"
		}
	}
	return "Stable"
}

func (cg *consumerGroup) sortedMembers() []*consumerMember {
	out := make([]*consumerMember, 0, len(cg.members))
	for _, m := range cg.members {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}

// cgHeartbeat is a ConsumerGroupHeartbeat copied out of the request.
type cgHeartbeat struct {
	version          int16
	memberID         string
	epoch            int32
	instanceID       string
	rackID           *string
	rebalanceTimeout int32
	names            []string // nil: unchanged
	regex            *string  // nil: unchanged
	assignor         *string  // nil: unchanged
	owned            assignment
	ownedSet         bool // Topics was sent
	clientID         string
	clientHost       string
	canDescribe      func(string) bool
}

// full reports a heartbeat that carries everything (Apache isFullRequest): its answer carries
// the assignment even when it did not change, so a member that lost a response catches up.
func (hr *cgHeartbeat) full() bool {
	return hr.rebalanceTimeout != -1 && (hr.names != nil || hr.regex != nil) && hr.ownedSet
}

func cghResp(version int16, code int16, msg string) *kmsg.ConsumerGroupHeartbeatResponse {
	resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	resp.Version = version
	resp.ErrorCode = code
	resp.MemberEpoch = -1
	if msg != "" {
		resp.ErrorMessage = &msg
	}
	return resp
}

// validateConsumerHeartbeat is Apache throwIfConsumerGroupHeartbeatRequestIsInvalid, with one
// leniency: Apache refuses a static leave (epoch -2) without InstanceId as INVALID_REQUEST, and
// franz-go (v1.22) sends its static leave without it; here the member id alone names the
// static member (consumerLeave), so such a client's restart keeps its assignment.
func (c *Coordinator) validateConsumerHeartbeat(req *kmsg.ConsumerGroupHeartbeatRequest) (int16, string) {
	if req.Group == "" {
		return codec.CodeInvalidRequest, "GroupId can't be empty."
	}
	if req.InstanceID != nil && *req.InstanceID == "" {
		return codec.CodeInvalidRequest, "InstanceId can't be empty."
	}
	if req.RackID != nil && *req.RackID == "" {
		return codec.CodeInvalidRequest, "RackId can't be empty."
	}
	if idsTooLong(req.Group, req.MemberID, derefOr(req.InstanceID)) {
		return codec.CodeInvalidRequest, "An id is longer than 32767 bytes."
	}
	if req.Version >= 1 && req.MemberID == "" {
		return codec.CodeInvalidRequest, "MemberId can't be empty."
	}
	switch {
	case req.MemberEpoch == 0:
		if req.RebalanceTimeoutMillis == -1 {
			return codec.CodeInvalidRequest, "RebalanceTimeoutMs must be provided in first request."
		}
		if len(req.Topics) != 0 {
			return codec.CodeInvalidRequest, "TopicPartitions must be empty when (re-)joining."
		}
		if req.SubscribedTopicNames == nil && req.SubscribedTopicRegex == nil {
			return codec.CodeInvalidRequest, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
		}
	case req.MemberEpoch < leaveStaticEpoch:
		return codec.CodeInvalidRequest, "MemberEpoch is invalid."
	}
	if req.Version == 0 && req.MemberEpoch != 0 && req.MemberID == "" {
		return codec.CodeInvalidRequest, "MemberId can't be empty."
	}
	if req.ServerAssignor != nil && *req.ServerAssignor != "" && !c.hasAssignor(*req.ServerAssignor) {
		return codec.CodeUnsupportedAssignor, "ServerAssignor " + *req.ServerAssignor + " is not supported. Supported assignors: " + strings.Join(c.cfg.Consumer.Assignors, ", ") + "."
	}
	if req.SubscribedTopicRegex != nil && *req.SubscribedTopicRegex != "" {
		if _, err := regexp.Compile(*req.SubscribedTopicRegex); err != nil {
			return codec.CodeInvalidRegularExpression, "SubscribedTopicRegex is not a valid regular expression: " + err.Error()
		}
	}
	return codec.CodeNone, ""
}

func (c *Coordinator) hasAssignor(name string) bool {
	for _, a := range c.cfg.Consumer.Assignors {
		if a == name {
			return true
		}
	}
	return false
}

// ConsumerGroupHeartbeat serves ConsumerGroupHeartbeat v0-1. clientHost is reported by the
// describe APIs. canDescribe reports whether the member's principal may DESCRIBE a topic: a
// regex subscription only resolves to those (Apache 4.1); nil allows every topic. It is kept with
// the member and called from the group's goroutine. reply is called exactly once, from the
// group's goroutine; nothing from req is kept without copying.
func (c *Coordinator) ConsumerGroupHeartbeat(req *kmsg.ConsumerGroupHeartbeatRequest, clientID, clientHost string, canDescribe func(topic string) bool, reply func(*kmsg.ConsumerGroupHeartbeatResponse)) {
	if code, msg := c.validateConsumerHeartbeat(req); code != codec.CodeNone {
		reply(cghResp(req.Version, code, msg))
		return
	}
	hr := &cgHeartbeat{
		version:          req.Version,
		memberID:         strings.Clone(req.MemberID),
		epoch:            req.MemberEpoch,
		instanceID:       strings.Clone(derefOr(req.InstanceID)),
		rebalanceTimeout: req.RebalanceTimeoutMillis,
		clientID:         clientID,
		clientHost:       clientHost,
		canDescribe:      canDescribe,
	}
	if req.RackID != nil {
		r := strings.Clone(*req.RackID)
		hr.rackID = &r
	}
	if req.SubscribedTopicNames != nil {
		hr.names = make([]string, 0, len(req.SubscribedTopicNames))
		for _, n := range req.SubscribedTopicNames {
			hr.names = append(hr.names, strings.Clone(n))
		}
		sort.Strings(hr.names)
		hr.names = dedupSorted(hr.names)
	}
	if req.SubscribedTopicRegex != nil {
		r := strings.Clone(*req.SubscribedTopicRegex)
		hr.regex = &r
	}
	if req.ServerAssignor != nil {
		a := strings.Clone(*req.ServerAssignor)
		hr.assignor = &a
	}
	if req.Topics != nil {
		hr.ownedSet = true
		var ps []topicPart
		for _, t := range req.Topics {
			for _, p := range t.Partitions {
				ps = append(ps, topicPart{t.TopicID, p})
			}
		}
		hr.owned = fromParts(ps)
	}
	if hr.memberID == "" { // v0 join: the coordinator names the member
		hr.memberID = newConsumerMemberID()
	}
	g, code := c.lookup(req.Group, req.MemberEpoch == 0)
	if code == codec.CodeNone && g == nil {
		reply(cghResp(req.Version, codec.CodeGroupIDNotFound, "Consumer group "+req.Group+" not found."))
		return
	}
	if code != codec.CodeNone {
		reply(cghResp(req.Version, code, ""))
		return
	}
	if !g.tryDo(func() { reply(g.consumerHeartbeat(hr)) }) {
		reply(cghResp(req.Version, codec.CodeCoordinatorNotAvailable, ""))
	}
}

func dedupSorted(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// newConsumerMemberID is a random UUID in URL-safe base64 (what v1 clients generate themselves).
func newConsumerMemberID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// classicEmpty reports a classic group with nothing in it (only offsets, or nothing at all).
func (g *group) classicEmpty() bool {
	return g.state == Empty && len(g.members) == 0 && len(g.pending) == 0
}

func (g *group) consumerHeartbeat(hr *cgHeartbeat) *kmsg.ConsumerGroupHeartbeatResponse {
	switch {
	case g.unloaded:
		return cghResp(hr.version, codec.CodeNotCoordinator, "")
	case g.state == Dead:
		return cghResp(hr.version, codec.CodeCoordinatorNotAvailable, "")
	}
	if g.cg == nil {
		switch {
		case hr.epoch != 0:
			return cghResp(hr.version, codec.CodeGroupIDNotFound, "Group "+g.id+" is not a consumer group.")
		case g.classicEmpty():
			// Apache converts an empty classic group on the first consumer-protocol join; its
			// committed offsets stay.
			g.log.Info("empty classic group becomes a consumer group")
			g.cg = newConsumerGroup()
			g.cgDirty = true
		default:
			// A classic group with members: online upgrade (migration.go).
			if resp := g.tryUpgrade(hr); resp != nil {
				return resp
			}
		}
	}
	cg := g.cg
	defer func() {
		if g.cgDirty {
			g.persistConsumer("heartbeat")
			g.publish()
		}
	}()
	if hr.epoch == leaveEpoch || hr.epoch == leaveStaticEpoch {
		return g.consumerLeave(hr)
	}
	topics := g.c.topicSnapshot()
	m, code, msg := g.consumerMemberFor(hr)
	if code != codec.CodeNone {
		return cghResp(hr.version, code, msg)
	}
	if m != nil && m.classic != nil {
		// Apache throwIfMemberDoesNotUseConsumerProtocol: a classic member on the consumer path.
		return cghResp(hr.version, codec.CodeUnknownMemberID, "Member "+m.id+" uses the classic protocol.")
	}
	isNew := m == nil
	if isNew {
		if len(cg.members) >= g.c.cfg.Consumer.MaxSize {
			mConsumerMaxSize.Inc()
			return cghResp(hr.version, codec.CodeGroupMaxSizeReached,
				"The consumer group has reached its maximum capacity of "+strconv.Itoa(g.c.cfg.Consumer.MaxSize)+" members.")
		}
		cg.nextSeq++
		m = &consumerMember{id: hr.memberID, instanceID: hr.instanceID, seq: cg.nextSeq,
			reconcileState: reconcileState{assigned: assignment{}}}
		cg.members[m.id] = m
		if m.instanceID != "" {
			cg.static[m.instanceID] = m.id
		}
		g.cgDirty = true
		g.log.Info("member joined the consumer group", zap.String("member", m.id), zap.String("instance", m.instanceID))
	} else if hr.epoch != 0 {
		if code := m.checkEpoch(hr); code != codec.CodeNone {
			g.log.Info("fenced member epoch", zap.String("member", m.id), zap.Int32("received", hr.epoch),
				zap.Int32("current", m.epoch))
			return cghResp(hr.version, code, "The consumer group member has a smaller or larger member epoch ("+
				strconv.Itoa(int(hr.epoch))+") than the one known by the group coordinator ("+strconv.Itoa(int(m.epoch))+").")
		}
	}
	changed := isNew
	if hr.rebalanceTimeout != -1 {
		if d := time.Duration(hr.rebalanceTimeout) * time.Millisecond; d != m.rebalanceTimeout {
			m.rebalanceTimeout, g.cgDirty = d, true
		}
	}
	if hr.rackID != nil && *hr.rackID != m.rackID {
		m.rackID, g.cgDirty = *hr.rackID, true
	}
	if m.clientID != hr.clientID || m.clientHost != hr.clientHost {
		m.clientID, m.clientHost, g.cgDirty = hr.clientID, hr.clientHost, true
	}
	m.canDescribe = hr.canDescribe
	if hr.names != nil && !equalStrings(hr.names, m.topicNames) {
		m.topicNames, changed = hr.names, true
	}
	if hr.regex != nil && *hr.regex != m.regex {
		m.regex, m.re, changed = *hr.regex, nil, true
		if m.regex != "" {
			m.re = regexp.MustCompile(m.regex) // validated before
		}
	}
	if hr.assignor != nil && *hr.assignor != m.serverAssignor {
		m.serverAssignor, changed = *hr.assignor, true
	}
	// Subscriptions are resolved again only when they or the topics changed: a regex is matched
	// against every topic, which is too much work for every heartbeat of every member.
	if changed || topics.print != cg.topicsPrint {
		cg.topicsPrint = topics.print
		if sub := cg.resolveSubscriptions(topics); changed || !equalMeta(sub, cg.subscribed) {
			cg.subscribed = sub
			g.bumpConsumerEpoch(topics, "member "+m.id+" joined or changed its subscription, or subscribed topics changed")
		}
	}
	before := m.assigned
	owned := hr.owned
	if !hr.ownedSet {
		owned = nil
	}
	if hr.epoch == 0 {
		owned = assignment{} // a (re)joining member holds nothing (Topics must be empty)
	}
	g.reconcileMember(m, owned)
	g.armSession(m)
	resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	resp.Version = hr.version
	id := m.id
	resp.MemberID = &id
	resp.MemberEpoch = m.epoch
	resp.HeartbeatIntervalMillis = int32(g.c.cfg.Consumer.HeartbeatInterval.Milliseconds())
	if hr.epoch == 0 || !before.equal(m.assigned) || hr.full() {
		a := kmsg.NewConsumerGroupHeartbeatResponseAssignment()
		for _, t := range sortedTopics(partitionCounts(m.assigned)) {
			rt := kmsg.NewConsumerGroupHeartbeatResponseAssignmentTopic()
			rt.TopicID = t
			rt.Partitions = append([]int32(nil), m.assigned[t]...)
			a.Topics = append(a.Topics, rt)
		}
		resp.Assignment = &a
	}
	return resp
}

func partitionCounts(a assignment) map[topicID]int32 {
	out := make(map[topicID]int32, len(a))
	for t, ps := range a {
		out[t] = int32(len(ps))
	}
	return out
}

// consumerMemberFor finds the heartbeat's member (nil: a new one), replacing a static member that
// left temporarily, or says why the heartbeat is refused.
func (g *group) consumerMemberFor(hr *cgHeartbeat) (*consumerMember, int16, string) {
	cg := g.cg
	if hr.instanceID == "" {
		m := cg.members[hr.memberID]
		if m == nil && hr.epoch != 0 {
			return nil, codec.CodeUnknownMemberID, "Member " + hr.memberID + " is not a member of group " + g.id + "."
		}
		return m, codec.CodeNone, ""
	}
	cur, ok := cg.static[hr.instanceID]
	if hr.epoch != 0 {
		switch {
		case !ok:
			return nil, codec.CodeUnknownMemberID, "Instance id " + hr.instanceID + " is unknown."
		case cur != hr.memberID:
			return nil, codec.CodeFencedInstanceID, "Static member " + hr.memberID + " with instance id " + hr.instanceID + " was fenced by member " + cur + "."
		}
		return cg.members[cur], codec.CodeNone, ""
	}
	if !ok {
		if cg.members[hr.memberID] != nil {
			return nil, codec.CodeInvalidRequest, "Member " + hr.memberID + " is a dynamic member; it cannot rejoin as a static one."
		}
		return nil, codec.CodeNone, ""
	}
	old := cg.members[cur]
	if cur == hr.memberID {
		return old, codec.CodeNone, ""
	}
	if old.epoch != leaveStaticEpoch {
		return nil, codec.CodeUnreleasedInstanceID, "Static member " + cur + " with instance id " + hr.instanceID + " is not released yet."
	}
	return g.replaceStatic(old, hr.memberID), codec.CodeNone, ""
}

// replaceStatic gives a static member that left temporarily (epoch -2) a new member id, keeping
// its subscriptions, assignment and target: a restarted static consumer gets its partitions back
// with no rebalance (KIP-345 carried into KIP-848).
func (g *group) replaceStatic(old *consumerMember, newID string) *consumerMember {
	cg := g.cg
	g.stop(&old.session)
	g.stop(&old.revoke)
	m := &consumerMember{
		id: newID, instanceID: old.instanceID, rackID: old.rackID, rebalanceTimeout: old.rebalanceTimeout,
		topicNames: old.topicNames, regex: old.regex, re: old.re, serverAssignor: old.serverAssignor,
		reconcileState: old.reconcileState, prevEpoch: old.prevEpoch, seq: old.seq,
	}
	m.epoch = old.prevEpoch // the epoch it held before leaving
	delete(cg.members, old.id)
	cg.members[newID] = m
	cg.static[m.instanceID] = newID
	if t, ok := cg.target[old.id]; ok {
		delete(cg.target, old.id)
		cg.target[newID] = t
	}
	for tp, h := range cg.holder {
		if h == old.id {
			cg.holder[tp] = newID
		}
	}
	g.cgDirty = true
	g.log.Info("static member rejoined with a new member id", zap.String("instance", m.instanceID),
		zap.String("old", old.id), zap.String("new", newID))
	return m
}

// checkEpoch is Apache throwIfMemberEpochIsInvalid.
func (m *consumerMember) checkEpoch(hr *cgHeartbeat) int16 {
	if hr.epoch > m.epoch {
		return codec.CodeFencedMemberEpoch
	}
	if hr.epoch < m.epoch {
		// The previous epoch with a subset of the current assignment: the member did not get
		// the response that moved it on.
		if hr.epoch != m.prevEpoch || !hr.ownedSet || hr.owned.minus(m.assigned).size() > 0 {
			return codec.CodeFencedMemberEpoch
		}
	}
	return codec.CodeNone
}

// reconcileMember moves m one step towards its target and keeps the partition holders and the
// revocation timer in line.
func (g *group) reconcileMember(m *consumerMember, owned assignment) {
	cg := g.cg
	target := cg.target[m.id]
	if target == nil {
		target = assignment{}
	}
	next := reconcile(m.reconcileState, cg.assignmentEpoch, target, owned, func(t topicID, p int32) bool {
		h, ok := cg.holder[topicPart{t, p}]
		return ok && h != m.id
	})
	if next.epoch != m.epoch {
		m.prevEpoch = m.epoch
	}
	wasRevoking := m.state == memberUnrevokedPartitions
	if next.state != m.state || next.epoch != m.epoch || !next.assigned.equal(m.assigned) || !next.revoking.equal(m.revoking) {
		g.cgDirty = true
	}
	cg.setHolding(m, next)
	switch {
	case m.state == memberUnrevokedPartitions && !wasRevoking:
		g.armRevocation(m)
	case m.state != memberUnrevokedPartitions:
		g.stop(&m.revoke)
	}
}

// armRevocation gives m its rebalance timeout to revoke; a member that does not is fenced, so a
// stuck member cannot keep partitions from their new owner forever.
func (g *group) armRevocation(m *consumerMember) {
	cg := g.cg
	d := m.rebalanceTimeout
	g.arm(&m.revoke, d, func() {
		if cg != g.cg || cg.members[m.id] != m || m.state != memberUnrevokedPartitions {
			return
		}
		g.log.Info("member did not revoke its partitions within the rebalance timeout; fencing it",
			zap.String("member", m.id), zap.Duration("timeout", d))
		mConsumerFenced.Inc()
		g.removeConsumerMember(m, "rebalance timeout of member "+m.id+" expired")
		g.persistConsumer("member fenced")
		g.publish()
	})
}

// setHolding records m's new state and which partitions it holds.
func (cg *consumerGroup) setHolding(m *consumerMember, next reconcileState) {
	for _, a := range []assignment{m.assigned, m.revoking} {
		for t, ps := range a {
			for _, p := range ps {
				if cg.holder[topicPart{t, p}] == m.id {
					delete(cg.holder, topicPart{t, p})
				}
			}
		}
	}
	if next.assigned == nil {
		next.assigned = assignment{}
	}
	m.reconcileState = next
	for _, a := range []assignment{m.assigned, m.revoking} {
		for t, ps := range a {
			for _, p := range ps {
				cg.holder[topicPart{t, p}] = m.id
			}
		}
	}
}

// armSession restarts m's session (group.consumer.session.timeout.ms).
func (g *group) armSession(m *consumerMember) {
	cg := g.cg
	d := g.c.cfg.Consumer.SessionTimeout
	if m.classic != nil {
		d = m.classic.sessionTimeout // a classic member's own, from its JoinGroup
	}
	g.arm(&m.session, d, func() {
		if cg != g.cg || cg.members[m.id] != m {
			return
		}
		g.log.Info("consumer group member session expired", zap.String("member", m.id), zap.Duration("timeout", d))
		mMembersExpired.Inc()
		g.removeConsumerMember(m, "session of member "+m.id+" expired")
		g.persistConsumer("member session expired")
		g.publish()
	})
}

// consumerLeave serves MemberEpoch -1 (leave) and -2 (a static member's temporary leave; a
// dynamic member sending -2 leaves for good).
func (g *group) consumerLeave(hr *cgHeartbeat) *kmsg.ConsumerGroupHeartbeatResponse {
	cg := g.cg
	var m *consumerMember
	if hr.instanceID != "" {
		cur, ok := cg.static[hr.instanceID]
		switch {
		case !ok:
			return cghResp(hr.version, codec.CodeUnknownMemberID, "Instance id "+hr.instanceID+" is unknown.")
		case cur != hr.memberID:
			return cghResp(hr.version, codec.CodeFencedInstanceID, "Static member "+hr.memberID+" with instance id "+hr.instanceID+" was fenced by member "+cur+".")
		}
		m = cg.members[cur]
	} else if m = cg.members[hr.memberID]; m == nil {
		return cghResp(hr.version, codec.CodeUnknownMemberID, "Member "+hr.memberID+" is not a member of group "+g.id+".")
	}
	resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	resp.Version = hr.version
	id := m.id
	resp.MemberID = &id
	resp.MemberEpoch = hr.epoch
	if hr.epoch == leaveStaticEpoch && m.instanceID != "" {
		// The member keeps its place and its partitions until its session expires, so the
		// same instance restarting within the session gets them back without a rebalance.
		if m.epoch != leaveStaticEpoch {
			m.prevEpoch = m.epoch
			m.epoch = leaveStaticEpoch
			g.cgDirty = true
		}
		g.stop(&m.revoke)
		g.log.Info("static member left temporarily", zap.String("member", m.id), zap.String("instance", m.instanceID))
		return resp
	}
	g.log.Info("member left the consumer group", zap.String("member", m.id))
	g.removeConsumerMember(m, "member "+m.id+" left")
	return resp
}

// removeConsumerMember drops m (leave, session expiry, fencing); its partitions become free for
// their new owners, and the group epoch moves so the target is recomputed without it.
func (g *group) removeConsumerMember(m *consumerMember, reason string) {
	cg := g.cg
	g.stop(&m.session)
	g.stop(&m.revoke)
	if m.classic != nil {
		g.stop(&m.classic.joinTimer)
		g.stop(&m.classic.syncTimer)
	}
	if g.maybeDowngrade(m) {
		return
	}
	cg.setHolding(m, reconcileState{})
	delete(cg.members, m.id)
	delete(cg.target, m.id)
	if m.instanceID != "" && cg.static[m.instanceID] == m.id {
		delete(cg.static, m.instanceID)
	}
	g.cgDirty = true
	topics := g.c.topicSnapshot()
	cg.subscribed = cg.resolveSubscriptions(topics)
	g.bumpConsumerEpoch(topics, reason)
}

// bumpConsumerEpoch moves the group epoch and computes the target assignment at it.
func (g *group) bumpConsumerEpoch(topics *topicSnapshot, reason string) {
	cg := g.cg
	cg.epoch++
	g.cgDirty = true
	mConsumerEpochBumps.Inc()
	name := g.preferredAssignor()
	as := assignorByName(name)
	members := make([]assignMember, 0, len(cg.members))
	partitions := make(map[topicID]int32)
	for _, m := range cg.members {
		am := assignMember{id: m.id, instanceID: m.instanceID, topics: make(map[topicID]bool), current: cg.target[m.id]}
		for _, name := range m.subscribedTopics(topics) {
			t := topics.byName[name]
			am.topics[t.ID] = true
			partitions[t.ID] = t.Partitions
		}
		members = append(members, am)
	}
	cg.target = as.assign(members, partitions)
	cg.assignmentEpoch = cg.epoch
	cg.assignor = name
	g.log.Info("consumer group epoch bumped; target assignment computed", zap.Int32("epoch", cg.epoch),
		zap.String("assignor", name), zap.Int("members", len(cg.members)), zap.String("reason", reason))
}

// preferredAssignor is Apache's: the server assignor most members ask for (ties to the one
// configured first), else the first configured.
func (g *group) preferredAssignor() string {
	votes := make(map[string]int)
	for _, m := range g.cg.members {
		if m.serverAssignor != "" {
			votes[m.serverAssignor]++
		}
	}
	best := g.c.cfg.Consumer.Assignors[0]
	for _, a := range g.c.cfg.Consumer.Assignors {
		if votes[a] > votes[best] {
			best = a
		}
	}
	return best
}

// subscribedTopics lists the existing topics m subscribes to, by name or regex (RE2, matched
// against the whole name as Apache's Pattern.matches; only topics the member may DESCRIBE, as of
// its last heartbeat; a restored member matches every topic until it heartbeats).
func (m *consumerMember) subscribedTopics(topics *topicSnapshot) []string {
	var out []string
	for _, n := range m.topicNames {
		if _, ok := topics.byName[n]; ok {
			out = append(out, n)
		}
	}
	if m.re != nil {
		for _, t := range topics.list {
			if loc := m.re.FindStringIndex(t.Name); loc != nil && loc[0] == 0 && loc[1] == len(t.Name) &&
				(m.canDescribe == nil || m.canDescribe(t.Name)) {
				out = append(out, t.Name)
			}
		}
	}
	sort.Strings(out)
	return dedupSorted(out)
}

// resolveSubscriptions is the metadata of every topic some member subscribes to; a change of it
// (a topic created that a regex matches, partitions added) moves the group epoch.
func (cg *consumerGroup) resolveSubscriptions(topics *topicSnapshot) map[string]topicMeta {
	out := make(map[string]topicMeta)
	for _, m := range cg.members {
		for _, n := range m.subscribedTopics(topics) {
			t := topics.byName[n]
			out[n] = topicMeta{id: t.ID, partitions: t.Partitions}
		}
	}
	return out
}

func equalMeta(a, b map[string]topicMeta) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// topicSnapshot is the topics at one moment, by name and by id, with a fingerprint of the list
// (FNV-1a over every name, id and partition count) that changes whenever any of them does.
type topicSnapshot struct {
	list   []TopicInfo
	byName map[string]TopicInfo
	byID   map[topicID]string
	print  uint64
}

func (c *Coordinator) topicSnapshot() *topicSnapshot {
	s := &topicSnapshot{byName: make(map[string]TopicInfo), byID: make(map[topicID]string)}
	if c.cfg.Topics != nil {
		s.list = c.cfg.Topics()
	}
	h := uint64(14695981039346656037)
	mix := func(b byte) { h = (h ^ uint64(b)) * 1099511628211 }
	for _, t := range s.list {
		s.byName[t.Name] = t
		s.byID[t.ID] = t.Name
		for i := 0; i < len(t.Name); i++ {
			mix(t.Name[i])
		}
		mix(0)
		for _, b := range t.ID {
			mix(b)
		}
		for k := 0; k < 32; k += 8 {
			mix(byte(t.Partitions >> k))
		}
	}
	s.print = h
	return s
}

// unloadConsumer stops every member timer (coordinator shutdown or shard release).
func (cg *consumerGroup) unload(g *group) {
	for _, m := range cg.members {
		g.stop(&m.session)
		g.stop(&m.revoke)
		if m.classic != nil {
			g.stop(&m.classic.joinTimer)
			g.stop(&m.classic.syncTimer)
		}
	}
}

// memberEpochs is the published member id → epoch map OffsetFetch validates against.
func (cg *consumerGroup) memberEpochs() map[string]int32 {
	out := make(map[string]int32, len(cg.members))
	for id, m := range cg.members {
		out[id] = m.epoch
	}
	return out
}

// validateCommit is Apache ConsumerGroup.validateOffsetCommit: a commit with a negative epoch is
// a simple (admin or manual-assignment) commit, allowed only while the group has no members;
// otherwise the member must exist, use OffsetCommit v9+ outside a transaction, and commit at its
// current epoch (STALE_MEMBER_EPOCH otherwise).
func (cg *consumerGroup) validateCommit(memberID string, epoch int32, transactional bool, version int16) int16 {
	if epoch < 0 && len(cg.members) == 0 {
		return codec.CodeNone
	}
	m := cg.members[memberID]
	if m == nil {
		return codec.CodeUnknownMemberID
	}
	if m.classic != nil {
		// A classic member commits at generation = its member epoch, with any version.
		if epoch != m.epoch {
			return codec.CodeIllegalGeneration
		}
		return codec.CodeNone
	}
	if !transactional && version < 9 {
		return codec.CodeUnsupportedVersion
	}
	if epoch != m.epoch {
		return codec.CodeStaleMemberEpoch
	}
	return codec.CodeNone
}

// ValidateOffsetFetch is Apache ConsumerGroup.validateOffsetFetch for OffsetFetch v9+: a request
// with a member id (or a member epoch >= 0) for a consumer group must name a current member at
// its current epoch (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH). Classic groups, and requests without
// member (admin tools), are not checked. It reads the epochs the group last published.
func (c *Coordinator) ValidateOffsetFetch(groupID string, memberID *string, memberEpoch int32) int16 {
	if memberID == nil && memberEpoch < 0 {
		return codec.CodeNone
	}
	c.mu.Lock()
	g := c.groups[groupID]
	c.mu.Unlock()
	if g == nil {
		return codec.CodeNone
	}
	p := g.pub.Load()
	if p.epochs == nil {
		return codec.CodeNone
	}
	e, ok := p.epochs[derefOr(memberID)]
	if !ok {
		return codec.CodeUnknownMemberID
	}
	if e != memberEpoch {
		return codec.CodeStaleMemberEpoch
	}
	return codec.CodeNone
}

// DescribeConsumerGroup serves ConsumerGroupDescribe for one group: GROUP_ID_NOT_FOUND for a
// group that does not exist or is not a consumer group.
func (c *Coordinator) DescribeConsumerGroup(groupID string, done func(kmsg.ConsumerGroupDescribeResponseGroup)) {
	fail := func(code int16, msg string) {
		d := kmsg.NewConsumerGroupDescribeResponseGroup()
		d.Group = groupID
		d.ErrorCode = code
		if msg != "" {
			d.ErrorMessage = &msg
		}
		done(d)
	}
	if idsTooLong(groupID) {
		fail(codec.CodeInvalidRequest, "")
		return
	}
	g, code := c.lookup(groupID, false)
	if code != codec.CodeNone {
		fail(code, "")
		return
	}
	if g == nil {
		fail(codec.CodeGroupIDNotFound, "Group "+groupID+" not found.")
		return
	}
	if !g.tryDo(func() {
		switch {
		case g.unloaded:
			fail(codec.CodeNotCoordinator, "")
		case g.state == Dead:
			fail(codec.CodeGroupIDNotFound, "Group "+groupID+" not found.")
		case g.cg == nil:
			fail(codec.CodeGroupIDNotFound, "Group "+groupID+" is not a consumer group.")
		default:
			done(g.describeConsumer())
		}
	}) {
		fail(codec.CodeCoordinatorNotAvailable, "")
	}
}

func (g *group) describeConsumer() kmsg.ConsumerGroupDescribeResponseGroup {
	cg := g.cg
	topics := g.c.topicSnapshot()
	d := kmsg.NewConsumerGroupDescribeResponseGroup()
	d.Group = g.id
	d.State = cg.state()
	d.Epoch = cg.epoch
	d.AssignmentEpoch = cg.assignmentEpoch
	d.AssignorName = cg.assignor
	if d.AssignorName == "" {
		d.AssignorName = g.preferredAssignor()
	}
	toAssignment := func(a assignment) kmsg.Assignment {
		out := kmsg.NewAssignment()
		for _, t := range sortedTopics(partitionCounts(a)) {
			tp := kmsg.NewAssignmentTopicPartition()
			tp.TopicID = t
			tp.Topic = topics.byID[t]
			tp.Partitions = append([]int32(nil), a[t]...)
			out.TopicPartitions = append(out.TopicPartitions, tp)
		}
		return out
	}
	for _, m := range cg.sortedMembers() {
		dm := kmsg.NewConsumerGroupDescribeResponseGroupMember()
		dm.MemberID = m.id
		if m.instanceID != "" {
			inst := m.instanceID
			dm.InstanceID = &inst
		}
		if m.rackID != "" {
			rack := m.rackID
			dm.RackID = &rack
		}
		dm.MemberEpoch = m.epoch
		dm.ClientID = m.clientID
		dm.ClientHost = m.clientHost
		dm.SubscribedTopics = append([]string{}, m.topicNames...)
		if m.regex != "" {
			re := m.regex
			dm.SubscribedTopicRegex = &re
		}
		dm.Assignment = toAssignment(m.assigned)
		dm.TargetAssignment = toAssignment(cg.target[m.id])
		dm.MemberType = 1 // consumer protocol
		if m.classic != nil {
			dm.MemberType = 0 // classic protocol (KIP-1099: ConsumerGroupDescribe v1 flags it)
		}
		d.Members = append(d.Members, dm)
	}
	return d
}

// consumerAdminLeave is LeaveGroup (v3+, kafka-consumer-groups --delete-members or Admin
// removeMembersFromConsumerGroup) on a consumer group: the member, named by instance id or member
// id, is removed as if it had left.
func (g *group) consumerAdminLeave(memberID, instanceID, reason string) int16 {
	cg := g.cg
	var m *consumerMember
	if instanceID != "" {
		cur, ok := cg.static[instanceID]
		if !ok {
			return codec.CodeUnknownMemberID
		}
		if memberID != "" && cur != memberID {
			return codec.CodeFencedInstanceID
		}
		m = cg.members[cur]
	} else if m = cg.members[memberID]; m == nil {
		return codec.CodeUnknownMemberID
	}
	g.log.Info("member removed from the consumer group by LeaveGroup", zap.String("member", m.id), zap.String("reason", reason))
	g.removeConsumerMember(m, "member "+m.id+" removed by LeaveGroup")
	g.persistConsumer("member removed by LeaveGroup")
	g.publish()
	return codec.CodeNone
}
