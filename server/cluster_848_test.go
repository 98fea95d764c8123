package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/topology"
)

// TestClusterConsumerGroup848MovesWithoutRebalance: the broker coordinating a KIP-848 consumer
// group stops; the group shard moves with the consumer group's state, and the consumer goes on
// at the same member id and member epoch with the same partitions.
func TestClusterConsumerGroup848MovesWithoutRebalance(t *testing.T) {
	tc := startTestClusterWith(t, 3, func(_ int32, cfg *configs.Config, _ *BrokerOptions) { fast848(cfg) })
	tc.createTopic("grp848", 3, 3)
	const grp = "g848-move"
	own := newOwnership(t)
	cons := tc.client(append([]kgo.Opt{kgo.ConsumerGroup(grp), kgo.ConsumeTopics("grp848"),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer()}, own.opts("c")...)...)
	ctx, cancel := context.WithCancel(context.Background())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for ctx.Err() == nil {
			cons.PollFetches(ctx)
		}
	}()
	defer func() { cancel(); cons.Close(); <-polled }()
	describe := func() kmsg.ConsumerGroupDescribeResponseGroup {
		var d kmsg.ConsumerGroupDescribeResponseGroup
		checkFor(t, 60*time.Second, 50*time.Millisecond, func() error {
			// A fresh client each time: a client that knew the old coordinator keeps dialing it.
			cl := tc.client()
			defer cl.Close()
			rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer rcancel()
			req := kmsg.NewPtrConsumerGroupDescribeRequest()
			req.Groups = []string{grp}
			resp, err := req.RequestWith(rctx, cl)
			if err != nil {
				return err
			}
			d = resp.Groups[0]
			if d.ErrorCode != 0 || d.State != "Stable" || len(own.held("c")) != 3 {
				return fmt.Errorf("group: code %d state %q; consumer holds %d", d.ErrorCode, d.State, len(own.held("c")))
			}
			return nil
		})
		return d
	}
	before := describe()
	member0, epoch0 := cons.GroupMetadata()
	assigned0 := own.assignments("c")
	coord := tc.owner(topology.GroupsTopic, int32(topology.GroupShard(grp)))
	tc.stop(coord.Broker)
	if moved := tc.owner(topology.GroupsTopic, int32(topology.GroupShard(grp))); moved.Broker == coord.Broker {
		t.Fatalf("group shard still on drained broker %d", coord.Broker)
	}
	after := describe()
	if after.Epoch != before.Epoch || len(after.Members) != 1 || after.Members[0].MemberID != member0 {
		t.Fatalf("after the move: epoch %d (before %d), members %+v", after.Epoch, before.Epoch, after.Members)
	}
	if m, e := cons.GroupMetadata(); m != member0 || e != epoch0 {
		t.Fatalf("consumer rejoined across the move: member %s → %s, epoch %d → %d", member0, m, epoch0, e)
	}
	if a := own.assignments("c"); a != assigned0 {
		t.Fatalf("consumer reassigned across the move: %d assignments, before %d", a, assigned0)
	}
}
