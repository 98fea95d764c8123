// Command compactload is the S9 ("compaction") driver of bench/run: it fills a topic with K keys
// × M versions, switches a topic's cleanup.policy, and runs a fixed-rate acks=all produce load
// whose per-record acknowledgement latency shows what a running log cleaner costs produce.
//
//	compactload fill   --brokers B --topic T --keys K --versions M --record-size 1024 --segment-bytes N
//	compactload policy --brokers B --topic T --policy compact
//	compactload load   --brokers B --topic T --rate 2000 --duration 20s --record-size 1024
//
// fill creates T (1 partition) with cleanup.policy=delete, retention unbounded, the given
// segment.bytes, min.cleanable.dirty.ratio=0.01 and min.compaction.lag.ms=0, then writes version
// 1 of every key, version 2 of every key, … (so every closed segment holds superseded records and
// a clean keeps only the last version, about 1/M of the log). The topic is filled under
// cleanup.policy=delete so that no clean starts before the fill ends on either broker; `policy`
// then turns compaction on (IncrementalAlterConfigs), and the broker's cleaner picks the
// partition up at its next check (log.cleaner.backoff.ms).
//
// load sends records at a fixed rate (a ticker, so a slow broker builds a queue that shows in
// the latency instead of lowering the rate) and reports the latency of every record from the
// moment it was due to its acknowledgement.
//
// The last stdout line is one JSON object (what bench/run reads).
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kaas-go/kaas/bench/internal/loadgen"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compactload fill|policy|load [flags] (see the package comment)")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var (
		brokers  = fs.String("brokers", "127.0.0.1:9092", "comma-separated seed brokers")
		topic    = fs.String("topic", "compactload", "topic")
		keys     = fs.Int("keys", 10000, "fill: distinct keys")
		versions = fs.Int("versions", 50, "fill: versions of each key")
		size     = fs.Int("record-size", 1024, "bytes of each record's value")
		segBytes = fs.Int64("segment-bytes", 16<<20, "fill: segment.bytes of the topic")
		policy   = fs.String("policy", "compact", "policy: the cleanup.policy to set")
		rate     = fs.Int("rate", 2000, "load: records per second")
		duration = fs.Duration("duration", 20*time.Second, "load: how long to produce")
		parts    = fs.Int("partitions", 1, "load: partitions of the load topic when created")
		latOut   = fs.String("latencies", "", "load: also write every record's \"due_unix_ns latency_ns\" to this file (bench/run takes the p99 over the clean's window from it)")
	)
	_ = fs.Parse(os.Args[2:])
	seeds := strings.Split(*brokers, ",")
	var (
		out any
		err error
	)
	switch os.Args[1] {
	case "fill":
		out, err = fill(seeds, *topic, *keys, *versions, *size, *segBytes)
	case "policy":
		err = setPolicy(seeds, *topic, *policy)
		out = map[string]string{"topic": *topic, "cleanup.policy": *policy}
	case "load":
		out, err = load(seeds, *topic, *parts, *rate, *duration, *size, *latOut)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "compactload %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}

func producer(seeds []string, topic string, extra ...kgo.Opt) (*kgo.Client, error) {
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.ProducerBatchMaxBytes(16384 + 512),
		// perf-test's compression.type default: what the brokers store is what was sent.
		kgo.ProducerBatchCompression(kgo.NoCompression()),
	}, extra...)
	return kgo.NewClient(opts...)
}

type fillResult struct {
	Records  int64   `json:"records"`
	Bytes    int64   `json:"bytes"` // keys + values
	Seconds  float64 `json:"seconds"`
	MBPerSec float64 `json:"mb_per_s"`
}

func fill(seeds []string, topic string, keys, versions, size int, segBytes int64) (fillResult, error) {
	var res fillResult
	cl, err := producer(seeds, topic, kgo.MaxBufferedRecords(20000))
	if err != nil {
		return res, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seg := strconv.FormatInt(segBytes, 10)
	cfg := map[string]*string{
		"cleanup.policy":            kadm.StringPtr("delete"),
		"retention.ms":              kadm.StringPtr("-1"),
		"retention.bytes":           kadm.StringPtr("-1"),
		"segment.bytes":             &seg,
		"min.cleanable.dirty.ratio": kadm.StringPtr("0.01"),
		"min.compaction.lag.ms":     kadm.StringPtr("0"),
	}
	r, err := adm.CreateTopic(ctx, 1, 1, cfg, topic)
	if err == nil {
		err = r.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return res, fmt.Errorf("cannot create topic (%s): %w", topic, err)
	}
	// Random values (slices of a random pool at varying offsets): nothing along the way can
	// shrink them, and a clean's cost is its I/O and key handling, as with real changelogs.
	pool := make([]byte, 4<<20+size)
	_, _ = rand.Read(pool)
	var (
		errs     atomic.Int64
		firstErr atomic.Pointer[string]
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range versions {
		for k := range keys {
			key := fmt.Appendf(nil, "key-%08d", k)
			off := int((res.Records * 7919) % (4 << 20))
			val := pool[off : off+size]
			res.Records++
			res.Bytes += int64(len(key) + len(val))
			wg.Add(1)
			cl.Produce(context.Background(), &kgo.Record{Key: key, Value: val}, func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					errs.Add(1)
					s := err.Error()
					firstErr.CompareAndSwap(nil, &s)
				}
			})
		}
	}
	wg.Wait()
	res.Seconds = loadgen.Round2(time.Since(start).Seconds())
	res.MBPerSec = loadgen.Round2(float64(res.Bytes) / (1 << 20) / time.Since(start).Seconds())
	if n := errs.Load(); n > 0 {
		return res, fmt.Errorf("%d records failed, first: %s", n, *firstErr.Load())
	}
	return res, nil
}

func setPolicy(seeds []string, topic, policy string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "cleanup.policy", Value: &policy}}, topic)
	if err != nil {
		return fmt.Errorf("cannot alter topic config (%s): %w", topic, err)
	}
	for _, r := range rs {
		if r.Err != nil {
			return fmt.Errorf("cannot alter topic config (%s): %w (%s)", topic, r.Err, r.ErrMessage)
		}
	}
	return nil
}

type loadResult struct {
	Records    int64   `json:"records"`
	RatePerSec int     `json:"rate"`
	DurationS  float64 `json:"duration_s"`
	RecordsPS  float64 `json:"records_per_s"`
	AvgMs      float64 `json:"avg_ms"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	P999Ms     float64 `json:"p999_ms"`
	MaxMs      float64 `json:"max_ms"`
	Errors     int64   `json:"errors"`
}

// sample is one acknowledged record: when it was due and how long its acknowledgement took.
type sample struct {
	due time.Time
	lat time.Duration
}

func load(seeds []string, topic string, parts, rate int, d time.Duration, size int, latOut string) (loadResult, error) {
	res := loadResult{RatePerSec: rate}
	if rate < 1 {
		return res, errors.New("--rate must be >= 1")
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return res, err
	}
	defer admin.Close()
	if err := loadgen.EnsureTopic(admin, topic, parts); err != nil {
		return res, err
	}
	cl, err := producer(seeds, topic, kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		return res, err
	}
	defer cl.Close()
	value := make([]byte, size)
	_, _ = rand.Read(value)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
		return res, fmt.Errorf("warm-up produce: %w", err)
	}
	var (
		mu   sync.Mutex
		smp  = make([]sample, 0, int(float64(rate)*d.Seconds())+16)
		errs atomic.Int64
		wg   sync.WaitGroup
	)
	// Records are sent on a fixed schedule (record i is due at start + i/rate), each record's
	// latency measured from when it was due, so a stall of the broker counts in full.
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	n := int64(float64(rate) * d.Seconds())
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		wg.Add(1)
		cl.Produce(context.Background(), &kgo.Record{Value: value}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				errs.Add(1)
				return
			}
			l := time.Since(due)
			mu.Lock()
			smp = append(smp, sample{due, l})
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if latOut != "" {
		var buf []byte
		for _, x := range smp {
			buf = fmt.Appendf(buf, "%d %d\n", x.due.UnixNano(), x.lat.Nanoseconds())
		}
		if err := os.WriteFile(latOut, buf, 0o644); err != nil {
			return res, fmt.Errorf("cannot write latencies (%s): %w", latOut, err)
		}
	}
	lats := make([]time.Duration, len(smp))
	for i, x := range smp {
		lats[i] = x.lat
	}
	slices.Sort(lats)
	var sum time.Duration
	for _, l := range lats {
		sum += l
	}
	ms := func(x time.Duration) float64 { return loadgen.Round2(float64(x) / 1e6) }
	pct := func(q float64) float64 {
		if len(lats) == 0 {
			return 0
		}
		return ms(lats[min(len(lats)-1, int(q*float64(len(lats))))])
	}
	res.Records = int64(len(lats))
	res.Errors = errs.Load()
	res.DurationS = loadgen.Round2(elapsed.Seconds())
	res.RecordsPS = loadgen.Round2(float64(res.Records) / elapsed.Seconds())
	if len(lats) > 0 {
		res.AvgMs = ms(sum / time.Duration(len(lats)))
		res.MaxMs = ms(lats[len(lats)-1])
	}
	res.P50Ms, res.P99Ms, res.P999Ms = pct(0.50), pct(0.99), pct(0.999)
	if res.Errors > 0 {
		return res, fmt.Errorf("%d records failed", res.Errors)
	}
	return res, nil
}
