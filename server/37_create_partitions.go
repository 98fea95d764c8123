package server

// CreatePartitions: v0-3
//
// Behavior (per topic):
//   - A topic named twice in one request answers INVALID_REQUEST (42) for each entry of it.
//   - ALTER on the topic, else TOPIC_AUTHORIZATION_FAILED (29).
//   - Unknown topic → UNKNOWN_TOPIC_OR_PARTITION (3).
//   - Count is the new total. Fewer partitions than today, or the same number, is
//     INVALID_PARTITIONS (37): partitions can only be added (Apache: "Topic currently has N
//     partitions, which is higher than the requested M" / "Topic already has N partitions").
//   - Assignment, when given, must have one entry per new partition, each exactly [this broker],
//     else INVALID_REPLICA_ASSIGNMENT (39) (the code Apache's KRaft controller uses).
//   - ValidateOnly runs the checks and changes nothing.
//   - New partitions are created synchronously and start empty at offset 0.
//
// Version notes: v1 throttle semantics; v2 flexible; v3 same as v2 (KIP-599 throttling quota).

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.CreatePartitions, 0, 3, handleCreatePartitions) }

func handleCreatePartitions(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.CreatePartitionsRequest)
	resp := req.ResponseKind().(*kmsg.CreatePartitionsResponse)
	counts := make(map[string]int, len(req.Topics))
	for i := range req.Topics {
		counts[req.Topics[i].Topic]++
	}
	for i := range req.Topics {
		rt := &req.Topics[i]
		st := kmsg.NewCreatePartitionsResponseTopic()
		st.Topic = rt.Topic
		var code int16
		var msg string
		if counts[rt.Topic] > 1 {
			code, msg = codec.CodeInvalidRequest, fmt.Sprintf("Topic '%s' appears more than once in the request.", rt.Topic)
		} else {
			code, msg = createPartitionsOne(rc, req.ValidateOnly, rt)
		}
		st.ErrorCode = code
		if msg != "" {
			st.ErrorMessage = &msg
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

func createPartitionsOne(rc *reqCtx, validateOnly bool, rt *kmsg.CreatePartitionsRequestTopic) (int16, string) {
	if !rc.authorized(OpAlter, ResTopic, rt.Topic) {
		return codec.CodeTopicAuthorizationFailed, ""
	}
	store := rc.s.deps.Store
	t := store.Topic(rt.Topic)
	if t == nil {
		return codec.CodeUnknownTopicOrPartition, fmt.Sprintf("Topic '%s' does not exist.", rt.Topic)
	}
	cur := t.NumPartitions()
	switch {
	case rt.Count < cur:
		return codec.CodeInvalidPartitions,
			fmt.Sprintf("Topic '%s' has %d partitions; it cannot shrink to %d (partitions can only be added).", rt.Topic, cur, rt.Count)
	case rt.Count == cur:
		return codec.CodeInvalidPartitions,
			fmt.Sprintf("Topic '%s' already has %d partitions; ask for more to add some.", rt.Topic, cur)
	}
	if rt.Assignment != nil {
		if add := rt.Count - cur; int32(len(rt.Assignment)) != add {
			return codec.CodeInvalidReplicaAssignment,
				fmt.Sprintf("Adding %d partitions needs %d assignments; the request has %d.", add, add, len(rt.Assignment))
		}
		for i, a := range rt.Assignment {
			if code, msg := checkReplicas(rc, a.Replicas); code != codec.CodeNone {
				return code, fmt.Sprintf("Partition %d: %s", cur+int32(i), msg)
			}
		}
	}
	if validateOnly {
		return codec.CodeNone, ""
	}
	if err := rc.s.topics().CreatePartitions(rt.Topic, rt.Count); err != nil {
		code := storage.ErrorCode(err)
		if code == codec.CodeKafkaStorageError {
			rc.s.log.Error("cannot create partitions", zap.String("topic", rt.Topic), zap.Int32("count", rt.Count), zap.Error(err))
		}
		return code, err.Error()
	}
	rc.s.log.Info("added partitions", zap.String("topic", rt.Topic), zap.Int32("from", cur), zap.Int32("to", rt.Count))
	return codec.CodeNone, ""
}
