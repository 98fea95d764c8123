package storage

import (
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
)

// Config configures a Store.
type Config struct {
	// Dir is the data directory root (default ./data). Topics live under Dir/topics/<name>/,
	// cluster state under Dir/__cluster/, deleted topics are parked in Dir/deleted/.
	Dir string
	// Defaults are the broker-level defaults for topic configs (zero value = DefaultTopicConfig()).
	Defaults TopicConfig
	// IndexIntervalBytes is the sparse index interval (index.interval.bytes), default 4096.
	IndexIntervalBytes int32
	// RetentionCheckInterval is how often retention runs (log.retention.check.interval.ms).
	// 0 = no background loop (RunRetention can still be called); brokers pass
	// DefaultRetentionCheckInterval (5m).
	RetentionCheckInterval time.Duration
	Logger                 *zap.Logger
	// Preallocate (log.preallocate) keeps a zeroed, fsync'd region ahead of each active
	// segment's end so flushes are fdatasyncs of already-allocated blocks (no journal commit,
	// no contention between partitions): about half the flush latency on ext4, at the price of
	// writing the zeros too (twice the bytes to disk). Off by default until the benchmark
	// harness shows it pays on the target disks.
	Preallocate bool
	// WAL (log.wal.enable) makes flush.messages = 1 appends durable through one shared,
	// group-committed write-ahead log per Store (Dir/wal, see wal.go) instead of one fsync per
	// partition; segments are then fsync'd lazily by checkpoints. Whatever its value, a WAL left
	// by an earlier run is replayed on Open.
	WAL bool
	// FS opens segment and WAL files; nil = the OS. Tests inject faults through it.
	FS FS
	// ProducerIDExpiration (producer.id.expiration.ms, a broker config in Apache too): a
	// partition removes idempotent producer state idle this long, except for a producer with an
	// open transaction there (Apache's ProducerStateManager.removeExpiredProducers). It runs with
	// retention (RunRetention), so state of producers whose data retention already deleted goes
	// too, and memory and snapshots stay bounded. 0 = DefaultProducerIDExpiration.
	ProducerIDExpiration time.Duration

	// Cluster mode (cluster.go; design §2). All zero = single broker, today's behaviour and
	// file names.
	//
	// Lazy: Open reads topic metadata (topic.json) only. Partitions exist with Loaded() false
	// until TakeOver opens them, and no WAL is replayed at Open: the WAL in Dir/wal (or WALDir)
	// is not this broker's to replay, the partitions in it may be led by other brokers.
	Lazy bool
	// WALDir is the write-ahead log directory ("" = Dir/wal). In cluster mode it is
	// Dir/__cluster/wal/b<id>-i<inc>, fresh for each incarnation; a successor salvages it.
	WALDir string
	// Incarnation (the membership lease, in hex) and BrokerID are written into epoch files.
	// Incarnation != "" turns on epoch-named segment and snapshot files.
	Incarnation string
	BrokerID    int32
	// Publish is Rule P: called after each durability point (WAL round, partition flush, the
	// sync of a takeover) and before anything it covers becomes visible (acks, HWM and LSO,
	// fetched bytes). When it returns false nothing is published, waiting acks fail with
	// ErrFenced and the store stays fenced for good: the broker is expected to fail-stop. nil =
	// always true.
	Publish func() bool

	// Cleaner is the log cleaner of compacted topics (cleaner.go; log.cleaner.*).
	Cleaner CleanerConfig

	// Tests only: WAL generation size (0 = walGenBytesDefault) and checkpoint period (0 =
	// walCheckpointEvery).
	walGenBytes        int64
	walCheckpointEvery time.Duration
	// Tests only: recovery checkpoint period in cluster mode (0 = recoveryCheckpointBytes).
	recoveryCheckpointBytes int64
}

// DefaultProducerIDExpiration is Apache's producer.id.expiration.ms default (one day).
const DefaultProducerIDExpiration = 24 * time.Hour

// DefaultRetentionCheckInterval is Kafka's log.retention.check.interval.ms default.
const DefaultRetentionCheckInterval = 5 * time.Minute

// Values of message.timestamp.type.
const (
	TimestampCreateTime    = "CreateTime"
	TimestampLogAppendTime = "LogAppendTime"
)

// Sources of a described config value (DescribeConfigsResponse ConfigSource).
const (
	SourceDynamicTopic int8 = 1
	SourceStaticBroker int8 = 4
	SourceDefault      int8 = 5
)

// TopicConfig is a topic's effective configuration. Kafka names in comments.
type TopicConfig struct {
	RetentionMs          int64  // retention.ms, -1 = forever
	RetentionBytes       int64  // retention.bytes, -1 = unlimited
	SegmentBytes         int64  // segment.bytes
	SegmentMs            int64  // segment.ms
	MaxMessageBytes      int32  // max.message.bytes
	CleanupPolicy        string // cleanup.policy: "delete", "compact" or both ("compact,delete"), cleaner.go
	TimestampType        string // message.timestamp.type: CreateTime | LogAppendTime
	TimestampBeforeMaxMs int64  // message.timestamp.before.max.ms
	TimestampAfterMaxMs  int64  // message.timestamp.after.max.ms
	// FlushMessages is flush.messages. 1 (kaas default) = every ack waits for fsync (group
	// committed). >1 = acks come from the page cache; the flusher fsyncs once that many records
	// are unflushed, after flush.ms, and at the latest relaxedFlushDelay after the first
	// unflushed append (the HWM only moves on fsync, so this bounds consumer visibility lag).
	FlushMessages int64
	FlushMs       int64 // flush.ms
	// CompressionType is compression.type: CompressionProducer keeps each batch as the
	// producer compressed it; a codec name makes the broker store every batch in that codec,
	// recompressing where the producer used another (Apache's LogValidator).
	CompressionType string
	// Levels used when recompressing to that codec (KIP-390; Apache 4.1 defaults -1, 9, 3).
	GzipLevel int32 // compression.gzip.level: -1 (zlib default) or 1..9
	LZ4Level  int32 // compression.lz4.level: 1..17
	ZstdLevel int32 // compression.zstd.level: -131072..22
	// Inert holds the Apache topic configs kaas accepts but does not act on (config_inert.go),
	// indexed like inertKeys; "" = Apache's default.
	Inert [numInertKeys]string
}

// DefaultTopicConfig returns Kafka 4.x defaults, except flush.messages = 1 (durable acks).
func DefaultTopicConfig() TopicConfig {
	return TopicConfig{
		RetentionMs:          604800000,
		RetentionBytes:       -1,
		SegmentBytes:         1073741824,
		SegmentMs:            604800000,
		MaxMessageBytes:      1048588,
		CleanupPolicy:        "delete",
		TimestampType:        TimestampCreateTime,
		TimestampBeforeMaxMs: math.MaxInt64,
		TimestampAfterMaxMs:  3600000,
		FlushMessages:        1,
		FlushMs:              math.MaxInt64,
		CompressionType:      CompressionProducer,
		GzipLevel:            codec.GzipLevelDefault,
		LZ4Level:             codec.LZ4LevelDefault,
		ZstdLevel:            codec.ZstdLevelDefault,
	}
}

// CompressionProducer is compression.type=producer: keep the producer's codec.
const CompressionProducer = "producer"

// compressionCodecs maps compression.type values (Apache's BrokerCompressionType names, which
// are case-sensitive) to codec ids.
var compressionCodecs = map[string]int{
	"uncompressed": codec.CompressionNone,
	"gzip":         codec.CompressionGzip,
	"snappy":       codec.CompressionSnappy,
	"lz4":          codec.CompressionLZ4,
	"zstd":         codec.CompressionZstd,
}

// Recompression reports the codec and level batches of this topic must be stored in; ok=false
// for compression.type=producer (batches are stored as produced).
func (c *TopicConfig) Recompression() (codecID, level int, ok bool) {
	id, ok := compressionCodecs[c.CompressionType]
	if !ok {
		return 0, 0, false
	}
	switch id {
	case codec.CompressionGzip:
		level = int(c.GzipLevel)
	case codec.CompressionLZ4:
		level = int(c.LZ4Level)
	case codec.CompressionZstd:
		level = int(c.ZstdLevel)
	}
	return id, level, true
}

// ConfigEntry is one described config (DescribeConfigs). Sensitive and ReadOnly are always false.
type ConfigEntry struct {
	Name      string
	Value     string
	IsDefault bool
	Source    int8 // SourceDynamicTopic, SourceStaticBroker or SourceDefault
}

// configKey describes one supported topic config: how to print it and how to parse+validate it.
type configKey struct {
	name string
	get  func(*TopicConfig) string
	set  func(*TopicConfig, string) string // returns a reason on error, "" when ok
}

func i64(v int64) string { return strconv.FormatInt(v, 10) }

// parseInt parses v as a base-10 integer within [lo, hi].
func parseInt(v string, lo, hi int64) (int64, string) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return 0, "not an integer"
	}
	if n < lo || n > hi {
		if hi == math.MaxInt64 {
			return 0, "must be at least " + i64(lo)
		}
		return 0, "must be in [" + i64(lo) + ", " + i64(hi) + "]"
	}
	return n, ""
}

func intKey(name string, lo, hi int64, field func(*TopicConfig) *int64) configKey {
	return configKey{
		name: name,
		get:  func(c *TopicConfig) string { return i64(*field(c)) },
		set: func(c *TopicConfig, v string) string {
			n, reason := parseInt(v, lo, hi)
			if reason == "" {
				*field(c) = n
			}
			return reason
		},
	}
}

// levelKey is a compression level config: an int in [lo, hi], or also -1 when extra is -1
// (compression.gzip.level, whose -1 means zlib's default, as Apache's validator allows).
func levelKey(name string, lo, hi, extra int, field func(*TopicConfig) *int32) configKey {
	return configKey{
		name: name,
		get:  func(c *TopicConfig) string { return i64(int64(*field(c))) },
		set: func(c *TopicConfig, v string) string {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			if err != nil {
				return "not a 32-bit integer"
			}
			if extra == -1 && n == -1 {
				*field(c) = -1
				return ""
			}
			if n < int64(lo) || n > int64(hi) {
				if extra == -1 {
					return "must be in [" + i64(int64(lo)) + ", " + i64(int64(hi)) + "] or -1"
				}
				return "must be in [" + i64(int64(lo)) + ", " + i64(int64(hi)) + "]"
			}
			*field(c) = int32(n)
			return ""
		},
	}
}

// minSegmentBytes is the smallest segment.bytes accepted. Kafka allows 14, which only makes sense
// in its own tests; 1 KiB keeps tests able to roll segments without absurd file counts.
const minSegmentBytes = 1024

var configKeys = []configKey{
	intKey("retention.ms", -1, math.MaxInt64, func(c *TopicConfig) *int64 { return &c.RetentionMs }),
	// Apache has no validator on retention.bytes: every negative value means unlimited.
	intKey("retention.bytes", math.MinInt64, math.MaxInt64, func(c *TopicConfig) *int64 { return &c.RetentionBytes }),
	// Positions in the sparse index are int32, so a segment cannot exceed MaxInt32 bytes.
	intKey("segment.bytes", minSegmentBytes, math.MaxInt32, func(c *TopicConfig) *int64 { return &c.SegmentBytes }),
	intKey("segment.ms", 1, math.MaxInt64, func(c *TopicConfig) *int64 { return &c.SegmentMs }),
	{
		name: "max.message.bytes",
		get:  func(c *TopicConfig) string { return i64(int64(c.MaxMessageBytes)) },
		set: func(c *TopicConfig, v string) string {
			n, reason := parseInt(v, 0, math.MaxInt32)
			if reason == "" {
				c.MaxMessageBytes = int32(n)
			}
			return reason
		},
	},
	{
		name: "cleanup.policy",
		get:  func(c *TopicConfig) string { return c.CleanupPolicy },
		set: func(c *TopicConfig, v string) string {
			// Apache: a list whose items are each compact or delete (ValidList.in). The
			// value is stored normalised (trimmed items, comma-joined) and shown that way.
			var items []string
			for _, it := range strings.Split(v, ",") {
				it = strings.ToLower(strings.TrimSpace(it))
				if it != "compact" && it != "delete" {
					return "must be a list of compact and delete"
				}
				if !slices.Contains(items, it) {
					items = append(items, it)
				}
			}
			c.CleanupPolicy = strings.Join(items, ",")
			return ""
		},
	},
	{
		name: "compression.type",
		get:  func(c *TopicConfig) string { return c.CompressionType },
		set: func(c *TopicConfig, v string) string {
			if _, ok := compressionCodecs[v]; ok || v == CompressionProducer {
				c.CompressionType = v
				return ""
			}
			return "must be one of producer, uncompressed, gzip, snappy, lz4, zstd"
		},
	},
	levelKey("compression.gzip.level", codec.GzipLevelMin, codec.GzipLevelMax, codec.GzipLevelDefault,
		func(c *TopicConfig) *int32 { return &c.GzipLevel }),
	levelKey("compression.lz4.level", codec.LZ4LevelMin, codec.LZ4LevelMax, 0,
		func(c *TopicConfig) *int32 { return &c.LZ4Level }),
	levelKey("compression.zstd.level", codec.ZstdLevelMin, codec.ZstdLevelMax, 0,
		func(c *TopicConfig) *int32 { return &c.ZstdLevel }),
	{
		name: "message.timestamp.type",
		get:  func(c *TopicConfig) string { return c.TimestampType },
		set: func(c *TopicConfig, v string) string {
			switch v {
			case TimestampCreateTime, TimestampLogAppendTime:
				c.TimestampType = v
				return ""
			}
			return "must be CreateTime or LogAppendTime"
		},
	},
	intKey("message.timestamp.before.max.ms", 0, math.MaxInt64, func(c *TopicConfig) *int64 { return &c.TimestampBeforeMaxMs }),
	intKey("message.timestamp.after.max.ms", 0, math.MaxInt64, func(c *TopicConfig) *int64 { return &c.TimestampAfterMaxMs }),
	intKey("flush.messages", 1, math.MaxInt64, func(c *TopicConfig) *int64 { return &c.FlushMessages }),
	intKey("flush.ms", 0, math.MaxInt64, func(c *TopicConfig) *int64 { return &c.FlushMs }),
}

func findConfigKey(name string) *configKey {
	for i := range configKeys {
		if configKeys[i].name == name {
			return &configKeys[i]
		}
	}
	return nil
}

// ParseTopicConfigs applies the overrides kv on top of base, validating every name and value. The
// first problem (in key order) is returned as a *ConfigError naming the key.
func ParseTopicConfigs(base TopicConfig, kv map[string]string) (TopicConfig, error) {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	c := base
	for _, k := range keys {
		ck := findConfigKey(k)
		if ck == nil {
			return base, &ConfigError{Key: k, Reason: "unknown or unsupported topic config"}
		}
		if reason := ck.set(&c, kv[k]); reason != "" {
			return base, &ConfigError{Key: k, Value: kv[k], Reason: reason}
		}
	}
	// Apache's LogConfig.validateValues: the one cross-key rule among the keys kaas accepts.
	minLag, _ := strconv.ParseInt(findConfigKey("min.compaction.lag.ms").get(&c), 10, 64)
	maxLag, _ := strconv.ParseInt(findConfigKey("max.compaction.lag.ms").get(&c), 10, 64)
	if minLag > maxLag {
		return base, &ConfigError{Key: "min.compaction.lag.ms", Value: i64(minLag),
			Reason: "conflicts with max.compaction.lag.ms " + i64(maxLag) + " (min must not exceed max)"}
	}
	return c, nil
}

// Describe lists every supported key with its value. IsDefault means the value equals Kafka's
// (kaas's) built-in default; Topic.DescribeConfigs knows about overrides and is more precise.
func (c TopicConfig) Describe() []ConfigEntry {
	def := DefaultTopicConfig()
	out := make([]ConfigEntry, 0, len(configKeys))
	for i := range configKeys {
		ck := &configKeys[i]
		v := ck.get(&c)
		isDef := v == ck.get(&def)
		src := SourceDynamicTopic
		if isDef {
			src = SourceDefault
		}
		out = append(out, ConfigEntry{Name: ck.name, Value: v, IsDefault: isDef, Source: src})
	}
	return out
}

// withDefaults fills zero fields of a broker-level default config from DefaultTopicConfig, so a
// zero Config.Defaults means "Kafka defaults".
func (c TopicConfig) withDefaults() TopicConfig {
	d := DefaultTopicConfig()
	if c == (TopicConfig{}) {
		return d
	}
	if c.SegmentBytes == 0 {
		c.SegmentBytes = d.SegmentBytes
	}
	if c.SegmentMs == 0 {
		c.SegmentMs = d.SegmentMs
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = d.MaxMessageBytes
	}
	if c.CleanupPolicy == "" {
		c.CleanupPolicy = d.CleanupPolicy
	}
	if c.TimestampType == "" {
		c.TimestampType = d.TimestampType
	}
	if c.FlushMessages == 0 {
		c.FlushMessages = d.FlushMessages
	}
	if c.FlushMs == 0 {
		c.FlushMs = d.FlushMs
	}
	if c.CompressionType == "" {
		c.CompressionType = d.CompressionType
	}
	// 0 is no valid gzip or lz4 level; for zstd, 0 is zstd's own "default level" and stays.
	if c.GzipLevel == 0 {
		c.GzipLevel = d.GzipLevel
	}
	if c.LZ4Level == 0 {
		c.LZ4Level = d.LZ4Level
	}
	return c
}
