package server

// CreateAcls: v0-3
//
// Behavior:
//   - ALTER on the cluster (else every result CLUSTER_AUTHORIZATION_FAILED, 31); no authorizer
//     configured → every result SECURITY_DISABLED (54).
//   - Each creation is validated as Apache's authorizer does (acl.Binding.Validate): concrete
//     resource type, operation and permission, LITERAL or PREFIXED pattern, non-empty name, a
//     Type:name principal, the cluster named kafka-cluster; a bad one answers INVALID_REQUEST (42)
//     with the reason and the valid ones of the same request are still created.
//   - The valid bindings are made durable together (acl.Store) before the answer, and apply to
//     every connection's next request. Creating an existing binding succeeds and stores it once.
//   - A store failure answers UNKNOWN_SERVER_ERROR for the bindings of that request.
//
// Version notes:
//   - v1: pattern types (KIP-290); v2: flexible; v3: USER resources (KIP-554).

import (
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/acl"
)

func init() { register(kmsg.CreateACLs, 0, 3, handleCreateACLs) }

func handleCreateACLs(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.CreateACLsRequest)
	resp := req.ResponseKind().(*kmsg.CreateACLsResponse)
	resp.Results = make([]kmsg.CreateACLsResponseResult, len(req.Creations))
	for i := range resp.Results {
		resp.Results[i] = kmsg.NewCreateACLsResponseResult()
	}
	if code, msg := aclAdminGate(rc, OpAlter); code != codec.CodeNone {
		for i := range resp.Results {
			resp.Results[i].ErrorCode, resp.Results[i].ErrorMessage = code, kmsg.StringPtr(msg)
		}
		return resp, nil
	}
	var valid []acl.Binding
	var at []int
	for i, c := range req.Creations {
		b := acl.Binding{
			ResourceType: acl.ResourceType(c.ResourceType), ResourceName: c.ResourceName,
			PatternType: acl.PatternType(c.ResourcePatternType), Principal: c.Principal, Host: c.Host,
			Operation: acl.Operation(c.Operation), Permission: acl.Permission(c.PermissionType),
		}
		if err := b.Validate(); err != nil {
			resp.Results[i].ErrorCode, resp.Results[i].ErrorMessage = codec.CodeInvalidRequest, kmsg.StringPtr(err.Error())
			continue
		}
		valid = append(valid, b)
		at = append(at, i)
	}
	if len(valid) == 0 {
		return resp, nil
	}
	if err := rc.s.deps.ACL.Create(valid); err != nil {
		rc.s.log.Error("cannot create ACLs", zap.Error(err))
		for _, i := range at {
			resp.Results[i].ErrorCode = codec.CodeUnknownServerError
			resp.Results[i].ErrorMessage = kmsg.StringPtr("The ACLs could not be stored.")
		}
		return resp, nil
	}
	rc.s.log.Info("ACLs created", zap.Int("bindings", len(valid)), zap.String("principal", rc.c.principal()))
	return resp, nil
}
