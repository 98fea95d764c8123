// Command txnload drives many small transactions at a Kafka-compatible broker: N transactional
// producers, each in its own goroutine, loop BeginTransaction → produce one record → commit for a
// fixed duration, and it reports commits/s with the latency of the commit (the EndTransaction
// call, which is one EndTxn round trip: under KIP-890 part 2 the produce itself registered the
// partition) and of the whole begin/produce/commit cycle. Compare brokers on the cycle and on
// commits/s, not on EndTxn alone: Apache Kafka answers EndTxn once PrepareCommit is logged and
// writes the markers afterwards, so its marker cost lands on the next produce (retried on
// CONCURRENT_TRANSACTIONS until the markers are written); kaas answers EndTxn only after the
// markers and CompleteCommit are durable (server/26_end_txn.go), so its EndTxn holds it all.
//
//	go run ./bench/txnload --brokers 127.0.0.1:9092 --producers 16 --duration 20s
//
// It serves both bench/perf-txn.sh (issue 4) and the side-by-side harness (issue 5, S4), so the
// same numbers come out for kaas and for Apache Kafka: the last stdout line is one JSON object,
// the line before it a human summary.
//
// Why one record per transaction: that is the worst case for a transaction coordinator — every
// record pays for a partition registration, the PrepareCommit write, the markers and the
// CompleteCommit write — so commits/s measures the coordinator, not the log.
//
// Each producer runs one untimed warm-up transaction first (InitProducerId, metadata, the first
// connection to the coordinator), then all producers start together. Each producer writes to a
// fixed partition (i mod P) so producers spread evenly over the partitions and over the broker's
// per-partition locks, as they would with keyed records. With --remote-leaders (bench/run S4c)
// each producer's partition is instead one led by another broker than its transaction
// coordinator, so on a cluster every commit crosses brokers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/bench/internal/loadgen"
)

type config struct {
	brokers     string
	producers   int
	duration    time.Duration
	topic       string
	partitions  int
	recordSize  int
	txnIDPrefix string
	versionChk  bool
	callTimeout time.Duration
	remote      bool
}

// result is the JSON line; field names are what bench/perf-txn.sh and the issue-5 harness read.
type result struct {
	Producers     int     `json:"producers"`
	DurationS     float64 `json:"duration_s"`
	Commits       int64   `json:"commits"`
	CommitsPerSec float64 `json:"commits_per_s"`
	EndTxnP50Ms   float64 `json:"end_txn_p50_ms"`
	EndTxnP99Ms   float64 `json:"end_txn_p99_ms"`
	EndTxnMaxMs   float64 `json:"end_txn_max_ms"`
	CycleP50Ms    float64 `json:"cycle_p50_ms"`
	CycleP99Ms    float64 `json:"cycle_p99_ms"`
	ProduceP50Ms  float64 `json:"produce_p50_ms"` // BeginTransaction + the one ProduceSync (first write: registers/verifies the partition)
	ProduceP99Ms  float64 `json:"produce_p99_ms"`
	// --remote-leaders: producers per coordinator broker id, and how many producers write to a
	// partition led by another broker than their transaction coordinator.
	Coordinators       map[string]int `json:"coordinators,omitempty"`
	RemoteProducers    int            `json:"remote_leader_producers"`
	Errors             int64          `json:"errors"`
	FirstError         string         `json:"first_error,omitempty"`
	RecordSize         int            `json:"record_size"`
	Partitions         int            `json:"partitions"`
	TransactionVersion int16          `json:"transaction_version"` // finalized feature level; -1 unknown/not checked
	EndTxnMaxVersion   int16          `json:"end_txn_max_version"` // -1 unknown/not checked
	ProduceMaxVersion  int16          `json:"produce_max_version"` // -1 unknown/not checked
}

func main() {
	var c config
	flag.StringVar(&c.brokers, "brokers", "127.0.0.1:9092", "comma-separated seed brokers (host:port)")
	flag.IntVar(&c.producers, "producers", 1, "number of transactional producers, one goroutine each")
	flag.DurationVar(&c.duration, "duration", 20*time.Second, "how long to commit transactions")
	flag.StringVar(&c.topic, "topic", "txnload", "topic to write; created if missing")
	flag.IntVar(&c.partitions, "partitions", 6, "partitions of the topic when it is created")
	flag.IntVar(&c.recordSize, "record-size", 100, "bytes of each record's value")
	flag.StringVar(&c.txnIDPrefix, "txn-id-prefix", "txnload", "transactional.id is <prefix>-<i>")
	flag.BoolVar(&c.versionChk, "txn-version-check", false,
		"ask the broker (ApiVersions v3+) for the finalized transaction.version feature and the EndTxn/Produce max versions, "+
			"and report them: TV2 (KIP-890 part 2) changes the wire protocol of a commit, so kaas and Kafka must be compared at the same level")
	flag.BoolVar(&c.remote, "remote-leaders", false,
		"ask FindCoordinator for every producer's transactional id and Metadata for the partitions' leaders, and give each producer "+
			"a partition led by another broker than its coordinator when there is one (round robin per coordinator), so on a cluster "+
			"every commit crosses brokers (verification and markers); on a single broker it changes nothing")
	flag.DurationVar(&c.callTimeout, "call-timeout", 30*time.Second, "bound on each produce; the run is abandoned if a commit takes longer")
	flag.Parse()
	if c.producers < 1 || c.partitions < 1 || c.recordSize < 0 || c.duration <= 0 {
		fmt.Fprintln(os.Stderr, "txnload: --producers and --partitions must be >= 1, --duration > 0, --record-size >= 0")
		os.Exit(2)
	}
	res, err := run(c)
	if err != nil {
		fmt.Fprintf(os.Stderr, "txnload: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("txnload: %d producers, %d commits in %.1fs = %.0f commits/s; end_txn p50 %.2f ms p99 %.2f ms max %.2f ms; produce p50 %.2f ms p99 %.2f ms; cycle p50 %.2f ms p99 %.2f ms; errors %d; transaction.version %d; coordinators %v, %d producers on a remote leader\n",
		res.Producers, res.Commits, res.DurationS, res.CommitsPerSec, res.EndTxnP50Ms, res.EndTxnP99Ms, res.EndTxnMaxMs,
		res.ProduceP50Ms, res.ProduceP99Ms, res.CycleP50Ms, res.CycleP99Ms, res.Errors, res.TransactionVersion,
		res.Coordinators, res.RemoteProducers)
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	if res.Commits == 0 {
		os.Exit(1)
	}
}

func run(c config) (result, error) {
	seeds := strings.Split(c.brokers, ",")
	res := result{Producers: c.producers, RecordSize: c.recordSize, Partitions: c.partitions,
		TransactionVersion: -1, EndTxnMaxVersion: -1, ProduceMaxVersion: -1}

	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return res, fmt.Errorf("cannot create admin client (%s): %w", c.brokers, err)
	}
	defer admin.Close()
	if err := loadgen.EnsureTopic(admin, c.topic, c.partitions); err != nil {
		return res, err
	}
	if c.versionChk {
		if err := versionCheck(admin, &res); err != nil {
			return res, err
		}
	}

	// Each producer's partition: i mod P, or with --remote-leaders one led by another broker than
	// the producer's coordinator.
	parts := make([]int32, c.producers)
	for i := range parts {
		parts[i] = int32(i % c.partitions)
	}
	if c.remote {
		if err := placeRemote(admin, c, parts, &res); err != nil {
			return res, err
		}
	}

	// Producers: created and warmed up before the clock starts.
	clients := make([]*kgo.Client, c.producers)
	defer func() {
		for _, cl := range clients {
			if cl != nil {
				cl.Close()
			}
		}
	}()
	value := make([]byte, c.recordSize)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	var warm sync.WaitGroup
	warmErr := make([]error, c.producers)
	for i := range clients {
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(seeds...),
			kgo.TransactionalID(fmt.Sprintf("%s-%d", c.txnIDPrefix, i)),
			kgo.DefaultProduceTopic(c.topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()),
			kgo.ProducerLinger(0),
		)
		if err != nil {
			return res, fmt.Errorf("cannot create producer (%d): %w", i, err)
		}
		clients[i] = cl
		warm.Add(1)
		go func() {
			defer warm.Done()
			_, _, _, warmErr[i] = cycle(cl, c, parts[i], value)
		}()
	}
	warm.Wait()
	if err := errors.Join(warmErr...); err != nil {
		return res, fmt.Errorf("cannot run the warm-up transactions: %w", err)
	}

	var (
		wg       sync.WaitGroup
		commits  atomic.Int64
		errCount atomic.Int64
		firstErr atomic.Pointer[string]
		endLat   = make([][]time.Duration, c.producers)
		cycLat   = make([][]time.Duration, c.producers)
		prodLat  = make([][]time.Duration, c.producers)
	)
	start := time.Now()
	end := start.Add(c.duration)
	// Watchdog: a broker that stops answering must not hang the benchmark script. EndTransaction
	// is not given a cancellable context (cancelling it leaves the outcome unknown), so the bound
	// is here instead.
	watchdog := time.AfterFunc(c.duration+2*c.callTimeout, func() {
		fmt.Fprintf(os.Stderr, "txnload: still running %s after the deadline; abandoning (commits so far %d, errors %d)\n",
			2*c.callTimeout, commits.Load(), errCount.Load())
		os.Exit(3)
	})
	defer watchdog.Stop()
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := parts[i]
			ends := make([]time.Duration, 0, 4096)
			cycs := make([]time.Duration, 0, 4096)
			prods := make([]time.Duration, 0, 4096)
			consecutive := 0
			for time.Now().Before(end) {
				p, e, cy, err := cycle(cl, c, part, value)
				if err != nil {
					errCount.Add(1)
					s := fmt.Sprintf("producer %d: %v", i, err)
					firstErr.CompareAndSwap(nil, &s)
					// Abort whatever is open, as EndTransaction's contract asks, and carry on; a
					// producer that keeps failing stops so the run still ends with a report.
					_ = cl.EndTransaction(context.Background(), kgo.TryAbort)
					if consecutive++; consecutive >= 20 {
						return
					}
					continue
				}
				consecutive = 0
				commits.Add(1)
				ends = append(ends, e)
				cycs = append(cycs, cy)
				prods = append(prods, p)
			}
			endLat[i], cycLat[i], prodLat[i] = ends, cycs, prods
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	res.DurationS = loadgen.Round2(elapsed.Seconds())
	res.Commits = commits.Load()
	res.CommitsPerSec = loadgen.Round2(float64(res.Commits) / elapsed.Seconds())
	res.Errors = errCount.Load()
	if p := firstErr.Load(); p != nil {
		res.FirstError = *p
	}
	e := slices.Concat(endLat...)
	cy := slices.Concat(cycLat...)
	slices.Sort(e)
	slices.Sort(cy)
	res.EndTxnP50Ms, res.EndTxnP99Ms = loadgen.Quantile(e, 0.50), loadgen.Quantile(e, 0.99)
	if len(e) > 0 {
		res.EndTxnMaxMs = loadgen.Ms(e[len(e)-1])
	}
	res.CycleP50Ms, res.CycleP99Ms = loadgen.Quantile(cy, 0.50), loadgen.Quantile(cy, 0.99)
	pr := slices.Concat(prodLat...)
	slices.Sort(pr)
	res.ProduceP50Ms, res.ProduceP99Ms = loadgen.Quantile(pr, 0.50), loadgen.Quantile(pr, 0.99)
	return res, nil
}

// placeRemote fills parts for --remote-leaders: every producer's coordinator (FindCoordinator
// v4, all ids in one request, retried while a slot has no owner yet) and every partition's
// leader (Metadata); producer i gets the next partition, round robin per coordinator, among
// those whose leader is not its coordinator. A producer whose coordinator leads every partition
// (a single broker) keeps i mod P.
func placeRemote(admin *kgo.Client, c config, parts []int32, res *result) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := make([]string, len(parts))
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", c.txnIDPrefix, i)
	}
	coord := make(map[string]int32, len(ids))
	for len(coord) < len(ids) {
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.CoordinatorType = 1
		for _, id := range ids {
			if _, ok := coord[id]; !ok {
				req.CoordinatorKeys = append(req.CoordinatorKeys, id)
			}
		}
		resp, err := req.RequestWith(ctx, admin)
		if err == nil {
			for _, k := range resp.Coordinators {
				if k.ErrorCode == 0 && k.NodeID >= 0 {
					coord[k.Key] = k.NodeID
				}
			}
		}
		if len(coord) < len(ids) {
			if ctx.Err() != nil {
				return fmt.Errorf("cannot find the coordinators of %d transactional ids (%s-*): %w", len(ids)-len(coord), c.txnIDPrefix, ctx.Err())
			}
			time.Sleep(100 * time.Millisecond) // polling the cluster for slot owners
		}
	}
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(c.topic)
	mreq.Topics = append(mreq.Topics, mt)
	md, err := mreq.RequestWith(ctx, admin)
	if err != nil || len(md.Topics) != 1 {
		return fmt.Errorf("cannot read the leaders of %s: %v", c.topic, err)
	}
	leader := map[int32]int32{}
	for _, p := range md.Topics[0].Partitions {
		leader[p.Partition] = p.Leader
	}
	res.Coordinators = map[string]int{}
	next := map[int32]int{} // per coordinator: round-robin position among its remote partitions
	for i, id := range ids {
		co := coord[id]
		res.Coordinators[fmt.Sprint(co)]++
		var remote []int32
		for p := int32(0); p < int32(c.partitions); p++ {
			if l, ok := leader[p]; ok && l != co {
				remote = append(remote, p)
			}
		}
		if len(remote) == 0 {
			continue
		}
		parts[i] = remote[next[co]%len(remote)]
		next[co]++
		res.RemoteProducers++
	}
	fmt.Fprintf(os.Stderr, "txnload: coordinators %v, %d of %d producers on a partition led by another broker\n",
		res.Coordinators, res.RemoteProducers, len(ids))
	return nil
}

// cycle runs one begin → produce → commit transaction and returns the latency of begin and
// produce, of the commit (the EndTransaction call) and of the whole cycle.
func cycle(cl *kgo.Client, c config, part int32, value []byte) (produce, endTxn, whole time.Duration, err error) {
	t0 := time.Now()
	if err := cl.BeginTransaction(); err != nil {
		return 0, 0, 0, fmt.Errorf("cannot begin transaction: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.callTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Partition: part, Value: value}).FirstErr(); err != nil {
		return 0, 0, 0, fmt.Errorf("cannot produce in transaction (partition %d): %w", part, err)
	}
	t1 := time.Now()
	if err := cl.EndTransaction(context.Background(), kgo.TryCommit); err != nil {
		return 0, 0, 0, fmt.Errorf("cannot commit transaction: %w", err)
	}
	t2 := time.Now()
	return t1.Sub(t0), t2.Sub(t1), t2.Sub(t0), nil
}

// ensureTopic creates the topic with RF 1 unless it exists.
// versionCheck reads the finalized transaction.version feature (KIP-1022; 2 = KIP-890 part 2:
// produce registers the partition, EndTxn v5 bumps the epoch each commit) and max versions.
func versionCheck(cl *kgo.Client, res *result) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName = "kaas-txnload"
	req.ClientSoftwareVersion = "1"
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("cannot request api versions: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("cannot read api versions: %w", err)
	}
	res.TransactionVersion = 0 // absent from the finalized features = level 0
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "transaction.version" {
			res.TransactionVersion = f.MaxVersionLevel
		}
	}
	for _, k := range resp.ApiKeys {
		switch k.ApiKey {
		case int16(kmsg.EndTxn):
			res.EndTxnMaxVersion = k.MaxVersion
		case int16(kmsg.Produce):
			res.ProduceMaxVersion = k.MaxVersion
		}
	}
	fmt.Fprintf(os.Stderr, "txnload: transaction.version %d, EndTxn max v%d, Produce max v%d\n",
		res.TransactionVersion, res.EndTxnMaxVersion, res.ProduceMaxVersion)
	return nil
}
