package server

// DescribeConfigs: v1-4
//
// Behavior:
//   - TOPIC: every key storage supports (storage.TopicConfig.Describe), with its effective value.
//     Source: DYNAMIC_TOPIC_CONFIG (1) for a topic override; otherwise STATIC_BROKER_CONFIG (4)
//     when the broker-level default (server.properties / flags) differs from Kafka's built-in
//     default, else DEFAULT_CONFIG (5). ReadOnly and IsSensitive are false, Documentation null.
//     kafka-configs --describe and kafka-topics --describe --topics-with-overrides both pick the
//     overrides out by Source == DYNAMIC_TOPIC_CONFIG. Needs DESCRIBE_CONFIGS on the topic (29);
//     an unknown topic is UNKNOWN_TOPIC_OR_PARTITION (3), an illegal name INVALID_TOPIC_EXCEPTION.
//   - BROKER: the resource name must be our broker id (all our broker configs, read-only, source
//     STATIC_BROKER_CONFIG when set away from the built-in default, else DEFAULT_CONFIG) or ""
//     (Kafka answers "" with the dynamic cluster-wide defaults only; kaas has no dynamic broker
//     configs, so the list is empty). Any other name is INVALID_REQUEST, as in Apache's
//     ConfigHelper. Needs DESCRIBE_CONFIGS on the cluster (31).
//   - BROKER_LOGGER: an empty list (no runtime-adjustable loggers).
//   - Other resource types: INVALID_REQUEST.
//   - ConfigNames (when non-empty) filters the keys; unknown names are simply absent.
//   - IncludeSynonyms: the entry's sources in precedence order (topic override, broker-level
//     value under Kafka's broker key name, built-in default).
//
// Version notes: v0 was removed by Kafka 4.0 (KIP-896); v1 Source + synonyms (IsDefault is only
// on the wire in v0); v2 throttle semantics; v3 ConfigType + documentation; v4 flexible.

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.DescribeConfigs, 1, 4, handleDescribeConfigs) }

// cfgEntry is one described config, independent of the response type it ends up in.
type cfgEntry struct {
	name     string
	value    string
	source   kmsg.ConfigSource
	readOnly bool
	typ      kmsg.ConfigType
	synonyms []cfgSynonym
}

type cfgSynonym struct {
	name   string
	value  string
	source kmsg.ConfigSource
}

// topicConfigMeta is Kafka's type and broker-level synonym of each topic config storage knows.
var topicConfigMeta = map[string]struct {
	broker string
	typ    kmsg.ConfigType
}{
	"retention.ms":                    {"log.retention.ms", kmsg.ConfigTypeLong},
	"retention.bytes":                 {"log.retention.bytes", kmsg.ConfigTypeLong},
	"segment.bytes":                   {"log.segment.bytes", kmsg.ConfigTypeInt},
	"segment.ms":                      {"log.roll.ms", kmsg.ConfigTypeLong},
	"max.message.bytes":               {"message.max.bytes", kmsg.ConfigTypeInt},
	"cleanup.policy":                  {"log.cleanup.policy", kmsg.ConfigTypeList},
	"message.timestamp.type":          {"log.message.timestamp.type", kmsg.ConfigTypeString},
	"message.timestamp.before.max.ms": {"log.message.timestamp.before.max.ms", kmsg.ConfigTypeLong},
	"message.timestamp.after.max.ms":  {"log.message.timestamp.after.max.ms", kmsg.ConfigTypeLong},
	"flush.messages":                  {"log.flush.interval.messages", kmsg.ConfigTypeLong},
	"flush.ms":                        {"log.flush.interval.ms", kmsg.ConfigTypeLong},
	"compression.type":                {"compression.type", kmsg.ConfigTypeString},
	"compression.gzip.level":          {"compression.gzip.level", kmsg.ConfigTypeInt},
	"compression.lz4.level":           {"compression.lz4.level", kmsg.ConfigTypeInt},
	"compression.zstd.level":          {"compression.zstd.level", kmsg.ConfigTypeInt},
	// Accepted and shown, no effect in kaas (storage/config_inert.go). Broker synonyms as
	// Apache 4.1 describes them; "" = none (only a topic override is listed as a synonym).
	"delete.retention.ms":                     {"log.cleaner.delete.retention.ms", kmsg.ConfigTypeLong},
	"file.delete.delay.ms":                    {"log.segment.delete.delay.ms", kmsg.ConfigTypeLong},
	"follower.replication.throttled.replicas": {"", kmsg.ConfigTypeList},
	"index.interval.bytes":                    {"log.index.interval.bytes", kmsg.ConfigTypeInt},
	"leader.replication.throttled.replicas":   {"", kmsg.ConfigTypeList},
	"local.retention.bytes":                   {"log.local.retention.bytes", kmsg.ConfigTypeLong},
	"local.retention.ms":                      {"log.local.retention.ms", kmsg.ConfigTypeLong},
	"max.compaction.lag.ms":                   {"log.cleaner.max.compaction.lag.ms", kmsg.ConfigTypeLong},
	"min.cleanable.dirty.ratio":               {"log.cleaner.min.cleanable.ratio", kmsg.ConfigTypeDouble},
	"min.compaction.lag.ms":                   {"log.cleaner.min.compaction.lag.ms", kmsg.ConfigTypeLong},
	"min.insync.replicas":                     {"min.insync.replicas", kmsg.ConfigTypeInt},
	"preallocate":                             {"log.preallocate", kmsg.ConfigTypeBoolean},
	"remote.log.copy.disable":                 {"", kmsg.ConfigTypeBoolean},
	"remote.log.delete.on.disable":            {"", kmsg.ConfigTypeBoolean},
	"remote.storage.enable":                   {"", kmsg.ConfigTypeBoolean},
	"segment.index.bytes":                     {"log.index.size.max.bytes", kmsg.ConfigTypeInt},
	"segment.jitter.ms":                       {"", kmsg.ConfigTypeLong}, // log.roll.jitter.ms has no default: Apache shows no synonym
	"unclean.leader.election.enable":          {"unclean.leader.election.enable", kmsg.ConfigTypeBoolean},
}

// topicDefaults is the broker-level default topic configuration (what a topic without overrides
// gets): storage's Defaults, which cmd/kaas fills from the broker's log.* settings.
func topicDefaults(rc *reqCtx) storage.TopicConfig { return rc.s.deps.Store.Defaults() }

// describeTopicEntries describes a topic whose effective configuration is cfg, whose topic-level
// overrides are overrides and whose broker-level defaults are brokerDefaults. (Storage's
// Topic.DescribeConfigs has the same sources but no synonyms, and needs an existing topic, which
// a validate-only CreateTopics does not have.)
func describeTopicEntries(cfg storage.TopicConfig, overrides map[string]string, brokerDefaults storage.TopicConfig) []cfgEntry {
	builtin := entryValues(storage.DefaultTopicConfig().Describe())
	brokerLevel := entryValues(brokerDefaults.Describe())
	described := cfg.Describe()
	out := make([]cfgEntry, 0, len(described))
	for _, d := range described {
		meta, ok := topicConfigMeta[d.Name]
		typ := meta.typ
		if !ok {
			typ = kmsg.ConfigTypeString
		}
		bkey := meta.broker
		if ok && bkey == "" {
			// No broker-level synonym in Apache (throttled replicas, tiered storage keys):
			// the value is the topic's own or Apache's built-in default.
			e := cfgEntry{name: d.Name, value: d.Value, typ: typ, source: kmsg.ConfigSourceDefaultConfig}
			if ov, over := overrides[d.Name]; over {
				e.source = kmsg.ConfigSourceDynamicTopicConfig
				e.synonyms = []cfgSynonym{{d.Name, ov, kmsg.ConfigSourceDynamicTopicConfig}}
			}
			out = append(out, e)
			continue
		}
		if bkey == "" {
			bkey = d.Name
		}
		e := cfgEntry{name: d.Name, value: d.Value, typ: typ}
		// Without an override the effective value is the broker-level default, whatever storage
		// was configured with; that keeps the source honest even if topicDefaults lags behind.
		bv, def := d.Value, builtin[d.Name]
		e.source = kmsg.ConfigSourceDefaultConfig
		if ov, ok := overrides[d.Name]; ok {
			e.source = kmsg.ConfigSourceDynamicTopicConfig
			e.synonyms = append(e.synonyms, cfgSynonym{d.Name, ov, kmsg.ConfigSourceDynamicTopicConfig})
			bv = brokerLevel[d.Name]
		}
		if bv != def {
			if e.source == kmsg.ConfigSourceDefaultConfig {
				e.source = kmsg.ConfigSourceStaticBrokerConfig
			}
			e.synonyms = append(e.synonyms, cfgSynonym{bkey, bv, kmsg.ConfigSourceStaticBrokerConfig})
		}
		e.synonyms = append(e.synonyms, cfgSynonym{bkey, def, kmsg.ConfigSourceDefaultConfig})
		out = append(out, e)
	}
	return out
}

func entryValues(es []storage.ConfigEntry) map[string]string {
	m := make(map[string]string, len(es))
	for _, e := range es {
		m[e.Name] = e.Value
	}
	return m
}

// brokerConfigTypes are the Kafka types of broker keys whose type cannot be guessed from the value.
var brokerConfigTypes = map[string]kmsg.ConfigType{
	"broker.id":                                kmsg.ConfigTypeInt,
	"node.id":                                  kmsg.ConfigTypeInt,
	"num.partitions":                           kmsg.ConfigTypeInt,
	"num.network.threads":                      kmsg.ConfigTypeInt,
	"message.max.bytes":                        kmsg.ConfigTypeInt,
	"socket.request.max.bytes":                 kmsg.ConfigTypeInt,
	"log.segment.bytes":                        kmsg.ConfigTypeInt,
	"default.replication.factor":               kmsg.ConfigTypeInt,
	"min.insync.replicas":                      kmsg.ConfigTypeInt,
	"offsets.topic.replication.factor":         kmsg.ConfigTypeShort,
	"transaction.state.log.replication.factor": kmsg.ConfigTypeShort,
	"transaction.state.log.min.isr":            kmsg.ConfigTypeInt,
	"transaction.version":                      kmsg.ConfigTypeShort,
	"log.cleanup.policy":                       kmsg.ConfigTypeList,
	"log.cleaner.threads":                      kmsg.ConfigTypeInt,
	"log.cleaner.io.max.bytes.per.second":      kmsg.ConfigTypeDouble,
	"log.dirs":                                 kmsg.ConfigTypeString,
	"listeners":                                kmsg.ConfigTypeString,
	"advertised.listeners":                     kmsg.ConfigTypeString,
}

// describeBrokerEntries lists this broker's configuration: every configs.Config key (Kafka's names
// where Kafka has one) plus the fixed facts of a single-broker cluster that tools look for.
func describeBrokerEntries(cfg configs.Config) []cfgEntry {
	cur := keyValues(cfg.Keys())
	def := configs.Default()
	defs := keyValues(def.Keys())
	// Kafka spells each listener as a URL; kaas also takes a bare host:port (PLAINTEXT).
	cur["listeners"] = listenerURLs(cur["listeners"])
	defs["listeners"] = listenerURLs(defs["listeners"])
	cur["advertised.listeners"] = listenerURLs(cur["advertised.listeners"])
	cur["log.dirs"], defs["log.dirs"] = cur["data.dir"], defs["data.dir"]
	id := strconv.Itoa(int(cfg.BrokerID))
	cur["node.id"], defs["node.id"] = id, strconv.Itoa(int(def.BrokerID))
	// Facts, not settings: one broker means one replica and an ISR of one.
	for k, v := range map[string]string{
		"default.replication.factor":               "1",
		"min.insync.replicas":                      "1",
		"offsets.topic.replication.factor":         "1",
		"transaction.state.log.replication.factor": "1",
		"transaction.state.log.min.isr":            "1",
		"log.cleanup.policy":                       "delete",
	} {
		cur[k], defs[k] = v, v
	}

	names := make([]string, 0, len(cur))
	for k := range cur {
		names = append(names, k)
	}
	slices.Sort(names)
	out := make([]cfgEntry, 0, len(names))
	for _, k := range names {
		v, d := cur[k], defs[k]
		e := cfgEntry{name: k, value: v, readOnly: true, typ: brokerConfigType(k, v)}
		if v != d {
			e.source = kmsg.ConfigSourceStaticBrokerConfig
			e.synonyms = append(e.synonyms, cfgSynonym{k, v, kmsg.ConfigSourceStaticBrokerConfig})
		} else {
			e.source = kmsg.ConfigSourceDefaultConfig
		}
		e.synonyms = append(e.synonyms, cfgSynonym{k, d, kmsg.ConfigSourceDefaultConfig})
		out = append(out, e)
	}
	return out
}

// listenerURLs writes a listeners value in Kafka's NAME://host:port form.
func listenerURLs(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		if p = strings.TrimSpace(p); p != "" && !strings.Contains(p, "://") {
			p = "PLAINTEXT://" + p
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

func brokerConfigType(k, v string) kmsg.ConfigType {
	if t, ok := brokerConfigTypes[k]; ok {
		return t
	}
	if v == "true" || v == "false" {
		return kmsg.ConfigTypeBoolean
	}
	if _, err := strconv.ParseInt(v, 10, 64); err == nil {
		return kmsg.ConfigTypeLong
	}
	return kmsg.ConfigTypeString
}

// keyValues splits configs.Config.Keys() ("k=v" lines) into a map.
func keyValues(kvs []string) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// brokerResource checks a BROKER resource name: our id, or "" for the cluster-wide default.
func brokerResource(rc *reqCtx, name string) (isDefault bool, code int16, msg string) {
	if name == "" {
		return true, codec.CodeNone, ""
	}
	id, err := strconv.ParseInt(name, 10, 32)
	if err != nil || id < 0 || id > math.MaxInt32 {
		return false, codec.CodeInvalidRequest, fmt.Sprintf("Broker resource name %q is not a broker id.", name)
	}
	if int32(id) != rc.s.cfg.BrokerID {
		return false, codec.CodeInvalidRequest,
			fmt.Sprintf("Unexpected broker id: this is broker %d; expected %d or an empty name, got %s.", rc.s.cfg.BrokerID, rc.s.cfg.BrokerID, name)
	}
	return false, codec.CodeNone, ""
}

func handleDescribeConfigs(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeConfigsRequest)
	resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
	for i := range req.Resources {
		rr := &req.Resources[i]
		r := kmsg.NewDescribeConfigsResponseResource()
		r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
		entries, code, msg := describeResource(rc, rr)
		r.ErrorCode = code
		if msg != "" {
			r.ErrorMessage = &msg
		}
		if code == codec.CodeNone {
			r.Configs = make([]kmsg.DescribeConfigsResponseResourceConfig, 0, len(entries))
			for _, e := range entries {
				if !wantConfig(rr.ConfigNames, e.name) {
					continue
				}
				r.Configs = append(r.Configs, describedConfig(req, e))
			}
		}
		resp.Resources = append(resp.Resources, r)
	}
	return resp, nil
}

func describeResource(rc *reqCtx, rr *kmsg.DescribeConfigsRequestResource) ([]cfgEntry, int16, string) {
	switch rr.ResourceType {
	case kmsg.ConfigResourceTypeTopic:
		if !rc.authorized(OpDescribeConfigs, ResTopic, rr.ResourceName) {
			return nil, codec.CodeTopicAuthorizationFailed, ""
		}
		if err := storage.ValidateTopicName(rr.ResourceName); err != nil {
			return nil, codec.CodeInvalidTopicException, err.Error()
		}
		t := rc.s.deps.Store.Topic(rr.ResourceName)
		if t == nil {
			return nil, codec.CodeUnknownTopicOrPartition, fmt.Sprintf("Topic '%s' does not exist.", rr.ResourceName)
		}
		return describeTopicEntries(t.Config(), t.Overrides(), topicDefaults(rc)), codec.CodeNone, ""
	case kmsg.ConfigResourceTypeBroker:
		if !rc.authorized(OpDescribeConfigs, ResCluster, clusterResource) {
			return nil, codec.CodeClusterAuthorizationFailed, ""
		}
		isDefault, code, msg := brokerResource(rc, rr.ResourceName)
		if code != codec.CodeNone || isDefault {
			return nil, code, msg
		}
		return describeBrokerEntries(rc.s.cfg), codec.CodeNone, ""
	case kmsg.ConfigResourceTypeBrokerLogger:
		if !rc.authorized(OpDescribeConfigs, ResCluster, clusterResource) {
			return nil, codec.CodeClusterAuthorizationFailed, ""
		}
		if _, code, msg := brokerResource(rc, rr.ResourceName); code != codec.CodeNone {
			return nil, code, msg
		}
		return nil, codec.CodeNone, ""
	default:
		return nil, codec.CodeInvalidRequest, fmt.Sprintf("Resource type %v is not supported by DescribeConfigs.", rr.ResourceType)
	}
}

// wantConfig applies the request's ConfigNames filter (null or empty = every key).
func wantConfig(names []string, name string) bool {
	if len(names) == 0 {
		return true
	}
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

func describedConfig(req *kmsg.DescribeConfigsRequest, e cfgEntry) kmsg.DescribeConfigsResponseResourceConfig {
	c := kmsg.NewDescribeConfigsResponseResourceConfig()
	c.Name = e.name
	v := e.value
	c.Value = &v
	c.ReadOnly = e.readOnly
	c.IsDefault = e.source == kmsg.ConfigSourceDefaultConfig
	c.Source = e.source
	// Apache answers a PASSWORD-type config (a private key) with a null value, flagged sensitive.
	c.IsSensitive = configs.IsSensitive(e.name)
	if c.IsSensitive {
		c.Value = nil
	}
	c.ConfigType = e.typ
	if req.IncludeSynonyms {
		for _, s := range e.synonyms {
			syn := kmsg.NewDescribeConfigsResponseResourceConfigConfigSynonym()
			syn.Name, syn.Source = s.name, s.source
			sv := s.value
			syn.Value = &sv
			if c.IsSensitive {
				syn.Value = nil
			}
			c.ConfigSynonyms = append(c.ConfigSynonyms, syn)
		}
	}
	return c
}
