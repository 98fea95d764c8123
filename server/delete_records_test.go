package server

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/coord/acl"
)

func drCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// drOne deletes records of one partition with kadm and returns its answer.
func drOne(t *testing.T, adm *kadm.Client, topic string, p int32, at int64) kadm.DeleteRecordsResponse {
	t.Helper()
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: topic, Partition: p, At: at})
	rs, err := adm.DeleteRecords(drCtx(t), os)
	if err != nil {
		t.Fatalf("DeleteRecords %s/%d at %d: %v", topic, p, at, err)
	}
	r, ok := rs.Lookup(topic, p)
	if !ok {
		t.Fatalf("DeleteRecords %s/%d: no answer", topic, p)
	}
	return r
}

func drStart(t *testing.T, adm *kadm.Client, topic string, p int32) int64 {
	t.Helper()
	los, err := adm.ListStartOffsets(drCtx(t), topic)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := los.Lookup(topic, p)
	if !ok || o.Err != nil {
		t.Fatalf("ListStartOffsets %s/%d: %+v", topic, p, o)
	}
	return o.Offset
}

func TestDeleteRecordsMovesLogStartDurably(t *testing.T) {
	cfg := testConfig(t)
	tb := startTestBroker(t, cfg)
	addr := tb.srv.Addr().String()
	cl := fxClient(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	fxCreateTopic(t, cl, "dr", 2)
	for i := 0; i < 10; i++ {
		fxProduceEach(t, cl, &kgo.Record{Topic: "dr", Partition: 0, Value: []byte(strconv.Itoa(i))})
	}
	for i := 0; i < 3; i++ {
		fxProduceEach(t, cl, &kgo.Record{Topic: "dr", Partition: 1, Value: []byte("x")})
	}
	adm := kadm.NewClient(cl)
	if r := drOne(t, adm, "dr", 0, 4); r.Err != nil || r.LowWatermark != 4 {
		t.Fatalf("DeleteRecords dr/0 at 4: %+v", r)
	}
	if r := drOne(t, adm, "dr", 1, -1); r.Err != nil || r.LowWatermark != 3 {
		t.Fatalf("DeleteRecords dr/1 at -1 (the HWM): %+v", r)
	}
	if r := drOne(t, adm, "dr", 0, 11); !errorsIs(r.Err, kerr.OffsetOutOfRange) {
		t.Fatalf("DeleteRecords above the HWM: %+v", r)
	}
	if r := drOne(t, adm, "dr", 0, 2); r.Err != nil || r.LowWatermark != 4 {
		t.Fatalf("DeleteRecords below the start: %+v", r)
	}
	if got := drStart(t, adm, "dr", 0); got != 4 {
		t.Fatalf("ListOffsets EARLIEST %d, want 4", got)
	}

	// Raw: unknown partition, internal topic, fetch below the start.
	rc := dialRaw(t, addr)
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.Version = 2
	mk := func(topic string, ps ...int32) kmsg.DeleteRecordsRequestTopic {
		rt := kmsg.NewDeleteRecordsRequestTopic()
		rt.Topic = topic
		for _, p := range ps {
			rp := kmsg.NewDeleteRecordsRequestTopicPartition()
			rp.Partition, rp.Offset = p, 0
			rt.Partitions = append(rt.Partitions, rp)
		}
		return rt
	}
	req.Topics = []kmsg.DeleteRecordsRequestTopic{mk("dr", 7), mk("__consumer_offsets", 0), mk("nope", 0)}
	resp := fxRoundTrip[*kmsg.DeleteRecordsResponse](t, rc, req)
	for i, want := range []int16{kerr.UnknownTopicOrPartition.Code, kerr.InvalidTopicException.Code, kerr.UnknownTopicOrPartition.Code} {
		if got := resp.Topics[i].Partitions[0]; got.ErrorCode != want || got.LowWatermark != -1 {
			t.Errorf("%s: code %d low watermark %d, want %d and -1", resp.Topics[i].Topic, got.ErrorCode, got.LowWatermark, want)
		}
	}
	fr := fxFetchReq(11, 0, 0, 1<<20)
	fxAddPart(fr, "dr", [16]byte{}, 0, 3, 1<<20)
	if p := fxParts(fxRoundTrip[*kmsg.FetchResponse](t, rc, fr))["dr/0"]; p.ErrorCode != kerr.OffsetOutOfRange.Code || p.LogStartOffset != 4 {
		t.Fatalf("fetch below the log start: code %d log start %d", p.ErrorCode, p.LogStartOffset)
	}

	// The new start survives a restart.
	tb.stop(t)
	tb = startTestBroker(t, cfg)
	t.Cleanup(func() { tb.stop(t) })
	adm = kadm.NewClient(fxClient(t, tb.srv.Addr().String()))
	if got := drStart(t, adm, "dr", 0); got != 4 {
		t.Fatalf("after restart ListOffsets EARLIEST %d, want 4", got)
	}
	if got := drStart(t, adm, "dr", 1); got != 3 {
		t.Fatalf("after restart dr/1 starts at %d, want 3", got)
	}
}

func errorsIs(err error, ke *kerr.Error) bool { return code(err) == ke.Code }

// TestDeleteRecordsNeedsDeleteOnTopic: DESCRIBE alone gives TOPIC_AUTHORIZATION_FAILED and moves
// nothing; DELETE on the topic is enough.
func TestDeleteRecordsNeedsDeleteOnTopic(t *testing.T) {
	ab := startACLBroker(t, testConfig(t))
	t.Cleanup(func() { ab.stop(t) })
	if _, err := ab.store.CreateTopic("t", 1, nil); err != nil {
		t.Fatal(err)
	}
	su := ab.who.client(t, ab.addr, superUser, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := 0; i < 5; i++ {
		fxProduceEach(t, su, &kgo.Record{Topic: "t", Value: []byte("v")})
	}
	const p = "User:purger"
	ab.grant(t, allow(acl.ResourceTopic, "t", p, acl.OpDescribe))
	adm := kadm.NewClient(ab.who.client(t, ab.addr, p))
	if r := drOne(t, adm, "t", 0, 3); !errorsIs(r.Err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("without DELETE: %+v", r)
	}
	if got := ab.store.Topic("t").Partition(0).LogStartOffset(); got != 0 {
		t.Fatalf("refused request moved the log start to %d", got)
	}
	ab.grant(t, allow(acl.ResourceTopic, "t", p, acl.OpDelete))
	if r := drOne(t, adm, "t", 0, 3); r.Err != nil || r.LowWatermark != 3 {
		t.Fatalf("with DELETE: %+v", r)
	}
}

// TestDeleteRecordsReadCommittedAcrossTransactions: a start moved into an aborted transaction
// and into a still-open one leaves read_committed consumers with exactly the committed records
// at or above it.
func TestDeleteRecordsReadCommittedAcrossTransactions(t *testing.T) {
	addr, srv := newTestBroker(t)
	txnTopic(t, addr, "drx", 1)
	cl := txnProducer(t, addr, "drx-producer")
	txnRun(t, cl, "drx", 0, true, "a1", "a2")  // 0-1, commit 2
	txnRun(t, cl, "drx", 0, false, "b1", "b2") // 3-4, abort 5
	txnRun(t, cl, "drx", 0, true, "c1")        // 6, commit 7
	adm := kadm.NewClient(fxClient(t, addr))
	if r := drOne(t, adm, "drx", 0, 4); r.Err != nil || r.LowWatermark != 4 {
		t.Fatalf("DeleteRecords into the aborted transaction: %+v", r)
	}

	// An open transaction d1 (8), d2 (9); the start moves past its first record.
	ctx := txnCtx(t)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"d1", "d2"} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "drx", Partition: 0, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	p := srv.deps.Store.Topic("drx").Partition(0)
	if p.LastStableOffset() != 8 {
		t.Fatalf("LSO %d with the transaction open, want 8", p.LastStableOffset())
	}
	if r := drOne(t, adm, "drx", 0, 9); r.Err != nil || r.LowWatermark != 9 {
		t.Fatalf("DeleteRecords into the open transaction: %+v", r)
	}
	if p.LastStableOffset() != 9 {
		t.Fatalf("LSO %d after the start passed the open transaction's first offset, want the log start 9", p.LastStableOffset())
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	sentinel(t, addr, "drx", 1)
	got := consumeUntilEnd(t, addr, "drx", 1, true)
	equalParts(t, "read_committed after DeleteRecords", got, map[int32][]string{0: {"d2"}})
	if s := fmt.Sprint(consumeUntilEnd(t, addr, "drx", 1, false)[0]); s != "[d2]" {
		t.Fatalf("read_uncommitted after DeleteRecords: %s", s)
	}
}
