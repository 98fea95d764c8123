package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/acl"
	"github.com/kaas-go/kaas/coord/group"
)

// addAllowingRepeat records r, counting rather than failing on a record seen before (see
// consumer848).
func (s *consumedSet) addAllowingRepeat(r *kgo.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := fmt.Sprintf("%d/%d", r.Partition, r.Offset)
	if s.seen[k] {
		s.dups++
	}
	s.seen[k] = true
}

func (s *consumedSet) repeats() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dups
}

// fast848 makes KIP-848 heartbeats quick in tests (the broker sets the interval).
func fast848(c *configs.Config) {
	fastGroups(c)
	c.ConsumerMinHeartbeatInterval = 50 * time.Millisecond
	c.ConsumerHeartbeatInterval = 100 * time.Millisecond
	c.ConsumerMinSessionTimeout = 500 * time.Millisecond
	c.ConsumerSessionTimeout = 10 * time.Second
}

// ownership records which consumer holds each partition according to its own callbacks, and
// fails the test if a partition is assigned to one consumer while another still holds it: KIP-848
// must revoke before it assigns.
type ownership struct {
	t      *testing.T
	mu     sync.Mutex
	owner  map[string]string // "topic/partition" → consumer name
	assign map[string]int    // consumer → times it was assigned something
}

func newOwnership(t *testing.T) *ownership {
	return &ownership{t: t, owner: map[string]string{}, assign: map[string]int{}}
}

func (o *ownership) opts(name string) []kgo.Opt {
	release := func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
		o.mu.Lock()
		defer o.mu.Unlock()
		for t, parts := range ps {
			for _, p := range parts {
				k := t + "/" + strconv.Itoa(int(p))
				if o.owner[k] == name {
					delete(o.owner, k)
				}
			}
		}
	}
	return []kgo.Opt{
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.assign[name]++
			for t, parts := range ps {
				for _, p := range parts {
					k := t + "/" + strconv.Itoa(int(p))
					if cur, ok := o.owner[k]; ok && cur != name {
						o.t.Errorf("partition %s assigned to %s while %s still holds it", k, name, cur)
					}
					o.owner[k] = name
				}
			}
		}),
		kgo.OnPartitionsRevoked(release),
		kgo.OnPartitionsLost(release),
	}
}

// held returns the partitions name holds.
func (o *ownership) held(name string) map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]bool{}
	for k, v := range o.owner {
		if v == name {
			out[k] = true
		}
	}
	return out
}

// assignments is how many times name was assigned partitions.
func (o *ownership) assignments(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.assign[name]
}

func (o *ownership) total() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.owner)
}

func describe848(t *testing.T, cl *kgo.Client, grp string) kmsg.ConsumerGroupDescribeResponseGroup {
	t.Helper()
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{grp}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Groups[0]
}

// consumer848 polls and commits after every poll with BlockRebalanceOnPoll, like groupConsumer,
// and counts commits franz-go answers REBALANCE_IN_PROGRESS. With Apache 4.1's strict member-epoch
// check (KIP-1251's per-partition assignment epochs come later), an OffsetCommit in flight while
// the member's epoch moves is STALE_MEMBER_EPOCH; franz-go retries it at the new epoch without the
// partitions it is revoking by then, and reports those REBALANCE_IN_PROGRESS. Their records may
// then be read again by the next owner (at-least-once), which is the only way a record may be
// consumed twice here.
type consumer848 struct {
	cl          *kgo.Client
	done        chan struct{}
	rebalancing atomic.Int64 // commits refused REBALANCE_IN_PROGRESS
}

func startConsumer848(t *testing.T, addr, grp, topic string, balancer kgo.GroupBalancer, seen *consumedSet, extra ...kgo.Opt) *consumer848 {
	opts := append([]kgo.Opt{
		kgo.ConsumerGroup(grp), kgo.ConsumeTopics(topic), kgo.Balancers(balancer), kgo.ServerSideBalancer(),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.RebalanceTimeout(10 * time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond),
	}, extra...)
	return startGroupLoop(t, addr, seen, opts, kerr.RebalanceInProgress)
}

// startGroupLoop runs consumer848's loop (poll, record what was seen, commit, allow a
// rebalance) on a client made with opts. A commit refused with one of racing (it raced a
// rebalance: its records may be read again, at-least-once) is counted in rebalancing; any other
// commit error fails the test.
func startGroupLoop(t *testing.T, addr string, seen *consumedSet, opts []kgo.Opt, racing ...error) *consumer848 {
	c := &consumer848{cl: grpClient(t, addr, opts...), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			fs := c.cl.PollRecords(ctx, 50)
			cancel()
			if fs.IsClientClosed() {
				return
			}
			fs.EachRecord(func(r *kgo.Record) { seen.addAllowingRepeat(r) })
			if fs.NumRecords() > 0 {
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := c.cl.CommitUncommittedOffsets(cctx)
				switch {
				case err == nil:
				case slices.ContainsFunc(racing, func(e error) bool { return errors.Is(err, e) }):
					c.rebalancing.Add(1)
				default:
					t.Errorf("commit: %v", err)
				}
				ccancel()
			}
			c.cl.AllowRebalance()
		}
	}()
	return c
}

func (c *consumer848) stop() {
	c.cl.Close()
	<-c.done
}

// TestConsumerGroup848MembersJoinAndLeave: three KIP-848 consumers (franz-go's server-side
// balancer path) join and leave mid-stream; partitions are only assigned once their previous
// owner revoked them, no record is consumed twice unless a commit was refused as described at
// consumer848, every record is consumed, and the group ends Stable with every partition assigned
// to the remaining members.
func TestConsumerGroup848MembersJoinAndLeave(t *testing.T) {
	for _, tc := range []struct {
		name     string
		balancer kgo.GroupBalancer
		assignor string
	}{
		{"uniform", kgo.CooperativeStickyBalancer(), "uniform"},
		{"range", kgo.RangeBalancer(), "range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := newTestBroker(t, fast848)
			const topic, grp, total = "events848", "g848", 3000
			prod := grpClient(t, addr, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
			defer prod.Close()
			adm := kadm.NewClient(prod)
			grpCreateTopic(t, adm, topic, 6)
			produced := produceBursts(prod, total, 60*time.Second)
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
			var consumers []*consumer848
			start := func(name string) *consumer848 {
				c := startConsumer848(t, addr, grp, topic, tc.balancer, seen, own.opts(name)...)
				consumers = append(consumers, c)
				return c
			}
			c1 := start("c1")
			waitCount(300)
			c2 := start("c2")
			waitCount(900)
			c3 := start("c3")
			waitCount(1500)
			c1.stop()
			waitCount(2100)
			if err := <-produced; err != nil {
				t.Fatal(err)
			}
			waitCount(total)
			checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
				d := describe848(t, prod, grp)
				if d.ErrorCode != 0 {
					return fmt.Errorf("describe: %d", d.ErrorCode)
				}
				if d.State != "Stable" || len(d.Members) != 2 || d.AssignorName != tc.assignor {
					return fmt.Errorf("state %s with %d members, assignor %s", d.State, len(d.Members), d.AssignorName)
				}
				n := 0
				for _, m := range d.Members {
					if m.MemberEpoch != d.Epoch {
						return fmt.Errorf("member %s at epoch %d, group at %d", m.MemberID, m.MemberEpoch, d.Epoch)
					}
					for _, tp := range m.Assignment.TopicPartitions {
						if tp.Topic != topic {
							return fmt.Errorf("assignment names topic %q", tp.Topic)
						}
						n += len(tp.Partitions)
					}
				}
				if n != 6 {
					return fmt.Errorf("%d partitions assigned, want 6", n)
				}
				if own.total() != 6 {
					return fmt.Errorf("consumers hold %d partitions by their callbacks, want 6", own.total())
				}
				return nil
			})
			if own.assignments("c1") == 0 || own.assignments("c2") == 0 || own.assignments("c3") == 0 {
				t.Fatalf("a consumer was never assigned anything: c1 %d, c2 %d, c3 %d",
					own.assignments("c1"), own.assignments("c2"), own.assignments("c3"))
			}
			// ConsumerGroupDescribe and ListGroups see a consumer group; the classic
			// DescribeGroups does not describe it (Apache 4.1: GROUP_ID_NOT_FOUND at v6).
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cg, err := adm.DescribeConsumerGroups(ctx, grp)
			if err != nil {
				t.Fatal(err)
			}
			if g := cg[grp]; g.Err != nil || g.State != "Stable" || len(g.Members) != 2 {
				t.Fatalf("ConsumerGroupDescribe: err %v state %q members %d", g.Err, g.State, len(g.Members))
			}
			dg, err := adm.DescribeGroups(ctx, grp)
			if err != nil {
				t.Fatal(err)
			}
			if g := dg[grp]; !errors.Is(g.Err, kerr.GroupIDNotFound) || g.State != "Dead" || len(g.Members) != 0 {
				t.Fatalf("DescribeGroups of a consumer group: err %v state %q members %d", g.Err, g.State, len(g.Members))
			}
			lreq := kmsg.NewPtrListGroupsRequest()
			lreq.TypesFilter = []string{"consumer"}
			lresp, err := lreq.RequestWith(ctx, prod)
			if err != nil {
				t.Fatal(err)
			}
			if len(lresp.Groups) != 1 || lresp.Groups[0].Group != grp || lresp.Groups[0].GroupType != "consumer" {
				t.Fatalf("ListGroups(consumer): %+v", lresp.Groups)
			}
			lreq.TypesFilter = []string{"classic"}
			if lresp, err = lreq.RequestWith(ctx, prod); err != nil || len(lresp.Groups) != 0 {
				t.Fatalf("ListGroups(classic): %v %+v", err, lresp.Groups)
			}
			c2.stop()
			c3.stop()
			var refused int64
			for _, c := range consumers {
				refused += c.rebalancing.Load()
			}
			if d := seen.repeats(); d > 0 && refused == 0 {
				t.Fatalf("%d records consumed twice with no commit refused", d)
			} else if d > 0 {
				t.Logf("%d records read again after %d commits were refused REBALANCE_IN_PROGRESS (Apache 4.1 member-epoch check)", d, refused)
			}
			// Committed offsets cover the whole topic.
			committed, err := adm.FetchOffsets(ctx, grp)
			if err != nil {
				t.Fatal(err)
			}
			ends, err := adm.ListEndOffsets(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			ends.Each(func(o kadm.ListedOffset) {
				if c, ok := committed.Lookup(topic, o.Partition); !ok || c.At != o.Offset {
					t.Errorf("%s/%d: committed %v (%v), end %d (%v)", topic, o.Partition, c.At, ok, o.Offset, o.Err)
				}
			})
			if d := describe848(t, prod, grp); d.State != "Empty" {
				t.Fatalf("after every member left: %s", d.State)
			}
		})
	}
}

// TestConsumerGroup848TransactSession is consume-transform-produce (KIP-447) on the KIP-848
// path: copiers join and leave, and every input record reaches the output exactly once under
// read_committed, with the group's committed offsets at the input's end.
func TestConsumerGroup848TransactSession(t *testing.T) {
	addr, _ := newTestBroker(t, fast848)
	r := newEOSCopyRun(t, addr, eosCopyCfg{in: "in848", out: "out848", group: "eos848", txnPrefix: "copier848-",
		inParts: 4, outParts: 2, n: 2000,
		opts: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer()}})
	r.start(0)
	r.waitOut(r.cfg.n / 4)
	r.start(1)
	r.waitOut(r.cfg.n / 2)
	r.stop(0)
	r.checkExactlyOnce(1)
}

// TestConsumerGroup848RegexPicksUpNewTopic: a regex subscription (resolved by the broker, RE2)
// gets a topic created after the member joined.
func TestConsumerGroup848RegexPicksUpNewTopic(t *testing.T) {
	addr, _ := newTestBroker(t, fast848)
	prod := grpClient(t, addr, kgo.ProducerLinger(0))
	defer prod.Close()
	adm := kadm.NewClient(prod)
	grpCreateTopic(t, adm, "rx-a", 2)
	got := make(chan string, 100)
	cl := grpClient(t, addr, kgo.ConsumerGroup("rx"), kgo.ConsumeTopics("rx-.*"), kgo.ConsumeRegex(),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer(),
		kgo.MetadataMaxAge(300*time.Millisecond), kgo.MetadataMinAge(50*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		for {
			fs := cl.PollFetches(ctx)
			if fs.IsClientClosed() || ctx.Err() != nil {
				return
			}
			fs.EachRecord(func(r *kgo.Record) { got <- r.Topic })
		}
	}()
	if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "rx-a", Value: []byte("1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitTopic := func(want string) {
		t.Helper()
		for {
			select {
			case tp := <-got:
				if tp == want {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no record of %s consumed", want)
			}
		}
	}
	waitTopic("rx-a")
	epoch := describe848(t, prod, "rx").Epoch
	grpCreateTopic(t, adm, "rx-b", 3)
	grpCreateTopic(t, adm, "other", 1)
	if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "rx-b", Value: []byte("2")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitTopic("rx-b")
	d := describe848(t, prod, "rx")
	if d.Epoch <= epoch {
		t.Fatalf("group epoch %d after the new topic, was %d", d.Epoch, epoch)
	}
	if len(d.Members) != 1 || d.Members[0].SubscribedTopicRegex == nil {
		t.Fatalf("members: %+v", d.Members)
	}
	for _, tp := range d.Members[0].TargetAssignment.TopicPartitions {
		if tp.Topic == "other" {
			t.Fatalf("topic other assigned to a member subscribed to rx-.*")
		}
	}
}

// TestConsumerGroup848StaticMemberRejoinKeepsAssignment: a static member (group.instance.id)
// that closes (temporary leave, epoch -2) and comes back within its session gets the same
// partitions back without a group epoch bump.
func TestConsumerGroup848StaticMemberRejoinKeepsAssignment(t *testing.T) {
	addr, _ := newTestBroker(t, fast848)
	adminCl := grpClient(t, addr)
	defer adminCl.Close()
	grpCreateTopic(t, kadm.NewClient(adminCl), "st848", 6)
	own := newOwnership(t)
	mk := func(name, inst string) *kgo.Client {
		opts := append([]kgo.Opt{kgo.ConsumerGroup("st"), kgo.ConsumeTopics("st848"), kgo.InstanceID(inst),
			kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer(), kgo.FetchMaxWait(100 * time.Millisecond)},
			own.opts(name)...)
		cl := grpClient(t, addr, opts...)
		go func() {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				fs := cl.PollFetches(ctx)
				cancel()
				if fs.IsClientClosed() {
					return
				}
			}
		}()
		return cl
	}
	a := mk("a", "inst-a")
	b := mk("b", "inst-b")
	defer b.Close()
	stable := func() kmsg.ConsumerGroupDescribeResponseGroup {
		var d kmsg.ConsumerGroupDescribeResponseGroup
		checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
			d = describe848(t, adminCl, "st")
			if d.State != "Stable" || len(d.Members) != 2 || len(own.held("a")) != 3 || len(own.held("b")) != 3 {
				return fmt.Errorf("state %s members %d; a holds %d, b %d", d.State, len(d.Members), len(own.held("a")), len(own.held("b")))
			}
			return nil
		})
		return d
	}
	before := stable()
	heldA := own.held("a")
	a.Close() // leaves with epoch -2: the member stays, with its partitions
	d := describe848(t, adminCl, "st")
	if d.Epoch != before.Epoch || len(d.Members) != 2 {
		t.Fatalf("after the static leave: epoch %d (was %d), %d members", d.Epoch, before.Epoch, len(d.Members))
	}
	a2 := mk("a2", "inst-a")
	defer a2.Close()
	checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if h := own.held("a2"); len(h) != len(heldA) {
			return fmt.Errorf("a2 holds %v, a held %v", h, heldA)
		}
		return nil
	})
	for k := range heldA {
		if !own.held("a2")[k] {
			t.Fatalf("rejoined static member holds %v, before %v", own.held("a2"), heldA)
		}
	}
	if d := describe848(t, adminCl, "st"); d.Epoch != before.Epoch {
		t.Fatalf("static rejoin moved the group epoch %d → %d", before.Epoch, d.Epoch)
	}
}

// TestConsumerGroup848SessionTimeoutExpiresMember: a member that stops heartbeating (here a raw
// joiner) is removed after group.consumer.session.timeout.ms and a live consumer gets its
// partitions. OffsetFetch and OffsetCommit by the expired member are refused.
func TestConsumerGroup848SessionTimeoutExpiresMember(t *testing.T) {
	addr, _ := newTestBroker(t, fast848, func(c *configs.Config) { c.ConsumerSessionTimeout = 3 * time.Second })
	adminCl := grpClient(t, addr)
	defer adminCl.Close()
	grpCreateTopic(t, kadm.NewClient(adminCl), "sess848", 4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	join := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	join.Group, join.MemberID, join.MemberEpoch, join.RebalanceTimeoutMillis = "sess", "ghost", 0, 5000
	join.SubscribedTopicNames = []string{"sess848"}
	join.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	jr, err := join.RequestWith(ctx, adminCl)
	if err != nil || jr.ErrorCode != 0 || jr.Assignment == nil || len(jr.Assignment.Topics) != 1 || len(jr.Assignment.Topics[0].Partitions) != 4 {
		t.Fatalf("ghost join: %v %+v", err, jr)
	}
	// The member epoch fences OffsetFetch v9 and OffsetCommit v9.
	fetch := func(epoch int32) int16 {
		req := kmsg.NewPtrOffsetFetchRequest()
		rg := kmsg.NewOffsetFetchRequestGroup()
		rg.Group, rg.MemberEpoch = "sess", epoch
		id := "ghost"
		rg.MemberID = &id
		req.Groups = append(req.Groups, rg)
		resp, err := req.RequestWith(ctx, adminCl)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Groups[0].ErrorCode
	}
	commit := func(epoch int32) int16 {
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Group, req.MemberID, req.Generation = "sess", "ghost", epoch
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic = "sess848"
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Offset = 0
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, adminCl)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Topics[0].Partitions[0].ErrorCode
	}
	if c := fetch(jr.MemberEpoch); c != 0 {
		t.Fatalf("OffsetFetch at the member's epoch: %d", c)
	}
	if c := fetch(jr.MemberEpoch + 1); c != codec.CodeStaleMemberEpoch {
		t.Fatalf("OffsetFetch at another epoch: %d, want STALE_MEMBER_EPOCH", c)
	}
	if c := commit(jr.MemberEpoch); c != 0 {
		t.Fatalf("OffsetCommit at the member's epoch: %d", c)
	}
	if c := commit(jr.MemberEpoch + 1); c != codec.CodeStaleMemberEpoch {
		t.Fatalf("OffsetCommit at another epoch: %d, want STALE_MEMBER_EPOCH", c)
	}
	own := newOwnership(t)
	live := grpClient(t, addr, append([]kgo.Opt{kgo.ConsumerGroup("sess"), kgo.ConsumeTopics("sess848"),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer(), kgo.FetchMaxWait(100 * time.Millisecond)},
		own.opts("live")...)...)
	defer live.Close()
	go func() {
		for {
			fs := live.PollFetches(ctx)
			if fs.IsClientClosed() || ctx.Err() != nil {
				return
			}
		}
	}()
	// The ghost never revokes; once its session expires the live consumer gets everything.
	checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if n := len(own.held("live")); n != 4 {
			return fmt.Errorf("live holds %d partitions", n)
		}
		return nil
	})
	d := describe848(t, adminCl, "sess")
	if len(d.Members) != 1 || d.Members[0].MemberID == "ghost" {
		t.Fatalf("members after the ghost's session expired: %+v", d.Members)
	}
	if c := fetch(jr.MemberEpoch); c != codec.CodeUnknownMemberID {
		t.Fatalf("OffsetFetch by the expired member: %d, want UNKNOWN_MEMBER_ID", c)
	}
	hb := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	hb.Group, hb.MemberID, hb.MemberEpoch, hb.RebalanceTimeoutMillis = "sess", "ghost", jr.MemberEpoch, -1
	if r, err := hb.RequestWith(ctx, adminCl); err != nil || r.ErrorCode != codec.CodeUnknownMemberID {
		t.Fatalf("heartbeat of the expired member: %v %+v", err, r)
	}
}

// TestConsumerGroup848ConvertsEmptyClassicGroup: a classic group whose members all left becomes a
// consumer group on the first ConsumerGroupHeartbeat, keeping its committed offsets; a classic
// group with members is refused GROUP_ID_NOT_FOUND while group.consumer.migration.policy disables upgrades.
func TestConsumerGroup848ConvertsEmptyClassicGroup(t *testing.T) {
	// With online upgrade disabled, only an empty classic group converts.
	addr, _ := newTestBroker(t, fast848, func(c *configs.Config) { c.ConsumerMigrationPolicy = "downgrade" })
	adminCl := grpClient(t, addr)
	defer adminCl.Close()
	adm := kadm.NewClient(adminCl)
	grpCreateTopic(t, adm, "conv848", 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	classic := grpClient(t, addr, kgo.ConsumerGroup("conv"), kgo.ConsumeTopics("conv848"), kgo.Balancers(kgo.CooperativeStickyBalancer()))
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		dg, err := adm.DescribeGroups(ctx, "conv")
		if err != nil {
			return err
		}
		if dg["conv"].State != "Stable" {
			return fmt.Errorf("classic group %s", dg["conv"].State)
		}
		return nil
	})
	join := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	join.Group, join.MemberID, join.MemberEpoch, join.RebalanceTimeoutMillis = "conv", "m848", 0, 5000
	join.SubscribedTopicNames = []string{"conv848"}
	join.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	if r, err := join.RequestWith(ctx, adminCl); err != nil || r.ErrorCode != codec.CodeGroupIDNotFound {
		t.Fatalf("848 join of a classic group with members: %v %+v", err, r)
	}
	classic.Close()
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		r, err := adm.CommitOffsets(ctx, "conv", kadm.OffsetsFromRecords(kgo.Record{Topic: "conv848", Partition: 1, Offset: 41}))
		if err != nil {
			return err
		}
		return r.Error()
	})
	r, err := join.RequestWith(ctx, adminCl)
	if err != nil || r.ErrorCode != 0 || r.MemberEpoch != 1 {
		t.Fatalf("848 join of an empty classic group: %v %+v", err, r)
	}
	offs, err := adm.FetchOffsets(ctx, "conv")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup("conv848", 1); !ok || o.At != 42 {
		t.Fatalf("committed offset after the conversion: %+v", o)
	}
	if d := describe848(t, adminCl, "conv"); d.ErrorCode != 0 || len(d.Members) != 1 {
		t.Fatalf("describe after the conversion: %+v", d)
	}
}

// TestApiVersionsAdvertisesKIP848 guards what the Java client (group.protocol=consumer) and
// franz-go's ServerSideBalancer look for.
func TestApiVersionsAdvertisesKIP848(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := grpClient(t, addr)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int16]bool{int16(kmsg.ConsumerGroupHeartbeat): true, int16(kmsg.ConsumerGroupDescribe): true}
	for _, k := range resp.ApiKeys {
		if want[k.ApiKey] {
			if k.MinVersion != 0 || k.MaxVersion != 1 {
				t.Fatalf("key %d advertised %d..%d, want 0..1", k.ApiKey, k.MinVersion, k.MaxVersion)
			}
			delete(want, k.ApiKey)
		}
	}
	if len(want) != 0 {
		t.Fatalf("not advertised: %v", want)
	}
}

// TestGroupShardReleaseReloadKeepsConsumerGroupEpoch: a KIP-848 consumer rides out a release and
// reload of its group's shard (what a coordinator move does) with the same member id, member
// epoch and partitions: the consumer group's state is written at release and restored at load.
func TestGroupShardReleaseReloadKeepsConsumerGroupEpoch(t *testing.T) {
	cfg := testConfig(t)
	fast848(&cfg)
	tb := startTestBroker(t, cfg)
	defer tb.stop(t)
	addr := tb.srv.Addr().String()
	admCl := grpClient(t, addr)
	defer admCl.Close()
	grpCreateTopic(t, kadm.NewClient(admCl), "t848", 3)
	const grp = "keeps-epoch"
	own := newOwnership(t)
	reqs := &requestCounter{}
	cl := grpClient(t, addr, append([]kgo.Opt{kgo.ConsumerGroup(grp), kgo.ConsumeTopics("t848"),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer(), kgo.WithHooks(reqs)},
		own.opts("c")...)...)
	ctx, cancel := context.WithCancel(context.Background())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	defer func() { cancel(); cl.Close(); <-polled }()
	var before kmsg.ConsumerGroupDescribeResponseGroup
	checkFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		before = describe848(t, admCl, grp)
		if before.State != "Stable" || len(own.held("c")) != 3 {
			return fmt.Errorf("group %s, consumer holds %d", before.State, len(own.held("c")))
		}
		return nil
	})
	member0, epoch0 := cl.GroupMetadata()
	assigned0 := own.assignments("c")
	shard := group.ShardFor(grp)
	releaseGroupShard(t, tb, shard)
	loadGroupShard(t, tb, shard, 2)
	hb0 := reqs.get(int16(kmsg.ConsumerGroupHeartbeat))
	checkFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if reqs.get(int16(kmsg.ConsumerGroupHeartbeat)) < hb0+5 {
			return errors.New("fewer than 5 heartbeats since the reload")
		}
		return nil
	})
	if m, e := cl.GroupMetadata(); m != member0 || e != epoch0 {
		t.Fatalf("after the reload: member %s epoch %d, before: %s %d", m, e, member0, epoch0)
	}
	if assigned := own.assignments("c"); assigned != assigned0 || len(own.held("c")) != 3 {
		t.Fatalf("the consumer was reassigned: %d assignments (before %d), holds %d", assigned, assigned0, len(own.held("c")))
	}
	after := describe848(t, admCl, grp)
	if after.Epoch != before.Epoch || after.State != "Stable" || len(after.Members) != 1 || after.Members[0].MemberID != member0 {
		t.Fatalf("after the reload: %+v, before %+v", after, before)
	}
}

// TestConsumerGroup848ACLs: ConsumerGroupHeartbeat needs READ on the group and DESCRIBE on every
// topic subscribed by name, a regex resolves only to topics the member may DESCRIBE, and
// ConsumerGroupDescribe needs DESCRIBE on the group.
func TestConsumerGroup848ACLs(t *testing.T) {
	ab := startACLBroker(t, testConfig(t))
	t.Cleanup(func() { ab.stop(t) })
	for _, name := range []string{"t", "t-hidden"} {
		if _, err := ab.store.CreateTopic(name, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	const p = "User:member"
	rc := ab.who.raw(t, ab.addr, p)
	join := func() int16 {
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Version, req.Group, req.MemberID, req.RebalanceTimeoutMillis = 1, "g", "m", 5000
		req.SubscribedTopicNames = []string{"t"}
		req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		return fxRoundTrip[*kmsg.ConsumerGroupHeartbeatResponse](t, rc, req).ErrorCode
	}
	describe := func() int16 {
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Version, req.Groups = 1, []string{"g"}
		return fxRoundTrip[*kmsg.ConsumerGroupDescribeResponse](t, rc, req).Groups[0].ErrorCode
	}
	if c := join(); c != codec.CodeGroupAuthorizationFailed {
		t.Fatalf("join without READ on the group: %d", c)
	}
	if c := describe(); c != codec.CodeGroupAuthorizationFailed {
		t.Fatalf("describe without DESCRIBE on the group: %d", c)
	}
	ab.grant(t, allow(acl.ResourceGroup, "g", p, acl.OpRead))
	if c := join(); c != codec.CodeTopicAuthorizationFailed {
		t.Fatalf("join without DESCRIBE on the topic: %d", c)
	}
	ab.grant(t, allow(acl.ResourceTopic, "t", p, acl.OpDescribe))
	if c := join(); c != codec.CodeNone {
		t.Fatalf("join with the ACLs: %d", c)
	}
	if c := describe(); c != codec.CodeNone {
		t.Fatalf("describe with READ (which implies DESCRIBE) on the group: %d", c)
	}
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	re := "t.*"
	req.Version, req.Group, req.MemberID, req.RebalanceTimeoutMillis, req.SubscribedTopicRegex = 1, "g", "rx", 5000, &re
	req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	if r := fxRoundTrip[*kmsg.ConsumerGroupHeartbeatResponse](t, rc, req); r.ErrorCode != 0 {
		t.Fatalf("regex join: %d", r.ErrorCode)
	}
	dreq := kmsg.NewPtrConsumerGroupDescribeRequest()
	dreq.Version, dreq.Groups = 1, []string{"g"}
	d := fxRoundTrip[*kmsg.ConsumerGroupDescribeResponse](t, rc, dreq).Groups[0]
	assigned := 0
	for _, m := range d.Members {
		for _, tp := range m.TargetAssignment.TopicPartitions {
			if tp.Topic != "t" {
				t.Fatalf("member %s is assigned %s, which it may not describe", m.MemberID, tp.Topic)
			}
			assigned += len(tp.Partitions)
		}
	}
	if len(d.Members) != 2 || assigned != 1 {
		t.Fatalf("%d members, %d partitions of t assigned", len(d.Members), assigned)
	}
}

// TestDescribeGroupsOfConsumerGroupIsNotClassic: the classic DescribeGroups API answers a live
// consumer group as Apache 4.1.1 does (measured with TestKIP848DescribeGroupsClassicAPI against
// the reference broker): Dead with no error at v5, GROUP_ID_NOT_FOUND "Group <id> is not a
// classic group." at v6, no members either way.
func TestDescribeGroupsOfConsumerGroupIsNotClassic(t *testing.T) {
	addr, _ := newTestBroker(t, fast848)
	adminCl := grpClient(t, addr)
	defer adminCl.Close()
	grpCreateTopic(t, kadm.NewClient(adminCl), "notclassic848", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	join := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	join.Group, join.MemberID, join.MemberEpoch, join.RebalanceTimeoutMillis = "nc", "m1", 0, 5000
	join.SubscribedTopicNames = []string{"notclassic848"}
	join.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	if r, err := join.RequestWith(ctx, adminCl); err != nil || r.ErrorCode != 0 {
		t.Fatalf("ConsumerGroupHeartbeat join: %v %+v", err, r)
	}
	rc := dialRaw(t, addr)
	for _, v := range []int16{5, 6} {
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Version = v
		req.Groups = []string{"nc"}
		g := fxRoundTrip[*kmsg.DescribeGroupsResponse](t, rc, req).Groups[0]
		switch {
		case len(g.Members) != 0 || g.State != "Dead" || g.ProtocolType != "":
			t.Fatalf("v%d: %+v", v, g)
		case v == 5 && g.ErrorCode != 0:
			t.Fatalf("v5: error %d", g.ErrorCode)
		case v == 6 && (g.ErrorCode != kerr.GroupIDNotFound.Code || g.ErrorMessage == nil || *g.ErrorMessage != "Group nc is not a classic group."):
			t.Fatalf("v6: error %d message %v", g.ErrorCode, g.ErrorMessage)
		}
	}
}
