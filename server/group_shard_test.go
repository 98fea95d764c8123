package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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

	released := make(chan error, 1)
	tb.Groups.ReleaseShard(shard, func(err error) { released <- err })
	if err := <-released; err != nil {
		t.Fatal(err)
	}
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
	loaded := make(chan error, 1)
	tb.Groups.LoadShard(shard, 1, func(err error) { loaded <- err })
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
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
