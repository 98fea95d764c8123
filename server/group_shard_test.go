package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/group"
)

// rawOffsetCommit sends one simple (generation -1) OffsetCommit v8 on a raw connection and
// returns the partition's code.
func rawOffsetCommit(t *testing.T, rc *rawConn, grp, topic string, offset int64) int16 {
	t.Helper()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version = 8
	req.Group, req.Generation = grp, -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := fxRoundTrip[*kmsg.OffsetCommitResponse](t, rc, req)
	return resp.Topics[0].Partitions[0].ErrorCode
}

// TestGroupShardReleaseReloadUnderCommits releases and reloads a group shard on a running broker
// while a kadm client keeps committing: raw requests meanwhile get NOT_COORDINATOR, the client
// rides it out (it retries), and every commit it saw acknowledged is fetched after the reload.
func TestGroupShardReleaseReloadUnderCommits(t *testing.T) {
	cfg := testConfig(t)
	fastGroups(&cfg)
	tb := startTestBroker(t, cfg)
	defer tb.stop(t)
	addr := tb.srv.Addr().String()
	cl := grpClient(t, addr)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	grpCreateTopic(t, adm, "t", 1)
	const grp = "moving"
	shard := group.ShardFor(grp)

	var stop atomic.Bool
	var acked atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for o := int64(1); !stop.Load(); o++ {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			offs := kadm.Offsets{}
			offs.Add(kadm.Offset{Topic: "t", Partition: 0, At: o, LeaderEpoch: -1})
			resp, err := adm.CommitOffsets(ctx, grp, offs)
			cancel()
			if err == nil && resp.Error() == nil {
				acked.Store(o)
			}
		}
	}()
	waitCommits := func(what string) {
		base := acked.Load()
		checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
			if acked.Load() < base+10 {
				return fmt.Errorf("%s: %d commits acknowledged", what, acked.Load()-base)
			}
			return nil
		})
	}
	waitCommits("before the release")

	releaseGroupShard(t, tb, shard)
	raw := dialRaw(t, addr)
	if code := rawOffsetCommit(t, raw, grp, "t", 1<<40); code != codec.CodeNotCoordinator {
		t.Fatalf("commit to a released shard: code %d, want NOT_COORDINATOR", code)
	}
	fr := kmsg.NewPtrOffsetFetchRequest()
	fr.Version = 8
	fg := kmsg.NewOffsetFetchRequestGroup()
	fg.Group = grp
	fr.Groups = append(fr.Groups, fg)
	if resp := fxRoundTrip[*kmsg.OffsetFetchResponse](t, raw, fr); resp.Groups[0].ErrorCode != codec.CodeNotCoordinator {
		t.Fatalf("fetch from a released shard: code %d, want NOT_COORDINATOR", resp.Groups[0].ErrorCode)
	}
	loadGroupShard(t, tb, shard, 1)
	waitCommits("after the reload")
	stop.Store(true)
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := adm.FetchOffsets(ctx, grp)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := got.Lookup("t", 0); !ok || o.At != acked.Load() {
		t.Fatalf("fetched %+v (found %v), last acknowledged commit %d", o, ok, acked.Load())
	}
}

// TestGroupIDOver32767BytesInvalidRequest: a flexible-version request can carry a group id
// longer than a Kafka string (int16 length); the broker answers INVALID_REQUEST.
func TestGroupIDOver32767BytesInvalidRequest(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := grpClient(t, addr)
	defer cl.Close()
	grpCreateTopic(t, kadm.NewClient(cl), "t", 1)
	raw := dialRaw(t, addr)
	long := strings.Repeat("g", group.MaxIDBytes+1)
	if code := rawOffsetCommit(t, raw, long, "t", 1); code != codec.CodeInvalidRequest {
		t.Fatalf("OffsetCommit: code %d, want INVALID_REQUEST", code)
	}
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Version = 4
	hb.Group, hb.MemberID, hb.Generation = "g", long, 1
	if resp := fxRoundTrip[*kmsg.HeartbeatResponse](t, raw, hb); resp.ErrorCode != codec.CodeInvalidRequest {
		t.Fatalf("Heartbeat: code %d, want INVALID_REQUEST", resp.ErrorCode)
	}
}

// requestCounter counts the requests a kgo client wrote, by API key (a kgo.HookBrokerWrite).
type requestCounter struct{ n [128]atomic.Int64 }

func (c *requestCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err == nil && key >= 0 && int(key) < len(c.n) {
		c.n[key].Add(1)
	}
}

func (c *requestCounter) get(key int16) int64 { return c.n[key].Load() }

// TestGroupShardReleaseReloadKeepsGeneration: a kgo group consumer rides out a release and
// reload of its group's shard (what a coordinator move does) with the same member id and
// generation and no new assignment: the group's metadata is persisted at release and the
// reloaded coordinator serves the generation, so the consumer's heartbeats go on succeeding.
func TestGroupShardReleaseReloadKeepsGeneration(t *testing.T) {
	cfg := testConfig(t)
	fastGroups(&cfg)
	tb := startTestBroker(t, cfg)
	defer tb.stop(t)
	addr := tb.srv.Addr().String()
	admCl := grpClient(t, addr)
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	grpCreateTopic(t, adm, "t", 2)
	const grp = "keeps-generation"
	shard := group.ShardFor(grp)

	var assigned, revoked, lost atomic.Int32
	reqs := &requestCounter{}
	cl := grpClient(t, addr,
		kgo.ConsumerGroup(grp), kgo.ConsumeTopics("t"),
		kgo.HeartbeatInterval(50*time.Millisecond), kgo.SessionTimeout(6*time.Second),
		kgo.WithHooks(reqs),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { assigned.Add(1) }),
		kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) { revoked.Add(1) }),
		kgo.OnPartitionsLost(func(context.Context, *kgo.Client, map[string][]int32) { lost.Add(1) }),
	)
	defer cl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	defer func() { cancel(); cl.Close(); <-polled }()

	describe := func() (kadm.DescribedGroup, error) {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		ds, err := adm.DescribeGroups(dctx, grp)
		if err != nil {
			return kadm.DescribedGroup{}, err
		}
		d := ds[grp]
		return d, d.Err
	}
	var member0 string
	var gen0 int32
	checkFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if assigned.Load() == 0 {
			return errors.New("not assigned yet")
		}
		if d, err := describe(); err != nil || d.State != "Stable" {
			return fmt.Errorf("group %s (%v)", d.State, err)
		}
		member0, gen0 = cl.GroupMetadata()
		return nil
	})
	assigned0 := assigned.Load()

	releaseGroupShard(t, tb, shard)
	// The consumer notices: a heartbeat answered NOT_COORDINATOR makes it look the coordinator
	// up again (FindCoordinator), and it keeps retrying while the shard is away.
	find0 := reqs.get(int16(kmsg.FindCoordinator))
	checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if reqs.get(int16(kmsg.FindCoordinator)) < find0+2 {
			return errors.New("the consumer has not looked the coordinator up again")
		}
		return nil
	})
	loadGroupShard(t, tb, shard, 2)
	hb0 := reqs.get(int16(kmsg.Heartbeat))
	checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if reqs.get(int16(kmsg.Heartbeat)) < hb0+5 {
			return errors.New("fewer than 5 heartbeats since the reload")
		}
		return nil
	})
	if m, g := cl.GroupMetadata(); m != member0 || g != gen0 {
		t.Fatalf("after the reload: member %s generation %d, before: %s %d", m, g, member0, gen0)
	}
	if a, r, l := assigned.Load(), revoked.Load(), lost.Load(); a != assigned0 || r != 0 || l != 0 {
		t.Fatalf("the consumer rebalanced: assigned %d (before %d), revoked %d, lost %d", a, assigned0, r, l)
	}
	d, err := describe()
	if err != nil || d.State != "Stable" || len(d.Members) != 1 || d.Members[0].MemberID != member0 {
		t.Fatalf("after the reload: %+v (%v)", d, err)
	}
}

// releaseGroupShard releases group shard n of tb (a coordinator move's first half) and waits.
func releaseGroupShard(t *testing.T, tb *testBroker, n int) {
	t.Helper()
	done := make(chan error, 1)
	tb.Groups.ReleaseShard(n, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// loadGroupShard loads group shard n of tb at epoch and waits.
func loadGroupShard(t *testing.T, tb *testBroker, n int, epoch int32) {
	t.Helper()
	done := make(chan error, 1)
	tb.Groups.LoadShard(n, epoch, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
