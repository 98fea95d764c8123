package server

// DeleteRecords: v0-2 (KIP-107)
//
// Moves the log start offset of each named partition; everything below it is gone for fetches
// (OFFSET_OUT_OF_RANGE) and ListOffsets EARLIEST answers it. Kafka Streams purges its
// repartition topics with it; kafka-delete-records.sh is a front end to it.
//
// Behavior (Apache's KafkaApis.handleDeleteRecordsRequest → ReplicaManager.deleteRecords →
// Partition.deleteRecordsOnLeader):
//   - DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED (29) for each of its partitions;
//     then UNKNOWN_TOPIC_OR_PARTITION (3) for an unknown topic or partition.
//   - __consumer_offsets / __transaction_state → INVALID_TOPIC_EXCEPTION (17): Apache refuses
//     client deletions on internal topics (only its own coordinators may, and kaas keeps their
//     state outside any log).
//   - Not the leader (or the partition not loaded here) → NOT_LEADER_OR_FOLLOWER (6).
//   - A topic whose cleanup.policy lacks "delete" → POLICY_VIOLATION (44), as Apache.
//   - offset -1 means "the high watermark"; any other negative offset, or one above the HWM →
//     OFFSET_OUT_OF_RANGE (1). An offset at or below the current log start changes nothing.
//   - low_watermark is the log start after the request (-1 with an error).
//   - The answer waits until the new start is durable (storage.Partition.DeleteRecords
//     checkpoints it off the executor; the reply is deferred and sent from its callback). A
//     single broker has no followers to wait for, so timeout_ms never expires a request (Apache
//     answers REQUEST_TIMED_OUT only when followers lag).
//
// Version notes: v1 is v0 with throttling after the response; v2 flexible.

import (
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.DeleteRecords, 0, 2, handleDeleteRecords) }

func handleDeleteRecords(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DeleteRecordsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteRecordsResponse)

	type pending struct {
		out    *kmsg.DeleteRecordsResponseTopicPartition
		offset int64
		run    func(offset int64, done func(int64, int16))
	}
	var todo []pending
	resp.Topics = make([]kmsg.DeleteRecordsResponseTopic, len(req.Topics))
	for i := range req.Topics {
		rt := &req.Topics[i]
		ot := &resp.Topics[i]
		*ot = kmsg.NewDeleteRecordsResponseTopic()
		ot.Topic = rt.Topic
		tr := rc.lookupTopic(OpDelete, rt.Topic)
		ot.Partitions = make([]kmsg.DeleteRecordsResponseTopicPartition, len(rt.Partitions))
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			op := &ot.Partitions[j]
			*op = kmsg.NewDeleteRecordsResponseTopicPartition()
			op.Partition, op.LowWatermark = rp.Partition, -1
			if tr.code == codec.CodeNone && tr.internal > 0 {
				if rp.Partition < 0 || rp.Partition >= tr.internal {
					op.ErrorCode = codec.CodeUnknownTopicOrPartition
				} else {
					op.ErrorCode = codec.CodeInvalidTopicException
				}
				continue
			}
			lp, code := rc.localPartition(&tr, rp.Partition, -1)
			if code != codec.CodeNone {
				op.ErrorCode = code
				continue
			}
			if !strings.Contains(tr.t.Config().CleanupPolicy, "delete") {
				op.ErrorCode = codec.CodePolicyViolation
				continue
			}
			todo = append(todo, pending{out: op, offset: rp.Offset, run: lp.p.DeleteRecords})
		}
	}
	if len(todo) == 0 {
		return resp, nil
	}
	rc.deferReply()
	var mu sync.Mutex
	left := len(todo)
	for _, pd := range todo {
		pd.run(pd.offset, func(lw int64, code int16) {
			defer rc.guard()
			mu.Lock()
			pd.out.LowWatermark, pd.out.ErrorCode = lw, code
			left--
			last := left == 0
			mu.Unlock()
			if last {
				rc.reply(resp)
			}
		})
	}
	return nil, nil
}
