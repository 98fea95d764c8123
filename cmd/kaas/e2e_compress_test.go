package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestConsoleProducerCompressed: Apache's console producer with --compression-codec lz4 (LZ4 frames)
// and snappy (snappy-java's xerial framing) into a compression.type=producer topic keeps its
// codec, and into a compression.type=zstd topic is recompressed to zstd; franz-go reads back
// every record and sees the stored codec in the record attributes. (kcat is not used: librdkafka
// 2.0.2 finds no compression support in brokers without Produce v0-2, which Apache 4.x and kaas
// no longer serve, and sends uncompressed batches.)
func TestConsoleProducerCompressed(t *testing.T) {
	requireKafkaLib(t)
	addr := e2eBootstrap(t)
	adm := e2eAdmin(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct{ codecName, topicType string }{{"lz4", "producer"}, {"lz4", "zstd"}, {"snappy", "producer"}} {
		codecName, topicType := tc.codecName, tc.topicType
		{
			t.Run(codecName+"-into-"+topicType, func(t *testing.T) {
				topic := e2eName("console-" + codecName + "-" + topicType)
				e2eCreateTopic(t, addr, topic, 1)
				alt, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "compression.type", Value: kadm.StringPtr(topicType)}}, topic)
				if err == nil {
					err = alt[0].Err
				}
				if err != nil {
					t.Fatalf("cannot set compression.type=%s: %v", topicType, err)
				}
				const n = 1500
				var in strings.Builder
				want := make([]string, n)
				for i := range want {
					want[i] = fmt.Sprintf("%s-%05d payload payload payload %d", codecName, i, i*i)
					in.WriteString(want[i] + "\n")
				}
				e2eRunCmd(t, 2*time.Minute, in.String(), filepath.Join(e2eRepoRoot, "bench", "kafka-tools.sh"), "run",
					"org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", addr, "--topic", topic,
					"--producer-property", "acks=all", "--compression-codec", codecName,
					"--producer-property", "linger.ms=20")
				wantCodec := map[string]uint8{"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codecName]
				if topicType == "zstd" {
					wantCodec = 4
				}
				cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				seen := 0
				for seen < n {
					fs := cl.PollFetches(ctx)
					if err := fs.Err0(); err != nil {
						t.Fatal(err)
					}
					fs.EachRecord(func(r *kgo.Record) {
						if c := r.Attrs.CompressionType(); c != wantCodec {
							t.Fatalf("offset %d stored with codec %d, want %d", r.Offset, c, wantCodec)
						}
						if r.Offset != int64(seen) || string(r.Value) != want[seen] {
							t.Fatalf("record %d: offset %d value %q, want %q", seen, r.Offset, r.Value, want[seen])
						}
						seen++
					})
				}
			})
		}
	}
}

// TestConsoleConsumerReadsRecompressed: batches the broker recompressed (franz-go produces them
// uncompressed) into lz4, snappy, gzip and zstd are read by Apache's console consumer, so the
// broker's LZ4 frames and xerial snappy framing are what the Java client expects.
func TestConsoleConsumerReadsRecompressed(t *testing.T) {
	requireKafkaLib(t)
	addr := e2eBootstrap(t)
	adm := e2eAdmin(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, codecName := range []string{"lz4", "snappy", "gzip", "zstd"} {
		t.Run(codecName, func(t *testing.T) {
			topic := e2eName("recompressed-" + codecName)
			if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"compression.type": kadm.StringPtr(codecName)}, topic); err != nil {
				t.Fatal(err)
			}
			const n = 2000
			recs := make([]*kgo.Record, n)
			for i := range recs {
				recs[i] = &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf("%s-%05d %s", codecName, i, strings.Repeat("x", i%50)))}
			}
			if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			r := javaTool(t, 2*time.Minute, classConsole, "--bootstrap-server", addr, "--topic", topic,
				"--from-beginning", "--max-messages", fmt.Sprint(n), "--timeout-ms", "30000")
			got := strings.Split(strings.TrimSpace(r.stdout), "\n")
			if len(got) != n {
				t.Fatalf("console consumer printed %d records, want %d; stderr:\n%s", len(got), n, e2eTruncate(r.stderr, 2000))
			}
			for i, l := range got {
				if l != string(recs[i].Value) {
					t.Fatalf("record %d: %q, want %q", i, l, recs[i].Value)
				}
			}
		})
	}
}
