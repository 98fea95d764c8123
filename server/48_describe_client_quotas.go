package server

// DescribeClientQuotas: v0-1
//
// Behavior:
//   - DESCRIBE_CONFIGS on the cluster (else CLUSTER_AUTHORIZATION_FAILED, 31, for the response),
//     as Apache.
//   - Components filter by entity type (user, client-id): exact name, the <default> (null
//     name) or any; an unknown entity type, a type named twice, an exact match without a name or
//     a default/any match with one answers INVALID_REQUEST (42). strict leaves out entities that
//     have entity types the filter does not name; no components and not strict lists everything.
//   - Entries (an empty list, never null, when nothing matches: the Java admin client reads
//     it unconditionally) carry the entity (a null name is the <default>) and every quota key set on it.
//
// Version notes:
//   - v1: flexible.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/quota"
)

func init() { register(kmsg.DescribeClientQuotas, 0, 1, handleDescribeClientQuotas) }

func handleDescribeClientQuotas(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeClientQuotasRequest)
	resp := req.ResponseKind().(*kmsg.DescribeClientQuotasResponse)
	if !rc.authorized(OpDescribeConfigs, ResCluster, clusterResource) {
		resp.ErrorCode = codec.CodeClusterAuthorizationFailed
		return resp, nil
	}
	q := rc.s.deps.Quotas
	if q == nil {
		resp.ErrorCode = codec.CodeUnknownServerError
		return resp, nil
	}
	cs := make([]quota.Component, len(req.Components))
	for i, c := range req.Components {
		cs[i] = quota.Component{Type: c.EntityType, Match: int8(c.MatchType), Name: c.Match}
	}
	if err := quota.ValidateFilter(cs); err != nil {
		resp.ErrorCode, resp.ErrorMessage = codec.CodeInvalidRequest, kmsg.StringPtr(err.Error())
		return resp, nil
	}
	// entries is nullable on the wire (null with an error); the Java client reads it as a list.
	resp.Entries = []kmsg.DescribeClientQuotasResponseEntry{}
	for _, e := range q.Describe(cs, req.Strict) {
		out := kmsg.NewDescribeClientQuotasResponseEntry()
		for _, part := range []struct {
			typ string
			n   quota.Name
		}{{quota.TypeUser, e.Entity.User}, {quota.TypeClientID, e.Entity.Client}} {
			if !part.n.Present {
				continue
			}
			ent := kmsg.NewDescribeClientQuotasResponseEntryEntity()
			ent.Type = part.typ
			if !part.n.Default {
				ent.Name = kmsg.StringPtr(part.n.Name)
			}
			out.Entity = append(out.Entity, ent)
		}
		for _, k := range []string{quota.ProducerByteRate, quota.ConsumerByteRate, quota.RequestPercentage} {
			if v, ok := e.Values[k]; ok {
				val := kmsg.NewDescribeClientQuotasResponseEntryValue()
				val.Key, val.Value = k, v
				out.Values = append(out.Values, val)
			}
		}
		resp.Entries = append(resp.Entries, out)
	}
	return resp, nil
}
