package server

// AlterClientQuotas: v0-1
//
// Behavior:
//   - ALTER_CONFIGS on the cluster (else every entry CLUSTER_AUTHORIZATION_FAILED, 31), as
//     Apache.
//   - Per entry: the entity is a user, a client-id or both (a null name is the <default>); an
//     empty entity, a repeated or unknown entity type (ip quotas are not supported) answers
//     INVALID_REQUEST (42). Ops set or remove producer_byte_rate / consumer_byte_rate (positive
//     whole numbers) and request_percentage (positive); any other key, a bad value or a key
//     twice is INVALID_REQUEST. validate_only checks without storing.
//   - A valid entry is durable (coord/quota Store) before the answer and applies to the next
//     request of every connection it matches.
//
// Version notes:
//   - v1: flexible.

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/quota"
)

func init() { register(kmsg.AlterClientQuotas, 0, 1, handleAlterClientQuotas) }

func handleAlterClientQuotas(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.AlterClientQuotasRequest)
	resp := req.ResponseKind().(*kmsg.AlterClientQuotasResponse)
	allowed := rc.authorized(OpAlterConfigs, ResCluster, clusterResource)
	for _, e := range req.Entries {
		out := kmsg.NewAlterClientQuotasResponseEntry()
		for _, ent := range e.Entity {
			r := kmsg.NewAlterClientQuotasResponseEntryEntity()
			r.Type, r.Name = ent.Type, ent.Name
			out.Entity = append(out.Entity, r)
		}
		var err error
		switch {
		case !allowed:
			out.ErrorCode = codec.CodeClusterAuthorizationFailed
		case rc.s.deps.Quotas == nil:
			out.ErrorCode = codec.CodeUnknownServerError
		default:
			err = alterClientQuota(rc, e, req.ValidateOnly)
		}
		if err != nil {
			out.ErrorCode = codec.CodeUnknownServerError
			if errors.Is(err, quota.ErrInvalid) {
				out.ErrorCode = codec.CodeInvalidRequest
			} else {
				rc.s.log.Error("cannot alter client quota", zap.Error(err))
			}
			out.ErrorMessage = kmsg.StringPtr(err.Error())
		}
		resp.Entries = append(resp.Entries, out)
	}
	return resp, nil
}

func alterClientQuota(rc *reqCtx, e kmsg.AlterClientQuotasRequestEntry, validateOnly bool) error {
	var ent quota.Entity
	if len(e.Entity) == 0 {
		return fmt.Errorf("%w: the entity is empty", quota.ErrInvalid)
	}
	for _, p := range e.Entity {
		n := quota.Name{Present: true, Default: p.Name == nil}
		if p.Name != nil {
			n.Name = *p.Name
		}
		var slot *quota.Name
		switch p.Type {
		case quota.TypeUser:
			slot = &ent.User
		case quota.TypeClientID:
			slot = &ent.Client
		default:
			return fmt.Errorf("%w: entity type %q is not supported (user, client-id)", quota.ErrInvalid, p.Type)
		}
		if slot.Present {
			return fmt.Errorf("%w: entity type %q appears more than once", quota.ErrInvalid, p.Type)
		}
		*slot = n
	}
	ops := make([]quota.Op, len(e.Ops))
	for i, op := range e.Ops {
		ops[i] = quota.Op{Key: op.Key, Value: op.Value, Remove: op.Remove}
	}
	if err := rc.s.deps.Quotas.Alter(ent, ops, validateOnly); err != nil {
		return err
	}
	if !validateOnly {
		rc.s.log.Info("client quota altered", zap.Stringer("entity", ent), zap.String("principal", rc.c.principal()))
	}
	return nil
}
