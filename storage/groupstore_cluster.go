package storage

// Cluster mode of the committed-offset store (design: cluster.md §7 with the replay rule of §3).
//
// Several brokers share <data.dir>/__cluster/consumer_offsets/ on one volume. Each group shard
// (GroupShardFor) has one owner at a time, named by the controller with an epoch. Every file has
// one writer, and nothing is ever rewritten in place by anyone but its writer:
//
//	log-b<broker>-i<inc>-<gen, 20 digits>.log   one per broker incarnation and generation;
//	    header "KAASGOC1", then gsFormat frames whose ops are each prefixed by
//	    shard uvarint | epoch varint | seq uvarint | length uvarint (seq counts up per shard and
//	    never repeats within an epoch; the length lets a load skip other shards' ops undecoded)
//	shard-<n>-e<epoch>.ckpt                     shard n's state as its owner at epoch saw it:
//	    header "KAASGOK1", a frame (shard uvarint, epoch varint, seq uvarint, frames uvarint,
//	    broker varint, inc str), then `frames` snapshot frames (the single-mode op encoding:
//	    offsets, stagings, group metadata). Written tmp + fsync + rename + directory fsync.
//
// Shard life on one store:
//
//	             LoadShard(n, E)                                       ReleaseShard(n)
//	┌──────────┐ ──────────────▶ ┌─────────┐ ckpt-E durable ┌────────┐ ─────────────▶ ┌───────────┐
//	│ unloaded │                 │ loading │ ─────────────▶ │ loaded │                │ releasing │
//	└──────────┘ ◀────────────── └─────────┘                └────────┘                └───────────┘
//	     ▲           load failed                                                            │
//	     └────────── queued writes written, ckpt at the current epoch, shard dropped ◀─────┘
//
// LoadShard(n, E) takes the highest-epoch checkpoint E' (E' <= E), then replays, from every
// log of every incarnation (a fresh directory listing and fresh opens, so on NFS close-to-open
// shows everything a predecessor fsync'd before its lease ended or it released), the ops of shard
// n with epoch == E' and seq > the checkpoint's seq, in seq order. Ops of other epochs are
// ignored: those of older epochs are in the checkpoint already, those of a zombie written after
// its shard moved carry an epoch no checkpoint chain continues from. An epoch's ops exist only
// after its checkpoint: the load writes shard-n-eE.ckpt before the shard serves, so the next
// owner continues from it. Torn tails are where a dead writer stopped: read, never truncated.
//
// Compaction is a roll: when the current log passes compactMin and 4× what the last roll
// wrote, the writer checkpoints every shard it holds, starts generation gen+1, and deletes its
// older generations, whose every op is now covered by a checkpoint of the same epoch and a
// seq at least as high (a released shard was covered by its release checkpoint). The same roll
// replaces a log a failed write left unrepairable. Logs of other (dead) incarnations are only
// read; deleting them is left to the controller (not done here).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/storage/framelog"
	"github.com/kaas-go/kaas/storage/mailbox"
)

const (
	gsClusterHeader = "KAASGOC1"
	gsCkptHeader    = "KAASGOK1"
)

// ErrGroupShardNotLoaded: a write for a group whose shard this store does not hold (cluster
// mode). The coordinator answers such groups NOT_COORDINATOR before it gets here.
var ErrGroupShardNotLoaded = errors.New("group shard not loaded in this offset store")

// ErrGroupStorePublishFenced: the write is durable but this broker may no longer publish it
// (Rule P: its liveness lease may have run out, so a successor may already own the shard). It is
// neither acknowledged nor applied; the coordinator answers NOT_COORDINATOR.
var ErrGroupStorePublishFenced = errors.New("offset store write not published: the broker's lease deadline passed")

// ErrGroupShardFenced: LoadShard found a checkpoint of a newer epoch than the one it was given
// (the caller's assignment is stale).
var ErrGroupShardFenced = errors.New("group shard has a checkpoint of a newer epoch")

var (
	gsShardLoads      = metrics.NewCounter("kaas_group_offsets_shard_loads_total")
	gsShardReleases   = metrics.NewCounter("kaas_group_offsets_shard_releases_total")
	gsReplayedOps     = metrics.NewCounter("kaas_group_offsets_replayed_ops_total")
	gsIgnoredOps      = metrics.NewCounter("kaas_group_offsets_ignored_other_epoch_ops_total")
	gsCheckpoints     = metrics.NewCounter("kaas_group_offsets_checkpoints_total")
	gsCheckpointFails = metrics.NewCounter("kaas_group_offsets_checkpoint_errors_total")
	gsRolls           = metrics.NewCounter("kaas_group_offsets_log_rolls_total")
	gsLogsDeleted     = metrics.NewCounter("kaas_group_offsets_logs_deleted_total")
	gsUnpublished     = metrics.NewCounter("kaas_group_offsets_unpublished_batches_total") // Rule P refused
)

type gsShardState uint8

const (
	gsShardUnloaded gsShardState = iota
	gsShardLoading
	gsShardLoaded
	gsShardReleasing
)

// gsCluster is a cluster-mode store's shard bookkeeping.
type gsCluster struct {
	brokerID int32
	inc      string

	state [GroupShards]gsShardState // guarded by GroupStore.closeMu
	// epoch and seq of each held shard: set by LoadShard before the shard becomes loaded (under
	// closeMu, so before any op of it is queued), then owned by the writer goroutine.
	epoch [GroupShards]int32
	seq   [GroupShards]uint64

	// older[n]: checkpoints of shard n older than the one a load started from (loading only)
	older [GroupShards][]string

	// writer-goroutine-only
	gen     uint64
	old     []string // this incarnation's older generations not yet deleted
	keepOld bool     // a release checkpoint failed: its ops live only in the logs, keep them all
}

// SetPublish installs Rule P (cluster.md §2): after each batch is durable and before any of it
// is acknowledged or applied, publish is asked; false fails the batch's writes with
// ErrGroupStorePublishFenced. A successor that loaded the shard before the write ignores it (its
// epoch is older than the successor's checkpoint), so it must not have been acknowledged. nil
// (the default) publishes always.
func (s *GroupStore) SetPublish(publish func() bool) {
	if publish == nil {
		s.publish.Store(nil)
		return
	}
	s.publish.Store(&publish)
}

// checkPublish applies Rule P to a written batch (writer goroutine).
func (s *GroupStore) checkPublish(ops []*gsOp) {
	p := s.publish.Load()
	if p == nil || (*p)() {
		return
	}
	gsUnpublished.Inc()
	for _, op := range ops {
		if op.err == nil && op.ctl == nil {
			op.err = fmt.Errorf("cannot acknowledge offset store write (group %.64q): %w", op.group, ErrGroupStorePublishFenced)
		}
	}
}

// stamp assigns op the next seq of its shard at the shard's epoch and appends the prefix of
// an op whose encoding is n bytes long.
func (c *gsCluster) stamp(b []byte, op *gsOp, n int) []byte {
	c.seq[op.shard]++
	op.cepoch, op.seq = c.epoch[op.shard], c.seq[op.shard]
	b = binary.AppendUvarint(b, uint64(op.shard))
	b = binary.AppendVarint(b, int64(op.cepoch))
	b = binary.AppendUvarint(b, op.seq)
	return binary.AppendUvarint(b, uint64(n))
}

func gsLogName(broker int32, inc string, gen uint64) string {
	return fmt.Sprintf("log-b%d-i%s-%020d.log", broker, inc, gen)
}

// gsParseLogName parses log-b<broker>-i<inc>-<gen>.log.
func gsParseLogName(name string) (broker int32, inc string, gen uint64, ok bool) {
	rest, ok1 := strings.CutPrefix(name, "log-b")
	rest, ok2 := strings.CutSuffix(rest, ".log")
	if !ok1 || !ok2 {
		return 0, "", 0, false
	}
	b, rest, ok3 := strings.Cut(rest, "-i")
	i := strings.LastIndexByte(rest, '-')
	if !ok3 || i < 0 {
		return 0, "", 0, false
	}
	id, err1 := strconv.ParseInt(b, 10, 32)
	g, err2 := strconv.ParseUint(rest[i+1:], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, "", 0, false
	}
	return int32(id), rest[:i], g, true
}

func gsCkptName(shard int, epoch int32) string {
	return "shard-" + strconv.Itoa(shard) + "-e" + strconv.Itoa(int(epoch)) + ".ckpt"
}

// gsParseCkptName parses shard-<n>-e<epoch>.ckpt.
func gsParseCkptName(name string) (shard int, epoch int32, ok bool) {
	rest, ok1 := strings.CutPrefix(name, "shard-")
	rest, ok2 := strings.CutSuffix(rest, ".ckpt")
	n, e, ok3 := strings.Cut(rest, "-e")
	if !ok1 || !ok2 || !ok3 {
		return 0, 0, false
	}
	sn, err1 := strconv.Atoi(n)
	ep, err2 := strconv.ParseInt(e, 10, 32)
	if err1 != nil || err2 != nil || sn < 0 || sn >= GroupShards {
		return 0, 0, false
	}
	return sn, int32(ep), true
}

// OpenGroupStoreCluster opens the cluster-mode offset store of broker incarnation inc under
// dataDir/__cluster/consumer_offsets: it creates this incarnation's first log and holds no shard
// until LoadShard. log may be nil.
func OpenGroupStoreCluster(dataDir string, brokerID int32, inc string, log *zap.Logger) (*GroupStore, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if inc == "" || strings.ContainsAny(inc, "-/") {
		return nil, fmt.Errorf("cannot open offset store (broker %d): bad incarnation %q", brokerID, inc)
	}
	dir := filepath.Join(dataDir, "__cluster", gsSubdir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create offset store directory (%s): %w", dir, err)
	}
	s := &GroupStore{
		dir:        dir,
		log:        log.Named("offsets").With(zap.Int32("broker", brokerID), zap.String("inc", inc)),
		groups:     make(map[string]map[GroupPartition]GroupOffset),
		pending:    make(map[string]map[int64]*gsPending),
		meta:       make(map[string]*GroupMeta),
		cmeta:      make(map[string]*ConsumerGroupMeta),
		compactMin: gsDefaultCompactMin,
		cl:         &gsCluster{brokerID: brokerID, inc: inc},
	}
	// An incarnation is new by construction (a fresh lease); a log already carrying its name
	// would be a second process with the same lease, so never append to it.
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cannot list offset store directory (%s): %w", dir, err)
	}
	for _, e := range ents {
		if b, i, g, ok := gsParseLogName(e.Name()); ok && b == brokerID && i == inc {
			return nil, fmt.Errorf("cannot open offset store (%s): incarnation %s of broker %d already has log generation %d", dir, inc, brokerID, g)
		}
	}
	f, path, err := s.createLog(1)
	if err != nil {
		return nil, err
	}
	s.cl.gen, s.path = 1, path
	s.setFile(f, int64(len(gsClusterHeader)))
	s.base = s.size
	s.writer = mailbox.New(mailbox.Config[*gsOp]{Name: "group_offsets", MaxLen: gsMaxQueuedOps, Batch: true}, s.writeOps)
	return s, nil
}

// createLog creates generation gen of this incarnation's log with its header, durably.
func (s *GroupStore) createLog(gen uint64) (*os.File, string, error) {
	path := filepath.Join(s.dir, gsLogName(s.cl.brokerID, s.cl.inc, gen))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, "", fmt.Errorf("cannot create offset log (%s): %w", path, err)
	}
	if _, err = f.Write([]byte(gsClusterHeader)); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = SyncDir(s.dir)
	}
	if err != nil {
		f.Close()
		_ = os.Remove(path)
		return nil, "", fmt.Errorf("cannot create offset log (%s): %w", path, err)
	}
	return f, path, nil
}

// LoadShard makes shard n readable and writable at epoch (see the file comment). Single mode
// holds every shard in its one log, so there it does nothing.
func (s *GroupStore) LoadShard(n int, epoch int32) error {
	if s.cl == nil {
		return nil
	}
	if n < 0 || n >= GroupShards {
		return fmt.Errorf("cannot load group shard (%d): out of range [0, %d)", n, GroupShards)
	}
	s.closeMu.Lock()
	switch {
	case s.closed:
		s.closeMu.Unlock()
		return fmt.Errorf("cannot load group shard (%d): %w", n, ErrGroupStoreClosed)
	case s.cl.state[n] != gsShardUnloaded:
		s.closeMu.Unlock()
		return fmt.Errorf("cannot load group shard (%d, epoch %d): already held by this store", n, epoch)
	}
	s.cl.state[n] = gsShardLoading
	s.closeMu.Unlock()

	seq, err := s.replayShard(n, epoch)
	if err == nil {
		_, err = s.writeCheckpoint(n, epoch, seq)
	}
	if err != nil {
		s.dropShard(n) // before the shard is unloaded: a next load must find nothing of this one
		s.closeMu.Lock()
		s.cl.state[n] = gsShardUnloaded
		s.closeMu.Unlock()
		return fmt.Errorf("cannot load group shard (%d, epoch %d): %w", n, epoch, err)
	}
	s.closeMu.Lock()
	s.cl.epoch[n], s.cl.seq[n] = epoch, seq
	s.cl.state[n] = gsShardLoaded
	older := s.cl.older[n]
	s.cl.older[n] = nil
	s.closeMu.Unlock()
	gsShardLoads.Inc()
	// Checkpoints of older epochs are superseded by the one just written (it carries all they
	// did); nothing reads them any more.
	for _, name := range older {
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("cannot delete superseded group shard checkpoint", zap.String("file", name), zap.Error(err))
		}
	}
	return nil
}

// replayShard rebuilds shard n in memory from its newest checkpoint and the logs (the §3 rule)
// and returns the seq the shard continues from.
func (s *GroupStore) replayShard(n int, epoch int32) (uint64, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("cannot list offset store directory (%s): %w", s.dir, err)
	}
	ckEpoch, found := int32(0), false
	var logs []string
	for _, e := range ents {
		if sn, ep, ok := gsParseCkptName(e.Name()); ok && sn == n && (!found || ep > ckEpoch) {
			ckEpoch, found = ep, true
		}
		if _, _, _, ok := gsParseLogName(e.Name()); ok {
			logs = append(logs, e.Name())
		}
	}
	if !found {
		// No owner ever served the shard: an epoch's ops are only written after its checkpoint.
		return 0, nil
	}
	s.cl.older[n] = s.cl.older[n][:0]
	for _, e := range ents {
		if sn, ep, ok := gsParseCkptName(e.Name()); ok && sn == n && ep < epoch {
			s.cl.older[n] = append(s.cl.older[n], e.Name())
		}
	}
	if ckEpoch > epoch {
		return 0, fmt.Errorf("checkpoint %s: %w (loading at %d)", gsCkptName(n, ckEpoch), ErrGroupShardFenced, epoch)
	}
	ckSeq, err := s.readCheckpoint(n, ckEpoch)
	if err != nil {
		return 0, err
	}
	var ops []*gsOp
	for _, name := range logs {
		path := filepath.Join(s.dir, name)
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted by its writer since the listing: every op in it is checkpointed
		}
		if err != nil {
			return 0, fmt.Errorf("cannot read offset log (%s): %w", path, err)
		}
		if len(data) < len(gsClusterHeader) {
			continue // its writer died creating it
		}
		if string(data[:len(gsClusterHeader)]) != gsClusterHeader {
			return 0, fmt.Errorf("cannot read offset log (%s): not a kaas cluster offsets log (bad header)", path)
		}
		sc := framelog.Scanner{
			Format: &gsFormat,
			Frame: func(_ int, payload []byte) (bool, error) {
				// The frame is replayed only if all of it is well formed, as in single mode.
				var fops []*gsOp
				err := gsScanPrefixed(payload, func(shard int, ep int32, seq uint64, body []byte) error {
					switch {
					case shard != n:
					case ep != ckEpoch:
						gsIgnoredOps.Inc()
					case seq > ckSeq:
						op, err := gsDecodeBody(body)
						if err != nil {
							return err
						}
						op.shard, op.cepoch, op.seq = shard, ep, seq
						fops = append(fops, op)
					}
					return nil
				})
				if err != nil {
					return false, fmt.Errorf("%w: %v", framelog.ErrBadFrame, err)
				}
				ops = append(ops, fops...)
				return true, nil
			},
			Follow: func(_ int, payload []byte) framelog.Follow {
				if _, err := gsDecodeOps(payload, true); err != nil {
					return framelog.Skip
				}
				return framelog.Acked
			},
		}
		res, err := sc.Scan(data, len(gsClusterHeader))
		if err != nil {
			return 0, fmt.Errorf("cannot read offset log (%s): %w", path, err)
		}
		if res.Damaged {
			return 0, fmt.Errorf("cannot read offset log (%s): corrupt frame at byte %d followed by valid data at byte %d", path, res.TornAt, res.DamagedAt)
		}
	}
	slices.SortStableFunc(ops, func(a, b *gsOp) int {
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	seq := ckSeq
	for _, op := range ops {
		if op.seq <= seq {
			continue // one writer per epoch never repeats a seq; never apply an op twice anyway
		}
		s.apply(op)
		seq = op.seq
	}
	gsReplayedOps.Add(len(ops))
	s.log.Info("group shard replayed", zap.Int("shard", n), zap.Int32("checkpoint_epoch", ckEpoch),
		zap.Uint64("checkpoint_seq", ckSeq), zap.Int("ops", len(ops)), zap.Uint64("seq", seq), zap.Int32("epoch", epoch))
	return seq, nil
}

// readCheckpoint applies shard-n-e<epoch>.ckpt to memory and returns its seq.
func (s *GroupStore) readCheckpoint(n int, epoch int32) (uint64, error) {
	path := filepath.Join(s.dir, gsCkptName(n, epoch))
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("cannot read group shard checkpoint (%s): %w", path, err)
	}
	bad := func(why string) (uint64, error) {
		return 0, fmt.Errorf("cannot read group shard checkpoint (%s): %s", path, why)
	}
	if len(data) < len(gsCkptHeader) || string(data[:len(gsCkptHeader)]) != gsCkptHeader {
		return bad("bad header")
	}
	pos := len(gsCkptHeader)
	payload, size, ok := gsFormat.Parse(data[pos:])
	if !ok {
		return bad("bad first frame")
	}
	pos += size
	r := &framelog.Reader{B: payload}
	shard := r.Uvarint("shard")
	ep := r.VarintIn("epoch", -1<<31, 1<<31-1)
	seq := r.Uvarint("seq")
	frames := r.Uvarint("frames")
	_ = r.Varint("broker")
	_ = r.Str("incarnation")
	if r.Err != nil || shard != uint64(n) || int32(ep) != epoch {
		return bad(fmt.Sprintf("header does not match its name (shard %d epoch %d, %v)", shard, ep, r.Err))
	}
	var ops []*gsOp
	for i := uint64(0); i < frames; i++ {
		payload, size, ok := gsFormat.Parse(data[pos:])
		if !ok {
			return bad(fmt.Sprintf("frame %d of %d at byte %d is damaged or missing", i+1, frames, pos))
		}
		pos += size
		fops, err := gsDecodeOps(payload, false)
		if err != nil {
			return bad(err.Error())
		}
		ops = append(ops, fops...)
	}
	if pos != len(data) {
		return bad(fmt.Sprintf("%d bytes after the last frame", len(data)-pos))
	}
	for _, op := range ops {
		if GroupShardFor(op.group) != n {
			return bad(fmt.Sprintf("group %q is not of the shard", op.group))
		}
	}
	for _, op := range ops {
		s.apply(op)
	}
	return seq, nil
}

// writeCheckpoint durably writes shard n's in-memory state as shard-n-e<epoch>.ckpt at seq and
// returns its size. Shard n's state must not change meanwhile (it is loading, or the caller is
// the writer goroutine).
func (s *GroupStore) writeCheckpoint(n int, epoch int32, seq uint64) (int64, error) {
	snap, frames := s.snapshot(nil, n)
	var hdr []byte
	hdr = binary.AppendUvarint(hdr, uint64(n))
	hdr = binary.AppendVarint(hdr, int64(epoch))
	hdr = binary.AppendUvarint(hdr, seq)
	hdr = binary.AppendUvarint(hdr, uint64(frames))
	hdr = binary.AppendVarint(hdr, int64(s.cl.brokerID))
	hdr = framelog.AppendStr(hdr, s.cl.inc)
	data := gsFormat.Append([]byte(gsCkptHeader), hdr)
	data = append(data, snap...)
	name := gsCkptName(n, epoch)
	path := filepath.Join(s.dir, name)
	// The tmp name carries the incarnation: two brokers never share one, even a zombie and its
	// successor writing the same shard's checkpoint name.
	tmp := filepath.Join(s.dir, "."+name+"."+s.cl.inc+".tmp")
	err := WriteFileSynced(tmp, data)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = SyncDir(s.dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		gsCheckpointFails.Inc()
		return 0, fmt.Errorf("cannot write group shard checkpoint (%s): %w", path, err)
	}
	gsCheckpoints.Inc()
	return int64(len(data)), nil
}

// dropShard forgets shard n's groups.
func (s *GroupStore) dropShard(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for g := range s.groups {
		if GroupShardFor(g) == n {
			delete(s.groups, g)
		}
	}
	for g := range s.pending {
		if GroupShardFor(g) == n {
			delete(s.pending, g)
		}
	}
	for g := range s.meta {
		if GroupShardFor(g) == n {
			delete(s.meta, g)
		}
	}
	for g := range s.cmeta {
		if GroupShardFor(g) == n {
			delete(s.cmeta, g)
		}
	}
}

// ReleaseShard stops holding shard n: writes already queued for it are written, its state is
// checkpointed at the current epoch and last seq, and it is dropped from memory; writes for it
// queued later fail with ErrGroupShardNotLoaded. Releasing a shard not held is a no-op. Single
// mode does nothing.
func (s *GroupStore) ReleaseShard(n int) error {
	if s.cl == nil {
		return nil
	}
	if n < 0 || n >= GroupShards {
		return fmt.Errorf("cannot release group shard (%d): out of range [0, %d)", n, GroupShards)
	}
	ch := make(chan error, 1)
	s.closeMu.Lock()
	switch st := s.cl.state[n]; {
	case s.closed:
		s.closeMu.Unlock()
		return fmt.Errorf("cannot release group shard (%d): %w", n, ErrGroupStoreClosed)
	case st == gsShardUnloaded:
		s.closeMu.Unlock()
		return nil
	case st != gsShardLoaded:
		s.closeMu.Unlock()
		return fmt.Errorf("cannot release group shard (%d): being loaded or released", n)
	}
	s.cl.state[n] = gsShardReleasing
	// Push, not TryPush: the release must follow the shard's queued writes whatever the queue's
	// length, and it adds no record.
	s.writer.Push(&gsOp{ctl: func() error { return s.releaseOnWriter(n) }, done: func(err error) { ch <- err }})
	s.closeMu.Unlock()
	return <-ch
}

// releaseOnWriter is ReleaseShard's step on the writer goroutine, after every earlier write.
func (s *GroupStore) releaseOnWriter(n int) error {
	epoch, seq := s.cl.epoch[n], s.cl.seq[n]
	_, err := s.writeCheckpoint(n, epoch, seq)
	if err != nil {
		// The shard's ops stay readable in this incarnation's logs (the load checkpoint
		// precedes them), so the successor still finds them, as long as no log is deleted.
		s.cl.keepOld = true
		s.log.Warn("group shard release: checkpoint failed; keeping every log generation", zap.Int("shard", n), zap.Error(err))
	}
	s.dropShard(n)
	s.closeMu.Lock()
	s.cl.state[n] = gsShardUnloaded
	s.closeMu.Unlock()
	gsShardReleases.Inc()
	if err != nil {
		return fmt.Errorf("cannot release group shard (%d, epoch %d): %w", n, epoch, err)
	}
	return nil
}

// roll is cluster-mode compaction (writer goroutine): checkpoint every held shard, start the
// next log generation, delete the older ones.
func (s *GroupStore) roll() error {
	var held []int
	s.closeMu.Lock()
	for n, st := range s.cl.state {
		if st == gsShardLoaded || st == gsShardReleasing {
			held = append(held, n)
		}
	}
	s.closeMu.Unlock()
	var total int64
	for _, n := range held {
		sz, err := s.writeCheckpoint(n, s.cl.epoch[n], s.cl.seq[n])
		if err != nil {
			return fmt.Errorf("cannot roll offset log (%s): %w", s.path, err)
		}
		total += sz
	}
	f, path, err := s.createLog(s.cl.gen + 1)
	if err != nil {
		return fmt.Errorf("cannot roll offset log (%s): %w", s.path, err)
	}
	if s.f != nil {
		s.f.Close()
	}
	s.cl.old = append(s.cl.old, s.path)
	s.cl.gen++
	s.path = path
	s.setFile(f, int64(len(gsClusterHeader)))
	s.base = max(total, s.size)
	s.needRewrite = false
	gsRolls.Inc()
	if s.cl.keepOld {
		return nil
	}
	kept := s.cl.old[:0]
	for _, p := range s.cl.old {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("cannot delete covered offset log generation", zap.String("file", p), zap.Error(err))
			kept = append(kept, p)
			continue
		}
		gsLogsDeleted.Inc()
	}
	s.cl.old = kept
	if err := SyncDir(s.dir); err != nil {
		s.log.Warn("cannot sync offset store directory after deleting logs", zap.String("dir", s.dir), zap.Error(err))
	}
	return nil
}

// RemoveDeadGroupLogs deletes the offset logs of a dead broker incarnation (brokerID, inc)
// whose every op is covered by a newer checkpoint: for the op's shard, the newest checkpoint
// has a higher epoch, or the same epoch and a seq at least the op's (§3: a checkpoint of a higher
// epoch carries everything of the epoch chain, and ops outside the chain are ignored by every
// load). A log with an op not yet covered is kept, as is one that cannot be read whole. Only
// for an incarnation that writes no more (its lease is gone); the controller calls it.
func RemoveDeadGroupLogs(dataDir string, brokerID int32, inc string) (removed int, err error) {
	dir := filepath.Join(dataDir, "__cluster", gsSubdir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("cannot list offset store directory (%s): %w", dir, err)
	}
	type pos struct {
		epoch int32
		seq   uint64
		ok    bool
	}
	var newest [GroupShards]pos
	for _, e := range ents {
		n, ep, ok := gsParseCkptName(e.Name())
		if !ok || (newest[n].ok && ep <= newest[n].epoch) {
			continue
		}
		seq, err := gsCkptSeq(filepath.Join(dir, e.Name()), n, ep)
		if err != nil {
			return removed, err
		}
		newest[n] = pos{ep, seq, true}
	}
	for _, e := range ents {
		b, i, _, ok := gsParseLogName(e.Name())
		if !ok || b != brokerID || i != inc {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return removed, fmt.Errorf("cannot read offset log (%s): %w", path, err)
		}
		covered := len(data) < len(gsClusterHeader) || string(data[:len(gsClusterHeader)]) == gsClusterHeader
		if covered && len(data) > len(gsClusterHeader) {
			sc := framelog.Scanner{Format: &gsFormat, Frame: func(_ int, payload []byte) (bool, error) {
				err := gsScanPrefixed(payload, func(shard int, epoch int32, seq uint64, _ []byte) error {
					c := newest[shard]
					if !c.ok || c.epoch < epoch || (c.epoch == epoch && c.seq < seq) {
						covered = false
					}
					return nil
				})
				if err != nil {
					return false, fmt.Errorf("%w: %v", framelog.ErrBadFrame, err)
				}
				return true, nil
			}}
			res, err := sc.Scan(data, len(gsClusterHeader))
			if err != nil || res.Damaged {
				covered = false
			}
		}
		if !covered {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("cannot delete offset log (%s): %w", path, err)
		}
		removed++
		gsLogsDeleted.Inc()
	}
	if removed > 0 {
		if err := SyncDir(dir); err != nil {
			return removed, fmt.Errorf("cannot sync offset store directory (%s): %w", dir, err)
		}
	}
	return removed, nil
}

// gsCkptSeq reads the seq from a checkpoint's header frame.
func gsCkptSeq(path string, n int, epoch int32) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("cannot read group shard checkpoint (%s): %w", path, err)
	}
	defer f.Close()
	buf := make([]byte, len(gsCkptHeader)+gsFrameHdr+64+2*GroupIDMaxBytes)
	k, _ := io.ReadFull(f, buf)
	buf = buf[:k]
	if len(buf) < len(gsCkptHeader) || string(buf[:len(gsCkptHeader)]) != gsCkptHeader {
		return 0, fmt.Errorf("cannot read group shard checkpoint (%s): bad header", path)
	}
	payload, _, ok := gsFormat.Parse(buf[len(gsCkptHeader):])
	if !ok {
		return 0, fmt.Errorf("cannot read group shard checkpoint (%s): bad first frame", path)
	}
	r := &framelog.Reader{B: payload}
	shard, ep, seq := r.Uvarint("shard"), r.Varint("epoch"), r.Uvarint("seq")
	if r.Err != nil || shard != uint64(n) || int32(ep) != epoch {
		return 0, fmt.Errorf("cannot read group shard checkpoint (%s): header does not match its name", path)
	}
	return seq, nil
}
