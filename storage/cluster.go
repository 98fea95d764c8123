package storage

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kaas-go/kaas/codec"
	"go.uber.org/zap"
)

// Cluster mode of the partition store (design cluster.md §2).
//
// Every broker of a cluster mounts one shared volume. The volume offers close-to-open
// consistency and nothing else: no lock, no conditional write, and a dead host's page cache may
// be written back late, in any order, into files a successor has already read. So the writers
// fence themselves:
//
//   - One writer per file name. A leader at epoch E creates only files named with E:
//     <base %020d>-<E %010d>.{log,index,timeindex,txnindex}, <offset>-<E>.snapshot and
//     epoch-<E>.json. Single-broker names (no suffix) are read as epoch 0.
//   - epoch-<E>.json is written (tmp + fsync + rename + directory fsync) before the leader
//     serves. It records where the previous epoch's data ends (prev: segment, end in bytes, end
//     offset). That end is authoritative: bytes past it (a zombie's late write-back) are ignored
//     forever, as are later segments of that epoch. A segment of epoch X counts only if
//     epoch-X.json exists (or X is 0), so a taker that crashed mid-takeover leaves nothing the
//     next taker reads.
//   - A successor never truncates, renames or deletes another epoch's file: it opens them
//     read-only and keeps their logical end in memory (segment.size). What it learns by
//     scanning a crashed epoch's open segment (indexes, aborted transactions) it keeps in
//     files of its own epoch (epoch-<E>.prev.ckpt / .prev.txnindex, recovery_ckpt.go), so the
//     next takeover of the chain scans nothing. Files of its own epoch left by an earlier,
//     failed TakeOver at the same epoch are removed first.
//   - Rule P (Config.Publish): nothing is published unless it is durable and the lease deadline
//     has not passed, checked after the sync.
//
// Takeover of one partition at epoch E (Store.TakeOver):
//
//	                 ┌─ graceful (h.Release != nil) ─► open the holder's sealed segment at the
//	 list dir fresh ─┤   recorded end (indexes + snapshot, no scan, no salvage)
//	 (epoch files,   └─ crash ─► scan the open segment from its recovery checkpoint to the first
//	  segments)           bad/zero batch (nothing cut), rebuild producer + txn state, salvage
//	                      the dead holder's WAL
//	                        │ base < LEO: skip │ base == LEO: append │ base > LEO: ErrSalvageGap
//	                        ▼
//	   new segment <LEO>-<E>.log ─► salvaged batches ─► fsync ─► epoch-E.json ─► Rule P ─► HWM = LEO,
//	                                                                                      Loaded()
//
// Release (Store.Release) is the holder's side of a graceful handover: refuse appends (6), let
// the in-flight WAL round finish, fsync, snapshot, write the active segment's indexes, close the
// files and return the ReleaseRecord the successor opens from.

// Errors of cluster mode.
var (
	// ErrSalvageGap: the previous holder's WAL holds a record of the partition past the log end
	// found on the volume, so an acknowledged record is missing. TakeOver refuses (it never
	// guesses); nothing is written.
	ErrSalvageGap = errors.New("an acknowledged record is missing: the previous holder's write-ahead log continues past the log end on the volume")
	// ErrFenced: Rule P failed (Config.Publish returned false after a durability point). Nothing
	// is published any more; it maps to NOT_LEADER_OR_FOLLOWER (6).
	ErrFenced = errors.New("the lease deadline passed: this broker publishes nothing more")
)

// Handover describes the previous holder of a partition for TakeOver.
type Handover struct {
	// Release is the holder's release record (graceful handover); nil = crash (its lease is gone).
	Release *ReleaseRecord
	// PrevWALDir is the previous holder's WAL directory, salvaged after a crash ("" = none).
	PrevWALDir string
	PrevInc    string
	PrevEpoch  int32
}

// ReleaseRecord is what Store.Release leaves for the successor: the holder's incarnation and
// epoch, its active segment's file name and logical end in bytes, and the log end offset.
type ReleaseRecord struct {
	Inc       string `json:"inc"`
	Epoch     int32  `json:"epoch"`
	Segment   string `json:"segment"`
	End       int64  `json:"end"`
	EndOffset int64  `json:"endOffset"`
}

// TakeoverStats reports one TakeOver: bytes scanned by the recovery scan (0 for a graceful
// handover), WAL records (batches) salvaged, and the wall time.
type TakeoverStats struct {
	Scanned  int64
	Salvaged int
	Duration time.Duration
}

// epochRecord is <partition dir>/epoch-<E>.json.
type epochRecord struct {
	Epoch       int32         `json:"epoch"`
	Broker      int32         `json:"broker"`
	Inc         string        `json:"inc"`
	StartOffset int64         `json:"startOffset"`
	Prev        *epochPrev    `json:"prev,omitempty"`
	Salvaged    *epochSalvage `json:"salvaged,omitempty"`
}

// epochPrev is where the previous epoch's data ends: Segment is a file name in the partition
// directory, End its valid length in bytes, EndOffset the offset after its last batch.
type epochPrev struct {
	Epoch     int32  `json:"epoch"`
	Segment   string `json:"segment"`
	End       int64  `json:"end"`
	EndOffset int64  `json:"endOffset"`
}

// epochSalvage is the range [From, To) salvaged from WALDir.
type epochSalvage struct {
	WALDir string `json:"walDir"`
	From   int64  `json:"from"`
	To     int64  `json:"to"`
}

func epochRecordName(e int32) string { return fmt.Sprintf("epoch-%d.json", e) }

// ClusterWALDir is broker's WAL directory for incarnation inc on the shared volume dataDir
// (Config.WALDir; Handover.PrevWALDir of a successor): dataDir/__cluster/wal/b<id>-i<inc>.
func ClusterWALDir(dataDir string, broker int32, inc string) string {
	return filepath.Join(dataDir, "__cluster", "wal", fmt.Sprintf("b%d-i%s", broker, inc))
}

// parseEpochRecordName returns E for "epoch-<E>.json".
func parseEpochRecordName(name string) (int32, bool) {
	s, ok := strings.CutPrefix(name, "epoch-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".json")
	if !ok {
		return 0, false
	}
	e, err := strconv.ParseInt(s, 10, 32)
	if err != nil || e < 0 || strconv.Itoa(int(e)) != s {
		return 0, false
	}
	return int32(e), true
}

// readEpochRecords reads every epoch file of a partition directory (fresh listing: the caller
// just opened the directory).
func readEpochRecords(dir string) (map[int32]*epochRecord, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int32]*epochRecord{}
	for _, e := range ents {
		ep, ok := parseEpochRecordName(e.Name())
		if !ok {
			continue
		}
		buf, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("cannot read epoch file (%s): %w", filepath.Join(dir, e.Name()), err)
		}
		var r epochRecord
		if err := json.Unmarshal(buf, &r); err != nil || r.Epoch != ep {
			// Written tmp + fsync + rename: never partial. A bad one is foreign damage.
			return nil, fmt.Errorf("cannot parse epoch file (%s): bad content", filepath.Join(dir, e.Name()))
		}
		out[ep] = &r
	}
	return out, nil
}

// publishOK is Rule P: true unless Config.Publish says the lease deadline passed (then the store
// is fenced for good). Called once per durability point, after it.
func (s *Store) publishOK() bool {
	if s.fenced.Load() {
		return false
	}
	if s.cfg.Publish == nil || s.cfg.Publish() {
		return true
	}
	s.fence()
	return false
}

// fence stops all publication: appends and reads answer 6 and every pending ack fails with
// ErrFenced. The waiters are failed from a goroutine (fence may run under a partition's mu).
func (s *Store) fence() {
	if s.fenced.Swap(true) {
		return
	}
	publishRefusedTotal.Inc()
	s.log.Error("lease deadline passed after a durability point: nothing more is published (Rule P); the broker must fail-stop")
	go func() {
		for _, t := range s.Topics() {
			for _, p := range *t.parts.Load() {
				p.completeWaiters(ErrFenced)
			}
		}
	}()
}

// Fenced reports whether Rule P failed once (the store publishes nothing any more).
func (s *Store) Fenced() bool { return s.fenced.Load() }

// unloadedPartition is a partition of a Lazy store before TakeOver: reachable, Loaded() false,
// answering NOT_LEADER_OR_FOLLOWER like a released one.
func unloadedPartition(t *Topic, id int32, dir string, s *Store) *Partition {
	p := &Partition{
		topic: t, id: id, dir: dir, fs: s.fs, log: s.log.With(zap.String("topic", t.Name), zap.Int32("partition", id)),
		interval: int64(s.cfg.IndexIntervalBytes), flushedMaxTs: -1, flushedMaxOff: -1,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		zkick: make(chan struct{}, 1), zdone: make(chan struct{}),
		producers: newProducerState(), epochs: implicitEpochs, nameEpoch: noEpoch,
		closed: true, wclosed: true,
	}
	empty := []*segment{}
	p.segs.Store(&empty)
	ch := make(chan struct{})
	close(ch)
	p.changed.Store(&ch)
	p.released.Store(true)
	return p
}

// EnsureTopic creates topic name with the given id, partition count and config overrides, or
// loads it if it exists with that id (on the volume or in memory): two brokers racing on one
// shared directory both end with the same topic. topic.json is written tmp + rename with a
// temporary name of this incarnation's own, so a reader never sees a partial file. A topic of

// EnsureNewTopic is EnsureTopic for the broker that has just registered name with id in etcd
// (it won the create-if-absent): a directory of any other id is a leftover of a deleted
// incarnation of the name (its deleter crashed before parking it, or parked late) and is parked
// first. Only the creator may do this; an agent acting on a possibly stale view must not.
func (s *Store) EnsureNewTopic(name string, id [16]byte, partitions int32, configs map[string]string) (*Topic, error) {
	if err := ValidateTopicName(name); err != nil {
		return nil, err
	}
	if t := s.Topic(name); t != nil && t.ID != id {
		if err := s.ForgetTopic(name); err != nil && !errors.Is(err, ErrUnknownTopic) {
			return nil, err
		}
	}
	if err := s.parkStaleDir(name, id, false); err != nil {
		return nil, err
	}
	return s.EnsureTopic(name, id, partitions, configs)
}

// that name with another id is ErrTopicExists. In a Lazy store the partitions are not loaded.
func (s *Store) EnsureTopic(name string, id [16]byte, partitions int32, configs map[string]string) (*Topic, error) {
	if err := ValidateTopicName(name); err != nil {
		return nil, err
	}
	if partitions < 1 || partitions > maxPartitions {
		return nil, fmt.Errorf("%w: %d", ErrInvalidPartitions, partitions)
	}
	if t := s.Topic(name); t != nil {
		if t.ID != id {
			return nil, fmt.Errorf("%w: %s has id %x, not %x", ErrTopicExists, name, t.ID, id)
		}
		return t, s.EnsurePartitions(name, partitions)
	}
	cfg, err := ParseTopicConfigs(s.defaults, configs)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if t := s.topics[name]; t != nil {
		// Created meanwhile by another caller of this store.
		if t.ID != id {
			return nil, fmt.Errorf("%w: %s has id %x, not %x", ErrTopicExists, name, t.ID, id)
		}
		return t, nil
	}
	if o := s.byID[id]; o != nil {
		return nil, fmt.Errorf("%w: id %x belongs to topic %s, not %s", ErrTopicExists, id, o.Name, name)
	}
	dir := filepath.Join(s.topicsDir(), name)
	overrides := make(map[string]string, len(configs))
	for k, v := range configs {
		overrides[k] = v
	}
	onDisk := int32(0)
	if m, err := readTopicMeta(dir); err == nil {
		if m.ID != hex.EncodeToString(id[:]) {
			return nil, fmt.Errorf("%w: %s has id %s on the volume, not %x", ErrTopicExists, name, m.ID, id)
		}
		partitions = max(partitions, m.Partitions)
		onDisk = m.Partitions
		if m.Configs != nil {
			overrides = m.Configs
			if cfg, err = ParseTopicConfigs(s.defaults, overrides); err != nil {
				return nil, err
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cannot read topic metadata (%s): %w", dir, err)
	}
	t := &Topic{Name: name, ID: id, store: s, dir: dir, overrides: overrides}
	t.cfg.Store(&cfg)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create topic dir (%s): %w", name, err)
	}
	if err := SyncDir(s.topicsDir()); err != nil {
		return nil, fmt.Errorf("cannot sync topics dir (%s): %w", name, err)
	}
	parts, err := s.newPartitions(t, 0, partitions)
	if err != nil {
		return nil, fmt.Errorf("cannot create topic (%s): %w", name, err)
	}
	if partitions > onDisk {
		// Only the first broker (or one growing it) writes: the others found the same file.
		if err := t.writeMeta(partitions, overrides); err != nil {
			for _, p := range parts {
				_ = p.shutdown(false)
			}
			return nil, err
		}
	}
	t.parts.Store(&parts)
	s.topics[name] = t
	s.byID[id] = t
	return t, nil
}

// EnsurePartitions grows topic name to total partitions; a count at or below the current one is
// not an error (idempotent: every broker applies the registry's count).
func (s *Store) EnsurePartitions(name string, total int32) error {
	t := s.Topic(name)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, name)
	}
	if total > maxPartitions {
		return fmt.Errorf("%w: %d", ErrInvalidPartitions, total)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.parts.Load()
	if total <= int32(len(cur)) {
		return nil
	}
	added, err := s.newPartitions(t, int32(len(cur)), total)
	if err != nil {
		return fmt.Errorf("cannot create partitions (%s): %w", name, err)
	}
	if disk, err := readTopicMeta(t.dir); err != nil || disk.Partitions < total {
		if err := t.writeMeta(total, t.overrides); err != nil {
			for _, p := range added {
				_ = p.shutdown(false)
			}
			return err
		}
	}
	all := append(append(make([]*Partition, 0, total), cur...), added...)
	t.parts.Store(&all)
	return nil
}

// readTopicMeta reads dir/topic.json.
func readTopicMeta(dir string) (*topicMeta, error) {
	path := filepath.Join(dir, topicMetaFile)
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m topicMeta
	if err := json.Unmarshal(buf, &m); err != nil {
		return nil, fmt.Errorf("cannot parse topic metadata (%s): %w", path, err)
	}
	return &m, nil
}

// newPartitions makes partitions [from, to) of t: unloaded ones in a Lazy store, opened ones
// otherwise.
func (s *Store) newPartitions(t *Topic, from, to int32) ([]*Partition, error) {
	if !s.cfg.Lazy {
		return s.openPartitions(t, from, to)
	}
	parts := make([]*Partition, 0, to-from)
	for i := from; i < to; i++ {
		parts = append(parts, unloadedPartition(t, i, filepath.Join(t.dir, strconv.Itoa(int(i))), s))
	}
	return parts, nil
}

// tmpSuffix is the temporary-file suffix of this store's atomic writes: in cluster mode it names
// the incarnation, so two brokers writing the same file (topic.json) never share a temp file.
func (s *Store) tmpSuffix() string {
	if s.cfg.Incarnation == "" {
		return ".tmp"
	}
	return "." + s.cfg.Incarnation + ".tmp"
}

// segFile is a segment file found in a partition directory.
type segFile struct {
	base      int64
	nameEpoch int32 // as named (noEpoch: unsuffixed)
	epoch     int32 // logical: noEpoch reads as 0
	name      string
	capEnd    int64      // recorded end in bytes (-1: none)
	capNext   int64      // recorded end offset
	capBy     int32      // the epoch whose file recorded the end
	clean     *cleanFile // a cleaned segment of the winning clean manifest (cleaner_cluster.go)
}

// partitionView is what a fresh listing of a partition directory says is valid.
type partitionView struct {
	records map[int32]*epochRecord
	segs    []segFile        // valid segments by base, capped where an epoch file says so
	epochTo map[int32]int64  // recorded end offset of an epoch (snapshots above it are a zombie's)
	valid   func(int32) bool // whether files named with that epoch count
	// Log compaction (cleaner_cluster.go): the manifests found, newest first, and the winner
	// whose files replace every segment below its cleanEnd (nil: none).
	manifests []*cleanManifest
	clean     *cleanManifest
}

// readPartitionView lists dir and applies the epoch chain (see the top of this file) for a taker
// at epoch.
func readPartitionView(dir string, epoch int32) (*partitionView, error) {
	recs, err := readEpochRecords(dir)
	if err != nil {
		return nil, err
	}
	v := &partitionView{records: recs, epochTo: map[int32]int64{}}
	for e := range recs {
		if e >= epoch {
			return nil, fmt.Errorf("cannot take over at epoch %d (%s): %s exists", epoch, dir, epochRecordName(e))
		}
	}
	v.valid = func(e int32) bool { return e <= 0 || recs[e] != nil }
	// Caps: the earliest successor's record of each epoch is authoritative.
	type cap struct {
		seg       string
		base      int64
		end, next int64
		by        int32
	}
	caps := map[int32]cap{}
	order := make([]int32, 0, len(recs))
	for e := range recs {
		order = append(order, e)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	for _, e := range order {
		pr := recs[e].Prev
		if pr == nil {
			continue
		}
		if _, seen := caps[pr.Epoch]; seen {
			continue
		}
		b, _, ok := parseEpochName(pr.Segment, ".log")
		if !ok {
			return nil, fmt.Errorf("cannot parse epoch file (%s): bad prev segment %q", filepath.Join(dir, epochRecordName(e)), pr.Segment)
		}
		caps[pr.Epoch] = cap{seg: pr.Segment, base: b, end: pr.End, next: pr.EndOffset, by: e}
		v.epochTo[pr.Epoch] = pr.EndOffset
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, de := range ents {
		base, ne, ok := parseEpochName(de.Name(), ".log")
		if !ok {
			continue
		}
		le := max(ne, 0)
		if !v.valid(le) || le >= epoch {
			continue // a crashed taker's files, or (same epoch) an earlier attempt of this one
		}
		sf := segFile{base: base, nameEpoch: ne, epoch: le, name: de.Name(), capEnd: -1}
		if c, ok := caps[le]; ok {
			switch {
			case base > c.base:
				continue // written by epoch le after its successor recorded its end
			case de.Name() == c.seg:
				sf.capEnd, sf.capNext, sf.capBy = c.end, c.next, c.by
				if c.end == 0 {
					continue // the epoch ended with an empty segment
				}
			}
		}
		v.segs = append(v.segs, sf)
	}
	sort.Slice(v.segs, func(i, j int) bool { return v.segs[i].base < v.segs[j].base })
	names := make([]string, 0, len(ents))
	exists := make(map[string]bool, len(ents))
	for _, de := range ents {
		names = append(names, de.Name())
		exists[de.Name()] = true
	}
	if v.manifests, err = readCleanManifests(dir, names); err != nil {
		return nil, err
	}
	v.applyCleanWinner(cleanWinner(v.manifests, v.valid, epoch, readLogStartFloor(dir), exists), exists)
	for i := 1; i < len(v.segs); i++ {
		if v.segs[i].base == v.segs[i-1].base {
			return nil, fmt.Errorf("cannot take over (%s): segments %s and %s start at the same offset", dir, v.segs[i-1].name, v.segs[i].name)
		}
	}
	return v, nil
}

// TakeOver opens partition part of topic at leader epoch epoch on this broker (cluster mode), as
// the sequence at the top of this file describes, and installs it (Loaded() true, HWM = LEO).
// The caller (the agent, after Rule S) guarantees the previous holder is gone or released. A
// partition already loaded at epoch is left alone. Errors: ErrSalvageGap (nothing written),
// ErrFenced, ErrUnknownTopic, and I/O errors; on any error no epoch file was written.
//
// Lock order: Topic.mu → Partition.mu.
func (s *Store) TakeOver(topic string, part, epoch int32, h Handover) (TakeoverStats, error) {
	start := time.Now()
	var st TakeoverStats
	if s.cfg.Incarnation == "" {
		return st, fmt.Errorf("cannot take over partition (%s-%d): the store is not in cluster mode (no incarnation)", topic, part)
	}
	s.mu.RLock()
	closed := s.closed
	s.mu.RUnlock()
	if closed {
		return st, ErrClosed
	}
	if s.fenced.Load() {
		return st, fmt.Errorf("cannot take over partition (%s-%d): %w", topic, part, ErrFenced)
	}
	t := s.Topic(topic)
	if t == nil {
		return st, fmt.Errorf("%w: %s", ErrUnknownTopic, topic)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.Partition(part)
	if old == nil || s.Topic(topic) != t {
		return st, fmt.Errorf("%w: %s-%d", ErrUnknownTopic, topic, part)
	}
	if old.Loaded() {
		if e := old.LeaderEpoch(); e != epoch {
			return st, fmt.Errorf("cannot take over partition (%s-%d) at epoch %d: loaded here at epoch %d", topic, part, epoch, e)
		}
		return st, nil
	}
	p, err := s.openTakeover(t, part, old.dir, epoch, h, &st)
	if err != nil {
		if errors.Is(err, ErrSalvageGap) {
			salvageGapsTotal.Inc()
			s.log.Error("refusing takeover: acknowledged records are missing", zap.String("topic", topic),
				zap.Int32("partition", part), zap.Int32("epoch", epoch), zap.String("walDir", h.PrevWALDir), zap.Error(err))
		}
		return st, err
	}
	cur := *t.parts.Load()
	next := append([]*Partition(nil), cur...)
	next[part] = p
	t.parts.Store(&next)
	st.Duration = time.Since(start)
	takeoverDuration.UpdateDuration(start)
	salvagedRecordsTotal.Add(st.Salvaged)
	partitionLoadsTotal.Inc()
	s.log.Info("partition taken over", zap.String("topic", topic), zap.Int32("partition", part), zap.Int32("epoch", epoch),
		zap.Bool("graceful", h.Release != nil), zap.Int64("scanned", st.Scanned), zap.Int("salvaged", st.Salvaged),
		zap.Int64("logEndOffset", p.LogEndOffset()), zap.Duration("took", st.Duration))
	return st, nil
}

// salvageSource is the WAL a crash takeover salvages: that of the incarnation that wrote the
// newest epoch file of the partition, which is the last one that can have acknowledged records
// beyond the synced segments. The handover names the previous assignee, and that is usually
// the same incarnation; but an assignee that never loaded the partition (it moved on before
// that broker got to it) forwards its predecessor's handover, and its own WAL holds nothing of
// the partition. Salvaging that one would find no gap and silently miss the real holder's
// acknowledged tail, so the volume's epoch chain decides.
func (s *Store) salvageSource(dir string, epoch int32, h Handover, log *zap.Logger) string {
	recs, err := readEpochRecords(dir)
	if err != nil || len(recs) == 0 {
		return h.PrevWALDir
	}
	newest := int32(-1)
	for e := range recs {
		if e < epoch && e > newest {
			newest = e
		}
	}
	r := recs[newest]
	if r == nil || r.Inc == "" {
		return h.PrevWALDir
	}
	d := ClusterWALDir(s.cfg.Dir, r.Broker, r.Inc)
	if d != h.PrevWALDir {
		log.Warn("salvaging the WAL of the partition's last writer, not of its last assignee",
			zap.String("writer_wal", d), zap.String("assignee_wal", h.PrevWALDir), zap.Int32("writer_epoch", newest))
	}
	return d
}

// openTakeover builds the partition for TakeOver; on error nothing of it stays open.
func (s *Store) openTakeover(t *Topic, id int32, dir string, epoch int32, h Handover, st *TakeoverStats) (*Partition, error) {
	p := &Partition{
		topic: t, id: id, dir: dir, fs: s.fs, log: s.log.With(zap.String("topic", t.Name), zap.Int32("partition", id)),
		interval: int64(s.cfg.IndexIntervalBytes), flushedMaxTs: -1, flushedMaxOff: -1,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		zkick: make(chan struct{}, 1), zdone: make(chan struct{}),
		preallocate: s.cfg.Preallocate,
		wal:         s.wal,
		nameEpoch:   epoch,
	}
	ch := make(chan struct{})
	p.changed.Store(&ch)
	if h.Release == nil {
		h.PrevWALDir = s.salvageSource(dir, epoch, h, p.log)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create partition dir (%s): %w", dir, err)
	}
	if err := SyncDir(t.dir); err != nil {
		return nil, fmt.Errorf("cannot sync topic dir (%s): %w", t.dir, err)
	}
	if err := p.recoverTakeover(epoch, h, st); err != nil {
		p.mu.Lock()
		p.closed = true
		p.untrackAllLocked() // rebuilt producer state was indexed store-wide
		p.mu.Unlock()
		p.closeFiles()
		return nil, fmt.Errorf("cannot take over partition (%s-%d) at epoch %d: %w", t.Name, id, epoch, err)
	}
	if v := p.cleanView; v != nil {
		p.cleanView = nil
		p.gcCleanLeftovers(epoch, v.clean, v.manifests)
	}
	p.loaded.Store(true)
	go p.flushLoop()
	go p.zeroLoop()
	return p, nil
}

// recoverTakeover is recoverLog for a partition written by other epochs (see the top of this
// file). Nothing is written to another epoch's file.
func (p *Partition) recoverTakeover(epoch int32, h Handover, st *TakeoverStats) error {
	// A single broker that crashed in the middle of a cleaner swap (cleaner.go) left a marker
	// and a mix of old and new files that only its own next open would make whole; finish
	// that first, as it would have. This is the one place a successor renames and deletes
	// another epoch's files: the marker and the *.cleaned files are only ever written by a
	// single broker (epoch 0), which no longer runs once the cluster owns the volume, and a
	// cluster-mode clean commits with a manifest instead (cleaner_cluster.go).
	if err := recoverCleanerSwap(p.dir, p.log); err != nil {
		return err
	}
	v, err := readPartitionView(p.dir, epoch)
	if err != nil {
		return err
	}
	if err := removeEpochLeftovers(p.dir, epoch); err != nil {
		return err
	}
	p.cleanView = v
	if v.clean != nil {
		p.cleanWinner = v.clean
		p.cleanedTo.Store(v.clean.CleanEnd)
	}
	p.snapOK = func(f snapFile) bool {
		le := max(f.epoch, 0)
		if !v.valid(le) || le >= epoch {
			return false
		}
		end, capped := v.epochTo[le]
		return !capped || f.off <= end
	}
	var segs []*segment
	var loadedAborted []AbortedTxn
	badTxnBase := int64(math64Max)
	p.segs.Store(&segs)
	rel := h.Release
	var scannedOpen *segment // the dead holder's open segment, scanned here
	for i, sf := range v.segs {
		f, err := p.fs.OpenFile(filepath.Join(p.dir, sf.name), os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		seg := newSegment(p.dir, sf.base, f)
		seg.epoch, seg.foreign = sf.nameEpoch, true
		segs = append(segs, seg)
		p.segs.Store(&segs)
		last := i == len(v.segs)-1
		if sf.clean != nil {
			// A cleaned segment of the winning manifest: complete by construction (no cap), and
			// its .txnindex alone holds the aborted transactions of its range (the originals'
			// files and the prev checkpoints of a capped original there are not read).
			if last {
				return fmt.Errorf("the newest valid segment %s is a cleaned one: the segments after clean end %d are missing", sf.name, v.clean.CleanEnd)
			}
			ents, txnOK, n, err := p.openCleanedSegment(seg, sf.clean)
			if err != nil {
				return err
			}
			st.Scanned += n
			if txnOK {
				loadedAborted = append(loadedAborted, ents...)
			} else {
				badTxnBase = min(badTxnBase, seg.base)
			}
			continue
		}
		var size, next int64
		switch {
		case sf.capEnd >= 0:
			size, next = sf.capEnd, sf.capNext
		case last && rel != nil:
			if rel.Segment != sf.name || rel.Epoch != sf.epoch {
				return fmt.Errorf("release record names segment %s of epoch %d, the newest valid segment is %s", rel.Segment, rel.Epoch, sf.name)
			}
			size, next = rel.End, rel.EndOffset
		case last:
			// The dead holder's open segment: scan to the first bad or zero batch.
			n, err := seg.scanTo(p.interval, -1)
			if err != nil {
				return err
			}
			st.Scanned += n
			badTxnBase = min(badTxnBase, seg.base) // it has no .txnindex: the replay covers it
			scannedOpen = seg
			continue
		default:
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			size, next = fi.Size(), v.segs[i+1].base
		}
		if sf.capEnd > 0 {
			// The open segment of a crashed epoch: the taker that capped it left its indexes
			// and aborted transactions under its own epoch's names.
			if ents, ok := seg.loadPrevCheckpoint(p.dir, sf.capBy, size, next); ok {
				loadedAborted = append(loadedAborted, ents...)
				continue
			}
		}
		if ents, ok := seg.loadTxnIndex(next); ok {
			loadedAborted = append(loadedAborted, ents...)
		} else {
			badTxnBase = min(badTxnBase, seg.base)
		}
		if seg.loadIndexes(size, next) {
			if last && rel != nil {
				if err := checkEndOffset(seg, next); err != nil {
					return fmt.Errorf("released segment %s does not end as recorded: %w", sf.name, err)
				}
			}
			continue
		}
		if last && rel != nil {
			// Its indexes did not load (a segment whose batches carry no timestamp has no time
			// index, for one): verify the recorded end by a scan instead.
			p.log.Warn("released segment's indexes did not load; scanning it", zap.String("segment", sf.name))
			sf.capEnd, sf.capNext = rel.End, rel.EndOffset
		}
		// A closed segment without a recorded end may be a cleaned one (offset gaps: a
		// single broker's clean); a recorded end is an open segment's, which is never cleaned.
		n, err := seg.scanRange(p.interval, size, sf.capEnd < 0)
		if err != nil {
			return err
		}
		st.Scanned += n
		got, _, _ := seg.stats()
		valid := seg.size.Load()
		switch {
		case sf.capEnd >= 0 && (valid != size || got != next):
			return fmt.Errorf("segment %s holds valid batches up to byte %d (offset %d), its recorded end is byte %d (offset %d)",
				sf.name, valid, got, size, next)
		case valid != size:
			// A closed segment was fsync'd before it was closed: media damage. Its tail stays
			// a gap (the file is not cut: it is not ours), as recoverLog does for its own.
			p.log.Error("closed segment of an earlier epoch is damaged; its tail is ignored",
				zap.String("segment", sf.name), zap.Int64("valid", valid), zap.Int64("size", size))
		}
		seg.mu.Lock()
		seg.next = next
		seg.mu.Unlock()
	}
	leo := int64(0)
	if n := len(segs); n > 0 {
		leo, _, _ = segs[n-1].stats()
	}
	p.leoLocal = leo
	p.leo.Store(leo)
	p.durableEnd = leo
	p.hwm.Store(leo)
	if len(segs) > 0 {
		p.logStart.Store(segs[0].base)
		p.startDurable = segs[0].base
	}
	if ck := p.loadLogStart(); ck > p.startDurable {
		p.logStart.Store(min(ck, leo))
		p.startDurable = ck
	}
	// Producer state and the txn index (recoverLog's step 3 and 4). A graceful handover has a
	// snapshot at the recorded end: nothing is replayed.
	if len(segs) > 0 {
		if err := p.rebuildProducersLocked(leo, min(leo, badTxnBase), loadedAborted); err != nil {
			return err
		}
	} else {
		p.installProducersLocked(newProducerState(), nil)
	}
	// Salvage (crash only): check everything before writing anything.
	var salvage []codec.Batch
	if rel == nil && h.PrevWALDir != "" {
		if salvage, err = p.collectSalvage(h.PrevWALDir, leo); err != nil {
			return err
		}
	}
	// Where the previous epoch ends, for epoch-E.json.
	var prev *epochPrev
	if n := len(segs); n > 0 {
		ls := segs[n-1]
		prev = &epochPrev{Epoch: max(ls.epoch, 0), Segment: ls.name(".log"), End: ls.size.Load(), EndOffset: leo}
	}
	// The new leader's own segment. An empty foreign last segment stays on disk but out of the
	// list (it would share the base offset).
	if n := len(segs); n > 0 && segs[n-1].size.Load() == 0 {
		_ = segs[n-1].f.Close()
		segs = segs[:n-1]
		p.segs.Store(&segs)
	}
	active, err := p.createSegment(leo)
	if err != nil {
		return err
	}
	for _, s := range segs {
		s.seal()
	}
	segs = append(segs, active)
	p.segs.Store(&segs)
	p.active = active
	p.durablePos = 0
	if len(segs) == 1 {
		p.logStart.Store(max(p.logStart.Load(), active.base))
	}
	p.closed = false
	for _, b := range salvage {
		res := p.append(b, time.Now().UnixMilli(), kindReplay, 0, markerArgs{})
		if res.Code != codec.CodeNone {
			return fmt.Errorf("cannot append salvaged batch at offset %d: code %d", b.BaseOffset(), res.Code)
		}
		st.Salvaged++
	}
	if err := p.active.f.Sync(); err != nil {
		return fmt.Errorf("cannot fsync segment %s: %w", p.active.name(".log"), err)
	}
	if err := SyncDir(p.dir); err != nil {
		return err
	}
	p.durablePos = p.active.size.Load()
	_, p.flushedMaxTs, p.flushedMaxOff = p.active.stats()
	rec := epochRecord{Epoch: epoch, Broker: p.topic.store.cfg.BrokerID, Inc: p.topic.store.cfg.Incarnation,
		StartOffset: p.leoLocal, Prev: prev}
	if len(salvage) > 0 {
		rec.Salvaged = &epochSalvage{WALDir: h.PrevWALDir, From: leo, To: p.leoLocal}
	}
	buf, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := writeFileAtomicTmp(p.dir, epochRecordName(epoch), epochRecordName(epoch)+p.topic.store.tmpSuffix(), buf); err != nil {
		return fmt.Errorf("cannot write epoch file: %w", err)
	}
	if scannedOpen != nil && scannedOpen.size.Load() > 0 {
		p.writePrevCheckpoint(scannedOpen, epoch, leo)
	}
	v.records[epoch] = &rec
	p.epochs = epochCache(v.records, p.leoLocal)
	p.leaderEpoch.Store(epoch)
	if !p.topic.store.publishOK() {
		return ErrFenced
	}
	p.publishHWMCheckedLocked(p.leoLocal)
	return nil
}

const math64Max = int64(^uint64(0) >> 1)

// removeEpochLeftovers removes the files named with epoch that an earlier, failed TakeOver at
// this same epoch left (no epoch file was written, so nobody reads them): they are this
// leader's own names, and once epoch-E.json exists a stale one would count.
func removeEpochLeftovers(dir string, epoch int32) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	prevPrefix := fmt.Sprintf("epoch-%d.prev.", epoch)
	cleanPrefix := fmt.Sprintf("clean-%d-", epoch)
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, prevPrefix) || strings.HasPrefix(name, cleanPrefix) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("cannot remove leftover of an earlier takeover at epoch %d (%s): %w", epoch, name, err)
			}
			continue
		}
		i := strings.IndexByte(name, '.')
		if i < 0 {
			continue
		}
		if _, ep, ok := parseEpochName(name, name[i:]); ok && ep == epoch {
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("cannot remove leftover of an earlier takeover at epoch %d (%s): %w", epoch, name, err)
			}
		}
	}
	return nil
}

// epochCache derives the leader-epoch cache (leader_epoch.go) from the epoch files: epoch 0
// from offset 0 below the first, then each epoch from its start offset. An epoch that appended
// nothing is superseded by the next one at the same start (Apache's LeaderEpochFileCache.assign).
func epochCache(recs map[int32]*epochRecord, leo int64) []epochEntry {
	es := make([]int32, 0, len(recs))
	for e := range recs {
		es = append(es, e)
	}
	sort.Slice(es, func(i, j int) bool { return es[i] < es[j] })
	out := []epochEntry{{epoch: 0, start: 0}}
	for _, e := range es {
		start := min(recs[e].StartOffset, leo)
		for len(out) > 0 && out[len(out)-1].start >= start {
			out = out[:len(out)-1]
		}
		if len(out) > 0 && out[len(out)-1].epoch >= e {
			continue
		}
		out = append(out, epochEntry{epoch: e, start: start})
	}
	return out
}

// checkEndOffset verifies that the batches of a sealed segment end at offset next (the headers
// from its last index entry are read).
func checkEndOffset(seg *segment, next int64) error {
	seg.mu.Lock()
	pos := int64(0)
	if n := len(seg.index); n > 0 {
		pos = int64(seg.index[n-1].pos)
	}
	seg.mu.Unlock()
	r := batchReader{f: seg.f, pos: pos, end: seg.size.Load()}
	last := seg.base - 1
	for {
		b, status, err := r.next(false)
		if err != nil {
			return err
		}
		if status == batchEOF {
			break
		}
		if status != batchOK {
			return fmt.Errorf("bad batch at byte %d", r.pos)
		}
		last = b.LastOffset()
	}
	if last+1 != next {
		return fmt.Errorf("batches end at offset %d, recorded %d", last+1, next)
	}
	return nil
}

// collectSalvage reads the previous holder's WAL (read-only, generations in seq order, the
// torn-tail rules of wal.go) and returns this partition's batches from offset leo on, in order.
// A record past the expected offset means an acknowledged record is missing: ErrSalvageGap.
func (p *Partition) collectSalvage(dir string, leo int64) ([]codec.Batch, error) {
	var out []codec.Batch
	expect := leo
	_, _, err := scanWAL(dir, false, p.log, func(r *walRecord, seq uint64, pos int) error {
		if r.topicID != p.topic.ID || r.partition != p.id {
			return nil
		}
		b := codec.Batch(append([]byte(nil), r.payload...))
		if len(b) < codec.BatchHeaderSize || int64(b.BatchLength())+codec.LogOverhead != int64(len(b)) ||
			b.Magic() != 2 || b.BaseOffset() != r.base || b.LastOffsetDelta() < 0 || !b.CRCValid() {
			return fmt.Errorf("%w: %s generation %d byte %d: record for %s-%d is not a valid batch",
				errWALCorrupt, dir, seq, pos, p.topic.Name, p.id)
		}
		switch {
		case r.base < expect:
			return nil
		case r.base > expect:
			return fmt.Errorf("%w (%s-%d): %s holds offset %d, the log ends at %d", ErrSalvageGap, p.topic.Name, p.id, dir, r.base, expect)
		}
		out = append(out, b)
		expect = b.LastOffset() + 1
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot salvage write-ahead log (%s): %w", dir, err)
	}
	return out, nil
}

// Release is the holder's side of a graceful handover of partition part of topic: new appends
// answer NOT_LEADER_OR_FOLLOWER (6), the in-flight WAL round finishes (its acks still under
// Rule P), the segment is fsync'd, a producer snapshot and the active segment's indexes are
// written, and the files are closed. The record it returns is what the successor's TakeOver
// opens from without a scan.
func (s *Store) Release(topic string, part int32) (ReleaseRecord, error) {
	t := s.Topic(topic)
	if t == nil {
		return ReleaseRecord{}, fmt.Errorf("%w: %s", ErrUnknownTopic, topic)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.Partition(part)
	if p == nil {
		return ReleaseRecord{}, fmt.Errorf("%w: %s-%d", ErrUnknownTopic, topic, part)
	}
	if !p.Loaded() {
		return ReleaseRecord{}, fmt.Errorf("cannot release partition (%s-%d): %w", topic, part, ErrNotLoaded)
	}
	p.mu.Lock()
	p.sealOnClose = true
	p.mu.Unlock()
	partitionReleasesTotal.Inc()
	err := p.release()
	// A clean in flight either committed its manifest before the release closed the partition
	// or commits nothing; wait for it to finish (its reads stop at shutdown, its deletions run
	// to the end) so that nothing of this epoch writes after Release returns.
	// Lock order: Topic.mu → Partition.cleanMu. Likewise retention and DeleteRecords that
	// removed segments before the close finish their checkpoint and deletions (fileOps).
	p.cleanMu.Lock()
	p.cleanMu.Unlock()
	p.fileOps.Wait()
	if err != nil {
		return ReleaseRecord{}, err
	}
	rec := p.releaseRec
	rec.Inc = s.cfg.Incarnation
	if rec.Segment == "" {
		return ReleaseRecord{}, fmt.Errorf("cannot release partition (%s-%d): the active segment was not sealed", topic, part)
	}
	return rec, nil
}

// sealActiveLocked (clean shutdown of a partition being released, under mu) writes the active
// segment's indexes and transaction index as a roll does, so the successor trusts them, and
// fills releaseRec.
func (p *Partition) sealActiveLocked() {
	a := p.active
	if err := a.writeIndexes(); err != nil {
		p.log.Warn("cannot write segment indexes", zap.Int64("segment", a.base), zap.Error(err))
		_ = os.Remove(a.path(".index"))
		_ = os.Remove(a.path(".timeindex"))
		return
	}
	if err := a.writeTxnIndex(p.txn.abortedRange(a.base, p.leoLocal)); err != nil {
		p.log.Warn("cannot write transaction index", zap.Int64("segment", a.base), zap.Error(err))
		return
	}
	p.releaseRec = ReleaseRecord{Epoch: p.leaderEpoch.Load(), Segment: a.name(".log"), End: a.size.Load(), EndOffset: p.leoLocal}
}

// RemoveDeadWAL removes a dead incarnation's WAL directory (…/b<id>-i<inc>) if every partition
// with records in it has an epoch file newer than the newest one that incarnation wrote: its
// records are then either in a successor's segments or were salvaged (design §2.5). It
// returns false, nil while some partition is not covered yet; a directory that is already gone
// counts as removed.
func (s *Store) RemoveDeadWAL(dir string) (removed bool, err error) {
	dir = filepath.Clean(dir)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if dir == filepath.Clean(s.walDir()) {
		return false, fmt.Errorf("cannot remove write-ahead log (%s): it is this store's own", dir)
	}
	base := filepath.Base(dir)
	i := strings.LastIndex(base, "-i")
	if i < 0 || i+2 == len(base) {
		return false, fmt.Errorf("cannot remove write-ahead log (%s): the name carries no incarnation (b<id>-i<inc>)", dir)
	}
	inc := base[i+2:]
	type tp struct {
		id   [16]byte
		part int32
	}
	seen := map[tp]bool{}
	if _, _, err := scanWAL(dir, false, s.log, func(r *walRecord, _ uint64, _ int) error {
		seen[tp{r.topicID, r.partition}] = true
		return nil
	}); err != nil {
		return false, fmt.Errorf("cannot read dead write-ahead log (%s): %w", dir, err)
	}
	for k := range seen {
		tdir, err := s.topicDirByID(k.id)
		if err != nil {
			return false, err
		}
		if tdir == "" {
			continue // topic deleted
		}
		recs, err := readEpochRecords(filepath.Join(tdir, strconv.Itoa(int(k.part))))
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		newestDead := int32(-1)
		for e, r := range recs {
			if r.Inc == inc {
				newestDead = max(newestDead, e)
			}
		}
		covered := false
		for e, r := range recs {
			if e > newestDead && r.Inc != inc {
				covered = true
			}
		}
		if !covered {
			return false, nil
		}
	}
	// A partition whose newest epoch is still this incarnation's has not been taken over yet,
	// and its successor salvages this WAL (the last writer's, salvageSource) even when the WAL
	// holds none of its records any more (checkpointed away): keep it until then, or that
	// takeover would find the directory gone.
	for _, t := range s.Topics() {
		for p := int32(0); p < t.NumPartitions(); p++ {
			recs, err := readEpochRecords(filepath.Join(t.dir, strconv.Itoa(int(p))))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return false, err
			}
			newest := int32(-1)
			for e := range recs {
				newest = max(newest, e)
			}
			if r := recs[newest]; r != nil && r.Inc == inc {
				return false, nil
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("cannot remove write-ahead log (%s): %w", dir, err)
	}
	if err := SyncDir(filepath.Dir(dir)); err != nil {
		return true, fmt.Errorf("cannot sync write-ahead log parent dir (%s): %w", filepath.Dir(dir), err)
	}
	deadWALsRemovedTotal.Inc()
	return true, nil
}

// topicDirByID finds a topic's directory by id: a known topic, else any topic.json on the
// volume that carries it (a topic created by another broker since this one last looked); "" if
// none (deleted).
func (s *Store) topicDirByID(id [16]byte) (string, error) {
	if t := s.TopicByID(id); t != nil {
		return t.dir, nil
	}
	ents, err := os.ReadDir(s.topicsDir())
	if err != nil {
		return "", fmt.Errorf("cannot list topics (%s): %w", s.topicsDir(), err)
	}
	want := hex.EncodeToString(id[:])
	for _, e := range ents {
		buf, err := os.ReadFile(filepath.Join(s.topicsDir(), e.Name(), topicMetaFile))
		if err != nil {
			continue
		}
		var m topicMeta
		if json.Unmarshal(buf, &m) == nil && m.ID == want {
			return filepath.Join(s.topicsDir(), e.Name()), nil
		}
	}
	return "", nil
}

// SelfTestVolume checks that dir behaves as the design requires of the shared volume (a sync
// export, close-to-open): a probe file is written and fsync'd, reopened fresh, read back and
// compared, then removed. The error names the directory and the step that failed.
func SelfTestVolume(dir string) error {
	name := filepath.Join(dir, fmt.Sprintf(".kaas-volume-probe-%d-%d", os.Getpid(), time.Now().UnixNano()))
	want := make([]byte, 4096)
	for i := range want {
		want[i] = byte(i*131 + 7)
	}
	copy(want, name)
	fail := func(step string, err error) error {
		_ = os.Remove(name)
		volumeSelfTestFailuresTotal.Inc()
		return fmt.Errorf("cannot self-test volume (%s): %s: %w", dir, step, err)
	}
	if err := WriteFileSynced(name, want); err != nil {
		return fail("write and fsync a probe file", err)
	}
	if err := SyncDir(dir); err != nil {
		return fail("fsync the directory", err)
	}
	f, err := os.Open(name)
	if err != nil {
		return fail("reopen the probe file", err)
	}
	got := make([]byte, len(want)+1)
	n, rerr := f.ReadAt(got, 0)
	_ = f.Close()
	if n != len(want) {
		if rerr == nil {
			rerr = fmt.Errorf("%d bytes", n)
		}
		return fail(fmt.Sprintf("read back %d bytes", len(want)), rerr)
	}
	for i := range want {
		if got[i] != want[i] {
			return fail("compare", fmt.Errorf("byte %d differs", i))
		}
	}
	if err := os.Remove(name); err != nil {
		return fail("remove the probe file", err)
	}
	if err := SyncDir(dir); err != nil {
		return fail("fsync the directory after removal", err)
	}
	return nil
}
