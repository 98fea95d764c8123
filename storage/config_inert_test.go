package storage

import (
	"errors"
	"testing"
)

// apacheTopicConfigs is every public topic config of Apache Kafka 4.1's LogConfig, with its
// default as Apache describes it, one value Apache accepts (and how kaas then shows it) and one
// it refuses. kaas refuses a few values Apache accepts (compaction, tiered
// storage, tiny segments); those rows say so in kaasRefuses.
var apacheTopicConfigs = []struct {
	name, def        string
	valid, shown     string
	invalid          string
	kaasRefuses      string // a value Apache accepts that kaas refuses on purpose
	effectiveInKaas  bool
	skipDefaultCheck bool // kaas's default differs from Apache's on purpose
}{
	{name: "cleanup.policy", def: "delete", valid: "compact, delete", shown: "compact,delete", invalid: "forever", effectiveInKaas: true},
	{name: "compression.gzip.level", def: "-1", valid: "9", shown: "9", invalid: "0", effectiveInKaas: true},
	{name: "compression.lz4.level", def: "9", valid: "17", shown: "17", invalid: "18", effectiveInKaas: true},
	{name: "compression.type", def: "producer", valid: "zstd", shown: "zstd", invalid: "GZIP", effectiveInKaas: true},
	{name: "compression.zstd.level", def: "3", valid: "-131072", shown: "-131072", invalid: "23", effectiveInKaas: true},
	{name: "delete.retention.ms", def: "86400000", valid: " 5 ", shown: "5", invalid: "-1", effectiveInKaas: true},
	{name: "file.delete.delay.ms", def: "60000", valid: "0", shown: "0", invalid: "x"},
	{name: "flush.messages", def: "9223372036854775807", valid: "10", shown: "10", invalid: "0", effectiveInKaas: true, skipDefaultCheck: true},
	{name: "flush.ms", def: "9223372036854775807", valid: "1000", shown: "1000", invalid: "-1", effectiveInKaas: true},
	{name: "follower.replication.throttled.replicas", def: "", valid: "0:1, 1:2", shown: "0:1,1:2", invalid: "0:1,*"},
	{name: "index.interval.bytes", def: "4096", valid: "0", shown: "0", invalid: "4294967296"},
	{name: "leader.replication.throttled.replicas", def: "", valid: "*", shown: "*", invalid: "a:1"},
	{name: "local.retention.bytes", def: "-2", valid: "-2", shown: "-2", invalid: "-3"},
	{name: "local.retention.ms", def: "-2", valid: "1000", shown: "1000", invalid: "-3"},
	{name: "max.compaction.lag.ms", def: "9223372036854775807", valid: "1", shown: "1", invalid: "0", effectiveInKaas: true},
	{name: "max.message.bytes", def: "1048588", valid: "0", shown: "0", invalid: "-1", effectiveInKaas: true},
	{name: "message.timestamp.after.max.ms", def: "3600000", valid: "0", shown: "0", invalid: "-1", effectiveInKaas: true},
	{name: "message.timestamp.before.max.ms", def: "9223372036854775807", valid: "0", shown: "0", invalid: "-1", effectiveInKaas: true},
	{name: "message.timestamp.type", def: "CreateTime", valid: "LogAppendTime", shown: "LogAppendTime", invalid: "createtime", effectiveInKaas: true},
	{name: "min.cleanable.dirty.ratio", def: "0.5", valid: "1", shown: "1", invalid: "1.5", effectiveInKaas: true},
	{name: "min.compaction.lag.ms", def: "0", valid: "100", shown: "100", invalid: "-1", effectiveInKaas: true},
	{name: "min.insync.replicas", def: "1", valid: "2", shown: "2", invalid: "0"},
	{name: "preallocate", def: "false", valid: " TRUE ", shown: "true", invalid: "yes"},
	{name: "remote.log.copy.disable", def: "false", valid: "true", shown: "true", invalid: "1"},
	{name: "remote.log.delete.on.disable", def: "false", valid: "true", shown: "true", invalid: "0"},
	{name: "remote.storage.enable", def: "false", valid: "false", shown: "false", invalid: "maybe", kaasRefuses: "true"},
	{name: "retention.bytes", def: "-1", valid: "-7", shown: "-7", invalid: "1.5", effectiveInKaas: true},
	{name: "retention.ms", def: "604800000", valid: "-1", shown: "-1", invalid: "-2", effectiveInKaas: true},
	{name: "segment.bytes", def: "1073741824", valid: "1048576", shown: "1048576", invalid: "2147483648", effectiveInKaas: true},
	{name: "segment.index.bytes", def: "10485760", valid: "4", shown: "4", invalid: "3"},
	{name: "segment.jitter.ms", def: "0", valid: "5", shown: "5", invalid: "-1"},
	{name: "segment.ms", def: "604800000", valid: "1", shown: "1", invalid: "0", effectiveInKaas: true},
	{name: "unclean.leader.election.enable", def: "false", valid: "true", shown: "true", invalid: "on"},
}

func describedValue(c TopicConfig, name string) (string, bool) {
	for _, e := range c.Describe() {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func TestEveryApacheTopicConfigIsAcceptedValidatedAndDescribed(t *testing.T) {
	def := DefaultTopicConfig()
	if got, want := len(def.Describe()), len(apacheTopicConfigs); got != want {
		t.Errorf("kaas describes %d topic configs, Apache 4.1 has %d", got, want)
	}
	for _, k := range apacheTopicConfigs {
		t.Run(k.name, func(t *testing.T) {
			if v, ok := describedValue(def, k.name); !ok {
				t.Fatal("not described")
			} else if !k.skipDefaultCheck && v != k.def {
				t.Errorf("default %q, want Apache's %q", v, k.def)
			}
			c, err := ParseTopicConfigs(def, map[string]string{k.name: k.valid})
			if err != nil {
				t.Fatalf("valid value %q refused: %v", k.valid, err)
			}
			if v, _ := describedValue(c, k.name); v != k.shown {
				t.Errorf("after setting %q described as %q, want %q", k.valid, v, k.shown)
			}
			var ce *ConfigError
			if _, err := ParseTopicConfigs(def, map[string]string{k.name: k.invalid}); !errors.As(err, &ce) || ce.Key != k.name {
				t.Errorf("invalid value %q: %v, want a ConfigError for the key", k.invalid, err)
			}
			if k.kaasRefuses != "" {
				if _, err := ParseTopicConfigs(def, map[string]string{k.name: k.kaasRefuses}); err == nil {
					t.Errorf("%q accepted; kaas cannot honour it", k.kaasRefuses)
				}
			}
			_, inert := InertTopicConfig(k.name)
			if inert == k.effectiveInKaas {
				t.Errorf("InertTopicConfig = %v, want %v", inert, !k.effectiveInKaas)
			}
			// Setting it back to the default restores the default configuration.
			back, err := ParseTopicConfigs(c, map[string]string{k.name: k.def})
			if err == nil && !k.skipDefaultCheck && k.kaasRefuses == "" && k.def != "" && back != def {
				t.Errorf("setting the default back does not restore the default config")
			}
		})
	}
}

func TestTopicConfigsRemovedFromApacheAreUnknown(t *testing.T) {
	for _, name := range []string{"message.format.version", "message.downconversion.enable",
		"message.timestamp.difference.max.ms", "internal.segment.bytes", "no.such.key"} {
		var ce *ConfigError
		if _, err := ParseTopicConfigs(DefaultTopicConfig(), map[string]string{name: "1"}); !errors.As(err, &ce) || ce.Key != name {
			t.Errorf("%s: %v, want an unknown-key ConfigError", name, err)
		}
	}
}

func TestMinCompactionLagAboveMaxIsRefused(t *testing.T) {
	_, err := ParseTopicConfigs(DefaultTopicConfig(), map[string]string{"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Key != "min.compaction.lag.ms" {
		t.Fatalf("min > max compaction lag: %v", err)
	}
}

// Inert keys survive a reopen with the topic's overrides.
func TestInertTopicConfigsPersist(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	if _, err := s.CreateTopic("t", 1, map[string]string{"min.insync.replicas": "2", "segment.jitter.ms": "7"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	got := map[string]ConfigEntry{}
	for _, e := range s.Topic("t").DescribeConfigs() {
		got[e.Name] = e
	}
	for k, v := range map[string]string{"min.insync.replicas": "2", "segment.jitter.ms": "7"} {
		if e := got[k]; e.Value != v || e.Source != SourceDynamicTopic {
			t.Errorf("%s after reopen: %+v", k, e)
		}
	}
	if e := got["unclean.leader.election.enable"]; e.Value != "false" || e.Source != SourceDefault {
		t.Errorf("unclean.leader.election.enable: %+v", e)
	}
}
