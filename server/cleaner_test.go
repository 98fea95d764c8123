package server

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestCompactedTopicConsumeAcrossGaps: the background cleaner compacts a topic while the broker
// serves it; a read_committed kgo consumer reading from the start walks the offset gaps and gets
// exactly the latest value of every key; DescribeConfigs shows the compaction configs with
// their sources.
func TestCompactedTopicConsumeAcrossGaps(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, func(c *configs.Config) { c.LogCleanerBackoff = 20 * time.Millisecond })
	store := e.s.deps.Store
	e.create(t, "cmp", 1, map[string]*string{
		"cleanup.policy":            kadm.StringPtr("compact"),
		"segment.bytes":             kadm.StringPtr("1024"),
		"min.cleanable.dirty.ratio": kadm.StringPtr("0.01"),
		"delete.retention.ms":       kadm.StringPtr("100"),
	})

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.DefaultProduceTopic("cmp"), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const n, keys = 400, 10
	latest := map[string]string{}
	for i := 0; i < n; i++ {
		k, v := fmt.Sprintf("k%d", i%keys), strconv.Itoa(i)
		if err := cl.ProduceSync(e.ctx, &kgo.Record{Key: []byte(k), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		latest[k] = v
	}
	p := store.Topic("cmp").Partition(0)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if p.FirstDirtyOffset() == 0 {
			return fmt.Errorf("not cleaned yet")
		}
		return nil
	})
	hwm := p.HighWatermark()

	cons, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.ConsumeTopics("cmp"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxBytes(2048), kgo.FetchMaxPartitionBytes(512))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	got := map[string]string{}
	var records int
	last := int64(-1)
	gaps := 0
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	for last < hwm-1 {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed up to %d of %d: %v", last, hwm, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset <= last {
				t.Fatalf("offset %d after %d", r.Offset, last)
			}
			if r.Offset > last+1 {
				gaps++
			}
			last = r.Offset
			records++
			got[string(r.Key)] = string(r.Value)
		})
	}
	if gaps == 0 || records >= n {
		t.Fatalf("%d records, %d gaps: nothing compacted", records, gaps)
	}
	for k, v := range latest {
		if got[k] != v {
			t.Fatalf("key %s = %q, want %q", k, got[k], v)
		}
	}

	cfgs := e.topicConfigs(t, "cmp")
	want := map[string]struct {
		v   string
		src kmsg.ConfigSource
	}{
		"cleanup.policy":            {"compact", kmsg.ConfigSourceDynamicTopicConfig},
		"delete.retention.ms":       {"100", kmsg.ConfigSourceDynamicTopicConfig},
		"min.cleanable.dirty.ratio": {"0.01", kmsg.ConfigSourceDynamicTopicConfig},
		"min.compaction.lag.ms":     {"0", kmsg.ConfigSourceDefaultConfig},
		"max.compaction.lag.ms":     {"9223372036854775807", kmsg.ConfigSourceDefaultConfig},
	}
	for k, w := range want {
		c := cfgs[k]
		if c.Value == nil || *c.Value != w.v || c.Source != w.src {
			t.Fatalf("%s: %+v, want %q from %v", k, c, w.v, w.src)
		}
	}

	// kafka-configs --describe --broker 0: the cleaner's keys, default or set.
	brs, err := e.adm.DescribeBrokerConfigs(e.ctx, 0)
	if err != nil || len(brs) != 1 || brs[0].Err != nil {
		t.Fatalf("describe broker: %v %+v", err, brs)
	}
	bc := map[string]kadm.Config{}
	for _, c := range brs[0].Configs {
		bc[c.Key] = c
	}
	for k, w := range map[string]struct {
		v   string
		src kmsg.ConfigSource
	}{
		"log.cleaner.enable":                  {"true", kmsg.ConfigSourceDefaultConfig},
		"log.cleaner.threads":                 {"1", kmsg.ConfigSourceDefaultConfig},
		"log.cleaner.dedupe.buffer.size":      {"134217728", kmsg.ConfigSourceDefaultConfig},
		"log.cleaner.io.max.bytes.per.second": {"1.7976931348623157e+308", kmsg.ConfigSourceDefaultConfig},
		"log.cleaner.backoff.ms":              {"20", kmsg.ConfigSourceStaticBrokerConfig},
	} {
		c := bc[k]
		if c.Value == nil || *c.Value != w.v || c.Source != w.src {
			t.Fatalf("broker %s: %+v, want %q from %v", k, c, w.v, w.src)
		}
	}

	// kafka-configs --alter --add-config cleanup.policy=[compact,delete] on a delete topic, then
	// APPEND: both give compact,delete.
	e.create(t, "both", 1, nil)
	rs, err := e.adm.AlterTopicConfigs(e.ctx, []kadm.AlterConfig{{Op: kadm.AppendConfig, Name: "cleanup.policy", Value: kadm.StringPtr("compact")}}, "both")
	if err != nil || rs[0].Err != nil {
		t.Fatalf("append compact: %v %+v", err, rs)
	}
	if c := e.topicConfigs(t, "both")["cleanup.policy"]; c.Value == nil || *c.Value != "delete,compact" || c.Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Fatalf("cleanup.policy after append: %+v", c)
	}
}

// TestCompactedTopicCompressedBatches: batches compressed by franz-go in each codec are cleaned
// (decompressed, filtered, recompressed in their codec) and a kgo consumer decodes the result:
// the latest value of every key, fewer records than were produced.
func TestCompactedTopicCompressedBatches(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, func(c *configs.Config) { c.LogCleanerBackoff = 20 * time.Millisecond })
	store := e.s.deps.Store
	for _, c := range []struct {
		name  string
		codec kgo.CompressionCodec
		id    int // Kafka's codec id
	}{{"gzip", kgo.GzipCompression(), 1}, {"snappy", kgo.SnappyCompression(), 2}, {"lz4", kgo.Lz4Compression(), 3}, {"zstd", kgo.ZstdCompression(), 4}} {
		topic := "z-" + c.name
		e.create(t, topic, 1, map[string]*string{
			"cleanup.policy":            kadm.StringPtr("compact"),
			"segment.bytes":             kadm.StringPtr("4096"),
			"min.cleanable.dirty.ratio": kadm.StringPtr("0.01"),
		})
		cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.DefaultProduceTopic(topic),
			kgo.ProducerBatchCompression(c.codec), kgo.ProducerLinger(5*time.Millisecond), kgo.ProducerBatchMaxBytes(2048))
		if err != nil {
			t.Fatal(err)
		}
		latest := map[string]string{}
		const n = 2000
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("key-%d", i%25)
			v := fmt.Sprintf("%s-value-%06d-%s", c.name, i, "padding padding padding padding")
			cl.Produce(e.ctx, &kgo.Record{Key: []byte(k), Value: []byte(v)}, func(_ *kgo.Record, err error) {
				if err != nil {
					t.Errorf("produce: %v", err)
				}
			})
			latest[k] = v
		}
		if err := cl.Flush(e.ctx); err != nil {
			t.Fatal(err)
		}
		cl.Close()
		p := store.Topic(topic).Partition(0)
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if p.FirstDirtyOffset() == 0 {
				return fmt.Errorf("%s: not cleaned yet", topic)
			}
			return nil
		})
		hwm := p.HighWatermark()
		// The cleaned log still holds batches in the producer's codec.
		buf, _ := p.Read(nil, 0, 1<<30, hwm)
		inCodec := 0
		for len(buf) > 0 {
			b, ok, _ := codec.FrameBatch(buf)
			if !ok {
				break
			}
			if b.BaseOffset() < p.FirstDirtyOffset() && b.Compression() == c.id {
				inCodec++
			}
			buf = buf[len(b):]
		}
		if inCodec == 0 {
			t.Fatalf("%s: no cleaned batch in the producer's codec", topic)
		}
		cons, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		records, last := 0, int64(-1)
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		for last < hwm-1 {
			fs := cons.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				t.Fatalf("%s: consumed up to %d of %d: %v", topic, last, hwm, err)
			}
			fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("%s: fetch: %v", topic, err) })
			fs.EachRecord(func(r *kgo.Record) {
				last = r.Offset
				records++
				got[string(r.Key)] = string(r.Value)
			})
		}
		cancel()
		cons.Close()
		if records >= n {
			t.Fatalf("%s: %d records of %d: nothing compacted", topic, records, n)
		}
		for k, v := range latest {
			if got[k] != v {
				t.Fatalf("%s: key %s = %q, want %q", topic, k, got[k], v)
			}
		}
	}
}
