package server

// Topology use in the handlers: the one partition check every partition API runs, the internal
// topics, and the broker list clients are given.
//
// The partition check, in Apache's order (KafkaApis authorizes and looks the topic up, then
// ReplicaManager / Partition check the replica):
//
//	authorize op on the topic ──no──▶ TOPIC_AUTHORIZATION_FAILED (29)
//	   │ (lookupTopic, once per request topic)
//	topic exists? ──no──▶ UNKNOWN_TOPIC_OR_PARTITION (3)
//	   │ (localPartition → leadPartition, per partition, from here on)
//	partition exists? ──no──▶ UNKNOWN_TOPIC_OR_PARTITION (3)
//	internal topic and op is Write? ──yes──▶ INVALID_TOPIC_EXCEPTION (17)
//	do I lead it now, and is it loaded here? ──no──▶ NOT_LEADER_OR_FOLLOWER (6)
//	current_leader_epoch (KIP-320) ──older──▶ FENCED_LEADER_EPOCH (74)
//	   │                           ──newer──▶ UNKNOWN_LEADER_EPOCH (75)
//	   ▼
//	the partition, and the epoch we lead it at
//
// APIs that differ from this order do their part before calling it: ListOffsets answers a
// partition named twice INVALID_REQUEST first, Fetch by topic id answers UNKNOWN_TOPIC_ID (100)
// for an unknown id before authorizing (there is no name to authorize), WriteTxnMarkers checks
// CLUSTER_ACTION itself (opCallerAuthorized).

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"crypto/sha256"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/storage"
)

// listenerName is the name of the one listener a kaas broker serves (configs accepts
// PLAINTEXT://host:port only). Brokers are described to clients by their endpoint on it.
const listenerName = "PLAINTEXT"

// opCallerAuthorized tells lookupTopic that the caller checked a cluster-level ACL instead of a
// topic one (WriteTxnMarkers needs CLUSTER_ACTION, not an operation on the topic).
const opCallerAuthorized Operation = -1

// topicRef is a topic as one request names it, looked up once for all its partitions: the
// authorization and the topic lookup are per topic, the rest of the check per partition.
type topicRef struct {
	name     string
	op       Operation
	t        *storage.Topic // nil for an unknown or an internal topic
	internal int32          // partition count of __consumer_offsets / __transaction_state, else 0
	code     int16          // the answer for every partition of the topic, if not CodeNone
}

// lookupTopic authorizes op on the topic and looks it up.
func (rc *reqCtx) lookupTopic(op Operation, name string) topicRef {
	if op != opCallerAuthorized && !rc.authorized(op, ResTopic, name) {
		return topicRef{name: name, op: op, code: codec.CodeTopicAuthorizationFailed}
	}
	return resolveTopic(rc.s.deps.Store, op, name)
}

// resolveTopic is lookupTopic for a caller that has authorized already (or needs no ACL: the
// broker's own marker path).
func resolveTopic(store *storage.Store, op Operation, name string) topicRef {
	tr := topicRef{name: name, op: op}
	if n, ok := topology.InternalPartitions(name); ok {
		tr.internal = n
		return tr
	}
	if tr.t = store.Topic(name); tr.t == nil {
		tr.code = codec.CodeUnknownTopicOrPartition
	}
	return tr
}

// leaderPart is a partition this broker leads now, as localPartition found it.
type leaderPart struct {
	// p is nil for a partition of an internal topic: there is no log behind it (the state lives
	// in the coordinators' journals), and each API answers for it as for an empty log.
	p     *storage.Partition
	epoch int32 // the leader epoch we lead it at
}

// localPartition is the per-partition half of the check drawn at the top of this file; every
// partition API (Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, WriteTxnMarkers,
// DescribeProducers) goes through it. currentEpoch is the request's current_leader_epoch, -1 for
// none (Produce carries none).
func (rc *reqCtx) localPartition(tr *topicRef, part int32, currentEpoch int32) (leaderPart, int16) {
	return leadPartition(rc.s.deps.Topology, tr, part, currentEpoch)
}

// leadPartition is localPartition without a request, for the broker's own paths (the marker
// writer resolves with resolveTopic and checks here, so a partition it does not lead is refused
// by the same rule as a client's request).
func leadPartition(topo topology.Topology, tr *topicRef, part int32, currentEpoch int32) (leaderPart, int16) {
	if tr.code != codec.CodeNone {
		return leaderPart{}, tr.code
	}
	var p *storage.Partition
	var o topology.Owner
	if tr.internal > 0 {
		if part < 0 || part >= tr.internal {
			return leaderPart{}, codec.CodeUnknownTopicOrPartition
		}
		if tr.op == OpWrite {
			// Apache's ReplicaManager refuses a client append to an internal topic before it
			// looks at leadership (only its coordinators write there).
			return leaderPart{}, codec.CodeInvalidTopicException
		}
		o = topology.PartitionOwner(topo, tr.name, part) // the shard's / slot's owner
	} else {
		if p = tr.t.Partition(part); p == nil {
			return leaderPart{}, codec.CodeUnknownTopicOrPartition
		}
		o = topo.Partition(tr.name, part)
	}
	if !o.Local || (p != nil && !p.Loaded()) {
		// Not ours, or ours but not open here (being loaded or released at runtime): Apache's
		// replica manager answers NOT_LEADER_OR_FOLLOWER until the partition is online.
		return leaderPart{}, codec.CodeNotLeaderForPartition
	}
	if code := checkLeaderEpoch(currentEpoch, o.Epoch); code != codec.CodeNone {
		return leaderPart{}, code
	}
	return leaderPart{p: p, epoch: o.Epoch}, codec.CodeNone
}

// checkLeaderEpoch is Kafka's Partition.checkCurrentLeaderEpoch (KIP-320): -1 means "no check";
// an epoch older than ours is fenced (the client saw an earlier leadership), a newer one is
// unknown to us (our view lags the client's).
func checkLeaderEpoch(requested, ours int32) int16 {
	switch {
	case requested == -1:
		return codec.CodeNone
	case requested < ours:
		return codec.CodeFencedLeaderEpoch
	case requested > ours:
		return codec.CodeUnknownLeaderEpoch
	}
	return codec.CodeNone
}

// internalTopic is __consumer_offsets or __transaction_state as clients see them: Metadata lists
// them with is_internal=true and 50 partitions, partition N led by the owner of group shard N /
// transaction slot N, as in Apache. They are not storage topics: clients may not produce to,
// create or delete them, and a read finds an empty log.
type internalTopic struct {
	name       string
	id         [16]byte
	partitions int32
}

// newInternalTopics builds the two internal topics of a cluster. Their topic ids are derived from
// the cluster id, so every broker of a cluster and every restart give the same ids (Apache picks
// them at random when it creates the topics and keeps them in its metadata log).
func newInternalTopics(clusterID string) [2]internalTopic {
	mk := func(name string, n int32) internalTopic {
		sum := sha256.Sum256([]byte("kaas internal topic\x00" + clusterID + "\x00" + name))
		var id [16]byte
		copy(id[:], sum[:16])
		id[6] = id[6]&0x0f | 0x80 // RFC 9562 version 8 (vendor-defined), variant 10
		id[8] = id[8]&0x3f | 0x80
		return internalTopic{name: name, id: id, partitions: n}
	}
	return [2]internalTopic{
		mk(topology.GroupsTopic, topology.NumGroupShards),
		mk(topology.TxnTopic, topology.NumTxnSlots),
	}
}

// internalByName returns the internal topic of that name, or nil.
func (s *Server) internalByName(name string) *internalTopic {
	if _, ok := topology.InternalPartitions(name); !ok {
		return nil
	}
	for i := range s.internal {
		if s.internal[i].name == name {
			return &s.internal[i]
		}
	}
	return nil
}

// internalByID returns the internal topic with that topic id, or nil.
func (s *Server) internalByID(id [16]byte) *internalTopic {
	for i := range s.internal {
		if s.internal[i].id == id {
			return &s.internal[i]
		}
	}
	return nil
}

// topicNameByID resolves a topic id (Fetch v13+, Metadata v10+) to its name.
func (s *Server) topicNameByID(id [16]byte) (string, bool) {
	if t := s.deps.Store.TopicByID(id); t != nil {
		return t.Name, true
	}
	if it := s.internalByID(id); it != nil {
		return it.name, true
	}
	return "", false
}

// liveBroker is a broker as clients are told about it.
type liveBroker struct {
	id   int32
	rack string
	host string
	port int32
}

// liveBrokers lists the live brokers that have an endpoint on our listener, sorted by id, as
// Apache's MetadataCache.getAliveBrokerNodes(listener) does. The local broker is always listed:
// until the topology has learned its bound address it is given the advertised one.
func (s *Server) liveBrokers() []liveBroker {
	topo := s.deps.Topology
	local := topo.LocalID()
	brokers := topo.Brokers()
	out := make([]liveBroker, 0, len(brokers)+1)
	sawLocal := false
	for _, b := range brokers {
		ep, ok := b.Endpoint(listenerName)
		if b.ID == local {
			sawLocal = true
			if !ok {
				ep.Host, ep.Port = s.advertised()
				ok = true
			}
		}
		if ok {
			out = append(out, liveBroker{id: b.ID, rack: b.Rack, host: ep.Host, port: ep.Port})
		}
	}
	if !sawLocal {
		h, p := s.advertised()
		out = append(out, liveBroker{id: local, host: h, port: p})
		for i := len(out) - 1; i > 0 && out[i].id < out[i-1].id; i-- {
			out[i], out[i-1] = out[i-1], out[i]
		}
	}
	return out
}

// findBroker returns the live broker with that id.
func findBroker(brokers []liveBroker, id int32) (liveBroker, bool) {
	for _, b := range brokers {
		if b.id == id {
			return b, true
		}
	}
	return liveBroker{}, false
}

// groupOwner is the owner of the shard a group id hashes to.
func (s *Server) groupOwner(group string) topology.Owner {
	return s.deps.Topology.GroupShard(topology.GroupShard(group))
}

// txnOwner is the owner of the slot a transactional id hashes to.
func (s *Server) txnOwner(tid string) topology.Owner {
	return s.deps.Topology.TxnSlot(topology.TxnSlot(tid))
}

// localEndpointSetter is a topology that learns the local broker's address from the bound
// listener (topology.Table): a listener bound to port 0 knows its port only after Start.
type localEndpointSetter interface {
	SetLocalEndpoint(topology.Endpoint)
}

// publishLocalEndpoint tells the topology where this broker listens, if it wants to know.
func (s *Server) publishLocalEndpoint() {
	if t, ok := s.deps.Topology.(localEndpointSetter); ok {
		h, p := s.advertised()
		t.SetLocalEndpoint(topology.Endpoint{Listener: listenerName, Host: h, Port: p})
	}
}

// leaderHints collects KIP-951 hints for the partitions a Produce (v10+) or Fetch (v16+) refused
// with NOT_LEADER_OR_FOLLOWER (Fetch also FENCED_LEADER_EPOCH): the leader and epoch the topology
// knows, and that leader's endpoint once per response, so the client moves to the new leader
// without a Metadata round trip, as Apache does.
type leaderHints struct {
	s       *Server
	brokers []liveBroker // listed on the first hint
	nodes   []liveBroker // the endpoints the response carries, each once
}

// hint returns the partition's known leader and epoch, or (-1, -1) when there is none to name
// (no owner, or the owner is not a live broker on our listener).
func (h *leaderHints) hint(topic string, part int32) (leader, epoch int32) {
	o := topology.PartitionOwner(h.s.deps.Topology, topic, part)
	if !o.Known {
		return -1, -1
	}
	if h.brokers == nil {
		h.brokers = h.s.liveBrokers()
	}
	b, ok := findBroker(h.brokers, o.Broker)
	if !ok {
		return -1, -1
	}
	if _, seen := findBroker(h.nodes, b.id); !seen {
		h.nodes = append(h.nodes, b)
	}
	return o.Broker, o.Epoch
}

// each calls fn with every endpoint the response must carry (nil-safe: no hints, no calls); the
// callers build their own kmsg broker type from it.
func (h *leaderHints) each(fn func(id int32, host string, port int32, rack *string)) {
	if h == nil {
		return
	}
	for _, b := range h.nodes {
		var rack *string
		if b.rack != "" {
			rack = kmsg.StringPtr(b.rack)
		}
		fn(b.id, b.host, b.port, rack)
	}
}
