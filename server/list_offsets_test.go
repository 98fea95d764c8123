package server

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

// fxOffsetsFixture is a one-partition topic "lo" holding three records whose timestamps are
// base, base+30s, base+20s (so the max timestamp is at offset 1, not at the end).
func fxOffsetsFixture(t *testing.T) (addr string, base time.Time) {
	t.Helper()
	addr, _ = newTestBroker(t)
	cl := fxClient(t, addr)
	fxCreateTopic(t, cl, "lo", 1)
	base = time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	fxProduceEach(t, cl,
		&kgo.Record{Topic: "lo", Value: []byte("0"), Timestamp: base},
		&kgo.Record{Topic: "lo", Value: []byte("1"), Timestamp: base.Add(30 * time.Second)},
		&kgo.Record{Topic: "lo", Value: []byte("2"), Timestamp: base.Add(20 * time.Second)},
	)
	return addr, base
}

func TestListOffsetsKadm(t *testing.T) {
	addr, base := fxOffsetsFixture(t)
	adm := kadm.NewClient(fxClient(t, addr))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	one := func(lo kadm.ListedOffsets, err error) kadm.ListedOffset {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		o, ok := lo.Lookup("lo", 0)
		if !ok || o.Err != nil {
			t.Fatalf("lo/0: %+v ok=%v", o, ok)
		}
		return o
	}
	if o := one(adm.ListStartOffsets(ctx, "lo")); o.Offset != 0 || o.LeaderEpoch != 0 {
		t.Fatalf("start: %+v", o)
	}
	if o := one(adm.ListEndOffsets(ctx, "lo")); o.Offset != 3 || o.LeaderEpoch != 0 {
		t.Fatalf("end: %+v", o)
	}
	if o := one(adm.ListCommittedOffsets(ctx, "lo")); o.Offset != 3 {
		t.Fatalf("read_committed end (LSO): %+v", o)
	}
	if o := one(adm.ListOffsetsAfterMilli(ctx, base.Add(5*time.Second).UnixMilli(), "lo")); o.Offset != 1 || o.Timestamp != base.Add(30*time.Second).UnixMilli() {
		t.Fatalf("after base+5s: %+v", o)
	}
	if o := one(adm.ListOffsetsAfterMilli(ctx, base.UnixMilli(), "lo")); o.Offset != 0 || o.Timestamp != base.UnixMilli() {
		t.Fatalf("after base: %+v", o)
	}
	if o := one(adm.ListMaxTimestampOffsets(ctx, "lo")); o.Offset != 1 || o.Timestamp != base.Add(30*time.Second).UnixMilli() {
		t.Fatalf("max timestamp: %+v", o)
	}
}

func TestListOffsetsRaw(t *testing.T) {
	addr, base := fxOffsetsFixture(t)
	rc := dialRaw(t, addr)

	list := func(version int16, iso int8, build func(*kmsg.ListOffsetsRequest)) *kmsg.ListOffsetsResponse {
		req := kmsg.NewPtrListOffsetsRequest()
		req.Version, req.IsolationLevel = version, iso
		build(req)
		return fxRoundTrip[*kmsg.ListOffsetsResponse](t, rc, req)
	}
	part := func(topic string, p int32, ts int64, epoch int32) func(*kmsg.ListOffsetsRequest) {
		return func(r *kmsg.ListOffsetsRequest) {
			rt := kmsg.NewListOffsetsRequestTopic()
			rt.Topic = topic
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch = p, ts, epoch
			rt.Partitions = append(rt.Partitions, rp)
			r.Topics = append(r.Topics, rt)
		}
	}
	type want struct {
		code      int16
		offset    int64
		timestamp int64
		epoch     int32
	}
	for _, c := range []struct {
		name    string
		version int16
		iso     int8
		build   func(*kmsg.ListOffsetsRequest)
		want    want
	}{
		{"earliest v1", 1, 0, part("lo", 0, -2, -1), want{0, 0, -1, -1}}, // v1 has no epoch field
		{"latest v4", 4, 0, part("lo", 0, -1, -1), want{0, 3, -1, 0}},
		{"latest committed v5", 5, 1, part("lo", 0, -1, 0), want{0, 3, -1, 0}},
		{"by time v6", 6, 0, part("lo", 0, base.Add(25*time.Second).UnixMilli(), -1), want{0, 1, base.Add(30 * time.Second).UnixMilli(), 0}},
		{"future time", 10, 0, part("lo", 0, time.Now().Add(time.Hour).UnixMilli(), -1), want{0, -1, -1, -1}},
		{"max timestamp v7", 7, 0, part("lo", 0, -3, -1), want{0, 1, base.Add(30 * time.Second).UnixMilli(), 0}},
		{"earliest local v8", 8, 0, part("lo", 0, -4, -1), want{0, 0, -1, 0}},
		{"latest tiered v9", 9, 0, part("lo", 0, -5, -1), want{0, -1, -1, -1}},
		{"future leader epoch", 10, 0, part("lo", 0, -1, 1), want{codec.CodeUnknownLeaderEpoch, -1, -1, -1}},
		{"fenced leader epoch", 10, 0, part("lo", 0, -1, -2), want{codec.CodeFencedLeaderEpoch, -1, -1, -1}},
		{"unknown topic", 10, 0, part("nope", 0, -1, -1), want{codec.CodeUnknownTopicOrPartition, -1, -1, -1}},
		{"unknown partition", 10, 0, part("lo", 5, -1, -1), want{codec.CodeUnknownTopicOrPartition, -1, -1, -1}},
	} {
		resp := list(c.version, c.iso, c.build)
		p := resp.Topics[0].Partitions[0]
		got := want{p.ErrorCode, p.Offset, p.Timestamp, p.LeaderEpoch}
		if got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}

	// The same partition twice: INVALID_REQUEST for both.
	resp := list(10, 0, func(r *kmsg.ListOffsetsRequest) {
		part("lo", 0, -1, -1)(r)
		part("lo", 0, -2, -1)(r)
	})
	for _, rt := range resp.Topics {
		if rt.Partitions[0].ErrorCode != codec.CodeInvalidRequest {
			t.Errorf("duplicate partition: got %d", rt.Partitions[0].ErrorCode)
		}
	}
}

func TestOffsetForLeaderEpoch(t *testing.T) {
	addr, _ := fxOffsetsFixture(t)
	rc := dialRaw(t, addr)
	type want struct {
		code   int16
		epoch  int32
		offset int64
	}
	for _, c := range []struct {
		name           string
		version        int16
		topic          string
		partition      int32
		current, epoch int32
		want           want
	}{
		{"epoch 0 → log end", 2, "lo", 0, -1, 0, want{0, 0, 3}},
		{"epoch 0 with current check v4", 4, "lo", 0, 0, 0, want{0, 0, 3}},
		{"epoch beyond the latest", 3, "lo", 0, 0, 4, want{0, -1, -1}},
		{"undefined epoch", 4, "lo", 0, -1, -1, want{0, -1, -1}},
		{"future current epoch", 4, "lo", 0, 2, 0, want{codec.CodeUnknownLeaderEpoch, -1, -1}},
		{"unknown topic", 4, "nope", 0, -1, 0, want{codec.CodeUnknownTopicOrPartition, -1, -1}},
		{"unknown partition", 4, "lo", 3, -1, 0, want{codec.CodeUnknownTopicOrPartition, -1, -1}},
	} {
		req := kmsg.NewPtrOffsetForLeaderEpochRequest()
		req.Version = c.version
		req.ReplicaID = -1
		rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
		rt.Topic = c.topic
		rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
		rp.Partition, rp.CurrentLeaderEpoch, rp.LeaderEpoch = c.partition, c.current, c.epoch
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp := fxRoundTrip[*kmsg.OffsetForLeaderEpochResponse](t, rc, req)
		p := resp.Topics[0].Partitions[0]
		if got := (want{p.ErrorCode, p.LeaderEpoch, p.EndOffset}); got != c.want || p.Partition != c.partition {
			t.Errorf("%s: got %+v (partition %d), want %+v", c.name, got, p.Partition, c.want)
		}
	}
}
