package server

import (
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/storage"
)

// Operation and ResourceType follow Kafka's ACL model (AclOperation / ResourceType).
type Operation int8

const (
	OpRead Operation = iota
	OpWrite
	OpCreate
	OpDelete
	OpAlter
	OpDescribe
	OpClusterAction
	OpDescribeConfigs
	OpAlterConfigs
	OpIdempotentWrite
)

type ResourceType int8

const (
	ResTopic ResourceType = iota
	ResGroup
	ResCluster
	ResTransactionalID
)

// Authorizer decides whether the principal on a connection may perform op on a resource. The
// default allows everything; ACLs and SASL principals plug in later without touching handlers.
type Authorizer interface {
	Authorize(principal string, op Operation, rt ResourceType, name string) bool
}

type allowAll struct{}

func (allowAll) Authorize(string, Operation, ResourceType, string) bool { return true }

// authorized is the one call site handlers use.
func (rc *reqCtx) authorized(op Operation, rt ResourceType, name string) bool {
	return rc.s.deps.Authz.Authorize(rc.c.principal(), op, rt, name)
}

// principal is the authenticated identity of the connection: User:ANONYMOUS on PLAINTEXT (and on
// SSL without a client certificate), the mapped certificate subject on SSL with mTLS, the SASL
// user on SASL listeners (listener.go, sasl.go).
func (c *conn) principal() string { return c.authPrincipal() }

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
	return d
}
