package topology

import (
	"sync"
	"testing"
)

func TestFNV1a32Vectors(t *testing.T) {
	// Reference values of 32-bit FNV-1a (the "" value is the offset basis).
	for s, want := range map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968} {
		if got := FNV1a32(s); got != want {
			t.Errorf("FNV1a32(%q) = %#x, want %#x", s, got, want)
		}
	}
	if got, want := TxnSlot("foobar"), int(uint32(0xbf9cf968)%50); got != want {
		t.Fatalf("TxnSlot(foobar) = %d, want %d", got, want)
	}
	if got, want := GroupShard("foobar"), int(uint32(0xbf9cf968)%50); got != want {
		t.Fatalf("GroupShard(foobar) = %d, want %d", got, want)
	}
}

func TestNewTableOwnsEverythingAtEpochZero(t *testing.T) {
	tb := NewTable(Broker{ID: 7, Endpoints: []Endpoint{{"PLAINTEXT", "127.0.0.1", 9092}}})
	want := Owner{Broker: 7, Epoch: 0, Local: true, Known: true}
	if got := tb.Partition("t", 3); got != want {
		t.Fatalf("Partition = %+v, want %+v", got, want)
	}
	for i := 0; i < NumTxnSlots; i++ {
		if got := tb.TxnSlot(i); got != want {
			t.Fatalf("TxnSlot(%d) = %+v", i, got)
		}
	}
	for i := 0; i < NumGroupShards; i++ {
		if got := tb.GroupShard(i); got != want {
			t.Fatalf("GroupShard(%d) = %+v", i, got)
		}
	}
	if tb.TxnSlot(NumTxnSlots) != NoOwner || tb.GroupShard(-1) != NoOwner {
		t.Fatal("out-of-range slot / shard must have no owner")
	}
	if tb.LocalID() != 7 || tb.Controller() != 7 {
		t.Fatalf("local %d controller %d", tb.LocalID(), tb.Controller())
	}
	bs := tb.Brokers()
	if len(bs) != 1 || bs[0].ID != 7 {
		t.Fatalf("brokers %+v", bs)
	}
	if ep, ok := bs[0].Endpoint("PLAINTEXT"); !ok || ep.Port != 9092 {
		t.Fatalf("endpoint %+v %v", ep, ok)
	}
	if _, ok := bs[0].Endpoint("SASL_SSL"); ok {
		t.Fatal("unknown listener must not be found")
	}
}

func TestTableSettersDeriveLocal(t *testing.T) {
	tb := NewTable(Broker{ID: 1})
	// Local passed in is ignored: it follows Broker == LocalID.
	tb.SetPartition("t", 0, Owner{Broker: 2, Epoch: 5, Local: true, Known: true})
	tb.SetPartition("t", 1, Owner{Broker: 1, Epoch: 3, Known: true})
	tb.SetPartition("t", 2, Owner{Broker: 9, Epoch: 9, Local: true})
	if got := tb.Partition("t", 0); got != (Owner{Broker: 2, Epoch: 5, Local: false, Known: true}) {
		t.Fatalf("remote partition: %+v", got)
	}
	if got := tb.Partition("t", 1); got != (Owner{Broker: 1, Epoch: 3, Local: true, Known: true}) {
		t.Fatalf("local partition at epoch 3: %+v", got)
	}
	if got := tb.Partition("t", 2); got != NoOwner {
		t.Fatalf("unknown owner: %+v", got)
	}
	if got := tb.Partition("t", 3); got != (Owner{Broker: 1, Epoch: 0, Local: true, Known: true}) {
		t.Fatalf("default: %+v", got)
	}
	tb.ForgetTopic("t")
	if got := tb.Partition("t", 0); !got.Local || got.Epoch != 0 {
		t.Fatalf("after ForgetTopic: %+v", got)
	}

	tb.SetTxnSlot(4, Owner{Broker: 3, Epoch: 2, Known: true})
	tb.SetGroupShard(5, Owner{})
	if got := tb.TxnSlot(4); got.Local || got.Broker != 3 || got.Epoch != 2 {
		t.Fatalf("slot 4: %+v", got)
	}
	if got := tb.GroupShard(5); got != NoOwner {
		t.Fatalf("shard 5: %+v", got)
	}
	if !tb.TxnSlot(3).Local || !tb.GroupShard(4).Local {
		t.Fatal("neighbours changed")
	}

	tb.SetBrokers([]Broker{{ID: 3}, {ID: 1}, {ID: 2}})
	tb.SetController(2)
	bs := tb.Brokers()
	if len(bs) != 3 || bs[0].ID != 1 || bs[1].ID != 2 || bs[2].ID != 3 || tb.Controller() != 2 {
		t.Fatalf("brokers %+v controller %d", bs, tb.Controller())
	}
	tb.SetLocalEndpoint(Endpoint{"PLAINTEXT", "h", 1})
	tb.SetLocalEndpoint(Endpoint{"PLAINTEXT", "h", 2})
	if ep, ok := tb.Brokers()[0].Endpoint("PLAINTEXT"); !ok || ep.Port != 2 || len(tb.Brokers()[0].Endpoints) != 1 {
		t.Fatalf("local endpoint %+v", tb.Brokers()[0])
	}
	if len(bs[0].Endpoints) != 0 {
		t.Fatal("an earlier Brokers() answer changed under its reader")
	}
}

func TestPartitionOwnerMapsInternalTopics(t *testing.T) {
	tb := NewTable(Broker{ID: 1})
	tb.SetGroupShard(7, Owner{Broker: 2, Epoch: 4, Known: true})
	tb.SetTxnSlot(8, Owner{Broker: 3, Epoch: 6, Known: true})
	if got := PartitionOwner(tb, GroupsTopic, 7); got.Broker != 2 || got.Epoch != 4 || got.Local {
		t.Fatalf("__consumer_offsets-7: %+v", got)
	}
	if got := PartitionOwner(tb, TxnTopic, 8); got.Broker != 3 || got.Epoch != 6 {
		t.Fatalf("__transaction_state-8: %+v", got)
	}
	if got := PartitionOwner(tb, TxnTopic, 50); got != NoOwner {
		t.Fatalf("__transaction_state-50: %+v", got)
	}
	if got := PartitionOwner(tb, "_other", 7); !got.Local {
		t.Fatalf("user topic: %+v", got)
	}
	if n, ok := InternalPartitions(GroupsTopic); !ok || n != 50 {
		t.Fatal("InternalPartitions(__consumer_offsets)")
	}
	if _, ok := InternalPartitions("__consumer_offsets2"); ok {
		t.Fatal("InternalPartitions matched a user topic")
	}
}

// TestTableConcurrentReadersSeeWholeSnapshots races readers against writers: each write moves
// a partition and a slot together, and a reader must never see a half-applied one.
func TestTableConcurrentReadersSeeWholeSnapshots(t *testing.T) {
	tb := NewTable(Broker{ID: 1})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := tb.Partition("t", 0)
				if o.Known && o.Epoch < 0 {
					t.Errorf("torn owner %+v", o)
					return
				}
			}
		}()
	}
	for e := int32(1); e <= 500; e++ {
		tb.SetPartitions(map[TopicPartition]Owner{{"t", 0}: {Broker: e % 3, Epoch: e, Known: true}, {"t", 1}: {Broker: 1, Epoch: e, Known: true}})
		tb.SetTxnSlot(int(e)%NumTxnSlots, Owner{Broker: 2, Epoch: e, Known: true})
	}
	close(stop)
	wg.Wait()
	if got := tb.Partition("t", 0); got.Epoch != 500 || got.Broker != 500%3 {
		t.Fatalf("last write lost: %+v", got)
	}
}

func TestTableRequireLoadKeepsLocalAsPassed(t *testing.T) {
	tb := NewTable(Broker{ID: 1})
	tb.RequireLoad()
	if got := tb.Partition("t", 0); got != NoOwner {
		t.Fatalf("default after RequireLoad %+v, want NoOwner", got)
	}
	if tb.TxnSlot(0) != NoOwner || tb.GroupShard(49) != NoOwner {
		t.Fatal("slots and shards still owned after RequireLoad")
	}
	// Assigned to this broker but not loaded yet: Known, not Local.
	tb.SetPartition("t", 0, Owner{Broker: 1, Epoch: 3, Known: true})
	if got := tb.Partition("t", 0); got != (Owner{Broker: 1, Epoch: 3, Known: true}) {
		t.Fatalf("assigned, not loaded: %+v", got)
	}
	tb.SetGroupShard(2, Owner{Broker: 1, Epoch: 3, Known: true, Local: true})
	if got := tb.GroupShard(2); !got.Local {
		t.Fatalf("loaded shard %+v, want Local", got)
	}
	// Local is never true for another broker.
	tb.SetTxnSlot(2, Owner{Broker: 2, Epoch: 3, Known: true, Local: true})
	if got := tb.TxnSlot(2); got.Local {
		t.Fatalf("slot of broker 2 %+v is Local", got)
	}
	tb.ForgetTopic("t")
	if got := tb.Partition("t", 0); got != NoOwner {
		t.Fatalf("forgotten partition %+v, want NoOwner", got)
	}
}
