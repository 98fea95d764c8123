package server

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestACLEveryAPIDeniesWithoutBindings sends every served API that touches a resource as a
// principal with no bindings (allow.everyone.if.no.acl.found=false) and checks Apache's error
// for each, and that nothing changed.
func TestACLEveryAPIDeniesWithoutBindings(t *testing.T) {
	ab := startACLBroker(t, testConfig(t))
	t.Cleanup(func() { ab.stop(t) })
	if _, err := ab.store.CreateTopic("t", 1, nil); err != nil {
		t.Fatal(err)
	}
	rc := ab.who.raw(t, ab.addr, "User:nobody")
	const (
		topicAuth   = 29
		groupAuth   = 30
		clusterAuth = 31
		txnAuth     = 53
	)
	want := func(api string, got, want int16) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %v, want %v", api, kerr.ErrorForCode(got), kerr.ErrorForCode(want))
		}
	}

	{
		r := quotaProduceRaw(t, rc, "t", testBatch(1))
		want("Produce", r.Topics[0].Partitions[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrFetchRequest()
		req.Version, req.ReplicaID, req.MaxBytes, req.SessionEpoch = 11, -1, 1<<20, -1
		p := kmsg.NewFetchRequestTopicPartition()
		p.PartitionMaxBytes = 1 << 20
		req.Topics = []kmsg.FetchRequestTopic{{Topic: "t", Partitions: []kmsg.FetchRequestTopicPartition{p}}}
		r := fxRoundTrip[*kmsg.FetchResponse](t, rc, req)
		want("Fetch", r.Topics[0].Partitions[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrListOffsetsRequest()
		req.Version, req.ReplicaID = 7, -1
		p := kmsg.NewListOffsetsRequestTopicPartition()
		p.Timestamp = -1
		req.Topics = []kmsg.ListOffsetsRequestTopic{{Topic: "t", Partitions: []kmsg.ListOffsetsRequestTopicPartition{p}}}
		r := fxRoundTrip[*kmsg.ListOffsetsResponse](t, rc, req)
		want("ListOffsets", r.Topics[0].Partitions[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrOffsetForLeaderEpochRequest()
		req.Version, req.ReplicaID = 3, -1
		p := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
		p.CurrentLeaderEpoch, p.LeaderEpoch = -1, 0
		req.Topics = []kmsg.OffsetForLeaderEpochRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetForLeaderEpochRequestTopicPartition{p}}}
		r := fxRoundTrip[*kmsg.OffsetForLeaderEpochResponse](t, rc, req)
		want("OffsetForLeaderEpoch", r.Topics[0].Partitions[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Version, req.Group, req.Generation = 8, "g", -1
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Offset = 1
		req.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{p}}}
		r := fxRoundTrip[*kmsg.OffsetCommitResponse](t, rc, req)
		want("OffsetCommit", r.Topics[0].Partitions[0].ErrorCode, groupAuth)
	}
	{
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Version, req.Group = 7, "g"
		r := fxRoundTrip[*kmsg.OffsetFetchResponse](t, rc, req)
		want("OffsetFetch", r.ErrorCode, groupAuth)
	}
	{
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.Version, req.CoordinatorKeys = 4, []string{"g"}
		r := fxRoundTrip[*kmsg.FindCoordinatorResponse](t, rc, req)
		want("FindCoordinator group", r.Coordinators[0].ErrorCode, groupAuth)
	}
	{
		req := kmsg.NewPtrJoinGroupRequest()
		req.Version, req.Group, req.SessionTimeoutMillis, req.RebalanceTimeoutMillis, req.ProtocolType = 5, "g", 10000, 10000, "consumer"
		req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range"}}
		r := fxRoundTrip[*kmsg.JoinGroupResponse](t, rc, req)
		want("JoinGroup", r.ErrorCode, groupAuth)
	}
	for name, req := range map[string]kmsg.Request{
		"Heartbeat":  &kmsg.HeartbeatRequest{Version: 3, Group: "g", MemberID: "m"},
		"SyncGroup":  &kmsg.SyncGroupRequest{Version: 3, Group: "g", MemberID: "m"},
		"LeaveGroup": &kmsg.LeaveGroupRequest{Version: 2, Group: "g", MemberID: "m"},
	} {
		var code int16
		switch r := fxRoundTrip[kmsg.Response](t, rc, req).(type) {
		case *kmsg.HeartbeatResponse:
			code = r.ErrorCode
		case *kmsg.SyncGroupResponse:
			code = r.ErrorCode
		case *kmsg.LeaveGroupResponse:
			code = r.ErrorCode
		}
		want(name, code, groupAuth)
	}
	{
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Version, req.Groups = 5, []string{"g"}
		r := fxRoundTrip[*kmsg.DescribeGroupsResponse](t, rc, req)
		want("DescribeGroups", r.Groups[0].ErrorCode, groupAuth)
	}
	{
		req := kmsg.NewPtrListGroupsRequest()
		req.Version = 3
		r := fxRoundTrip[*kmsg.ListGroupsResponse](t, rc, req)
		want("ListGroups (filtered, no error)", r.ErrorCode, 0)
	}
	{
		req := kmsg.NewPtrDeleteGroupsRequest()
		req.Version, req.Groups = 2, []string{"g"}
		r := fxRoundTrip[*kmsg.DeleteGroupsResponse](t, rc, req)
		want("DeleteGroups", r.Groups[0].ErrorCode, groupAuth)
	}
	{
		req := kmsg.NewPtrOffsetDeleteRequest()
		req.Group = "g"
		req.Topics = []kmsg.OffsetDeleteRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 0}}}}
		r := fxRoundTrip[*kmsg.OffsetDeleteResponse](t, rc, req)
		want("OffsetDelete", r.ErrorCode, groupAuth)
	}
	{
		req := kmsg.NewPtrCreateTopicsRequest()
		req.Version, req.TimeoutMillis = 5, 5000
		ct := kmsg.NewCreateTopicsRequestTopic()
		ct.Topic, ct.NumPartitions, ct.ReplicationFactor = "new", 1, 1
		req.Topics = []kmsg.CreateTopicsRequestTopic{ct}
		r := fxRoundTrip[*kmsg.CreateTopicsResponse](t, rc, req)
		want("CreateTopics", r.Topics[0].ErrorCode, topicAuth)
		if ab.store.Topic("new") != nil {
			t.Error("refused CreateTopics created the topic")
		}
	}
	{
		req := kmsg.NewPtrDeleteTopicsRequest()
		req.Version, req.TimeoutMillis, req.TopicNames = 5, 5000, []string{"t"}
		r := fxRoundTrip[*kmsg.DeleteTopicsResponse](t, rc, req)
		want("DeleteTopics", r.Topics[0].ErrorCode, topicAuth)
		if ab.store.Topic("t") == nil {
			t.Fatal("refused DeleteTopics deleted the topic")
		}
	}
	{
		req := kmsg.NewPtrDeleteRecordsRequest()
		req.Version = 2
		rp := kmsg.NewDeleteRecordsRequestTopicPartition()
		rp.Offset = -1
		req.Topics = []kmsg.DeleteRecordsRequestTopic{{Topic: "t", Partitions: []kmsg.DeleteRecordsRequestTopicPartition{rp}}}
		r := fxRoundTrip[*kmsg.DeleteRecordsResponse](t, rc, req)
		want("DeleteRecords", r.Topics[0].Partitions[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrCreatePartitionsRequest()
		req.Version, req.TimeoutMillis = 2, 5000
		req.Topics = []kmsg.CreatePartitionsRequestTopic{{Topic: "t", Count: 3}}
		r := fxRoundTrip[*kmsg.CreatePartitionsResponse](t, rc, req)
		want("CreatePartitions", r.Topics[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrDescribeConfigsRequest()
		req.Version = 3
		req.Resources = []kmsg.DescribeConfigsRequestResource{{ResourceType: kmsg.ConfigResourceTypeTopic, ResourceName: "t"},
			{ResourceType: kmsg.ConfigResourceTypeBroker, ResourceName: "0"}}
		r := fxRoundTrip[*kmsg.DescribeConfigsResponse](t, rc, req)
		want("DescribeConfigs topic", r.Resources[0].ErrorCode, topicAuth)
		want("DescribeConfigs broker", r.Resources[1].ErrorCode, clusterAuth)
	}
	{
		req := kmsg.NewPtrAlterConfigsRequest()
		req.Resources = []kmsg.AlterConfigsRequestResource{{ResourceType: kmsg.ConfigResourceTypeTopic, ResourceName: "t"}}
		r := fxRoundTrip[*kmsg.AlterConfigsResponse](t, rc, req)
		want("AlterConfigs topic", r.Resources[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrIncrementalAlterConfigsRequest()
		req.Resources = []kmsg.IncrementalAlterConfigsRequestResource{{ResourceType: kmsg.ConfigResourceTypeTopic, ResourceName: "t",
			Configs: []kmsg.IncrementalAlterConfigsRequestResourceConfig{{Name: "retention.ms", Value: kmsg.StringPtr("1")}}}}
		r := fxRoundTrip[*kmsg.IncrementalAlterConfigsResponse](t, rc, req)
		want("IncrementalAlterConfigs topic", r.Resources[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrDescribeProducersRequest()
		req.Topics = []kmsg.DescribeProducersRequestTopic{{Topic: "t", Partitions: []int32{0}}}
		r := fxRoundTrip[*kmsg.DescribeProducersResponse](t, rc, req)
		want("DescribeProducers", r.Topics[0].Partitions[0].ErrorCode, topicAuth)
	}
	{
		req := kmsg.NewPtrDescribeTransactionsRequest()
		req.TransactionalIDs = []string{"x"}
		r := fxRoundTrip[*kmsg.DescribeTransactionsResponse](t, rc, req)
		want("DescribeTransactions", r.TransactionStates[0].ErrorCode, txnAuth)
	}
	{
		req := kmsg.NewPtrDescribeClusterRequest()
		req.IncludeClusterAuthorizedOperations = true
		r := fxRoundTrip[*kmsg.DescribeClusterResponse](t, rc, req)
		if r.ErrorCode != 0 || r.ClusterAuthorizedOperations != 0 {
			t.Errorf("DescribeCluster: %v, ops %b", kerr.ErrorForCode(r.ErrorCode), r.ClusterAuthorizedOperations)
		}
	}
	{
		r := fxRoundTrip[*kmsg.DescribeACLsResponse](t, rc, &kmsg.DescribeACLsRequest{Version: 1, ResourceType: 1, ResourcePatternType: 1, Operation: 1, PermissionType: 1})
		want("DescribeAcls", r.ErrorCode, clusterAuth)
		c := kmsg.CreateACLsRequestCreation{ResourceType: 2, ResourceName: "t", ResourcePatternType: 3, Principal: "User:nobody", Host: "*", Operation: 2, PermissionType: 3}
		cr := fxRoundTrip[*kmsg.CreateACLsResponse](t, rc, &kmsg.CreateACLsRequest{Version: 1, Creations: []kmsg.CreateACLsRequestCreation{c}})
		want("CreateAcls", cr.Results[0].ErrorCode, clusterAuth)
		dr := fxRoundTrip[*kmsg.DeleteACLsResponse](t, rc, &kmsg.DeleteACLsRequest{Version: 1, Filters: []kmsg.DeleteACLsRequestFilter{{ResourceType: 1, ResourcePatternType: 1, Operation: 1, PermissionType: 1}}})
		want("DeleteAcls", dr.Results[0].ErrorCode, clusterAuth)
	}
	if got := ab.srv.deps.ACL.Describe(aclAnyFilter()); len(got) != 0 {
		t.Errorf("refused CreateAcls stored %+v", got)
	}
}

func quotaProduceRaw(t *testing.T, rc *rawConn, topic string, batch []byte) *kmsg.ProduceResponse {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 9, -1, 5000
	req.Topics = []kmsg.ProduceRequestTopic{{Topic: topic, Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: batch}}}}
	return fxRoundTrip[*kmsg.ProduceResponse](t, rc, req)
}
