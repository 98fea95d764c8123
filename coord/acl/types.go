// Package acl is the broker's authorizer: Apache Kafka's StandardAuthorizer semantics (KIP-801)
// over an in-memory index of ACL bindings that a durable Store keeps across restarts.
//
// Decision order for one check (principal P from host H wants operation O on resource R):
//
//	super user? ──yes──▶ ALLOW
//	    │no
//	bindings whose pattern covers R (literal R, literal "*", every prefix of R)
//	    │ keep those for P or User:*, for H or "*"
//	    ├─ a DENY for O or ALL ─────────────────────────▶ DENY   (deny wins)
//	    ├─ an ALLOW for O, ALL, or an op implying O ───▶ ALLOW
//	    └─ none: no binding covers R at all and
//	       allow.everyone.if.no.acl.found ─────────────▶ ALLOW, else DENY
//
// Implications (Apache's AclOperation docs): READ, WRITE, DELETE and ALTER imply DESCRIBE;
// ALTER_CONFIGS implies DESCRIBE_CONFIGS. They apply to ALLOW only: a DENY of READ does not deny
// DESCRIBE.
package acl

import (
	"errors"
	"fmt"
	"strings"
)

// ResourceType is Kafka's ResourceType code (org.apache.kafka.common.resource.ResourceType).
type ResourceType int8

const (
	ResourceUnknown         ResourceType = 0
	ResourceAny             ResourceType = 1
	ResourceTopic           ResourceType = 2
	ResourceGroup           ResourceType = 3
	ResourceCluster         ResourceType = 4
	ResourceTransactionalID ResourceType = 5
	ResourceDelegationToken ResourceType = 6
	ResourceUser            ResourceType = 7
)

func (r ResourceType) String() string {
	switch r {
	case ResourceAny:
		return "Any"
	case ResourceTopic:
		return "Topic"
	case ResourceGroup:
		return "Group"
	case ResourceCluster:
		return "Cluster"
	case ResourceTransactionalID:
		return "TransactionalId"
	case ResourceDelegationToken:
		return "DelegationToken"
	case ResourceUser:
		return "User"
	}
	return fmt.Sprintf("Unknown(%d)", int8(r))
}

// concrete reports whether r may appear in a stored binding (not UNKNOWN or ANY).
func (r ResourceType) concrete() bool { return r >= ResourceTopic && r <= ResourceUser }

// PatternType is Kafka's PatternType code. MATCH and ANY appear only in filters.
type PatternType int8

const (
	PatternUnknown  PatternType = 0
	PatternAny      PatternType = 1
	PatternMatch    PatternType = 2
	PatternLiteral  PatternType = 3
	PatternPrefixed PatternType = 4
)

func (p PatternType) String() string {
	switch p {
	case PatternAny:
		return "Any"
	case PatternMatch:
		return "Match"
	case PatternLiteral:
		return "Literal"
	case PatternPrefixed:
		return "Prefixed"
	}
	return fmt.Sprintf("Unknown(%d)", int8(p))
}

// Operation is Kafka's AclOperation code; the KIP-430 authorized-operations bitsets use these
// codes as bit positions.
type Operation int8

const (
	OpUnknown         Operation = 0
	OpAny             Operation = 1
	OpAll             Operation = 2
	OpRead            Operation = 3
	OpWrite           Operation = 4
	OpCreate          Operation = 5
	OpDelete          Operation = 6
	OpAlter           Operation = 7
	OpDescribe        Operation = 8
	OpClusterAction   Operation = 9
	OpDescribeConfigs Operation = 10
	OpAlterConfigs    Operation = 11
	OpIdempotentWrite Operation = 12
	OpCreateTokens    Operation = 13
	OpDescribeTokens  Operation = 14
	OpTwoPhaseCommit  Operation = 15 // KIP-939, on TransactionalId
)

func (o Operation) concrete() bool { return o >= OpAll && o <= OpTwoPhaseCommit }

// Permission is Kafka's AclPermissionType code.
type Permission int8

const (
	PermUnknown Permission = 0
	PermAny     Permission = 1
	PermDeny    Permission = 2
	PermAllow   Permission = 3
)

// Wildcard is the literal resource name and host that match everything, and WildcardPrincipal
// the principal that matches every user.
const (
	Wildcard          = "*"
	WildcardPrincipal = "User:*"
	// ClusterName is the only name of the CLUSTER resource (Kafka's "kafka-cluster").
	ClusterName = "kafka-cluster"
)

// Binding is one ACL: a resource pattern and an access control entry (Kafka's AclBinding).
type Binding struct {
	ResourceType ResourceType `json:"resourceType"`
	ResourceName string       `json:"resourceName"`
	PatternType  PatternType  `json:"patternType"`
	Principal    string       `json:"principal"`
	Host         string       `json:"host"`
	Operation    Operation    `json:"operation"`
	Permission   Permission   `json:"permission"`
}

// ErrInvalid marks a binding or filter Kafka answers INVALID_REQUEST for.
var ErrInvalid = errors.New("invalid ACL")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Validate applies Apache's checks on a new binding (AclControlManager.validateNewAcl): every
// field concrete, the pattern LITERAL or PREFIXED, a non-empty name, a Type:name principal, and
// the cluster resource named kafka-cluster.
func (b Binding) Validate() error {
	switch {
	case !b.ResourceType.concrete():
		return invalid("invalid resource type %s", b.ResourceType)
	case b.PatternType != PatternLiteral && b.PatternType != PatternPrefixed:
		return invalid("invalid pattern type %s", b.PatternType)
	case b.ResourceName == "":
		return invalid("resource name should not be empty")
	case !b.Operation.concrete():
		return invalid("invalid operation %d", b.Operation)
	case b.Permission != PermAllow && b.Permission != PermDeny:
		return invalid("invalid permission type %d", b.Permission)
	case b.ResourceType == ResourceCluster && b.ResourceName != ClusterName:
		return invalid("the only valid name for the CLUSTER resource is %s", ClusterName)
	case b.Host == "":
		return invalid("host should not be empty")
	}
	if i := strings.IndexByte(b.Principal, ':'); i <= 0 || i == len(b.Principal)-1 {
		return invalid("could not parse principal %q (want Type:name)", b.Principal)
	}
	return nil
}

// Filter selects bindings (Kafka's AclBindingFilter). A nil Name, Principal or Host matches any
// value; ResourceAny, PatternAny, OpAny and PermAny match any value. PatternMatch selects every
// binding that would apply to the resource Name: the literal, the "*" literal and the prefixes
// of Name.
type Filter struct {
	ResourceType ResourceType
	Name         *string
	PatternType  PatternType
	Principal    *string
	Host         *string
	Operation    Operation
	Permission   Permission
}

// Validate rejects the UNKNOWN values Kafka refuses in a filter (INVALID_REQUEST).
func (f Filter) Validate() error {
	switch {
	case f.ResourceType == ResourceUnknown || f.ResourceType > ResourceUser || f.ResourceType < 0:
		return invalid("invalid resource type filter %d", f.ResourceType)
	case f.PatternType <= PatternUnknown || f.PatternType > PatternPrefixed:
		return invalid("invalid pattern type filter %d", f.PatternType)
	case f.Operation <= OpUnknown || f.Operation > OpTwoPhaseCommit:
		return invalid("invalid operation filter %d", f.Operation)
	case f.Permission <= PermUnknown || f.Permission > PermAllow:
		return invalid("invalid permission filter %d", f.Permission)
	}
	return nil
}

// Matches is Kafka's AclBindingFilter.matches.
func (f Filter) Matches(b Binding) bool {
	if f.ResourceType != ResourceAny && f.ResourceType != b.ResourceType {
		return false
	}
	if f.PatternType != PatternAny && f.PatternType != PatternMatch && f.PatternType != b.PatternType {
		return false
	}
	if f.Name != nil {
		name := *f.Name
		if f.PatternType == PatternMatch {
			switch b.PatternType {
			case PatternLiteral:
				if b.ResourceName != name && b.ResourceName != Wildcard {
					return false
				}
			case PatternPrefixed:
				if !strings.HasPrefix(name, b.ResourceName) {
					return false
				}
			default:
				return false
			}
		} else if b.ResourceName != name {
			return false
		}
	}
	if f.Principal != nil && *f.Principal != b.Principal {
		return false
	}
	if f.Host != nil && *f.Host != b.Host {
		return false
	}
	if f.Operation != OpAny && f.Operation != b.Operation {
		return false
	}
	return f.Permission == PermAny || f.Permission == b.Permission
}
