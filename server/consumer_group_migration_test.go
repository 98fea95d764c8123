package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/group"
)

// startClassicConsumer is consumer848's loop (commit after every poll, BlockRebalanceOnPoll) on
// the classic protocol: JoinGroup/SyncGroup/Heartbeat with a client-side balancer.
func startClassicConsumer(t *testing.T, addr, grp, topic string, balancer kgo.GroupBalancer, seen *consumedSet, extra ...kgo.Opt) *consumer848 {
	opts := append([]kgo.Opt{
		kgo.ConsumerGroup(grp), kgo.ConsumeTopics(topic), kgo.Balancers(balancer),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.RebalanceTimeout(10 * time.Second),
		kgo.HeartbeatInterval(100 * time.Millisecond), kgo.SessionTimeout(10 * time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond),
	}, extra...)
	return startGroupLoop(t, addr, seen, opts, kerr.RebalanceInProgress, kerr.IllegalGeneration)
}

// TestConsumerGroupOnlineUpgradeAndDowngrade: two classic consumers share a topic; a third with
// franz-go's KIP-848 path joins and the group converts to a consumer group with the classic
// members inside it (ConsumerGroupDescribe flags them); the three end with disjoint assignments
// covering every partition, and no partition is ever assigned to one consumer while another holds
// it. The group's shard is released and reloaded (a coordinator move: the converted group is
// persisted); then the KIP-848 consumer leaves and the group converts back to a classic group,
// whose two members go on. Every record is consumed; a record is consumed twice only when a
// commit raced a rebalance (counted).
func TestConsumerGroupOnlineUpgradeAndDowngrade(t *testing.T) {
	for _, tc := range []struct {
		name     string
		balancer kgo.GroupBalancer
	}{
		{"cooperative-sticky", kgo.CooperativeStickyBalancer()},
		{"range", kgo.RangeBalancer()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			fast848(&cfg)
			tb := startTestBroker(t, cfg)
			defer tb.stop(t)
			addr := tb.srv.Addr().String()
			const topic, grp, total = "migrate", "gmig", 6000
			prod := grpClient(t, addr, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
			defer prod.Close()
			adm := kadm.NewClient(prod)
			grpCreateTopic(t, adm, topic, 6)
			produced := producePaced(prod, total, 50, 100*time.Millisecond, 120*time.Second)
			seen := &consumedSet{seen: map[string]bool{}}
			own := newOwnership(t)
			waitCount := func(n int) {
				t.Helper()
				checkFor(t, 60*time.Second, 10*time.Millisecond, func() error {
					if c := seen.count(); c < n {
						return fmt.Errorf("consumed %d of %d", c, n)
					}
					return nil
				})
			}
			// disjoint checks that the named consumers together hold every partition once.
			disjoint := func(names ...string) error {
				all := map[string]string{}
				for _, n := range names {
					held := own.held(n)
					if len(held) == 0 {
						return fmt.Errorf("%s holds nothing", n)
					}
					for k := range held {
						if o, ok := all[k]; ok {
							return fmt.Errorf("%s held by %s and %s", k, o, n)
						}
						all[k] = n
					}
				}
				if len(all) != 6 {
					return fmt.Errorf("%d of 6 partitions held: %v", len(all), all)
				}
				return nil
			}
			c1 := startClassicConsumer(t, addr, grp, topic, tc.balancer, seen, own.opts("c1")...)
			defer c1.stop()
			c2 := startClassicConsumer(t, addr, grp, topic, tc.balancer, seen, own.opts("c2")...)
			defer c2.stop()
			checkFor(t, 30*time.Second, 20*time.Millisecond, func() error { return disjoint("c1", "c2") })
			waitCount(1000)

			c3 := startConsumer848(t, addr, grp, topic, tc.balancer, seen, own.opts("c3")...)
			checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
				d := describe848(t, prod, grp)
				if d.ErrorCode != 0 {
					return fmt.Errorf("describe: %d", d.ErrorCode)
				}
				var classic int
				for _, m := range d.Members {
					if m.MemberType == 0 {
						classic++
					}
				}
				if len(d.Members) != 3 || classic != 2 || d.State != "Stable" {
					return fmt.Errorf("group %s with %d members, %d classic", d.State, len(d.Members), classic)
				}
				return disjoint("c1", "c2", "c3")
			})
			lg, err := adm.ListGroups(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if l := lg[grp]; l.ProtocolType != "consumer" || l.State != "Stable" {
				t.Fatalf("ListGroups after the upgrade: %+v", l)
			}
			waitCount(2500)

			// A coordinator move: the converted group with its classic members is written at
			// release and restored at load.
			shard := group.ShardFor(grp)
			releaseGroupShard(t, tb, shard)
			loadGroupShard(t, tb, shard, 2)
			checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
				d := describe848(t, prod, grp)
				if d.ErrorCode != 0 || len(d.Members) != 3 {
					return fmt.Errorf("after the reload: code %d, %d members", d.ErrorCode, len(d.Members))
				}
				return disjoint("c1", "c2", "c3")
			})
			waitCount(4000)

			c3.stop()
			checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
				dg, err := adm.DescribeGroups(context.Background(), grp)
				if err != nil {
					return err
				}
				d := dg[grp]
				if d.Err != nil || d.State != "Stable" || d.ProtocolType != "consumer" || len(d.Members) != 2 {
					return fmt.Errorf("classic group after the downgrade: %s %v %d members", d.State, d.Err, len(d.Members))
				}
				return disjoint("c1", "c2")
			})
			if err := <-produced; err != nil {
				t.Fatal(err)
			}
			waitCount(total)
			// The final commits cover everything: nothing is left unconsumed by the group.
			checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
				offs, err := adm.FetchOffsets(context.Background(), grp)
				if err != nil {
					return err
				}
				ends, err := adm.ListEndOffsets(context.Background(), topic)
				if err != nil {
					return err
				}
				var lag []string
				ends.Each(func(e kadm.ListedOffset) {
					if o, ok := offs.Lookup(topic, e.Partition); !ok || o.At != e.Offset {
						lag = append(lag, strconv.Itoa(int(e.Partition)))
					}
				})
				sort.Strings(lag)
				if len(lag) > 0 {
					return fmt.Errorf("partitions not fully committed: %v", lag)
				}
				return nil
			})
			repeats := seen.repeats()
			raced := c1.rebalancing.Load() + c2.rebalancing.Load() + c3.rebalancing.Load()
			if repeats > 0 && raced == 0 {
				t.Fatalf("%d records consumed twice with no commit refused during a rebalance", repeats)
			}
			t.Logf("repeats %d, commits refused during a rebalance %d", repeats, raced)
		})
	}
}

// producePaced produces total records in batches of batch every pause, so a stream lasts through
// every step of a test.
func producePaced(prod *kgo.Client, total, batch int, pause, timeout time.Duration) <-chan error {
	produced := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		for i := 0; i < total; i += batch {
			var recs []*kgo.Record
			for j := i; j < min(i+batch, total); j++ {
				recs = append(recs, &kgo.Record{Key: []byte(strconv.Itoa(j % 17)), Value: []byte(strconv.Itoa(j))})
			}
			if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				produced <- err
				return
			}
			<-time.After(pause)
		}
		produced <- nil
	}()
	return produced
}

// TestConsumerGroupOnlineUpgradeRefused: an online upgrade is refused GROUP_MAX_SIZE_REACHED when
// the classic group has no room left under group.consumer.max.size, and GROUP_ID_NOT_FOUND when
// the policy disables it; the classic group is left untouched.
func TestConsumerGroupOnlineUpgradeRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  func(*configs.Config)
		code error
	}{
		{"max-size", func(c *configs.Config) { c.ConsumerMaxSize = 1 }, kerr.GroupMaxSizeReached},
		{"disabled", func(c *configs.Config) { c.ConsumerMigrationPolicy = "disabled" }, kerr.GroupIDNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := newTestBroker(t, fast848, tc.opt)
			admCl := grpClient(t, addr)
			defer admCl.Close()
			adm := kadm.NewClient(admCl)
			grpCreateTopic(t, adm, "refused", 2)
			seen := &consumedSet{seen: map[string]bool{}}
			c1 := startClassicConsumer(t, addr, "gref", "refused", kgo.CooperativeStickyBalancer(), seen)
			defer c1.stop()
			checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
				dg, err := adm.DescribeGroups(context.Background(), "gref")
				if err != nil {
					return err
				}
				if dg["gref"].State != "Stable" {
					return fmt.Errorf("classic group %s", dg["gref"].State)
				}
				return nil
			})
			errs := make(chan error, 1)
			c3 := grpClient(t, addr, kgo.ConsumerGroup("gref"), kgo.ConsumeTopics("refused"), kgo.ServerSideBalancer(),
				kgo.Balancers(kgo.CooperativeStickyBalancer()),
				kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
					select {
					case errs <- errors.New("the 848 consumer was assigned partitions"):
					default:
					}
				}))
			defer c3.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			go func() {
				for ctx.Err() == nil {
					fs := c3.PollFetches(ctx)
					fs.EachError(func(_ string, _ int32, err error) {
						if errors.Is(err, tc.code) {
							select {
							case errs <- nil:
							default:
							}
						}
					})
				}
			}()
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			dg, err := adm.DescribeGroups(context.Background(), "gref")
			if err != nil || dg["gref"].State != "Stable" || len(dg["gref"].Members) != 1 {
				t.Fatalf("classic group after the refusal: %+v %v", dg["gref"], err)
			}
		})
	}
}
