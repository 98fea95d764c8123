package server

// DeleteTopics: v1-6
//
// Behavior:
//   - delete.topic.enable=false: every topic answers TOPIC_DELETION_DISABLED (73); Apache answers
//     INVALID_REQUEST (42) to v0-2, which predate that code.
//   - A topic is named by name (v1-5, and v6 with a name) or by ID (v6 with a null name). Both or
//     neither is INVALID_REQUEST. A topic named twice in one request answers INVALID_REQUEST for
//     the repeats, as Apache's controller does.
//   - DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED (29). For a lookup by ID the ID is
//     resolved first, and an unauthorized caller learns nothing about whether it exists.
//   - Unknown name → UNKNOWN_TOPIC_OR_PARTITION (3); unknown ID → UNKNOWN_TOPIC_ID (100).
//   - __consumer_offsets / __transaction_state (by name or by their ID), once authorized →
//     INVALID_TOPIC_EXCEPTION (17): internal topics cannot be deleted, as in Apache.
//   - Deletion is synchronous: when the response is sent the topic is gone from Metadata, and a
//     topic re-created under the same name gets a new topic ID.
//   - The v6 response carries the name and the ID of every deleted topic, whichever was asked for.
//
// Version notes: v0 was removed by Kafka 4.0 (KIP-896); v3 TOPIC_DELETION_DISABLED; v4 flexible;
// v5 ErrorMessage; v6 topic IDs (KIP-516).

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.DeleteTopics, 1, 6, handleDeleteTopics) }

func handleDeleteTopics(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DeleteTopicsRequest)
	resp := req.ResponseKind().(*kmsg.DeleteTopicsResponse)

	// v0-5 name topics in TopicNames; v6 in Topics. Normalise to the v6 shape.
	wanted := req.Topics
	if req.Version < 6 {
		wanted = make([]kmsg.DeleteTopicsRequestTopic, 0, len(req.TopicNames))
		for i := range req.TopicNames {
			t := kmsg.NewDeleteTopicsRequestTopic()
			t.Topic = &req.TopicNames[i]
			wanted = append(wanted, t)
		}
	}

	seenNames := make(map[string]bool, len(wanted))
	seenIDs := make(map[[16]byte]bool, len(wanted))
	for i := range wanted {
		w := &wanted[i]
		st := kmsg.NewDeleteTopicsResponseTopic()
		st.Topic, st.TopicID = w.Topic, w.TopicID
		code, msg := deleteOneTopic(rc, req.Version, w, &st, seenNames, seenIDs)
		st.ErrorCode = code
		if msg != "" {
			st.ErrorMessage = &msg
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

func deleteOneTopic(rc *reqCtx, version int16, w *kmsg.DeleteTopicsRequestTopic, st *kmsg.DeleteTopicsResponseTopic,
	seenNames map[string]bool, seenIDs map[[16]byte]bool) (int16, string) {
	store := rc.s.deps.Store
	byName := w.Topic != nil && *w.Topic != ""
	if byName == (w.TopicID != [16]byte{}) {
		return codec.CodeInvalidRequest, "Each topic must be named either by name or by topic ID."
	}
	if !rc.s.cfg.DeleteTopicEnable {
		if version < 3 {
			return codec.CodeInvalidRequest, "Topic deletion is disabled (delete.topic.enable=false)."
		}
		return codec.CodeTopicDeletionDisabled, "Topic deletion is disabled (delete.topic.enable=false)."
	}

	var t *storage.Topic
	if byName {
		name := *w.Topic
		if seenNames[name] {
			return codec.CodeInvalidRequest, fmt.Sprintf("Topic '%s' appears more than once in the request.", name)
		}
		seenNames[name] = true
		if !rc.authorized(OpDelete, ResTopic, name) {
			return codec.CodeTopicAuthorizationFailed, ""
		}
		if rc.s.internalByName(name) != nil {
			return codec.CodeInvalidTopicException, fmt.Sprintf("Topic '%s' is internal and cannot be deleted.", name)
		}
		if t = store.Topic(name); t == nil {
			return codec.CodeUnknownTopicOrPartition, fmt.Sprintf("Topic '%s' does not exist.", name)
		}
	} else {
		if seenIDs[w.TopicID] {
			return codec.CodeInvalidRequest, "The topic ID appears more than once in the request."
		}
		seenIDs[w.TopicID] = true
		if it := rc.s.internalByID(w.TopicID); it != nil {
			if !rc.authorized(OpDelete, ResTopic, it.name) {
				return codec.CodeTopicAuthorizationFailed, ""
			}
			return codec.CodeInvalidTopicException, fmt.Sprintf("Topic '%s' is internal and cannot be deleted.", it.name)
		}
		t = store.TopicByID(w.TopicID)
		if t == nil {
			return codec.CodeUnknownTopicID, "No topic has this topic ID."
		}
		if !rc.authorized(OpDelete, ResTopic, t.Name) {
			return codec.CodeTopicAuthorizationFailed, ""
		}
		if seenNames[t.Name] {
			return codec.CodeInvalidRequest, fmt.Sprintf("Topic '%s' appears more than once in the request.", t.Name)
		}
		seenNames[t.Name] = true
	}
	name, id := t.Name, t.ID
	st.Topic, st.TopicID = &name, id
	if err := rc.s.topics().DeleteTopic(name); err != nil {
		if errors.Is(err, storage.ErrUnknownTopic) {
			// Deleted concurrently by another request.
			if byName {
				return codec.CodeUnknownTopicOrPartition, fmt.Sprintf("Topic '%s' does not exist.", name)
			}
			return codec.CodeUnknownTopicID, "No topic has this topic ID."
		}
		rc.s.log.Error("cannot delete topic", zap.String("topic", name), zap.Error(err))
		return storage.ErrorCode(err), err.Error()
	}
	rc.s.log.Info("deleted topic", zap.String("topic", name))
	return codec.CodeNone, ""
}
