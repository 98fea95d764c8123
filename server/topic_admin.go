package server

import (
	"fmt"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// TopicAdmin is how CreateTopics, Metadata's auto-creation, DeleteTopics and CreatePartitions
// change the set of topics, and what they ask about replication. A single broker changes its
// local store (localTopics); cluster mode (cluster.go) first wins a compare-and-swap in etcd,
// which any broker may do, and then writes the files on the shared volume, so two brokers
// creating one name at once end with one topic (Apache routes the same race through its
// controller). The calls may block on etcd: they run on a connection's executor, never on an
// event loop.
type TopicAdmin interface {
	CreateTopic(name string, partitions int32, rf int16, configs map[string]string) (*storage.Topic, error)
	DeleteTopic(name string) error
	CreatePartitions(name string, total int32) error
	// SetTopicConfigs replaces a topic's config overrides with what edit makes of the current
	// ones (IncrementalAlterConfigs, AlterConfigs). edit validates; its error is returned and
	// nothing changes. In cluster mode the current overrides are the registry's, so a change
	// made through one broker is the one every broker applies.
	SetTopicConfigs(name string, edit func(cur map[string]string) (map[string]string, error)) error
	// ReplicationFactor is what Metadata and DescribeTopics report for a topic: 1 on a single
	// broker; the factor asked for at creation in a cluster (the shared volume is the replica;
	// the replica list is the leader and its failover candidates).
	ReplicationFactor(name string) int16
	// Registered is the broker ids a replica list may name: this broker alone, or every
	// registered broker of the cluster. A replication factor above len(Registered) is
	// INVALID_REPLICATION_FACTOR (38), as in Apache.
	Registered() []int32
}

// localTopics is the single broker's TopicAdmin: the store itself.
type localTopics struct {
	store *storage.Store
	id    int32
}

func (l localTopics) CreateTopic(name string, partitions int32, _ int16, kv map[string]string) (*storage.Topic, error) {
	return l.store.CreateTopic(name, partitions, kv)
}
func (l localTopics) DeleteTopic(name string) error { return l.store.DeleteTopic(name) }
func (l localTopics) CreatePartitions(name string, total int32) error {
	return l.store.CreatePartitions(name, total)
}
func (l localTopics) SetTopicConfigs(name string, edit func(map[string]string) (map[string]string, error)) error {
	return l.store.EditTopicConfig(name, edit)
}
func (l localTopics) ReplicationFactor(string) int16 { return 1 }
func (l localTopics) Registered() []int32            { return []int32{l.id} }

func (s *Server) topics() TopicAdmin {
	if s.deps.Topics != nil {
		return s.deps.Topics
	}
	return localTopics{store: s.deps.Store, id: s.cfg.BrokerID}
}

// checkReplicationFactor is CreateTopics' replication check: -1 is the default (1), anything
// from 1 to the number of registered brokers is served, the rest is 38 with Apache's message.
func checkReplicationFactor(rf int16, registered int) (int16, string, int16) {
	switch {
	case rf == -1:
		return 0, "", 1
	case rf <= 0:
		return codec.CodeInvalidReplicationFactor, fmt.Sprintf("The replication factor must be positive, or -1 for the broker default; got %d.", rf), 0
	case int(rf) > registered:
		return codec.CodeInvalidReplicationFactor, fmt.Sprintf("Replication factor: %d larger than available brokers: %d.", rf, registered), 0
	}
	return 0, "", rf
}

// replicaList is a partition's Replicas and ISR in Metadata: the leader, then the next rf−1
// live brokers in id order after it (its failover candidates: the volume is the replica, so
// every live broker can take over at once, and they are all "in sync").
func replicaList(leader int32, rf int16, live []liveBroker) []int32 {
	out := []int32{leader}
	if rf <= 1 || len(live) <= 1 {
		return out
	}
	start := 0 // the first broker after the leader in id order, wrapping around
	for start < len(live) && live[start].id <= leader {
		start++
	}
	for k := 0; k < len(live) && len(out) < int(rf); k++ {
		b := live[(start+k)%len(live)]
		if b.id != leader {
			out = append(out, b.id)
		}
	}
	return out
}
