package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/coord/acl"
)

// bigBatch is a v2 batch of one record with a value of n bytes, no producer id.
func bigBatch(n int) []byte {
	var body []byte
	body = append(body, 0)
	body = binary.AppendVarint(body, 0)
	body = binary.AppendVarint(body, 0)
	body = binary.AppendVarint(body, -1)
	body = binary.AppendVarint(body, int64(n))
	body = append(body, bytes.Repeat([]byte{'q'}, n)...)
	body = binary.AppendVarint(body, 0)
	recs := binary.AppendVarint(nil, int64(len(body)))
	recs = append(recs, body...)
	now := time.Now().UnixMilli()
	rb := kmsg.RecordBatch{PartitionLeaderEpoch: -1, Magic: 2, FirstTimestamp: now, MaxTimestamp: now,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: 1, Records: recs}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func setQuota(t *testing.T, adm *kadm.Client, typ, name, key string, v float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var np *string
	if name != "" {
		np = &name
	}
	r, err := adm.AlterClientQuotas(ctx, []kadm.AlterClientQuotaEntry{{
		Entity: kadm.ClientQuotaEntity{{Type: typ, Name: np}},
		Ops:    []kadm.AlterClientQuotaOp{{Key: key, Value: v}},
	}})
	if err != nil || len(r) != 1 || r[0].Err != nil {
		t.Fatalf("AlterClientQuotas %s=%s %s=%v: %+v %v", typ, name, key, v, r, err)
	}
}

func quotaProduce(t *testing.T, rc *rawConn, topic string, batch []byte) *kmsg.ProduceResponse {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 9, -1, 5000
	req.Topics = []kmsg.ProduceRequestTopic{{Topic: topic, Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: batch}}}}
	r := fxRoundTrip[*kmsg.ProduceResponse](t, rc, req)
	if c := r.Topics[0].Partitions[0].ErrorCode; c != 0 {
		t.Fatalf("produce: %v", kerr.ErrorForCode(c))
	}
	return r
}

// A user over producer_byte_rate gets throttle_time_ms at once and its connection's next
// request waits that long (KIP-219 muting); another user is not throttled; the per-entity
// series shows the throttle.
func TestQuotaProduceThrottlesAndMutesConnection(t *testing.T) {
	who := &principals{}
	tb := startTestBroker(t, testConfig(t), BrokerOptions{PrincipalFor: who.of})
	t.Cleanup(func() { tb.stop(t) })
	addr := tb.srv.Addr().String()
	if _, err := tb.store.CreateTopic("q", 1, nil); err != nil {
		t.Fatal(err)
	}
	setQuota(t, kadm.NewClient(fxClient(t, addr)), "user", "slow", "producer_byte_rate", 10000)
	// 110 kB against 10 kB/s over the 10 s minimum span: rate 11 kB/s, throttle ≈ 1 s.
	batch := bigBatch(110_000)
	slow, fast := who.raw(t, addr, "User:slow"), who.raw(t, addr, "User:fast")
	if r := quotaProduce(t, fast, "q", batch); r.ThrottleMillis != 0 {
		t.Fatalf("unquoted user throttled %d ms", r.ThrottleMillis)
	}
	r := quotaProduce(t, slow, "q", batch)
	if r.ThrottleMillis < 800 || r.ThrottleMillis > 1500 {
		t.Fatalf("throttle_time_ms %d, want about 1000", r.ThrottleMillis)
	}
	start := time.Now()
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 9
	fxRoundTrip[*kmsg.MetadataResponse](t, slow, md)
	if waited := time.Since(start); waited < time.Duration(r.ThrottleMillis)*time.Millisecond/2 {
		t.Fatalf("next request on the muted connection answered after %v (throttle %d ms)", waited, r.ThrottleMillis)
	}
	var buf bytes.Buffer
	metrics.WritePrometheus(&buf, false)
	if !strings.Contains(buf.String(), `kaas_quota_throttle_ms_total{kind="produce",user="slow",client_id=""}`) {
		t.Fatalf("no per-entity throttle series in /metrics")
	}
}

// consumer_byte_rate throttles the Fetch responses of a client-id (the raw connections send
// client id "test"); request_percentage throttles any request.
func TestQuotaFetchAndRequestPercentage(t *testing.T) {
	who := &principals{}
	tb := startTestBroker(t, testConfig(t), BrokerOptions{PrincipalFor: who.of})
	t.Cleanup(func() { tb.stop(t) })
	addr := tb.srv.Addr().String()
	if _, err := tb.store.CreateTopic("f", 1, nil); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(fxClient(t, addr))
	quotaProduce(t, who.raw(t, addr, "User:writer"), "f", bigBatch(110_000))
	setQuota(t, adm, "client-id", "test", "consumer_byte_rate", 10000)
	setQuota(t, adm, "user", "busy", "request_percentage", 0.000001)

	fr := kmsg.NewPtrFetchRequest()
	fr.Version, fr.MaxWaitMillis, fr.MaxBytes, fr.ReplicaID, fr.SessionEpoch = 11, 100, 1<<20, -1, -1
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = 0, 0, 1<<20
	fr.Topics = []kmsg.FetchRequestTopic{{Topic: "f", Partitions: []kmsg.FetchRequestTopicPartition{fp}}}
	r := fxRoundTrip[*kmsg.FetchResponse](t, who.raw(t, addr, "User:reader"), fr)
	if len(r.Topics) != 1 || len(r.Topics[0].Partitions[0].RecordBatches) < 110_000 {
		t.Fatalf("fetch returned no data: %+v", r.Topics)
	}
	if r.ThrottleMillis < 800 || r.ThrottleMillis > 1500 {
		t.Fatalf("fetch throttle_time_ms %d, want about 1000", r.ThrottleMillis)
	}
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 9
	if r := fxRoundTrip[*kmsg.MetadataResponse](t, who.raw(t, addr, "User:busy"), md); r.ThrottleMillis <= 0 {
		t.Fatalf("request_percentage: throttle_time_ms %d", r.ThrottleMillis)
	}
}

// AlterClientQuotas / DescribeClientQuotas round trip, validation, authorization and durability.
func TestQuotaAdminRoundTripSurvivesRestart(t *testing.T) {
	cfg := testConfig(t)
	ab := startACLBroker(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(ab.who.client(t, ab.addr, superUser))
	setQuota(t, adm, "user", "alice", "producer_byte_rate", 1048576)
	setQuota(t, adm, "user", "", "consumer_byte_rate", 2097152)
	setQuota(t, adm, "client-id", "app", "request_percentage", 25)
	bad, err := adm.AlterClientQuotas(ctx, []kadm.AlterClientQuotaEntry{
		{Entity: kadm.ClientQuotaEntity{{Type: "user", Name: kmsg.StringPtr("x")}}, Ops: []kadm.AlterClientQuotaOp{{Key: "producer_byte_rate", Value: 1.5}}},
		{Entity: kadm.ClientQuotaEntity{{Type: "ip", Name: kmsg.StringPtr("1.2.3.4")}}, Ops: []kadm.AlterClientQuotaOp{{Key: "connection_creation_rate", Value: 1}}},
		{Entity: kadm.ClientQuotaEntity{{Type: "user", Name: kmsg.StringPtr("x")}}, Ops: []kadm.AlterClientQuotaOp{{Key: "bogus", Value: 1}}},
	})
	if err != nil || len(bad) != 3 {
		t.Fatalf("bad alters: %+v %v", bad, err)
	}
	for _, b := range bad {
		if code(b.Err) != kerr.InvalidRequest.Code {
			t.Errorf("%v: %v, want INVALID_REQUEST", b.Entity, b.Err)
		}
	}
	// Without ALTER_CONFIGS / DESCRIBE_CONFIGS on the cluster: 31.
	nobody := kadm.NewClient(ab.who.client(t, ab.addr, "User:nobody"))
	if r, err := nobody.AlterClientQuotas(ctx, []kadm.AlterClientQuotaEntry{{Entity: kadm.ClientQuotaEntity{{Type: "user"}},
		Ops: []kadm.AlterClientQuotaOp{{Key: "producer_byte_rate", Value: 1}}}}); err != nil || code(r[0].Err) != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("unauthorized alter: %+v %v", r, err)
	}
	if _, err := nobody.DescribeClientQuotas(ctx, false, nil); code(err) != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("unauthorized describe: %v", err)
	}
	ab.grant(t, allow(acl.ResourceCluster, acl.ClusterName, "User:nobody", acl.OpDescribeConfigs))

	ab.stop(t)
	ab = startACLBroker(t, cfg)
	t.Cleanup(func() { ab.stop(t) })
	adm = kadm.NewClient(ab.who.client(t, ab.addr, "User:nobody"))
	all, err := adm.DescribeClientQuotas(ctx, false, nil)
	if err != nil || len(all) != 3 {
		t.Fatalf("describe all after restart: %+v %v", all, err)
	}
	def, err := adm.DescribeClientQuotas(ctx, true, []kadm.DescribeClientQuotaComponent{{Type: "user", MatchType: 1}})
	if err != nil || len(def) != 1 || def[0].Entity[0].Name != nil || def[0].Values[0].Key != "consumer_byte_rate" || def[0].Values[0].Value != 2097152 {
		t.Fatalf("describe the user default: %+v %v", def, err)
	}
	ex, err := adm.DescribeClientQuotas(ctx, true, []kadm.DescribeClientQuotaComponent{{Type: "client-id", MatchType: 0, MatchName: kmsg.StringPtr("app")}})
	if err != nil || len(ex) != 1 || ex[0].Values[0].Value != 25 {
		t.Fatalf("describe client-id app: %+v %v", ex, err)
	}
}
