package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

const classDeleteRecords = "org.apache.kafka.tools.DeleteRecordsCommand"

// TestDeleteRecordsCLI purges a topic with kafka-delete-records (DeleteRecords v2), checks the
// tool's report and the new log start (kadm ListOffsets EARLIEST), that a consumer from the
// earliest offset starts there, and (kaas only, see below) that the start survives a kill -9.
func TestDeleteRecordsCLI(t *testing.T) {
	requireKafkaLib(t)
	b := startE2EBroker(t) // managed: it gets killed
	topic := e2eName("delrec")
	e2eCreateTopic(t, b.Addr(), topic, 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		r := &kgo.Record{Topic: topic, Partition: int32(i % 2), Value: []byte(fmt.Sprint(i))}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// Each partition holds offsets 0-9: cut p0 at 6 and p1 at its high watermark (-1).
	spec := fmt.Sprintf(`{"version":1,"partitions":[{"topic":%q,"partition":0,"offset":6},{"topic":%q,"partition":1,"offset":-1}]}`, topic, topic)
	file := filepath.Join(t.TempDir(), "offsets.json")
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	out := javaTool(t, 60*time.Second, classDeleteRecords, "--bootstrap-server", b.Addr(), "--offset-json-file", file).stdout
	t.Logf("kafka-delete-records:\n%s", strings.TrimSpace(out))
	for _, want := range []string{
		fmt.Sprintf("partition: %s-0\tlow_watermark: 6", topic),
		fmt.Sprintf("partition: %s-1\tlow_watermark: 10", topic),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("kafka-delete-records output lacks %q", want)
		}
	}

	check := func(when string) {
		t.Helper()
		adm := e2eAdmin(t, b.Addr())
		e2eEventually(t, 30*time.Second, "log start offsets "+when, func() error {
			los, err := adm.ListStartOffsets(ctx, topic)
			if err != nil {
				return err
			}
			for p, want := range map[int32]int64{0: 6, 1: 10} {
				o, ok := los.Lookup(topic, p)
				if !ok || o.Err != nil || o.Offset != want {
					return fmt.Errorf("partition %d: %+v, want start %d", p, o, want)
				}
			}
			return nil
		})
		cons, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		fs := cons.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			t.Fatalf("%s: consume: %v", when, err)
		}
		if recs := fs.Records(); len(recs) == 0 || recs[0].Offset != 6 || string(recs[0].Value) != "12" {
			t.Fatalf("%s: first record from the earliest offset: %+v", when, recs)
		}
	}
	check("after kafka-delete-records")
	if e2eBrokerKind() != "kaas" {
		// Apache checkpoints log start offsets every log.flush.start.offset.checkpoint.interval.ms
		// (60 s), not before answering: a kill -9 right after DeleteRecords brings the old start
		// back (seen with the reference broker). kaas answers only once the start is durable.
		return
	}
	b.Kill(t)
	b.Restart(t)
	check("after kill -9 and restart")
}

// TestTopicConfigsCLINoEffectKeys: kafka-topics --create and kafka-configs --alter accept topic
// configs Apache 4.1 has and kaas stores without acting on, kafka-configs --describe shows them
// as dynamic topic configs and --describe --all shows the rest with Apache's defaults.
func TestTopicConfigsCLINoEffectKeys(t *testing.T) {
	requireKafkaLib(t)
	addr := e2eBootstrap(t)
	topic := e2eName("cfgs")
	bs := []string{"--bootstrap-server", addr}
	javaTool(t, 60*time.Second, classTopics, append(append([]string{}, bs...), "--create", "--topic", topic,
		"--partitions", "1", "--replication-factor", "1",
		"--config", "min.insync.replicas=2", "--config", "segment.jitter.ms=5")...)
	cfg := func(args ...string) string {
		t.Helper()
		return javaTool(t, 60*time.Second, classConfigs, append(append([]string{}, bs...),
			append([]string{"--entity-type", "topics", "--entity-name", topic}, args...)...)...).stdout
	}
	if out := cfg("--alter", "--add-config", "unclean.leader.election.enable=true,min.cleanable.dirty.ratio=0.7"); !strings.Contains(out, "Completed updating config") {
		t.Errorf("kafka-configs --alter: unexpected output %q", out)
	}
	var out string
	e2eEventually(t, 30*time.Second, "kafka-configs --describe shows the overrides", func() error {
		out = cfg("--describe")
		for _, want := range []string{"min.insync.replicas=2", "segment.jitter.ms=5", "unclean.leader.election.enable=true", "min.cleanable.dirty.ratio=0.7"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("no %q in:\n%s", want, out)
			}
		}
		return nil
	})
	t.Logf("kafka-configs --describe:\n%s", strings.TrimSpace(out))
	out = cfg("--describe", "--all")
	t.Logf("kafka-configs --describe --all:\n%s", strings.TrimSpace(out))
	for _, want := range []string{"preallocate=false", "local.retention.ms=-2", "segment.index.bytes=10485760", "compression.type=producer"} {
		if !strings.Contains(out, want) {
			t.Errorf("kafka-configs --describe --all lacks %q:\n%s", want, out)
		}
	}
}
