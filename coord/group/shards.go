package group

// Group shards: the unit the group coordinator loads and releases at runtime.
//
// A group belongs to shard fnv1a32(group id) % NumShards, the same hash as transaction slots
// (coord/txn.SlotFor), so shard N is partition N of __consumer_offsets and moving the
// coordinatorship of a group is moving the leadership of that partition (Apache's
// GroupMetadataManager loads and unloads one __consumer_offsets partition at a time).
//
//	             LoadShard(epoch)                 rebuilt from the store
//	┌─────────┐ ─────────────────▶ ┌─────────┐ ─────────────────────────▶ ┌────────┐
//	│ unowned │                    │ loading │                            │ loaded │
//	└─────────┘ ◀──────────┐       └─────────┘                            └────────┘
//	     ▲                 │  store failed to load                            │ ReleaseShard
//	     │                 └──────────────────────────────────────┐          ▼
//	     │          every group unloaded, every admitted        ┌───────────┐
//	     └───────── store write acknowledged ◀───────────────── │ releasing │
//	                                                            └───────────┘
//
// Requests for a group answer by its shard's state: loaded serves; loading answers
// COORDINATOR_LOAD_IN_PROGRESS (14), unowned and releasing answer NOT_COORDINATOR (16), as
// Apache does while a partition of __consumer_offsets is loading or after it moved away. A client
// that gets 16 looks the coordinator up again (FindCoordinator) and rejoins; one that gets 14
// retries the same broker.
//
// What a release keeps: every committed offset and every staged transactional offset was
// acknowledged only after the GroupStore fsync'd it, and a release waits for every store write
// admitted before it began (shardInfo.inflight) before the shard leaves "releasing". Each group's
// metadata (generation, leader, members, assignments; meta.go) is written once more as the group
// unloads, and the release waits for that too. What it drops: the in-memory groups (timers,
// parked requests, answered NOT_COORDINATOR). Members keep their generation: the next
// coordinator serves it.
//
// What a load rebuilds: for every group of the shard the store holds offsets, staged offsets or
// metadata for (Apache's loadGroupsAndOffsets caches every group it reads), the group restored
// from its metadata (Stable at its generation, each member with a fresh session), or an Empty
// group when it has none. Offsets, staged transactional offsets and the highest staging producer
// epoch are read through the store on demand, so nothing else is copied. In single mode the
// GroupStore is one log for every shard, so a load has nothing to replay; in cluster mode the
// store replays the shard (ShardLoader.LoadShard) while the shard answers 14.
//
// Lock order: Coordinator.mu, then a group's mailbox lock (never the other way round: code on a
// group's goroutine takes Coordinator.mu only with no mailbox lock held).

import (
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// NumShards is the number of group shards, Apache's offsets.topic.num.partitions default (the
// store shards by the same number).
const NumShards = storage.GroupShards

// ShardFor is the shard of a group: fnv1a32(group) % NumShards.
func ShardFor(group string) int { return storage.GroupShardFor(group) }

// ShardLoader is implemented by a store that holds shards separately and must read a shard
// before its groups can be served (cluster mode, *storage.GroupStore). LoadShard returns once the
// shard's committed and staged offsets and group metadata are readable and its writes will carry
// epoch; ReleaseShard once they are durable and dropped from memory.
type ShardLoader interface {
	LoadShard(shard int, epoch int32) error
	ReleaseShard(shard int) error
}

type shardState uint8

const (
	shardUnowned shardState = iota
	shardLoading
	shardLoaded
	shardReleasing
)

func (s shardState) String() string {
	switch s {
	case shardUnowned:
		return "unowned"
	case shardLoading:
		return "loading"
	case shardLoaded:
		return "loaded"
	case shardReleasing:
		return "releasing"
	}
	return "unknown"
}

// shardInfo is one shard's state, guarded by Coordinator.mu.
type shardInfo struct {
	state    shardState
	epoch    int32 // coordinator epoch: the leader epoch of __consumer_offsets partition N
	inflight int   // store writes admitted for the shard's groups whose callbacks have not run
}

// ErrShardBusy is LoadShard's or ReleaseShard's answer while the shard is in the middle of the
// other transition; the caller retries once that finishes.
var ErrShardBusy = errors.New("group shard is being loaded or released")

// shardCodeLocked is the code for requests of shard n: NONE when served here. c.mu held.
func (c *Coordinator) shardCodeLocked(n int) int16 {
	if c.closed {
		return codec.CodeNotCoordinator
	}
	switch c.shards[n].state {
	case shardLoaded:
		return codec.CodeNone
	case shardLoading:
		return codec.CodeCoordinatorLoadInProgress
	}
	return codec.CodeNotCoordinator
}

// Serving is the per-group check the server's handlers may make before anything else: NONE when
// this broker has the group's shard loaded, COORDINATOR_LOAD_IN_PROGRESS while it loads,
// NOT_COORDINATOR otherwise. Every Coordinator method makes the same check itself.
func (c *Coordinator) Serving(group string) int16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shardCodeLocked(ShardFor(group))
}

// ShardEpoch is the coordinator epoch shard n was loaded with; false unless it is loaded.
func (c *Coordinator) ShardEpoch(n int) (int32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n < 0 || n >= NumShards || c.shards[n].state != shardLoaded {
		return 0, false
	}
	return c.shards[n].epoch, true
}

// Loading reports whether any shard is loading (ListGroups answers COORDINATOR_LOAD_IN_PROGRESS
// then, as Apache does, and still lists what it has).
func (c *Coordinator) Loading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.shards {
		if c.shards[i].state == shardLoading {
			return true
		}
	}
	return false
}

// LoadShard makes this broker the coordinator of shard n at epoch: its groups answer 14 until
// the shard is rebuilt from the store, then they are served. done is called once, from another
// goroutine, with nil when the shard is served. Loading a shard that is already loaded only
// raises its epoch (a newer epoch for the same owner); a lower epoch is refused.
func (c *Coordinator) LoadShard(n int, epoch int32, done func(error)) {
	if n < 0 || n >= NumShards {
		done(fmt.Errorf("cannot load group shard (%d): out of range [0, %d)", n, NumShards))
		return
	}
	c.mu.Lock()
	sh := &c.shards[n]
	switch {
	case c.closed:
		c.mu.Unlock()
		done(fmt.Errorf("cannot load group shard (%d): %w", n, ErrNotRunning))
		return
	case sh.state == shardLoaded && epoch >= sh.epoch:
		sh.epoch = epoch
		c.mu.Unlock()
		done(nil)
		return
	case sh.state == shardLoaded:
		cur := sh.epoch
		c.mu.Unlock()
		done(fmt.Errorf("cannot load group shard (%d, epoch %d): loaded at newer epoch %d", n, epoch, cur))
		return
	case sh.state != shardUnowned:
		st := sh.state
		c.mu.Unlock()
		done(fmt.Errorf("cannot load group shard (%d): %s: %w", n, st, ErrShardBusy))
		return
	}
	sh.state, sh.epoch = shardLoading, epoch
	c.mu.Unlock()
	go func() {
		err := c.loadShard(n, epoch)
		c.mu.Lock()
		if err != nil || c.closed {
			sh.state = shardUnowned
		} else {
			sh.state = shardLoaded
		}
		c.mu.Unlock()
		if err != nil {
			mShardLoadFailures.Inc()
			c.log.Warn("group shard load failed", zap.Int("shard", n), zap.Error(err))
			done(fmt.Errorf("cannot load group shard (%d): %w", n, err))
			return
		}
		c.log.Info("group shard loaded", zap.Int("shard", n), zap.Int32("epoch", epoch))
		done(nil)
	}()
}

// loadShard rebuilds shard n's groups from the store (restored from their metadata, else Empty).
// The shard answers 14 meanwhile, so nothing else creates its groups.
func (c *Coordinator) loadShard(n int, epoch int32) error {
	if l, ok := c.store.(ShardLoader); ok {
		if err := l.LoadShard(n, epoch); err != nil {
			return err
		}
	}
	ids := c.store.Groups()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if ShardFor(id) == n && c.groups[id] == nil {
			c.groups[id] = c.materialize(id)
		}
	}
	return nil
}

// ReleaseShard stops coordinating shard n: its groups answer NOT_COORDINATOR from now on,
// requests parked in a rebalance are answered NOT_COORDINATOR, every store write already admitted
// for the shard is acknowledged (so every success a client saw is durable), and the shard's
// in-memory groups are dropped. done is called once, from another goroutine. Releasing a shard
// that is not owned is a no-op.
func (c *Coordinator) ReleaseShard(n int, done func(error)) {
	if n < 0 || n >= NumShards {
		done(fmt.Errorf("cannot release group shard (%d): out of range [0, %d)", n, NumShards))
		return
	}
	c.mu.Lock()
	sh := &c.shards[n]
	switch sh.state {
	case shardUnowned:
		c.mu.Unlock()
		done(nil)
		return
	case shardLoading, shardReleasing:
		st := sh.state
		c.mu.Unlock()
		done(fmt.Errorf("cannot release group shard (%d): %s: %w", n, st, ErrShardBusy))
		return
	}
	sh.state = shardReleasing
	var gs []*group
	for id, g := range c.groups {
		if g.shard == n {
			gs = append(gs, g)
			delete(c.groups, id)
		}
	}
	c.mu.Unlock()
	go func() {
		c.unloadAll(gs)
		c.mu.Lock()
		for sh.inflight > 0 {
			c.drained.Wait()
		}
		c.mu.Unlock()
		var err error
		if l, ok := c.store.(ShardLoader); ok {
			err = l.ReleaseShard(n)
		}
		c.mu.Lock()
		sh.state = shardUnowned
		c.mu.Unlock()
		if err != nil {
			c.log.Warn("group shard release: store release failed", zap.Int("shard", n), zap.Error(err))
			done(fmt.Errorf("cannot release group shard (%d): %w", n, err))
			return
		}
		c.log.Info("group shard released", zap.Int("shard", n), zap.Int("groups", len(gs)))
		done(nil)
	}()
}

// unloadAll runs unload on every group's goroutine and returns once all have run.
func (c *Coordinator) unloadAll(gs []*group) {
	ch := make(chan struct{}, len(gs))
	for _, g := range gs {
		g.do(func() {
			g.unload()
			ch <- struct{}{}
		})
	}
	for range gs {
		<-ch
	}
}

// beginStore admits one store write for g: false (answer NOT_COORDINATOR) once g's shard is no
// longer served. Called on g's goroutine after its own unloaded check; endStore must follow
// exactly once, from the write's callback.
func (c *Coordinator) beginStore(g *group) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.shards[g.shard].state != shardLoaded {
		return false
	}
	c.shards[g.shard].inflight++
	return true
}

// beginFinalStore admits unload's metadata write (meta.go) whatever the shard's state: the
// release (or Close) that is unloading the group waits for it.
func (c *Coordinator) beginFinalStore(g *group) {
	c.mu.Lock()
	c.shards[g.shard].inflight++
	c.mu.Unlock()
}

func (c *Coordinator) endStore(g *group) {
	c.mu.Lock()
	sh := &c.shards[g.shard]
	sh.inflight--
	if sh.inflight == 0 {
		c.drained.Broadcast()
	}
	c.mu.Unlock()
}
