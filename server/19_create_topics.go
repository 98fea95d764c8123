package server

// CreateTopics: v2-7
//
// Behavior (per topic, in Apache's order of checks):
//   - A name that appears more than once in one request answers INVALID_REQUEST (42) once for
//     that name, and none of its entries is acted on (Apache keys its result collection by name).
//   - CREATE on the cluster or on the topic, else TOPIC_AUTHORIZATION_FAILED (29).
//   - Name validity (Kafka's Topic.validate: non-empty, not "." or "..", at most 249 characters of
//     [a-zA-Z0-9._-], no '.'/'_' collision with an existing topic) → INVALID_TOPIC_EXCEPTION (17).
//   - Existing topic → TOPIC_ALREADY_EXISTS (36), also for ValidateOnly. __consumer_offsets and
//     __transaction_state always exist (Apache answers 36 for them once they are created, which
//     a running Apache cluster has done at its first FindCoordinator).
//   - Partitions and replicas. Either NumPartitions/ReplicationFactor, where -1 picks the broker
//     default (num.partitions; replication factor 1), or an explicit ReplicaAssignment (both
//     counts must then be -1, else INVALID_REQUEST). One broker means the only legal replication
//     factor is 1: a larger one is INVALID_REPLICATION_FACTOR (38), and an assignment must put
//     every partition 0..n-1 on exactly [this broker], else INVALID_REPLICA_ASSIGNMENT (39).
//     A non-positive partition count is INVALID_PARTITIONS (37).
//   - Configs are validated by storage.ParseTopicConfigs; unknown keys, unsupported values and null
//     values answer INVALID_CONFIG (40) with the reason in ErrorMessage.
//   - ValidateOnly runs every check above and creates nothing; the v5+ fields describe the topic
//     that would have been created.
//
// Topics are created synchronously: when the response is sent the topic is in Metadata.
//
// Version notes:
//   - v0-1 were removed by Kafka 4.0 (KIP-896) and are not served; v1 added ValidateOnly and
//     ErrorMessage.
//   - v4: -1 for broker defaults; v5: flexible, response NumPartitions/ReplicationFactor/Configs
//     (ConfigErrorCode is tag 0); v7: TopicID.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.CreateTopics, 2, 7, handleCreateTopics) }

// clusterResource is the name of the single CLUSTER ACL resource (Kafka's "kafka-cluster").
const clusterResource = "kafka-cluster"

func handleCreateTopics(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.CreateTopicsRequest)
	resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)

	counts := make(map[string]int, len(req.Topics))
	for i := range req.Topics {
		counts[req.Topics[i].Topic]++
	}
	clusterCreate := rc.authorized(OpCreate, ResCluster, clusterResource)
	answered := make(map[string]bool, len(req.Topics))
	for i := range req.Topics {
		rt := &req.Topics[i]
		if answered[rt.Topic] {
			continue
		}
		answered[rt.Topic] = true
		st := kmsg.NewCreateTopicsResponseTopic()
		st.Topic = rt.Topic
		if counts[rt.Topic] > 1 {
			setCreateErr(&st, codec.CodeInvalidRequest,
				fmt.Sprintf("Topic %q appears %d times in the request; each topic may be created once.", rt.Topic, counts[rt.Topic]))
			resp.Topics = append(resp.Topics, st)
			continue
		}
		if !clusterCreate && !rc.authorized(OpCreate, ResTopic, rt.Topic) {
			setCreateErr(&st, codec.CodeTopicAuthorizationFailed, "")
			resp.Topics = append(resp.Topics, st)
			continue
		}
		createOneTopic(rc, req, rt, &st)
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

func setCreateErr(st *kmsg.CreateTopicsResponseTopic, code int16, msg string) {
	st.ErrorCode = code
	if msg != "" {
		st.ErrorMessage = &msg
	}
}

// createOneTopic validates and (unless ValidateOnly) creates one topic, filling st.
func createOneTopic(rc *reqCtx, req *kmsg.CreateTopicsRequest, rt *kmsg.CreateTopicsRequestTopic, st *kmsg.CreateTopicsResponseTopic) {
	store := rc.s.deps.Store
	if err := storage.ValidateTopicName(rt.Topic); err != nil {
		setCreateErr(st, codec.CodeInvalidTopicException, err.Error())
		return
	}
	if store.Topic(rt.Topic) != nil || rc.s.internalByName(rt.Topic) != nil {
		setCreateErr(st, codec.CodeTopicAlreadyExists, fmt.Sprintf("Topic '%s' already exists.", rt.Topic))
		return
	}
	if other := collidingTopic(rc.s, rt.Topic); other != "" {
		setCreateErr(st, codec.CodeInvalidTopicException,
			fmt.Sprintf("Topic '%s' collides with existing topic '%s': '.' and '_' are interchangeable in metric names.", rt.Topic, other))
		return
	}
	partitions, rf, code, msg := createPartitionCount(rc, rt)
	if code != codec.CodeNone {
		setCreateErr(st, code, msg)
		return
	}
	kv := make(map[string]string, len(rt.Configs))
	for _, c := range rt.Configs {
		if c.Value == nil {
			setCreateErr(st, codec.CodeInvalidConfig, fmt.Sprintf("Null value not supported for topic config %q.", c.Name))
			return
		}
		kv[c.Name] = *c.Value
	}
	effective, err := storage.ParseTopicConfigs(topicDefaults(rc), kv)
	if err != nil {
		setCreateErr(st, codec.CodeInvalidConfig, err.Error())
		return
	}

	if req.ValidateOnly {
		fillCreated(rc, req, st, partitions, rf, effective, kv)
		return
	}
	t, err := rc.s.topics().CreateTopic(rt.Topic, partitions, rf, kv)
	if err != nil {
		code := storage.ErrorCode(err)
		if code == codec.CodeKafkaStorageError {
			rc.s.log.Error("cannot create topic", zap.String("topic", rt.Topic), zap.Error(err))
		}
		setCreateErr(st, code, err.Error())
		return
	}
	rc.s.log.Info("created topic", zap.String("topic", t.Name), zap.Int32("partitions", t.NumPartitions()),
		zap.Any("configs", kv))
	st.TopicID = t.ID
	fillCreated(rc, req, st, t.NumPartitions(), rf, t.Config(), t.Overrides())
}

// fillCreated sets the v5+ description of a created (or validated) topic. The configs need
// DESCRIBE_CONFIGS on the topic, as in Apache; without it ConfigErrorCode carries the denial.
func fillCreated(rc *reqCtx, req *kmsg.CreateTopicsRequest, st *kmsg.CreateTopicsResponseTopic, partitions int32, rf int16, cfg storage.TopicConfig, overrides map[string]string) {
	if req.Version < 5 {
		return
	}
	st.NumPartitions = partitions
	st.ReplicationFactor = rf
	if !rc.authorized(OpDescribeConfigs, ResTopic, st.Topic) {
		st.ConfigErrorCode = codec.CodeTopicAuthorizationFailed
		return
	}
	for _, e := range describeTopicEntries(cfg, overrides, topicDefaults(rc)) {
		c := kmsg.NewCreateTopicsResponseTopicConfig()
		c.Name = e.name
		v := e.value
		c.Value = &v
		c.Source = int8(e.source)
		st.Configs = append(st.Configs, c)
	}
}

// createPartitionCount resolves the partition count and replication factor of a CreateTopics
// entry, checking them against the registered brokers.
func createPartitionCount(rc *reqCtx, rt *kmsg.CreateTopicsRequestTopic) (int32, int16, int16, string) {
	if len(rt.ReplicaAssignment) > 0 {
		if rt.NumPartitions != -1 || rt.ReplicationFactor != -1 {
			return 0, 0, codec.CodeInvalidRequest,
				"NumPartitions and ReplicationFactor must be -1 when a replica assignment is given."
		}
		n := int32(len(rt.ReplicaAssignment))
		seen := make([]bool, n)
		rf := int16(0)
		for _, a := range rt.ReplicaAssignment {
			if a.Partition < 0 || a.Partition >= n || seen[a.Partition] {
				return 0, 0, codec.CodeInvalidReplicaAssignment,
					fmt.Sprintf("The assigned partitions must be 0..%d, each once; got partition %d.", n-1, a.Partition)
			}
			seen[a.Partition] = true
			if code, msg := checkReplicas(rc, a.Replicas); code != codec.CodeNone {
				return 0, 0, code, fmt.Sprintf("Partition %d: %s", a.Partition, msg)
			}
			if rf != 0 && int(rf) != len(a.Replicas) {
				return 0, 0, codec.CodeInvalidReplicaAssignment, "Every partition must have the same number of replicas."
			}
			rf = int16(len(a.Replicas))
		}
		return n, rf, codec.CodeNone, ""
	}
	n := rt.NumPartitions
	switch {
	case n == -1:
		n = rc.s.cfg.NumPartitions
	case n <= 0:
		return 0, 0, codec.CodeInvalidPartitions,
			fmt.Sprintf("The number of partitions must be positive, or -1 for the broker default; got %d.", n)
	}
	code, msg, rf := checkReplicationFactor(rt.ReplicationFactor, len(rc.s.topics().Registered()))
	if code != codec.CodeNone {
		return 0, 0, code, msg
	}
	return n, rf, codec.CodeNone, ""
}

// checkReplicas accepts a replica list of distinct registered brokers (shared by CreateTopics
// and CreatePartitions). On a single broker that is exactly [this broker]. In a cluster the
// controller places leaders itself (the volume is the replica), so the list only sets the
// replication factor.
func checkReplicas(rc *reqCtx, replicas []int32) (int16, string) {
	reg := rc.s.topics().Registered()
	if len(replicas) == 0 {
		return codec.CodeInvalidReplicaAssignment, "the replica list is empty."
	}
	seen := make(map[int32]bool, len(replicas))
	for _, r := range replicas {
		if !slices.Contains(reg, r) {
			if len(reg) == 1 {
				return codec.CodeInvalidReplicaAssignment,
					fmt.Sprintf("broker %d does not exist; the only broker is %d.", r, reg[0])
			}
			return codec.CodeInvalidReplicaAssignment, fmt.Sprintf("broker %d is not registered; brokers are %v.", r, reg)
		}
		if seen[r] {
			return codec.CodeInvalidReplicaAssignment, fmt.Sprintf("replicas %v name broker %d twice.", replicas, r)
		}
		seen[r] = true
	}
	return codec.CodeNone, ""
}

// collidingTopic returns an existing topic whose name differs from name only by '.' versus '_'
// (Kafka refuses such pairs because their metric names would be the same).
// The internal topics count as existing.
func collidingTopic(s *Server, name string) string {
	if !strings.ContainsAny(name, "._") {
		return ""
	}
	norm := strings.ReplaceAll(name, ".", "_")
	for i := range s.internal {
		if n := s.internal[i].name; n != name && strings.ReplaceAll(n, ".", "_") == norm {
			return n
		}
	}
	for _, t := range s.deps.Store.Topics() {
		if t.Name != name && strings.ReplaceAll(t.Name, ".", "_") == norm {
			return t.Name
		}
	}
	return ""
}
