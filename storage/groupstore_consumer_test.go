package storage

import (
	"reflect"
	"testing"
)

func sampleConsumerMeta() *ConsumerGroupMeta {
	return &ConsumerGroupMeta{
		Epoch: 7, AssignmentEpoch: 7, Assignor: "uniform",
		Subscribed: []ConsumerTopic{{Name: "t", ID: [16]byte{1}, Partitions: 4}},
		Members: []ConsumerMember{
			{MemberID: "a", InstanceID: "i", RackID: "r", ClientID: "c", ClientHost: "/h", RebalanceTimeoutMs: 60000,
				TopicNames: []string{"t"}, ServerAssignor: "uniform", State: 1, Epoch: 6, PreviousEpoch: 5,
				Assigned: []ConsumerPartitions{{TopicID: [16]byte{1}, Partitions: []int32{0, 1}}},
				Revoking: []ConsumerPartitions{{TopicID: [16]byte{1}, Partitions: []int32{2}}},
				Target:   []ConsumerPartitions{{TopicID: [16]byte{1}, Partitions: []int32{0, 1}}}},
			{MemberID: "b", Regex: "t.*", Epoch: 7, PreviousEpoch: 6,
				Target: []ConsumerPartitions{{TopicID: [16]byte{1}, Partitions: []int32{2, 3}}}},
		},
	}
}

// TestGroupStoreConsumerGroupSurvivesRestartAndCompaction: op 8 is replayed after a restart and
// carried through compaction; its tombstone and DeleteGroup drop it.
func TestGroupStoreConsumerGroupSurvivesRestartAndCompaction(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	s.compactMin = 1 << 10
	want := sampleConsumerMeta()
	if err := s.StoreConsumerGroup("cg", want); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreConsumerGroup("empty", &ConsumerGroupMeta{Epoch: 3, AssignmentEpoch: 3}); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreConsumerGroup("gone", &ConsumerGroupMeta{Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreConsumerGroup("gone", nil); err != nil {
		t.Fatal(err)
	}
	if !s.HasGroup("cg") || s.HasGroup("gone") {
		t.Fatal("HasGroup does not follow the consumer-group state")
	}
	s.Close()
	s = gsOpen(t, dir)
	s.compactMin = 1 << 10
	got, ok := s.ConsumerGroup("cg")
	if !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("after restart: %+v, want %+v", got, want)
	}
	if m, ok := s.ConsumerGroup("empty"); !ok || m.Epoch != 3 || len(m.Members) != 0 {
		t.Fatalf("empty consumer group after restart: %+v %v", m, ok)
	}
	if _, ok := s.ConsumerGroup("gone"); ok {
		t.Fatal("tombstoned consumer group came back")
	}
	before := gsCompactionsTotal.Get()
	for i := 0; i < 200; i++ {
		if err := s.Commit("filler", []GroupOffset{{Topic: "x", Partition: 0, Offset: int64(i), Metadata: "padding padding"}}); err != nil {
			t.Fatal(err)
		}
	}
	if gsCompactionsTotal.Get() == before {
		t.Fatal("log never compacted")
	}
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	if got, ok := s.ConsumerGroup("cg"); !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("after compaction: %+v", got)
	}
	if err := s.DeleteGroup("cg"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.ConsumerGroup("cg"); ok {
		t.Fatal("DeleteGroup kept the consumer-group state")
	}
}

// TestGroupStoreConsumerGroupClassicMembersSurviveRestart: a consumer group holding classic-
// protocol members (KIP-848 online migration) keeps their session timeout and JoinGroup
// protocols across a restart, next to a member of the consumer protocol.
func TestGroupStoreConsumerGroupClassicMembersSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	s := gsOpen(t, dir)
	want := sampleConsumerMeta()
	want.Members[0].Classic = &ConsumerClassic{SessionTimeoutMs: 45000, Protocols: []ConsumerClassicProtocol{
		{Name: "cooperative-sticky", Metadata: []byte{0, 3, 0, 0}}, {Name: "range", Metadata: []byte{}}}}
	if err := s.StoreConsumerGroup("mixed", want); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = gsOpen(t, dir)
	defer s.Close()
	got, ok := s.ConsumerGroup("mixed")
	if !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("after restart: %+v, want %+v", got, want)
	}
	if got.Members[1].Classic != nil {
		t.Fatal("a consumer-protocol member came back as a classic one")
	}
}
