package server

// KIP-227 incremental fetch sessions.
//
// A consumer that fetches the same partitions over and over may open a session: the broker then
// remembers the partition list (with each partition's fetch offset and limits) and the client
// only sends what changed. The broker in turn leaves out of an incremental response every
// partition that has nothing new to say.
//
// (SessionID, SessionEpoch) in the request select the behaviour, exactly as Kafka's
// FetchManager.newContext:
//
//	id  epoch   meaning                                      response SessionID
//	──  ─────   ───────────────────────────────────────────  ──────────────────
//	0   -1      sessionless full fetch                       0
//	X   -1      close session X, then sessionless full fetch 0
//	0    0      full fetch, try to open a session            new id (0 if no slot)
//	X    0      close X, full fetch, try to open a session   new id (0 if no slot)
//	X   N>0     incremental fetch on X                       X
//	            X unknown          → FETCH_SESSION_ID_NOT_FOUND (70), no partitions
//	            N != next epoch    → INVALID_FETCH_SESSION_EPOCH (71), no partitions
//	            ids vs names mixed → FETCH_SESSION_TOPIC_ID_ERROR (106) (session opened with
//	                                 v13+ used by a v<13 request or the other way round)
//
// Session life cycle:
//
//	            full fetch, epoch 0, slot free
//	  (none) ─────────────────────────────────▶ OPEN(next epoch 1)
//	                                             │  incremental, epoch == next:
//	                                             │    add/update request partitions,
//	                                             │    drop ForgottenTopics, next epoch++
//	                                             │    (MaxInt32 wraps to 1)
//	                                             ▼
//	                                           OPEN(next epoch N+1)
//	   any of: epoch -1 or 0 naming the id;      │
//	   incremental that leaves it empty;         │
//	   evicted for a newer/bigger session   ─────┴──▶ (gone)
//
// Incremental response rule (Kafka's CachedPartition.maybeUpdateResponseData): a session
// partition is sent when it has records, when its high watermark or log start offset differs
// from what was last sent, or when it has an error (an error also resets the remembered high
// watermark to -1 so the partition is sent again once the error clears). The last stable offset
// is deliberately not part of the rule (Kafka does not compare it either: the LSO only moves
// when a marker is appended, which moves the high watermark too). Partitions that returned
// records are moved to the end of the session so that, under max_bytes pressure, every
// partition gets its turn.
//
// Eviction (Kafka's FetchSessionCache.tryEvict): when the cache is full a new session may take
// the slot of the least recently used session if that one has been idle for more than
// 2 minutes; otherwise it may evict the smallest session if it is itself strictly larger. All
// our sessions come from consumers (we have no followers), so there is no privileged class.

import (
	"container/list"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// fetchSessionEvictIdle is Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS.
const fetchSessionEvictIdle = 120 * time.Second

// fetchPartKey names a session partition: by topic id for v13+ sessions, by name before.
type fetchPartKey struct {
	topicID   [16]byte
	topic     string
	partition int32
}

// cachedFetchPart is one partition of a session: the request parameters last sent by the client
// and the response values last sent by us.
type cachedFetchPart struct {
	req      fetchPartReq
	hwm      int64
	logStart int64
	elem     *list.Element
}

type fetchSession struct {
	id           int32
	usesTopicIDs bool

	mu        sync.Mutex // guards everything below
	nextEpoch int32
	parts     map[fetchPartKey]*cachedFetchPart
	order     *list.List // of *cachedFetchPart, the session's iteration order

	// guarded by the cache's mutex
	lastUsed time.Time
	size     int
	lru      *list.Element
}

type fetchSessionCache struct {
	slots int

	mu       sync.Mutex
	sessions map[int32]*fetchSession
	lru      *list.List // of *fetchSession, least recently used first
	now      func() time.Time
}

func newFetchSessionCache(slots int) *fetchSessionCache {
	return &fetchSessionCache{
		slots:    slots,
		sessions: make(map[int32]*fetchSession),
		lru:      list.New(),
		now:      time.Now,
	}
}

// fetchContextKind says how a fetch relates to sessions.
type fetchContextKind uint8

const (
	fetchSessionless  fetchContextKind = iota // full fetch, no session, SessionID 0 in the answer
	fetchFull                                 // full fetch that tries to open a session
	fetchIncremental                          // incremental fetch on an existing session
	fetchSessionError                         // top-level error, no partitions
)

// fetchContext is the session side of one fetch: which partitions to read and how to turn the
// read results into the response.
type fetchContext struct {
	kind    fetchContextKind
	errCode int16
	session *fetchSession
	topicID bool           // v13+: partitions are keyed by topic id
	parts   []fetchPartReq // what to read, in response order
}

// nextFetchEpoch is Kafka's FetchMetadata.nextEpoch: wraps from MaxInt32 to 1 (0 and -1 are
// reserved for "open" and "close").
func nextFetchEpoch(e int32) int32 {
	if e < 0 {
		return e
	}
	if e == math.MaxInt32 {
		return 1
	}
	return e + 1
}

// newContext applies the session part of a fetch request: it validates and advances the session
// and returns the partitions to read. parts and forgotten are the request's own (copied).
func (c *fetchSessionCache) newContext(version int16, sessionID, epoch int32, parts []fetchPartReq, forgotten []fetchPartKey) *fetchContext {
	usesIDs := version >= 13
	if version < 7 {
		// No sessions before v7 (KIP-227); the fields are not on the wire.
		return &fetchContext{kind: fetchSessionless, topicID: usesIDs, parts: parts}
	}
	if epoch == 0 || epoch == -1 {
		if sessionID != 0 {
			// A full fetch naming a session closes it.
			c.remove(sessionID)
		}
		kind := fetchFull
		if epoch == -1 {
			kind = fetchSessionless
		}
		return &fetchContext{kind: kind, topicID: usesIDs, parts: parts}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[sessionID]
	if s == nil {
		return &fetchContext{kind: fetchSessionError, errCode: codec.CodeFetchSessionIDNotFound}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nextEpoch != epoch {
		return &fetchContext{kind: fetchSessionError, errCode: codec.CodeInvalidFetchSessionEpoch}
	}
	if s.usesTopicIDs != usesIDs {
		return &fetchContext{kind: fetchSessionError, errCode: codec.CodeFetchSessionTopicIDError}
	}
	// Adds and updates first, then removals (Kafka's FetchSession.update order).
	for _, p := range parts {
		k := p.key(usesIDs)
		if cp := s.parts[k]; cp != nil {
			cp.req = p
			continue
		}
		// A partition new to the session has never been answered: hwm -1 makes it part of
		// this response.
		cp := &cachedFetchPart{req: p, hwm: -1, logStart: -1}
		cp.elem = s.order.PushBack(cp)
		s.parts[k] = cp
	}
	for _, k := range forgotten {
		if cp := s.parts[k]; cp != nil {
			s.order.Remove(cp.elem)
			delete(s.parts, k)
		}
	}
	if len(s.parts) == 0 {
		// Kafka closes a session that has no partitions left and serves the request
		// sessionless.
		c.removeLocked(s)
		return &fetchContext{kind: fetchSessionless, topicID: usesIDs, parts: parts}
	}
	s.nextEpoch = nextFetchEpoch(s.nextEpoch)
	c.touchLocked(s, len(s.parts))
	all := make([]fetchPartReq, 0, len(s.parts))
	for e := s.order.Front(); e != nil; e = e.Next() {
		all = append(all, e.Value.(*cachedFetchPart).req)
	}
	return &fetchContext{kind: fetchIncremental, session: s, topicID: usesIDs, parts: all}
}

// finish is called once with the final read results (parts[i] ↔ results[i], the same slice
// newContext returned). It returns the response's SessionID and which results to send.
func (fc *fetchContext) finish(c *fetchSessionCache, results []fetchPartResult) (int32, []bool) {
	keep := make([]bool, len(results))
	switch fc.kind {
	case fetchSessionError:
		return 0, keep
	case fetchSessionless:
		for i := range keep {
			keep[i] = true
		}
		return 0, keep
	case fetchFull:
		for i := range keep {
			keep[i] = true
		}
		return c.create(fc.parts, results, fc.topicID), keep
	}
	s := fc.session
	s.mu.Lock()
	defer s.mu.Unlock()
	var moved []*cachedFetchPart
	for i, p := range fc.parts {
		cp := s.parts[p.key(fc.topicID)]
		if cp == nil {
			// Forgotten by a concurrent request (a misbehaving client); still answer it.
			keep[i] = true
			continue
		}
		keep[i] = cp.update(&results[i])
		if keep[i] && results[i].size() > 0 {
			moved = append(moved, cp)
		}
	}
	for _, cp := range moved {
		s.order.MoveToBack(cp.elem)
	}
	return s.id, keep
}

// update applies Kafka's incremental inclusion rule and remembers what is being sent.
func (cp *cachedFetchPart) update(r *fetchPartResult) bool {
	must := r.size() > 0
	if cp.hwm != r.hwm {
		must = true
		cp.hwm = r.hwm
	}
	if cp.logStart != r.logStart {
		must = true
		cp.logStart = r.logStart
	}
	if r.code != codec.CodeNone {
		cp.hwm = -1
		must = true
	}
	return must
}

// create opens a session for a full fetch; 0 when no slot can be had.
func (c *fetchSessionCache) create(parts []fetchPartReq, results []fetchPartResult, usesIDs bool) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if len(c.sessions) >= c.slots && !c.evictLocked(len(parts), now) {
		return 0
	}
	s := &fetchSession{
		usesTopicIDs: usesIDs,
		nextEpoch:    nextFetchEpoch(0),
		parts:        make(map[fetchPartKey]*cachedFetchPart, len(parts)),
		order:        list.New(),
	}
	for i, p := range parts {
		k := p.key(usesIDs)
		if cp := s.parts[k]; cp != nil {
			// A duplicate in the request: the later entry wins, as in a map.
			cp.req = p
			continue
		}
		cp := &cachedFetchPart{req: p, hwm: results[i].hwm, logStart: results[i].logStart}
		if results[i].code != codec.CodeNone {
			cp.hwm = -1
		}
		cp.elem = s.order.PushBack(cp)
		s.parts[k] = cp
	}
	for {
		id := rand.Int32()
		if id > 0 && c.sessions[id] == nil {
			s.id = id
			break
		}
	}
	c.sessions[s.id] = s
	s.lastUsed = now
	s.size = len(s.parts)
	s.lru = c.lru.PushBack(s)
	return s.id
}

// evictLocked frees one slot for a session of size partitions, following Kafka: a stale session
// (idle past fetchSessionEvictIdle) goes first; otherwise the smallest session, if strictly
// smaller than the newcomer.
func (c *fetchSessionCache) evictLocked(size int, now time.Time) bool {
	front := c.lru.Front()
	if front == nil {
		return false
	}
	if oldest := front.Value.(*fetchSession); now.Sub(oldest.lastUsed) > fetchSessionEvictIdle {
		c.removeLocked(oldest)
		return true
	}
	var victim *fetchSession
	for e := front; e != nil; e = e.Next() {
		s := e.Value.(*fetchSession)
		if victim == nil || s.size < victim.size || (s.size == victim.size && s.id < victim.id) {
			victim = s
		}
	}
	if victim == nil || size <= victim.size {
		return false
	}
	c.removeLocked(victim)
	return true
}

func (c *fetchSessionCache) touchLocked(s *fetchSession, size int) {
	s.lastUsed = c.now()
	s.size = size
	c.lru.MoveToBack(s.lru)
}

func (c *fetchSessionCache) remove(id int32) {
	c.mu.Lock()
	if s := c.sessions[id]; s != nil {
		c.removeLocked(s)
	}
	c.mu.Unlock()
}

func (c *fetchSessionCache) removeLocked(s *fetchSession) {
	delete(c.sessions, s.id)
	c.lru.Remove(s.lru)
}

// len is the number of open sessions (tests, metrics).
func (c *fetchSessionCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sessions)
}
