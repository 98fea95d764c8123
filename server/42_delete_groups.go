package server

// DeleteGroups: v0-2
//
// Behavior:
//   - Per group: DELETE on the group (GROUP_AUTHORIZATION_FAILED), ownership (NOT_COORDINATOR);
//     the coordinator deletes only an Empty group (NON_EMPTY_GROUP otherwise, GROUP_ID_NOT_FOUND
//     for an unknown one) and answers once its committed offsets are durably gone. Staged
//     transactional offsets do not make a group non-empty (Apache) and are discarded with it.
//
// Version notes:
//   - v2: flexible.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.DeleteGroups, 0, 2, handleDeleteGroups) }

func handleDeleteGroups(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DeleteGroupsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteGroupsResponse)
	groups := append([]string(nil), req.Groups...)
	resp.Groups = make([]kmsg.DeleteGroupsResponseGroup, len(groups))
	rc.deferReply()
	f := newFanIn(len(groups), func() { rc.reply(resp) })
	for i, id := range groups {
		r := kmsg.NewDeleteGroupsResponseGroup()
		r.Group = id
		if code := rc.groupGate(OpDelete, id); code != codec.CodeNone {
			r.ErrorCode = code
			resp.Groups[i] = r
			f.finish()
			continue
		}
		rc.s.deps.Groups.DeleteGroup(id, func(code int16) {
			defer rc.guard()
			r.ErrorCode = code
			resp.Groups[i] = r
			f.finish()
		})
	}
	return nil, nil
}
