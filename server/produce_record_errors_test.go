package server

import (
	"context"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestProduceListsEveryInvalidRecord: a compressed batch with several keyless records on a
// compacted topic is refused with INVALID_RECORD and one ErrorRecords entry per keyless record
// (Apache's LogValidator collects them all), and nothing is written.
func TestProduceListsEveryInvalidRecord(t *testing.T) {
	addr, s := newTestBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1,
		map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, "keyless-many"); err != nil {
		t.Fatal(err)
	}
	inOrder := func(i int) int64 { return int64(i) }
	keyless := func(i int) bool { return i == 0 || i == 2 || i == 5 }
	req := kmsg.NewPtrProduceRequest()
	req.Acks = -1
	req.TimeoutMillis = 10000
	req.Topics = []kmsg.ProduceRequestTopic{{Topic: "keyless-many", Partitions: []kmsg.ProduceRequestTopicPartition{
		{Partition: 0, Records: zstdBatch(6, inOrder, keyless, 0)}}}}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Topics[0].Partitions[0]
	if r.ErrorCode != codec.CodeInvalidRecord || r.ErrorMessage == nil || len(r.ErrorRecords) != 3 {
		t.Fatalf("code %d message %v, %d error records: %+v", r.ErrorCode, r.ErrorMessage, len(r.ErrorRecords), r.ErrorRecords)
	}
	for i, want := range []int32{0, 2, 5} {
		if e := r.ErrorRecords[i]; e.RelativeOffset != want || e.ErrorMessage == nil || *e.ErrorMessage == "" {
			t.Fatalf("error record %d: %+v, want batch index %d with a message", i, e, want)
		}
	}
	if end := s.deps.Store.Topic("keyless-many").Partition(0).LogEndOffset(); end != 0 {
		t.Fatalf("log end %d: the refused batch was written", end)
	}
}
