package storage

// Topic configs Apache Kafka 4.1 accepts that change nothing in kaas, plus the compaction keys
// the cleaner reads (live: stored the same way, but acted on; cleaner.go).
//
// Apache's LogConfig defines 33 public topic keys. kaas honours the ones in configKeys
// (config.go). The rest are listed here: they are validated exactly as Apache's ConfigDef
// validates them (type, range, list shape), stored with the topic's overrides, and described
// with their Apache default, so tools that set them (Kafka Streams sets min.insync.replicas and
// segment.index.bytes on its internal topics, Connect and Terraform providers set many) work,
// and a value Apache would refuse is refused with INVALID_CONFIG (40) too. Why each has no
// effect is in its reason field and in README ("Per-topic configs").
//
// Keys Apache 4.1 no longer has (message.format.version, message.downconversion.enable,
// message.timestamp.difference.max.ms, all removed in 4.0) are unknown here as there:
// INVALID_CONFIG.

import (
	"math"
	"strconv"
	"strings"
)

type inertKind int

const (
	inertInt           inertKind = iota // Java int
	inertLong                           // Java long
	inertBool                           // true / false, case-insensitive
	inertRatio                          // double in [0, 1]
	inertThrottledList                  // "*" or partition:broker,...
)

// inertKey is one accepted-but-inert topic config.
type inertKey struct {
	name   string
	kind   inertKind
	def    string
	lo, hi int64
	// Why it has no effect in kaas (shown in the README; kept here next to the key), or, with
	// live, what it does: the compaction keys are kept in TopicConfig.Inert for their Apache
	// validation and description, but the cleaner reads them (TopicConfig.inertValue).
	reason string
	live   bool
}

// inertKeys is indexed by TopicConfig.Inert.
var inertKeys = [...]inertKey{
	{name: "delete.retention.ms", kind: inertLong, def: "86400000", lo: 0, hi: math.MaxInt64,
		live: true, reason: "tombstone and transaction marker retention of compacted topics (cleaner.go)"},
	{name: "file.delete.delay.ms", kind: inertLong, def: "60000", lo: 0, hi: math.MaxInt64,
		reason: "kaas deletes a removed segment's files at once"},
	{name: "follower.replication.throttled.replicas", kind: inertThrottledList, def: "",
		reason: "no replication"},
	{name: "index.interval.bytes", kind: inertInt, def: "4096", lo: 0, hi: math.MaxInt32,
		reason: "the index interval is store-wide in kaas"},
	{name: "leader.replication.throttled.replicas", kind: inertThrottledList, def: "",
		reason: "no replication"},
	{name: "local.retention.bytes", kind: inertLong, def: "-2", lo: -2, hi: math.MaxInt64,
		reason: "tiered storage only"},
	{name: "local.retention.ms", kind: inertLong, def: "-2", lo: -2, hi: math.MaxInt64,
		reason: "tiered storage only"},
	{name: "max.compaction.lag.ms", kind: inertLong, def: i64(math.MaxInt64), lo: 1, hi: math.MaxInt64,
		live: true, reason: "longest a record stays uncompacted (cleaner.go)"},
	{name: "min.cleanable.dirty.ratio", kind: inertRatio, def: "0.5",
		live: true, reason: "dirty share of the log that makes it worth cleaning (cleaner.go)"},
	{name: "min.compaction.lag.ms", kind: inertLong, def: "0", lo: 0, hi: math.MaxInt64,
		live: true, reason: "shortest time a record stays uncompacted (cleaner.go)"},
	{name: "min.insync.replicas", kind: inertInt, def: "1", lo: 1, hi: math.MaxInt32,
		reason: "one replica per partition: acks=all waits for the leader's fsync"},
	{name: "preallocate", kind: inertBool, def: "false",
		reason: "pre-zeroing is the broker's log.preallocate, store-wide"},
	{name: "remote.log.copy.disable", kind: inertBool, def: "false",
		reason: "tiered storage only"},
	{name: "remote.log.delete.on.disable", kind: inertBool, def: "false",
		reason: "tiered storage only"},
	{name: "remote.storage.enable", kind: inertBool, def: "false",
		reason: "tiered storage only; true is refused, as by an Apache broker without remote.log.storage.system.enable"},
	{name: "segment.index.bytes", kind: inertInt, def: "10485760", lo: 4, hi: math.MaxInt32,
		reason: "kaas indexes are in memory, written whole on roll"},
	{name: "segment.jitter.ms", kind: inertLong, def: "0", lo: 0, hi: math.MaxInt64,
		reason: "segments roll at segment.ms exactly"},
	{name: "unclean.leader.election.enable", kind: inertBool, def: "false",
		reason: "one replica per partition: there is no other leader to elect"},
}

const numInertKeys = len(inertKeys)

// parseJavaInt parses like Integer.parseInt / Long.parseLong after ConfigDef's trim.
func parseJavaInt(v string, bits int) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, bits)
	return n, err == nil
}

// check validates v for k and returns the value to store, or a reason.
func (k *inertKey) check(v string) (string, string) {
	switch k.kind {
	case inertInt, inertLong:
		bits := 32
		if k.kind == inertLong {
			bits = 64
		}
		n, ok := parseJavaInt(v, bits)
		if !ok {
			if bits == 32 {
				return "", "not a 32-bit integer"
			}
			return "", "not an integer"
		}
		if n < k.lo || n > k.hi {
			if k.hi == math.MaxInt64 || k.hi == math.MaxInt32 {
				return "", "must be at least " + i64(k.lo)
			}
			return "", "must be in [" + i64(k.lo) + ", " + i64(k.hi) + "]"
		}
		return i64(n), ""
	case inertBool:
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "true":
			if k.name == "remote.storage.enable" {
				return "", "tiered storage is not available in kaas (Apache answers the same when remote.log.storage.system.enable=false)"
			}
			return "true", ""
		case "false":
			return "false", ""
		}
		return "", "must be true or false"
	case inertRatio:
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return "", "not a number"
		}
		if f < 0 || f > 1 { // as Apache's Range.between, which lets NaN through
			return "", "must be in [0, 1]"
		}
		return strings.TrimSpace(v), ""
	case inertThrottledList:
		// Apache's ThrottledReplicaListValidator: "*" alone, or partitionId:brokerId entries.
		var items []string
		for _, it := range strings.Split(v, ",") {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, it)
			}
		}
		if len(items) == 1 && items[0] == "*" {
			return "*", ""
		}
		for _, it := range items {
			p, b, ok := strings.Cut(it, ":")
			if !ok || !allDigits(p) || !allDigits(b) {
				return "", "must be * or a list of partitionId:brokerId"
			}
		}
		return strings.Join(items, ","), ""
	}
	return "", "unsupported"
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func init() {
	for i := range inertKeys {
		k := &inertKeys[i]
		configKeys = append(configKeys, configKey{
			name: k.name,
			get: func(c *TopicConfig) string {
				if v := c.Inert[i]; v != "" {
					return v
				}
				return k.def
			},
			set: func(c *TopicConfig, v string) string {
				nv, reason := k.check(v)
				if reason == "" {
					c.Inert[i] = nv
					if nv == k.def {
						c.Inert[i] = ""
					}
				}
				return reason
			},
		})
	}
}

// InertTopicConfig reports whether name is an Apache topic config that kaas stores and
// describes but does not act on, and why.
func InertTopicConfig(name string) (reason string, ok bool) {
	for i := range inertKeys {
		if inertKeys[i].name == name && !inertKeys[i].live {
			return inertKeys[i].reason, true
		}
	}
	return "", false
}
