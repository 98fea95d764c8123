// Package group is the classic (pre-KIP-848) consumer-group coordinator: JoinGroup, SyncGroup,
// Heartbeat and LeaveGroup drive a per-group state machine, and committed offsets go through a
// durable Store. It follows Apache Kafka's GroupCoordinator (core/.../group/GroupCoordinator.scala)
// error for error; deviations are called out where they are made.
//
// Concurrency: every group is a mailbox (storage/mailbox, group.do) drained by at most one
// goroutine at a time, so a group's state is only ever touched by one goroutine and needs no lock;
// the goroutine exists only while the mailbox has work, so idle groups cost nothing. Handlers
// never wait: the API methods enqueue and return, and the reply callback is called later (exactly
// once) from the group's goroutine, a timer, or the store's writer goroutine. Nothing here blocks
// a caller for a rebalance.
//
// Groups are sharded like __consumer_offsets partitions and a shard can be loaded and released at
// runtime (shards.go, which also has the lock order).
package group

import (
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// Store is what the coordinator needs from durable offset storage (*storage.GroupStore). The
// async methods call done exactly once, after the change is fsync'd (nil) or failed; a failed
// change is never visible.
type Store interface {
	CommitAsync(group string, offs []storage.GroupOffset, done func(error))
	DeleteGroupAsync(group string, done func(error))
	DeleteOffsetsAsync(group string, parts []storage.GroupPartition, done func(error))
	Offset(group, topic string, partition int32) (storage.GroupOffset, bool)
	Offsets(group string) []storage.GroupOffset
	HasGroup(group string) bool
	Groups() []string
	// HasPending reports staged transactional offsets (TxnOffsetCommit) for the partition.
	HasPending(group, topic string, partition int32) bool
	// StageTxnOffsets durably stages producerID's transactional offsets; CompleteTxnOffsets
	// commits (one durable record) or discards them, idempotently. PendingEpoch is the highest
	// producer epoch of the open staging, if any.
	StageTxnOffsets(group string, producerID int64, producerEpoch int16, offs []storage.GroupOffset, done func(error))
	CompleteTxnOffsets(group string, producerID int64, commit bool, done func(error))
	PendingEpoch(group string, producerID int64) (int16, bool)
	// StoreGroupMetaAsync durably records a classic group's metadata (nil: the tombstone);
	// GroupMeta reads the durable one (meta.go).
	StoreGroupMetaAsync(group string, m *storage.GroupMeta, done func(error))
	GroupMeta(group string) (*storage.GroupMeta, bool)
	// StoreConsumerGroupAsync durably records a KIP-848 consumer group's state (nil: the
	// tombstone); ConsumerGroup reads the durable one (consumer_meta.go).
	StoreConsumerGroupAsync(group string, m *storage.ConsumerGroupMeta, done func(error))
	ConsumerGroup(group string) (*storage.ConsumerGroupMeta, bool)
}

// Config holds the group.* broker settings.
type Config struct {
	InitialRebalanceDelay time.Duration // group.initial.rebalance.delay.ms
	MinSessionTimeout     time.Duration // group.min.session.timeout.ms
	MaxSessionTimeout     time.Duration // group.max.session.timeout.ms
	MaxSize               int           // group.max.size
	// Consumer configures KIP-848 consumer groups; Topics lists the topics their subscriptions
	// resolve against (nil: none).
	Consumer ConsumerConfig
	Topics   func() []TopicInfo
	// ShardsUnowned starts the coordinator owning no group shard (cluster mode: LoadShard each
	// assigned one). The zero value is the single broker, which serves every shard from the start.
	ShardsUnowned bool
}

// maxGroupQueue bounds the requests queued on one group's mailbox. A group's requests are
// already bounded by its members' connections (max.inflight.requests.per.connection each), so
// this is only reached by a group that cannot keep up; such requests are answered
// COORDINATOR_NOT_AVAILABLE, the code Apache's coordinator answers when an operation on
// __consumer_offsets cannot be completed in time (REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS map to
// it): retriable, and it makes the client back off and look the coordinator up again rather
// than hammer it. NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS would lie about ownership.
const maxGroupQueue = 8192

// newMemberJoinTimeout bounds how long a new member's JoinGroup may wait in a rebalance before it
// is dropped (Apache GroupCoordinator.NewMemberJoinTimeoutMs): a new member has no id to heartbeat
// with, and a client that timed out would otherwise leave a defunct member behind.
const newMemberJoinTimeout = 5 * time.Minute

var (
	mRebalances     = metrics.NewCounter(`kaas_group_rebalances_total`)
	mMembersExpired = metrics.NewCounter(`kaas_group_members_expired_total`)
	mCommitFailures = metrics.NewCounter(`kaas_group_offset_commit_failures_total`)
	// mShardLoadFailures counts LoadShard calls whose store load failed (the shard stays unowned).
	mShardLoadFailures = metrics.NewCounter(`kaas_group_shard_load_failures_total`)
	// mOversizedIDs counts requests refused INVALID_REQUEST for an id longer than a Kafka string.
	mOversizedIDs = metrics.NewCounter(`kaas_group_oversized_id_requests_total`)
)

// Coordinator owns every group this broker coordinates.
type Coordinator struct {
	cfg   Config
	store Store
	log   *zap.Logger

	mu      sync.Mutex
	groups  map[string]*group
	closed  bool
	shards  [NumShards]shardInfo // shards.go
	drained *sync.Cond           // on mu: a shard's inflight store writes reached zero
}

// New builds a coordinator over store. log may be nil.
func New(cfg Config, store Store, log *zap.Logger) *Coordinator {
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.MaxSize <= 0 {
		cfg.MaxSize = int(^uint32(0) >> 1)
	}
	if cfg.Consumer.MaxSize <= 0 {
		cfg.Consumer.MaxSize = int(^uint32(0) >> 1)
	}
	if len(cfg.Consumer.Assignors) == 0 {
		cfg.Consumer.Assignors = []string{"uniform", "range"}
	}
	if cfg.Consumer.SessionTimeout <= 0 {
		cfg.Consumer.SessionTimeout = 45 * time.Second
	}
	if cfg.Consumer.HeartbeatInterval <= 0 {
		cfg.Consumer.HeartbeatInterval = 5 * time.Second
	}
	c := &Coordinator{cfg: cfg, store: store, log: log.Named("groups"), groups: make(map[string]*group)}
	c.drained = sync.NewCond(&c.mu)
	if !cfg.ShardsUnowned {
		// Committed offsets are already in the store's memory, and groups that only have
		// offsets are materialised from it on first use, so serving every shard at once costs
		// nothing. Groups with persisted metadata come back now (Stable, at their generation),
		// so their members' sessions start with the broker rather than at some later lookup.
		for i := range c.shards {
			c.shards[i].state = shardLoaded
		}
		c.mu.Lock()
		for _, id := range store.Groups() {
			_, classic := store.GroupMeta(id)
			if _, consumer := store.ConsumerGroup(id); classic || consumer {
				c.groups[id] = c.materialize(id)
			}
		}
		c.mu.Unlock()
	}
	return c
}

// Start makes the coordinator serve. Committed offsets are already loaded by the store, so groups
// that only have offsets are served (OffsetFetch, ListGroups, DescribeGroups) without any member
// rejoining; their in-memory state is created on first use.
func (c *Coordinator) Start() error { return nil }

// Close unloads every group: timers stop, requests parked in a rebalance are answered
// NOT_COORDINATOR (as Apache does when a coordinator resigns), later requests get NOT_COORDINATOR,
// and Close returns once every in-flight offset write has been acknowledged. Close the server first
// and the store after.
func (c *Coordinator) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	gs := make([]*group, 0, len(c.groups))
	for _, g := range c.groups {
		gs = append(gs, g)
	}
	c.mu.Unlock()
	c.unloadAll(gs)
	c.mu.Lock()
	for i := range c.shards {
		for c.shards[i].inflight > 0 {
			c.drained.Wait()
		}
	}
	c.mu.Unlock()
}

// lookup returns the group, materialising an Empty group for one that only has committed offsets
// (Apache loads those from __consumer_offsets), or creating one if create is set. A code other
// than NONE means the group's shard is not served here (shardCodeLocked); otherwise a nil group
// does not exist.
func (c *Coordinator) lookup(id string, create bool) (*group, int16) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if code := c.shardCodeLocked(ShardFor(id)); code != codec.CodeNone {
		return nil, code
	}
	if g := c.groups[id]; g != nil {
		return g, codec.CodeNone
	}
	if !create && !c.store.HasGroup(id) {
		return nil, codec.CodeNone
	}
	g := c.materialize(id)
	c.groups[id] = g
	return g, codec.CodeNone
}

// forget removes g from the coordinator if it is still the registered group for its id.
func (c *Coordinator) forget(g *group) {
	c.mu.Lock()
	if c.groups[g.id] == g {
		delete(c.groups, g.id)
	}
	c.mu.Unlock()
}

// ListedGroup is one ListGroups entry.
type ListedGroup struct {
	Group        string
	ProtocolType string
	State        string
	Type         string // "classic" or "consumer" (KIP-848)
}

// ListGroups lists every group of a served shard in memory plus every group that only has
// committed offsets (Apache loads those too, so they are listed as Empty), sorted by id. states
// filters by state name (case-insensitive, KIP-518); empty means all.
func (c *Coordinator) ListGroups(states []string) []ListedGroup {
	want := func(st string) bool {
		if len(states) == 0 {
			return true
		}
		for _, s := range states {
			if equalFold(s, st) {
				return true
			}
		}
		return false
	}
	seen := make(map[string]bool)
	var out []ListedGroup
	c.mu.Lock()
	var servedShard [NumShards]bool
	for i := range servedShard {
		servedShard[i] = c.shardCodeLocked(i) == codec.CodeNone
	}
	served := func(id string) bool { return servedShard[ShardFor(id)] }
	for id, g := range c.groups {
		if !served(id) {
			continue
		}
		p := g.pub.Load()
		if p.state == Dead {
			continue
		}
		seen[id] = true
		lg := ListedGroup{Group: id, ProtocolType: p.protocolType, State: p.state.String(), Type: "classic"}
		if p.epochs != nil {
			lg.State, lg.Type = p.consumerState, "consumer"
		}
		if want(lg.State) {
			out = append(out, lg)
		}
	}
	c.mu.Unlock()
	for _, id := range c.store.Groups() {
		if !seen[id] && want(Empty.String()) && served(id) {
			out = append(out, ListedGroup{Group: id, State: Empty.String(), Type: "classic"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// MaxIDBytes is the longest group id, member id or group.instance.id accepted: Apache reads these
// as Kafka strings, whose length is a signed 16-bit number (Short.MAX_VALUE). Flexible versions
// carry a varint length that can say more; such a request is answered INVALID_REQUEST (42) rather
// than stored under an id that no Apache tool could send back.
const MaxIDBytes = 32767

// idsTooLong reports (and counts) a request naming an id longer than MaxIDBytes.
func idsTooLong(ids ...string) bool {
	for _, id := range ids {
		if len(id) > MaxIDBytes {
			mOversizedIDs.Inc()
			return true
		}
	}
	return false
}

// storeErrorCode maps a failed offset write to the code Apache answers for a failed append to
// __consumer_offsets (KAFKA_STORAGE_ERROR → NOT_COORDINATOR, GroupMetadataManager.storeOffsets):
// retriable, and never a success. A write refused because the store's queue is full is
// overload, answered like a full group queue. What the store refuses by its write-time limits (a
// group id over 32767 bytes, an op over the frame limit) would fail again on retry:
// INVALID_REQUEST.
func storeErrorCode(err error) int16 {
	switch {
	case err == nil:
		return codec.CodeNone
	case errors.Is(err, storage.ErrGroupStoreBusy):
		return codec.CodeCoordinatorNotAvailable // overload, not a lost coordinatorship: see maxGroupQueue
	case errors.Is(err, storage.ErrGroupIDTooLong), errors.Is(err, storage.ErrOffsetCommitTooLarge):
		return codec.CodeInvalidRequest
	}
	return codec.CodeNotCoordinator
}
