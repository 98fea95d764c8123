package server

// ListOffsets: v1-10
//
// Behavior (Apache's KafkaApis.handleListOffsetRequest → Partition.fetchOffsetForTimestamp):
//   - A partition named twice in one request answers INVALID_REQUEST for every occurrence.
//   - TOPIC_AUTHORIZATION_FAILED without Describe on the topic, then UNKNOWN_TOPIC_OR_PARTITION,
//     NOT_LEADER_OR_FOLLOWER, and the KIP-320 CurrentLeaderEpoch check against the topology's
//     leader epoch (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH): the shared check of topology.go.
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
//   - LeaderEpoch is the partition's current leader epoch (the topology's; 0 on a single
//     broker), the epoch Metadata advertises. Apache answers the epoch of the record found from
//     its epoch cache; a shared-volume log keeps no epoch cache and is never truncated on a
//     leader change, so the current epoch is the only one a client can check against.
//   - __consumer_offsets / __transaction_state (internal, no storage log) answer as an empty
//     log: EARLIEST / LATEST offset 0, every lookup by timestamp offset -1.
//
// Version notes: v1 single offset; v2 isolation level; v4 CurrentLeaderEpoch / LeaderEpoch;
// v5 OFFSET_NOT_AVAILABLE possible (never here: no leader change); v6 flexible; v7 -3; v8 -4;
// v9 -5; v10 TimeoutMillis (no remote lookups, so nothing to time out). v11 (-6, earliest pending
// upload, KIP-1023) is not served.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.ListOffsets, 1, 10, handleListOffsets) }

// Kafka's ListOffsetsRequest special timestamps.
const (
	listOffsetsLatest        int64 = -1
	listOffsetsEarliest      int64 = -2
	listOffsetsMaxTimestamp  int64 = -3
	listOffsetsEarliestLocal int64 = -4
	listOffsetsLatestTiered  int64 = -5
)

func handleListOffsets(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ListOffsetsRequest)
	resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)

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
		tr := rc.lookupTopic(OpDescribe, rt.Topic)
		ot.Partitions = make([]kmsg.ListOffsetsResponseTopicPartition, len(rt.Partitions))
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			op := &ot.Partitions[j]
			*op = kmsg.NewListOffsetsResponseTopicPartition()
			op.Partition = rp.Partition
			if seen[tp{rt.Topic, rp.Partition}] > 1 {
				op.ErrorCode = codec.CodeInvalidRequest
				continue
			}
			lp, code := rc.localPartition(&tr, rp.Partition, rp.CurrentLeaderEpoch)
			if code != codec.CodeNone {
				op.ErrorCode = code
				continue
			}
			listOffsetsPartition(lp, rp, req.IsolationLevel, op)
		}
	}
	return resp, nil
}

// listOffsetsPartition answers one partition we lead. A partition of an internal topic is an
// empty log: log start = end = 0.
func listOffsetsPartition(lp leaderPart, rp *kmsg.ListOffsetsRequestTopicPartition, isolation int8, op *kmsg.ListOffsetsResponseTopicPartition) {
	p, epoch := lp.p, lp.epoch
	if p == nil {
		switch rp.Timestamp {
		case listOffsetsEarliest, listOffsetsEarliestLocal, listOffsetsLatest:
			op.Offset, op.Timestamp, op.LeaderEpoch = 0, -1, epoch
		default: // nothing to find by timestamp, nothing tiered
			op.Offset, op.Timestamp, op.LeaderEpoch = -1, -1, -1
		}
		return
	}
	switch rp.Timestamp {
	case listOffsetsEarliest, listOffsetsEarliestLocal:
		op.Offset, op.Timestamp, op.LeaderEpoch = p.LogStartOffset(), -1, epoch
	case listOffsetsLatest:
		op.Offset, op.Timestamp, op.LeaderEpoch = fetchUpperBound(p, isolation), -1, epoch
	case listOffsetsLatestTiered:
		op.Offset, op.Timestamp, op.LeaderEpoch = -1, -1, -1
	case listOffsetsMaxTimestamp:
		upTo := fetchUpperBound(p, isolation)
		off, ts := p.MaxTimestamp()
		if off >= 0 && off < upTo {
			op.Offset, op.Timestamp, op.LeaderEpoch = off, ts, epoch
		}
	default:
		upTo := fetchUpperBound(p, isolation)
		off, ts, found := p.OffsetForTimestamp(rp.Timestamp)
		if found && off < upTo {
			op.Offset, op.Timestamp, op.LeaderEpoch = off, ts, epoch
		}
	}
}
