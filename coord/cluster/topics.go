package cluster

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

var (
	ErrTopicExists       = errors.New("topic already exists")
	ErrUnknownTopic      = errors.New("unknown topic")
	ErrInvalidPartitions = errors.New("invalid partition count")
)

// TopicMeta is one topics/<name> record. Any broker creates it (CreateTopics, auto-create) with a
// create-if-absent CAS; the files on the volume follow from it.
type TopicMeta struct {
	Name       string
	ID         [16]byte
	Partitions int32
	RF         int16
	Configs    map[string]string
	// Rev is the record's etcd ModRevision (0 for a record not read from etcd): config changes
	// are applied in revision order (SetTopicConfigs and the watch may race on one broker).
	Rev int64
}

type topicJSON struct {
	ID         string            `json:"id"`
	Partitions int32             `json:"partitions"`
	RF         int16             `json:"rf"`
	Configs    map[string]string `json:"configs"`
}

// TopicsPrefix is <prefix>topics/ (watch it to follow topic changes).
func TopicsPrefix(prefix string) string { return prefix + "topics/" }

// TopicKey is <prefix>topics/<name>.
func TopicKey(prefix, name string) string { return TopicsPrefix(prefix) + name }

func encodeTopic(t TopicMeta) []byte {
	j := topicJSON{ID: hex.EncodeToString(t.ID[:]), Partitions: t.Partitions, RF: t.RF, Configs: t.Configs}
	if j.Configs == nil {
		j.Configs = map[string]string{}
	}
	b, _ := json.Marshal(j) // strings and ints only: cannot fail
	return b
}

// ParseTopicKV decodes a topics/<name> key (as returned by Get or a put event).
func ParseTopicKV(prefix string, kv KV) (TopicMeta, error) {
	name, ok := strings.CutPrefix(kv.Key, TopicsPrefix(prefix))
	if !ok || name == "" {
		return TopicMeta{}, fmt.Errorf("cannot parse topic key %q: not under %s", kv.Key, TopicsPrefix(prefix))
	}
	var j topicJSON
	if err := json.Unmarshal(kv.Value, &j); err != nil {
		return TopicMeta{}, fmt.Errorf("cannot parse topic record %q: %w", kv.Key, err)
	}
	t := TopicMeta{Name: name, Partitions: j.Partitions, RF: j.RF, Configs: j.Configs, Rev: kv.ModRev}
	id, err := hex.DecodeString(j.ID)
	if err != nil || len(id) != len(t.ID) {
		return TopicMeta{}, fmt.Errorf("cannot parse topic record %q: bad id %q", kv.Key, j.ID)
	}
	copy(t.ID[:], id)
	return t, nil
}

// CreateTopic creates topics/<t.Name> if absent; ErrTopicExists when another creator won.
func CreateTopic(ctx context.Context, b Backend, prefix string, t TopicMeta) error {
	if t.Name == "" || strings.Contains(t.Name, "/") {
		return fmt.Errorf("cannot create topic %q: invalid name", t.Name)
	}
	if t.Partitions < 1 {
		return fmt.Errorf("cannot create topic %s (%d partitions): %w", t.Name, t.Partitions, ErrInvalidPartitions)
	}
	key := TopicKey(prefix, t.Name)
	ok, _, err := b.Txn(ctx, []Compare{{Key: key, Field: CreateRevision, Rev: 0}}, []Op{{Key: key, Value: encodeTopic(t)}})
	if err != nil {
		return fmt.Errorf("cannot create topic %s: %w", t.Name, err)
	}
	if !ok {
		return fmt.Errorf("cannot create topic %s: %w", t.Name, ErrTopicExists)
	}
	return nil
}

// getTopic reads one topic and its KV (for the revision compares).
func getTopic(ctx context.Context, b Backend, prefix, name string) (TopicMeta, KV, error) {
	kvs, _, err := b.Get(ctx, TopicKey(prefix, name), false)
	if err != nil {
		return TopicMeta{}, KV{}, err
	}
	if len(kvs) == 0 {
		return TopicMeta{}, KV{}, ErrUnknownTopic
	}
	t, err := ParseTopicKV(prefix, kvs[0])
	return t, kvs[0], err
}

// DeleteTopic removes topics/<name> and returns the record it removed (its id names the files
// to park); ErrUnknownTopic when absent.
func DeleteTopic(ctx context.Context, b Backend, prefix, name string) (TopicMeta, error) {
	key := TopicKey(prefix, name)
	for {
		t, kv, err := getTopic(ctx, b, prefix, name)
		if err != nil {
			return TopicMeta{}, fmt.Errorf("cannot delete topic %s: %w", name, err)
		}
		// The compare makes "exists" and "delete" one atomic step: of two concurrent deleters
		// one succeeds and the other re-reads and gets ErrUnknownTopic, as Kafka answers.
		ok, _, err := b.Txn(ctx, []Compare{{Key: key, Field: CreateRevision, Rev: kv.CreateRev}}, []Op{{Key: key, Delete: true}})
		if err != nil {
			return TopicMeta{}, fmt.Errorf("cannot delete topic %s: %w", name, err)
		}
		if ok {
			return t, nil
		}
	}
}

// SetPartitions grows topics/<name> to total partitions with a CAS on its ModRevision, retried
// on a concurrent change. Fewer or equal partitions → ErrInvalidPartitions (Kafka
// CreatePartitions answers INVALID_PARTITIONS for both).
func SetPartitions(ctx context.Context, b Backend, prefix, name string, total int32) error {
	key := TopicKey(prefix, name)
	for {
		t, kv, err := getTopic(ctx, b, prefix, name)
		if err != nil {
			return fmt.Errorf("cannot set partitions of topic %s to %d: %w", name, total, err)
		}
		if total <= t.Partitions {
			return fmt.Errorf("cannot set partitions of topic %s to %d (has %d): %w", name, total, t.Partitions, ErrInvalidPartitions)
		}
		t.Partitions = total
		ok, _, err := b.Txn(ctx, []Compare{{Key: key, Field: ModRevision, Rev: kv.ModRev}}, []Op{{Key: key, Value: encodeTopic(t)}})
		if err != nil {
			return fmt.Errorf("cannot set partitions of topic %s to %d: %w", name, total, err)
		}
		if ok {
			return nil
		}
	}
}

// SetTopicConfigs replaces the config overrides of topics/<name> with what edit makes of the
// current ones, with a CAS on its ModRevision retried on a concurrent change (edit sees the
// record as it is each time, so two IncrementalAlterConfigs through two brokers both land). An
// error from edit (a config that does not validate) is returned as it is and nothing is
// written. It returns the overrides written and the revision of the write. Every broker's agent applies them from its watch
// (TopicChanged), so DescribeConfigs and the leaders' cleaners and flushers agree, as Apache's
// brokers follow the controller's config records.
func SetTopicConfigs(ctx context.Context, b Backend, prefix, name string, edit func(cur map[string]string) (map[string]string, error)) (map[string]string, int64, error) {
	key := TopicKey(prefix, name)
	for {
		t, kv, err := getTopic(ctx, b, prefix, name)
		if err != nil {
			return nil, 0, fmt.Errorf("cannot set configs of topic %s: %w", name, err)
		}
		cur := make(map[string]string, len(t.Configs))
		for k, v := range t.Configs {
			cur[k] = v
		}
		next, err := edit(cur)
		if err != nil {
			return nil, 0, err
		}
		t.Configs = next
		ok, rev, err := b.Txn(ctx, []Compare{{Key: key, Field: ModRevision, Rev: kv.ModRev}}, []Op{{Key: key, Value: encodeTopic(t)}})
		if err != nil {
			return nil, 0, fmt.Errorf("cannot set configs of topic %s: %w", name, err)
		}
		if ok {
			return next, rev, nil
		}
	}
}

// ListTopics reads every topic, sorted by name, and the revision of the read (watch TopicsPrefix
// from rev+1 to follow changes).
func ListTopics(ctx context.Context, b Backend, prefix string) ([]TopicMeta, int64, error) {
	kvs, rev, err := b.Get(ctx, TopicsPrefix(prefix), true)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot list topics (%s): %w", prefix, err)
	}
	out := make([]TopicMeta, 0, len(kvs))
	for _, kv := range kvs {
		t, err := ParseTopicKV(prefix, kv)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, t)
	}
	return out, rev, nil
}
