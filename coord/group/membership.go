package group

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
)

// joinReq is a JoinGroup copied out of the request frame (metadata bytes are owned copies).
type joinReq struct {
	version          int16
	memberID         string
	instanceID       string
	clientID         string
	clientHost       string
	rebalanceTimeout time.Duration
	sessionTimeout   time.Duration
	protocolType     string
	protocols        []protocol
	reason           string
	reply            func(*kmsg.JoinGroupResponse)
}

type syncReq struct {
	version int16
	reply   func(*kmsg.SyncGroupResponse)
}

func (g *group) joinError(jr *joinReq, memberID string, code int16) *kmsg.JoinGroupResponse {
	return joinErrorResp(jr.version, memberID, code)
}

func joinErrorResp(version int16, memberID string, code int16) *kmsg.JoinGroupResponse {
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.Version = version
	resp.ErrorCode = code
	resp.MemberID = memberID
	resp.Generation = -1
	return resp
}

// joinOK answers a join with the current generation; the leader (withMembers) gets every
// member's metadata for the selected protocol.
func (g *group) joinOK(jr *joinReq, memberID string, withMembers, skipAssignment bool) *kmsg.JoinGroupResponse {
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.Version = jr.version
	resp.MemberID = memberID
	resp.Generation = g.generation
	pt, proto := g.protocolType, g.protocol
	resp.ProtocolType = &pt
	resp.Protocol = &proto
	resp.LeaderID = g.leader
	resp.SkipAssignment = skipAssignment
	if withMembers {
		for _, m := range g.sortedMembers() {
			rm := kmsg.NewJoinGroupResponseMember()
			rm.MemberID = m.id
			if m.static() {
				inst := m.instanceID
				rm.InstanceID = &inst
			}
			rm.ProtocolMetadata = m.metadataFor(g.protocol)
			resp.Members = append(resp.Members, rm)
		}
	}
	return resp
}

func syncError(sr *syncReq, code int16) *kmsg.SyncGroupResponse {
	resp := kmsg.NewPtrSyncGroupResponse()
	resp.Version = sr.version
	resp.ErrorCode = code
	return resp
}

func (g *group) syncOK(sr *syncReq, assignment []byte) *kmsg.SyncGroupResponse {
	resp := kmsg.NewPtrSyncGroupResponse()
	resp.Version = sr.version
	pt, proto := g.protocolType, g.protocol
	resp.ProtocolType = &pt
	resp.Protocol = &proto
	if assignment == nil {
		assignment = []byte{}
	}
	resp.MemberAssignment = assignment
	return resp
}

// JoinGroup serves JoinGroup v0+. clientHost is reported by DescribeGroups. reply is called
// exactly once, possibly much later (after the rebalance) and from another goroutine. req is not
// used after reply is called, and nothing from it is kept without copying.
func (c *Coordinator) JoinGroup(req *kmsg.JoinGroupRequest, clientID, clientHost string, reply func(*kmsg.JoinGroupResponse)) {
	if req.Group == "" {
		reply(joinErrorResp(req.Version, req.MemberID, codec.CodeInvalidGroupID))
		return
	}
	if idsTooLong(req.Group, req.MemberID, derefOr(req.InstanceID)) {
		reply(joinErrorResp(req.Version, "", codec.CodeInvalidRequest))
		return
	}
	session := time.Duration(req.SessionTimeoutMillis) * time.Millisecond
	if session < c.cfg.MinSessionTimeout || session > c.cfg.MaxSessionTimeout {
		reply(joinErrorResp(req.Version, req.MemberID, codec.CodeInvalidSessionTimeout))
		return
	}
	rebalance := time.Duration(req.RebalanceTimeoutMillis) * time.Millisecond
	if req.Version == 0 {
		rebalance = session // v0 has no rebalance timeout; Apache uses the session timeout
	}
	jr := &joinReq{
		version:          req.Version,
		memberID:         req.MemberID,
		clientID:         clientID,
		clientHost:       clientHost,
		rebalanceTimeout: rebalance,
		sessionTimeout:   session,
		protocolType:     req.ProtocolType,
		protocols:        make([]protocol, 0, len(req.Protocols)),
		reply:            reply,
	}
	if req.InstanceID != nil {
		jr.instanceID = *req.InstanceID
	}
	if req.Reason != nil { // KIP-800: logged only
		jr.reason = *req.Reason
	}
	for _, p := range req.Protocols {
		jr.protocols = append(jr.protocols, protocol{name: p.Name, metadata: append([]byte{}, p.Metadata...)})
	}
	// A group is created by a join without a member id; a member id for a group we do not have
	// is UNKNOWN_MEMBER_ID (the member must rejoin from scratch).
	g, code := c.lookup(req.Group, req.MemberID == "")
	if code == codec.CodeNone && g == nil {
		code = codec.CodeUnknownMemberID
	}
	if code != codec.CodeNone {
		reply(joinErrorResp(req.Version, req.MemberID, code))
		return
	}
	if !g.tryDo(func() { g.handleJoin(jr) }) {
		reply(joinErrorResp(req.Version, req.MemberID, codec.CodeCoordinatorNotAvailable))
	}
}

func (g *group) handleJoin(jr *joinReq) {
	switch {
	case g.unloaded:
		jr.reply(g.joinError(jr, jr.memberID, codec.CodeNotCoordinator))
		return
	case g.state == Dead:
		jr.reply(g.joinError(jr, jr.memberID, codec.CodeCoordinatorNotAvailable))
		return
	}
	if g.cg != nil {
		if len(g.cg.members) > 0 {
			// A classic member of a consumer group (KIP-848 online migration, migration.go).
			g.classicJoin(jr)
			return
		}
		// An empty consumer group becomes a classic group on a JoinGroup, as Apache allows.
		g.log.Info("empty consumer group becomes a classic group")
		g.cg.unload(g)
		g.cg = nil
		g.cgDirty = true
		g.persistConsumer("converted to a classic group")
		g.publish()
	}
	if !g.acceptJoiningMember(jr.memberID) {
		if m := g.members[jr.memberID]; m != nil {
			g.removeMemberAndUpdate(m, codec.CodeGroupMaxSizeReached)
		}
		jr.reply(g.joinError(jr, "", codec.CodeGroupMaxSizeReached))
		return
	}
	if jr.memberID == "" {
		g.newMemberJoin(jr)
	} else {
		g.currentMemberJoin(jr)
	}
	if g.state == PreparingRebalance {
		g.tryCompleteJoin()
	}
}

// acceptJoiningMember enforces group.max.size (Apache acceptJoiningMember): while preparing, the
// count is of members that already rejoined, so the last to rejoin of an oversized group are the
// ones turned away.
func (g *group) acceptJoiningMember(id string) bool {
	switch g.state {
	case PreparingRebalance:
		if m := g.members[id]; m != nil && m.awaitingJoin != nil {
			return true
		}
		return g.numAwaitingJoin() < g.c.cfg.MaxSize
	case CompletingRebalance, Stable:
		return g.members[id] != nil || len(g.members) < g.c.cfg.MaxSize
	}
	return true
}

func (g *group) newMemberJoin(jr *joinReq) {
	if !g.supportsProtocols(jr.protocolType, jr.protocols) {
		jr.reply(g.joinError(jr, "", codec.CodeInconsistentGroupProtocol))
		return
	}
	if jr.instanceID != "" {
		newID := newMemberID(jr.instanceID)
		if old, ok := g.static[jr.instanceID]; ok {
			g.log.Info("static member rejoined with a new member id", zap.String("instance", jr.instanceID),
				zap.String("old", old), zap.String("new", newID), zap.Stringer("state", g.state))
			g.updateStaticMember(old, newID, jr)
			return
		}
		g.addMemberAndRebalance(jr, newID)
		return
	}
	newID := newMemberID(jr.clientID)
	if jr.version >= 4 {
		// KIP-394: hand out the id and make the client come back with it, so a client whose
		// first JoinGroup times out does not leave a phantom member behind. The id is pending
		// for a session timeout.
		t := &timer{}
		g.pending[newID] = t
		g.arm(t, jr.sessionTimeout, func() {
			g.log.Info("pending member expired", zap.String("member", newID))
			g.removePending(newID)
		})
		jr.reply(g.joinError(jr, newID, codec.CodeMemberIDRequired))
		return
	}
	g.addMemberAndRebalance(jr, newID)
}

func (g *group) currentMemberJoin(jr *joinReq) {
	if !g.supportsProtocols(jr.protocolType, jr.protocols) {
		jr.reply(g.joinError(jr, jr.memberID, codec.CodeInconsistentGroupProtocol))
		return
	}
	if _, ok := g.pending[jr.memberID]; ok {
		if jr.instanceID != "" {
			// Pending ids are only handed to dynamic members; this request is confused.
			jr.reply(g.joinError(jr, jr.memberID, codec.CodeUnknownMemberID))
			return
		}
		g.addMemberAndRebalance(jr, jr.memberID)
		return
	}
	if code := g.validateMember(jr.memberID, jr.instanceID); code != codec.CodeNone {
		jr.reply(g.joinError(jr, jr.memberID, code))
		return
	}
	m := g.members[jr.memberID]
	switch g.state {
	case PreparingRebalance:
		g.updateMemberAndRebalance(m, jr, "member joined during PreparingRebalance")
	case CompletingRebalance:
		if m.matches(jr.protocols) {
			// A retry of a join whose response was lost: answer the current generation again.
			jr.reply(g.joinOK(jr, m.id, m.id == g.leader, false))
			return
		}
		g.updateMemberAndRebalance(m, jr, "member metadata changed during CompletingRebalance")
	case Stable:
		if m.id == g.leader || !m.matches(jr.protocols) {
			// The leader rejoining forces a rebalance: that is how a consumer leader reacts to
			// topic metadata changes that do not change any member's metadata.
			g.updateMemberAndRebalance(m, jr, "leader rejoined or metadata changed")
			return
		}
		jr.reply(g.joinOK(jr, m.id, false, false))
	default:
		jr.reply(g.joinError(jr, jr.memberID, codec.CodeUnknownMemberID))
	}
}

func (g *group) addMemberAndRebalance(jr *joinReq, id string) {
	m := &member{
		id:               id,
		instanceID:       jr.instanceID,
		clientID:         jr.clientID,
		clientHost:       jr.clientHost,
		rebalanceTimeout: jr.rebalanceTimeout,
		sessionTimeout:   jr.sessionTimeout,
		protocolType:     jr.protocolType,
		protocols:        jr.protocols,
		isNew:            true,
	}
	if g.state == PreparingRebalance && g.generation == 0 {
		g.newMemberAdded = true
	}
	g.add(m, jr)
	g.scheduleHeartbeat(m, newMemberJoinTimeout)
	g.maybePrepareRebalance("new member " + id + " joined (reason: " + jr.reason + ")")
}

// updateMember records a rejoin's protocols and timeouts and parks its JoinGroup.
func (g *group) updateMember(m *member, jr *joinReq) {
	m.protocols = jr.protocols
	m.rebalanceTimeout = jr.rebalanceTimeout
	m.sessionTimeout = jr.sessionTimeout
	if old := m.awaitingJoin; old != nil {
		// A second JoinGroup while the first is parked: the first is stale (its client gave up
		// on it); answer it so its connection's responses keep flowing.
		old.reply(g.joinError(old, m.id, codec.CodeRebalanceInProgress))
	}
	m.awaitingJoin = jr
}

func (g *group) updateMemberAndRebalance(m *member, jr *joinReq, reason string) {
	g.updateMember(m, jr)
	g.maybePrepareRebalance(reason + " (reason: " + jr.reason + ")")
}

// updateStaticMember is KIP-345's static rejoin: the instance keeps its place (and assignment)
// under a new member id; the old id is fenced. A Stable group whose protocol would not change
// does not rebalance: the member just gets the current generation back and syncs.
func (g *group) updateStaticMember(oldID, newID string, jr *joinReq) {
	currentLeader := g.leader
	m := g.members[oldID]
	if m.awaitingJoin != nil {
		m.awaitingJoin.reply(g.joinError(m.awaitingJoin, oldID, codec.CodeFencedInstanceID))
		m.awaitingJoin = nil
	}
	if m.awaitingSync != nil {
		m.awaitingSync.reply(syncError(m.awaitingSync, codec.CodeFencedInstanceID))
		m.awaitingSync = nil
	}
	delete(g.members, oldID)
	m.id = newID
	g.members[newID] = m
	g.static[m.instanceID] = newID
	if g.leader == oldID {
		g.leader = newID
	}
	if _, ok := g.pendingSync[oldID]; ok {
		delete(g.pendingSync, oldID)
		g.pendingSync[newID] = struct{}{}
	}
	m.clientID, m.clientHost = jr.clientID, jr.clientHost
	g.scheduleHeartbeat(m, jr.sessionTimeout)
	g.updateMember(m, jr)
	switch g.state {
	case Stable:
		if g.selectProtocol() == g.protocol {
			// Apache answers with the old leader id so a restarted leader does not think it
			// leads and run a trivial assignment a Stable group would never broadcast; with
			// KIP-814 (v9+) the leader is told it leads but must skip the assignment.
			isLeader := g.leader == newID
			skip := isLeader && jr.version >= 9
			resp := g.joinOK(jr, newID, skip, skip)
			if jr.version < 9 {
				resp.LeaderID = currentLeader
			}
			m.awaitingJoin = nil
			// The next coordinator must know the new member id (Apache stores the group here too).
			g.persistMeta("static member replaced")
			jr.reply(resp)
			return
		}
		g.maybePrepareRebalance("static member rejoined with a different protocol")
	case CompletingRebalance:
		// The leader may already be assigning under the old id; rebalance so the new id gets
		// an assignment.
		g.prepareRebalance("static member rejoined during CompletingRebalance")
	}
}

// SyncGroup serves SyncGroup v0+. The leader's assignments are copied; nothing in them is parsed.
func (c *Coordinator) SyncGroup(req *kmsg.SyncGroupRequest, reply func(*kmsg.SyncGroupResponse)) {
	sr := &syncReq{version: req.Version, reply: reply}
	if req.Group == "" {
		reply(syncError(sr, codec.CodeInvalidGroupID))
		return
	}
	if idsTooLong(req.Group, req.MemberID, derefOr(req.InstanceID)) {
		reply(syncError(sr, codec.CodeInvalidRequest))
		return
	}
	g, code := c.lookup(req.Group, false)
	if code == codec.CodeNone && g == nil {
		code = codec.CodeUnknownMemberID
	}
	if code != codec.CodeNone {
		reply(syncError(sr, code))
		return
	}
	gen, memberID := req.Generation, req.MemberID
	var instanceID string
	if req.InstanceID != nil {
		instanceID = *req.InstanceID
	}
	protocolType, protocolName := req.ProtocolType, req.Protocol
	var assignments map[string][]byte
	if len(req.GroupAssignment) > 0 {
		assignments = make(map[string][]byte, len(req.GroupAssignment))
		for _, a := range req.GroupAssignment {
			assignments[a.MemberID] = append([]byte{}, a.MemberAssignment...)
		}
	}
	if !g.tryDo(func() {
		if g.unloaded {
			reply(syncError(sr, codec.CodeNotCoordinator))
			return
		}
		if g.state == Dead {
			reply(syncError(sr, codec.CodeCoordinatorNotAvailable))
			return
		}
		if g.cg != nil {
			reply(g.classicSync(sr, gen, memberID, instanceID, protocolType, protocolName))
			return
		}
		if code := g.validateMember(memberID, instanceID); code != codec.CodeNone {
			reply(syncError(sr, code))
			return
		}
		if gen != g.generation {
			reply(syncError(sr, codec.CodeIllegalGeneration))
			return
		}
		if (protocolType != nil && *protocolType != g.protocolType) || (protocolName != nil && *protocolName != g.protocol) {
			reply(syncError(sr, codec.CodeInconsistentGroupProtocol))
			return
		}
		m := g.members[memberID]
		switch g.state {
		case Empty:
			reply(syncError(sr, codec.CodeUnknownMemberID))
		case PreparingRebalance:
			reply(syncError(sr, codec.CodeRebalanceInProgress))
		case CompletingRebalance:
			if old := m.awaitingSync; old != nil {
				old.reply(syncError(old, codec.CodeRebalanceInProgress))
			}
			m.awaitingSync = sr
			delete(g.pendingSync, memberID)
			if memberID != g.leader || (g.assignPending && g.assignGen == g.generation) {
				return
			}
			// Members the leader left out get a real, empty assignment; ids that are not
			// members are ignored.
			for _, mm := range g.members {
				a, ok := assignments[mm.id]
				if !ok {
					a = []byte{}
				}
				mm.assignment = a
			}
			g.log.Info("assignment received from leader", zap.Int32("generation", g.generation),
				zap.Int("members", len(g.members)))
			g.storeAssignment()
		case Stable:
			delete(g.pendingSync, memberID)
			reply(g.syncOK(sr, m.assignment))
			g.scheduleHeartbeat(m, m.sessionTimeout)
		}
	}) {
		reply(syncError(sr, codec.CodeCoordinatorNotAvailable))
	}
}

// Heartbeat serves Heartbeat v0+.
func (c *Coordinator) Heartbeat(req *kmsg.HeartbeatRequest, reply func(*kmsg.HeartbeatResponse)) {
	answer := func(code int16) {
		resp := kmsg.NewPtrHeartbeatResponse()
		resp.Version = req.Version
		resp.ErrorCode = code
		reply(resp)
	}
	if req.Group == "" {
		answer(codec.CodeInvalidGroupID)
		return
	}
	if idsTooLong(req.Group, req.MemberID, derefOr(req.InstanceID)) {
		answer(codec.CodeInvalidRequest)
		return
	}
	g, code := c.lookup(req.Group, false)
	if code == codec.CodeNone && g == nil {
		code = codec.CodeUnknownMemberID
	}
	if code != codec.CodeNone {
		answer(code)
		return
	}
	gen, memberID := req.Generation, req.MemberID
	var instanceID string
	if req.InstanceID != nil {
		instanceID = *req.InstanceID
	}
	version := req.Version
	if !g.tryDo(func() {
		resp := kmsg.NewPtrHeartbeatResponse()
		resp.Version = version
		resp.ErrorCode = g.heartbeat(gen, memberID, instanceID)
		reply(resp)
	}) {
		answer(codec.CodeCoordinatorNotAvailable)
	}
}

func (g *group) heartbeat(gen int32, memberID, instanceID string) int16 {
	if g.unloaded {
		return codec.CodeNotCoordinator
	}
	if g.state == Dead {
		return codec.CodeCoordinatorNotAvailable
	}
	if g.cg != nil {
		return g.classicHeartbeat(gen, memberID, instanceID)
	}
	if code := g.validateMember(memberID, instanceID); code != codec.CodeNone {
		return code
	}
	if gen != g.generation {
		return codec.CodeIllegalGeneration
	}
	m := g.members[memberID]
	switch g.state {
	case CompletingRebalance, Stable:
		g.scheduleHeartbeat(m, m.sessionTimeout)
		return codec.CodeNone
	case PreparingRebalance:
		g.scheduleHeartbeat(m, m.sessionTimeout)
		return codec.CodeRebalanceInProgress
	}
	return codec.CodeUnknownMemberID
}

// LeaveGroup serves LeaveGroup v0+: v0-2 carry one member id, v3+ a batch of members that may be
// named by group.instance.id alone (KIP-345 admin removal). For v0-2 the single member's error is
// the top-level error.
func (c *Coordinator) LeaveGroup(req *kmsg.LeaveGroupRequest, reply func(*kmsg.LeaveGroupResponse)) {
	version := req.Version
	type leaving struct{ memberID, instanceID, reason string }
	var ls []leaving
	if version <= 2 {
		ls = []leaving{{memberID: req.MemberID}}
	} else {
		for _, m := range req.Members {
			l := leaving{memberID: m.MemberID}
			if m.InstanceID != nil {
				l.instanceID = *m.InstanceID
			}
			if m.Reason != nil {
				l.reason = *m.Reason
			}
			ls = append(ls, l)
		}
	}
	answer := func(top int16, codes []int16) {
		resp := kmsg.NewPtrLeaveGroupResponse()
		resp.Version = version
		resp.ErrorCode = top
		if version <= 2 {
			if top == codec.CodeNone && len(codes) == 1 {
				resp.ErrorCode = codes[0]
			}
		} else if top == codec.CodeNone {
			for i, l := range ls {
				rm := kmsg.NewLeaveGroupResponseMember()
				rm.MemberID = l.memberID
				if l.instanceID != "" {
					inst := l.instanceID
					rm.InstanceID = &inst
				}
				rm.ErrorCode = codes[i]
				resp.Members = append(resp.Members, rm)
			}
		}
		reply(resp)
	}
	if req.Group == "" {
		answer(codec.CodeInvalidGroupID, nil)
		return
	}
	ids := []string{req.Group, req.MemberID}
	for _, l := range ls {
		ids = append(ids, l.memberID, l.instanceID)
	}
	if idsTooLong(ids...) {
		answer(codec.CodeInvalidRequest, nil)
		return
	}
	g, code := c.lookup(req.Group, false)
	if code != codec.CodeNone {
		answer(code, nil)
		return
	}
	if g == nil {
		codes := make([]int16, len(ls))
		for i := range codes {
			codes[i] = codec.CodeUnknownMemberID
		}
		answer(codec.CodeNone, codes)
		return
	}
	if !g.tryDo(func() {
		if g.unloaded {
			answer(codec.CodeNotCoordinator, nil)
			return
		}
		if g.state == Dead {
			answer(codec.CodeCoordinatorNotAvailable, nil)
			return
		}
		codes := make([]int16, len(ls))
		for i, l := range ls {
			codes[i] = g.leave(l.memberID, l.instanceID, l.reason)
		}
		answer(codec.CodeNone, codes)
	}) {
		answer(codec.CodeCoordinatorNotAvailable, nil)
	}
}

func (g *group) leave(memberID, instanceID, reason string) int16 {
	if g.cg != nil {
		return g.consumerAdminLeave(memberID, instanceID, reason)
	}
	if memberID == "" {
		// Admin removal by instance id (KIP-345).
		cur, ok := g.static[instanceID]
		if instanceID == "" || !ok {
			return codec.CodeUnknownMemberID
		}
		memberID = cur
	} else if _, ok := g.pending[memberID]; ok {
		g.removePending(memberID)
		return codec.CodeNone
	} else if code := g.validateMember(memberID, instanceID); code != codec.CodeNone {
		return code
	}
	g.log.Info("member left the group", zap.String("member", memberID), zap.String("reason", reason))
	g.removeMemberAndUpdate(g.members[memberID], codec.CodeUnknownMemberID)
	return codec.CodeNone
}

// derefOr is *p, or "" for nil.
func derefOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
