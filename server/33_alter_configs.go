package server

// AlterConfigs: v0-2 (the legacy, non-incremental API; kafka-configs and the Java AdminClient use
// IncrementalAlterConfigs today, older tools and some libraries still send this).
//
// Behavior (per resource; a resource named twice answers INVALID_REQUEST and is not applied):
//   - TOPIC: set-all semantics, as in Apache: the request's configs become the topic's complete
//     set of overrides; every override not named is removed. Checks as IncrementalAlterConfigs:
//     ALTER_CONFIGS (29), illegal name (17), unknown topic (3), a key named twice or a null value
//     is INVALID_REQUEST, unknown keys and unsupported values INVALID_CONFIG (40) with the reason.
//   - ValidateOnly checks everything and changes nothing.
//   - BROKER: static in kaas; a non-empty change set is INVALID_REQUEST (an empty one succeeds:
//     there are no dynamic broker configs to remove).
//   - Other resource types: INVALID_REQUEST.
//
// Version notes: v1 throttle semantics; v2 flexible.

import (
	"fmt"
	"maps"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.AlterConfigs, 0, 2, handleAlterConfigs) }

func handleAlterConfigs(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.AlterConfigsRequest)
	resp := req.ResponseKind().(*kmsg.AlterConfigsResponse)
	dups := duplicateResources(len(req.Resources), func(i int) (kmsg.ConfigResourceType, string) {
		return req.Resources[i].ResourceType, req.Resources[i].ResourceName
	})
	for i := range req.Resources {
		rr := &req.Resources[i]
		r := kmsg.NewAlterConfigsResponseResource()
		r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
		var code int16
		var msg string
		if dups[i] {
			code, msg = codec.CodeInvalidRequest, "The resource appears more than once in the request."
		} else {
			code, msg = alterConfigsOne(rc, req.ValidateOnly, rr)
		}
		r.ErrorCode = code
		if msg != "" {
			r.ErrorMessage = &msg
		}
		resp.Resources = append(resp.Resources, r)
	}
	return resp, nil
}

func alterConfigsOne(rc *reqCtx, validateOnly bool, rr *kmsg.AlterConfigsRequestResource) (int16, string) {
	switch rr.ResourceType {
	case kmsg.ConfigResourceTypeTopic:
		t, code, msg := alterableTopic(rc, rr.ResourceName)
		if code != codec.CodeNone {
			return code, msg
		}
		kv := make(map[string]string, len(rr.Configs))
		for _, c := range rr.Configs {
			if _, dup := kv[c.Name]; dup {
				return codec.CodeInvalidRequest, fmt.Sprintf("Config '%s' appears more than once for this resource.", c.Name)
			}
			if c.Value == nil {
				return codec.CodeInvalidRequest, fmt.Sprintf("Null value not supported for config '%s'.", c.Name)
			}
			kv[c.Name] = *c.Value
		}
		// Set-all: every override the request does not name is removed, in one change (the
		// TopicAdmin's, cluster-wide in cluster mode).
		return applyTopicConfigs(rc, t, func(map[string]string) (map[string]string, error) { return maps.Clone(kv), nil }, validateOnly)
	case kmsg.ConfigResourceTypeBroker:
		return alterBrokerConfigs(rc, rr.ResourceName, len(rr.Configs), func(i int) string { return rr.Configs[i].Name })
	default:
		return codec.CodeInvalidRequest, fmt.Sprintf("Altering configs of resource type %v is not supported.", rr.ResourceType)
	}
}
