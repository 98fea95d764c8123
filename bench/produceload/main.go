// Command produceload pushes acks=all, idempotent records at a Kafka-compatible broker from N
// franz-go producers in one process, for a fixed duration, and reports records/s, MB/s and the
// per-record acknowledgement latency (produce call → promise). It is the S7 "produce ceiling"
// driver of bench/run next to the JVM perf-test producers: on a 2-core machine the JVM clients
// spend more CPU per record than the broker does, so they find the client's ceiling first; a Go
// client costs less per record and gets closer to the broker's own limit over the wire.
//
//	go run ./bench/produceload --brokers 127.0.0.1:9092 --producers 4 --duration 15s
//
// Each producer is its own client (its own connection and idempotent producer id) writing to its
// own topic <topic>-<i> with P partitions, like S7's perf-test producers. Records are spread
// round-robin over the partitions. Up to 5 produce requests are in flight per connection (the
// Java client's default with idempotence) and batches linger 5 ms (Kafka 4.x's linger.ms default),
// so the broker sees what a Java producer would send, minus the JVM.
//
// The last stdout line is one JSON object (what bench/run reads); the line before it a summary.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kaas-go/kaas/bench/internal/loadgen"
)

type result struct {
	Producers  int     `json:"producers"`
	DurationS  float64 `json:"duration_s"`
	Records    int64   `json:"records"`
	RecordsPS  float64 `json:"records_per_s"`
	MBPS       float64 `json:"mb_per_s"` // MiB/s of record values, like perf-test's MB/sec
	AvgMs      float64 `json:"avg_ms"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	P999Ms     float64 `json:"p999_ms"`
	MaxMs      float64 `json:"max_ms"`
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	RecordSize int     `json:"record_size"`
}

func main() {
	var (
		brokers    = flag.String("brokers", "127.0.0.1:9092", "comma-separated seed brokers (host:port)")
		producers  = flag.Int("producers", 1, "number of producer clients")
		duration   = flag.Duration("duration", 15*time.Second, "how long to produce")
		topic      = flag.String("topic", "produceload", "topic prefix; producer i writes <topic>-<i>, created if missing")
		partitions = flag.Int("partitions", 6, "partitions of each topic when created")
		size       = flag.Int("record-size", 1024, "bytes of each record's value")
		buffered   = flag.Int("max-buffered", 20000, "records buffered per producer before Produce blocks (the client's buffer.memory)")
	)
	flag.Parse()
	if *producers < 1 || *partitions < 1 || *size < 0 || *duration <= 0 || *buffered < 1 {
		fmt.Fprintln(os.Stderr, "produceload: --producers, --partitions, --max-buffered >= 1, --duration > 0, --record-size >= 0")
		os.Exit(2)
	}
	res, err := run(strings.Split(*brokers, ","), *producers, *duration, *topic, *partitions, *size, *buffered)
	if err != nil {
		fmt.Fprintf(os.Stderr, "produceload: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("produceload: %d producers, %d records in %.1fs = %.0f rec/s (%.2f MB/s); ack latency avg %.2f p50 %.2f p99 %.2f p99.9 %.2f max %.2f ms; errors %d\n",
		res.Producers, res.Records, res.DurationS, res.RecordsPS, res.MBPS, res.AvgMs, res.P50Ms, res.P99Ms, res.P999Ms, res.MaxMs, res.Errors)
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	if res.Records == 0 || res.Errors > 0 {
		os.Exit(1)
	}
}

func run(seeds []string, n int, d time.Duration, topic string, partitions, size, buffered int) (result, error) {
	res := result{Producers: n, RecordSize: size}
	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return res, err
	}
	defer admin.Close()
	for i := range n {
		if err := loadgen.EnsureTopic(admin, fmt.Sprintf("%s-%d", topic, i), partitions); err != nil {
			return res, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	value := make([]byte, size)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	clients := make([]*kgo.Client, n)
	defer func() {
		for _, cl := range clients {
			if cl != nil {
				cl.Close()
			}
		}
	}()
	for i := range clients {
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(seeds...),
			kgo.DefaultProduceTopic(fmt.Sprintf("%s-%d", topic, i)),
			kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.ProducerLinger(5*time.Millisecond),
			kgo.ProducerBatchMaxBytes(16384+512),
			kgo.MaxBufferedRecords(buffered),
			kgo.RecordPartitioner(kgo.RoundRobinPartitioner()),
		)
		if err != nil {
			return res, err
		}
		clients[i] = cl
		// Warm up: metadata, connection, producer id — outside the clock.
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
			return res, fmt.Errorf("warm-up produce of producer %d: %w", i, err)
		}
	}

	var (
		wg       sync.WaitGroup
		records  atomic.Int64
		errs     atomic.Int64
		firstErr atomic.Pointer[string]
		lats     = make([][]time.Duration, n)
		mus      = make([]sync.Mutex, n)
	)
	start := time.Now()
	end := start.Add(d)
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lats[i] = make([]time.Duration, 0, 1<<16)
			var seq uint64
			for time.Now().Before(end) {
				t0 := time.Now()
				sample := seq%8 == 0 // keep one latency in 8: bounded memory, same distribution
				seq++
				cl.Produce(context.Background(), &kgo.Record{Value: value}, func(_ *kgo.Record, err error) {
					if err != nil {
						errs.Add(1)
						s := err.Error()
						firstErr.CompareAndSwap(nil, &s)
						return
					}
					records.Add(1)
					if sample {
						l := time.Since(t0)
						mus[i].Lock()
						lats[i] = append(lats[i], l)
						mus[i].Unlock()
					}
				})
			}
			// Every record handed over counts once acknowledged: the span ends at the last ack.
			_ = cl.Flush(context.Background())
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	var all []time.Duration
	for i := range lats {
		all = append(all, lats[i]...)
	}
	slices.Sort(all)
	var sum time.Duration
	for _, l := range all {
		sum += l
	}
	res.DurationS = loadgen.Round2(elapsed.Seconds())
	res.Records = records.Load()
	res.RecordsPS = float64(res.Records) / elapsed.Seconds()
	res.MBPS = res.RecordsPS * float64(size) / (1 << 20)
	if len(all) > 0 {
		res.AvgMs = float64(sum.Microseconds()) / 1000 / float64(len(all))
		res.MaxMs = loadgen.Ms(all[len(all)-1])
	}
	res.P50Ms, res.P99Ms, res.P999Ms = loadgen.Quantile(all, 0.50), loadgen.Quantile(all, 0.99), loadgen.Quantile(all, 0.999)
	res.RecordsPS, res.MBPS, res.AvgMs = loadgen.Round2(res.RecordsPS), loadgen.Round2(res.MBPS), loadgen.Round2(res.AvgMs)
	res.Errors = errs.Load()
	if p := firstErr.Load(); p != nil {
		res.FirstError = *p
	}
	return res, nil
}
