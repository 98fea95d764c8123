package server

// Metadata: v0-12
//
// Behavior:
//   - One broker (us) leads every partition, with leader epoch 0 (no elections on a single
//     broker), replicas = ISR = [us].
//   - Topics nil (v1+: null) = every topic; an empty list = none; v10+ topics may be named by ID.
//   - Auto-creation: when the broker allows it (auto.create.topics.enable) and the request does
//     (AllowAutoTopicCreation, v4+; implicitly true before v4), a missing topic is created with
//     num.partitions and returned ready. Apache answers LEADER_NOT_AVAILABLE on the creating
//     request because its controller creates asynchronously; we create synchronously, so the
//     topic is usable at once. Invalid names answer INVALID_TOPIC_EXCEPTION (17).
//   - Authorized-operations bitfields are INT32_MIN ("not requested") unless asked for.
//
// Version notes: v1 null topics = all; v2 ClusterID; v4 AllowAutoTopicCreation; v7 LeaderEpoch;
// v8 authorized operations; v9 flexible; v10 topic IDs; v11 drops cluster authorized ops.

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.Metadata, 0, 12, handleMetadata) }

const authorizedOpsNotRequested = -2147483648

func handleMetadata(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.MetadataRequest)
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	s := rc.s
	host, port := s.advertised()
	b := kmsg.NewMetadataResponseBroker()
	b.NodeID, b.Host, b.Port = s.cfg.BrokerID, host, port
	resp.Brokers = append(resp.Brokers, b)
	cid := s.clusterID
	resp.ClusterID = &cid
	resp.ControllerID = s.cfg.BrokerID
	resp.AuthorizedOperations = authorizedOpsNotRequested
	if req.IncludeClusterAuthorizedOperations && req.Version <= 10 {
		resp.AuthorizedOperations = 0
	}

	store := s.deps.Store
	addTopic := func(t *storage.Topic) {
		mt := kmsg.NewMetadataResponseTopic()
		name := t.Name
		mt.Topic = &name
		mt.TopicID = t.ID
		mt.AuthorizedOperations = authorizedOpsNotRequested
		if req.IncludeTopicAuthorizedOperations {
			mt.AuthorizedOperations = 0
		}
		n := t.NumPartitions()
		mt.Partitions = make([]kmsg.MetadataResponseTopicPartition, 0, n)
		for p := int32(0); p < n; p++ {
			mp := kmsg.NewMetadataResponseTopicPartition()
			mp.Partition = p
			mp.Leader = s.cfg.BrokerID
			mp.LeaderEpoch = 0
			mp.Replicas = []int32{s.cfg.BrokerID}
			mp.ISR = []int32{s.cfg.BrokerID}
			mt.Partitions = append(mt.Partitions, mp)
		}
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
			if rc.authorized(OpDescribe, ResTopic, t.Name) {
				addTopic(t)
			}
		}
		return resp, nil
	}
	autoCreate := s.cfg.AutoCreateTopics && (req.Version < 4 || req.AllowAutoTopicCreation)
	for _, rt := range req.Topics {
		if rt.Topic == nil || *rt.Topic == "" {
			// Lookup by topic ID (v10+).
			if t := store.TopicByID(rt.TopicID); t != nil && rc.authorized(OpDescribe, ResTopic, t.Name) {
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
		t := store.Topic(name)
		if t == nil && autoCreate && rc.authorized(OpCreate, ResTopic, name) {
			var err error
			t, err = store.CreateTopic(name, s.cfg.NumPartitions, nil)
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
