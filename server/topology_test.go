package server

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/topology"
)

// ---- helpers (tp prefix) ----

// tpBroker starts a broker whose topology is a Table the test drives, with a fake live broker 2
// (it never answers: only its address is handed out) and topic "topo" with two partitions, one
// record in each.
func tpBroker(t *testing.T) (*testBroker, *topology.Table, *rawConn) {
	t.Helper()
	cfg := testConfig(t)
	tbl := topology.NewTable(topology.Broker{ID: cfg.BrokerID})
	tb := startTestBroker(t, cfg, BrokerOptions{Topology: tbl})
	t.Cleanup(func() { tb.stop(t) })
	local := tbl.Brokers()[0]
	if _, ok := local.Endpoint("PLAINTEXT"); !ok {
		t.Fatalf("the listener did not publish its address to the topology: %+v", local)
	}
	tbl.SetBrokers([]topology.Broker{local,
		{ID: 2, Rack: "r2", Endpoints: []topology.Endpoint{{Listener: "PLAINTEXT", Host: "broker-2.test", Port: 9999}}}})

	cl := fxClient(t, tb.srv.Addr().String(), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	fxCreateTopic(t, cl, "topo", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for p := int32(0); p < 2; p++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "topo", Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return tb, tbl, dialRaw(t, tb.srv.Addr().String())
}

func tpProduce(t *testing.T, rc *rawConn, topic string, p int32) int16 {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 9, -1, 5000
	req.Topics = []kmsg.ProduceRequestTopic{{Topic: topic, Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: p, Records: testBatch(1)}}}}
	return fxRoundTrip[*kmsg.ProduceResponse](t, rc, req).Topics[0].Partitions[0].ErrorCode
}

func tpFetch(t *testing.T, rc *rawConn, topic string, p int32, offset int64, epoch int32) kmsg.FetchResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrFetchRequest()
	req.Version, req.MaxWaitMillis, req.MaxBytes, req.SessionEpoch = 12, 10, 1<<20, -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.CurrentLeaderEpoch, rp.PartitionMaxBytes = p, offset, epoch, 1<<20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return fxRoundTrip[*kmsg.FetchResponse](t, rc, req).Topics[0].Partitions[0]
}

func tpListOffsets(t *testing.T, rc *rawConn, topic string, p int32, ts int64, epoch int32) kmsg.ListOffsetsResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrListOffsetsRequest()
	req.Version = 7
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch = p, ts, epoch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return fxRoundTrip[*kmsg.ListOffsetsResponse](t, rc, req).Topics[0].Partitions[0]
}

func tpOffsetForEpoch(t *testing.T, rc *rawConn, topic string, p int32, current, leaderEpoch int32) kmsg.OffsetForLeaderEpochResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrOffsetForLeaderEpochRequest()
	req.Version, req.ReplicaID = 4, -1
	rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
	rp.Partition, rp.CurrentLeaderEpoch, rp.LeaderEpoch = p, current, leaderEpoch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return fxRoundTrip[*kmsg.OffsetForLeaderEpochResponse](t, rc, req).Topics[0].Partitions[0]
}

func tpMetadata(t *testing.T, rc *rawConn, topics ...string) *kmsg.MetadataResponse {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	req.Version = 12
	for _, name := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, rt)
	}
	if len(topics) == 0 {
		req.Topics = nil // all topics
	}
	return fxRoundTrip[*kmsg.MetadataResponse](t, rc, req)
}

func tpFindCoordinator(t *testing.T, rc *rawConn, keyType int8, key string) kmsg.FindCoordinatorResponseCoordinator {
	t.Helper()
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.Version, req.CoordinatorType, req.CoordinatorKeys = 4, keyType, []string{key}
	return fxRoundTrip[*kmsg.FindCoordinatorResponse](t, rc, req).Coordinators[0]
}

// ---- tests ----

// TestTopologyRemoteLeaderAnswersNotLeader moves partition 1 of a topic to another broker: every
// partition API answers NOT_LEADER_OR_FOLLOWER for it, partition 0 keeps working, and Metadata
// names the new leader and its epoch.
func TestTopologyRemoteLeaderAnswersNotLeader(t *testing.T) {
	tb, tbl, rc := tpBroker(t)
	tbl.SetPartition("topo", 1, topology.Owner{Broker: 2, Epoch: 3, Known: true})

	if code := tpProduce(t, rc, "topo", 1); code != codec.CodeNotLeaderForPartition {
		t.Errorf("Produce to a remote partition: %d, want 6", code)
	}
	if code := tpProduce(t, rc, "topo", 0); code != codec.CodeNone {
		t.Errorf("Produce to a local partition: %d", code)
	}
	if p := tpFetch(t, rc, "topo", 1, 0, -1); p.ErrorCode != codec.CodeNotLeaderForPartition {
		t.Errorf("Fetch of a remote partition: %d, want 6", p.ErrorCode)
	}
	if p := tpFetch(t, rc, "topo", 0, 0, -1); p.ErrorCode != codec.CodeNone || p.HighWatermark != 2 || len(p.RecordBatches) == 0 {
		t.Errorf("Fetch of a local partition: %+v", p)
	}
	if p := tpListOffsets(t, rc, "topo", 1, -1, -1); p.ErrorCode != codec.CodeNotLeaderForPartition {
		t.Errorf("ListOffsets of a remote partition: %d, want 6", p.ErrorCode)
	}
	if p := tpOffsetForEpoch(t, rc, "topo", 1, -1, 0); p.ErrorCode != codec.CodeNotLeaderForPartition {
		t.Errorf("OffsetForLeaderEpoch of a remote partition: %d, want 6", p.ErrorCode)
	}

	// WriteTxnMarkers for the remote partition is refused too (the shared check).
	wm := kmsg.NewPtrWriteTxnMarkersRequest()
	wm.Version = 1
	m := kmsg.NewWriteTxnMarkersRequestMarker()
	m.ProducerID, m.ProducerEpoch, m.Committed = 1, 0, false
	m.Topics = []kmsg.WriteTxnMarkersRequestMarkerTopic{{Topic: "topo", Partitions: []int32{1}}}
	wm.Markers = append(wm.Markers, m)
	if code := fxRoundTrip[*kmsg.WriteTxnMarkersResponse](t, rc, wm).Markers[0].Topics[0].Partitions[0].ErrorCode; code != codec.CodeNotLeaderForPartition {
		t.Errorf("WriteTxnMarkers to a remote partition: %d, want 6", code)
	}

	// KIP-951: Produce v10+ and Fetch v16+ name the new leader and its endpoint.
	pr := kmsg.NewPtrProduceRequest()
	pr.Version, pr.Acks, pr.TimeoutMillis = 10, -1, 5000
	pr.Topics = []kmsg.ProduceRequestTopic{{Topic: "topo", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 1, Records: testBatch(1)}}}}
	presp := fxRoundTrip[*kmsg.ProduceResponse](t, rc, pr)
	if cl := presp.Topics[0].Partitions[0].CurrentLeader; cl.LeaderID != 2 || cl.LeaderEpoch != 3 ||
		len(presp.Brokers) != 1 || presp.Brokers[0].NodeID != 2 || presp.Brokers[0].Host != "broker-2.test" || presp.Brokers[0].Port != 9999 {
		t.Errorf("Produce v10 leader hint: %+v brokers %+v", cl, presp.Brokers)
	}
	md := tpMetadata(t, rc, "topo")
	fr := kmsg.NewPtrFetchRequest()
	fr.Version, fr.MaxWaitMillis, fr.MaxBytes, fr.SessionEpoch = 16, 10, 1<<20, -1
	frt := kmsg.NewFetchRequestTopic()
	frt.TopicID = md.Topics[0].TopicID
	frp := kmsg.NewFetchRequestTopicPartition()
	frp.Partition, frp.CurrentLeaderEpoch, frp.PartitionMaxBytes = 1, -1, 1<<20
	frt.Partitions = append(frt.Partitions, frp)
	fr.Topics = append(fr.Topics, frt)
	fresp := fxRoundTrip[*kmsg.FetchResponse](t, rc, fr)
	if p := fresp.Topics[0].Partitions[0]; p.ErrorCode != codec.CodeNotLeaderForPartition || p.CurrentLeader.LeaderID != 2 ||
		p.CurrentLeader.LeaderEpoch != 3 || len(fresp.Brokers) != 1 || fresp.Brokers[0].NodeID != 2 {
		t.Errorf("Fetch v16 leader hint: %+v brokers %+v", p, fresp.Brokers)
	}

	if len(md.Brokers) != 2 || md.Brokers[1].NodeID != 2 || md.Brokers[1].Host != "broker-2.test" || md.Brokers[1].Port != 9999 ||
		md.Brokers[1].Rack == nil || *md.Brokers[1].Rack != "r2" {
		t.Fatalf("Metadata brokers: %+v", md.Brokers)
	}
	parts := md.Topics[0].Partitions
	if parts[0].Leader != tb.cfg.BrokerID || parts[0].LeaderEpoch != 0 {
		t.Errorf("partition 0: %+v", parts[0])
	}
	if parts[1].Leader != 2 || parts[1].LeaderEpoch != 3 || !slices.Equal(parts[1].Replicas, []int32{2}) || !slices.Equal(parts[1].ISR, []int32{2}) {
		t.Errorf("partition 1: %+v", parts[1])
	}

	// No registered owner, or an owner that is not a live broker: no leader.
	tbl.SetPartition("topo", 1, topology.Owner{})
	tbl.SetPartition("topo", 0, topology.Owner{Broker: 7, Epoch: 1, Known: true})
	parts = tpMetadata(t, rc, "topo").Topics[0].Partitions
	for _, p := range parts {
		if p.ErrorCode != codec.CodeLeaderNotAvailable || p.Leader != -1 {
			t.Errorf("partition %d without a live leader: %+v", p.Partition, p)
		}
	}
	if code := tpProduce(t, rc, "topo", 1); code != codec.CodeNotLeaderForPartition {
		t.Errorf("Produce to a leaderless partition: %d, want 6", code)
	}
}

// TestTopologyLeaderEpochChecks bumps partition 0's leader epoch: Fetch, ListOffsets and
// OffsetForLeaderEpoch fence a client with the old epoch (74), answer a future one 75 (KIP-320),
// and Metadata / ListOffsets report the new epoch.
func TestTopologyLeaderEpochChecks(t *testing.T) {
	tb, tbl, rc := tpBroker(t)
	tbl.SetPartition("topo", 0, topology.Owner{Broker: tbl.LocalID(), Epoch: 5, Known: true})

	for _, c := range []struct {
		epoch int32
		want  int16
	}{{0, codec.CodeFencedLeaderEpoch}, {4, codec.CodeFencedLeaderEpoch}, {6, codec.CodeUnknownLeaderEpoch}, {5, codec.CodeNone}, {-1, codec.CodeNone}} {
		if p := tpFetch(t, rc, "topo", 0, 0, c.epoch); p.ErrorCode != c.want {
			t.Errorf("Fetch with current epoch %d: %d, want %d", c.epoch, p.ErrorCode, c.want)
		} else if c.want == codec.CodeNone && len(p.RecordBatches) == 0 {
			t.Errorf("Fetch with current epoch %d returned no records", c.epoch)
		}
		p := tpListOffsets(t, rc, "topo", 0, -1, c.epoch)
		if p.ErrorCode != c.want {
			t.Errorf("ListOffsets with current epoch %d: %d, want %d", c.epoch, p.ErrorCode, c.want)
		} else if c.want == codec.CodeNone && (p.Offset != 1 || p.LeaderEpoch != 5) {
			t.Errorf("ListOffsets with current epoch %d: %+v", c.epoch, p)
		}
		if p := tpOffsetForEpoch(t, rc, "topo", 0, c.epoch, 5); p.ErrorCode != c.want {
			t.Errorf("OffsetForLeaderEpoch with current epoch %d: %d, want %d", c.epoch, p.ErrorCode, c.want)
		}
	}
	// Epoch lookups against the bumped epoch: every epoch up to ours ends at the log end.
	for _, c := range []struct {
		asked, epoch int32
		end          int64
	}{{5, 5, 1}, {2, 2, 1}, {6, -1, -1}, {-1, -1, -1}} {
		p := tpOffsetForEpoch(t, rc, "topo", 0, -1, c.asked)
		if p.ErrorCode != 0 || p.LeaderEpoch != c.epoch || p.EndOffset != c.end {
			t.Errorf("OffsetForLeaderEpoch(%d): %+v, want epoch %d end %d", c.asked, p, c.epoch, c.end)
		}
	}
	// Fetch v16 tells a fenced client the current epoch (KIP-951).
	md := tpMetadata(t, rc, "topo")
	fr := kmsg.NewPtrFetchRequest()
	fr.Version, fr.MaxWaitMillis, fr.MaxBytes, fr.SessionEpoch = 16, 10, 1<<20, -1
	frt := kmsg.NewFetchRequestTopic()
	frt.TopicID = md.Topics[0].TopicID
	frp := kmsg.NewFetchRequestTopicPartition()
	frp.Partition, frp.CurrentLeaderEpoch, frp.PartitionMaxBytes = 0, 1, 1<<20
	frt.Partitions = append(frt.Partitions, frp)
	fr.Topics = append(fr.Topics, frt)
	if p := fxRoundTrip[*kmsg.FetchResponse](t, rc, fr).Topics[0].Partitions[0]; p.ErrorCode != codec.CodeFencedLeaderEpoch ||
		p.CurrentLeader.LeaderID != tb.cfg.BrokerID || p.CurrentLeader.LeaderEpoch != 5 {
		t.Errorf("Fetch v16 with a fenced epoch: %+v", p)
	}
	if p := md.Topics[0].Partitions[0]; p.LeaderEpoch != 5 {
		t.Errorf("Metadata leader epoch %d, want 5", p.LeaderEpoch)
	}

	// A kgo consumer learns epoch 5 from Metadata and reads through the checks.
	cl := fxClient(t, tb.srv.Addr().String(), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"topo": {0: kgo.NewOffset().AtStart()}}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fs := cl.PollFetches(ctx)
	if err := fs.Err(); err != nil || fs.NumRecords() != 1 {
		t.Fatalf("consume at epoch 5: %v, %d records", err, fs.NumRecords())
	}
}

// TestTopologyFindCoordinatorAnswersTheOwner moves a group shard and a transaction slot to
// another broker: FindCoordinator names that broker (as Apache, any broker can), the coordinator
// APIs here answer NOT_COORDINATOR (16), and a shard or slot without a live owner answers
// COORDINATOR_NOT_AVAILABLE (15).
func TestTopologyFindCoordinatorAnswersTheOwner(t *testing.T) {
	tb, tbl, rc := tpBroker(t)
	const group, tid = "topo-group", "topo-tid"

	for _, kt := range []int8{coordinatorKeyGroup, coordinatorKeyTxn} {
		c := tpFindCoordinator(t, rc, kt, "k")
		if c.ErrorCode != 0 || c.NodeID != tb.cfg.BrokerID || c.Port != int32(tb.srv.Addr().Port) {
			t.Fatalf("key type %d, local owner: %+v", kt, c)
		}
	}

	tbl.SetGroupShard(topology.GroupShard(group), topology.Owner{Broker: 2, Epoch: 1, Known: true})
	tbl.SetTxnSlot(topology.TxnSlot(tid), topology.Owner{Broker: 2, Epoch: 1, Known: true})
	for _, c := range []struct {
		kt  int8
		key string
	}{{coordinatorKeyGroup, group}, {coordinatorKeyTxn, tid}} {
		got := tpFindCoordinator(t, rc, c.kt, c.key)
		if got.ErrorCode != 0 || got.NodeID != 2 || got.Host != "broker-2.test" || got.Port != 9999 {
			t.Errorf("key type %d, remote owner: %+v", c.kt, got)
		}
	}
	// v3 (single key) gives the same answer.
	v3 := kmsg.NewPtrFindCoordinatorRequest()
	v3.Version, v3.CoordinatorKey = 3, group
	if r := fxRoundTrip[*kmsg.FindCoordinatorResponse](t, rc, v3); r.ErrorCode != 0 || r.NodeID != 2 {
		t.Errorf("v3 remote owner: %+v", r)
	}

	// This broker is not the coordinator: the coordinator APIs say so.
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.Version, ip.TransactionalID, ip.TransactionTimeoutMillis = 4, kmsg.StringPtr(tid), 10000
	ip.ProducerID, ip.ProducerEpoch = -1, -1
	if r := fxRoundTrip[*kmsg.InitProducerIDResponse](t, rc, ip); r.ErrorCode != codec.CodeNotCoordinator {
		t.Errorf("InitProducerId on a non-coordinator: %d, want 16", r.ErrorCode)
	}
	et := kmsg.NewPtrEndTxnRequest()
	et.Version, et.TransactionalID, et.ProducerID, et.ProducerEpoch, et.Commit = 3, tid, 1, 0, true
	if r := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, et); r.ErrorCode != codec.CodeNotCoordinator {
		t.Errorf("EndTxn on a non-coordinator: %d, want 16", r.ErrorCode)
	}
	jg := kmsg.NewPtrJoinGroupRequest()
	jg.Version, jg.Group, jg.ProtocolType, jg.SessionTimeoutMillis, jg.RebalanceTimeoutMillis = 5, group, "consumer", 10000, 10000
	jg.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{}}}
	if r := fxRoundTrip[*kmsg.JoinGroupResponse](t, rc, jg); r.ErrorCode != codec.CodeNotCoordinator {
		t.Errorf("JoinGroup on a non-coordinator: %d, want 16", r.ErrorCode)
	}

	// No owner, or an owner that is not a live broker.
	tbl.SetGroupShard(topology.GroupShard(group), topology.Owner{})
	tbl.SetTxnSlot(topology.TxnSlot(tid), topology.Owner{Broker: 9, Epoch: 1, Known: true})
	if c := tpFindCoordinator(t, rc, coordinatorKeyGroup, group); c.ErrorCode != codec.CodeCoordinatorNotAvailable || c.NodeID != -1 {
		t.Errorf("group without owner: %+v", c)
	}
	if c := tpFindCoordinator(t, rc, coordinatorKeyTxn, tid); c.ErrorCode != codec.CodeCoordinatorNotAvailable || c.NodeID != -1 {
		t.Errorf("txn slot owned by a dead broker: %+v", c)
	}

	// The internal topics' leaders are the owners.
	md := tpMetadata(t, rc, topology.GroupsTopic, topology.TxnTopic)
	shard, slot := topology.GroupShard(group), topology.TxnSlot(tid)
	if p := md.Topics[0].Partitions[shard]; p.ErrorCode != codec.CodeLeaderNotAvailable || p.Leader != -1 {
		t.Errorf("__consumer_offsets-%d without owner: %+v", shard, p)
	}
	tbl.SetGroupShard(shard, topology.Owner{Broker: 2, Epoch: 4, Known: true})
	md = tpMetadata(t, rc, topology.GroupsTopic, topology.TxnTopic)
	if p := md.Topics[0].Partitions[shard]; p.Leader != 2 || p.LeaderEpoch != 4 {
		t.Errorf("__consumer_offsets-%d: %+v", shard, p)
	}
	if p := md.Topics[1].Partitions[slot]; p.ErrorCode != codec.CodeLeaderNotAvailable {
		t.Errorf("__transaction_state-%d owned by a dead broker: %+v", slot, p)
	}
}

// TestTopologyDescribeClusterListsBrokers: DescribeCluster lists the topology's live brokers and
// controller; endpoint type 2 lists the controller only.
func TestTopologyDescribeClusterListsBrokers(t *testing.T) {
	tb, tbl, rc := tpBroker(t)
	tbl.SetController(2)
	req := kmsg.NewPtrDescribeClusterRequest()
	req.Version, req.EndpointType = 1, 1
	r := fxRoundTrip[*kmsg.DescribeClusterResponse](t, rc, req)
	if r.ControllerID != 2 || len(r.Brokers) != 2 || r.Brokers[0].NodeID != tb.cfg.BrokerID || r.Brokers[1].NodeID != 2 ||
		r.Brokers[1].Rack == nil || *r.Brokers[1].Rack != "r2" {
		t.Fatalf("DescribeCluster: %+v", r)
	}
	req.EndpointType = 2
	r = fxRoundTrip[*kmsg.DescribeClusterResponse](t, rc, req)
	if len(r.Brokers) != 1 || r.Brokers[0].NodeID != 2 || r.Brokers[0].Port != 9999 {
		t.Fatalf("DescribeCluster controllers: %+v", r.Brokers)
	}
}

// TestInternalTopicsListedByKadm: kadm lists __consumer_offsets and __transaction_state as
// internal topics with 50 partitions; ListTopics without internal topics filters them out, as it
// does against Apache; clients can neither produce to, create nor delete them.
func TestInternalTopicsListedByKadm(t *testing.T) {
	tb, _, _ := tpBroker(t)
	cl := fxClient(t, tb.srv.Addr().String())
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	all, err := adm.ListTopicsWithInternal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{topology.GroupsTopic, topology.TxnTopic} {
		d, ok := all[name]
		if !ok {
			t.Fatalf("%s not listed: %v", name, all.Names())
		}
		if d.Err != nil || !d.IsInternal || len(d.Partitions) != 50 || d.ID == (kadm.TopicID{}) {
			t.Fatalf("%s: err %v internal %v partitions %d id %v", name, d.Err, d.IsInternal, len(d.Partitions), d.ID)
		}
		for _, p := range d.Partitions {
			if p.Leader != tb.cfg.BrokerID || p.LeaderEpoch != 0 || p.Err != nil {
				t.Fatalf("%s-%d: %+v", name, p.Partition, p)
			}
		}
	}
	if d := all["topo"]; d.IsInternal || len(d.Partitions) != 2 {
		t.Fatalf("user topic: %+v", d)
	}
	plain, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if plain.Has(topology.GroupsTopic) || plain.Has(topology.TxnTopic) || !plain.Has("topo") {
		t.Fatalf("ListTopics (internal filtered): %v", plain.Names())
	}
	named, err := adm.ListTopics(ctx, topology.TxnTopic)
	if err != nil || !named[topology.TxnTopic].IsInternal {
		t.Fatalf("ListTopics naming an internal topic: %v %+v", err, named)
	}
	// By topic id (Metadata v10+) too.
	byID := kmsg.NewPtrMetadataRequest()
	byID.Version = 12
	byID.Topics = []kmsg.MetadataRequestTopic{{TopicID: all[topology.GroupsTopic].ID}}
	if r, err := byID.RequestWith(ctx, cl); err != nil || len(r.Topics) != 1 || r.Topics[0].Topic == nil ||
		*r.Topics[0].Topic != topology.GroupsTopic || !r.Topics[0].IsInternal {
		t.Fatalf("Metadata by the internal topic's id: %v %+v", err, r)
	}

	// Produce: INVALID_TOPIC_EXCEPTION.
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: topology.GroupsTopic, Partition: 0, Value: []byte("x")}).FirstErr()
	if !errors.Is(err, kerr.InvalidTopicException) {
		t.Fatalf("produce to __consumer_offsets: %v", err)
	}
	// Delete: INVALID_TOPIC_EXCEPTION, by name and by id.
	dr, err := adm.DeleteTopics(ctx, topology.GroupsTopic, topology.TxnTopic)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{topology.GroupsTopic, topology.TxnTopic} {
		if !errors.Is(dr[name].Err, kerr.InvalidTopicException) {
			t.Fatalf("delete %s: %v", name, dr[name].Err)
		}
	}
	dt := kmsg.NewPtrDeleteTopicsRequest()
	dt.Version = 6
	dt.Topics = []kmsg.DeleteTopicsRequestTopic{{TopicID: all[topology.TxnTopic].ID}}
	if r, err := dt.RequestWith(ctx, cl); err != nil || r.Topics[0].ErrorCode != codec.CodeInvalidTopicException {
		t.Fatalf("delete __transaction_state by id: %v %+v", err, r)
	}
	// Create: TOPIC_ALREADY_EXISTS; a '.'/'_' twin collides with it.
	cr, err := adm.CreateTopics(ctx, 1, 1, nil, topology.TxnTopic, "__consumer.offsets")
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(cr[topology.TxnTopic].Err, kerr.TopicAlreadyExists) {
		t.Fatalf("create __transaction_state: %v", cr[topology.TxnTopic].Err)
	}
	if !errors.Is(cr["__consumer.offsets"].Err, kerr.InvalidTopicException) {
		t.Fatalf("create __consumer.offsets: %v", cr["__consumer.offsets"].Err)
	}
	// Never storage topics, also after auto-creating Metadata requests.
	md := kmsg.NewPtrMetadataRequest()
	md.Version, md.AllowAutoTopicCreation = 12, true
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr(topology.GroupsTopic)}}
	if _, err := md.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if tb.store.Topic(topology.GroupsTopic) != nil || tb.store.Topic(topology.TxnTopic) != nil {
		t.Fatal("an internal topic became a storage topic")
	}
	// Still listed after all of it.
	if again, err := adm.ListTopicsWithInternal(ctx); err != nil || len(again[topology.GroupsTopic].Partitions) != 50 {
		t.Fatalf("after delete/create attempts: %v", err)
	}
}

// TestInternalTopicsReadAsEmptyLogs: Fetch, ListOffsets and OffsetForLeaderEpoch on an internal
// topic answer as for an empty log at the owner's epoch, go through the same leader and epoch
// checks, and Fetch finds it by topic id.
func TestInternalTopicsReadAsEmptyLogs(t *testing.T) {
	_, tbl, rc := tpBroker(t)
	if p := tpFetch(t, rc, topology.GroupsTopic, 3, 0, -1); p.ErrorCode != 0 || p.HighWatermark != 0 || p.LogStartOffset != 0 || len(p.RecordBatches) != 0 {
		t.Errorf("Fetch __consumer_offsets-3 at 0: %+v", p)
	}
	if p := tpFetch(t, rc, topology.TxnTopic, 3, 5, -1); p.ErrorCode != codec.CodeOffsetOutOfRange {
		t.Errorf("Fetch __transaction_state-3 at 5: %+v", p)
	}
	if p := tpFetch(t, rc, topology.TxnTopic, 50, 0, -1); p.ErrorCode != codec.CodeUnknownTopicOrPartition {
		t.Errorf("Fetch __transaction_state-50: %+v", p)
	}
	if p := tpListOffsets(t, rc, topology.GroupsTopic, 3, -1, -1); p.ErrorCode != 0 || p.Offset != 0 || p.LeaderEpoch != 0 {
		t.Errorf("ListOffsets latest __consumer_offsets-3: %+v", p)
	}
	if p := tpListOffsets(t, rc, topology.GroupsTopic, 3, -3, -1); p.ErrorCode != 0 || p.Offset != -1 {
		t.Errorf("ListOffsets max timestamp __consumer_offsets-3: %+v", p)
	}
	if code := tpProduce(t, rc, topology.TxnTopic, 50); code != codec.CodeUnknownTopicOrPartition {
		t.Errorf("Produce to __transaction_state-50: %d, want 3", code)
	}

	tbl.SetGroupShard(3, topology.Owner{Broker: tbl.LocalID(), Epoch: 2, Known: true})
	tbl.SetGroupShard(4, topology.Owner{Broker: 2, Epoch: 2, Known: true})
	if p := tpFetch(t, rc, topology.GroupsTopic, 3, 0, 1); p.ErrorCode != codec.CodeFencedLeaderEpoch {
		t.Errorf("Fetch __consumer_offsets-3 with an old epoch: %+v", p)
	}
	if p := tpFetch(t, rc, topology.GroupsTopic, 4, 0, -1); p.ErrorCode != codec.CodeNotLeaderForPartition {
		t.Errorf("Fetch __consumer_offsets-4 (remote): %+v", p)
	}
	if p := tpOffsetForEpoch(t, rc, topology.GroupsTopic, 3, 2, 2); p.ErrorCode != 0 || p.LeaderEpoch != 2 || p.EndOffset != 0 {
		t.Errorf("OffsetForLeaderEpoch __consumer_offsets-3: %+v", p)
	}
	if code := tpProduce(t, rc, topology.GroupsTopic, 4); code != codec.CodeInvalidTopicException {
		t.Errorf("Produce to a remote internal partition: %d, want 17 (before the leader check)", code)
	}

	// Fetch v13 names the topic by id.
	md := tpMetadata(t, rc, topology.GroupsTopic)
	req := kmsg.NewPtrFetchRequest()
	req.Version, req.MaxWaitMillis, req.MaxBytes, req.SessionEpoch = 13, 10, 1<<20, -1
	rt := kmsg.NewFetchRequestTopic()
	rt.TopicID = md.Topics[0].TopicID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.CurrentLeaderEpoch, rp.PartitionMaxBytes = 3, 2, 1<<20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	if p := fxRoundTrip[*kmsg.FetchResponse](t, rc, req).Topics[0].Partitions[0]; p.ErrorCode != 0 || p.HighWatermark != 0 {
		t.Errorf("Fetch v13 of __consumer_offsets-3 by id: %+v", p)
	}
	rt.TopicID = [16]byte{1, 2, 3}
	req.Topics[0] = rt
	if p := fxRoundTrip[*kmsg.FetchResponse](t, rc, req).Topics[0].Partitions[0]; p.ErrorCode != codec.CodeUnknownTopicID {
		t.Errorf("Fetch v13 by an unknown id: %+v", p)
	}
}

// TestRegexConsumerSkipsInternalTopics: a kgo consumer subscribed to the regex ".*" consumes the
// user topics and never the internal ones (kgo skips topics Metadata marks internal).
func TestRegexConsumerSkipsInternalTopics(t *testing.T) {
	tb, _, _ := tpBroker(t)
	cl := fxClient(t, tb.srv.Addr().String(), kgo.ConsumeRegex(), kgo.ConsumeTopics(".*"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(50*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := 0
	for got < 2 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of 2 records: %v", got, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Errorf("fetch %s-%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic != "topo" {
				t.Errorf("consumed a record of %s", r.Topic)
			}
			got++
		})
	}
	topics := cl.GetConsumeTopics()
	if !slices.Contains(topics, "topo") || slices.Contains(topics, topology.GroupsTopic) || slices.Contains(topics, topology.TxnTopic) {
		t.Fatalf("regex consumer consumes %v", topics)
	}
}
