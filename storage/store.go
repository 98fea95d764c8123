package storage

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Store owns every topic's partitions under one data directory.
type Store struct {
	cfg      Config
	fs       FS
	log      *zap.Logger
	defaults TopicConfig

	mu     sync.RWMutex
	topics map[string]*Topic
	byID   map[[16]byte]*Topic
	closed bool

	fences fenceMemory // store-wide fenced epochs (FenceProducer, txn.go)
	pids   pidIndex    // pid → partitions holding producer state or a guard for it (txn.go)

	wal *wal // shared write-ahead log (Config.WAL), nil when off

	// fenced: Rule P failed once (cluster.go); nothing is published any more.
	fenced atomic.Bool

	stopRetention chan struct{}
	retentionDone chan struct{}
	cleaner       *cleaner       // background log cleaner (cleaner.go), nil when off
	bg            sync.WaitGroup // background removal of deleted topics
}

// Topic is one topic: its identity, config and partitions.
type Topic struct {
	Name string
	ID   [16]byte

	store *Store
	dir   string
	cfg   atomic.Pointer[TopicConfig]
	parts atomic.Pointer[[]*Partition]

	mu        sync.Mutex // serialises metadata changes (partitions, overrides)
	overrides map[string]string
	// cfgRev is the cluster registry revision the overrides were last set from (guarded by mu;
	// 0 on a single broker and before the registry was read): see ApplyTopicConfigsAt.
	cfgRev int64
}

// topicMeta is Dir/topics/<name>/topic.json.
type topicMeta struct {
	Name       string            `json:"name"`
	ID         string            `json:"id"` // 32 hex digits
	Partitions int32             `json:"partitions"`
	Configs    map[string]string `json:"configs,omitempty"`
}

const topicMetaFile = "topic.json"

func (s *Store) topicsDir() string  { return filepath.Join(s.cfg.Dir, "topics") }
func (s *Store) deletedDir() string { return filepath.Join(s.cfg.Dir, "deleted") }
func (s *Store) walDir() string {
	if s.cfg.WALDir != "" {
		return s.cfg.WALDir
	}
	return filepath.Join(s.cfg.Dir, walDirName)
}

// ClusterDir is Dir/__cluster, where cluster-wide state (PID blocks, ...) lives.
func (s *Store) ClusterDir() string { return filepath.Join(s.cfg.Dir, "__cluster") }

// Defaults returns the broker-level topic config defaults.
func (s *Store) Defaults() TopicConfig { return s.defaults }

// Open loads every topic and recovers every partition (see Partition recovery).
func Open(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		cfg.Dir = "./data"
	}
	if cfg.IndexIntervalBytes <= 0 {
		cfg.IndexIntervalBytes = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.FS == nil {
		cfg.FS = osFS{}
	}
	if cfg.ProducerIDExpiration <= 0 {
		cfg.ProducerIDExpiration = DefaultProducerIDExpiration
	}
	if cfg.Incarnation != "" && !cfg.Lazy {
		// Opening every partition with single-broker recovery would cut other epochs' files.
		return nil, fmt.Errorf("cannot open store (%s): cluster mode (incarnation %s) requires Lazy", cfg.Dir, cfg.Incarnation)
	}
	s := &Store{
		cfg: cfg, fs: cfg.FS, log: cfg.Logger, defaults: cfg.Defaults.withDefaults(),
		topics: make(map[string]*Topic), byID: make(map[[16]byte]*Topic),
	}
	for _, d := range []string{s.topicsDir(), s.deletedDir(), s.ClusterDir(), s.walDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cannot create data dir (%s): %w", d, err)
		}
	}
	s.purgeDeleted()
	// The WAL directory's own entry must be durable before a record in it is acknowledged (the
	// WAL fsyncs the directory's contents, not its name in the data dir).
	if err := SyncDir(cfg.Dir); err != nil {
		return nil, fmt.Errorf("cannot sync data dir (%s): %w", cfg.Dir, err)
	}
	if cfg.WALDir != "" {
		for d := filepath.Dir(cfg.WALDir); ; d = filepath.Dir(d) {
			if err := SyncDir(d); err != nil {
				return nil, fmt.Errorf("cannot sync write-ahead log parent dir (%s): %w", d, err)
			}
			if d == filepath.Clean(cfg.Dir) || d == filepath.Dir(d) {
				break
			}
		}
	}
	if cfg.Lazy {
		// A cluster broker's WAL is fresh per incarnation: generations in it belong to an
		// incarnation that must be salvaged by a successor, not replayed blindly here.
		if seqs, err := listWALGens(s.walDir(), false); err != nil || len(seqs) > 0 {
			return nil, fmt.Errorf("cannot open write-ahead log (%s): not a fresh directory (%d generations, %v)", s.walDir(), len(seqs), err)
		}
	}
	if cfg.WAL {
		// Partitions pick it up when they open; it starts writing only after the replay below.
		s.wal = newWAL(s.walDir(), s.fs, s.log, cfg.walGenBytes, cfg.walCheckpointEvery)
		s.wal.keep = cfg.Incarnation != ""
		s.wal.publish = s.publishOK
	}
	ents, err := os.ReadDir(s.topicsDir())
	if err != nil {
		return nil, fmt.Errorf("cannot list topics (%s): %w", s.topicsDir(), err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		t, err := s.loadTopic(e.Name())
		if err != nil {
			s.closeAll(false)
			return nil, err
		}
		if t != nil {
			s.topics[t.Name] = t
			s.byID[t.ID] = t
		}
	}
	// A WAL left by the previous run (crash, or a failure that pinned it) is replayed even if
	// log.wal.enable is now off: it may hold acknowledged records the segments lost. (Not in a
	// Lazy store: a dead incarnation's WAL is salvaged per partition by TakeOver.)
	nextSeq, nextRound, err := uint64(1), uint64(1), error(nil)
	if !cfg.Lazy {
		nextSeq, nextRound, err = s.replayWAL(s.walDir())
	}
	if err != nil {
		s.closeAll(false)
		s.bg.Wait()
		return nil, fmt.Errorf("cannot recover write-ahead log: %w", err)
	}
	if s.wal != nil {
		s.wal.start(nextSeq, nextRound)
	}
	if cfg.RetentionCheckInterval > 0 {
		s.stopRetention = make(chan struct{})
		s.retentionDone = make(chan struct{})
		go s.retentionLoop(cfg.RetentionCheckInterval)
	}
	if cfg.Cleaner.Enable {
		s.startCleaner()
	}
	return s, nil
}

// loadTopic opens one topic directory. A directory without topic.json is a creation that did not
// finish (metadata is written last): it is moved away and nil is returned.
func (s *Store) loadTopic(name string) (*Topic, error) {
	dir := filepath.Join(s.topicsDir(), name)
	buf, err := os.ReadFile(filepath.Join(dir, topicMetaFile))
	if errors.Is(err, os.ErrNotExist) && s.cfg.Lazy {
		// On a shared volume this may be another broker's creation in progress.
		return nil, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		s.log.Warn("removing incomplete topic directory", zap.String("dir", dir))
		s.parkDir(dir, name+"-incomplete")
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read topic metadata (%s): %w", dir, err)
	}
	var m topicMeta
	if err := json.Unmarshal(buf, &m); err != nil {
		return nil, fmt.Errorf("cannot parse topic metadata (%s): %w", filepath.Join(dir, topicMetaFile), err)
	}
	idb, err := hex.DecodeString(m.ID)
	if err != nil || len(idb) != 16 || m.Name != name || m.Partitions < 1 {
		return nil, fmt.Errorf("cannot parse topic metadata (%s): bad id, name or partition count", filepath.Join(dir, topicMetaFile))
	}
	cfg, err := ParseTopicConfigs(s.defaults, m.Configs)
	if err != nil {
		return nil, fmt.Errorf("cannot load topic configs (%s): %w", name, err)
	}
	t := &Topic{Name: name, store: s, dir: dir, overrides: m.Configs}
	copy(t.ID[:], idb)
	if t.overrides == nil {
		t.overrides = map[string]string{}
	}
	t.cfg.Store(&cfg)
	parts, err := s.newPartitions(t, 0, m.Partitions)
	if err != nil {
		return nil, err
	}
	t.parts.Store(&parts)
	return t, nil
}

// openPartitions opens partitions [from, to) of t, a few at a time.
func (s *Store) openPartitions(t *Topic, from, to int32) ([]*Partition, error) {
	parts := make([]*Partition, to-from)
	errs := make([]error, to-from)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := from; i < to; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int32) {
			defer wg.Done()
			defer func() { <-sem }()
			parts[i-from], errs[i-from] = openPartition(t, i, filepath.Join(t.dir, strconv.Itoa(int(i))), s)
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range parts {
			if p != nil {
				_ = p.shutdown(false)
			}
		}
		return nil, err
	}
	return parts, nil
}

func (t *Topic) writeMeta(partitions int32, overrides map[string]string) error {
	m := topicMeta{Name: t.Name, ID: hex.EncodeToString(t.ID[:]), Partitions: partitions, Configs: overrides}
	if t.store.cfg.Lazy {
		// Shared volume: another broker may have grown the topic meanwhile; never write a
		// smaller count back (every broker applies the registry's count, which only grows).
		if disk, err := readTopicMeta(t.dir); err == nil && disk.ID == m.ID {
			m.Partitions = max(m.Partitions, disk.Partitions)
		}
	}
	buf, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomicTmp(t.dir, topicMetaFile, topicMetaFile+t.store.tmpSuffix(), buf); err != nil {
		return fmt.Errorf("cannot write topic metadata (%s): %w", t.Name, err)
	}
	return nil
}

// ValidateTopicName applies Kafka's rules: 1..249 chars of [a-zA-Z0-9._-], not "." or "..".
func ValidateTopicName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 249 {
		return fmt.Errorf("%w: %q", ErrInvalidTopic, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q contains %q (allowed: [a-zA-Z0-9._-])", ErrInvalidTopic, name, c)
		}
	}
	return nil
}

// newTopicID returns a random UUIDv4 that is not zero and whose base64 form does not start with
// '-' (Kafka's Uuid.randomUuid avoids those so they never look like CLI flags).
func newTopicID() ([16]byte, error) {
	for {
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return id, err
		}
		id[6] = id[6]&0x0f | 0x40
		id[8] = id[8]&0x3f | 0x80
		if id != ([16]byte{}) && !strings.HasPrefix(base64.RawURLEncoding.EncodeToString(id[:]), "-") {
			return id, nil
		}
	}
}

// maxPartitions bounds one request's partition count (a typo should not create a million dirs).
const maxPartitions = 100000

// CreateTopic creates a topic with partitions partitions and the given config overrides.
// Errors: ErrTopicExists, ErrInvalidTopic (bad name, or a '.'/'_' collision with an existing
// topic, as Kafka forbids), ErrInvalidPartitions, *ConfigError.
func (s *Store) CreateTopic(name string, partitions int32, configs map[string]string) (*Topic, error) {
	if err := ValidateTopicName(name); err != nil {
		return nil, err
	}
	if partitions < 1 || partitions > maxPartitions {
		return nil, fmt.Errorf("%w: %d", ErrInvalidPartitions, partitions)
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
	if s.topics[name] != nil {
		return nil, fmt.Errorf("%w: %s", ErrTopicExists, name)
	}
	norm := strings.ReplaceAll(name, ".", "_")
	for other := range s.topics {
		if strings.ReplaceAll(other, ".", "_") == norm {
			return nil, fmt.Errorf("%w: %q collides with existing topic %q ('.' and '_' collide in metric names)", ErrInvalidTopic, name, other)
		}
	}
	id, err := newTopicID()
	for err == nil && s.byID[id] != nil {
		id, err = newTopicID()
	}
	if err != nil {
		return nil, fmt.Errorf("cannot create topic id (%s): %w", name, err)
	}
	overrides := make(map[string]string, len(configs))
	for k, v := range configs {
		overrides[k] = v
	}
	t := &Topic{Name: name, ID: id, store: s, dir: filepath.Join(s.topicsDir(), name), overrides: overrides}
	t.cfg.Store(&cfg)
	if _, err := os.Stat(t.dir); err == nil {
		s.parkDir(t.dir, name+"-stale")
	}
	if err := os.MkdirAll(t.dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create topic dir (%s): %w", name, err)
	}
	parts, err := s.openPartitions(t, 0, partitions)
	if err == nil {
		// Metadata last: a crash before this line leaves a dir without topic.json, which Open
		// discards.
		err = t.writeMeta(partitions, overrides)
		if err == nil {
			err = SyncDir(s.topicsDir())
		}
		if err != nil {
			for _, p := range parts {
				_ = p.shutdown(false)
			}
		}
	}
	if err != nil {
		s.parkDir(t.dir, name+"-failed")
		return nil, fmt.Errorf("cannot create topic (%s): %w", name, err)
	}
	t.parts.Store(&parts)
	s.topics[name] = t
	s.byID[id] = t
	return t, nil
}

// DeleteTopic removes a topic: its partitions are closed, its directory is renamed into
// Dir/deleted (atomic: after a crash the topic is either fully there or gone) and removed in the
// background. A topic created later under the same name gets a new ID.
func (s *Store) DeleteTopic(name string) error {
	t, err := s.dropTopic(name, false)
	if err != nil {
		return err
	}
	defer t.mu.Unlock()
	if err := s.parkDir(t.dir, name+"-"+hex.EncodeToString(t.ID[:])); err != nil {
		if s.cfg.Lazy && errors.Is(err, os.ErrNotExist) {
			return nil // on a shared volume another broker moved it away first
		}
		return fmt.Errorf("cannot delete topic (%s): %w", name, err)
	}
	return nil
}

// dropTopic removes name from the store and shuts its partitions down (clean: synced and
// snapshotted first); it returns the topic with its mu held.
func (s *Store) dropTopic(name string, clean bool) (*Topic, error) {
	s.mu.Lock()
	t := s.topics[name]
	if t == nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrUnknownTopic, name)
	}
	delete(s.topics, name)
	delete(s.byID, t.ID)
	s.mu.Unlock()

	t.mu.Lock()
	for _, p := range *t.parts.Load() {
		_ = p.shutdown(clean)
	}
	// A clean in flight stops at the shutdown (its reads end, it commits nothing); wait for it
	// as Release does, so that it creates or deletes nothing by the partition's path once the
	// directory is parked or left to another broker (the path may then hold a re-created topic
	// of the same name, with the same file names). Lock order: Topic.mu → Partition.cleanMu.
	for _, p := range *t.parts.Load() {
		p.cleanMu.Lock()
		p.cleanMu.Unlock()
		p.fileOps.Wait() // retention and DeleteRecords, likewise (log_start.go)
	}
	return t, nil
}

// ForgetTopic closes a deleted topic and drops it from this store without touching its files:
// on a shared volume (cluster mode) the broker that served DeleteTopics parks the directory, and
// the others, told by etcd, only let go of theirs. The close writes nothing (no snapshot, no
// sync): the directory may already be parked, or even hold a re-created topic of the same name.
// Appends, reads and markers on its partitions then answer as for a released partition.
func (s *Store) ForgetTopic(name string) error {
	t, err := s.dropTopic(name, false)
	if err != nil {
		return err
	}
	t.mu.Unlock()
	return nil
}

// ParkTopic is DeleteTopic for a shared volume, given the id etcd held for the deleted topic:
// the topic is closed here if open (writing nothing, as ForgetTopic), and its directory is parked
// if it still holds that id, whether or not this broker ever opened it. A directory of another id
// (already re-created) or none at all (parked by another broker) is left alone.
func (s *Store) ParkTopic(name string, id [16]byte) error {
	s.mu.Lock()
	open := s.topics[name]
	s.mu.Unlock()
	if open != nil && open.ID == id {
		if err := s.ForgetTopic(name); err != nil && !errors.Is(err, ErrUnknownTopic) {
			return err
		}
	}
	return s.parkStaleDir(name, id, true)
}

// parkStaleDir parks topics/<name> when its metadata names id (same true) or any id but id (same
// false: a leftover of a deleted incarnation of the name). A missing directory is fine: another
// broker parked it first.
func (s *Store) parkStaleDir(name string, id [16]byte, same bool) error {
	dir := filepath.Join(s.topicsDir(), name)
	m, err := readTopicMeta(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("cannot read topic metadata (%s): %w", dir, err)
	}
	if (m.ID == hex.EncodeToString(id[:])) != same {
		return nil
	}
	if err := s.parkDir(dir, name+"-"+m.ID); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cannot delete topic (%s): %w", name, err)
	}
	return nil
}

// parkDir renames dir into Dir/deleted under a unique name and removes it in the background.
func (s *Store) parkDir(dir, as string) error {
	dst := filepath.Join(s.deletedDir(), fmt.Sprintf("%s-%d", as, time.Now().UnixNano()))
	if err := os.Rename(dir, dst); err != nil {
		return err
	}
	_ = SyncDir(filepath.Dir(dir))
	_ = SyncDir(s.deletedDir())
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		if err := os.RemoveAll(dst); err != nil {
			s.log.Warn("cannot remove deleted topic dir", zap.String("dir", dst), zap.Error(err))
		}
	}()
	return nil
}

// purgeDeleted removes leftovers of deletions interrupted by a crash.
func (s *Store) purgeDeleted() {
	ents, _ := os.ReadDir(s.deletedDir())
	for _, e := range ents {
		dst := filepath.Join(s.deletedDir(), e.Name())
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			_ = os.RemoveAll(dst)
		}()
	}
}

// CreatePartitions grows a topic to total partitions (ErrInvalidPartitions if total <= current,
// as Kafka answers for an equal count too).
func (s *Store) CreatePartitions(name string, total int32) error {
	t := s.Topic(name)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, name)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.parts.Load()
	if total <= int32(len(cur)) || total > maxPartitions {
		return fmt.Errorf("%w: topic %s has %d partitions, asked for %d", ErrInvalidPartitions, name, len(cur), total)
	}
	if s.Topic(name) != t {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, name)
	}
	added, err := s.openPartitions(t, int32(len(cur)), total)
	if err != nil {
		return fmt.Errorf("cannot create partitions (%s): %w", name, err)
	}
	if err := t.writeMeta(total, t.overrides); err != nil {
		for _, p := range added {
			_ = p.shutdown(false)
		}
		return err
	}
	all := append(append(make([]*Partition, 0, total), cur...), added...)
	t.parts.Store(&all)
	return nil
}

// AlterTopicConfig applies config changes: a nil value deletes the override (back to the broker
// default). The result is validated as a whole, persisted, then applied to live partitions.
func (s *Store) AlterTopicConfig(name string, set map[string]*string) error {
	t := s.Topic(name)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, name)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := make(map[string]string, len(t.overrides)+len(set))
	for k, v := range t.overrides {
		next[k] = v
	}
	for k, v := range set {
		if v == nil {
			if findConfigKey(k) == nil {
				return &ConfigError{Key: k, Reason: "unknown or unsupported topic config"}
			}
			delete(next, k)
		} else {
			next[k] = *v
		}
	}
	return t.applyOverridesLocked(next)
}

// ReplaceTopicConfig replaces all overrides (legacy AlterConfigs semantics).
func (s *Store) ReplaceTopicConfig(name string, kv map[string]string) error {
	t := s.Topic(name)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, name)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := make(map[string]string, len(kv))
	for k, v := range kv {
		next[k] = v
	}
	return t.applyOverridesLocked(next)
}

// EditTopicConfig replaces the overrides with what edit makes of the current ones, under the
// topic's lock (a single broker's IncrementalAlterConfigs and AlterConfigs: concurrent alters
// of one topic apply one after the other). An error from edit is returned and nothing changes.
func (s *Store) EditTopicConfig(name string, edit func(cur map[string]string) (map[string]string, error)) error {
	t := s.Topic(name)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, name)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := make(map[string]string, len(t.overrides))
	for k, v := range t.overrides {
		cur[k] = v
	}
	next, err := edit(cur)
	if err != nil {
		return err
	}
	return t.applyOverridesLocked(next)
}

// ApplyTopicConfigsAt sets the overrides from the cluster registry's record at revision rev
// (etcd's topics/<name>), unless overrides of a later revision were applied already: the
// broker that changed them applies its own write at once and the watch brings every change
// to every broker, and the two may arrive in either order. The registry is the truth in
// cluster mode, so this also replaces what topic.json held when the broker started (every
// broker writes that copy; a late write there is corrected at the next load).
func (s *Store) ApplyTopicConfigsAt(name string, overrides map[string]string, rev int64) error {
	t := s.Topic(name)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, name)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if rev <= t.cfgRev {
		return nil
	}
	if maps.Equal(overrides, t.overrides) {
		t.cfgRev = rev
		return nil
	}
	next := make(map[string]string, len(overrides))
	for k, v := range overrides {
		next[k] = v
	}
	if err := t.applyOverridesLocked(next); err != nil {
		return err
	}
	t.cfgRev = rev
	return nil
}

func (t *Topic) applyOverridesLocked(next map[string]string) error {
	cfg, err := ParseTopicConfigs(t.store.defaults, next)
	if err != nil {
		return err
	}
	if err := t.writeMeta(int32(len(*t.parts.Load())), next); err != nil {
		return err
	}
	t.overrides = next
	t.cfg.Store(&cfg)
	// Wake the flushers so a flush.messages change takes effect now.
	for _, p := range *t.parts.Load() {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Topic returns the named topic or nil.
func (s *Store) Topic(name string) *Topic {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.topics[name]
}

// TopicByID returns the topic with that ID or nil.
func (s *Store) TopicByID(id [16]byte) *Topic {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byID[id]
}

// Topics returns all topics sorted by name.
func (s *Store) Topics() []*Topic {
	s.mu.RLock()
	out := make([]*Topic, 0, len(s.topics))
	for _, t := range s.topics {
		out = append(out, t)
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Config returns the topic's effective config.
func (t *Topic) Config() TopicConfig { return *t.cfg.Load() }

// Overrides returns a copy of the topic-level config overrides.
func (t *Topic) Overrides() map[string]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]string, len(t.overrides))
	for k, v := range t.overrides {
		out[k] = v
	}
	return out
}

// DescribeConfigs lists every supported key: overrides are DYNAMIC_TOPIC_CONFIG, the rest come
// from the broker defaults (STATIC_BROKER_CONFIG if the broker changed them, else DEFAULT_CONFIG).
func (t *Topic) DescribeConfigs() []ConfigEntry {
	ov := t.Overrides()
	cfg := t.Config()
	def := DefaultTopicConfig()
	broker := t.store.defaults
	out := make([]ConfigEntry, 0, len(configKeys))
	for i := range configKeys {
		ck := &configKeys[i]
		e := ConfigEntry{Name: ck.name, Value: ck.get(&cfg)}
		switch _, over := ov[ck.name]; {
		case over:
			e.Source = SourceDynamicTopic
		case ck.get(&broker) != ck.get(&def):
			e.Source, e.IsDefault = SourceStaticBroker, true
		default:
			e.Source, e.IsDefault = SourceDefault, true
		}
		out = append(out, e)
	}
	return out
}

// NumPartitions returns the partition count.
func (t *Topic) NumPartitions() int32 { return int32(len(*t.parts.Load())) }

// Partition returns partition p or nil if out of range.
func (t *Topic) Partition(p int32) *Partition {
	parts := *t.parts.Load()
	if p < 0 || int(p) >= len(parts) {
		return nil
	}
	return parts[p]
}

// ReleasePartition unloads partition part of topic at runtime (a leadership moving away): it
// is synced, its producer snapshot written and its files closed. The *Partition stays
// reachable through Topic.Partition with Loaded() false; appends, reads and markers on it
// answer NOT_LEADER_OR_FOLLOWER and pending long-polls are woken. Every append acknowledged
// before (or racing with) the release is durable in the segment afterwards (with the WAL on
// this is the partition's checkpoint), so a LoadPartition here or elsewhere finds it.
func (s *Store) ReleasePartition(topic string, part int32) error {
	t := s.Topic(topic)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, topic)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.Partition(part)
	if p == nil {
		return fmt.Errorf("%w: %s-%d", ErrUnknownTopic, topic, part)
	}
	partitionReleasesTotal.Inc()
	return p.release()
}

// LoadPartition opens partition part of topic at runtime with leaderEpoch, recovering it as
// Open does (torn tail, indexes, producer state from snapshot + replay). A released partition is
// replaced by a fresh *Partition (reachable through Topic.Partition); a loaded one only moves to
// the new epoch. An epoch above the latest known is persisted in the leader-epoch checkpoint
// (starting at the log end) before any batch is stamped with it; one below is refused.
//
// Lock order: Topic.mu → Partition.mu.
func (s *Store) LoadPartition(topic string, part, leaderEpoch int32) error {
	s.mu.RLock()
	closed := s.closed
	s.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	if s.cfg.Incarnation != "" {
		return fmt.Errorf("cannot load partition (%s-%d): a cluster-mode store opens partitions with TakeOver", topic, part)
	}
	t := s.Topic(topic)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, topic)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.Topic(topic) != t {
		return fmt.Errorf("%w: %s", ErrUnknownTopic, topic)
	}
	old := t.Partition(part)
	if old == nil {
		return fmt.Errorf("%w: %s-%d", ErrUnknownTopic, topic, part)
	}
	if old.Loaded() {
		old.mu.Lock()
		defer old.mu.Unlock()
		if old.closed {
			return fmt.Errorf("cannot load partition (%s-%d): %w", topic, part, ErrClosed)
		}
		return old.setLeaderEpochLocked(leaderEpoch)
	}
	if !old.released.Load() {
		return fmt.Errorf("cannot load partition (%s-%d): %w", topic, part, ErrClosed)
	}
	p, err := openPartition(t, part, old.dir, s)
	if err != nil {
		return err
	}
	p.mu.Lock()
	err = p.setLeaderEpochLocked(leaderEpoch)
	p.mu.Unlock()
	if err != nil {
		_ = p.shutdown(true)
		return err
	}
	cur := *t.parts.Load()
	next := append([]*Partition(nil), cur...)
	next[part] = p
	t.parts.Store(&next)
	partitionLoadsTotal.Inc()
	return nil
}

// RunRetention applies retention to every partition once, then producer.id.expiration.ms.
func (s *Store) RunRetention(now time.Time) {
	for _, t := range s.Topics() {
		for _, p := range *t.parts.Load() {
			p.retain(now)
			p.expireProducers(now.UnixMilli(), s.cfg.ProducerIDExpiration.Milliseconds())
		}
	}
}

func (s *Store) retentionLoop(every time.Duration) {
	defer close(s.retentionDone)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-s.stopRetention:
			return
		case now := <-tick.C:
			s.RunRetention(now)
		}
	}
}

// Close flushes every partition, writes producer snapshots and closes all files.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if s.stopRetention != nil {
		close(s.stopRetention)
		<-s.retentionDone
	}
	if s.cleaner != nil {
		s.cleaner.close()
	}
	err := s.closeAll(true)
	if s.wal != nil {
		// Only after every partition fsync'd its segment may the WAL go (and only if all did).
		if werr := s.wal.close(err == nil); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	s.bg.Wait()
	return err
}

func (s *Store) closeAll(clean bool) error {
	var errs []error
	for _, t := range s.Topics() {
		for _, p := range *t.parts.Load() {
			errs = append(errs, p.shutdown(clean))
		}
	}
	return errors.Join(errs...)
}
