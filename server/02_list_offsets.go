package server

// ListOffsets: v1-10
//
// Behavior (Apache's KafkaApis.handleListOffsetRequest → Partition.fetchOffsetForTimestamp):
//   - A partition named twice in one request answers INVALID_REQUEST for every occurrence.
//   - TOPIC_AUTHORIZATION_FAILED without Describe on the topic, then UNKNOWN_TOPIC_OR_PARTITION,
//     NOT_LEADER_OR_FOLLOWER, and the KIP-320 CurrentLeaderEpoch check (checkLeaderEpoch).
//   - Timestamp:
//     -2 EARLIEST             → log start offset
//     -1 LATEST               → high watermark, or the LSO at READ_COMMITTED (fetchUpperBound)
//     -3 MAX_TIMESTAMP        → offset and timestamp of the record with the largest timestamp
//     (KIP-734, v7+)
//     -4 EARLIEST_LOCAL       → log start offset (no tiered storage: local = whole log; KIP-405, v8+)
//     -5 LATEST_TIERED        → offset -1, timestamp -1, epoch -1: nothing is tiered (KIP-1005, v9+;
//     Apache answers exactly this when remote storage is off)
//     ts >= 0 (or any other)  → first offset whose record timestamp >= ts
//     The special offsets carry timestamp -1. A lookup by timestamp (and -3) that finds nothing,
//     or finds an offset at or past the isolation's upper bound (not yet visible to consumers),
//     answers offset -1 / timestamp -1 / epoch -1, as Apache filters on lastFetchableOffset.
//   - LeaderEpoch is 0: one broker leads every partition at epoch 0 from offset 0, and Metadata
//     advertises epoch 0.
//
// Version notes: v1 single offset; v2 isolation level; v4 CurrentLeaderEpoch / LeaderEpoch;
// v5 OFFSET_NOT_AVAILABLE possible (never here: no leader change); v6 flexible; v7 -3; v8 -4;
// v9 -5; v10 TimeoutMillis (no remote lookups, so nothing to time out). v11 (-6, earliest pending
// upload, KIP-1023) is not served.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.ListOffsets, 1, 10, handleListOffsets) }

// partitionLeaderEpoch is the leader epoch of every partition: a single broker, no elections.
const partitionLeaderEpoch int32 = 0

// Kafka's ListOffsetsRequest special timestamps.
const (
	listOffsetsLatest        int64 = -1
	listOffsetsEarliest      int64 = -2
	listOffsetsMaxTimestamp  int64 = -3
	listOffsetsEarliestLocal int64 = -4
	listOffsetsLatestTiered  int64 = -5
)

// checkLeaderEpoch is Kafka's Partition.checkCurrentLeaderEpoch (KIP-320): -1 means "no check";
// a smaller epoch than ours is fenced, a larger one is unknown to us.
func checkLeaderEpoch(requested int32) int16 {
	switch {
	case requested == -1:
		return codec.CodeNone
	case requested < partitionLeaderEpoch:
		return codec.CodeFencedLeaderEpoch
	case requested > partitionLeaderEpoch:
		return codec.CodeUnknownLeaderEpoch
	}
	return codec.CodeNone
}

func handleListOffsets(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ListOffsetsRequest)
	resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
	store := rc.s.deps.Store

	type tp struct {
		topic string
		p     int32
	}
	seen := make(map[tp]int)
	for i := range req.Topics {
		for j := range req.Topics[i].Partitions {
			seen[tp{req.Topics[i].Topic, req.Topics[i].Partitions[j].Partition}]++
		}
	}

	resp.Topics = make([]kmsg.ListOffsetsResponseTopic, len(req.Topics))
	for i := range req.Topics {
		rt := &req.Topics[i]
		ot := &resp.Topics[i]
		*ot = kmsg.NewListOffsetsResponseTopic()
		ot.Topic = rt.Topic
		authorized := rc.authorized(OpDescribe, ResTopic, rt.Topic)
		var t *storage.Topic
		if authorized {
			t = store.Topic(rt.Topic)
		}
		ot.Partitions = make([]kmsg.ListOffsetsResponseTopicPartition, len(rt.Partitions))
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			op := &ot.Partitions[j]
			*op = kmsg.NewListOffsetsResponseTopicPartition()
			op.Partition = rp.Partition
			switch {
			case seen[tp{rt.Topic, rp.Partition}] > 1:
				op.ErrorCode = codec.CodeInvalidRequest
			case !authorized:
				op.ErrorCode = codec.CodeTopicAuthorizationFailed
			case t == nil:
				op.ErrorCode = codec.CodeUnknownTopicOrPartition
			default:
				listOffsetsPartition(rc, t, rp, req.IsolationLevel, op)
			}
		}
	}
	return resp, nil
}

func listOffsetsPartition(rc *reqCtx, t *storage.Topic, rp *kmsg.ListOffsetsRequestTopicPartition, isolation int8, op *kmsg.ListOffsetsResponseTopicPartition) {
	p := t.Partition(rp.Partition)
	if p == nil {
		op.ErrorCode = codec.CodeUnknownTopicOrPartition
		return
	}
	if !rc.s.deps.Owner.LeadsPartition(t.Name, rp.Partition) {
		op.ErrorCode = codec.CodeNotLeaderForPartition
		return
	}
	if code := checkLeaderEpoch(rp.CurrentLeaderEpoch); code != codec.CodeNone {
		op.ErrorCode = code
		return
	}
	switch rp.Timestamp {
	case listOffsetsEarliest, listOffsetsEarliestLocal:
		op.Offset, op.Timestamp, op.LeaderEpoch = p.LogStartOffset(), -1, partitionLeaderEpoch
	case listOffsetsLatest:
		op.Offset, op.Timestamp, op.LeaderEpoch = fetchUpperBound(p, isolation), -1, partitionLeaderEpoch
	case listOffsetsLatestTiered:
		op.Offset, op.Timestamp, op.LeaderEpoch = -1, -1, -1
	case listOffsetsMaxTimestamp:
		upTo := fetchUpperBound(p, isolation)
		off, ts := p.MaxTimestamp()
		if off >= 0 && off < upTo {
			op.Offset, op.Timestamp, op.LeaderEpoch = off, ts, partitionLeaderEpoch
		}
	default:
		upTo := fetchUpperBound(p, isolation)
		off, ts, found := p.OffsetForTimestamp(rp.Timestamp)
		if found && off < upTo {
			op.Offset, op.Timestamp, op.LeaderEpoch = off, ts, partitionLeaderEpoch
		}
	}
}
