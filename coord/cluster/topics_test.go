package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// checkTopicCAS runs against any Backend: of two concurrent creators exactly one wins, and the
// record then follows SetPartitions/DeleteTopic with Kafka's errors.
func checkTopicCAS(t *testing.T, b Backend) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = CreateTopic(ctx, b, testPrefix, TopicMeta{Name: "orders", ID: [16]byte{byte(i + 1)}, Partitions: 3, RF: 1,
				Configs: map[string]string{"cleanup.policy": "delete"}})
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatal("both creators won")
			}
			winner = i
		case !errors.Is(err, ErrTopicExists):
			t.Fatalf("creator %d: %v, want ErrTopicExists", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no creator won")
	}
	ts, _, err := ListTopics(ctx, b, testPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0].Name != "orders" || ts[0].ID != [16]byte{byte(winner + 1)} || ts[0].Partitions != 3 || ts[0].RF != 1 ||
		ts[0].Configs["cleanup.policy"] != "delete" {
		t.Fatalf("topics = %+v, want the winner's record", ts)
	}
	if err := SetPartitions(ctx, b, testPrefix, "orders", 3); !errors.Is(err, ErrInvalidPartitions) {
		t.Fatalf("SetPartitions to the same count: %v, want ErrInvalidPartitions", err)
	}
	if err := SetPartitions(ctx, b, testPrefix, "orders", 5); err != nil {
		t.Fatal(err)
	}
	if err := SetPartitions(ctx, b, testPrefix, "nope", 5); !errors.Is(err, ErrUnknownTopic) {
		t.Fatalf("SetPartitions of a missing topic: %v", err)
	}
	ts, _, _ = ListTopics(ctx, b, testPrefix)
	if len(ts) != 1 || ts[0].Partitions != 5 || ts[0].ID != [16]byte{byte(winner + 1)} {
		t.Fatalf("after SetPartitions: %+v", ts)
	}
	if gone, err := DeleteTopic(ctx, b, testPrefix, "orders"); err != nil || gone.ID != [16]byte{byte(winner + 1)} {
		t.Fatalf("delete: %+v %v, want the winner's record", gone, err)
	}
	if _, err := DeleteTopic(ctx, b, testPrefix, "orders"); !errors.Is(err, ErrUnknownTopic) {
		t.Fatalf("second delete: %v, want ErrUnknownTopic", err)
	}
	if err := CreateTopic(ctx, b, testPrefix, TopicMeta{Name: "zero", Partitions: 0}); !errors.Is(err, ErrInvalidPartitions) {
		t.Fatalf("create with 0 partitions: %v", err)
	}
}

func TestTopicCreateCASOneWinnerFake(t *testing.T) {
	checkTopicCAS(t, NewFake(NewManualClock(time.Time{})))
}

// Concurrent growers both land: SetPartitions retries its ModRevision CAS on a conflict and
// never shrinks.
func TestSetPartitionsConcurrentGrowersKeepTheLargest(t *testing.T) {
	ctx := context.Background()
	f := NewFake(NewManualClock(time.Time{}))
	if err := CreateTopic(ctx, f, testPrefix, TopicMeta{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for n := int32(2); n <= 9; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := SetPartitions(ctx, f, testPrefix, "t", n); err != nil && !errors.Is(err, ErrInvalidPartitions) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ts, _, _ := ListTopics(ctx, f, testPrefix)
	if len(ts) != 1 || ts[0].Partitions != 9 {
		t.Fatalf("topics = %+v, want 9 partitions", ts)
	}
}
