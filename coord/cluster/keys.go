package cluster

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Sub-prefixes under the cluster prefix ("/kaas/<cluster.name>/") that the controller and the
// agent read or write. The layout is design note §1 "Key layout"; values are JSON.
const (
	pfxBrokers    = "brokers/"
	pfxTopics     = "topics/"
	pfxAssign     = "assign/"
	pfxRelease    = "release/"
	pfxController = "controller/" // election candidates, one key per candidate (own session lease)
)

// Path segments of a resource inside assign/ and release/.
const (
	segPartition = "p/"
	segTxnSlot   = "txn/"
	segGroup     = "grp/"
)

// ResourceKind says what a broker can hold: a partition (it leads it), a transaction slot or a
// group shard (it coordinates them).
type ResourceKind uint8

const (
	KindPartition ResourceKind = iota
	KindTxnSlot
	KindGroupShard
	numKinds
)

func (k ResourceKind) String() string {
	switch k {
	case KindPartition:
		return "partition"
	case KindTxnSlot:
		return "txn_slot"
	case KindGroupShard:
		return "group_shard"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Resource names one thing a broker can hold, as the Resources callbacks receive it.
type Resource struct {
	Kind      ResourceKind
	Topic     string   // partitions only
	TopicID   [16]byte // partitions only
	Partition int32    // partition, slot or shard number
}

// ResourceID is a resource's identity in etcd. A partition is keyed by topic ID, not name, so a
// topic deleted and re-created under the same name never inherits the old topic's epochs (Kafka
// topic IDs exist for the same reason, KIP-516).
type ResourceID struct {
	Kind    ResourceKind
	TopicID [16]byte // zero for slots and shards
	N       int32
}

func (r Resource) id() ResourceID {
	return ResourceID{Kind: r.Kind, TopicID: r.TopicID, N: r.Partition}
}

func (id ResourceID) String() string {
	switch id.Kind {
	case KindPartition:
		return segPartition + hex.EncodeToString(id.TopicID[:]) + "/" + strconv.Itoa(int(id.N))
	case KindTxnSlot:
		return segTxnSlot + strconv.Itoa(int(id.N))
	default:
		return segGroup + strconv.Itoa(int(id.N))
	}
}

// less orders resources by kind, topic ID, number: the balancer's deterministic order.
func (id ResourceID) less(o ResourceID) bool {
	if id.Kind != o.Kind {
		return id.Kind < o.Kind
	}
	if c := strings.Compare(string(id.TopicID[:]), string(o.TopicID[:])); c != 0 {
		return c < 0
	}
	return id.N < o.N
}

// assignKey is <prefix>assign/{p/<tid hex>/<p>|txn/<n>|grp/<n>}.
func assignKey(prefix string, id ResourceID) string { return prefix + pfxAssign + id.String() }

// releaseKey is <prefix>release/<resource>/<epoch>: written by the holder of epoch, read by the
// successor at epoch+1 (Rule S).
func releaseKey(prefix string, id ResourceID, epoch int32) string {
	return prefix + pfxRelease + id.String() + "/" + strconv.Itoa(int(epoch))
}

// parseResource parses "p/<tid>/<p>", "txn/<n>" or "grp/<n>" and returns what follows it.
func parseResource(s string) (id ResourceID, rest string, ok bool) {
	var num string
	switch {
	case strings.HasPrefix(s, segPartition):
		s = s[len(segPartition):]
		h, tail, found := strings.Cut(s, "/")
		if !found || len(h) != 32 {
			return id, "", false
		}
		if _, err := hex.Decode(id.TopicID[:], []byte(h)); err != nil {
			return id, "", false
		}
		id.Kind = KindPartition
		num, rest, _ = strings.Cut(tail, "/")
	case strings.HasPrefix(s, segTxnSlot):
		id.Kind = KindTxnSlot
		num, rest, _ = strings.Cut(s[len(segTxnSlot):], "/")
	case strings.HasPrefix(s, segGroup):
		id.Kind = KindGroupShard
		num, rest, _ = strings.Cut(s[len(segGroup):], "/")
	default:
		return id, "", false
	}
	n, err := strconv.ParseInt(num, 10, 32)
	if err != nil || n < 0 {
		return id, "", false
	}
	id.N = int32(n)
	return id, rest, true
}

// parseAssignKey inverts assignKey.
func parseAssignKey(prefix, key string) (ResourceID, bool) {
	s, ok := strings.CutPrefix(key, prefix+pfxAssign)
	if !ok {
		return ResourceID{}, false
	}
	id, rest, ok := parseResource(s)
	return id, ok && rest == ""
}

// parseReleaseKey inverts releaseKey.
func parseReleaseKey(prefix, key string) (ResourceID, int32, bool) {
	s, ok := strings.CutPrefix(key, prefix+pfxRelease)
	if !ok {
		return ResourceID{}, 0, false
	}
	id, rest, ok := parseResource(s)
	if !ok {
		return id, 0, false
	}
	e, err := strconv.ParseInt(rest, 10, 32)
	if err != nil || e < 0 {
		return id, 0, false
	}
	return id, int32(e), true
}

// Holder is one holding of a resource: a broker incarnation at an epoch. Broker −1 means none
// (the Prev of a first assignment).
type Holder struct {
	Broker int32
	Inc    string
	Epoch  int32
}

// noHolder is the Prev of a first assignment. Its epoch 0 is the epoch single-broker files are
// read at, so the first cluster holder (epoch 1) is a successor of a migrated single-broker
// data dir as well.
var noHolder = Holder{Broker: -1}

// Assignment is the value of assign/<resource>: who holds it at which epoch, and who held it
// at epoch−1 (the holder Rule S waits for).
type Assignment struct {
	Holder
	Prev Holder
}

// wireHolder is a Holder on the wire. Partitions name the holder "leader" and slots and shards
// "owner" (design note §1), so exactly one of the two is set.
type wireHolder struct {
	Leader *int32 `json:"leader,omitempty"`
	Owner  *int32 `json:"owner,omitempty"`
	Inc    string `json:"inc"`
	Epoch  int32  `json:"epoch"`
}

type wireAssignment struct {
	wireHolder
	Prev *wireHolder `json:"prev,omitempty"`
}

func toWire(k ResourceKind, h Holder) wireHolder {
	b := h.Broker
	w := wireHolder{Inc: h.Inc, Epoch: h.Epoch}
	if k == KindPartition {
		w.Leader = &b
	} else {
		w.Owner = &b
	}
	return w
}

func fromWire(w wireHolder) (Holder, bool) {
	h := Holder{Broker: -1, Inc: w.Inc, Epoch: w.Epoch}
	switch {
	case w.Leader != nil:
		h.Broker = *w.Leader
	case w.Owner != nil:
		h.Broker = *w.Owner
	default:
		return h, false
	}
	return h, true
}

func encodeAssignment(k ResourceKind, a Assignment) []byte {
	w := wireAssignment{wireHolder: toWire(k, a.Holder)}
	if a.Prev.Broker >= 0 {
		p := toWire(k, a.Prev)
		w.Prev = &p
	}
	b, _ := json.Marshal(w) // cannot fail: plain fields
	return b
}

func decodeAssignment(v []byte) (Assignment, error) {
	var w wireAssignment
	if err := json.Unmarshal(v, &w); err != nil {
		return Assignment{}, fmt.Errorf("cannot decode assignment %q: %w", v, err)
	}
	h, ok := fromWire(w.wireHolder)
	if !ok {
		return Assignment{}, fmt.Errorf("cannot decode assignment %q: no leader or owner", v)
	}
	a := Assignment{Holder: h, Prev: noHolder}
	if w.Prev != nil {
		if p, ok := fromWire(*w.Prev); ok {
			a.Prev = p
		}
	}
	return a, nil
}

// releaseValue is the value of release/<resource>/<epoch>: the releasing incarnation (Rule S
// accepts only the one the assignment's prev names) and the opaque record Resources.Release
// returned, handed to the successor's Acquire.
type releaseValue struct {
	Inc    string `json:"inc"`
	Record []byte `json:"record"`
}

func encodeRelease(inc string, record []byte) []byte {
	b, _ := json.Marshal(releaseValue{Inc: inc, Record: record})
	return b
}

func decodeRelease(v []byte) (releaseValue, error) {
	var r releaseValue
	if err := json.Unmarshal(v, &r); err != nil {
		return r, fmt.Errorf("cannot decode release record %q: %w", v, err)
	}
	return r, nil
}

// candidateValue is the value of a controller election candidate. The oldest candidate is the
// controller (that is what winning a concurrency.Election means), so every broker learns the
// controller id from the election keys themselves and it can never go stale: the key dies with
// the candidate's session.
type candidateValue struct {
	Broker int32 `json:"broker"`
}

func encodeCandidate(id int32) []byte {
	b, _ := json.Marshal(candidateValue{Broker: id})
	return b
}

func decodeCandidate(v []byte) (int32, error) {
	var c candidateValue
	if err := json.Unmarshal(v, &c); err != nil {
		return -1, fmt.Errorf("cannot decode controller candidate %q: %w", v, err)
	}
	return c.Broker, nil
}

// brokerFromKV and topicFromKV decode the membership and topic records (member.go, topics.go)
// for the controller and agent, which skip a record they cannot read rather than stop.
func brokerFromKV(prefix string, kv KV) (BrokerRecord, bool) {
	r, err := ParseBrokerKV(prefix, kv)
	return r, err == nil
}

func topicFromKV(prefix string, kv KV) (TopicMeta, bool) {
	t, err := ParseTopicKV(prefix, kv)
	return t, err == nil
}
