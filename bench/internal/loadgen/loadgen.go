// Package loadgen holds what the Go load drivers of bench/ (txnload, produceload) share: topic
// setup that waits until the topic is usable, and the latency/rate arithmetic of their reports,
// so both drivers' figures are computed the same way.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// EnsureTopic creates topic with the given partitions (replication factor 1) unless it exists,
// then waits until metadata lists every partition with a leader, so the first produce does not
// race the topic's creation.
func EnsureTopic(cl *kgo.Client, topic string, partitions int) error {
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("cannot create topic (%s): %w", topic, err)
	}
	for {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			if t, ok := md.Topics[topic]; ok && t.Err == nil && len(t.Partitions) > 0 {
				ready := true
				for _, p := range t.Partitions {
					ready = ready && p.Err == nil && p.Leader >= 0
				}
				if ready {
					return nil
				}
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("cannot see topic (%s) in metadata: %w", topic, ctx.Err())
		}
		time.Sleep(100 * time.Millisecond) // polling the broker, not waiting for our own state
	}
}

// Quantile is the nearest-rank q-quantile (0 < q <= 1) of sorted latencies, in milliseconds
// rounded to 0.01; 0 for no samples.
func Quantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(sorted)) * q))
	i = min(max(i, 1), len(sorted))
	return Ms(sorted[i-1])
}

// Ms is d in milliseconds rounded to 0.01.
func Ms(d time.Duration) float64 { return Round2(float64(d) / 1e6) }

// Round2 rounds f to two decimals (report precision).
func Round2(f float64) float64 { return math.Round(f*100) / 100 }
