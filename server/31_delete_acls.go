package server

// DeleteAcls: v0-3
//
// Behavior:
//   - ALTER on the cluster (else every result CLUSTER_AUTHORIZATION_FAILED, 31); no authorizer
//     configured → every result SECURITY_DISABLED (54).
//   - Each filter carrying an UNKNOWN field answers INVALID_REQUEST (42) on its own; the other
//     filters still apply. Every binding some valid filter matches is removed in one durable
//     change, and each filter's result lists the bindings it matched (a binding two filters match
//     is listed under both, as Apache does).
//
// Version notes:
//   - v1: pattern types (KIP-290); v2: flexible; v3: USER resources (KIP-554).

import (
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/acl"
)

func init() { register(kmsg.DeleteACLs, 0, 3, handleDeleteACLs) }

func handleDeleteACLs(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DeleteACLsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteACLsResponse)
	resp.Results = make([]kmsg.DeleteACLsResponseResult, len(req.Filters))
	for i := range resp.Results {
		resp.Results[i] = kmsg.NewDeleteACLsResponseResult()
	}
	if code, msg := aclAdminGate(rc, OpAlter); code != codec.CodeNone {
		for i := range resp.Results {
			resp.Results[i].ErrorCode, resp.Results[i].ErrorMessage = code, kmsg.StringPtr(msg)
		}
		return resp, nil
	}
	var filters []acl.Filter
	var at []int
	for i, rf := range req.Filters {
		f := acl.Filter{
			ResourceType: acl.ResourceType(rf.ResourceType), Name: rf.ResourceName,
			PatternType: acl.PatternType(rf.ResourcePatternType), Principal: rf.Principal, Host: rf.Host,
			Operation: acl.Operation(rf.Operation), Permission: acl.Permission(rf.PermissionType),
		}
		if err := f.Validate(); err != nil {
			resp.Results[i].ErrorCode, resp.Results[i].ErrorMessage = codec.CodeInvalidRequest, kmsg.StringPtr(err.Error())
			continue
		}
		filters = append(filters, f)
		at = append(at, i)
	}
	if len(filters) == 0 {
		return resp, nil
	}
	matched, err := rc.s.deps.ACL.Delete(filters)
	if err != nil {
		rc.s.log.Error("cannot delete ACLs", zap.Error(err))
		for _, i := range at {
			resp.Results[i].ErrorCode = codec.CodeUnknownServerError
			resp.Results[i].ErrorMessage = kmsg.StringPtr("The ACL change could not be stored.")
		}
		return resp, nil
	}
	n := 0
	for j, i := range at {
		for _, b := range matched[j] {
			m := kmsg.NewDeleteACLsResponseResultMatchingACL()
			m.ResourceType, m.ResourceName = kmsg.ACLResourceType(b.ResourceType), b.ResourceName
			m.ResourcePatternType = kmsg.ACLResourcePatternType(b.PatternType)
			m.Principal, m.Host = b.Principal, b.Host
			m.Operation, m.PermissionType = kmsg.ACLOperation(b.Operation), kmsg.ACLPermissionType(b.Permission)
			resp.Results[i].MatchingACLs = append(resp.Results[i].MatchingACLs, m)
			n++
		}
	}
	if n > 0 {
		rc.s.log.Info("ACLs deleted", zap.Int("bindings", n), zap.String("principal", rc.c.principal()))
	}
	return resp, nil
}
