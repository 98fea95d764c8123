package server

// DescribeCluster: v0-2
//
// Behavior:
//   - ClusterID; ControllerID and Brokers from the topology: the live brokers with an endpoint on
//     our listener, with their rack (null if none), never fenced. A single kaas process is broker
//     and controller, listed at its advertised host:port.
//   - EndpointType (v1+): 1 (brokers) as above. 2 (controllers) answers the controller's node
//     only, since controllers are brokers here; Apache's brokers refuse type 2 with
//     UNSUPPORTED_ENDPOINT_TYPE because their controllers listen elsewhere. Any other type is
//     UNSUPPORTED_ENDPOINT_TYPE too.
//   - ClusterAuthorizedOperations is INT32_MIN unless requested; when requested it is 0 without
//     DESCRIBE on the cluster, else the bitfield of the cluster operations the principal may
//     perform (bit n = Kafka AclOperation code n), as Apache computes it.
//   - No ACL is needed to describe the cluster itself (Apache checks none).
//
// Version notes: v1 EndpointType (KIP-919); v2 IncludeFencedBrokers / IsFenced (KIP-1073).

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.DescribeCluster, 0, 2, handleDescribeCluster) }

func handleDescribeCluster(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeClusterRequest)
	resp := req.ResponseKind().(*kmsg.DescribeClusterResponse)
	s := rc.s
	if req.Version >= 1 {
		resp.EndpointType = req.EndpointType
		if req.EndpointType != 1 && req.EndpointType != 2 {
			msg := fmt.Sprintf("Unknown endpoint type %d; 1 = brokers, 2 = controllers.", req.EndpointType)
			resp.ErrorCode, resp.ErrorMessage = codec.CodeUnsupportedEndpointType, &msg
			return resp, nil
		}
	}
	resp.ClusterID = s.clusterID
	controller := s.deps.Topology.Controller()
	resp.ControllerID = controller
	for _, lb := range s.liveBrokers(rc.c.ln.name) {
		if req.Version >= 1 && req.EndpointType == 2 && lb.id != controller {
			continue
		}
		b := kmsg.NewDescribeClusterResponseBroker()
		b.NodeID, b.Host, b.Port = lb.id, lb.host, lb.port
		if lb.rack != "" {
			rack := lb.rack
			b.Rack = &rack
		}
		resp.Brokers = append(resp.Brokers, b)
	}
	resp.ClusterAuthorizedOperations = authorizedOpsNotRequested
	if req.IncludeClusterAuthorizedOperations {
		resp.ClusterAuthorizedOperations = 0
		if rc.authorized(OpDescribe, ResCluster, clusterResource) {
			resp.ClusterAuthorizedOperations = rc.authorizedOps(ResCluster, clusterResource, clusterOps)
		}
	}
	return resp, nil
}
