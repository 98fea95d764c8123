package server

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

// clusterAlterTopic sends one IncrementalAlterConfigs SET of kv for topic to broker id only, on
// its own connection.
func clusterAlterTopic(t *testing.T, tc *testCluster, id int32, topic string, kv map[string]string) {
	t.Helper()
	req := clusterAlterRequest(topic, kv)
	resp := fxRoundTrip[*kmsg.IncrementalAlterConfigsResponse](t, dialRaw(t, tc.broker(id).Addr().String()), req)
	if c := resp.Resources[0].ErrorCode; c != codec.CodeNone {
		t.Fatalf("IncrementalAlterConfigs %v through broker %d: %v", kv, id, kerr.ErrorForCode(c))
	}
}

func clusterAlterRequest(topic string, kv map[string]string) *kmsg.IncrementalAlterConfigsRequest {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	req.Version = 1
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	for k, v := range kv {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Op, c.Value = k, kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(v)
		r.Configs = append(r.Configs, c)
	}
	req.Resources = []kmsg.IncrementalAlterConfigsRequestResource{r}
	return req
}

// clusterTopicOverrides is what DescribeConfigs through broker id reports as topic-level
// overrides (source DYNAMIC_TOPIC_CONFIG) of topic.
func clusterTopicOverrides(t *testing.T, tc *testCluster, id int32, topic string) map[string]string {
	t.Helper()
	req := kmsg.NewPtrDescribeConfigsRequest()
	req.Version = 4
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	req.Resources = []kmsg.DescribeConfigsRequestResource{r}
	resp := fxRoundTrip[*kmsg.DescribeConfigsResponse](t, dialRaw(t, tc.broker(id).Addr().String()), req)
	if c := resp.Resources[0].ErrorCode; c != codec.CodeNone {
		t.Fatalf("DescribeConfigs through broker %d: %v", id, kerr.ErrorForCode(c))
	}
	out := map[string]string{}
	for _, c := range resp.Resources[0].Configs {
		if c.Source == kmsg.ConfigSourceDynamicTopicConfig && c.Value != nil {
			out[c.Name] = *c.Value
		}
	}
	return out
}

// TestClusterTopicConfigChangeAppliesOnEveryBroker: a topic config changed through one broker
// is the topic's config on every broker (DescribeConfigs through each, and what each one's
// storage runs with: the leaders' cleaners and flushers), as Apache's brokers all follow the
// controller's config records; alters through different brokers at once all land (the
// registry's compare-and-swap); a restarted broker takes the registry's overrides over the
// volume's topic.json; legacy AlterConfigs (set-all) replaces them everywhere.
func TestClusterTopicConfigChangeAppliesOnEveryBroker(t *testing.T) {
	tc := startTestCluster(t, 3)
	const topic = "cfgwide"
	tc.createTopic(topic, 3, 3)

	everyBroker := func(what string, want map[string]string) {
		t.Helper()
		checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			for id := int32(1); id <= 3; id++ {
				if got := clusterTopicOverrides(t, tc, id, topic); !maps.Equal(got, want) {
					return fmt.Errorf("%s: broker %d describes overrides %v, want %v", what, id, got, want)
				}
				if got := tc.broker(id).Store.Topic(topic).Overrides(); !maps.Equal(got, want) {
					return fmt.Errorf("%s: broker %d's storage runs with overrides %v, want %v", what, id, got, want)
				}
			}
			return nil
		})
	}

	clusterAlterTopic(t, tc, 1, topic, map[string]string{"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"})
	// The broker that served the change shows it in its answer's wake, with no wait.
	if got := clusterTopicOverrides(t, tc, 1, topic); got["min.compaction.lag.ms"] != "3600000" {
		t.Fatalf("broker 1 right after its own alter: overrides %v", got)
	}
	want := map[string]string{"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"}
	everyBroker("after an alter through broker 1", want)
	if cfg := tc.broker(3).Store.Topic(topic).Config(); cfg.MinCompactionLagMs() != 3600000 {
		t.Fatalf("broker 3's cleaner would use min.compaction.lag.ms %d", cfg.MinCompactionLagMs())
	}

	// Nine alters of different keys through the three brokers at once: each one's
	// read-modify-write of the overrides must keep the others' keys.
	keys := []string{"retention.ms", "segment.ms", "max.message.bytes", "delete.retention.ms",
		"min.cleanable.dirty.ratio", "max.compaction.lag.ms", "segment.bytes", "retention.bytes", "flush.ms"}
	vals := []string{"86400000", "600000", "2000000", "3600000", "0.3", "7200000", "2097152", "1073741824", "5000"}
	cl := tc.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.Ping(ctx); err != nil { // loads the brokers, so Broker(id) dials the right one
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(keys))
	for i := range keys {
		id := int32(i%3) + 1
		req := clusterAlterRequest(topic, map[string]string{keys[i]: vals[i]})
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := cl.Broker(int(id)).Request(ctx, req)
			if err == nil {
				err = kerr.ErrorForCode(resp.(*kmsg.IncrementalAlterConfigsResponse).Resources[0].ErrorCode)
			}
			if err != nil {
				errs <- fmt.Errorf("alter of %s through broker %d: %w", keys[i], id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range keys {
		want[keys[i]] = vals[i]
	}
	everyBroker("after nine concurrent alters through three brokers", want)

	// A restarted broker: the registry's overrides, whatever topic.json on the volume says.
	tc.stop(2)
	tc.start(2)
	tc.waitBrokers(3)
	everyBroker("after broker 2 restarted", want)

	// Legacy AlterConfigs replaces the whole set, cluster-wide.
	areq := kmsg.NewPtrAlterConfigsRequest()
	areq.Version = 1
	ar := kmsg.NewAlterConfigsRequestResource()
	ar.ResourceType, ar.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	ac := kmsg.NewAlterConfigsRequestResourceConfig()
	ac.Name, ac.Value = "retention.ms", kmsg.StringPtr("1000")
	ar.Configs = []kmsg.AlterConfigsRequestResourceConfig{ac}
	areq.Resources = []kmsg.AlterConfigsRequestResource{ar}
	if resp := fxRoundTrip[*kmsg.AlterConfigsResponse](t, dialRaw(t, tc.broker(3).Addr().String()), areq); resp.Resources[0].ErrorCode != codec.CodeNone {
		t.Fatalf("AlterConfigs through broker 3: %v", kerr.ErrorForCode(resp.Resources[0].ErrorCode))
	}
	everyBroker("after a set-all AlterConfigs through broker 3", map[string]string{"retention.ms": "1000"})
}
