package storage

import (
	"errors"
	"strings"
	"testing"
)

func TestParseTopicConfigs(t *testing.T) {
	def := DefaultTopicConfig()
	f := func(kv map[string]string, wantErrKey string) TopicConfig {
		t.Helper()
		c, err := ParseTopicConfigs(def, kv)
		if wantErrKey == "" {
			if err != nil {
				t.Fatalf("%v: unexpected error %v", kv, err)
			}
			return c
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Key != wantErrKey || ErrorCode(err) != 40 {
			t.Fatalf("%v: want ConfigError for %q, got %v", kv, wantErrKey, err)
		}
		if !strings.Contains(err.Error(), wantErrKey) {
			t.Fatalf("error does not name the key: %v", err)
		}
		return c
	}
	c := f(map[string]string{"retention.ms": "-1", "segment.bytes": "1024", "message.timestamp.type": "LogAppendTime", "flush.messages": "100"}, "")
	if c.RetentionMs != -1 || c.SegmentBytes != 1024 || c.TimestampType != TimestampLogAppendTime || c.FlushMessages != 100 {
		t.Fatalf("parsed %+v", c)
	}
	if c.MaxMessageBytes != def.MaxMessageBytes {
		t.Fatal("unset key changed")
	}
	f(map[string]string{"no.such.key": "1"}, "no.such.key")
	f(map[string]string{"segment.bytes": "100"}, "segment.bytes")
	f(map[string]string{"segment.bytes": "abc"}, "segment.bytes")
	f(map[string]string{"retention.ms": "-2"}, "retention.ms")
	f(map[string]string{"flush.messages": "0"}, "flush.messages")
	f(map[string]string{"message.timestamp.type": "Foo"}, "message.timestamp.type")
	cc, err := ParseTopicConfigs(def, map[string]string{"cleanup.policy": "Delete , compact"})
	if err != nil || cc.CleanupPolicy != "delete,compact" || !cc.compacted() || !cc.deletes() {
		t.Fatalf("compact,delete: %+v %v", cc.CleanupPolicy, err)
	}
	f(map[string]string{"cleanup.policy": "compact,forever"}, "cleanup.policy")
	f(map[string]string{"cleanup.policy": ""}, "cleanup.policy")
}

func TestDescribeConfigs(t *testing.T) {
	entries := DefaultTopicConfig().Describe()
	if len(entries) != len(configKeys) || len(entries) < 11 {
		t.Fatalf("%d entries", len(entries))
	}
	for _, e := range entries {
		if !e.IsDefault || e.Source != SourceDefault {
			t.Fatalf("default entry %+v", e)
		}
	}
	s := openStore(t, "")
	defer s.Close()
	top, err := s.CreateTopic("d", 1, map[string]string{"retention.ms": "1000"})
	if err != nil {
		t.Fatal(err)
	}
	seen := false
	for _, e := range top.DescribeConfigs() {
		if e.Name == "retention.ms" {
			seen = true
			if e.IsDefault || e.Value != "1000" || e.Source != SourceDynamicTopic {
				t.Fatalf("override %+v", e)
			}
		} else if !e.IsDefault {
			t.Fatalf("non-override %+v", e)
		}
	}
	if !seen {
		t.Fatal("retention.ms missing")
	}
}
