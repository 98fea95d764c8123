package server

// WriteTxnMarkers: v0-1
//
// Behavior:
//   - The partition-leader side of Apache's inter-broker marker API; kafka-transactions.sh abort
//     (KIP-664) sends it to the leader of a hanging transaction's partition. CLUSTER_ACTION on the
//     cluster is required, or ALTER on the cluster as Apache 4.1 also accepts (its KafkaApis tries
//     ALTER first, so an operator's admin grant is enough for an abort):
//     CLUSTER_AUTHORIZATION_FAILED (31) on every partition otherwise.
//   - Per marker, per partition (the shared check of topology.go, without a topic ACL):
//     UNKNOWN_TOPIC_OR_PARTITION (3) if it does not exist, NOT_LEADER_OR_FOLLOWER (6) if the
//     topology says another broker leads it (or owns the group shard),
//     INVALID_TOPIC_EXCEPTION (17) for a partition of __transaction_state, else AppendMarker
//     (epoch below the producer's → INVALID_PRODUCER_EPOCH 47, older coordinator epoch →
//     TRANSACTION_COORDINATOR_FENCED 52) and the answer waits until the marker is durable
//     (acks=-1; fsync failure → KAFKA_STORAGE_ERROR 56). Markers go through the same
//     per-partition queue as the coordinator's own (markers.go), so concurrent ones share a Sync.
//   - Partition N of __consumer_offsets (group shard N, owned here): every group of the shard
//     with offsets staged by the producer is completed (commit or abort, one durable record per
//     group) before the answer, as Apache's GroupCoordinator.scheduleHandleTxnCompletion. This is
//     how a transaction coordinator on another broker completes a group (design/cluster.md §6).
//   - Rule P: a marker or completion is answered NONE only once durable and while the broker's
//     lease deadline holds (storage checks it after the sync; the handler checks again).
//   - A marker for a producer whose transaction on the partition is already closed by a marker of
//     the same epoch and coordinator epoch is not written again (a resend after a lost answer:
//     AppendMarker answers the first one's offset); otherwise a marker with no ongoing
//     transaction is written and closes nothing, as in Apache.
//   - A kaas coordinator adds the tagged field tagMarkerPrepareSeq to each marker: the sequence of
//     the prepare it ends (design/cluster.md §4). A marker of the same producer epoch and
//     coordinator epoch whose sequence is not above the last one applied for the producer here is
//     a late copy of an applied marker: answered NONE, not written, even though the producer's
//     next transaction (same epoch under TV1) may be ongoing here by now and would otherwise be
//     closed by it (storage.Partition.AppendMarkerSeq). A request without the tag (an Apache
//     coordinator, kafka-transactions.sh abort) is served by the rules above alone.
//
// Version notes: v1 flexible. (v2, KIP-1228, TransactionVersion per marker, is not served.)

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
)

func init() { register(kmsg.WriteTxnMarkers, 0, 1, handleWriteTxnMarkers) }

// tagMarkerPrepareSeq is the tagged field (WriteTxnMarkers v1+, per marker) carrying the
// coordinator's prepare sequence of the transaction the marker ends, eight bytes big-endian.
// Apache defines no tagged field on a marker (and ignores unknown ones); the number is far from
// the low ones Apache hands out, next to tagTxnOffsetCommitVersion.
const tagMarkerPrepareSeq = 0x6b62

// setMarkerPrepareSeq adds the tag to m (nothing for 0: unknown).
func setMarkerPrepareSeq(m *kmsg.WriteTxnMarkersRequestMarker, seq uint64) {
	if seq == 0 {
		return
	}
	m.UnknownTags.Set(tagMarkerPrepareSeq, binary.BigEndian.AppendUint64(nil, seq))
}

// markerPrepareSeq reads the tag (0: absent or malformed, the untagged rules apply).
func markerPrepareSeq(m *kmsg.WriteTxnMarkersRequestMarker) uint64 {
	var seq uint64
	m.UnknownTags.Each(func(key uint32, val []byte) {
		if key == tagMarkerPrepareSeq && len(val) == 8 {
			seq = binary.BigEndian.Uint64(val)
		}
	})
	return seq
}

func handleWriteTxnMarkers(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.WriteTxnMarkersRequest)
	resp := req.ResponseKind().(*kmsg.WriteTxnMarkersResponse)
	allowed := rc.authorized(OpAlter, ResCluster, clusterResource) || rc.authorized(OpClusterAction, ResCluster, clusterResource)
	var left atomic.Int32
	left.Store(1)
	done := func() {
		if left.Add(-1) == 0 {
			rc.reply(resp)
		}
	}
	rc.deferReply()
	markers := rc.s.deps.Markers
	hooks := markers.testHooks.Load()
	resp.Markers = make([]kmsg.WriteTxnMarkersResponseMarker, len(req.Markers))
	for i := range req.Markers {
		m := &req.Markers[i]
		om := &resp.Markers[i]
		*om = kmsg.NewWriteTxnMarkersResponseMarker()
		om.ProducerID = m.ProducerID
		om.Topics = make([]kmsg.WriteTxnMarkersResponseMarkerTopic, len(m.Topics))
		for j := range m.Topics {
			mt := &m.Topics[j]
			ot := &om.Topics[j]
			*ot = kmsg.NewWriteTxnMarkersResponseMarkerTopic()
			ot.Topic = mt.Topic
			ot.Partitions = make([]kmsg.WriteTxnMarkersResponseMarkerTopicPartition, len(mt.Partitions))
			var tr topicRef
			if allowed {
				tr = rc.lookupTopic(opCallerAuthorized, mt.Topic)
			}
			for k, pn := range mt.Partitions {
				op := &ot.Partitions[k]
				*op = kmsg.NewWriteTxnMarkersResponseMarkerTopicPartition()
				op.Partition = pn
				if !allowed {
					op.ErrorCode = codec.CodeClusterAuthorizationFailed
					continue
				}
				lp, code := rc.localPartition(&tr, pn, -1)
				if code == codec.CodeNone && lp.p == nil && mt.Topic != topology.GroupsTopic {
					code = codec.CodeInvalidTopicException // __transaction_state: no markers there
				}
				if code != codec.CodeNone {
					op.ErrorCode = code
					continue
				}
				left.Add(1)
				answer := func(code int16) {
					if code == codec.CodeNone && lp.p != nil && hooks != nil && hooks.durable != nil &&
						!hooks.durable(mt.Topic, pn, m.ProducerID) {
						return
					}
					defer rc.guard()
					if code == codec.CodeNone && !markers.publishable() {
						// Rule P: durable but past the lease deadline; a successor owns it now.
						code = codec.CodeNotLeaderForPartition
					}
					op.ErrorCode = code
					done()
				}
				if lp.p == nil {
					// A group shard this broker owns (design/cluster.md §6 step 4).
					markers.completeShard(pn, m.ProducerID, m.Committed, answer)
					continue
				}
				if hooks != nil && hooks.received != nil && !hooks.received(mt.Topic, pn, m.ProducerID) {
					continue
				}
				enqueueMarker(lp.p, markerItem{pid: m.ProducerID, epoch: m.ProducerEpoch, commit: m.Committed,
					coordinatorEpoch: m.CoordinatorEpoch, prepareSeq: markerPrepareSeq(m), done: answer})
			}
		}
	}
	done()
	return nil, nil
}
