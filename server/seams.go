package server

import (
	"net"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/acl"
	"github.com/kaas-go/kaas/storage"
)

// Operation and ResourceType are Kafka's ACL codes (AclOperation / ResourceType); the KIP-430
// authorized-operations bitsets use the operation codes as bit positions.
type Operation = acl.Operation

const (
	OpRead            = acl.OpRead
	OpWrite           = acl.OpWrite
	OpCreate          = acl.OpCreate
	OpDelete          = acl.OpDelete
	OpAlter           = acl.OpAlter
	OpDescribe        = acl.OpDescribe
	OpClusterAction   = acl.OpClusterAction
	OpDescribeConfigs = acl.OpDescribeConfigs
	OpAlterConfigs    = acl.OpAlterConfigs
	OpIdempotentWrite = acl.OpIdempotentWrite
)

type ResourceType = acl.ResourceType

const (
	ResTopic           = acl.ResourceTopic
	ResGroup           = acl.ResourceGroup
	ResCluster         = acl.ResourceCluster
	ResTransactionalID = acl.ResourceTransactionalID
)

// Authorizer decides whether the principal on a connection, coming from host (the client's IP
// address), may perform op on a resource. The default allows everything; *acl.Authorizer is the
// StandardAuthorizer (authorizer.class.name).
type Authorizer interface {
	Authorize(principal, host string, op Operation, rt ResourceType, name string) bool
}

// typeAuthorizer is the optional "on any resource of this type?" question
// (Authorizer.authorizeByResourceType in Apache); an Authorizer without it answers yes.
type typeAuthorizer interface {
	AuthorizeByResourceType(principal, host string, op Operation, rt ResourceType) bool
}

type allowAll struct{}

func (allowAll) Authorize(string, string, Operation, ResourceType, string) bool { return true }

// authorized is the one call site handlers use.
func (rc *reqCtx) authorized(op Operation, rt ResourceType, name string) bool {
	return rc.s.deps.Authz.Authorize(rc.c.principal(), rc.c.host(), op, rt, name)
}

// authorizedAny is authorized on at least one resource of type rt.
func (rc *reqCtx) authorizedAny(op Operation, rt ResourceType) bool {
	if ta, ok := rc.s.deps.Authz.(typeAuthorizer); ok {
		return ta.AuthorizeByResourceType(rc.c.principal(), rc.c.host(), op, rt)
	}
	return true
}

// authorizedOps is the KIP-430 bitset of the operations in ops the principal holds on a resource.
func (rc *reqCtx) authorizedOps(rt ResourceType, name string, ops []Operation) int32 {
	var bits int32
	for _, op := range ops {
		if rc.authorized(op, rt, name) {
			bits |= 1 << op
		}
	}
	return bits
}

// Operations Apache 4.1 reports per resource type in KIP-430 bitsets (the operations that apply
// to the type, AclEntry.supportedOperations).
var (
	topicOps   = []Operation{OpRead, OpWrite, OpCreate, OpDelete, OpAlter, OpDescribe, OpDescribeConfigs, OpAlterConfigs}
	groupOps   = []Operation{OpRead, OpDescribe, OpDelete, OpDescribeConfigs, OpAlterConfigs}
	clusterOps = []Operation{OpCreate, OpClusterAction, OpDescribeConfigs, OpAlterConfigs, OpIdempotentWrite, OpAlter, OpDescribe}
)

// principal is the authenticated identity of the connection: User:ANONYMOUS on PLAINTEXT (and on
// SSL without a client certificate), the mapped certificate subject on SSL with mTLS, the SASL
// user on SASL listeners (listener.go, sasl.go). Deps.PrincipalFor, set only by tests, names it
// from the remote address instead.
func (c *conn) principal() string {
	if f := c.s.deps.PrincipalFor; f != nil {
		return f(c.addr)
	}
	return c.authPrincipal()
}

// host is the client's IP address as ACL bindings name it.
func (c *conn) host() string {
	if h, _, err := net.SplitHostPort(c.addr); err == nil {
		return h
	}
	return c.addr
}

// TopicDefaults maps the broker-level log.* defaults onto topic configs.
func TopicDefaults(cfg configs.Config) storage.TopicConfig {
	d := storage.DefaultTopicConfig()
	d.RetentionMs = cfg.LogRetentionMs
	d.RetentionBytes = cfg.LogRetentionBytes
	d.SegmentBytes = cfg.LogSegmentBytes
	d.SegmentMs = cfg.LogRollMs
	d.MaxMessageBytes = cfg.MessageMaxBytes
	d.FlushMessages = cfg.LogFlushIntervalMsgs
	d.FlushMs = cfg.LogFlushIntervalMs
	d.TimestampType = cfg.LogTimestampType
	d.TimestampBeforeMaxMs = cfg.LogTimestampBeforeMax
	d.TimestampAfterMaxMs = cfg.LogTimestampAfterMax
	d.CompressionType = cfg.CompressionType
	d.GzipLevel = cfg.CompressionGzipLevel
	d.LZ4Level = cfg.CompressionLZ4Level
	d.ZstdLevel = cfg.CompressionZstdLevel
	return d
}
