package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestClusterDescribeProducersAnsweredByEveryReplica guards `kafka-transactions.sh find-hanging
// --broker-id N` across brokers: the admin client asks broker N itself about every partition
// Metadata lists N as a replica of, and fails on NOT_LEADER_OR_FOLLOWER. Every broker of an RF 3
// topic on 3 brokers must answer DescribeProducers for a partition it does not lead with the
// leader's producer state (forwarded), here an open transaction and then its end; the
// forwarded form itself is answered where it lands, never forwarded again.
func TestClusterDescribeProducersAnsweredByEveryReplica(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "dprep"
	tc.createTopic(topic, 3, 3)
	tc.waitTopicSpread(topic)
	leader := tc.owner(topic, 0).Broker

	prod := tc.client(kgo.TransactionalID("dprep-tid"), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := prod.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	r := &kgo.Record{Partition: 0, Value: []byte("open")}
	if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatalf("produce in the transaction: %v", err)
	}

	cl := tc.client()
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl); err != nil {
		t.Fatalf("metadata: %v", err)
	}
	ask := func(id int32, forwardedTag bool) kmsg.DescribeProducersResponseTopicPartition {
		t.Helper()
		req := kmsg.NewPtrDescribeProducersRequest()
		req.Topics = []kmsg.DescribeProducersRequestTopic{{Topic: topic, Partitions: []int32{0}}}
		if forwardedTag {
			req.UnknownTags.Set(tagDescribeProducersForwarded, []byte{1})
		}
		kresp, err := cl.Broker(int(id)).Request(ctx, req)
		if err != nil {
			t.Fatalf("DescribeProducers to broker %d: %v", id, err)
		}
		resp := kresp.(*kmsg.DescribeProducersResponse)
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			t.Fatalf("broker %d: malformed answer %+v", id, resp)
		}
		return resp.Topics[0].Partitions[0]
	}
	for id := int32(1); id <= 3; id++ {
		p := ask(id, false)
		if p.ErrorCode != 0 || len(p.ActiveProducers) != 1 {
			t.Fatalf("broker %d (leader %d): DescribeProducers %s-0: code %d, producers %+v; want the leader's one open transaction",
				id, leader, topic, p.ErrorCode, p.ActiveProducers)
		}
		ap := p.ActiveProducers[0]
		if ap.ProducerID != r.ProducerID || ap.CurrentTxnStartOffset != r.Offset {
			t.Errorf("broker %d: producer %d with transaction start %d, want %d at %d", id, ap.ProducerID, ap.CurrentTxnStartOffset, r.ProducerID, r.Offset)
		}
	}
	// The forwarded form is answered where it lands and never forwarded again: a non-leader
	// answers it NOT_LEADER_OR_FOLLOWER itself.
	for id := int32(1); id <= 3; id++ {
		p := ask(id, true)
		want := int16(0)
		if id != leader {
			want = 6
		}
		if p.ErrorCode != want {
			t.Errorf("broker %d (leader %d), forwarded form: code %d, want %d", id, leader, p.ErrorCode, want)
		}
	}
	if err := prod.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatalf("abort: %v", err)
	}
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		for id := int32(1); id <= 3; id++ {
			if p := ask(id, false); p.ErrorCode != 0 || len(p.ActiveProducers) != 1 || p.ActiveProducers[0].CurrentTxnStartOffset != -1 {
				return fmt.Errorf("broker %d after the abort: %+v", id, p)
			}
		}
		return nil
	})
}
