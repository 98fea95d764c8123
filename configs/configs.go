// Package configs holds the broker configuration: defaults, a Kafka-style .properties file, KAAS_*
// environment variables and command-line flags, applied in that order (later wins). Keys use
// Apache Kafka's broker property names wherever Kafka has one, so an operator's muscle memory
// (and kafka-configs output) carries over.
package configs

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config is the broker configuration. See configs/kaas.properties for every key with its meaning.
type Config struct {
	BrokerID            int32
	Listeners           string // Kafka's listeners: NAME://host:port,... (a bare host:port is PLAINTEXT)
	AdvertisedListeners string // NAME://host:port per listener clients are told to use; unlisted = the bound address
	DataDir             string
	MetricsAddr         string // HTTP /metrics, /healthz, /debug/pprof; empty = off
	LogLevel            string

	NumEventLoops        int   // gnet loops; 0 = one per CPU
	SocketRequestMaxByte int32 // socket.request.max.bytes
	MaxInflightPerConn   int   // requests decoded but not yet answered, per connection
	ConnMaxOutboundBytes int64 // connection.max.outbound.bytes: unread response bytes before a close

	AutoCreateTopics       bool
	NumPartitions          int32
	DeleteTopicEnable      bool
	LogRetentionMs         int64
	LogRetentionBytes      int64
	LogSegmentBytes        int64
	LogRollMs              int64
	MessageMaxBytes        int32
	LogFlushIntervalMsgs   int64
	LogFlushIntervalMs     int64
	LogTimestampType       string
	LogTimestampBeforeMax  int64
	LogTimestampAfterMax   int64
	CompressionType        string
	CompressionGzipLevel   int32
	CompressionLZ4Level    int32
	CompressionZstdLevel   int32
	RetentionCheckInterval time.Duration
	LogPreallocate         bool
	LogWALEnable           bool
	ProducerIDExpiration   time.Duration

	// Log cleaner of compacted topics (storage/cleaner.go), Apache's log.cleaner.* keys.
	LogCleanerEnable      bool
	LogCleanerThreads     int
	LogCleanerIOMaxBytes  float64 // log.cleaner.io.max.bytes.per.second
	LogCleanerDedupeBytes int64   // log.cleaner.dedupe.buffer.size
	LogCleanerBackoff     time.Duration

	FetchMaxBytes         int32
	FetchSessionCacheSize int

	GroupInitialRebalanceDelay time.Duration
	GroupMinSessionTimeout     time.Duration
	GroupMaxSessionTimeout     time.Duration
	GroupMaxSize               int
	OffsetsRetention           time.Duration

	TransactionMaxTimeout   time.Duration
	TransactionVersion      int16
	TransactionReapInterval time.Duration
	TransactionWorkers      int
	// TransactionalIDExpiration is transactional.id.expiration.ms: a transactional.id whose
	// entry is Empty or Complete* and has not changed for this long is removed (durably).
	TransactionalIDExpiration time.Duration

	Security      // listeners, TLS and SASL (security.go)
	ConsumerGroup // KIP-848 group.consumer.* (consumer_group.go)
	Cluster       // cluster mode (cluster.go)
	// AuthorizerClassName is authorizer.class.name: empty allows everything; Apache's
	// org.apache.kafka.metadata.authorizer.StandardAuthorizer (or "acl") enables ACLs.
	AuthorizerClassName  string
	SuperUsers           string // super.users: User:a;User:b
	AllowEveryoneIfNoACL bool   // allow.everyone.if.no.acl.found
}

// StandardAuthorizer is Apache's KRaft authorizer class; authorizer.class.name accepts it.
const StandardAuthorizer = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

// Default returns the configuration of `make run`: one broker, id 0, 127.0.0.1:9092, data in
// ./data, metrics on 127.0.0.1:9644, fsync before every acknowledgement.
func Default() Config {
	return Config{
		BrokerID:             0,
		Listeners:            "127.0.0.1:9092",
		DataDir:              "./data",
		MetricsAddr:          "127.0.0.1:9644",
		LogLevel:             "info",
		SocketRequestMaxByte: 100 << 20,
		MaxInflightPerConn:   64,
		ConnMaxOutboundBytes: 256 << 20, // four 55 MiB fetch.max.bytes responses and change

		AutoCreateTopics:       true,
		NumPartitions:          1,
		DeleteTopicEnable:      true,
		LogRetentionMs:         7 * 24 * 3600 * 1000,
		LogRetentionBytes:      -1,
		LogSegmentBytes:        1 << 30,
		LogRollMs:              7 * 24 * 3600 * 1000,
		MessageMaxBytes:        1048588,
		LogFlushIntervalMsgs:   1, // Kafka's default is Long.MAX (page cache); ours is honest fsync
		LogFlushIntervalMs:     math.MaxInt64,
		LogTimestampType:       "CreateTime",
		LogTimestampBeforeMax:  math.MaxInt64,
		LogTimestampAfterMax:   3600000, // Kafka 4.0 default (KIP-937)
		CompressionType:        "producer",
		CompressionGzipLevel:   -1,
		CompressionLZ4Level:    9,
		CompressionZstdLevel:   3,
		RetentionCheckInterval: 5 * time.Minute,
		LogWALEnable:           true,
		ProducerIDExpiration:   24 * time.Hour, // Apache's producer.id.expiration.ms default
		LogCleanerEnable:       true,
		LogCleanerThreads:      1,
		LogCleanerIOMaxBytes:   math.MaxFloat64, // Apache's default: unlimited
		LogCleanerDedupeBytes:  128 << 20,
		LogCleanerBackoff:      15 * time.Second,

		FetchMaxBytes:         55 << 20,
		FetchSessionCacheSize: 1000,

		GroupInitialRebalanceDelay: 3 * time.Second,
		GroupMinSessionTimeout:     6 * time.Second,
		GroupMaxSessionTimeout:     30 * time.Minute,
		GroupMaxSize:               math.MaxInt32,
		ConsumerGroup:              defaultConsumerGroup(),
		OffsetsRetention:           7 * 24 * time.Hour,

		TransactionMaxTimeout:   15 * time.Minute,
		TransactionVersion:      2,
		TransactionReapInterval: 10 * time.Second,
		TransactionWorkers:      1,
		// Apache's default: 7 days.
		TransactionalIDExpiration: 7 * 24 * time.Hour,

		Security: defaultSecurity(),
		Cluster:  defaultCluster(),
	}
}

type kind int

const (
	kString kind = iota
	kInt32
	kInt64
	kInt
	kInt16
	kBool
	kMillis
	kFloat
)

type entry struct {
	key  string
	kind kind
	ptr  any
	help string
	// sensitive values (private keys, inline PEM) are never logged nor described (Keys).
	sensitive bool
}

func (c *Config) entries() []entry {
	return append([]entry{
		{"broker.id", kInt32, &c.BrokerID, "broker id; PIDs are partitioned per broker id", false},
		{"listeners", kString, &c.Listeners, "listeners to bind: NAME://host:port,... (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL or names in listener.security.protocol.map); a bare host:port is PLAINTEXT", false},
		{"advertised.listeners", kString, &c.AdvertisedListeners, "NAME://host:port returned in Metadata per listener; a listener not named here advertises its bound address", false},
		{"data.dir", kString, &c.DataDir, "data directory (alias: log.dirs)", false},
		{"metrics.addr", kString, &c.MetricsAddr, "HTTP address for /metrics, /healthz and /debug/pprof; empty disables", false},
		{"log.level", kString, &c.LogLevel, "debug|info|warn|error", false},
		{"num.network.threads", kInt, &c.NumEventLoops, "event loops; 0 = one per CPU", false},
		{"socket.request.max.bytes", kInt32, &c.SocketRequestMaxByte, "largest request frame accepted; larger closes the connection", false},
		{"max.inflight.requests.per.connection", kInt, &c.MaxInflightPerConn, "decoded-but-unanswered requests per connection before reading pauses", false},
		{"connection.max.outbound.bytes", kInt64, &c.ConnMaxOutboundBytes, "response bytes a client has not read yet before its connection is closed (slow consumer); >= 2 × fetch.max.bytes", false},
		{"auto.create.topics.enable", kBool, &c.AutoCreateTopics, "create topics on Metadata requests that ask for it", false},
		{"num.partitions", kInt32, &c.NumPartitions, "partitions of auto-created topics", false},
		{"delete.topic.enable", kBool, &c.DeleteTopicEnable, "allow DeleteTopics", false},
		{"log.retention.ms", kInt64, &c.LogRetentionMs, "default retention.ms; -1 keeps forever", false},
		{"log.retention.bytes", kInt64, &c.LogRetentionBytes, "default retention.bytes per partition; -1 = unlimited", false},
		{"log.segment.bytes", kInt64, &c.LogSegmentBytes, "default segment.bytes", false},
		{"log.roll.ms", kInt64, &c.LogRollMs, "default segment.ms", false},
		{"message.max.bytes", kInt32, &c.MessageMaxBytes, "default max.message.bytes (largest record batch)", false},
		{"log.flush.interval.messages", kInt64, &c.LogFlushIntervalMsgs, "default flush.messages: 1 = fsync before every ack (honest durability); larger trades durability for speed", false},
		{"log.flush.interval.ms", kInt64, &c.LogFlushIntervalMs, "default flush.ms: background fsync period when flush.messages > 1", false},
		{"log.message.timestamp.type", kString, &c.LogTimestampType, "CreateTime or LogAppendTime", false},
		{"log.message.timestamp.before.max.ms", kInt64, &c.LogTimestampBeforeMax, "reject CreateTime records older than this", false},
		{"log.message.timestamp.after.max.ms", kInt64, &c.LogTimestampAfterMax, "reject CreateTime records further in the future than this", false},
		{"compression.type", kString, &c.CompressionType, "default compression.type: producer keeps the producer's codec; uncompressed, gzip, snappy, lz4 or zstd recompresses other codecs into it", false},
		{"compression.gzip.level", kInt32, &c.CompressionGzipLevel, "default compression.gzip.level: -1 or 1..9", false},
		{"compression.lz4.level", kInt32, &c.CompressionLZ4Level, "default compression.lz4.level: 1..17", false},
		{"compression.zstd.level", kInt32, &c.CompressionZstdLevel, "default compression.zstd.level: -131072..22", false},
		{"log.retention.check.interval.ms", kMillis, &c.RetentionCheckInterval, "how often retention runs", false},
		{"log.preallocate", kBool, &c.LogPreallocate, "keep a zeroed region ahead of active segments so flushes are cheaper fdatasyncs (writes the zeros too)", false},
		{"log.wal.enable", kBool, &c.LogWALEnable, "make flush.messages=1 acks durable with one shared, group-committed write-ahead log (data.dir/wal) instead of one fsync per partition", false},
		{"producer.id.expiration.ms", kMillis, &c.ProducerIDExpiration, "idempotent producer state idle this long is removed from a partition (not while a transaction is open); checked with retention", false},
		{"log.cleaner.enable", kBool, &c.LogCleanerEnable, "run the log cleaner that compacts topics with cleanup.policy=compact (not in cluster mode yet)", false},
		{"log.cleaner.threads", kInt, &c.LogCleanerThreads, "partitions cleaned at the same time", false},
		{"log.cleaner.io.max.bytes.per.second", kFloat, &c.LogCleanerIOMaxBytes, "read plus write bytes per second of all cleaner threads together", false},
		{"log.cleaner.dedupe.buffer.size", kInt64, &c.LogCleanerDedupeBytes, "memory for the cleaners' key maps, all threads together; a full map ends a clean early", false},
		{"log.cleaner.backoff.ms", kMillis, &c.LogCleanerBackoff, "pause between checks for partitions to clean", false},
		{"fetch.max.bytes", kInt32, &c.FetchMaxBytes, "upper bound on one Fetch response", false},
		{"max.incremental.fetch.session.cache.slots", kInt, &c.FetchSessionCacheSize, "KIP-227 fetch sessions kept", false},
		{"group.initial.rebalance.delay.ms", kMillis, &c.GroupInitialRebalanceDelay, "delay of the first rebalance of an empty group", false},
		{"group.min.session.timeout.ms", kMillis, &c.GroupMinSessionTimeout, "smallest session timeout a member may ask for", false},
		{"group.max.session.timeout.ms", kMillis, &c.GroupMaxSessionTimeout, "largest session timeout a member may ask for", false},
		{"group.max.size", kInt, &c.GroupMaxSize, "members per group", false},
		{"offsets.retention.minutes", kInt, nil, "(reserved)", false},
		{"transaction.max.timeout.ms", kMillis, &c.TransactionMaxTimeout, "largest transaction.timeout.ms a producer may ask for", false},
		{"transaction.version", kInt16, &c.TransactionVersion, "finalized transaction.version feature advertised in ApiVersions (1 or 2)", false},
		{"transaction.abort.timed.out.transaction.cleanup.interval.ms", kMillis, &c.TransactionReapInterval, "transaction timeout reaper period", false},
		{"transaction.coordinator.workers", kInt, &c.TransactionWorkers, "transaction coordinator workers, each owning slot % N and its own journal (one fdatasync per batch each)", false},
		{"transactional.id.expiration.ms", kMillis, &c.TransactionalIDExpiration, "idle time after which a transactional.id with no open transaction is removed", false},
		{"authorizer.class.name", kString, &c.AuthorizerClassName, "empty allows everything; org.apache.kafka.metadata.authorizer.StandardAuthorizer (or acl) enforces ACLs", false},
		{"super.users", kString, &c.SuperUsers, "principals allowed everything, ';'-separated (User:admin;User:broker)", false},
		{"allow.everyone.if.no.acl.found", kBool, &c.AllowEveryoneIfNoACL, "allow a resource no ACL binding covers", false},
	}, append(append(c.securityEntries(), c.clusterEntries()...), c.consumerGroupEntries()...)...)
}

func (e entry) set(v string) error {
	v = strings.TrimSpace(v)
	switch p := e.ptr.(type) {
	case nil:
		return nil
	case *string:
		*p = v
	case *bool:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		*p = b
	case *int32:
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return err
		}
		*p = int32(n)
	case *int16:
		n, err := strconv.ParseInt(v, 10, 16)
		if err != nil {
			return err
		}
		*p = int16(n)
	case *int:
		n, err := strconv.Atoi(v)
		if err != nil {
			return err
		}
		*p = n
	case *int64:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return err
		}
		*p = n
	case *time.Duration:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return err
		}
		*p = time.Duration(n) * time.Millisecond
	case *float64:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return err
		}
		*p = f
	default:
		return fmt.Errorf("BUG: unhandled config type %T", p)
	}
	return nil
}

func (e entry) String() string {
	switch p := e.ptr.(type) {
	case nil:
		return ""
	case *time.Duration:
		return strconv.FormatInt(p.Milliseconds(), 10)
	default:
		return fmt.Sprint(reflectDeref(p))
	}
}

func reflectDeref(p any) any {
	switch v := p.(type) {
	case *string:
		return *v
	case *bool:
		return *v
	case *int32:
		return *v
	case *int16:
		return *v
	case *int:
		return *v
	case *int64:
		return *v
	case *float64:
		return *v
	}
	return p
}

var aliases = map[string]string{"log.dirs": "data.dir", "log.dir": "data.dir"}

// Set applies one key=value; unknown keys are an error so typos do not pass silently.
func (c *Config) Set(key, value string) error {
	if a, ok := aliases[key]; ok {
		key = a
	}
	if strings.HasPrefix(key, listenerPrefix) {
		return c.setListenerOverride(key, value)
	}
	for _, e := range c.entries() {
		if e.key == key {
			if err := e.set(value); err != nil {
				return fmt.Errorf("cannot parse config %s=%q: %w", key, value, err)
			}
			return nil
		}
	}
	return fmt.Errorf("unknown config key %q", key)
}

// ParseProperties applies a Kafka-style properties stream (key=value, # comments). A line
// ending in an odd number of backslashes continues on the next one, whose leading whitespace is
// dropped (java.util.Properties), which is how a sasl.jaas.config is usually spread over lines.
func (c *Config) ParseProperties(r io.Reader, name string) error {
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || s[0] == '#' || s[0] == '!' {
			continue
		}
		at := line
		for continued(s) && sc.Scan() {
			line++
			s = s[:len(s)-1] + strings.TrimLeft(sc.Text(), " \t\f")
			s = strings.TrimRight(s, " \t\f")
		}
		i := strings.IndexAny(s, "=:")
		if i < 0 {
			return fmt.Errorf("%s:%d: expected key=value", name, at)
		}
		if err := c.Set(strings.TrimSpace(s[:i]), s[i+1:]); err != nil {
			return fmt.Errorf("%s:%d: %w", name, at, err)
		}
	}
	return sc.Err()
}

// continued reports whether a properties line ends in an odd number of backslashes.
func continued(s string) bool {
	n := 0
	for n < len(s) && s[len(s)-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

// EnvName is the environment variable for a key: KAAS_ + upper-cased key with dots as underscores.
func EnvName(key string) string {
	return "KAAS_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// Load builds the configuration from defaults, the file named by --config (or KAAS_CONFIG), the
// environment and the flags in args.
func Load(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	c := Default()
	fs := flag.NewFlagSet("kaas", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("config", getenv("KAAS_CONFIG"), "properties file (Kafka server.properties style)")
	flagVals := map[string]*string{}
	for _, e := range c.entries() {
		flagVals[e.key] = fs.String(e.key, "", e.help+" (default "+e.String()+")")
	}
	fs.String("log.dirs", "", "alias of data.dir")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			return c, fmt.Errorf("cannot open config file: %w", err)
		}
		err = c.ParseProperties(f, *file)
		f.Close()
		if err != nil {
			return c, err
		}
	}
	for _, e := range c.entries() {
		if v := getenv(EnvName(e.key)); v != "" {
			if err := c.Set(e.key, v); err != nil {
				return c, fmt.Errorf("%s: %w", EnvName(e.key), err)
			}
		}
	}
	var ferr error
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "config" || ferr != nil {
			return
		}
		ferr = c.Set(f.Name, f.Value.String())
	})
	if ferr != nil {
		return c, ferr
	}
	return c, c.Validate()
}

// Validate checks ranges, the listeners and the TLS / SASL settings.
func (c *Config) Validate() error {
	var errs []error
	errs = append(errs, c.validateSecurity()...)
	errs = append(errs, c.validateCluster()...)
	errs = append(errs, c.validateConsumerGroup()...)
	if c.BrokerID < 0 {
		errs = append(errs, errors.New("broker.id must be >= 0"))
	}
	if c.SocketRequestMaxByte < 1024 {
		errs = append(errs, errors.New("socket.request.max.bytes must be >= 1024"))
	}
	if c.MaxInflightPerConn < 1 {
		errs = append(errs, errors.New("max.inflight.requests.per.connection must be >= 1"))
	}
	if c.ConnMaxOutboundBytes < 2*int64(c.FetchMaxBytes) {
		// A Fetch response may pass fetch.max.bytes by one batch (KIP-74), and the next
		// response can be queued while the client still reads the previous one.
		errs = append(errs, errors.New("connection.max.outbound.bytes must be >= 2 × fetch.max.bytes"))
	}
	if c.NumPartitions < 1 {
		errs = append(errs, errors.New("num.partitions must be >= 1"))
	}
	if c.LogFlushIntervalMsgs < 1 {
		errs = append(errs, errors.New("log.flush.interval.messages must be >= 1"))
	}
	if c.LogTimestampType != "CreateTime" && c.LogTimestampType != "LogAppendTime" {
		errs = append(errs, errors.New("log.message.timestamp.type must be CreateTime or LogAppendTime"))
	}
	switch c.CompressionType {
	case "producer", "uncompressed", "gzip", "snappy", "lz4", "zstd":
	default:
		errs = append(errs, errors.New("compression.type must be one of producer, uncompressed, gzip, snappy, lz4, zstd"))
	}
	if c.CompressionGzipLevel != -1 && (c.CompressionGzipLevel < 1 || c.CompressionGzipLevel > 9) {
		errs = append(errs, errors.New("compression.gzip.level must be -1 or 1..9"))
	}
	if c.CompressionLZ4Level < 1 || c.CompressionLZ4Level > 17 {
		errs = append(errs, errors.New("compression.lz4.level must be 1..17"))
	}
	if c.CompressionZstdLevel < -131072 || c.CompressionZstdLevel > 22 {
		errs = append(errs, errors.New("compression.zstd.level must be -131072..22"))
	}
	if c.TransactionVersion < 0 || c.TransactionVersion > 2 {
		errs = append(errs, errors.New("transaction.version must be 0, 1 or 2"))
	}
	if c.TransactionalIDExpiration <= 0 {
		errs = append(errs, errors.New("transactional.id.expiration.ms must be positive"))
	}
	// Apache: log.cleaner.threads >= 0, io.max.bytes.per.second a double, dedupe buffer a long;
	// kaas needs one thread to clean at all (log.cleaner.enable=false turns it off) and a
	// positive rate and buffer.
	if c.LogCleanerThreads < 1 {
		errs = append(errs, errors.New("log.cleaner.threads must be >= 1"))
	}
	if !(c.LogCleanerIOMaxBytes > 0) {
		errs = append(errs, errors.New("log.cleaner.io.max.bytes.per.second must be > 0"))
	}
	if c.LogCleanerDedupeBytes < 1<<20 {
		errs = append(errs, errors.New("log.cleaner.dedupe.buffer.size must be >= 1048576"))
	}
	if c.TransactionWorkers < 1 || c.TransactionWorkers > 50 {
		errs = append(errs, errors.New("transaction.coordinator.workers must be 1..50 (there are 50 slots)"))
	}
	switch c.AuthorizerClassName {
	case "", "acl":
	case StandardAuthorizer:
		c.AuthorizerClassName = "acl"
	default:
		errs = append(errs, fmt.Errorf("authorizer.class.name %q is not supported (empty, acl or %s)", c.AuthorizerClassName, StandardAuthorizer))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data.dir must be set"))
	}
	return errors.Join(errs...)
}

// Keys lists every key with its current value, for logging the effective configuration and
// DescribeConfigs. Sensitive values (private keys, inline PEM) are given as Hidden, as Apache
// hides PASSWORD-type configs.
func (c *Config) Keys() []string {
	var out []string
	for _, e := range c.entries() {
		if e.ptr != nil {
			out = append(out, e.key+"="+redact(e.sensitive, e.String()))
		}
	}
	for k, v := range c.ListenerOverrides {
		out = append(out, k+"="+redact(IsSensitive(k), v))
	}
	sort.Strings(out)
	return out
}
