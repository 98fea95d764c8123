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
	cfg := e2eTopicConfigsTool(t, bs, topic)
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

// TestCompactedTopicDeleteRecordsAndConfigsCLI: Apache's tools on a compacted topic.
// kafka-topics --create with cleanup.policy=compact and eager cleaning settings; keyed records
// in 20 rounds (one version of each of 10 keys per round, paced past segment.ms so that each
// round lands in its own segment) are compacted by the broker; kafka-configs --describe shows
// cleanup.policy=compact as a dynamic topic config over the broker default, and --alter changes
// delete.retention.ms; kafka-delete-records is refused (POLICY_VIOLATION, as Apache) until
// --alter makes the policy compact,delete, and then moves the log start into the compacted
// range (onto an offset the cleaner removed), and a consumer from the earliest offset starts at
// the first record at or after it and still finds every key's latest value, also after a kill -9
// (kaas).
func TestCompactedTopicDeleteRecordsAndConfigsCLI(t *testing.T) {
	requireKafkaLib(t)
	if e2eBrokerKind() == "kaas" {
		e2eExtraKaasArgs = []string{"--log.cleaner.backoff.ms=100"}
		defer func() { e2eExtraKaasArgs = nil }()
	}
	b := startE2EBroker(t) // managed: it gets killed
	topic := e2eName("compact-tools")
	bs := []string{"--bootstrap-server", b.Addr()}
	javaTool(t, 60*time.Second, classTopics, append(append([]string{}, bs...), "--create", "--topic", topic,
		"--partitions", "1", "--replication-factor", "1",
		"--config", "cleanup.policy=compact", "--config", "segment.ms=100",
		"--config", "min.cleanable.dirty.ratio=0.01", "--config", "min.compaction.lag.ms=0")...)

	const keys, rounds = 10, 20
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	pace := time.NewTicker(150 * time.Millisecond) // > segment.ms: a roll between rounds
	defer pace.Stop()
	for r := 0; r < rounds; r++ {
		var recs []*kgo.Record
		for k := 0; k < keys; k++ {
			recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("k%d", k)), Value: []byte(fmt.Sprintf("k%d-v%d", k, r))})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		<-pace.C
	}
	// One more record, so that the last round's segment is closed (cleanable) by a roll.
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("roll"), Value: []byte("roll")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	written := int64(keys*rounds + 1)

	// readAll reads the partition from its log start to its high watermark.
	readAll := func() ([]*kgo.Record, error) {
		cons, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
		if err != nil {
			return nil, err
		}
		defer cons.Close()
		ends, err := e2eAdmin(t, b.Addr()).ListEndOffsets(ctx, topic)
		if err != nil {
			return nil, err
		}
		end, _ := ends.Lookup(topic, 0)
		var out []*kgo.Record
		for len(out) == 0 || out[len(out)-1].Offset < end.Offset-1 {
			fs := cons.PollFetches(ctx)
			if err := fs.Err(); err != nil {
				return nil, err
			}
			out = append(out, fs.Records()...)
		}
		return out, nil
	}
	latest := func(recs []*kgo.Record) map[string]string {
		m := map[string]string{}
		for _, r := range recs {
			m[string(r.Key)] = string(r.Value)
		}
		return m
	}
	checkLatest := func(when string, recs []*kgo.Record) {
		t.Helper()
		got := latest(recs)
		for k := 0; k < keys; k++ {
			if v, want := got[fmt.Sprintf("k%d", k)], fmt.Sprintf("k%d-v%d", k, rounds-1); v != want {
				t.Errorf("%s: key k%d reads %q, want its latest value %q", when, k, v, want)
			}
		}
	}
	var kept []*kgo.Record
	e2eEventually(t, 90*time.Second, "the topic compacted", func() error {
		recs, err := readAll()
		if err != nil {
			return err
		}
		if int64(len(recs)) > written/2 {
			return fmt.Errorf("%d of %d records still there", len(recs), written)
		}
		kept = recs
		return nil
	})
	t.Logf("compacted: %d of %d records kept", len(kept), written)
	checkLatest("after compaction", kept)

	cfg := e2eTopicConfigsTool(t, bs, topic)
	if out := cfg("--alter", "--add-config", "delete.retention.ms=3600000"); !strings.Contains(out, "Completed updating config") {
		t.Errorf("kafka-configs --alter: unexpected output %q", out)
	}
	var desc string
	e2eEventually(t, 30*time.Second, "kafka-configs --describe of the compacted topic", func() error {
		desc = cfg("--describe")
		for _, want := range []string{"cleanup.policy=compact", "DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact",
			"DEFAULT_CONFIG:log.cleanup.policy=delete", "delete.retention.ms=3600000"} {
			if !strings.Contains(desc, want) {
				return fmt.Errorf("no %q in:\n%s", want, desc)
			}
		}
		return nil
	})
	t.Logf("kafka-configs --describe:\n%s", strings.TrimSpace(desc))

	// The new start: an offset of the compacted range that the cleaner removed (a gap), so the
	// first record a consumer from the earliest offset gets is the next one kept.
	start, first := int64(-1), int64(-1)
	prev := int64(-1) // the offset before the log start (0)
	for _, r := range kept {
		if r.Offset > prev+1 && r.Offset < int64(keys*rounds) {
			start, first = r.Offset-1, r.Offset // start on a removed offset
			break
		}
		prev = r.Offset
	}
	if start < 0 {
		t.Fatalf("no gap left by the cleaner in %d kept records", len(kept))
	}
	spec := fmt.Sprintf(`{"version":1,"partitions":[{"topic":%q,"partition":0,"offset":%d}]}`, topic, start)
	file := filepath.Join(t.TempDir(), "offsets.json")
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	// As Apache (ReplicaManager.deleteRecords): a topic whose cleanup.policy lacks delete
	// refuses DeleteRecords with POLICY_VIOLATION; compact,delete (Streams' repartition
	// topics are delete) allows it.
	out := javaTool(t, 60*time.Second, classDeleteRecords, append(append([]string{}, bs...), "--offset-json-file", file)...).stdout
	if !strings.Contains(out, "PolicyViolationException") {
		t.Errorf("kafka-delete-records on a compact-only topic: no PolicyViolationException in:\n%s", out)
	}
	if out := cfg("--alter", "--add-config", "cleanup.policy=[compact,delete]"); !strings.Contains(out, "Completed updating config") {
		t.Errorf("kafka-configs --alter cleanup.policy: unexpected output %q", out)
	}
	e2eEventually(t, 30*time.Second, "cleanup.policy=compact,delete", func() error {
		if d := cfg("--describe"); !strings.Contains(d, "cleanup.policy=compact,delete") {
			return fmt.Errorf("not in:\n%s", d)
		}
		return nil
	})
	out = javaTool(t, 60*time.Second, classDeleteRecords, append(append([]string{}, bs...), "--offset-json-file", file)...).stdout
	t.Logf("kafka-delete-records (start %d; the next record kept at the last read: %d):\n%s", start, first, strings.TrimSpace(out))
	if want := fmt.Sprintf("partition: %s-0\tlow_watermark: %d", topic, start); !strings.Contains(out, want) {
		t.Errorf("kafka-delete-records output lacks %q", want)
	}
	check := func(when string) {
		t.Helper()
		e2eEventually(t, 30*time.Second, "log start "+when, func() error {
			los, err := e2eAdmin(t, b.Addr()).ListStartOffsets(ctx, topic)
			if err != nil {
				return err
			}
			if o, ok := los.Lookup(topic, 0); !ok || o.Err != nil || o.Offset != start {
				return fmt.Errorf("%+v, want start %d", o, start)
			}
			return nil
		})
		recs, err := readAll()
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		// The first record at or after the start (the cleaner may have removed more since).
		if len(recs) == 0 || recs[0].Offset < start {
			t.Fatalf("%s: %d records from the earliest offset, the first at %d, want one at or after %d", when, len(recs), recs[0].Offset, start)
		}
		checkLatest(when, recs)
	}
	check("after kafka-delete-records")
	if e2eBrokerKind() != "kaas" {
		return // Apache checkpoints the log start later (see TestDeleteRecordsCLI)
	}
	b.Kill(t)
	b.Restart(t)
	check("after kill -9 and restart")
}

// e2eTopicConfigsTool runs kafka-configs for one topic: cfg("--describe") or
// cfg("--alter", "--add-config", "k=v"), returning its stdout.
func e2eTopicConfigsTool(t *testing.T, bootstrap []string, topic string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		return javaTool(t, 60*time.Second, classConfigs, append(append([]string{}, bootstrap...),
			append([]string{"--entity-type", "topics", "--entity-name", topic}, args...)...)...).stdout
	}
}
