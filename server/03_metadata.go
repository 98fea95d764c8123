package server

// Metadata: v0-12
//
// Behavior:
//   - Brokers, controller, leaders and leader epochs come from the topology (topology.go): the
//     live brokers that have an endpoint on our listener, and per partition its owner as leader at
//     the owner's epoch, replicas = ISR = [leader] (a shared volume has no followers). A partition
//     with no registered owner, or whose owner is not a listed live broker, answers
//     LEADER_NOT_AVAILABLE (5) with leader -1, as Apache. A single broker leads everything at
//     epoch 0.
//   - __consumer_offsets and __transaction_state are listed (when named, and among all topics,
//     as Apache does) with is_internal=true and 50 partitions; partition N's leader and epoch are
//     those of group shard N / transaction slot N. They are never auto-created (they exist).
//     Their topic ids are derived from the cluster id (internalTopic).
//   - Topics nil (v1+: null) = every topic; an empty list = none; v10+ topics may be named by ID.
//   - Auto-creation: when the broker allows it (auto.create.topics.enable) and the request does
//     (AllowAutoTopicCreation, v4+; implicitly true before v4), a missing topic is created with
//     num.partitions and returned ready. Apache answers LEADER_NOT_AVAILABLE on the creating
//     request because its controller creates asynchronously; we create synchronously, so the
//     topic is usable at once. Invalid names answer INVALID_TOPIC_EXCEPTION (17).
//   - ACLs (Apache's KafkaApis): DESCRIBE per topic; list-all leaves out topics the principal
//     may not describe, a named one answers TOPIC_AUTHORIZATION_FAILED (29). Auto-creation needs
//     CREATE on the cluster or on the topic; a missing topic without either answers 29.
//   - Authorized-operations bitfields (KIP-430) are INT32_MIN ("not requested") unless asked
//     for: per topic the topic operations held; the cluster's (v8-10) only with DESCRIBE on it.
//
// Version notes: v1 null topics = all; v2 ClusterID; v4 AllowAutoTopicCreation; v7 LeaderEpoch;
// v8 authorized operations; v9 flexible; v10 topic IDs; v11 drops cluster authorized ops.

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.Metadata, 0, 12, handleMetadata) }

const authorizedOpsNotRequested = -2147483648

func handleMetadata(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.MetadataRequest)
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	s := rc.s
	topo := s.deps.Topology
	brokers := s.liveBrokers(rc.c.ln.name)
	for _, lb := range brokers {
		b := kmsg.NewMetadataResponseBroker()
		b.NodeID, b.Host, b.Port = lb.id, lb.host, lb.port
		if lb.rack != "" {
			rack := lb.rack
			b.Rack = &rack
		}
		resp.Brokers = append(resp.Brokers, b)
	}
	cid := s.clusterID
	resp.ClusterID = &cid
	resp.ControllerID = topo.Controller()
	resp.AuthorizedOperations = authorizedOpsNotRequested
	if req.IncludeClusterAuthorizedOperations && req.Version <= 10 {
		// Apache: the cluster bitset only for a principal that may DESCRIBE the cluster.
		resp.AuthorizedOperations = 0
		if rc.authorized(OpDescribe, ResCluster, clusterResource) {
			resp.AuthorizedOperations = rc.authorizedOps(ResCluster, clusterResource, clusterOps)
		}
	}

	store := s.deps.Store
	// Replicas and ISR are the leader and its failover candidates (replicaList); the encoder only
	// reads them, so partitions with the same leader and factor share one slice (a single broker
	// allocates one for the whole response).
	type setKey struct {
		leader int32
		rf     int16
	}
	sets := map[setKey][]int32{}
	replicaSet := func(id int32, rf int16) []int32 {
		k := setKey{id, rf}
		if set, ok := sets[k]; ok {
			return set
		}
		set := replicaList(id, rf, brokers)
		sets[k] = set
		return set
	}
	admin := s.topics()
	addPartitions := func(mt *kmsg.MetadataResponseTopic, name string, n int32) {
		rf := admin.ReplicationFactor(name)
		mt.Partitions = make([]kmsg.MetadataResponseTopicPartition, 0, n)
		for p := int32(0); p < n; p++ {
			mp := kmsg.NewMetadataResponseTopicPartition()
			mp.Partition = p
			o := topology.PartitionOwner(topo, name, p)
			mp.LeaderEpoch = o.Epoch
			leader := o.Known
			if leader && !o.Local {
				_, leader = findBroker(brokers, o.Broker)
			}
			if leader {
				mp.Leader = o.Broker
				mp.Replicas = replicaSet(o.Broker, rf)
				mp.ISR = mp.Replicas
			} else {
				mp.Leader = -1
				mp.ErrorCode = codec.CodeLeaderNotAvailable
				mp.Replicas = []int32{}
				mp.ISR = []int32{}
			}
			mt.Partitions = append(mt.Partitions, mp)
		}
	}
	newTopic := func(name string, id [16]byte) kmsg.MetadataResponseTopic {
		mt := kmsg.NewMetadataResponseTopic()
		mt.Topic = &name
		mt.TopicID = id
		mt.AuthorizedOperations = authorizedOpsNotRequested
		if req.IncludeTopicAuthorizedOperations {
			mt.AuthorizedOperations = rc.authorizedOps(ResTopic, name, topicOps)
		}
		return mt
	}
	addTopic := func(t *storage.Topic) {
		mt := newTopic(t.Name, t.ID)
		addPartitions(&mt, t.Name, t.NumPartitions())
		resp.Topics = append(resp.Topics, mt)
	}
	addInternal := func(it *internalTopic) {
		mt := newTopic(it.name, it.id)
		mt.IsInternal = true
		addPartitions(&mt, it.name, it.partitions)
		resp.Topics = append(resp.Topics, mt)
	}
	errTopic := func(name *string, id [16]byte, code int16) {
		mt := kmsg.NewMetadataResponseTopic()
		mt.Topic, mt.TopicID, mt.ErrorCode = name, id, code
		mt.AuthorizedOperations = authorizedOpsNotRequested
		resp.Topics = append(resp.Topics, mt)
	}

	if req.Topics == nil || (req.Version == 0 && len(req.Topics) == 0) {
		for _, t := range store.Topics() {
			if rc.s.internalByName(t.Name) == nil && rc.authorized(OpDescribe, ResTopic, t.Name) {
				addTopic(t)
			}
		}
		for i := range s.internal {
			if rc.authorized(OpDescribe, ResTopic, s.internal[i].name) {
				addInternal(&s.internal[i])
			}
		}
		return resp, nil
	}
	autoCreate := s.cfg.AutoCreateTopics && (req.Version < 4 || req.AllowAutoTopicCreation)
	// Apache: CREATE on the cluster covers every auto-created topic, else CREATE per topic.
	clusterCreate := -1
	for _, rt := range req.Topics {
		if rt.Topic == nil || *rt.Topic == "" {
			// Lookup by topic ID (v10+).
			if it := s.internalByID(rt.TopicID); it != nil && rc.authorized(OpDescribe, ResTopic, it.name) {
				addInternal(it)
			} else if t := store.TopicByID(rt.TopicID); t != nil && rc.authorized(OpDescribe, ResTopic, t.Name) {
				addTopic(t)
			} else {
				errTopic(nil, rt.TopicID, codec.CodeUnknownTopicID)
			}
			continue
		}
		name := *rt.Topic
		if !rc.authorized(OpDescribe, ResTopic, name) {
			errTopic(rt.Topic, [16]byte{}, codec.CodeTopicAuthorizationFailed)
			continue
		}
		if it := s.internalByName(name); it != nil {
			addInternal(it)
			continue
		}
		t := store.Topic(name)
		if t == nil && autoCreate {
			if clusterCreate < 0 {
				clusterCreate = 0
				if rc.authorized(OpCreate, ResCluster, clusterResource) {
					clusterCreate = 1
				}
			}
			if clusterCreate == 0 && !rc.authorized(OpCreate, ResTopic, name) {
				// A missing topic the caller could describe but not create: Apache answers 29.
				errTopic(rt.Topic, [16]byte{}, codec.CodeTopicAuthorizationFailed)
				continue
			}
			var err error
			t, err = admin.CreateTopic(name, s.cfg.NumPartitions, -1, nil)
			switch {
			case err == nil:
				s.log.Info("auto-created topic", zap.String("topic", name), zap.Int32("partitions", s.cfg.NumPartitions))
			case errors.Is(err, storage.ErrTopicExists):
				t = store.Topic(name)
			case errors.Is(err, storage.ErrInvalidTopic):
				errTopic(rt.Topic, [16]byte{}, codec.CodeInvalidTopicException)
				continue
			default:
				s.log.Error("cannot auto-create topic", zap.String("topic", name), zap.Error(err))
				errTopic(rt.Topic, [16]byte{}, codec.CodeUnknownServerError)
				continue
			}
		}
		if t == nil {
			errTopic(rt.Topic, [16]byte{}, codec.CodeUnknownTopicOrPartition)
			continue
		}
		addTopic(t)
	}
	return resp, nil
}
