package server

// IncrementalAlterConfigs: v0-1
//
// Behavior (per resource; a resource named twice in one request answers INVALID_REQUEST for each
// occurrence and neither is applied):
//   - TOPIC: ALTER_CONFIGS on the topic, else TOPIC_AUTHORIZATION_FAILED (29); illegal name →
//     INVALID_TOPIC_EXCEPTION (17); unknown topic → UNKNOWN_TOPIC_OR_PARTITION (3). The operations:
//     SET (0) sets an override (a null value is INVALID_REQUEST); DELETE (1) removes an override
//     (the topic falls back to the broker-level default; deleting an absent override is a no-op);
//     APPEND (2) / SUBTRACT (3) add or remove items of a list-typed config (cleanup.policy, the
//     *.replication.throttled.replicas lists) starting from its effective value, and are
//     INVALID_CONFIG for any other key, as in Apache.
//     A key named twice in one resource is INVALID_REQUEST. Unknown keys and values storage does
//     not accept are INVALID_CONFIG (40) with the reason. All operations of a resource are validated together
//     and applied in one storage call, so a resource is changed entirely or not at all.
//   - ValidateOnly checks everything and changes nothing.
//   - BROKER: kaas's broker configuration is static (properties file, KAAS_* environment, flags,
//     read at start). A request that changes anything answers INVALID_REQUEST naming the keys,
//     like Apache's answer for keys that are not dynamically updatable; an empty change set
//     succeeds. The resource name must be our broker id or "" (cluster default).
//   - BROKER_LOGGER and other types: INVALID_REQUEST.
//
// Version notes: v1 flexible.

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.IncrementalAlterConfigs, 0, 1, handleIncrementalAlterConfigs) }

func handleIncrementalAlterConfigs(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.IncrementalAlterConfigsRequest)
	resp := req.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
	dups := duplicateResources(len(req.Resources), func(i int) (kmsg.ConfigResourceType, string) {
		return req.Resources[i].ResourceType, req.Resources[i].ResourceName
	})
	for i := range req.Resources {
		rr := &req.Resources[i]
		r := kmsg.NewIncrementalAlterConfigsResponseResource()
		r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
		var code int16
		var msg string
		if dups[i] {
			code, msg = codec.CodeInvalidRequest, "The resource appears more than once in the request."
		} else {
			code, msg = incrementalAlterOne(rc, req.ValidateOnly, rr)
		}
		r.ErrorCode = code
		if msg != "" {
			r.ErrorMessage = &msg
		}
		resp.Resources = append(resp.Resources, r)
	}
	return resp, nil
}

// duplicateResources marks the resources (of n) that share type and name with another one.
func duplicateResources(n int, at func(int) (kmsg.ConfigResourceType, string)) []bool {
	type key struct {
		t    kmsg.ConfigResourceType
		name string
	}
	count := make(map[key]int, n)
	for i := 0; i < n; i++ {
		t, name := at(i)
		count[key{t, name}]++
	}
	dup := make([]bool, n)
	for i := 0; i < n; i++ {
		t, name := at(i)
		dup[i] = count[key{t, name}] > 1
	}
	return dup
}

func incrementalAlterOne(rc *reqCtx, validateOnly bool, rr *kmsg.IncrementalAlterConfigsRequestResource) (int16, string) {
	switch rr.ResourceType {
	case kmsg.ConfigResourceTypeTopic:
		t, code, msg := alterableTopic(rc, rr.ResourceName)
		if code != codec.CodeNone {
			return code, msg
		}
		// Checked here on the request alone; the values are computed and validated by edit
		// below against the overrides as they are when applied (in cluster mode the registry's,
		// which another broker may have changed meanwhile: APPEND then adds to that).
		seen := make(map[string]bool, len(rr.Configs))
		effective := entryValues(t.Config().Describe())
		for _, c := range rr.Configs {
			if seen[c.Name] {
				return codec.CodeInvalidRequest, fmt.Sprintf("Config '%s' appears more than once for this resource.", c.Name)
			}
			seen[c.Name] = true
			if _, known := effective[c.Name]; !known {
				return codec.CodeInvalidConfig, fmt.Sprintf("Unknown or unsupported topic config '%s'.", c.Name)
			}
			switch c.Op {
			case kmsg.IncrementalAlterConfigOpSet:
				if c.Value == nil {
					return codec.CodeInvalidRequest, fmt.Sprintf("SET of '%s' needs a value; use DELETE to remove an override.", c.Name)
				}
			case kmsg.IncrementalAlterConfigOpDelete:
			case kmsg.IncrementalAlterConfigOpAppend, kmsg.IncrementalAlterConfigOpSubtract:
				verb := "append"
				if c.Op == kmsg.IncrementalAlterConfigOpSubtract {
					verb = "subtract"
				}
				if topicConfigMeta[c.Name].typ != kmsg.ConfigTypeList {
					return codec.CodeInvalidConfig,
						fmt.Sprintf("Config value %s is not allowed for config key '%s': it is not a list.", verb, c.Name)
				}
				if c.Value == nil {
					return codec.CodeInvalidRequest, fmt.Sprintf("%s on '%s' needs a value.", strings.ToUpper(verb), c.Name)
				}
			default:
				return codec.CodeInvalidRequest, fmt.Sprintf("Unknown config operation %d for '%s'.", c.Op, c.Name)
			}
		}
		if len(rr.Configs) == 0 {
			return codec.CodeNone, ""
		}
		edit := func(cur map[string]string) (map[string]string, error) {
			next := maps.Clone(cur)
			if next == nil {
				next = make(map[string]string, len(rr.Configs))
			}
			for _, c := range rr.Configs {
				switch c.Op {
				case kmsg.IncrementalAlterConfigOpSet:
					next[c.Name] = *c.Value
				case kmsg.IncrementalAlterConfigOpDelete:
					delete(next, c.Name)
				default: // APPEND, SUBTRACT: from the override, else the effective value
					v, ok := cur[c.Name]
					if !ok {
						v = effective[c.Name]
					}
					next[c.Name] = editList(v, *c.Value, c.Op == kmsg.IncrementalAlterConfigOpAppend)
				}
			}
			return next, nil
		}
		return applyTopicConfigs(rc, t, edit, validateOnly)
	case kmsg.ConfigResourceTypeBroker:
		return alterBrokerConfigs(rc, rr.ResourceName, len(rr.Configs), func(i int) string { return rr.Configs[i].Name })
	default:
		return codec.CodeInvalidRequest, fmt.Sprintf("Altering configs of resource type %v is not supported.", rr.ResourceType)
	}
}

// editList appends (or subtracts) the comma-separated items of v to (from) the list cur, keeping
// order and dropping duplicates and blanks: Kafka's list semantics for APPEND/SUBTRACT.
func editList(cur, v string, add bool) string {
	split := func(s string) []string {
		var out []string
		for _, it := range strings.Split(s, ",") {
			if it = strings.TrimSpace(it); it != "" {
				out = append(out, it)
			}
		}
		return out
	}
	items, change := split(cur), split(v)
	var out []string
	for _, it := range items {
		if add || !slices.Contains(change, it) {
			if !slices.Contains(out, it) {
				out = append(out, it)
			}
		}
	}
	if add {
		for _, it := range change {
			if !slices.Contains(out, it) {
				out = append(out, it)
			}
		}
	}
	return strings.Join(out, ",")
}

// alterableTopic resolves the topic of an alter-configs resource, checking ALTER_CONFIGS.
func alterableTopic(rc *reqCtx, name string) (*storage.Topic, int16, string) {
	if !rc.authorized(OpAlterConfigs, ResTopic, name) {
		return nil, codec.CodeTopicAuthorizationFailed, ""
	}
	if err := storage.ValidateTopicName(name); err != nil {
		return nil, codec.CodeInvalidTopicException, err.Error()
	}
	t := rc.s.deps.Store.Topic(name)
	if t == nil {
		return nil, codec.CodeUnknownTopicOrPartition, fmt.Sprintf("Topic '%s' does not exist.", name)
	}
	return t, codec.CodeNone, ""
}

// applyTopicConfigs validates the topic's overrides as edit makes them and, unless
// validateOnly, stores them through the TopicAdmin (cluster-wide in cluster mode), all or
// nothing. AlterConfigs (33) shares it with an edit that replaces every override.
func applyTopicConfigs(rc *reqCtx, t *storage.Topic, edit func(cur map[string]string) (map[string]string, error), validateOnly bool) (int16, string) {
	checked := func(cur map[string]string) (map[string]string, error) {
		next, err := edit(cur)
		if err != nil {
			return nil, err
		}
		if _, err := storage.ParseTopicConfigs(topicDefaults(rc), next); err != nil {
			return nil, err
		}
		return next, nil
	}
	if validateOnly {
		if _, err := checked(t.Overrides()); err != nil {
			return codec.CodeInvalidConfig, err.Error()
		}
		return codec.CodeNone, ""
	}
	var applied map[string]string
	err := rc.s.topics().SetTopicConfigs(t.Name, func(cur map[string]string) (map[string]string, error) {
		next, err := checked(cur)
		applied = next
		return next, err
	})
	if err != nil {
		code := storage.ErrorCode(err) // a *storage.ConfigError from edit is INVALID_CONFIG
		if code == codec.CodeKafkaStorageError {
			rc.s.log.Error("cannot alter topic configs", zap.String("topic", t.Name), zap.Error(err))
		}
		return code, err.Error()
	}
	rc.s.log.Info("altered topic configs", zap.String("topic", t.Name), zap.Any("overrides", applied))
	return codec.CodeNone, ""
}

// alterBrokerConfigs answers a BROKER resource of (Incremental)AlterConfigs: kaas broker configs
// are static, so only an empty change set succeeds.
func alterBrokerConfigs(rc *reqCtx, name string, n int, key func(int) string) (int16, string) {
	if !rc.authorized(OpAlterConfigs, ResCluster, clusterResource) {
		return codec.CodeClusterAuthorizationFailed, ""
	}
	if _, code, msg := brokerResource(rc, name); code != codec.CodeNone {
		return code, msg
	}
	if n == 0 {
		return codec.CodeNone, ""
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = key(i)
	}
	return codec.CodeInvalidRequest, fmt.Sprintf(
		"Cannot update these configs dynamically: %s. kaas broker configs are static: set them in the "+
			"properties file, KAAS_* environment or flags and restart the broker.", strings.Join(keys, ", "))
}
