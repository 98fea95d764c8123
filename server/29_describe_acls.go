package server

// DescribeAcls: v0-3
//
// Behavior:
//   - DESCRIBE on the cluster first (else CLUSTER_AUTHORIZATION_FAILED, 31); then, with no
//     authorizer configured (authorizer.class.name empty), SECURITY_DISABLED (54), as Apache's
//     AclApis.
//   - A filter carrying an UNKNOWN resource type, pattern type, operation or permission answers
//     INVALID_REQUEST (42) for the whole response (Apache refuses such a request).
//   - The matching bindings are grouped by resource pattern (type, name, pattern type), one entry
//     per pattern with its access control entries, as Apache lists them.
//
// Version notes:
//   - v1: pattern types (KIP-290; v0 is LITERAL only); v2: flexible; v3: USER resources (KIP-554).

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/acl"
)

func init() { register(kmsg.DescribeACLs, 0, 3, handleDescribeACLs) }

const noAuthorizerMsg = "No Authorizer is configured."

func handleDescribeACLs(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeACLsRequest)
	resp := req.ResponseKind().(*kmsg.DescribeACLsResponse)
	if code, msg := aclAdminGate(rc, OpDescribe); code != codec.CodeNone {
		resp.ErrorCode, resp.ErrorMessage = code, kmsg.StringPtr(msg)
		return resp, nil
	}
	f := acl.Filter{
		ResourceType: acl.ResourceType(req.ResourceType), Name: req.ResourceName,
		PatternType: acl.PatternType(req.ResourcePatternType), Principal: req.Principal, Host: req.Host,
		Operation: acl.Operation(req.Operation), Permission: acl.Permission(req.PermissionType),
	}
	if err := f.Validate(); err != nil {
		resp.ErrorCode, resp.ErrorMessage = codec.CodeInvalidRequest, kmsg.StringPtr(err.Error())
		return resp, nil
	}
	type pattern struct {
		rt   acl.ResourceType
		name string
		pt   acl.PatternType
	}
	at := map[pattern]int{}
	for _, b := range rc.s.deps.ACL.Describe(f) {
		p := pattern{b.ResourceType, b.ResourceName, b.PatternType}
		i, ok := at[p]
		if !ok {
			r := kmsg.NewDescribeACLsResponseResource()
			r.ResourceType, r.ResourceName = kmsg.ACLResourceType(p.rt), p.name
			r.ResourcePatternType = kmsg.ACLResourcePatternType(p.pt)
			i = len(resp.Resources)
			at[p] = i
			resp.Resources = append(resp.Resources, r)
		}
		e := kmsg.NewDescribeACLsResponseResourceACL()
		e.Principal, e.Host = b.Principal, b.Host
		e.Operation, e.PermissionType = kmsg.ACLOperation(b.Operation), kmsg.ACLPermissionType(b.Permission)
		resp.Resources[i].ACLs = append(resp.Resources[i].ACLs, e)
	}
	return resp, nil
}

// aclAdminGate is the prologue of the three ACL APIs, in Apache's order: the cluster operation
// (ALTER to change, DESCRIBE to list) before revealing whether an authorizer exists.
func aclAdminGate(rc *reqCtx, op Operation) (int16, string) {
	if !rc.authorized(op, ResCluster, clusterResource) {
		return codec.CodeClusterAuthorizationFailed, "Cluster authorization failed."
	}
	if rc.s.deps.ACL == nil {
		return codec.CodeSecurityDisabled, noAuthorizerMsg
	}
	return codec.CodeNone, ""
}
