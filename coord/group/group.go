package group

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"sort"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
	"github.com/kaas-go/kaas/storage/mailbox"
)

// State is a classic group's state (Apache GroupState).
//
//	                JoinGroup (first member)
//	┌───────┐ ───────────────────────────────▶ ┌────────────────────┐◀────────────────────────────┐
//	│ Empty │                                  │ PreparingRebalance │                             │
//	└───────┘ ◀─────────────────────────────── └────────────────────┘                             │
//	  │   ▲    join completes with no members     │ all members rejoined, or                     │
//	  │   │    (all left / expired)               │ rebalance timeout (laggards removed)         │
//	  │   │                                       ▼                                              │
//	  │   │                            ┌─────────────────────┐  join, leave, member expiry,       │
//	  │   │                            │ CompletingRebalance │  pending-sync timeout ────────────▶┤
//	  │   │                            └─────────────────────┘                                    │
//	  │   │                                       │ leader's SyncGroup (assignment stored)       │
//	  │   │                                       ▼                                              │
//	  │   │                                  ┌────────┐  leader rejoins, new member, changed     │
//	  │   │                                  │ Stable │  metadata, leave, member expiry ─────────┘
//	  │   │                                  └────────┘
//	  │   └── (Empty is also where a group that only has committed offsets lives)
//	  │ DeleteGroups
//	  ▼
//	┌──────┐  removed from the coordinator once the delete is durable; a request that raced
//	│ Dead │  with it gets COORDINATOR_NOT_AVAILABLE and retries against a fresh group.
//	└──────┘
//
// PreparingRebalance waits for every known member to rejoin (InitialDelayedJoin first when the
// group was Empty: group.initial.rebalance.delay.ms, extended while new members keep arriving, up
// to the rebalance timeout). CompletingRebalance waits for the leader's assignment.
type State int8

const (
	Empty State = iota
	PreparingRebalance
	CompletingRebalance
	Stable
	Dead
)

func (s State) String() string {
	switch s {
	case Empty:
		return "Empty"
	case PreparingRebalance:
		return "PreparingRebalance"
	case CompletingRebalance:
		return "CompletingRebalance"
	case Stable:
		return "Stable"
	case Dead:
		return "Dead"
	}
	return "Unknown"
}

// published is the part of a group's state read outside its goroutine (ListGroups,
// OffsetFetch's member-epoch check).
type published struct {
	state        State
	protocolType string
	// A KIP-848 consumer group (consumer.go): its state name and member id → member epoch;
	// epochs is nil for a classic group.
	consumerState string
	epochs        map[string]int32
}

type protocol struct {
	name     string
	metadata []byte // owned copy
}

// member is one group member. Every field is owned by the group's goroutine.
type member struct {
	id         string
	instanceID string // group.instance.id; "" for a dynamic member
	clientID   string
	clientHost string

	rebalanceTimeout time.Duration
	sessionTimeout   time.Duration
	protocolType     string
	protocols        []protocol
	assignment       []byte // owned copy; empty is a real (empty) assignment

	awaitingJoin *joinReq // parked JoinGroup, answered at join completion
	awaitingSync *syncReq // parked SyncGroup, answered when the leader's assignment lands
	isNew        bool     // has not yet completed a join (Apache MemberMetadata.isNew)

	hb  timer
	seq uint64 // join order, for deterministic iteration (leader fallback, metadata order)
}

func (m *member) static() bool { return m.instanceID != "" }

func (m *member) metadataFor(name string) []byte {
	for _, p := range m.protocols {
		if p.name == name {
			return p.metadata
		}
	}
	return nil
}

// matches reports whether protocols are exactly the member's (same names, order and metadata).
func (m *member) matches(ps []protocol) bool {
	if len(ps) != len(m.protocols) {
		return false
	}
	for i := range ps {
		if ps[i].name != m.protocols[i].name || !bytes.Equal(ps[i].metadata, m.protocols[i].metadata) {
			return false
		}
	}
	return true
}

// timer is a restartable timer whose callback runs on the group's goroutine. seq makes a
// callback that was already in flight when the timer was re-armed or stopped a no-op.
type timer struct {
	t   *time.Timer
	seq uint64
}

type group struct {
	c     *Coordinator
	id    string
	shard int // ShardFor(id)
	log   *zap.Logger

	mbox *mailbox.Queue[func()] // the group's goroutine: see do and tryDo

	pub atomic.Pointer[published]

	// Everything below is owned by the group's goroutine.
	state        State
	generation   int32
	protocolType string
	protocol     string // selected protocol of the current generation; "" when none
	leader       string
	members      map[string]*member
	static       map[string]string   // group.instance.id → member id
	pending      map[string]*timer   // KIP-394: ids handed out with MEMBER_ID_REQUIRED, not yet joined
	pendingSync  map[string]struct{} // members of this generation that have not sent SyncGroup
	subscribed   map[string]struct{} // topics of the current generation; nil = unknown
	nextSeq      uint64
	unloaded     bool

	// Persisted metadata (meta.go): the last written (or loaded) one, and the leader's
	// assignment of generation assignGen waiting for its write before it is handed out.
	written       *storage.GroupMeta
	assignPending bool
	assignGen     int32

	// Transactional offset commits (txn_offsets.go).
	txnEpoch  map[int64]int16     // producer id → highest producer epoch seen staging here
	txnGuards map[int64]*txnGuard // producer id → verification guard of in-flight TxnOffsetCommits

	// cg is set while the group is a KIP-848 consumer group (consumer.go); the classic state
	// above is then Empty with no members.
	cg *consumerGroup
	// cgDirty: the consumer-group state (or its removal) is not yet written (consumer_meta.go).
	cgDirty bool

	join           timer
	initialDelay   bool // the join timer is an InitialDelayedJoin (cannot complete early)
	newMemberAdded bool
	syncTimer      timer
}

func newGroup(c *Coordinator, id string) *group {
	g := &group{
		c:           c,
		id:          id,
		shard:       ShardFor(id),
		log:         c.log.With(zap.String("group", id)),
		members:     make(map[string]*member),
		static:      make(map[string]string),
		pending:     make(map[string]*timer),
		pendingSync: make(map[string]struct{}),
	}
	g.mbox = mailbox.New(groupQueueConfig, runGroupFn)
	g.publish()
	return g
}

var groupQueueConfig = mailbox.Config[func()]{Name: "group", MaxLen: maxGroupQueue}

func runGroupFn(fns []func()) { fns[0]() }

// do runs fn on the group's goroutine, after everything queued before it, whatever the queue's
// length: for continuations of work the group already admitted (timers, verification and store
// callbacks, unload), which must not be lost.
func (g *group) do(fn func()) { g.mbox.Push(fn) }

// tryDo is do for a new request: false when the group's queue is full (the caller answers
// COORDINATOR_NOT_AVAILABLE, see maxGroupQueue).
func (g *group) tryDo(fn func()) bool { return g.mbox.TryPush(fn) }

// arm (re)starts t; fn runs on the group's goroutine unless t is re-armed or stopped first.
func (g *group) arm(t *timer, d time.Duration, fn func()) {
	g.stop(t)
	seq := t.seq
	t.t = time.AfterFunc(d, func() {
		g.do(func() {
			if t.seq != seq || g.unloaded {
				return
			}
			t.t = nil
			fn()
		})
	})
}

func (g *group) stop(t *timer) {
	if t.t != nil {
		t.t.Stop()
		t.t = nil
	}
	t.seq++
}

func (g *group) publish() {
	p := &published{state: g.state, protocolType: g.protocolType}
	if g.cg != nil {
		p.protocolType = "consumer"
		p.consumerState = g.cg.state()
		p.epochs = g.cg.memberEpochs()
	}
	g.pub.Store(p)
}

func (g *group) transition(s State) {
	if g.state != s {
		g.log.Debug("group state change", zap.Stringer("from", g.state), zap.Stringer("to", s),
			zap.Int32("generation", g.generation))
	}
	g.state = s
	g.publish()
}

// sortedMembers returns the members in join order.
func (g *group) sortedMembers() []*member {
	out := make([]*member, 0, len(g.members))
	for _, m := range g.members {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}

func (g *group) numAwaitingJoin() int {
	n := 0
	for _, m := range g.members {
		if m.awaitingJoin != nil {
			n++
		}
	}
	return n
}

func (g *group) hasAllMembersJoined() bool {
	return len(g.members) == g.numAwaitingJoin() && len(g.pending) == 0
}

// rebalanceTimeout is the largest rebalance timeout of any member (Apache
// GroupMetadata.rebalanceTimeoutMs).
func (g *group) rebalanceTimeout() time.Duration {
	var d time.Duration
	for _, m := range g.members {
		if m.rebalanceTimeout > d {
			d = m.rebalanceTimeout
		}
	}
	return d
}

// supportsProtocols: an Empty group takes any non-empty protocol type and list; otherwise the
// type must match and at least one of the offered protocols must be supported by every member.
func (g *group) supportsProtocols(protocolType string, ps []protocol) bool {
	if g.state == Empty {
		return protocolType != "" && len(ps) > 0
	}
	if g.protocolType != protocolType {
		return false
	}
	for _, p := range ps {
		all := true
		for _, m := range g.members {
			if !m.hasProtocol(p.name) {
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

func (m *member) hasProtocol(name string) bool {
	for _, p := range m.protocols {
		if p.name == name {
			return true
		}
	}
	return false
}

// selectProtocol picks the protocol supported by every member that gets the most first-choice
// votes (each member votes for its most preferred candidate); ties go to the earliest-joined
// member's preference order, so the choice is deterministic.
func (g *group) selectProtocol() string {
	ms := g.sortedMembers()
	if len(ms) == 0 {
		return ""
	}
	var candidates []string
	for _, p := range ms[0].protocols {
		all := true
		for _, m := range ms[1:] {
			if !m.hasProtocol(p.name) {
				all = false
				break
			}
		}
		if all {
			candidates = append(candidates, p.name)
		}
	}
	if len(candidates) == 0 {
		return ""
	}
	isCand := func(n string) bool {
		for _, c := range candidates {
			if c == n {
				return true
			}
		}
		return false
	}
	votes := make(map[string]int)
	for _, m := range ms {
		for _, p := range m.protocols {
			if isCand(p.name) {
				votes[p.name]++
				break
			}
		}
	}
	best := candidates[0]
	for _, c := range candidates[1:] {
		if votes[c] > votes[best] {
			best = c
		}
	}
	return best
}

// computeSubscribed records the topics the consumer-protocol members subscribe to, for
// OffsetDelete's GROUP_SUBSCRIBED_TO_TOPIC guard. Anything unparsable leaves it unknown (nil),
// which the guard treats as "subscribed to everything" (Apache isSubscribedToTopic).
func (g *group) computeSubscribed() {
	g.subscribed = nil
	if g.protocolType != "consumer" || g.protocol == "" {
		return
	}
	topics := make(map[string]struct{})
	for _, m := range g.members {
		var md kmsg.ConsumerMemberMetadata
		if err := md.ReadFrom(m.metadataFor(g.protocol)); err != nil {
			return
		}
		for _, t := range md.Topics {
			topics[t] = struct{}{}
		}
	}
	g.subscribed = topics
}

func (g *group) isSubscribedTo(topic string) bool {
	if g.subscribed == nil {
		return true
	}
	_, ok := g.subscribed[topic]
	return ok
}

// add puts m in the group with its parked JoinGroup.
func (g *group) add(m *member, jr *joinReq) {
	if len(g.members) == 0 {
		g.protocolType = m.protocolType
		g.publish()
	}
	if g.leader == "" {
		g.leader = m.id // the first member to join leads
	}
	g.nextSeq++
	m.seq = g.nextSeq
	g.members[m.id] = m
	if m.static() {
		g.static[m.instanceID] = m.id
	}
	if t := g.pending[m.id]; t != nil {
		g.stop(t)
		delete(g.pending, m.id)
	}
	m.awaitingJoin = jr
}

// remove drops a member; a new leader is the earliest-joined remaining member. Any parked request
// of the member must have been answered by the caller.
func (g *group) remove(id string) {
	m := g.members[id]
	if m == nil {
		return
	}
	g.stop(&m.hb)
	delete(g.members, id)
	if m.static() && g.static[m.instanceID] == id {
		delete(g.static, m.instanceID)
	}
	delete(g.pendingSync, id)
	if g.leader == id {
		g.leader = ""
		if ms := g.sortedMembers(); len(ms) > 0 {
			g.leader = ms[0].id
		}
	}
}

// scheduleHeartbeat restarts the member's session (Apache completeAndScheduleNextExpiration). A
// member parked in JoinGroup or SyncGroup satisfies its heartbeat implicitly: the rebalance and
// pending-sync timeouts bound those waits, except for new members, which expire after d.
func (g *group) scheduleHeartbeat(m *member, d time.Duration) {
	g.arm(&m.hb, d, func() {
		if g.members[m.id] != m || g.state == Dead {
			return
		}
		if !m.isNew && (m.awaitingJoin != nil || m.awaitingSync != nil) {
			return
		}
		g.log.Info("member session expired", zap.String("member", m.id), zap.Duration("timeout", d))
		mMembersExpired.Inc()
		g.removeMemberAndUpdate(m, codec.CodeUnknownMemberID)
	})
}

// removeMemberAndUpdate removes m (answering its parked requests with code) and moves the group
// on: a Stable/CompletingRebalance group rebalances, a PreparingRebalance one may now complete.
func (g *group) removeMemberAndUpdate(m *member, code int16) {
	if m.awaitingJoin != nil {
		// Apache answers a parked join of a removed member UNKNOWN_MEMBER_ID with an empty id so a
		// live client rejoins from scratch.
		m.awaitingJoin.reply(g.joinError(m.awaitingJoin, "", code))
		m.awaitingJoin = nil
	}
	if m.awaitingSync != nil {
		// Apache leaves this callback dangling; answering keeps the connection's response order
		// moving.
		m.awaitingSync.reply(syncError(m.awaitingSync, code))
		m.awaitingSync = nil
	}
	g.remove(m.id)
	switch g.state {
	case Stable, CompletingRebalance:
		g.maybePrepareRebalance("member removed")
	case PreparingRebalance:
		g.tryCompleteJoin()
	}
	g.persistMeta("member removed")
}

func (g *group) removePending(id string) {
	if t := g.pending[id]; t != nil {
		g.stop(t)
		delete(g.pending, id)
		if g.state == PreparingRebalance {
			g.tryCompleteJoin()
		}
	}
}

func (g *group) maybePrepareRebalance(reason string) {
	switch g.state {
	case Stable, CompletingRebalance, Empty:
		g.prepareRebalance(reason)
	}
}

// prepareRebalance moves to PreparingRebalance: members parked in SyncGroup are told to rejoin,
// and the join phase starts (an InitialDelayedJoin when the group was Empty).
func (g *group) prepareRebalance(reason string) {
	if g.state == CompletingRebalance {
		g.resetAndPropagateAssignmentError(codec.CodeRebalanceInProgress)
	}
	g.stop(&g.syncTimer)
	mRebalances.Inc()
	g.log.Info("preparing to rebalance", zap.String("reason", reason), zap.Int32("generation", g.generation))
	wasEmpty := g.state == Empty
	g.transition(PreparingRebalance)
	if wasEmpty {
		delay := g.c.cfg.InitialRebalanceDelay
		remaining := g.rebalanceTimeout() - delay
		if remaining < 0 {
			remaining = 0
		}
		g.armInitialJoin(delay, delay, remaining)
		return
	}
	g.initialDelay = false
	g.arm(&g.join, g.rebalanceTimeout(), g.completeJoin)
	g.tryCompleteJoin()
}

// armInitialJoin is Apache's InitialDelayedJoin: it never completes early, and while new members
// keep arriving it waits again (up to the configured delay each time) until remaining runs out.
func (g *group) armInitialJoin(configured, delay, remaining time.Duration) {
	g.initialDelay = true
	g.newMemberAdded = false
	g.arm(&g.join, delay, func() {
		if g.state != PreparingRebalance {
			return
		}
		if g.newMemberAdded && remaining != 0 {
			next := configured
			if remaining < next {
				next = remaining
			}
			rem := remaining - delay
			if rem < 0 {
				rem = 0
			}
			g.armInitialJoin(configured, next, rem) // clears newMemberAdded, as Apache does
			return
		}
		g.initialDelay = false
		g.completeJoin()
	})
}

// tryCompleteJoin completes the join phase early once every member rejoined (DelayedJoin).
func (g *group) tryCompleteJoin() {
	if g.state == PreparingRebalance && !g.initialDelay && g.hasAllMembersJoined() {
		g.stop(&g.join)
		g.completeJoin()
	}
}

// completeJoin is Apache's onCompleteJoin: drop dynamic members that did not rejoin, keep or elect
// a leader among those that did, start the next generation and answer every parked JoinGroup
// (the leader gets the member list).
func (g *group) completeJoin() {
	if g.state != PreparingRebalance {
		return
	}
	g.stop(&g.join)
	g.initialDelay = false
	for _, m := range g.sortedMembers() {
		if m.awaitingJoin == nil && !m.static() {
			g.log.Info("removing member that did not rejoin", zap.String("member", m.id))
			g.removeMemberNoUpdate(m, codec.CodeUnknownMemberID)
		}
	}
	if len(g.members) > 0 && !g.electJoinedLeader() {
		// Only static members that have not rejoined are left: wait another rebalance timeout
		// for them to rejoin or for their sessions to expire.
		g.log.Warn("could not complete rebalance because no members rejoined")
		g.arm(&g.join, g.rebalanceTimeout(), g.completeJoin)
		return
	}
	g.generation++
	if len(g.members) == 0 {
		g.protocol = ""
		g.subscribed = nil
		g.transition(Empty)
		g.log.Info("group is now empty", zap.Int32("generation", g.generation))
		g.persistMeta("group is empty")
		return
	}
	g.protocol = g.selectProtocol()
	g.computeSubscribed()
	g.transition(CompletingRebalance)
	g.log.Info("rebalance complete; awaiting assignment", zap.Int32("generation", g.generation),
		zap.String("leader", g.leader), zap.String("protocol", g.protocol), zap.Int("members", len(g.members)))
	for _, m := range g.sortedMembers() {
		if jr := m.awaitingJoin; jr != nil {
			m.awaitingJoin = nil
			jr.reply(g.joinOK(jr, m.id, m.id == g.leader, false))
		}
		g.scheduleHeartbeat(m, m.sessionTimeout)
		m.isNew = false
		g.pendingSync[m.id] = struct{}{}
	}
	gen := g.generation
	g.arm(&g.syncTimer, g.rebalanceTimeout(), func() { g.expirePendingSync(gen) })
}

// removeMemberNoUpdate removes a member answering its parked requests, without moving the state.
func (g *group) removeMemberNoUpdate(m *member, code int16) {
	if m.awaitingJoin != nil {
		m.awaitingJoin.reply(g.joinError(m.awaitingJoin, "", code))
		m.awaitingJoin = nil
	}
	if m.awaitingSync != nil {
		m.awaitingSync.reply(syncError(m.awaitingSync, code))
		m.awaitingSync = nil
	}
	g.remove(m.id)
}

// electJoinedLeader keeps the leader if it rejoined, else picks the earliest-joined member that
// did; false if nobody rejoined.
func (g *group) electJoinedLeader() bool {
	if l := g.members[g.leader]; l != nil && l.awaitingJoin != nil {
		return true
	}
	for _, m := range g.sortedMembers() {
		if m.awaitingJoin != nil {
			g.log.Info("new leader elected", zap.String("old", g.leader), zap.String("new", m.id))
			g.leader = m.id
			return true
		}
	}
	return false
}

// expirePendingSync removes members that never sent SyncGroup for generation gen and rebalances.
func (g *group) expirePendingSync(gen int32) {
	if gen != g.generation {
		return
	}
	switch g.state {
	case CompletingRebalance, Stable:
		for id := range g.pendingSync {
			if m := g.members[id]; m != nil {
				g.log.Info("removing member that did not sync", zap.String("member", id))
				g.removeMemberNoUpdate(m, codec.CodeUnknownMemberID)
			}
		}
		g.pendingSync = make(map[string]struct{})
		g.prepareRebalance("pending SyncGroup expired")
		g.persistMeta("pending SyncGroup expired")
	}
}

// resetAndPropagateAssignmentError clears every assignment and answers parked SyncGroups with code.
func (g *group) resetAndPropagateAssignmentError(code int16) {
	for _, m := range g.members {
		m.assignment = nil
		if sr := m.awaitingSync; sr != nil {
			m.awaitingSync = nil
			sr.reply(syncError(sr, code))
		}
	}
}

// propagateAssignment answers every parked SyncGroup with the member's assignment and restarts its
// session (an expiry ignored while it waited would otherwise never be rescheduled).
func (g *group) propagateAssignment() {
	for _, m := range g.sortedMembers() {
		if sr := m.awaitingSync; sr != nil {
			m.awaitingSync = nil
			sr.reply(g.syncOK(sr, m.assignment))
			g.scheduleHeartbeat(m, m.sessionTimeout)
		}
	}
}

// validateMember is Apache validateCurrentMember: a static request must come from the member id
// currently mapped to its instance id (else FENCED_INSTANCE_ID), and the member must exist.
func (g *group) validateMember(memberID, instanceID string) int16 {
	if instanceID != "" {
		cur, ok := g.static[instanceID]
		if !ok {
			return codec.CodeUnknownMemberID
		}
		if cur != memberID {
			g.log.Info("fenced static member", zap.String("instance", instanceID),
				zap.String("member", memberID), zap.String("current", cur))
			return codec.CodeFencedInstanceID
		}
	}
	if g.members[memberID] == nil {
		return codec.CodeUnknownMemberID
	}
	return codec.CodeNone
}

// unload writes the group's final metadata, stops everything and answers parked requests
// NOT_COORDINATOR (coordinator shutdown or shard release).
func (g *group) unload() {
	g.persistFinal()
	g.persistConsumerFinal()
	if g.cg != nil {
		g.cg.unload(g)
	}
	g.stop(&g.join)
	g.stop(&g.syncTimer)
	for id, t := range g.pending {
		g.stop(t)
		delete(g.pending, id)
	}
	for _, m := range g.members {
		g.stop(&m.hb)
		if m.awaitingJoin != nil {
			m.awaitingJoin.reply(g.joinError(m.awaitingJoin, m.id, codec.CodeNotCoordinator))
			m.awaitingJoin = nil
		}
		if m.awaitingSync != nil {
			m.awaitingSync.reply(syncError(m.awaitingSync, codec.CodeNotCoordinator))
			m.awaitingSync = nil
		}
	}
	g.unloaded = true
}

// newMemberID is Apache's "<client.id or group.instance.id>-<uuid>".
func newMemberID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return prefix + "-" + string(s[:])
}
