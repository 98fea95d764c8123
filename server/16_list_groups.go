package server

// ListGroups: v0-5
//
// Behavior:
//   - Every group this broker coordinates: those in memory and those that only have committed
//     offsets (listed Empty with an empty protocol type, as Apache lists a group loaded from its
//     offsets), so `kafka-consumer-groups --list` sees inactive groups after a restart.
//   - DESCRIBE on the cluster lists everything; otherwise only groups the principal may DESCRIBE.
//     Groups another broker owns (cluster mode) are left out.
//   - v4 states_filter (KIP-518, case-insensitive; a consumer group's states are Empty,
//     Assigning, Reconciling, Stable); v5 types_filter (KIP-848): "classic" or "consumer", with
//     protocol type "consumer" for KIP-848 groups.
//
// Version notes:
//   - v3: flexible; v4: states filter and group_state; v5: types filter and group_type.

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.ListGroups, 0, 5, handleListGroups) }

func handleListGroups(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ListGroupsRequest)
	resp := req.ResponseKind().(*kmsg.ListGroupsResponse)
	if rc.s.deps.Groups == nil {
		resp.ErrorCode = codec.CodeCoordinatorNotAvailable
		return resp, nil
	}
	wantType := func(string) bool { return true }
	if req.Version >= 5 && len(req.TypesFilter) > 0 {
		wantType = func(typ string) bool {
			for _, t := range req.TypesFilter {
				if strings.EqualFold(t, typ) {
					return true
				}
			}
			return false
		}
	}
	var states []string
	if req.Version >= 4 {
		states = req.StatesFilter
	}
	if rc.s.deps.Groups.Loading() {
		// Apache answers COORDINATOR_LOAD_IN_PROGRESS while any of its group shards loads, and
		// still lists the groups it has.
		resp.ErrorCode = codec.CodeCoordinatorLoadInProgress
	}
	all := rc.authorized(OpDescribe, ResCluster, "kafka-cluster")
	for _, g := range rc.s.deps.Groups.ListGroups(states) {
		if !wantType(g.Type) || !rc.s.groupOwner(g.Group).Local || (!all && !rc.authorized(OpDescribe, ResGroup, g.Group)) {
			continue
		}
		lg := kmsg.NewListGroupsResponseGroup()
		lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.Group, g.ProtocolType, g.State, g.Type
		resp.Groups = append(resp.Groups, lg)
	}
	return resp, nil
}
