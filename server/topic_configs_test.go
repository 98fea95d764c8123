package server

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestTopicConfigsApacheKeysNoEffect: keys Apache 4.1 accepts that change nothing in kaas go
// through CreateTopics, IncrementalAlterConfigs (SET, APPEND on a list, DELETE) and legacy
// AlterConfigs, are described with Apache's types, defaults and sources, and bad values or keys
// Apache no longer has are INVALID_CONFIG.
func TestTopicConfigsApacheKeysNoEffect(t *testing.T) {
	e := newAdminEnv(t)
	e.create(t, "t", 1, map[string]*string{
		"min.insync.replicas":            kadm.StringPtr("2"),
		"unclean.leader.election.enable": kadm.StringPtr("true"),
		"compression.type":               kadm.StringPtr("producer"),
	})
	cs := e.topicConfigs(t, "t")
	for k, want := range map[string]struct {
		v   string
		src kmsg.ConfigSource
	}{
		"min.insync.replicas":            {"2", kmsg.ConfigSourceDynamicTopicConfig},
		"unclean.leader.election.enable": {"true", kmsg.ConfigSourceDynamicTopicConfig},
		"compression.type":               {"producer", kmsg.ConfigSourceDynamicTopicConfig},
		"segment.jitter.ms":              {"0", kmsg.ConfigSourceDefaultConfig},
		"local.retention.ms":             {"-2", kmsg.ConfigSourceDefaultConfig},
		"min.cleanable.dirty.ratio":      {"0.5", kmsg.ConfigSourceDefaultConfig},
		"remote.storage.enable":          {"false", kmsg.ConfigSourceDefaultConfig},
	} {
		c, ok := cs[k]
		if !ok || c.Value == nil || *c.Value != want.v || c.Source != want.src {
			t.Errorf("%s: %+v, want %q from %v", k, c, want.v, want.src)
		}
	}

	// v3+ carries the Kafka type.
	req := kmsg.NewPtrDescribeConfigsRequest()
	req.Version = 4
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, "t"
	r.ConfigNames = []string{"preallocate", "min.cleanable.dirty.ratio", "leader.replication.throttled.replicas", "segment.index.bytes"}
	req.Resources = []kmsg.DescribeConfigsRequestResource{r}
	resp := e.rawRequest(t, req).(*kmsg.DescribeConfigsResponse)
	types := map[string]kmsg.ConfigType{}
	for _, c := range resp.Resources[0].Configs {
		types[c.Name] = c.ConfigType
	}
	for k, want := range map[string]kmsg.ConfigType{"preallocate": kmsg.ConfigTypeBoolean, "min.cleanable.dirty.ratio": kmsg.ConfigTypeDouble,
		"leader.replication.throttled.replicas": kmsg.ConfigTypeList, "segment.index.bytes": kmsg.ConfigTypeInt} {
		if types[k] != want {
			t.Errorf("%s type %v, want %v", k, types[k], want)
		}
	}

	alter := func(ops ...kadm.AlterConfig) error {
		t.Helper()
		rs, err := e.adm.AlterTopicConfigs(e.ctx, ops, "t")
		if err != nil {
			t.Fatal(err)
		}
		return rs[0].Err
	}
	if err := alter(kadm.AlterConfig{Op: kadm.SetConfig, Name: "segment.jitter.ms", Value: kadm.StringPtr("100")},
		kadm.AlterConfig{Op: kadm.AppendConfig, Name: "leader.replication.throttled.replicas", Value: kadm.StringPtr("0:0")},
		kadm.AlterConfig{Op: kadm.DeleteConfig, Name: "min.insync.replicas"}); err != nil {
		t.Fatal(err)
	}
	cs = e.topicConfigs(t, "t")
	if c := cs["segment.jitter.ms"]; *c.Value != "100" || c.Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Errorf("segment.jitter.ms after SET: %+v", c)
	}
	if c := cs["leader.replication.throttled.replicas"]; *c.Value != "0:0" || c.Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Errorf("leader.replication.throttled.replicas after APPEND: %+v", c)
	}
	if c := cs["min.insync.replicas"]; *c.Value != "1" || c.Source != kmsg.ConfigSourceDefaultConfig {
		t.Errorf("min.insync.replicas after DELETE: %+v", c)
	}

	for k, v := range map[string]string{
		"min.insync.replicas":           "0",
		"compression.type":              "GZIP", // the values are case-sensitive, as in Apache
		"remote.storage.enable":         "true", // no tiered storage
		"message.downconversion.enable": "true", // removed in Apache 4.0
		"segment.index.bytes":           "3",
	} {
		if err := alter(kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: kadm.StringPtr(v)}); !errorsIs(err, kerr.InvalidConfig) {
			t.Errorf("SET %s=%s: %v, want INVALID_CONFIG", k, v, err)
		}
		rs, err := e.adm.CreateTopic(e.ctx, 1, 1, map[string]*string{k: kadm.StringPtr(v)}, "bad")
		if err == nil {
			err = rs.Err
		}
		if !errorsIs(err, kerr.InvalidConfig) {
			t.Errorf("CreateTopics with %s=%s: %v, want INVALID_CONFIG", k, v, err)
		}
	}

	// Legacy AlterConfigs replaces the whole set.
	ar := kmsg.NewPtrAlterConfigsRequest()
	ar.Version = 2
	res := kmsg.NewAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, "t"
	c := kmsg.NewAlterConfigsRequestResourceConfig()
	c.Name, c.Value = "file.delete.delay.ms", kadm.StringPtr("0")
	res.Configs = []kmsg.AlterConfigsRequestResourceConfig{c}
	ar.Resources = []kmsg.AlterConfigsRequestResource{res}
	if got := e.rawRequest(t, ar).(*kmsg.AlterConfigsResponse).Resources[0].ErrorCode; got != 0 {
		t.Fatalf("AlterConfigs: code %d", got)
	}
	cs = e.topicConfigs(t, "t")
	if c := cs["file.delete.delay.ms"]; *c.Value != "0" || c.Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Errorf("file.delete.delay.ms after AlterConfigs: %+v", c)
	}
	if c := cs["segment.jitter.ms"]; c.Source != kmsg.ConfigSourceDefaultConfig {
		t.Errorf("segment.jitter.ms survived a legacy AlterConfigs without it: %+v", c)
	}
}
