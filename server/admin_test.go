package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/storage"
)

// adminEnv is a broker plus the clients the admin tests drive it with.
type adminEnv struct {
	addr string
	s    *Server
	cl   *kgo.Client
	adm  *kadm.Client
	ctx  context.Context
}

func newAdminEnv(t *testing.T, opts ...func(*configs.Config)) *adminEnv {
	t.Helper()
	addr, s := newTestBroker(t, opts...)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RetryTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return &adminEnv{addr: addr, s: s, cl: cl, adm: kadm.NewClient(cl), ctx: ctx}
}

// request sends a raw request and fails the test on transport errors.
func (e *adminEnv) request(t *testing.T, req kmsg.Request) kmsg.Response {
	t.Helper()
	resp, err := e.cl.Request(e.ctx, req)
	if err != nil {
		t.Fatalf("%s: %v", kmsg.NameForKey(req.Key()), err)
	}
	return resp
}

// rawRequest sends req at exactly req.Version on a fresh connection (kgo picks versions itself).
func (e *adminEnv) rawRequest(t *testing.T, req kmsg.Request) kmsg.Response {
	t.Helper()
	rc := dialRaw(t, e.addr)
	rc.send(req, 7)
	corr, body, err := rc.recv()
	if err != nil || corr != 7 {
		t.Fatalf("%s v%d: corr %d, %v", kmsg.NameForKey(req.Key()), req.GetVersion(), corr, err)
	}
	if req.IsFlexible() {
		body = body[1:] // response header v1: empty tag buffer
	}
	resp := req.ResponseKind()
	if err := resp.ReadFrom(body); err != nil {
		t.Fatalf("%s v%d: cannot parse response: %v", kmsg.NameForKey(req.Key()), req.GetVersion(), err)
	}
	return resp
}

func (e *adminEnv) create(t *testing.T, topic string, partitions int32, configs map[string]*string) kadm.CreateTopicResponse {
	t.Helper()
	r, err := e.adm.CreateTopic(e.ctx, partitions, 1, configs, topic)
	if err != nil {
		t.Fatalf("create %s: %v (%s)", topic, err, r.ErrMessage)
	}
	return r
}

// topicConfigs describes one topic's configs by key.
func (e *adminEnv) topicConfigs(t *testing.T, topic string) map[string]kadm.Config {
	t.Helper()
	rcs, err := e.adm.DescribeTopicConfigs(e.ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(rcs) != 1 || rcs[0].Err != nil {
		t.Fatalf("describe %s: %+v", topic, rcs)
	}
	m := map[string]kadm.Config{}
	for _, c := range rcs[0].Configs {
		m[c.Key] = c
	}
	return m
}

func expectErr(t *testing.T, what string, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Fatalf("%s: got error %v, want %v", what, got, want)
	}
}

func TestAdminCreateTopics(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, func(c *configs.Config) { c.NumPartitions = 2 })
	store := e.s.deps.Store

	r := e.create(t, "orders", 3, map[string]*string{"retention.ms": kadm.StringPtr("60000")})
	if r.ID == (kadm.TopicID{}) || r.NumPartitions != 3 || r.ReplicationFactor != 1 {
		t.Fatalf("create response: %+v", r)
	}
	if c := r.Configs["retention.ms"]; c.Value == nil || *c.Value != "60000" || c.Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Fatalf("retention.ms in create response: %+v", c)
	}
	if c := r.Configs["segment.bytes"]; c.Source != kmsg.ConfigSourceDefaultConfig {
		t.Fatalf("segment.bytes in create response: %+v", c)
	}
	st := store.Topic("orders")
	if st == nil || st.NumPartitions() != 3 || st.ID != [16]byte(r.ID) || st.Config().RetentionMs != 60000 {
		t.Fatalf("storage topic after create: %+v", st)
	}

	// Broker default partitions (-1).
	r = e.create(t, "defaults", -1, nil)
	if r.NumPartitions != 2 {
		t.Fatalf("-1 partitions: got %d, want num.partitions=2", r.NumPartitions)
	}

	f := func(name string, partitions int32, rf int16, cfg map[string]*string, want error, msgPart string) {
		t.Helper()
		rs, err := e.adm.CreateTopics(e.ctx, partitions, rf, cfg, name)
		if err != nil {
			t.Fatal(err)
		}
		got := rs[name]
		expectErr(t, name, got.Err, want)
		if !strings.Contains(got.ErrMessage, msgPart) {
			t.Fatalf("%s: message %q does not contain %q", name, got.ErrMessage, msgPart)
		}
		if store.Topic(name) != nil && want != kerr.TopicAlreadyExists {
			t.Fatalf("%s: failed create left a topic behind", name)
		}
	}
	f("orders", 1, 1, nil, kerr.TopicAlreadyExists, "already exists")
	f("rf3", 1, 3, nil, kerr.InvalidReplicationFactor, "Replication factor: 3 larger than available brokers: 1.")
	f("rf0", 1, 0, nil, kerr.InvalidReplicationFactor, "")
	f("p0", 0, 1, nil, kerr.InvalidPartitions, "")
	f("bad name!", 1, 1, nil, kerr.InvalidTopicException, "allowed")
	f(strings.Repeat("x", 250), 1, 1, nil, kerr.InvalidTopicException, "invalid topic name")
	f("..", 1, 1, nil, kerr.InvalidTopicException, "")
	f("badpolicy", 1, 1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact,forever")}, kerr.InvalidConfig, "cleanup.policy")
	f("unknowncfg", 1, 1, map[string]*string{"no.such.key": kadm.StringPtr("1")}, kerr.InvalidConfig, "no.such.key")
	f("badvalue", 1, 1, map[string]*string{"retention.ms": kadm.StringPtr("soon")}, kerr.InvalidConfig, "retention.ms")
	f("nullvalue", 1, 1, map[string]*string{"retention.ms": nil}, kerr.InvalidConfig, "retention.ms")

	// '.' and '_' collide.
	e.create(t, "a.b", 1, nil)
	f("a_b", 1, 1, nil, kerr.InvalidTopicException, "collides")

	// Validate-only validates everything and creates nothing.
	vs, err := e.adm.ValidateCreateTopics(e.ctx, 4, 1, map[string]*string{"segment.bytes": kadm.StringPtr("1048576")}, "dry")
	if err != nil || vs["dry"].Err != nil {
		t.Fatalf("validate-only: %v %+v", err, vs["dry"])
	}
	if v := vs["dry"]; v.NumPartitions != 4 || v.Configs["segment.bytes"].Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Fatalf("validate-only response: %+v", v)
	}
	if store.Topic("dry") != nil {
		t.Fatal("validate-only created the topic")
	}
	vs, _ = e.adm.ValidateCreateTopics(e.ctx, 1, 1, nil, "orders")
	expectErr(t, "validate-only existing", vs["orders"].Err, kerr.TopicAlreadyExists)
	vs, _ = e.adm.ValidateCreateTopics(e.ctx, 1, 5, nil, "dry")
	expectErr(t, "validate-only rf5", vs["dry"].Err, kerr.InvalidReplicationFactor)
}

func TestAdminCreateTopicsRaw(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t)
	store := e.s.deps.Store
	topic := func(name string, partitions int32, rf int16) kmsg.CreateTopicsRequestTopic {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, partitions, rf
		return rt
	}
	assigned := func(name string, replicas ...[]int32) kmsg.CreateTopicsRequestTopic {
		rt := topic(name, -1, -1)
		for p, r := range replicas {
			a := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
			a.Partition, a.Replicas = int32(p), r
			rt.ReplicaAssignment = append(rt.ReplicaAssignment, a)
		}
		return rt
	}

	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 5000
	req.Topics = []kmsg.CreateTopicsRequestTopic{
		topic("dup", 1, 1), topic("dup", 2, 1), topic("single", 1, 1),
		assigned("manual", []int32{0}, []int32{0}),
		assigned("elsewhere", []int32{1}),
		assigned("tworeplicas", []int32{0, 1}),
	}
	bothSet := assigned("both", []int32{0})
	bothSet.NumPartitions = 1
	req.Topics = append(req.Topics, bothSet)
	resp := e.request(t, req).(*kmsg.CreateTopicsResponse)
	got := map[string]kmsg.CreateTopicsResponseTopic{}
	for _, rt := range resp.Topics {
		if _, ok := got[rt.Topic]; ok {
			t.Fatalf("topic %s answered twice", rt.Topic)
		}
		got[rt.Topic] = rt
	}
	want := map[string]int16{
		"dup": kerr.InvalidRequest.Code, "single": 0, "manual": 0,
		"elsewhere": kerr.InvalidReplicaAssignment.Code, "tworeplicas": kerr.InvalidReplicaAssignment.Code,
		"both": kerr.InvalidRequest.Code,
	}
	for name, code := range want {
		if got[name].ErrorCode != code {
			t.Errorf("%s: error %d, want %d (%v)", name, got[name].ErrorCode, code, got[name].ErrorMessage)
		}
	}
	if store.Topic("dup") != nil {
		t.Error("duplicate entries created a topic")
	}
	if m := store.Topic("manual"); m == nil || m.NumPartitions() != 2 {
		t.Errorf("manual assignment: %+v", m)
	}
	if got["single"].TopicID == ([16]byte{}) {
		t.Error("v7 response has no topic ID")
	}
}

func TestAdminDescribeConfigs(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, func(c *configs.Config) { c.LogRetentionMs = 3600000 })
	e.create(t, "t", 1, map[string]*string{"max.message.bytes": kadm.StringPtr("2000000")})

	cs := e.topicConfigs(t, "t")
	for _, k := range []string{"retention.ms", "retention.bytes", "segment.bytes", "segment.ms", "max.message.bytes",
		"cleanup.policy", "message.timestamp.type", "flush.messages"} {
		if _, ok := cs[k]; !ok {
			t.Errorf("topic config %s missing", k)
		}
	}
	mm := cs["max.message.bytes"]
	if *mm.Value != "2000000" || mm.Source != kmsg.ConfigSourceDynamicTopicConfig || mm.Sensitive {
		t.Errorf("max.message.bytes: %+v", mm)
	}
	if len(mm.Synonyms) == 0 || mm.Synonyms[0].Source != kmsg.ConfigSourceDynamicTopicConfig ||
		mm.Synonyms[len(mm.Synonyms)-1].Key != "message.max.bytes" {
		t.Errorf("max.message.bytes synonyms: %+v", mm.Synonyms)
	}
	if c := cs["cleanup.policy"]; *c.Value != "delete" || c.Source != kmsg.ConfigSourceDefaultConfig {
		t.Errorf("cleanup.policy: %+v", c)
	}

	// Raw: ConfigNames filter, v3+ types, unknown topic, broker resources.
	res := func(typ kmsg.ConfigResourceType, name string, keys ...string) kmsg.DescribeConfigsRequestResource {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType, r.ResourceName, r.ConfigNames = typ, name, keys
		return r
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	req.Resources = []kmsg.DescribeConfigsRequestResource{
		res(kmsg.ConfigResourceTypeTopic, "t", "cleanup.policy", "segment.bytes", "nope"),
		res(kmsg.ConfigResourceTypeTopic, "missing"),
		res(kmsg.ConfigResourceTypeBroker, "0"),
		res(kmsg.ConfigResourceTypeBroker, ""),
		res(kmsg.ConfigResourceTypeBroker, "7"),
		res(kmsg.ConfigResourceTypeBrokerLogger, "0"),
		res(kmsg.ConfigResourceTypeGroupConfig, "g"),
	}
	// Raw: kgo would shard broker "7" to a broker that does not exist.
	req.Version = 4
	resp := e.rawRequest(t, req).(*kmsg.DescribeConfigsResponse)
	if len(resp.Resources) != len(req.Resources) {
		t.Fatalf("%d resources answered, want %d", len(resp.Resources), len(req.Resources))
	}
	r := resp.Resources
	if r[0].ErrorCode != 0 || len(r[0].Configs) != 2 {
		t.Errorf("filtered topic: %+v", r[0])
	}
	for _, c := range r[0].Configs {
		want := map[string]kmsg.ConfigType{"cleanup.policy": kmsg.ConfigTypeList, "segment.bytes": kmsg.ConfigTypeInt}[c.Name]
		if c.ConfigType != want || c.ReadOnly || c.Documentation != nil {
			t.Errorf("%s: %+v", c.Name, c)
		}
	}
	if r[1].ErrorCode != kerr.UnknownTopicOrPartition.Code {
		t.Errorf("unknown topic: %+v", r[1])
	}
	broker := map[string]kmsg.DescribeConfigsResponseResourceConfig{}
	for _, c := range r[2].Configs {
		broker[c.Name] = c
	}
	for k, want := range map[string]string{
		"broker.id": "0", "num.partitions": "1", "log.retention.ms": "3600000",
		"auto.create.topics.enable": "true", "message.max.bytes": "1048588", "default.replication.factor": "1",
	} {
		c, ok := broker[k]
		if !ok || c.Value == nil || *c.Value != want || !c.ReadOnly {
			t.Errorf("broker config %s: %+v, want %s", k, c, want)
		}
	}
	if broker["log.retention.ms"].Source != kmsg.ConfigSourceStaticBrokerConfig ||
		broker["num.partitions"].Source != kmsg.ConfigSourceDefaultConfig {
		t.Errorf("broker config sources: %v %v", broker["log.retention.ms"].Source, broker["num.partitions"].Source)
	}
	if _, ok := broker["listeners"]; !ok {
		t.Error("broker config listeners missing")
	}
	if r[3].ErrorCode != 0 || len(r[3].Configs) != 0 {
		t.Errorf("cluster-default broker resource: %+v", r[3])
	}
	if r[4].ErrorCode != kerr.InvalidRequest.Code {
		t.Errorf("other broker id: %+v", r[4])
	}
	if r[5].ErrorCode != 0 {
		t.Errorf("broker logger: %+v", r[5])
	}
	if r[6].ErrorCode != kerr.InvalidRequest.Code {
		t.Errorf("group config: %+v", r[6])
	}

	// kadm's broker path (what kafka-configs --entity-type brokers --describe sends).
	brs, err := e.adm.DescribeBrokerConfigs(e.ctx, 0)
	if err != nil || len(brs) != 1 || brs[0].Err != nil || len(brs[0].Configs) < 10 {
		t.Fatalf("DescribeBrokerConfigs: %v %+v", err, brs)
	}
}

func TestAdminIncrementalAlterConfigs(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t)
	store := e.s.deps.Store
	e.create(t, "t", 1, nil)
	alter := func(ops ...kadm.AlterConfig) error {
		t.Helper()
		rs, err := e.adm.AlterTopicConfigs(e.ctx, ops, "t")
		if err != nil {
			t.Fatal(err)
		}
		return rs[0].Err
	}
	set := func(k, v string) kadm.AlterConfig {
		return kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: kadm.StringPtr(v)}
	}

	if err := alter(set("retention.ms", "120000"), set("segment.bytes", "4096")); err != nil {
		t.Fatal(err)
	}
	cs := e.topicConfigs(t, "t")
	if *cs["retention.ms"].Value != "120000" || cs["retention.ms"].Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Fatalf("after SET: %+v", cs["retention.ms"])
	}
	if c := store.Topic("t").Config(); c.RetentionMs != 120000 || c.SegmentBytes != 4096 {
		t.Fatalf("storage after SET: %+v", c)
	}

	if err := alter(kadm.AlterConfig{Op: kadm.DeleteConfig, Name: "retention.ms"}); err != nil {
		t.Fatal(err)
	}
	cs = e.topicConfigs(t, "t")
	if *cs["retention.ms"].Value != "604800000" || cs["retention.ms"].Source != kmsg.ConfigSourceDefaultConfig {
		t.Fatalf("after DELETE: %+v", cs["retention.ms"])
	}
	if ov := store.Topic("t").Overrides(); len(ov) != 1 || ov["segment.bytes"] != "4096" {
		t.Fatalf("storage overrides after DELETE: %v", ov)
	}

	// List semantics on cleanup.policy.
	if err := alter(kadm.AlterConfig{Op: kadm.AppendConfig, Name: "cleanup.policy", Value: kadm.StringPtr("delete")}); err != nil {
		t.Fatalf("APPEND delete to delete: %v", err)
	}
	if c := e.topicConfigs(t, "t")["cleanup.policy"]; *c.Value != "delete" {
		t.Fatalf("cleanup.policy after APPEND delete: %+v", c)
	}

	f := func(what string, want error, ops ...kadm.AlterConfig) {
		t.Helper()
		before := store.Topic("t").Overrides()
		expectErr(t, what, alter(ops...), want)
		if after := store.Topic("t").Overrides(); len(after) != len(before) || after["segment.bytes"] != before["segment.bytes"] {
			t.Fatalf("%s: a rejected alter changed storage: %v -> %v", what, before, after)
		}
	}
	f("append unknown policy", kerr.InvalidConfig, kadm.AlterConfig{Op: kadm.AppendConfig, Name: "cleanup.policy", Value: kadm.StringPtr("forever")})
	f("subtract delete", kerr.InvalidConfig, kadm.AlterConfig{Op: kadm.SubtractConfig, Name: "cleanup.policy", Value: kadm.StringPtr("delete")})
	f("append non-list", kerr.InvalidConfig, kadm.AlterConfig{Op: kadm.AppendConfig, Name: "retention.ms", Value: kadm.StringPtr("1")})
	f("unknown key", kerr.InvalidConfig, set("no.such.key", "1"))
	f("bad value", kerr.InvalidConfig, set("segment.bytes", "-5"))
	f("bad policy", kerr.InvalidConfig, set("cleanup.policy", "compact,never"))
	f("atomic", kerr.InvalidConfig, set("retention.ms", "1000"), set("segment.bytes", "x"))
	f("duplicate key", kerr.InvalidRequest, set("retention.ms", "1000"), set("retention.ms", "2000"))

	// Validate-only changes nothing.
	vr, err := e.adm.ValidateAlterTopicConfigs(e.ctx, []kadm.AlterConfig{set("retention.ms", "5000")}, "t")
	if err != nil || vr[0].Err != nil {
		t.Fatalf("validate-only: %v %+v", err, vr)
	}
	if _, ok := store.Topic("t").Overrides()["retention.ms"]; ok {
		t.Fatal("validate-only alter was applied")
	}

	// Unknown topic, broker configs.
	rs, err := e.adm.AlterTopicConfigs(e.ctx, []kadm.AlterConfig{set("retention.ms", "1")}, "missing")
	if err != nil {
		t.Fatal(err)
	}
	expectErr(t, "unknown topic", rs[0].Err, kerr.UnknownTopicOrPartition)
	rs, err = e.adm.AlterBrokerConfigs(e.ctx, []kadm.AlterConfig{set("log.retention.ms", "1")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	expectErr(t, "broker", rs[0].Err, kerr.InvalidRequest)
	if !strings.Contains(rs[0].ErrMessage, "static") {
		t.Errorf("broker alter message: %q", rs[0].ErrMessage)
	}
}

func TestAdminAlterConfigsLegacy(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t)
	store := e.s.deps.Store
	e.create(t, "t", 1, map[string]*string{"retention.ms": kadm.StringPtr("1000"), "flush.messages": kadm.StringPtr("10")})

	// Set-all: retention.ms is replaced, flush.messages (not named) is removed.
	rs, err := e.adm.AlterTopicConfigsState(e.ctx, []kadm.AlterConfig{
		{Name: "retention.ms", Value: kadm.StringPtr("2000")},
		{Name: "segment.ms", Value: kadm.StringPtr("3000")},
	}, "t")
	if err != nil || rs[0].Err != nil {
		t.Fatalf("AlterConfigs: %v %+v", err, rs)
	}
	ov := store.Topic("t").Overrides()
	if len(ov) != 2 || ov["retention.ms"] != "2000" || ov["segment.ms"] != "3000" {
		t.Fatalf("overrides after set-all: %v", ov)
	}
	if c := store.Topic("t").Config(); c.FlushMessages != 1 || c.RetentionMs != 2000 {
		t.Fatalf("storage config after set-all: %+v", c)
	}

	rs, _ = e.adm.AlterTopicConfigsState(e.ctx, []kadm.AlterConfig{{Name: "cleanup.policy", Value: kadm.StringPtr("never")}}, "t")
	expectErr(t, "bad policy", rs[0].Err, kerr.InvalidConfig)
	rs, _ = e.adm.ValidateAlterTopicConfigsState(e.ctx, nil, "t")
	if rs[0].Err != nil || len(store.Topic("t").Overrides()) != 2 {
		t.Fatalf("validate-only clear-all: %+v %v", rs, store.Topic("t").Overrides())
	}
	rs, _ = e.adm.AlterBrokerConfigsState(e.ctx, []kadm.AlterConfig{{Name: "num.partitions", Value: kadm.StringPtr("3")}}, 0)
	expectErr(t, "broker", rs[0].Err, kerr.InvalidRequest)
}

func TestAdminCreatePartitions(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t)
	store := e.s.deps.Store
	e.create(t, "t", 1, nil)

	rs, err := e.adm.UpdatePartitions(e.ctx, 3, "t")
	if err != nil || rs["t"].Err != nil {
		t.Fatalf("grow: %v %+v", err, rs)
	}
	if n := store.Topic("t").NumPartitions(); n != 3 {
		t.Fatalf("partitions after grow: %d", n)
	}
	md, err := e.adm.ListTopics(e.ctx, "t")
	if err != nil || len(md["t"].Partitions) != 3 {
		t.Fatalf("metadata after grow: %v %+v", err, md["t"])
	}

	f := func(what string, set int, topic string, want error) {
		t.Helper()
		rs, err := e.adm.UpdatePartitions(e.ctx, set, topic)
		if err != nil {
			t.Fatal(err)
		}
		expectErr(t, what, rs[topic].Err, want)
	}
	f("same count", 3, "t", kerr.InvalidPartitions)
	f("shrink", 2, "t", kerr.InvalidPartitions)
	f("unknown", 5, "missing", kerr.UnknownTopicOrPartition)

	vr, err := e.adm.ValidateCreatePartitions(e.ctx, 2, "t")
	if err != nil || vr["t"].Err != nil || store.Topic("t").NumPartitions() != 3 {
		t.Fatalf("validate-only: %v %+v, partitions %d", err, vr, store.Topic("t").NumPartitions())
	}

	// Explicit assignments: ours is fine, another broker or a wrong count is not.
	req := kmsg.NewPtrCreatePartitionsRequest()
	req.TimeoutMillis = 5000
	part := func(topic string, count int32, replicas ...[]int32) kmsg.CreatePartitionsRequestTopic {
		rt := kmsg.NewCreatePartitionsRequestTopic()
		rt.Topic, rt.Count = topic, count
		for _, r := range replicas {
			a := kmsg.NewCreatePartitionsRequestTopicAssignment()
			a.Replicas = r
			rt.Assignment = append(rt.Assignment, a)
		}
		return rt
	}
	e.create(t, "u", 1, nil)
	e.create(t, "w", 1, nil)
	req.Topics = []kmsg.CreatePartitionsRequestTopic{
		part("t", 5, []int32{0}, []int32{0}),
		part("u", 2, []int32{3}),
		part("w", 3, []int32{0}),
	}
	resp := e.request(t, req).(*kmsg.CreatePartitionsResponse)
	for i, want := range []int16{0, kerr.InvalidReplicaAssignment.Code, kerr.InvalidReplicaAssignment.Code} {
		if resp.Topics[i].ErrorCode != want {
			t.Errorf("%s: %d, want %d", resp.Topics[i].Topic, resp.Topics[i].ErrorCode, want)
		}
	}
	if store.Topic("t").NumPartitions() != 5 || store.Topic("u").NumPartitions() != 1 {
		t.Fatalf("after assignments: t=%d u=%d", store.Topic("t").NumPartitions(), store.Topic("u").NumPartitions())
	}
}

func TestAdminDeleteTopics(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t)
	store := e.s.deps.Store
	first := e.create(t, "t", 2, nil)

	r, err := e.adm.DeleteTopic(e.ctx, "t")
	if err != nil || r.Err != nil {
		t.Fatalf("delete: %v %+v", err, r)
	}
	if store.Topic("t") != nil {
		t.Fatal("topic still in storage after delete")
	}
	r, _ = e.adm.DeleteTopic(e.ctx, "t")
	expectErr(t, "delete again", r.Err, kerr.UnknownTopicOrPartition)

	second := e.create(t, "t", 1, nil)
	if second.ID == first.ID {
		t.Fatal("recreated topic reuses the old topic ID")
	}

	// v6 by ID.
	req := kmsg.NewPtrDeleteTopicsRequest()
	req.TimeoutMillis = 5000
	byID := kmsg.NewDeleteTopicsRequestTopic()
	byID.TopicID = second.ID
	unknownID := kmsg.NewDeleteTopicsRequestTopic()
	unknownID.TopicID = first.ID
	neither := kmsg.NewDeleteTopicsRequestTopic()
	req.Topics = []kmsg.DeleteTopicsRequestTopic{byID, unknownID, neither}
	resp := e.request(t, req).(*kmsg.DeleteTopicsResponse)
	if resp.Topics[0].ErrorCode != 0 || resp.Topics[0].Topic == nil || *resp.Topics[0].Topic != "t" {
		t.Errorf("delete by ID: %+v", resp.Topics[0])
	}
	if resp.Topics[1].ErrorCode != kerr.UnknownTopicID.Code {
		t.Errorf("delete unknown ID: %+v", resp.Topics[1])
	}
	if resp.Topics[2].ErrorCode != kerr.InvalidRequest.Code {
		t.Errorf("delete with neither name nor ID: %+v", resp.Topics[2])
	}
	if store.Topic("t") != nil {
		t.Fatal("topic deleted by ID still in storage")
	}
}

func TestAdminDeleteTopicsDisabled(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, func(c *configs.Config) { c.DeleteTopicEnable = false })
	e.create(t, "keep", 1, nil)
	_, err := e.adm.DeleteTopic(e.ctx, "keep")
	expectErr(t, "disabled", err, kerr.TopicDeletionDisabled)
	if e.s.deps.Store.Topic("keep") == nil {
		t.Fatal("topic deleted although delete.topic.enable=false")
	}
}

func TestAdminDescribeCluster(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, func(c *configs.Config) { c.BrokerID = 3 })
	for _, v := range []int16{0, 1, 2} {
		req := kmsg.NewPtrDescribeClusterRequest()
		req.Version = v
		req.IncludeClusterAuthorizedOperations = v == 1
		resp := e.rawRequest(t, req).(*kmsg.DescribeClusterResponse)
		if resp.ErrorCode != 0 || resp.ClusterID != e.s.clusterID || len(resp.ClusterID) != 22 || resp.ControllerID != 3 || len(resp.Brokers) != 1 {
			t.Fatalf("v%d: %+v", v, resp)
		}
		b := resp.Brokers[0]
		host, port := e.s.advertised("PLAINTEXT")
		if b.NodeID != 3 || b.Host != host || b.Port != port || b.Rack != nil {
			t.Fatalf("v%d broker: %+v", v, b)
		}
		switch {
		case v == 1 && resp.ClusterAuthorizedOperations&(1<<8) == 0:
			t.Errorf("v1 authorized operations lack DESCRIBE: %b", resp.ClusterAuthorizedOperations)
		case v != 1 && resp.ClusterAuthorizedOperations != authorizedOpsNotRequested:
			t.Errorf("v%d authorized operations: %d", v, resp.ClusterAuthorizedOperations)
		}
	}
	req := kmsg.NewPtrDescribeClusterRequest()
	req.Version = 1
	req.EndpointType = 9
	if resp := e.rawRequest(t, req).(*kmsg.DescribeClusterResponse); resp.ErrorCode != kerr.UnsupportedEndpointType.Code {
		t.Errorf("endpoint type 9: %+v", resp)
	}
}

// TestAdminEveryVersion drives each admin API at every version we advertise, so a field that only
// exists in some versions cannot break the encoding of the others.
func TestAdminEveryVersion(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t)
	store := e.s.deps.Store
	for v := int16(2); v <= 7; v++ {
		name := fmt.Sprintf("v%d", v)
		req := kmsg.NewPtrCreateTopicsRequest()
		req.Version, req.TimeoutMillis = v, 5000
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, 2, 1
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = "retention.ms", kmsg.StringPtr("1000")
		rt.Configs = append(rt.Configs, c)
		bad := kmsg.NewCreateTopicsRequestTopic()
		bad.Topic, bad.NumPartitions, bad.ReplicationFactor = name+"-rf", 1, 2
		req.Topics = []kmsg.CreateTopicsRequestTopic{rt, bad}
		resp := e.rawRequest(t, req).(*kmsg.CreateTopicsResponse)
		if len(resp.Topics) != 2 || resp.Topics[0].ErrorCode != 0 || resp.Topics[1].ErrorCode != kerr.InvalidReplicationFactor.Code {
			t.Fatalf("CreateTopics v%d: %+v", v, resp)
		}
		if v >= 5 && (resp.Topics[0].NumPartitions != 2 || len(resp.Topics[0].Configs) == 0) {
			t.Fatalf("CreateTopics v%d lacks the v5 fields: %+v", v, resp.Topics[0])
		}
		if store.Topic(name) == nil {
			t.Fatalf("CreateTopics v%d did not create %s", v, name)
		}
	}
	for v := int16(1); v <= 4; v++ {
		req := kmsg.NewPtrDescribeConfigsRequest()
		req.Version, req.IncludeSynonyms = v, true
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, "v5"
		req.Resources = append(req.Resources, r)
		resp := e.rawRequest(t, req).(*kmsg.DescribeConfigsResponse)
		if len(resp.Resources) != 1 || resp.Resources[0].ErrorCode != 0 || len(resp.Resources[0].Configs) == 0 {
			t.Fatalf("DescribeConfigs v%d: %+v", v, resp)
		}
	}
	for v := int16(0); v <= 1; v++ {
		req := kmsg.NewPtrIncrementalAlterConfigsRequest()
		req.Version = v
		r := kmsg.NewIncrementalAlterConfigsRequestResource()
		r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, "v5"
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Op, c.Value = "segment.ms", kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(fmt.Sprint(1000+v))
		r.Configs = append(r.Configs, c)
		req.Resources = append(req.Resources, r)
		resp := e.rawRequest(t, req).(*kmsg.IncrementalAlterConfigsResponse)
		if len(resp.Resources) != 1 || resp.Resources[0].ErrorCode != 0 {
			t.Fatalf("IncrementalAlterConfigs v%d: %+v", v, resp)
		}
	}
	for v := int16(0); v <= 2; v++ {
		req := kmsg.NewPtrAlterConfigsRequest()
		req.Version = v
		r := kmsg.NewAlterConfigsRequestResource()
		r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, "missing"
		req.Resources = append(req.Resources, r)
		resp := e.rawRequest(t, req).(*kmsg.AlterConfigsResponse)
		if len(resp.Resources) != 1 || resp.Resources[0].ErrorCode != kerr.UnknownTopicOrPartition.Code {
			t.Fatalf("AlterConfigs v%d: %+v", v, resp)
		}
	}
	for v := int16(0); v <= 3; v++ {
		req := kmsg.NewPtrCreatePartitionsRequest()
		req.Version, req.TimeoutMillis = v, 5000
		rt := kmsg.NewCreatePartitionsRequestTopic()
		rt.Topic, rt.Count = "v2", int32(3+v)
		req.Topics = append(req.Topics, rt)
		resp := e.rawRequest(t, req).(*kmsg.CreatePartitionsResponse)
		if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
			t.Fatalf("CreatePartitions v%d: %+v", v, resp)
		}
	}
	for v := int16(1); v <= 6; v++ {
		name := fmt.Sprintf("v%d", v+1) // v2..v7 were created above
		req := kmsg.NewPtrDeleteTopicsRequest()
		req.Version, req.TimeoutMillis = v, 5000
		if v < 6 {
			req.TopicNames = []string{name}
		} else {
			dt := kmsg.NewDeleteTopicsRequestTopic()
			dt.Topic = kmsg.StringPtr(name)
			req.Topics = append(req.Topics, dt)
		}
		resp := e.rawRequest(t, req).(*kmsg.DeleteTopicsResponse)
		if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 || store.Topic(name) != nil {
			t.Fatalf("DeleteTopics v%d: %+v", v, resp)
		}
	}
}

// TestDescribeTopicEntriesSources checks the source and synonym rules without a broker: an
// override is DYNAMIC_TOPIC_CONFIG, a broker-level default that differs from Kafka's is
// STATIC_BROKER_CONFIG, anything else DEFAULT_CONFIG.
func TestDescribeTopicEntriesSources(t *testing.T) {
	defaults := storage.DefaultTopicConfig()
	defaults.RetentionMs = 3600000
	eff := defaults
	eff.SegmentBytes = 4096
	got := map[string]cfgEntry{}
	for _, e := range describeTopicEntries(eff, map[string]string{"segment.bytes": "4096"}, defaults) {
		got[e.name] = e
	}
	f := func(name, value string, source kmsg.ConfigSource, synonyms ...string) {
		t.Helper()
		e := got[name]
		if e.value != value || e.source != source || e.readOnly {
			t.Fatalf("%s: %+v, want value %s source %v", name, e, value, source)
		}
		var syn []string
		for _, s := range e.synonyms {
			syn = append(syn, fmt.Sprintf("%d:%s=%s", s.source, s.name, s.value))
		}
		if strings.Join(syn, " ") != strings.Join(synonyms, " ") {
			t.Fatalf("%s synonyms: %v, want %v", name, syn, synonyms)
		}
	}
	f("retention.ms", "3600000", kmsg.ConfigSourceStaticBrokerConfig,
		"4:log.retention.ms=3600000", "5:log.retention.ms=604800000")
	f("segment.bytes", "4096", kmsg.ConfigSourceDynamicTopicConfig,
		"1:segment.bytes=4096", "5:log.segment.bytes=1073741824")
	f("cleanup.policy", "delete", kmsg.ConfigSourceDefaultConfig, "5:log.cleanup.policy=delete")
	if got["cleanup.policy"].typ != kmsg.ConfigTypeList || got["retention.ms"].typ != kmsg.ConfigTypeLong {
		t.Fatalf("types: %v %v", got["cleanup.policy"].typ, got["retention.ms"].typ)
	}
}

func TestEditList(t *testing.T) {
	f := func(cur, v string, add bool, want string) {
		t.Helper()
		if got := editList(cur, v, add); got != want {
			t.Fatalf("editList(%q, %q, %v) = %q, want %q", cur, v, add, got, want)
		}
	}
	f("delete", "compact", true, "delete,compact")
	f("delete", "delete", true, "delete")
	f("delete, compact", "compact", false, "delete")
	f("delete", "delete", false, "")
	f("", " a ,b,,a", true, "a,b")
	f("a,b,c", "b,x", false, "a,c")
}
