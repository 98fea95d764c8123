package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

// Cross-broker markers (issue 10, design/cluster.md §4 and §6) on the in-process 3-broker
// cluster. The transactions are driven on the wire against their coordinator (InitProducerId,
// AddPartitionsToTxn, AddOffsetsToTxn, EndTxn); their data is appended on the remote leaders'
// partitions and their offsets staged on the remote group coordinator directly, standing in for
// the Produce and TxnOffsetCommit that cross-broker KIP-890 verification (another part of the
// issue) lets through.

// waitTopicSpread waits until the controller has spread the transaction slots and group shards over
// the three brokers (it places everything on the first broker to join and moves some each
// tick) and topic's three partitions are led by three brokers.
func (tc *testCluster) waitTopicSpread(topic string) {
	tc.t.Helper()
	checkFor(tc.t, 60*time.Second, 50*time.Millisecond, func() error {
		tb := tc.anyTable()
		slots, shards, parts := map[int32]int{}, map[int32]int{}, map[int32]int{}
		for n := 0; n < topology.NumTxnSlots; n++ {
			slots[tb.TxnSlot(n).Broker]++
			shards[tb.GroupShard(n).Broker]++
		}
		for p := int32(0); p < 3; p++ {
			parts[tb.Partition(topic, p).Broker]++
		}
		for id := int32(1); id <= 3; id++ {
			if slots[id] < 16 || shards[id] < 16 || parts[id] != 1 {
				return fmt.Errorf("not spread yet: slots %v shards %v partitions %v", slots, shards, parts)
			}
		}
		return nil
	})
}

// txnPlacement picks a transactional id and returns it with its coordinator and the two
// partitions of topic (3 partitions, one per broker) that the coordinator does not lead.
func (tc *testCluster) txnPlacement(prefix, topic string) (tid string, c int32, remote [2]int32) {
	tc.t.Helper()
	tc.waitTopicSpread(topic)
	tid = prefix + "-tid"
	c = tc.owner(topology.TxnTopic, int32(topology.TxnSlot(tid))).Broker
	n, seen := 0, map[int32]bool{}
	for p := int32(0); p < 3; p++ {
		l := tc.owner(topic, p).Broker
		seen[l] = true
		if l != c && n < 2 {
			remote[n] = p
			n++
		}
	}
	if n != 2 || len(seen) != 3 {
		tc.t.Fatalf("placement: coordinator %d, %d partitions led elsewhere, leaders on %d brokers; want 2 and 3", c, n, len(seen))
	}
	return tid, c, remote
}

// groupNotOwnedBy finds a group id whose shard another broker than id owns.
func (tc *testCluster) groupNotOwnedBy(prefix string, id int32) (string, int32) {
	tc.t.Helper()
	for i := 0; i < 1000; i++ {
		g := fmt.Sprintf("%s-%d", prefix, i)
		if o := tc.owner(topology.GroupsTopic, int32(topology.GroupShard(g))); o.Broker != id {
			return g, o.Broker
		}
	}
	tc.t.Fatalf("every group shard is owned by broker %d", id)
	return "", -1
}

// appendTxnData appends one transactional record on the partition's current leader (as a
// verified Produce would) and waits until it is durable.
func (tc *testCluster) appendTxnData(topic string, part int32, pid int64, epoch int16, seq int32, val string) {
	tc.t.Helper()
	o := tc.owner(topic, part)
	p := tc.broker(o.Broker).Store.Topic(topic).Partition(part)
	guard, ongoing := p.VerificationGuard(pid, epoch)
	if ongoing {
		guard = 0
	}
	r := p.AppendTxn(codec.Batch(txnBatch(pid, epoch, seq, val)), time.Now().UnixMilli(), guard)
	if r.Code != codec.CodeNone {
		tc.t.Fatalf("transactional append on %s-%d (leader %d): code %d", topic, part, o.Broker, r.Code)
	}
	ch := make(chan error, 1)
	p.Sync(r.LastOffset+1, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		tc.t.Fatal(err)
	}
}

// stableAt asserts, on the partition's leader, that nothing is open (LSO = HWM) and the log
// ends at hwm. It is asked right after EndTxn answered, without waiting: kaas answers EndTxn
// only once every marker is durable on its partition.
func (tc *testCluster) stableAt(topic string, part int32, hwm int64) {
	tc.t.Helper()
	o := tc.owner(topic, part)
	p := tc.broker(o.Broker).Store.Topic(topic).Partition(part)
	if got, lso := p.HighWatermark(), p.LastStableOffset(); got != hwm || lso != hwm {
		tc.t.Fatalf("%s-%d on leader %d right after EndTxn: HWM %d LSO %d, want both %d", topic, part, o.Broker, got, lso, hwm)
	}
}

// readCommittedOnce polls a read_committed consumer of one partition once and returns the
// values of that one poll.
func (tc *testCluster) readCommittedOnce(topic string, part int32) []string {
	tc.t.Helper()
	cl := tc.client(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {part: kgo.NewOffset().At(0)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fs := cl.PollFetches(ctx)
	var out []string
	fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
	return out
}

func rawEndTxn(t *testing.T, rc *rawConn, tid string, pid int64, epoch int16, commit bool) {
	t.Helper()
	e := kmsg.NewPtrEndTxnRequest()
	e.Version = 3
	e.TransactionalID, e.ProducerID, e.ProducerEpoch, e.Commit = tid, pid, epoch, commit
	if r := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, e); r.ErrorCode != 0 {
		t.Fatalf("EndTxn(commit=%v): %v", commit, kerr.ErrorForCode(r.ErrorCode))
	}
}

func rawAddOffsets(t *testing.T, rc *rawConn, tid string, pid int64, epoch int16, grp string) {
	t.Helper()
	ao := kmsg.NewPtrAddOffsetsToTxnRequest()
	ao.Version = 3
	ao.TransactionalID, ao.ProducerID, ao.ProducerEpoch, ao.Group = tid, pid, epoch, grp
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, ao); r.ErrorCode != 0 {
		t.Fatalf("AddOffsetsToTxn: %v", kerr.ErrorForCode(r.ErrorCode))
	}
}

// stageOffset stages a transactional offset on the group's coordinator.
func (tc *testCluster) stageOffset(grp string, pid int64, epoch int16, topic string, part int32, offset int64) {
	tc.t.Helper()
	o := tc.owner(topology.GroupsTopic, int32(topology.GroupShard(grp)))
	ch := make(chan int16, 1)
	tc.broker(o.Broker).Groups.TxnOffsetCommit(group.TxnCommit{Commit: group.Commit{Group: grp, Generation: -1},
		ProducerID: pid, ProducerEpoch: epoch}, []storage.GroupOffset{{Topic: topic, Partition: part, Offset: offset, LeaderEpoch: -1}},
		nil, func(code int16) { ch <- code })
	if code := <-ch; code != codec.CodeNone {
		tc.t.Fatalf("staging offsets of %s on %d: code %d", grp, o.Broker, code)
	}
}

func (tc *testCluster) committedOffset(grp, topic string, part int32) int64 {
	tc.t.Helper()
	adm := kadm.NewClient(tc.client())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	os, err := adm.FetchOffsets(ctx, grp)
	if err != nil {
		tc.t.Fatal(err)
	}
	if o, ok := os.Lookup(topic, part); ok {
		return o.At
	}
	return -1
}

func equalValues(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: %q, want %q", what, got, want)
	}
}

// TestClusterEndTxnWaitsForRemoteMarkersAndGroups: the transaction coordinator C leads none of
// the transaction's partitions, and the group's coordinator G is another broker. EndTxn(commit)
// answers only once the markers are durable on both remote leaders and G has committed the
// staged offset: right after the answer LSO = HWM on every partition, a read_committed consumer
// sees the records in its first poll, and the offset is committed once. An aborted transaction
// leaves the partitions stable and the committed offset unchanged. Resending a shard's marker
// to G commits nothing twice; the marker on a broker that does not own the shard answers 6.
func TestClusterEndTxnWaitsForRemoteMarkersAndGroups(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "mk"
	tc.createTopic(topic, 3, 3)
	tid, c, parts := tc.txnPlacement("mk", topic)
	p1, p2 := parts[0], parts[1]
	grp, g := tc.groupNotOwnedBy("mkg", c)
	t.Logf("coordinator %d, partitions %d and %d led by %d and %d, group coordinator %d",
		c, p1, p2, tc.owner(topic, p1).Broker, tc.owner(topic, p2).Broker, g)
	rc := dialRaw(t, tc.broker(c).Addr().String())

	pid, epoch := rawInit(t, rc, tid)
	rawAddPartition(t, rc, tid, pid, epoch, topic, p1)
	rawAddPartition(t, rc, tid, pid, epoch, topic, p2)
	rawAddOffsets(t, rc, tid, pid, epoch, grp)
	tc.appendTxnData(topic, p1, pid, epoch, 0, "a1")
	tc.appendTxnData(topic, p2, pid, epoch, 0, "a2")
	tc.stageOffset(grp, pid, epoch, topic, p1, 1)
	rawEndTxn(t, rc, tid, pid, epoch, true)
	tc.stableAt(topic, p1, 2)
	tc.stableAt(topic, p2, 2)
	equalValues(t, "partition p1, first read_committed poll", tc.readCommittedOnce(topic, p1), "a1")
	equalValues(t, "partition p2, first read_committed poll", tc.readCommittedOnce(topic, p2), "a2")
	if o := tc.committedOffset(grp, topic, p1); o != 1 {
		t.Fatalf("offset of %s after the commit: %d, want 1", grp, o)
	}

	// Resending the shard's marker to its owner (a lost answer) is harmless.
	shard := int32(topology.GroupShard(grp))
	wm := kmsg.NewPtrWriteTxnMarkersRequest()
	wm.Version = 1
	m := kmsg.NewWriteTxnMarkersRequestMarker()
	m.ProducerID, m.ProducerEpoch, m.Committed, m.CoordinatorEpoch = pid, epoch, true, 0
	m.Topics = []kmsg.WriteTxnMarkersRequestMarkerTopic{{Topic: topology.GroupsTopic, Partitions: []int32{shard}}}
	wm.Markers = []kmsg.WriteTxnMarkersRequestMarker{m}
	for _, id := range []int32{g, c} {
		r := fxRoundTrip[*kmsg.WriteTxnMarkersResponse](t, dialRaw(t, tc.broker(id).Addr().String()), wm)
		want := codec.CodeNone
		if id != g {
			want = codec.CodeNotLeaderForPartition
		}
		if got := r.Markers[0].Topics[0].Partitions[0].ErrorCode; got != want {
			t.Fatalf("shard marker on broker %d (owner %d): code %d, want %d", id, g, got, want)
		}
	}
	if o := tc.committedOffset(grp, topic, p1); o != 1 {
		t.Fatalf("offset of %s after a resent shard marker: %d, want 1", grp, o)
	}

	// The next transaction aborts: its records stay invisible and its staged offset is dropped.
	rawAddPartition(t, rc, tid, pid, epoch, topic, p1)
	rawAddPartition(t, rc, tid, pid, epoch, topic, p2)
	rawAddOffsets(t, rc, tid, pid, epoch, grp)
	tc.appendTxnData(topic, p1, pid, epoch, 1, "b1")
	tc.appendTxnData(topic, p2, pid, epoch, 1, "b2")
	tc.stageOffset(grp, pid, epoch, topic, p1, 2)
	rawEndTxn(t, rc, tid, pid, epoch, false)
	tc.stableAt(topic, p1, 4)
	tc.stableAt(topic, p2, 4)
	if o := tc.committedOffset(grp, topic, p1); o != 1 {
		t.Fatalf("offset of %s after the abort: %d, want 1 (the staged 2 dropped)", grp, o)
	}

	// And a third commits after it, visible at once behind the aborted records.
	rawAddPartition(t, rc, tid, pid, epoch, topic, p1)
	tc.appendTxnData(topic, p1, pid, epoch, 2, "c1")
	rawEndTxn(t, rc, tid, pid, epoch, true)
	tc.stableAt(topic, p1, 6)
	equalValues(t, "partition 1 after commit, abort, commit", tc.readCommittedOnce(topic, p1), "a1", "c1")
}

// TestClusterMarkerResentToNewLeaderAfterCrash: a partition's leader crashes after the
// transaction wrote to it and before its marker is acknowledged. The coordinator's marker
// request fails (connection refused, then NOT_LEADER while the successor loads), it waits for
// the topology to name the new leader and resends there; the successor has salvaged the
// transaction's data from the crashed leader's WAL and closes it. EndTxn then answers, and the
// partition is stable and shows the record.
func TestClusterMarkerResentToNewLeaderAfterCrash(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "mkc"
	tc.createTopic(topic, 3, 3)
	tid, c, parts := tc.txnPlacement("mkc", topic)
	p1, p2 := parts[0], parts[1]
	rc := dialRaw(t, tc.broker(c).Addr().String())
	pid, epoch := rawInit(t, rc, tid)
	rawAddPartition(t, rc, tid, pid, epoch, topic, p1)
	rawAddPartition(t, rc, tid, pid, epoch, topic, p2)
	tc.appendTxnData(topic, p1, pid, epoch, 0, "x1")
	tc.appendTxnData(topic, p2, pid, epoch, 0, "x2")
	before := tc.owner(topic, p1)
	retries := mMarkerRetries.Get()
	tc.crash(before.Broker)

	start := time.Now()
	rc = dialRaw(t, tc.broker(c).Addr().String()) // a fresh deadline: the takeover waits for the lease
	rawEndTxn(t, rc, tid, pid, epoch, true)
	after := tc.owner(topic, p1)
	if after.Broker == before.Broker || after.Epoch <= before.Epoch {
		t.Fatalf("partition 1 at %+v after the crash of %+v", after, before)
	}
	if mMarkerRetries.Get() == retries {
		t.Fatal("EndTxn completed without resending the marker of the crashed leader")
	}
	t.Logf("EndTxn answered %s after the leader's crash (new leader %d at epoch %d)", time.Since(start), after.Broker, after.Epoch)
	tc.stableAt(topic, p1, 2)
	tc.stableAt(topic, p2, 2)
	equalValues(t, "partition 1 on the new leader", tc.readCommittedOnce(topic, p1), "x1")
	equalValues(t, "partition 2", tc.readCommittedOnce(topic, p2), "x2")
}

// TestClusterMarkersBatchedPerLeaderAndResendsNotRewritten: markers of many transactions bound
// for one remote leader share its single in-flight WriteTxnMarkers (ten markers, at most two
// requests: the first may leave before the rest are queued), each is durable when answered, and
// the same batch sent again (a coordinator resending after lost answers) writes nothing more.
func TestClusterMarkersBatchedPerLeaderAndResendsNotRewritten(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "mkb"
	tc.createTopic(topic, 3, 3)
	_, c, parts := tc.txnPlacement("mkb", topic)
	part := parts[0]
	leader := tc.owner(topic, part)
	w := tc.broker(c).remote
	sent := metrics.GetOrCreateCounter(fmt.Sprintf(`kaas_txn_marker_requests_sent_total{broker="%d"}`, leader.Broker))
	var batch []txn.MarkerRequest
	for i := 0; i < 10; i++ {
		batch = append(batch, txn.MarkerRequest{TransactionalID: "batched", Topic: topic, Partition: part,
			ProducerID: int64(1000 + i), ProducerEpoch: 0, Commit: true, CoordinatorEpoch: 1})
	}
	write := func() []txn.MarkerResult {
		ch := make(chan []txn.MarkerResult, 1)
		w.WriteMarkers(batch, func(res []txn.MarkerResult) { ch <- res })
		select {
		case res := <-ch:
			return res
		case <-time.After(30 * time.Second):
			t.Fatal("WriteMarkers did not answer")
		}
		return nil
	}
	p := tc.broker(leader.Broker).Store.Topic(topic).Partition(part)
	before := sent.Get()
	for i, r := range write() {
		if r.Code != codec.CodeNone {
			t.Fatalf("marker %d: code %d", i, r.Code)
		}
	}
	if n := sent.Get() - before; n < 1 || n > 2 {
		t.Fatalf("ten markers for broker %d took %d requests, want 1 or 2", leader.Broker, n)
	}
	end := p.LogEndOffset()
	if end != 10 || p.HighWatermark() != 10 || p.LastStableOffset() != 10 {
		t.Fatalf("after ten markers: LEO %d HWM %d LSO %d, want 10 each (durable when answered)", end, p.HighWatermark(), p.LastStableOffset())
	}
	for i, r := range write() {
		if r.Code != codec.CodeNone {
			t.Fatalf("resent marker %d: code %d", i, r.Code)
		}
	}
	if p.LogEndOffset() != end {
		t.Fatalf("resent markers were written again: LEO %d → %d", end, p.LogEndOffset())
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if v := metrics.GetOrCreateGauge(fmt.Sprintf(`kaas_txn_marker_inflight{broker="%d"}`, leader.Broker), nil).Get(); v != 0 {
			return fmt.Errorf("in-flight gauge %v after every answer", v)
		}
		return nil
	})
}

// interBrokerPing asks the env's broker for ApiVersions through an inter-broker pool built from
// cfg (the connection's TLS and SASL handshakes come first, so an answer means both passed).
func interBrokerPing(t *testing.T, e *secEnv, cfg configs.Config) error {
	t.Helper()
	p, err := NewInterBroker(cfg, e.tb.srv.deps.Topology, zap.NewNop())
	if err != nil {
		t.Fatalf("inter-broker pool over %s: %v", cfg.InterBrokerListenerName(), err)
	}
	defer p.Close()
	b, err := p.Broker(cfg.BrokerID)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = b.Request(ctx, kmsg.NewPtrApiVersionsRequest())
	return err
}

// TestInterBrokerClientTLS: with an SSL inter-broker listener the shared inter-broker client
// verifies the peer against the listener's truststore (a peer with a certificate from another CA
// is refused) and presents the listener's keystore.
func TestInterBrokerClientTLS(t *testing.T) {
	e := newSecEnv(t, func(c *configs.Config) { c.SSLClientAuth = "required" })
	cfg := e.tb.srv.cfg
	cfg.InterBrokerListener = "SSL"
	if err := interBrokerPing(t, e, cfg); err != nil {
		t.Fatalf("inter-broker TLS client against a peer its truststore trusts (client certificate required): %v", err)
	}
	other := newTestPKI(t)
	_, foreign := other.writeKeystore(t.TempDir(), "elsewhere")
	untrusting := cfg
	untrusting.SSLTruststoreLocation = foreign
	if err := interBrokerPing(t, e, untrusting); err == nil {
		t.Fatal("inter-broker TLS client accepted a peer certificate from a CA outside its truststore")
	}
}

// TestInterBrokerClientSASL: over SASL_PLAINTEXT and SASL_SSL the shared client logs in with
// sasl.mechanism.inter.broker.protocol and the listener's JAAS login, read as Apache writes it;
// a wrong password fails the connection, not the broker.
func TestInterBrokerClientSASL(t *testing.T) {
	e := newSecEnv(t)
	for _, tc := range []struct{ listener, mech, module string }{
		{"SASL_PLAINTEXT", "SCRAM-SHA-256", "org.apache.kafka.common.security.scram.ScramLoginModule"},
		{"SASL_SSL", "SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"},
		{"SASL_PLAINTEXT", "PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"},
	} {
		cfg := e.tb.srv.cfg
		cfg.InterBrokerListener = tc.listener
		cfg.InterBrokerSASL = tc.mech
		login := func(pw string) {
			if err := cfg.Set(configs.JAASKey(tc.listener, tc.mech),
				tc.module+` required username="alice" password="`+pw+`";`); err != nil {
				t.Fatal(err)
			}
		}
		login(alicePW)
		if err := interBrokerPing(t, e, cfg); err != nil {
			t.Fatalf("%s over %s as alice: %v", tc.mech, tc.listener, err)
		}
		login("wrong")
		if err := interBrokerPing(t, e, cfg); err == nil {
			t.Fatalf("%s over %s with a wrong password was let in", tc.mech, tc.listener)
		}
	}
}

// TestClusterGroupCompletedAfterGroupCoordinatorCrash: the group coordinator G crashes between
// TxnOffsetCommit (the staging is durable in its offsets log) and EndTxn. The transaction
// coordinator's completion for the group's shard fails against the dead broker, waits for the
// shard's new owner, which has loaded the staging from G's log, and resends there; EndTxn then
// answers and the offset is committed once.
func TestClusterGroupCompletedAfterGroupCoordinatorCrash(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "mkg"
	tc.createTopic(topic, 3, 3)
	tid, c, _ := tc.txnPlacement("mkg", topic)
	grp, g := tc.groupNotOwnedBy("mkgg", c)
	rc := dialRaw(t, tc.broker(c).Addr().String())
	pid, epoch := rawInit(t, rc, tid)
	rawAddOffsets(t, rc, tid, pid, epoch, grp)
	tc.stageOffset(grp, pid, epoch, topic, 0, 17)
	shard := int32(topology.GroupShard(grp))
	before := tc.owner(topology.GroupsTopic, shard)
	retries := mMarkerRetries.Get()
	tc.crash(g)

	rc = dialRaw(t, tc.broker(c).Addr().String())
	rawEndTxn(t, rc, tid, pid, epoch, true)
	after := tc.owner(topology.GroupsTopic, shard)
	if after.Broker == before.Broker || after.Epoch <= before.Epoch {
		t.Fatalf("shard %d at %+v after the crash of %+v", shard, after, before)
	}
	if mMarkerRetries.Get() == retries {
		t.Fatal("EndTxn completed without resending the completion to the shard's new owner")
	}
	if o := tc.committedOffset(grp, topic, 0); o != 17 {
		t.Fatalf("offset of %s after EndTxn across the group coordinator's crash: %d, want 17", grp, o)
	}
}
