package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
)

var kgoCodecs = []struct {
	name string
	c    kgo.CompressionCodec
	id   int
}{
	{"none", kgo.NoCompression(), codec.CompressionNone},
	{"gzip", kgo.GzipCompression(), codec.CompressionGzip},
	{"snappy", kgo.SnappyCompression(), codec.CompressionSnappy},
	{"lz4", kgo.Lz4Compression(), codec.CompressionLZ4},
	{"zstd", kgo.ZstdCompression(), codec.CompressionZstd},
}

// storedCodecs reads every batch of topic/0 from storage and returns their codecs.
func storedCodecs(t *testing.T, s *Server, topic string) map[int]int {
	t.Helper()
	p := s.deps.Store.Topic(topic).Partition(0)
	out := map[int]int{}
	for off := int64(0); off < p.HighWatermark(); {
		buf, code := p.Read(nil, off, 1<<20, p.HighWatermark())
		if code != codec.CodeNone || len(buf) == 0 {
			t.Fatalf("read %s at %d: code %d", topic, off, code)
		}
		for len(buf) > 0 {
			b, ok, _ := codec.FrameBatch(buf)
			if !ok {
				break
			}
			if !b.CRCValid() {
				t.Fatalf("%s: stored batch at %d has a bad CRC", topic, b.BaseOffset())
			}
			out[b.Compression()]++
			off = b.LastOffset() + 1
			buf = buf[len(b):]
		}
	}
	return out
}

// TestCompressedProduceIntoProducerAndZstdTopics produces with every franz-go codec into a
// compression.type=producer topic (batches stored as produced) and a compression.type=zstd topic
// (every batch recompressed to zstd unless it already is), and reads back the same records,
// headers and offsets from both.
func TestCompressedProduceIntoProducerAndZstdTopics(t *testing.T) {
	addr, s := newTestBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics := map[string]map[string]*string{
		"c-producer": {"compression.type": kadm.StringPtr("producer")},
		"c-zstd":     {"compression.type": kadm.StringPtr("zstd"), "compression.zstd.level": kadm.StringPtr("9")},
	}
	for name, cfg := range topics {
		if _, err := adm.CreateTopic(ctx, 1, 1, cfg, name); err != nil {
			t.Fatal(err)
		}
	}
	const perCodec = 300
	var want []string
	for _, kc := range kgoCodecs {
		p, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerBatchCompression(kc.c), kgo.ProducerLinger(5*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var recs []*kgo.Record
		for topic := range topics {
			for i := 0; i < perCodec; i++ {
				recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("%s-%d", kc.name, i)),
					Value:   bytes.Repeat([]byte(kc.name), 10+i%7),
					Headers: []kgo.RecordHeader{{Key: "codec", Value: []byte(kc.name)}}})
			}
		}
		if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("produce with %s: %v", kc.name, err)
		}
		p.Close()
		for i := 0; i < perCodec; i++ {
			want = append(want, fmt.Sprintf("%s-%d", kc.name, i))
		}
	}

	for topic := range topics {
		c, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var got []*kgo.Record
		for len(got) < len(want) {
			fs := c.PollFetches(ctx)
			if err := fs.Err0(); err != nil {
				t.Fatalf("%s: %v", topic, err)
			}
			got = append(got, fs.Records()...)
		}
		c.Close()
		for i, r := range got {
			codecName := want[i][:bytes.IndexByte([]byte(want[i]), '-')]
			if r.Offset != int64(i) || string(r.Key) != want[i] || len(r.Headers) != 1 ||
				string(r.Headers[0].Value) != codecName || !bytes.HasPrefix(r.Value, []byte(codecName)) {
				t.Fatalf("%s offset %d: got key %q offset %d headers %v, want %q", topic, i, r.Key, r.Offset, r.Headers, want[i])
			}
		}
	}

	prod := storedCodecs(t, s, "c-producer")
	for _, kc := range kgoCodecs {
		if prod[kc.id] == 0 {
			t.Errorf("c-producer: no batch stored as %s (%v): compression.type=producer keeps the producer's codec", kc.name, prod)
		}
	}
	if z := storedCodecs(t, s, "c-zstd"); len(z) != 1 || z[codec.CompressionZstd] == 0 {
		t.Errorf("c-zstd stores codecs %v, want zstd only", z)
	}
}

// zstdBatch is a hand-built zstd v2 batch of n records from no producer; delta(i) is record i's
// offset delta, keyless(i) drops its key, and record future (if > 0) is two hours ahead.
func zstdBatch(n int, delta func(int) int64, keyless func(int) bool, future int) []byte {
	var recs []byte
	for i := 0; i < n; i++ {
		var body []byte
		body = append(body, 0)
		tsDelta := int64(0)
		if future > 0 && i == future {
			tsDelta = int64(2 * time.Hour / time.Millisecond)
		}
		body = binary.AppendVarint(body, tsDelta)
		body = binary.AppendVarint(body, delta(i))
		if keyless(i) {
			body = binary.AppendVarint(body, -1)
		} else {
			body = binary.AppendVarint(body, 1)
			body = append(body, 'k')
		}
		body = binary.AppendVarint(body, 1)
		body = append(body, 'v')
		body = binary.AppendVarint(body, 0)
		recs = binary.AppendVarint(recs, int64(len(body)))
		recs = append(recs, body...)
	}
	return compressedBatch(recs, n)
}

func compressedBatch(recs []byte, n int) []byte {
	enc, _ := zstd.NewWriter(nil)
	now := time.Now().UnixMilli()
	rb := kmsg.RecordBatch{PartitionLeaderEpoch: -1, Magic: 2, Attributes: codec.CompressionZstd,
		LastOffsetDelta: int32(n - 1), FirstTimestamp: now, MaxTimestamp: now, ProducerID: -1,
		ProducerEpoch: -1, FirstSequence: -1, NumRecords: int32(n), Records: enc.EncodeAll(recs, nil)}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], codec.Batch(b).ComputeCRC())
	return b
}

// TestInvalidCompressedRecordsGetApacheErrors: the records inside a compressed batch are
// checked, not just its CRC: a header claiming more records than the stream holds is
// INVALID_RECORD; a record timestamp out of message.timestamp.after.max.ms is INVALID_TIMESTAMP
// naming the record (ErrorRecords); a decompression bomb is MESSAGE_TOO_LARGE and counted;
// nothing of these is written. Inner offset deltas other than 0..n-1 are renumbered, as Apache
// does, and consumers see consecutive offsets.
func TestInvalidCompressedRecordsGetApacheErrors(t *testing.T) {
	addr, s := newTestBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1,
		map[string]*string{"message.timestamp.after.max.ms": kadm.StringPtr("60000")}, "bad-inner"); err != nil {
		t.Fatal(err)
	}
	produce := func(b []byte) kmsg.ProduceResponseTopicPartition {
		t.Helper()
		req := kmsg.NewPtrProduceRequest()
		req.Acks = -1
		req.TimeoutMillis = 10000
		req.Topics = []kmsg.ProduceRequestTopic{{Topic: "bad-inner", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: b}}}}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Topics[0].Partitions[0]
	}
	never := func(int) bool { return false }
	inOrder := func(i int) int64 { return int64(i) }

	if r := produce(zstdBatch(4, inOrder, never, 0)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("valid zstd batch: code %d offset %d", r.ErrorCode, r.BaseOffset)
	}
	// Deltas 0 2 4 6: renumbered to 4..7.
	if r := produce(zstdBatch(4, func(i int) int64 { return int64(i) * 2 }, never, 0)); r.ErrorCode != 0 || r.BaseOffset != 4 {
		t.Fatalf("misnumbered zstd batch: code %d offset %d", r.ErrorCode, r.BaseOffset)
	}
	short := zstdBatch(4, inOrder, never, 0)
	binary.BigEndian.PutUint32(short[57:], 5) // count 5, lastOffsetDelta 4, 4 records inside
	binary.BigEndian.PutUint32(short[23:], 4)
	binary.BigEndian.PutUint32(short[17:], codec.Batch(short).ComputeCRC())
	if r := produce(short); r.ErrorCode != codec.CodeInvalidRecord {
		t.Fatalf("count above the records: code %d", r.ErrorCode)
	}
	// Record 2 is two hours ahead.
	r := produce(zstdBatch(4, inOrder, never, 2))
	if r.ErrorCode != codec.CodeInvalidTimestamp || len(r.ErrorRecords) != 1 || r.ErrorRecords[0].RelativeOffset != 2 || r.ErrorMessage == nil {
		t.Fatalf("future record: code %d records %+v", r.ErrorCode, r.ErrorRecords)
	}
	before := mProduceDecompressLimited.Get()
	bomb := compressedBatch(make([]byte, codec.DefaultMaxUncompressedBytes+1), 1)
	if len(bomb) > 1<<20 {
		t.Fatalf("the bomb is %d bytes, not small", len(bomb))
	}
	if r := produce(bomb); r.ErrorCode != codec.CodeMessageTooLarge {
		t.Fatalf("decompression bomb: code %d", r.ErrorCode)
	}
	if got := mProduceDecompressLimited.Get(); got != before+1 {
		t.Fatalf("kaas_produce_decompress_limit_total went %d → %d", before, got)
	}
	if end := s.deps.Store.Topic("bad-inner").Partition(0).LogEndOffset(); end != 8 {
		t.Fatalf("log end %d, want 8: refused batches write nothing", end)
	}
	c, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("bad-inner"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var offsets []int64
	for len(offsets) < 8 {
		fs := c.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) { offsets = append(offsets, r.Offset) })
	}
	for i, o := range offsets {
		if o != int64(i) {
			t.Fatalf("consumed offsets %v, want 0..7", offsets)
		}
	}
}

// TestCompressionTypeBrokerDefaultDescribedAndHonoured: the broker's compression.type is the
// default of topics without an override (STATIC_BROKER_CONFIG in DescribeConfigs) and applies;
// a topic override wins (DYNAMIC_TOPIC_CONFIG); the levels are described with their sources.
func TestCompressionTypeBrokerDefaultDescribedAndHonoured(t *testing.T) {
	addr, s := newTestBroker(t, func(c *configs.Config) { c.CompressionType = "lz4"; c.CompressionLZ4Level = 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerBatchCompression(kgo.GzipCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "inherits"); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"compression.type": kadm.StringPtr("uncompressed")}, "plain"); err != nil {
		t.Fatal(err)
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, "inherits", "plain")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]struct {
		v   string
		src kmsg.ConfigSource
	}{
		"inherits": {
			"compression.type":       {"lz4", kmsg.ConfigSourceStaticBrokerConfig},
			"compression.lz4.level":  {"1", kmsg.ConfigSourceStaticBrokerConfig},
			"compression.zstd.level": {"3", kmsg.ConfigSourceDefaultConfig},
		},
		"plain": {"compression.type": {"uncompressed", kmsg.ConfigSourceDynamicTopicConfig}},
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if w, ok := want[rc.Name][c.Key]; ok {
				if c.Value == nil || *c.Value != w.v || c.Source != w.src {
					t.Errorf("%s %s = %v source %v, want %s source %v", rc.Name, c.Key, c.MaybeValue(), c.Source, w.v, w.src)
				}
				delete(want[rc.Name], c.Key)
			}
		}
	}
	for topic, left := range want {
		if len(left) > 0 {
			t.Errorf("%s: not described: %v", topic, left)
		}
	}
	for _, topic := range []string{"inherits", "plain"} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("hello")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if got := storedCodecs(t, s, "inherits"); got[codec.CompressionLZ4] != 1 || len(got) != 1 {
		t.Errorf("inherits stores %v, want lz4 (broker default)", got)
	}
	if got := storedCodecs(t, s, "plain"); got[codec.CompressionNone] != 1 || len(got) != 1 {
		t.Errorf("plain stores %v, want uncompressed", got)
	}
}
