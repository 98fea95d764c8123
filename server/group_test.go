package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/storage"
)

// wireGroups opens the offset store and the group coordinator for a test broker, sets
// deps.Groups, and returns the closer (coordinator first, then the store), to run after the
// server is closed.
func wireGroups(t *testing.T, cfg configs.Config, log *zap.Logger, deps *Deps) func() {
	t.Helper()
	offsets, err := storage.OpenGroupStore(cfg.DataDir, log)
	if err != nil {
		t.Fatal(err)
	}
	gc := group.New(GroupConfig(cfg), offsets, log)
	if err := gc.Start(); err != nil {
		t.Fatal(err)
	}
	deps.Groups = gc
	return func() {
		gc.Close()
		if err := offsets.Close(); err != nil {
			t.Errorf("offset store close: %v", err)
		}
	}
}

// fastGroups makes rebalances quick in tests.
func fastGroups(c *configs.Config) {
	c.GroupInitialRebalanceDelay = 50 * time.Millisecond
	c.GroupMinSessionTimeout = 100 * time.Millisecond
}

func grpClient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.RetryTimeout(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func grpCreateTopic(t *testing.T, adm *kadm.Client, topic string, n int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := adm.CreateTopic(ctx, n, 1, nil, topic)
	if err != nil {
		t.Fatalf("create %s: %v (%s)", topic, err, r.ErrMessage)
	}
}

// groupConsumer consumes with manual commits after every poll and BlockRebalanceOnPoll, so no
// record is handed to two consumers even across rebalances: a rebalance cannot revoke a
// partition between a poll and the commit of what it returned.
type groupConsumer struct {
	cl   *kgo.Client
	done chan struct{}
	n    atomic.Int64 // records consumed
}

func startGroupConsumer(t *testing.T, addr, grp, topic string, balancer kgo.GroupBalancer, seen *consumedSet, extra ...kgo.Opt) *groupConsumer {
	opts := append([]kgo.Opt{
		kgo.ConsumerGroup(grp),
		kgo.ConsumeTopics(topic),
		kgo.Balancers(balancer),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.SessionTimeout(10 * time.Second),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}, extra...)
	gc := &groupConsumer{cl: grpClient(t, addr, opts...), done: make(chan struct{})}
	go func() {
		defer close(gc.done)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			fs := gc.cl.PollRecords(ctx, 50)
			cancel()
			if fs.IsClientClosed() {
				return
			}
			fs.EachRecord(func(r *kgo.Record) { seen.add(t, r); gc.n.Add(1) })
			if fs.NumRecords() > 0 {
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := gc.cl.CommitUncommittedOffsets(cctx); err != nil {
					t.Errorf("commit: %v", err)
				}
				ccancel()
			}
			gc.cl.AllowRebalance()
		}
	}()
	return gc
}

// stop closes the consumer (leaving the group unless static) and waits for its loop.
func (gc *groupConsumer) stop() {
	gc.cl.Close()
	<-gc.done
}

type consumedSet struct {
	mu   sync.Mutex
	seen map[string]bool
	dups int
}

func (s *consumedSet) add(t *testing.T, r *kgo.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := fmt.Sprintf("%d/%d", r.Partition, r.Offset)
	if s.seen[k] {
		s.dups++
		t.Errorf("record %s consumed twice", k)
	}
	s.seen[k] = true
}

func (s *consumedSet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// Three consumers in one group, joining and leaving while records are produced: every record is
// consumed exactly once, and the final commits equal the end offsets.
func TestGroupConsumeExactlyOnceAcrossRebalances(t *testing.T) {
	for _, tc := range []struct {
		name     string
		balancer kgo.GroupBalancer
	}{
		{"range", kgo.RangeBalancer()},
		{"cooperative-sticky", kgo.CooperativeStickyBalancer()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := newTestBroker(t, fastGroups)
			const topic, grp, total = "events", "g", 3000
			prod := grpClient(t, addr, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
			defer prod.Close()
			adm := kadm.NewClient(prod)
			grpCreateTopic(t, adm, topic, 6)

			// Produce in the background, in bursts, so consumption is mid-stream throughout.
			produced := produceBursts(prod, total, 30*time.Second)

			seen := &consumedSet{seen: map[string]bool{}}
			waitCount := func(n int) {
				t.Helper()
				checkFor(t, 30*time.Second, 10*time.Millisecond, func() error {
					if c := seen.count(); c < n {
						return fmt.Errorf("consumed %d of %d", c, n)
					}
					return nil
				})
			}
			c1 := startGroupConsumer(t, addr, grp, topic, tc.balancer, seen)
			waitCount(300)
			c2 := startGroupConsumer(t, addr, grp, topic, tc.balancer, seen)
			waitCount(900)
			c3 := startGroupConsumer(t, addr, grp, topic, tc.balancer, seen)
			waitCount(1500)
			c1.stop() // leaves mid-stream
			waitCount(2100)
			if err := <-produced; err != nil {
				t.Fatal(err)
			}
			waitCount(total)

			// All three rejoined; the survivors own everything and committed the end offsets.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
				dg, err := adm.DescribeGroups(ctx, grp)
				if err != nil {
					return err
				}
				g := dg[grp]
				if g.State != "Stable" || len(g.Members) != 2 {
					return fmt.Errorf("group %s with %d members", g.State, len(g.Members))
				}
				offs, err := adm.FetchOffsets(ctx, grp)
				if err != nil {
					return err
				}
				ends, err := adm.ListEndOffsets(ctx, topic)
				if err != nil {
					return err
				}
				var bad error
				ends.Each(func(e kadm.ListedOffset) {
					o, ok := offs.Lookup(topic, e.Partition)
					if !ok || o.At != e.Offset {
						bad = fmt.Errorf("partition %d committed %v, end %d", e.Partition, o.At, e.Offset)
					}
				})
				return bad
			})
			c2.stop()
			c3.stop()
			if c1.n.Load() == 0 || c2.n.Load() == 0 || c3.n.Load() == 0 {
				t.Fatalf("a consumer never got records: %d %d %d", c1.n.Load(), c2.n.Load(), c3.n.Load())
			}
			if seen.dups != 0 || seen.count() != total {
				t.Fatalf("consumed %d distinct, %d duplicates; want %d, 0", seen.count(), seen.dups, total)
			}
			dg, err := adm.DescribeGroups(ctx, grp)
			if err != nil || dg[grp].State != "Empty" {
				t.Fatalf("after every consumer left: %+v %v", dg[grp], err)
			}
		})
	}
}

// A static member that restarts within its session timeout gets its partitions back and the
// other member never sees a rebalance.
func TestGroupStaticMemberRestartNoRebalance(t *testing.T) {
	addr, _ := newTestBroker(t, fastGroups)
	const topic, grp = "static", "sg"
	admCl := grpClient(t, addr)
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	grpCreateTopic(t, adm, topic, 4)

	var mu sync.Mutex
	events := map[string][]string{}
	track := func(name string) []kgo.Opt {
		return []kgo.Opt{
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
				mu.Lock()
				events[name] = append(events[name], fmt.Sprint("assigned ", m[topic]))
				mu.Unlock()
			}),
			kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
				mu.Lock()
				events[name] = append(events[name], fmt.Sprint("revoked ", m[topic]))
				mu.Unlock()
			}),
		}
	}
	seen := &consumedSet{seen: map[string]bool{}}
	a := startGroupConsumer(t, addr, grp, topic, kgo.RangeBalancer(), seen, append(track("a"), kgo.InstanceID("a"))...)
	b := startGroupConsumer(t, addr, grp, topic, kgo.RangeBalancer(), seen, append(track("b"), kgo.InstanceID("b"))...)
	defer b.stop()
	var genBefore int32
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(events["a"]) == 0 || len(events["b"]) == 0 {
			return fmt.Errorf("not both assigned: %v", events)
		}
		last := events["b"][len(events["b"])-1]
		if last != "assigned [2 3]" && last != "assigned [0 1]" {
			return fmt.Errorf("b: %v", events["b"])
		}
		_, genBefore = b.cl.GroupMetadata()
		return nil
	})
	mu.Lock()
	aAssigned := events["a"][len(events["a"])-1]
	bEvents := len(events["b"])
	mu.Unlock()

	a.stop() // a static member does not leave on close
	a2 := startGroupConsumer(t, addr, grp, topic, kgo.RangeBalancer(), seen, append(track("a2"), kgo.InstanceID("a"))...)
	defer a2.stop()
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(events["a2"]) == 0 {
			return errors.New("restarted member has no assignment yet")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if got := events["a2"][0]; got != aAssigned {
		t.Fatalf("restarted member got %q, had %q", got, aAssigned)
	}
	if len(events["b"]) != bEvents {
		t.Fatalf("the other member saw a rebalance: %v", events["b"])
	}
	if _, gen := b.cl.GroupMetadata(); gen != genBefore {
		t.Fatalf("generation moved from %d to %d", genBefore, gen)
	}
}

// Committed offsets are durable: after the broker restarts on the same data dir, OffsetFetch
// returns them (with leader epoch and metadata) without any member rejoining, and the group is
// listed and described.
func TestGroupOffsetsSurviveRestart(t *testing.T) {
	cfg := configs.Default()
	cfg.Listeners = "127.0.0.1:0"
	cfg.MetricsAddr = ""
	cfg.DataDir = t.TempDir()
	cfg.NumEventLoops = 2
	fastGroups(&cfg)
	tb := startTestBroker(t, cfg)
	addr := tb.srv.Addr().String()
	cl := grpClient(t, addr)
	adm := kadm.NewClient(cl)
	grpCreateTopic(t, adm, "t", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "t", Partition: 0, At: 42, LeaderEpoch: 3, Metadata: "m0"})
	offs.Add(kadm.Offset{Topic: "t", Partition: 2, At: 7, LeaderEpoch: -1})
	resp, err := adm.CommitOffsets(ctx, "manual", offs)
	if err != nil || resp.Error() != nil {
		t.Fatalf("commit: %v %v", err, resp.Error())
	}
	cl.Close()
	tb.stop(t)

	tb = startTestBroker(t, cfg)
	defer tb.stop(t)
	cl = grpClient(t, tb.srv.Addr().String())
	defer cl.Close()
	adm = kadm.NewClient(cl)
	got, err := adm.FetchOffsets(ctx, "manual")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := got.Lookup("t", 0); !ok || o.At != 42 || o.LeaderEpoch != 3 || o.Metadata != "m0" {
		t.Fatalf("t/0 after restart: %+v %v", o, ok)
	}
	if o, ok := got.Lookup("t", 2); !ok || o.At != 7 {
		t.Fatalf("t/2 after restart: %+v %v", o, ok)
	}
	if _, ok := got.Lookup("t", 1); ok {
		t.Fatal("t/1 was never committed")
	}
	// The oldest served OffsetFetch version, asking for explicit partitions.
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Version = 1
	req.Group = "manual"
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = "t", []int32{0, 1}
	req.Topics = append(req.Topics, rt)
	raw := dialRaw(t, tb.srv.Addr().String())
	fr := fxRoundTrip[*kmsg.OffsetFetchResponse](t, raw, req)
	if p := fr.Topics[0].Partitions; p[0].Offset != 42 || p[1].Offset != -1 || p[0].ErrorCode != 0 {
		t.Fatalf("v1 fetch: %+v", fr.Topics)
	}
	lg, err := adm.ListGroups(ctx)
	if err != nil || len(lg.Groups()) != 1 || lg.Groups()[0] != "manual" {
		t.Fatalf("list after restart: %v %v", lg.Groups(), err)
	}
	dg, err := adm.DescribeGroups(ctx, "manual")
	if err != nil || dg["manual"].State != "Empty" {
		t.Fatalf("describe after restart: %+v %v", dg, err)
	}
}

// Bad input: unknown group / member / generation combinations get Kafka's codes, malformed
// assignment bytes are passed through, FindCoordinator answers both key types.
func TestGroupBadInput(t *testing.T) {
	e := newAdminEnv(t, fastGroups)
	e.create(t, "t", 2, nil)
	code := func(what string, got int16, want error) {
		t.Helper()
		if err := kerr.ErrorForCode(got); !errors.Is(err, want) && !(err == nil && want == nil) {
			t.Fatalf("%s: got %v, want %v", what, err, want)
		}
	}

	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Version, hb.Group, hb.MemberID, hb.Generation = 4, "nope", "m", 1
	code("heartbeat unknown group", e.rawRequest(t, hb).(*kmsg.HeartbeatResponse).ErrorCode, kerr.UnknownMemberID)

	jg := kmsg.NewPtrJoinGroupRequest()
	jg.Version, jg.Group, jg.SessionTimeoutMillis, jg.RebalanceTimeoutMillis, jg.ProtocolType = 9, "g", 6000, 6000, "consumer"
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = "range", []byte{0xde, 0xad}
	jg.Protocols = append(jg.Protocols, p)
	jr := e.rawRequest(t, jg).(*kmsg.JoinGroupResponse)
	code("first join", jr.ErrorCode, kerr.MemberIDRequired)
	jg.MemberID = jr.MemberID
	jr = e.rawRequest(t, jg).(*kmsg.JoinGroupResponse)
	code("second join", jr.ErrorCode, nil)
	if jr.LeaderID != jr.MemberID || len(jr.Members) != 1 || string(jr.Members[0].ProtocolMetadata) != "\xde\xad" {
		t.Fatalf("join: %+v", jr)
	}
	sg := kmsg.NewPtrSyncGroupRequest()
	sg.Version, sg.Group, sg.MemberID, sg.Generation = 5, "g", jr.MemberID, jr.Generation
	ga := kmsg.NewSyncGroupRequestGroupAssignment()
	ga.MemberID, ga.MemberAssignment = jr.MemberID, []byte{0xff, 0xff, 0xff, 0x7f, 1}
	sg.GroupAssignment = append(sg.GroupAssignment, ga)
	sr := e.rawRequest(t, sg).(*kmsg.SyncGroupResponse)
	if sr.ErrorCode != 0 || string(sr.MemberAssignment) != "\xff\xff\xff\x7f\x01" {
		t.Fatalf("sync: %+v", sr)
	}
	hb.Group, hb.MemberID, hb.Generation = "g", jr.MemberID, jr.Generation+1
	code("heartbeat wrong generation", e.rawRequest(t, hb).(*kmsg.HeartbeatResponse).ErrorCode, kerr.IllegalGeneration)
	hb.MemberID = "stranger"
	code("heartbeat unknown member", e.rawRequest(t, hb).(*kmsg.HeartbeatResponse).ErrorCode, kerr.UnknownMemberID)

	commit := func(version int16, grp string, gen int32, member, topic string) int16 {
		oc := kmsg.NewPtrOffsetCommitRequest()
		oc.Version, oc.Group, oc.Generation, oc.MemberID = version, grp, gen, member
		ot := kmsg.NewOffsetCommitRequestTopic()
		ot.Topic = topic
		op := kmsg.NewOffsetCommitRequestTopicPartition()
		op.Offset = 5
		ot.Partitions = append(ot.Partitions, op)
		oc.Topics = append(oc.Topics, ot)
		return e.rawRequest(t, oc).(*kmsg.OffsetCommitResponse).Topics[0].Partitions[0].ErrorCode
	}
	code("commit member", commit(9, "g", jr.Generation, jr.MemberID, "t"), nil)
	code("commit v2 member", commit(2, "g", jr.Generation, jr.MemberID, "t"), nil)
	code("commit old generation", commit(9, "g", jr.Generation-1, jr.MemberID, "t"), kerr.IllegalGeneration)
	code("commit unknown member", commit(9, "g", jr.Generation, "stranger", "t"), kerr.UnknownMemberID)
	code("simple commit to active group", commit(9, "g", -1, "", "t"), kerr.UnknownMemberID)
	code("generation for unknown group", commit(9, "nope", 3, "m", "t"), kerr.IllegalGeneration)
	code("unknown topic", commit(9, "g", jr.Generation, jr.MemberID, "missing"), kerr.UnknownTopicOrPartition)

	// OffsetFetch v8 batched, require_stable, unknown group → -1.
	of := kmsg.NewPtrOffsetFetchRequest()
	of.Version, of.RequireStable = 8, true
	for _, g := range []string{"g", "nope"} {
		rg := kmsg.NewOffsetFetchRequestGroup()
		rg.Group = g
		rgt := kmsg.NewOffsetFetchRequestGroupTopic()
		rgt.Topic, rgt.Partitions = "t", []int32{0}
		rg.Topics = append(rg.Topics, rgt)
		of.Groups = append(of.Groups, rg)
	}
	ofr := e.rawRequest(t, of).(*kmsg.OffsetFetchResponse)
	if ofr.Groups[0].Topics[0].Partitions[0].Offset != 5 || ofr.Groups[1].Topics[0].Partitions[0].Offset != -1 || ofr.Groups[1].ErrorCode != 0 {
		t.Fatalf("offset fetch v8: %+v", ofr.Groups)
	}

	// FindCoordinator: group and transaction keys are ours, other key types are invalid.
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.Version, fc.CoordinatorKeys = 5, []string{"g", "x"}
	for kt, want := range map[int8]error{0: nil, 1: nil, 2: kerr.InvalidRequest} {
		fc.CoordinatorType = kt
		fr := e.rawRequest(t, fc).(*kmsg.FindCoordinatorResponse)
		for _, c := range fr.Coordinators {
			code(fmt.Sprintf("find coordinator type %d", kt), c.ErrorCode, want)
			if want == nil && (c.NodeID != 0 || c.Port != int32(e.s.Addr().Port)) {
				t.Fatalf("coordinator %+v", c)
			}
		}
	}
	fc0 := kmsg.NewPtrFindCoordinatorRequest()
	fc0.Version, fc0.CoordinatorKey = 0, "g"
	if fr := e.rawRequest(t, fc0).(*kmsg.FindCoordinatorResponse); fr.ErrorCode != 0 || fr.Port != int32(e.s.Addr().Port) {
		t.Fatalf("find coordinator v0: %+v", fr)
	}

	// Admin: deleting an active group fails, an unknown one is not found; OffsetDelete guards.
	dr, err := e.adm.DeleteGroups(e.ctx, "g", "nope")
	if err != nil || !errors.Is(dr["g"].Err, kerr.NonEmptyGroup) || !errors.Is(dr["nope"].Err, kerr.GroupIDNotFound) {
		t.Fatalf("delete groups: %+v %v", dr, err)
	}
	od := kmsg.NewPtrOffsetDeleteRequest()
	od.Group = "nope"
	odr := e.rawRequest(t, od).(*kmsg.OffsetDeleteResponse)
	code("offset delete unknown group", odr.ErrorCode, kerr.GroupIDNotFound)

	lg := kmsg.NewPtrListGroupsRequest()
	lg.Version, lg.StatesFilter = 5, []string{"stable"}
	lr := e.rawRequest(t, lg).(*kmsg.ListGroupsResponse)
	if len(lr.Groups) != 1 || lr.Groups[0].Group != "g" || lr.Groups[0].GroupState != "Stable" || lr.Groups[0].GroupType != "classic" {
		t.Fatalf("list groups: %+v", lr.Groups)
	}

	// The member leaves; the group is Empty, deletable, and its offsets go with it.
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Version, lv.Group, lv.MemberID = 0, "g", jr.MemberID
	code("leave v0", e.rawRequest(t, lv).(*kmsg.LeaveGroupResponse).ErrorCode, nil)
	code("leave v0 again", e.rawRequest(t, lv).(*kmsg.LeaveGroupResponse).ErrorCode, kerr.UnknownMemberID)
	dr, err = e.adm.DeleteGroups(e.ctx, "g")
	if err != nil || dr["g"].Err != nil {
		t.Fatalf("delete empty group: %+v %v", dr, err)
	}
	fo, err := e.adm.FetchOffsets(e.ctx, "g")
	if err != nil || len(fo) != 0 {
		t.Fatalf("offsets after delete: %+v %v", fo, err)
	}
}

// TestDescribeUnknownGroupByVersion: v0-5 answer an unknown group as Dead with no error, v6
// (KIP-1043) as GROUP_ID_NOT_FOUND — what Kafka 4.x's kafka-consumer-groups expects.
func TestDescribeUnknownGroupByVersion(t *testing.T) {
	addr, _ := newTestBroker(t)
	rc := dialRaw(t, addr)
	for _, v := range []int16{5, 6} {
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Version = v
		req.Groups = []string{"no-such-group"}
		resp := fxRoundTrip[*kmsg.DescribeGroupsResponse](t, rc, req)
		g := resp.Groups[0]
		switch {
		case v == 5 && (g.ErrorCode != 0 || g.State != "Dead"):
			t.Fatalf("v5: %+v", g)
		case v == 6 && (g.ErrorCode != kerr.GroupIDNotFound.Code || g.ErrorMessage == nil):
			t.Fatalf("v6: %+v", g)
		}
	}
}

// produceBursts produces the values 0..total-1 (keys value%17) in bursts of 100, 20 ms apart, in
// the background, so a group consumes mid-stream throughout; the channel gets the outcome.
func produceBursts(prod *kgo.Client, total int, timeout time.Duration) <-chan error {
	produced := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		for i := 0; i < total; i += 100 {
			var recs []*kgo.Record
			for j := i; j < min(i+100, total); j++ {
				recs = append(recs, &kgo.Record{Key: []byte(strconv.Itoa(j % 17)), Value: []byte(strconv.Itoa(j))})
			}
			if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				produced <- err
				return
			}
			<-time.After(20 * time.Millisecond)
		}
		produced <- nil
	}()
	return produced
}
