package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/storage/framelog"
	"github.com/kaas-go/kaas/storage/mailbox"
)

// GroupStore is the durable committed-offset store of the group coordinator (Kafka's
// __consumer_offsets, without the topic). It lives in <data.dir>/__cluster/consumer_offsets/.
//
// On-disk format: one append-only log, offsets.log.
//
//	file   = header frame*
//	header = "KAASGOF1"                                    (8 bytes; the format version is the last byte)
//	frame  = magic u32 (0x4B474F46 "KGOF") | len u32 | crc32c(payload) u32 | payload[len]
//	payload = op*                                          (one frame = one group-commit batch)
//	op     = 1 commit        group str, n uvarint, n × (topic str, partition varint, offset varint,
//	                         leaderEpoch varint, metadata str, commitTimeMs varint)
//	       | 2 deleteGroup   group str
//	       | 3 deleteOffsets group str, n uvarint, n × (topic str, partition varint)
//	       | 4 stageTxn      group str, producerID varint, producerEpoch varint, n uvarint,
//	                         n × (topic str, partition varint, offset varint, leaderEpoch varint,
//	                         metadata str, commitTimeMs varint, flags u8)
//	       | 5 commitTxn     group str, producerID varint
//	       | 6 abortTxn      group str, producerID varint
//	       | 7 groupMeta     group str, classic-group metadata (groupstore_meta.go)
//	str    = uvarint length | bytes
//	flags  = bit 0 "superseded": a plain commit for the partition was made after this staging
//
// Transactional offsets (KIP-98 TxnOffsetCommit, KIP-447). A staging is replayed into a pending
// set keyed by (group, producerID), next to the committed set and invisible to Offset/Offsets;
// later stagings for the same (group, producerID, partition) overwrite. commitTxn moves the whole
// pending set of (group, producerID) into the committed set in one record (atomic by the frame
// CRC) and drops it; abortTxn drops it. A partition whose staging was followed by a plain
// OffsetCommit keeps the plain commit when the transaction commits: Apache materialises a
// transactional offset only if its record is newer than the committed one
// (GroupMetadata.completePendingTxnOffsetCommit / OffsetMetadataManager.replayEndTransactionMarker),
// and the superseded flag is that comparison made durable, so it survives compaction (which
// rewrites records in a different order). deleteOffsets and deleteGroup drop the pending offsets of
// the partitions / group they delete (Apache's GroupMetadata.removeOffsets).
//
// Staged-but-not-completed offsets are durable like commits: they survive kill -9 and a restart,
// and the transaction coordinator's reconcile pass (which re-drives every prepared transaction)
// completes them through CompleteTxnOffsets. They are never dropped just because the broker
// restarted (a memory-only pending layer would turn a restart into at-least-once).
//
// Why one frame per batch: the writer goroutine takes everything queued while the previous fsync
// ran, encodes it as ONE frame, writes it with one write(2) and fsyncs once (group commit), then
// acknowledges every waiter. A crash can therefore only tear the last frame, and nothing is ever
// written after a frame that has not been fsync'd (framelog.Appender). A batch whose frame would
// exceed what the reader accepts (gsFormat.MaxLen, 256 MiB) is split into several frames, each
// written and fsync'd on its own, so the "only the last frame may be torn" rule still holds; a
// single op larger than that, or naming a group id longer than Apache's 32767 bytes, is refused
// before anything is written (ErrOffsetCommitTooLarge, ErrGroupIDTooLong → INVALID_REQUEST):
// everything acknowledged can be read back.
//
// Recovery on open (framelog.Scanner): frames are replayed in order. The first bad frame (wrong
// magic, length past EOF or over the limit, CRC mismatch, undecodable payload) ends the valid
// prefix. If no valid frame follows it anywhere in the file, it is a torn tail: the file is
// truncated there (earlier commits kept). If a valid frame follows, the damage is in the middle of
// acknowledged data and Open refuses with an error naming the file and offset — guessing would
// silently lose or resurrect offsets.
//
// Compaction: when the log grows past gsCompactMin and 4× the size of a snapshot of the live set,
// the writer rewrites the live set to offsets.log.tmp, fsyncs it, renames it over offsets.log and
// fsyncs the directory. A crash leaves either file whole; a leftover .tmp is removed on open. The
// same rewrite is how the store recovers after a failed write or fsync when the appender's own
// repair (cut the file back to the last durable frame and fsync) fails too: the in-memory
// committed set only ever contains fsync'd data, so it is the truth to rewrite from, and until a
// repair or a rewrite succeeds every commit fails (never a success the disk did not confirm).
//
// Cluster mode (OpenGroupStoreCluster, groupstore_cluster.go) keeps the frame and op formats but
// writes one log per broker incarnation whose ops carry (shard, epoch, seq), holds only the
// shards it loaded, and compacts by checkpointing them and starting a new log generation.
type GroupStore struct {
	dir  string
	path string
	log  *zap.Logger

	mu      sync.RWMutex
	groups  map[string]map[GroupPartition]GroupOffset // fsync'd committed offsets only
	pending map[string]map[int64]*gsPending           // fsync'd staged transactional offsets
	meta    map[string]*GroupMeta                     // fsync'd classic-group metadata (never mutated in place)
	cmeta   map[string]*ConsumerGroupMeta             // fsync'd KIP-848 consumer-group state (never mutated in place)

	cl      *gsCluster                  // nil in single mode
	publish atomic.Pointer[func() bool] // Rule P (SetPublish); nil = always

	// The writer is a mailbox drained in batches (writeOps); closeMu orders enqueues before
	// Close's wait for the writer (and, in cluster mode, guards the shard states). Lock order:
	// closeMu, then the mailbox's lock; s.mu is never held with either.
	writer  *mailbox.Queue[*gsOp]
	closeMu sync.Mutex
	closed  bool

	// writer-goroutine-only state
	f           *os.File
	app         *framelog.Appender // appends frames to f at the end of the durable log
	size        int64
	base        int64 // size of the log right after the last compaction / open
	needRewrite bool  // a failed write could not be repaired, or a rewrite's rename is not durable: rewrite before appending
	compactMin  int64
	buf         []byte
	opBuf       []byte // cluster mode: one op's encoding
}

// GroupPartition names one partition of a committed-offset set.
type GroupPartition struct {
	Topic     string
	Partition int32
}

// GroupOffset is one committed offset (OffsetCommit's per-partition data).
type GroupOffset struct {
	Topic        string
	Partition    int32
	Offset       int64
	LeaderEpoch  int32 // committed_leader_epoch, -1 if unknown
	Metadata     string
	CommitTimeMs int64
}

// gsPending is one (group, producerID)'s staged transactional offsets.
type gsPending struct {
	epoch int16 // highest producer epoch that staged into this set
	offs  map[GroupPartition]gsPendingOffset
}

type gsPendingOffset struct {
	GroupOffset
	superseded bool // a plain commit for the partition came after this staging: it wins
}

// ErrGroupStoreClosed is returned for operations after Close.
var ErrGroupStoreClosed = errors.New("group offset store is closed")

// Refusals at write time (answer INVALID_REQUEST, 42): what the store cannot read back it never
// acknowledges.
var (
	// ErrGroupIDTooLong: a group id longer than GroupIDMaxBytes (Apache's limit for a Kafka
	// string, 32767 bytes).
	ErrGroupIDTooLong = errors.New("group id longer than 32767 bytes")
	// ErrOffsetCommitTooLarge: one operation encodes to more than a frame may hold.
	ErrOffsetCommitTooLarge = errors.New("offset store operation larger than its frame limit")
)

// GroupIDMaxBytes is the longest group id the store accepts (a Kafka STRING is int16-length).
const GroupIDMaxBytes = 32767

// ErrGroupStoreBusy is returned, without writing anything, when gsMaxQueuedOps writes already
// wait for the disk: the group coordinator answers the request COORDINATOR_NOT_AVAILABLE and the
// client retries, instead of the queue growing while the disk is slow.
var ErrGroupStoreBusy = errors.New("group offset store has too many queued writes")

const (
	gsHeader    = "KAASGOF1"
	gsMagic     = 0x4B474F46
	gsFrameHdr  = 12
	gsMaxFrame  = 256 << 20 // read limit of a frame payload; the writer splits and refuses to stay within it
	gsFileName  = "offsets.log"
	gsSubdir    = "consumer_offsets"
	gsOpCommit  = 1
	gsOpDelGrp  = 2
	gsOpDelOffs = 3
	gsOpStage   = 4
	gsOpTxnCmt  = 5
	gsOpTxnAbrt = 6
	gsOpMeta    = 7

	gsDefaultCompactMin = 8 << 20

	// gsMaxQueuedOps bounds the writes waiting for the writer. Every one comes from a group
	// request the coordinator admitted, so this is reached only when the disk falls far behind.
	gsMaxQueuedOps = 1 << 16
)

// gsFormat is the offsets.log frame: magic "KGOF" | len u32 | crc32c(payload) u32 | payload.
// MaxLen is the limit the reader and the writer share; tests lower it.
var gsFormat = framelog.Format{Magic: gsMagic, HeaderLen: gsFrameHdr, LenAt: 4, CRCAt: 8, MaxLen: gsMaxFrame}

// gsFile is the offset log's file as the appender sees it.
type gsFile struct{ *os.File }

func (f gsFile) Datasync() error { return Fdatasync(f.File) }

var (
	gsCommitsTotal     = metrics.NewCounter("kaas_group_offsets_commits_total")
	gsCommitErrors     = metrics.NewCounter("kaas_group_offsets_commit_errors_total")
	gsFsyncsTotal      = metrics.NewCounter("kaas_group_offsets_fsyncs_total")
	gsCompactionsTotal = metrics.NewCounter("kaas_group_offsets_compactions_total")
	gsTruncatedTotal   = metrics.NewCounter("kaas_group_offsets_torn_tail_truncations_total")
	gsFsyncDuration    = metrics.NewHistogram("kaas_group_offsets_fsync_duration_seconds")
	gsRefusedTotal     = metrics.NewCounter("kaas_group_offsets_refused_total") // over a write-time limit
	gsSplitsTotal      = metrics.NewCounter("kaas_group_offsets_batch_splits_total")
)

// gsOp is one queued mutation: applied to memory only after its frame is fsync'd.
type gsOp struct {
	kind  byte
	group string
	offs  []GroupOffset
	parts []GroupPartition
	// transactional ops
	pid        int64
	epoch      int16
	superseded []bool             // stage only, parallel to offs; nil = none (only compaction writes them)
	meta       *GroupMeta         // groupMeta only; nil = tombstone
	cmeta      *ConsumerGroupMeta // consumerGroupMeta only; nil = tombstone
	// cluster mode: the op's shard, and the epoch and seq the writer stamps it with
	shard  int
	cepoch int32
	seq    uint64
	// ctl, when set, makes the op a control step for the writer, not a record: it runs after
	// every op queued before it was written and applied, and its result is done's argument.
	ctl  func() error
	done func(error)
	err  error // writer: the outcome of this op's write
}

// OpenGroupStore opens (creating if needed) the offset store under dataDir/__cluster/consumer_offsets
// and replays it. log may be nil.
func OpenGroupStore(dataDir string, log *zap.Logger) (*GroupStore, error) {
	if log == nil {
		log = zap.NewNop()
	}
	dir := filepath.Join(dataDir, "__cluster", gsSubdir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create offset store directory (%s): %w", dir, err)
	}
	s := &GroupStore{
		dir:        dir,
		path:       filepath.Join(dir, gsFileName),
		log:        log.Named("offsets"),
		groups:     make(map[string]map[GroupPartition]GroupOffset),
		pending:    make(map[string]map[int64]*gsPending),
		meta:       make(map[string]*GroupMeta),
		cmeta:      make(map[string]*ConsumerGroupMeta),
		compactMin: gsDefaultCompactMin,
	}
	s.writer = mailbox.New(mailbox.Config[*gsOp]{Name: "group_offsets", MaxLen: gsMaxQueuedOps, Batch: true}, s.writeOps)
	_ = os.Remove(s.path + ".tmp") // an interrupted compaction; offsets.log is still whole
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// load replays offsets.log into memory, truncating a torn tail, and leaves s.f open for append.
func (s *GroupStore) load() error {
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("cannot open offset store (%s): %w", s.path, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return fmt.Errorf("cannot read offset store (%s): %w", s.path, err)
	}
	if len(data) < len(gsHeader) && bytes.HasPrefix([]byte(gsHeader), data) {
		// New file, or a crash tore the header of a new file: start it (again).
		if err := f.Truncate(0); err == nil {
			if _, err = f.WriteAt([]byte(gsHeader), 0); err == nil {
				err = f.Sync()
			}
		}
		if err != nil {
			f.Close()
			return fmt.Errorf("cannot initialise offset store (%s): %w", s.path, err)
		}
		if err := SyncDir(s.dir); err != nil {
			f.Close()
			return fmt.Errorf("cannot sync offset store directory (%s): %w", s.dir, err)
		}
		data = []byte(gsHeader)
	}
	if len(data) < len(gsHeader) || string(data[:len(gsHeader)]) != gsHeader {
		f.Close()
		return fmt.Errorf("cannot open offset store (%s): not a kaas offsets log (bad header); refusing to start", s.path)
	}
	sc := framelog.Scanner{
		Format: &gsFormat,
		Frame: func(_ int, payload []byte) (bool, error) {
			ops, err := gsDecodeOps(payload, false)
			if err != nil {
				return false, fmt.Errorf("%w: %v", framelog.ErrBadFrame, err)
			}
			for _, op := range ops {
				s.apply(op)
			}
			return true, nil
		},
		// One frame per write: every valid frame after a bad one was acknowledged. A CRC-valid
		// frame that does not decode is not taken for one (it cannot be told from noise).
		Follow: func(_ int, payload []byte) framelog.Follow {
			if _, err := gsDecodeOps(payload, false); err != nil {
				return framelog.Skip
			}
			return framelog.Acked
		},
	}
	res, err := sc.Scan(data, len(gsHeader))
	if err != nil {
		f.Close()
		return fmt.Errorf("cannot read offset store (%s): %w", s.path, err)
	}
	pos := int(res.End)
	switch {
	case res.Damaged:
		f.Close()
		return fmt.Errorf("cannot open offset store (%s): corrupt frame at byte %d followed by valid data at byte %d; refusing to start (move the file aside to discard committed offsets)", s.path, res.TornAt, res.DamagedAt)
	case res.Torn:
		s.log.Warn("truncating torn tail of offset store", zap.String("file", s.path),
			zap.Int("at", pos), zap.Int("discarded_bytes", len(data)-pos), zap.String("why", res.Why))
		gsTruncatedTotal.Inc()
		err := f.Truncate(int64(pos))
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			f.Close()
			return fmt.Errorf("cannot truncate offset store (%s) at %d: %w", s.path, pos, err)
		}
	}
	valid := int64(pos)
	s.setFile(f, valid)
	snap, _ := s.snapshot(nil, -1)
	s.base = int64(len(snap))
	if s.size > s.compactMin && s.size > 2*s.base {
		if err := s.rewrite(); err != nil {
			s.log.Warn("cannot compact offset store on open; continuing with the existing log",
				zap.String("file", s.path), zap.Error(err))
		}
	}
	return nil
}

// apply folds one durable op into the in-memory committed set.
func (s *GroupStore) apply(op *gsOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch op.kind {
	case gsOpCommit:
		g := s.groups[op.group]
		if g == nil {
			g = make(map[GroupPartition]GroupOffset, len(op.offs))
			s.groups[op.group] = g
		}
		for _, o := range op.offs {
			gp := GroupPartition{o.Topic, o.Partition}
			g[gp] = o
			for _, p := range s.pending[op.group] {
				if po, ok := p.offs[gp]; ok {
					po.superseded = true
					p.offs[gp] = po
				}
			}
		}
	case gsOpDelGrp:
		delete(s.groups, op.group)
		delete(s.pending, op.group)
		delete(s.meta, op.group)
		delete(s.cmeta, op.group)
	case gsOpConsumerMeta:
		if op.cmeta == nil {
			delete(s.cmeta, op.group)
		} else {
			s.cmeta[op.group] = op.cmeta
		}
	case gsOpMeta:
		if op.meta == nil {
			delete(s.meta, op.group)
		} else {
			s.meta[op.group] = op.meta
		}
	case gsOpDelOffs:
		g := s.groups[op.group]
		for _, p := range op.parts {
			delete(g, p)
		}
		if len(g) == 0 {
			delete(s.groups, op.group)
		}
		pg := s.pending[op.group]
		for pid, pe := range pg {
			for _, p := range op.parts {
				delete(pe.offs, p)
			}
			if len(pe.offs) == 0 {
				delete(pg, pid)
			}
		}
		if len(pg) == 0 {
			delete(s.pending, op.group)
		}
	case gsOpStage:
		pg := s.pending[op.group]
		if pg == nil {
			pg = make(map[int64]*gsPending)
			s.pending[op.group] = pg
		}
		pe := pg[op.pid]
		if pe == nil {
			pe = &gsPending{epoch: op.epoch, offs: make(map[GroupPartition]gsPendingOffset, len(op.offs))}
			pg[op.pid] = pe
		}
		pe.epoch = max(pe.epoch, op.epoch)
		for i, o := range op.offs {
			pe.offs[GroupPartition{o.Topic, o.Partition}] = gsPendingOffset{GroupOffset: o,
				superseded: op.superseded != nil && op.superseded[i]}
		}
	case gsOpTxnCmt, gsOpTxnAbrt:
		pg := s.pending[op.group]
		pe := pg[op.pid]
		if pe == nil {
			return // nothing staged: completion is idempotent
		}
		delete(pg, op.pid)
		if len(pg) == 0 {
			delete(s.pending, op.group)
		}
		if op.kind == gsOpTxnAbrt {
			return
		}
		g := s.groups[op.group]
		for gp, po := range pe.offs {
			if po.superseded {
				continue
			}
			if g == nil {
				g = make(map[GroupPartition]GroupOffset, len(pe.offs))
				s.groups[op.group] = g
			}
			g[gp] = po.GroupOffset
		}
	}
}

// ---- encoding ----

func gsAppendOp(b []byte, op *gsOp) []byte {
	b = append(b, op.kind)
	b = framelog.AppendStr(b, op.group)
	switch op.kind {
	case gsOpCommit:
		b = binary.AppendUvarint(b, uint64(len(op.offs)))
		for _, o := range op.offs {
			b = framelog.AppendStr(b, o.Topic)
			b = binary.AppendVarint(b, int64(o.Partition))
			b = binary.AppendVarint(b, o.Offset)
			b = binary.AppendVarint(b, int64(o.LeaderEpoch))
			b = framelog.AppendStr(b, o.Metadata)
			b = binary.AppendVarint(b, o.CommitTimeMs)
		}
	case gsOpDelOffs:
		b = binary.AppendUvarint(b, uint64(len(op.parts)))
		for _, p := range op.parts {
			b = framelog.AppendStr(b, p.Topic)
			b = binary.AppendVarint(b, int64(p.Partition))
		}
	case gsOpStage:
		b = binary.AppendVarint(b, op.pid)
		b = binary.AppendVarint(b, int64(op.epoch))
		b = binary.AppendUvarint(b, uint64(len(op.offs)))
		for i, o := range op.offs {
			b = framelog.AppendStr(b, o.Topic)
			b = binary.AppendVarint(b, int64(o.Partition))
			b = binary.AppendVarint(b, o.Offset)
			b = binary.AppendVarint(b, int64(o.LeaderEpoch))
			b = framelog.AppendStr(b, o.Metadata)
			b = binary.AppendVarint(b, o.CommitTimeMs)
			var flags byte
			if op.superseded != nil && op.superseded[i] {
				flags |= 1
			}
			b = append(b, flags)
		}
	case gsOpTxnCmt, gsOpTxnAbrt:
		b = binary.AppendVarint(b, op.pid)
	case gsOpMeta:
		b = gsAppendMeta(b, op.meta)
	case gsOpConsumerMeta:
		b = gsAppendConsumerMeta(b, op.cmeta)
	}
	return b
}

var gsErrDecode = errors.New("malformed offset store record")

// gsDecodeOps decodes every op of a frame payload; any malformation rejects the whole frame.
// prefixed: a cluster-mode payload, every op preceded by its (shard, epoch, seq) and length.
func gsDecodeOps(p []byte, prefixed bool) ([]*gsOp, error) {
	var ops []*gsOp
	if prefixed {
		err := gsScanPrefixed(p, func(shard int, epoch int32, seq uint64, body []byte) error {
			op, err := gsDecodeBody(body)
			if err != nil {
				return err
			}
			op.shard, op.cepoch, op.seq = shard, epoch, seq
			ops = append(ops, op)
			return nil
		})
		return ops, err
	}
	r := &framelog.Reader{B: p}
	for len(r.B) > 0 && r.Err == nil {
		op, err := gsDecodeOp(r)
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	if r.Err != nil {
		return nil, fmt.Errorf("%w: %v", gsErrDecode, r.Err)
	}
	return ops, nil
}

// gsDecodeBody decodes exactly one op from body.
func gsDecodeBody(body []byte) (*gsOp, error) {
	r := &framelog.Reader{B: body}
	op, err := gsDecodeOp(r)
	switch {
	case err != nil:
		return nil, err
	case r.Err != nil:
		return nil, fmt.Errorf("%w: %v", gsErrDecode, r.Err)
	case len(r.B) != 0:
		return nil, fmt.Errorf("%w: %d bytes after an op", gsErrDecode, len(r.B))
	}
	return op, nil
}

// gsScanPrefixed walks a cluster-mode payload (shard uvarint | epoch varint | seq uvarint |
// len uvarint | op[len])*, handing each op's body to fn undecoded, so a load skips the ops of
// other shards and epochs without decoding them.
func gsScanPrefixed(p []byte, fn func(shard int, epoch int32, seq uint64, body []byte) error) error {
	r := &framelog.Reader{B: p}
	for len(r.B) > 0 {
		shard := r.Uvarint("shard")
		epoch := r.VarintIn("epoch", -1<<31, 1<<31-1)
		seq := r.Uvarint("seq")
		n := r.Uvarint("op length")
		if r.Err != nil {
			return fmt.Errorf("%w: %v", gsErrDecode, r.Err)
		}
		if shard >= GroupShards || n == 0 || n > uint64(len(r.B)) {
			return fmt.Errorf("%w: bad op prefix (shard %d, length %d of %d)", gsErrDecode, shard, n, len(r.B))
		}
		body := r.B[:n]
		r.B = r.B[n:]
		if err := fn(int(shard), int32(epoch), seq, body); err != nil {
			return err
		}
	}
	return nil
}

// gsDecodeOp decodes one op (no prefix) from r.
func gsDecodeOp(r *framelog.Reader) (*gsOp, error) {
	kind := r.Byte("op")
	op := &gsOp{kind: kind, group: r.Str("group")}
	switch kind {
	case gsOpCommit:
		n := r.Uvarint("count")
		if n > uint64(len(r.B)) { // every entry takes at least one byte
			return nil, gsErrDecode
		}
		op.offs = make([]GroupOffset, 0, n)
		for i := uint64(0); i < n && r.Err == nil; i++ {
			o := readGroupOffset(r)
			op.offs = append(op.offs, o)
		}
	case gsOpDelGrp:
	case gsOpDelOffs:
		n := r.Uvarint("count")
		if n > uint64(len(r.B)) {
			return nil, gsErrDecode
		}
		op.parts = make([]GroupPartition, 0, n)
		for i := uint64(0); i < n && r.Err == nil; i++ {
			var gp GroupPartition
			gp.Topic = r.Str("topic")
			gp.Partition = int32(r.Varint("partition"))
			op.parts = append(op.parts, gp)
		}
	case gsOpStage:
		op.pid = r.Varint("producer id")
		op.epoch = int16(r.Varint("producer epoch"))
		n := r.Uvarint("count")
		if n > uint64(len(r.B)) {
			return nil, gsErrDecode
		}
		op.offs = make([]GroupOffset, 0, n)
		for i := uint64(0); i < n && r.Err == nil; i++ {
			o := readGroupOffset(r)
			switch r.Byte("offset flags") {
			case 0:
				if op.superseded != nil {
					op.superseded = append(op.superseded, false)
				}
			case 1:
				if op.superseded == nil {
					op.superseded = make([]bool, len(op.offs), n)
				}
				op.superseded = append(op.superseded, true)
			default:
				return nil, fmt.Errorf("%w: unknown offset flags", gsErrDecode)
			}
			op.offs = append(op.offs, o)
		}
	case gsOpTxnCmt, gsOpTxnAbrt:
		op.pid = r.Varint("producer id")
	case gsOpMeta:
		if m := gsReadMeta(r); m != nil && len(m.Members) > 0 {
			op.meta = m
		}
	case gsOpConsumerMeta:
		op.cmeta = gsReadConsumerMeta(r)
	default:
		return nil, fmt.Errorf("%w: unknown op %d", gsErrDecode, kind)
	}
	return op, nil
}

// snapshot appends the live state as frames to b: per group its commit op (if it has committed
// offsets) followed by one stage op per producer with pending offsets, carrying the producer
// epoch and the superseded flags, so replaying the snapshot rebuilds exactly the committed and
// pending sets (compaction carries open transactions). A group's frame is split where it would
// exceed the frame limit, and so is an op (into ops over parts of its offsets: their replay in
// order has the same effect), so a snapshot is always readable whatever the group sizes. A
// group's metadata follows as one groupMeta op. shard >= 0 limits the snapshot to that shard's
// groups (a cluster-mode checkpoint); the number of frames appended is returned with b.
func (s *GroupStore) snapshot(b []byte, shard int) ([]byte, int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := s.groupNamesLocked()
	if shard >= 0 {
		names = slices.DeleteFunc(names, func(g string) bool { return GroupShardFor(g) != shard })
	}
	fr := gsFramer{b: b, start: -1}
	for _, name := range names {
		if g := s.groups[name]; len(g) > 0 {
			op := &gsOp{kind: gsOpCommit, group: name}
			for _, o := range g {
				op.offs = append(op.offs, o)
			}
			fr.addSplit(op)
		}
		pg := s.pending[name]
		pids := make([]int64, 0, len(pg))
		for pid := range pg {
			pids = append(pids, pid)
		}
		slices.Sort(pids)
		for _, pid := range pids {
			pe := pg[pid]
			op := &gsOp{kind: gsOpStage, group: name, pid: pid, epoch: pe.epoch,
				offs: make([]GroupOffset, 0, len(pe.offs)), superseded: make([]bool, 0, len(pe.offs))}
			for _, po := range pe.offs {
				op.offs = append(op.offs, po.GroupOffset)
				op.superseded = append(op.superseded, po.superseded)
			}
			fr.addSplit(op)
		}
		if m := s.meta[name]; m != nil {
			fr.addSplit(&gsOp{kind: gsOpMeta, group: name, meta: m})
		}
		if m := s.cmeta[name]; m != nil {
			fr.addSplit(&gsOp{kind: gsOpConsumerMeta, group: name, cmeta: m})
		}
		fr.end()
	}
	return fr.b, fr.frames
}

// groupNamesLocked lists, sorted, every group with offsets, staged offsets or metadata. s.mu held.
func (s *GroupStore) groupNamesLocked() []string {
	names := make([]string, 0, len(s.groups)+len(s.pending)+len(s.meta)+len(s.cmeta))
	for g := range s.groups {
		names = append(names, g)
	}
	for g := range s.pending {
		if _, ok := s.groups[g]; !ok {
			names = append(names, g)
		}
	}
	for g := range s.meta {
		_, ok := s.groups[g]
		if _, ok2 := s.pending[g]; !ok && !ok2 {
			names = append(names, g)
		}
	}
	for g := range s.cmeta {
		_, ok := s.groups[g]
		_, ok2 := s.pending[g]
		if _, ok3 := s.meta[g]; !ok && !ok2 && !ok3 {
			names = append(names, g)
		}
	}
	sort.Strings(names)
	return names
}

// gsFramer packs encoded ops into frames of at most gsFormat.MaxLen payload bytes.
type gsFramer struct {
	b       []byte
	start   int // of the open frame; -1 if none
	scratch []byte
	frames  int // frames ended so far
}

func (fr *gsFramer) end() {
	if fr.start >= 0 {
		fr.b = gsFormat.End(fr.b, fr.start)
		fr.start = -1
		fr.frames++
	}
}

// addSplit adds op, halving its offsets until each part fits in a frame.
func (fr *gsFramer) addSplit(op *gsOp) {
	fr.scratch = gsAppendOp(fr.scratch[:0], op)
	if len(fr.scratch) > gsFormat.MaxLen && len(op.offs) > 1 {
		h := len(op.offs) / 2
		a, b := *op, *op
		a.offs, b.offs = op.offs[:h], op.offs[h:]
		if op.superseded != nil {
			a.superseded, b.superseded = op.superseded[:h], op.superseded[h:]
		}
		fr.addSplit(&a)
		fr.addSplit(&b)
		return
	}
	if fr.start >= 0 && len(fr.b)-fr.start-gsFrameHdr+len(fr.scratch) > gsFormat.MaxLen {
		fr.end()
	}
	if fr.start < 0 {
		fr.b, fr.start = gsFormat.Begin(fr.b)
	}
	fr.b = append(fr.b, fr.scratch...)
}

// ---- writer ----

func (s *GroupStore) enqueue(op *gsOp) {
	if s.cl != nil {
		op.shard = GroupShardFor(op.group)
	}
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		op.done(ErrGroupStoreClosed)
		return
	}
	if s.cl != nil && s.cl.state[op.shard] != gsShardLoaded {
		s.closeMu.Unlock()
		op.done(fmt.Errorf("cannot store offsets of group (%.64q, shard %d): %w", op.group, op.shard, ErrGroupShardNotLoaded))
		return
	}
	ok := s.writer.TryPush(op)
	s.closeMu.Unlock()
	if !ok {
		op.done(ErrGroupStoreBusy)
	}
}

// writeOps is the single writer (the mailbox's drainer, one batch at a time): everything queued
// while the previous batch was written is written (as one frame unless it passes the frame
// limit), fsync'd, applied and acknowledged; an op refused by a write-time limit fails alone.
func (s *GroupStore) writeOps(ops []*gsOp) {
	s.writeBatch(ops)
	s.checkPublish(ops)
	failed := false
	for _, op := range ops {
		if op.err == nil && op.ctl == nil {
			s.apply(op)
		}
	}
	for _, op := range ops {
		if op.ctl != nil {
			op.done(op.ctl())
			continue
		}
		err := op.err
		if err != nil {
			failed = true
			gsCommitErrors.Inc()
			if !errors.Is(err, ErrGroupIDTooLong) && !errors.Is(err, ErrOffsetCommitTooLarge) {
				err = fmt.Errorf("cannot persist committed offsets (%s): %w", s.path, err)
			}
		}
		op.done(err)
	}
	if !failed && s.size > s.compactMin && s.size > 4*s.base {
		if cerr := s.rewrite(); cerr != nil {
			s.log.Warn("offset store compaction failed", zap.String("file", s.path), zap.Error(cerr))
		}
	}
}

// checkOp applies the write-time limits that do not need the encoding.
func gsCheckOp(op *gsOp) error {
	if len(op.group) > GroupIDMaxBytes {
		return fmt.Errorf("cannot store offsets of group (%.64q…, %d bytes): %w", op.group, len(op.group), ErrGroupIDTooLong)
	}
	return nil
}

// writeBatch writes the batch, normally as one frame with one write and one fsync, and sets every
// op's err. Ops over a limit are refused alone. A batch over the frame limit becomes several
// frames, each written and fsync'd before the next (only the last write can ever be torn); after
// a failed write nothing more is written and every later op fails with it.
func (s *GroupStore) writeBatch(ops []*gsOp) {
	if err := s.ready(); err != nil {
		for _, op := range ops {
			op.err = err
		}
		return
	}
	b, start := gsFormat.Begin(s.buf[:0])
	first := 0 // first op of the open frame
	flush := func(upto int) bool {
		if len(b) == start+gsFrameHdr {
			return true // only refused ops: nothing to write
		}
		b = gsFormat.End(b, start)
		err := s.app.Write(b)
		n := 0
		for _, op := range ops[first:upto] {
			if op.err == nil {
				op.err = err
				n++
			}
		}
		if err != nil {
			for _, op := range ops[upto:] {
				op.err = err
			}
			return false
		}
		gsFsyncsTotal.Inc()
		gsCommitsTotal.Add(n)
		s.size = s.app.Offset()
		return true
	}
	for i, op := range ops {
		if op.ctl != nil {
			continue
		}
		if err := gsCheckOp(op); err != nil {
			op.err = err
			gsRefusedTotal.Inc()
			continue
		}
		mark := len(b)
		if s.cl != nil {
			// Cluster mode: the (shard, epoch, seq, length) prefix, then the op.
			s.opBuf = gsAppendOp(s.opBuf[:0], op)
			b = s.cl.stamp(b, op, len(s.opBuf))
			b = append(b, s.opBuf...)
		} else {
			b = gsAppendOp(b, op)
		}
		if len(b)-start-gsFrameHdr <= gsFormat.MaxLen {
			continue
		}
		if n := len(b) - mark; n > gsFormat.MaxLen {
			b = b[:mark]
			op.err = fmt.Errorf("cannot store offsets of group (%.64q): %d bytes, limit %d: %w", op.group, n, gsFormat.MaxLen, ErrOffsetCommitTooLarge)
			gsRefusedTotal.Inc()
			continue
		}
		// The frame is full: write it, and start the next one with this op.
		enc := append([]byte(nil), b[mark:]...)
		b = b[:mark]
		gsSplitsTotal.Inc()
		if !flush(i) {
			return
		}
		b, start = gsFormat.Begin(b[:0])
		b = append(b, enc...)
		first = i
	}
	flush(len(ops))
	if cap(b) <= 1<<20 {
		s.buf = b
	}
}

// ready makes sure the log ends cleanly before a write: a failed write is repaired by the
// appender (cut back to the last durable frame, fsync) or, if that fails, by a rewrite from the
// durable in-memory state.
func (s *GroupStore) ready() error {
	if s.app.Broken() {
		if err := s.app.Repair(); err != nil {
			s.needRewrite = true
		}
	}
	if s.needRewrite {
		return s.rewrite()
	}
	return nil
}

// setFile makes f, whose valid data ends at size, the log being appended to.
func (s *GroupStore) setFile(f *os.File, size int64) {
	s.f, s.size = f, size
	s.app = framelog.NewAppender(gsFile{f}, &gsFormat, size, 0)
	s.app.Observe = func(_, sync time.Duration, _ bool) { gsFsyncDuration.Update(sync.Seconds()) }
}

// rewrite replaces the log with a snapshot of the in-memory committed set.
func (s *GroupStore) rewrite() error {
	tmp := s.path + ".tmp"
	if s.cl != nil {
		return s.roll()
	}
	snap, _ := s.snapshot(nil, -1)
	data := append([]byte(gsHeader), snap...)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("cannot compact offset store (%s): %w", s.path, err)
	}
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, s.path)
	}
	if err != nil {
		f.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("cannot compact offset store (%s): %w", s.path, err)
	}
	// From the rename on, the new file is the log: never append to the old (unlinked) one.
	if s.f != nil {
		s.f.Close()
	}
	s.setFile(f, int64(len(data)))
	s.base = s.size
	if err := SyncDir(s.dir); err != nil {
		// The rename may not be durable: rewrite again before the next append is acknowledged.
		s.needRewrite = true
		return fmt.Errorf("cannot sync offset store directory (%s): %w", s.dir, err)
	}
	s.needRewrite = false
	gsCompactionsTotal.Inc()
	return nil
}

// ---- API ----

// CommitAsync durably records offs for group and calls done once they are fsync'd (nil) or could
// not be (the error; nothing became visible). Commits are applied in call order; concurrent
// callers share fsyncs. done runs on the writer goroutine and must not block.
func (s *GroupStore) CommitAsync(group string, offs []GroupOffset, done func(error)) {
	s.enqueue(&gsOp{kind: gsOpCommit, group: group, offs: offs, done: done})
}

// Commit is the blocking form of CommitAsync.
func (s *GroupStore) Commit(group string, offs []GroupOffset) error {
	ch := make(chan error, 1)
	s.CommitAsync(group, offs, func(err error) { ch <- err })
	return <-ch
}

// DeleteGroupAsync durably removes every committed offset of group.
func (s *GroupStore) DeleteGroupAsync(group string, done func(error)) {
	s.enqueue(&gsOp{kind: gsOpDelGrp, group: group, done: done})
}

// DeleteGroup is the blocking form of DeleteGroupAsync.
func (s *GroupStore) DeleteGroup(group string) error {
	ch := make(chan error, 1)
	s.DeleteGroupAsync(group, func(err error) { ch <- err })
	return <-ch
}

// DeleteOffsetsAsync durably removes the committed offsets of parts in group.
func (s *GroupStore) DeleteOffsetsAsync(group string, parts []GroupPartition, done func(error)) {
	s.enqueue(&gsOp{kind: gsOpDelOffs, group: group, parts: parts, done: done})
}

// DeleteOffsets is the blocking form of DeleteOffsetsAsync.
func (s *GroupStore) DeleteOffsets(group string, parts []GroupPartition) error {
	ch := make(chan error, 1)
	s.DeleteOffsetsAsync(group, parts, func(err error) { ch <- err })
	return <-ch
}

// Offset returns the committed offset of one partition.
func (s *GroupStore) Offset(group, topic string, partition int32) (GroupOffset, bool) {
	s.mu.RLock()
	o, ok := s.groups[group][GroupPartition{topic, partition}]
	s.mu.RUnlock()
	return o, ok
}

// Offsets returns every committed offset of group, sorted by topic then partition.
func (s *GroupStore) Offsets(group string) []GroupOffset {
	s.mu.RLock()
	g := s.groups[group]
	out := make([]GroupOffset, 0, len(g))
	for _, o := range g {
		out = append(out, o)
	}
	s.mu.RUnlock()
	sortOffsets(out)
	return out
}

// HasGroup reports whether group has at least one committed offset, an open transaction's
// staged offsets (Apache loads a group that only has pending transactional offsets as Empty) or
// persisted metadata.
func (s *GroupStore) HasGroup(group string) bool {
	s.mu.RLock()
	_, ok := s.groups[group]
	if !ok {
		_, ok = s.pending[group]
	}
	if !ok {
		_, ok = s.meta[group]
	}
	if !ok {
		_, ok = s.cmeta[group]
	}
	s.mu.RUnlock()
	return ok
}

// Groups lists every group with committed or pending offsets or persisted metadata, sorted.
func (s *GroupStore) Groups() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.groupNamesLocked()
}

// StageTxnOffsets durably stages offs as producerID's transactional offsets for group
// (TxnOffsetCommit) and calls done once they are fsync'd (nil) or could not be (nothing changed).
// Staged offsets are invisible to Offset/Offsets until CompleteTxnOffsets commits them; a later
// staging for the same (group, producerID, partition) overwrites the earlier one. producerEpoch is
// kept (the highest seen) with the staged set for the coordinator's fencing. Ordered with every
// other operation; done runs on the writer goroutine and must not block.
func (s *GroupStore) StageTxnOffsets(group string, producerID int64, producerEpoch int16, offsets []GroupOffset, done func(error)) {
	s.enqueue(&gsOp{kind: gsOpStage, group: group, pid: producerID, epoch: producerEpoch, offs: offsets, done: done})
}

// CompleteTxnOffsets ends producerID's transaction for group: commit moves every staged offset
// into the committed set in one durable record (a partition committed by a plain OffsetCommit after
// its staging keeps the plain commit, as in Apache), abort discards them. Idempotent: with nothing
// staged it changes nothing (still acknowledged only once durable, so it is ordered after every
// earlier staging). done runs on the writer goroutine and must not block.
func (s *GroupStore) CompleteTxnOffsets(group string, producerID int64, commit bool, done func(error)) {
	kind := byte(gsOpTxnAbrt)
	if commit {
		kind = gsOpTxnCmt
	}
	s.enqueue(&gsOp{kind: kind, group: group, pid: producerID, done: done})
}

// HasPending reports whether group has transactional offsets staged for the partition and not
// yet committed or aborted (OffsetFetch require_stable answers UNSTABLE_OFFSET_COMMIT then, per
// partition, as Apache's hasPendingOffsetCommitsForTopicPartition).
func (s *GroupStore) HasPending(group, topic string, partition int32) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	gp := GroupPartition{topic, partition}
	for _, pe := range s.pending[group] {
		if _, ok := pe.offs[gp]; ok {
			return true
		}
	}
	return false
}

// PendingProducers lists, sorted, the producer ids with staged offsets in group (open
// transactions the transaction coordinator still has to complete).
func (s *GroupStore) PendingProducers(group string) []int64 {
	s.mu.RLock()
	out := make([]int64, 0, len(s.pending[group]))
	for pid := range s.pending[group] {
		out = append(out, pid)
	}
	s.mu.RUnlock()
	slices.Sort(out)
	return out
}

// PendingEpoch returns the highest producer epoch that staged offsets for (group, producerID) in
// the open transaction, if any.
func (s *GroupStore) PendingEpoch(group string, producerID int64) (int16, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pe := s.pending[group][producerID]
	if pe == nil {
		return 0, false
	}
	return pe.epoch, true
}

// PendingOffsets returns (group, producerID)'s staged offsets, sorted by topic then partition.
func (s *GroupStore) PendingOffsets(group string, producerID int64) []GroupOffset {
	s.mu.RLock()
	pe := s.pending[group][producerID]
	var out []GroupOffset
	if pe != nil {
		out = make([]GroupOffset, 0, len(pe.offs))
		for _, po := range pe.offs {
			out = append(out, po.GroupOffset)
		}
	}
	s.mu.RUnlock()
	sortOffsets(out)
	return out
}

func sortOffsets(out []GroupOffset) {
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
}

// Close stops the writer after every queued operation completed and closes the file.
func (s *GroupStore) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	s.closeMu.Unlock()
	s.writer.Wait()
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("cannot close offset store (%s): %w", s.path, err)
	}
	return nil
}

// readGroupOffset decodes one committed or staged offset (the same fields in both ops).
func readGroupOffset(r *framelog.Reader) GroupOffset {
	var o GroupOffset
	o.Topic = r.Str("topic")
	o.Partition = int32(r.Varint("partition"))
	o.Offset = r.Varint("offset")
	o.LeaderEpoch = int32(r.Varint("leader epoch"))
	o.Metadata = r.Str("metadata")
	o.CommitTimeMs = r.Varint("commit time")
	return o
}
