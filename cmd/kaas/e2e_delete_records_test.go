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
// earliest offset starts there, and that the start survives a kill -9 of the broker.
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
	b.Kill(t)
	b.Restart(t)
	check("after kill -9 and restart")
}
