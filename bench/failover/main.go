// Command failover measures partition failover on a kaas cluster for bench/run's S8, the same
// way the process tests do (cmd/kaas e2e_cluster_test.go): it finds the leader of a partition,
// signals that broker's process itself, and times until a produce to that partition is
// acknowledged again (by whichever broker took over). The produce is sent after the signal, so
// its ack necessarily comes from a live leader.
//
//	failover ready --brokers h:p,h:p,h:p --n 3          wait until every seed lists n brokers and a controller
//	failover run --brokers … --topic t --signal KILL --pids 1=123,2=456,3=789
//	failover txn --brokers … --topic t --txn-id id --pids … --etcd http://127.0.0.1:2379
//
// run prints one JSON line: {"leader":2,"pid":456,"signal":"KILL","failover_ms":3412.5}. bench/run
// restarts the signalled broker afterwards; this program never starts processes.
//
// txn measures a transaction coordinator's failover (issue 10): a transactional producer loops
// begin → 1 record → commit on a partition led by another broker than its coordinator, the
// coordinator is killed with kill -9 mid-stream, and the figure is the time from the kill to the
// first commit answered by another broker (txn.go has the breakdown it prints).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type result struct {
	Leader     int32   `json:"leader"`
	Pid        int     `json:"pid"`
	Signal     string  `json:"signal"`
	FailoverMs float64 `json:"failover_ms"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: failover ready|run|txn [flags] (see the package comment)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "ready":
		err = cmdReady(os.Args[2:])
	case "run":
		err = cmdRun(os.Args[2:])
	case "txn":
		err = cmdTxn(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (ready, run or txn)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
}

// clientOpts: refresh metadata right after a NOT_LEADER or a dead connection (kgo's 5 s
// minimum metadata age would otherwise be most of the figure), with a short constant backoff,
// as in the process tests.
func clientOpts(seeds []string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.MetadataMinAge(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
	}
}

// metadataFrom asks exactly the broker at addr (a fresh client knows only its seed).
func metadataFrom(ctx context.Context, addr, topic string) (*kmsg.MetadataResponse, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequestRetries(0))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	if topic != "" {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
	}
	return req.RequestWith(ctx, cl)
}

// produceWithin produces one record and waits for its ack or ctx's end, whichever is first:
// kgo ignores a record's context once the record may have been sent (an idempotent producer
// cannot drop it without risking a sequence gap), so ProduceSync could block forever when no
// broker takes the partition over.
func produceWithin(ctx context.Context, cl *kgo.Client, r *kgo.Record) error {
	done := make(chan error, 1)
	cl.Produce(ctx, r, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func cmdReady(args []string) error {
	fs := flag.NewFlagSet("ready", flag.ExitOnError)
	brokers := fs.String("brokers", "", "comma-separated seeds")
	n := fs.Int("n", 3, "brokers every seed must list")
	timeout := fs.Duration("timeout", 90*time.Second, "give up after")
	balanced := fs.Bool("txn-balanced", false, "also wait until the 50 transaction slots are spread ±1 over the n brokers")
	_ = fs.Parse(args)
	deadline := time.Now().Add(*timeout)
	var last error
	for time.Now().Before(deadline) {
		last = nil
		for _, addr := range strings.Split(*brokers, ",") {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			md, err := metadataFrom(ctx, addr, "")
			cancel()
			if err == nil && (len(md.Brokers) != *n || md.ControllerID < 0) {
				err = fmt.Errorf("%s lists %d brokers, controller %d", addr, len(md.Brokers), md.ControllerID)
			}
			if err != nil {
				last = err
				break
			}
		}
		if last == nil && *balanced {
			last = txnSlotsBalanced(strings.Split(*brokers, ","), *n)
		}
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
	return fmt.Errorf("cluster not ready within %s: %w", *timeout, last)
}

// parsePids parses --pids: broker id → pid, e.g. 1=123,2=456,3=789.
func parsePids(list string) (map[int32]int, error) {
	pids := map[int32]int{}
	for _, kv := range strings.Split(list, ",") {
		k, v, ok := strings.Cut(kv, "=")
		id, err1 := strconv.Atoi(k)
		pid, err2 := strconv.Atoi(v)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bad --pids entry %q", kv)
		}
		pids[int32(id)] = pid
	}
	return pids, nil
}

func cmdRun(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	brokers := fs.String("brokers", "", "comma-separated seeds")
	topic := fs.String("topic", "", "an existing topic")
	partition := fs.Int("partition", 0, "the partition whose leader is signalled")
	sigName := fs.String("signal", "KILL", "KILL (crash: lease expiry, scan, salvage) or TERM (drain: release record)")
	pidList := fs.String("pids", "", "broker id → pid, e.g. 1=123,2=456,3=789")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after")
	_ = fs.Parse(args)
	seeds := strings.Split(*brokers, ",")
	sig := map[string]syscall.Signal{"KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM}[*sigName]
	if sig == 0 {
		return fmt.Errorf("signal %q: want KILL or TERM", *sigName)
	}
	pids, err := parsePids(*pidList)
	if err != nil {
		return err
	}
	p := int32(*partition)

	cl, err := kgo.NewClient(append(clientOpts(seeds), kgo.DefaultProduceTopic(*topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(*timeout))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	// Warm up: the client has the partition's leader and an idempotent producer id before the
	// signal, so the figure is the failover, not the client's start.
	if err := produceWithin(ctx, cl, &kgo.Record{Partition: p, Value: []byte("warm-up")}); err != nil {
		return fmt.Errorf("cannot produce to %s/%d before the failover: %w", *topic, p, err)
	}
	var leader int32 = -1
	for _, addr := range seeds {
		md, err := metadataFrom(ctx, addr, *topic)
		if err != nil || len(md.Topics) != 1 {
			continue
		}
		for _, mp := range md.Topics[0].Partitions {
			if mp.Partition == p && mp.ErrorCode == 0 {
				leader = mp.Leader
			}
		}
		break
	}
	pid, ok := pids[leader]
	if !ok {
		return fmt.Errorf("leader of %s/%d is %d, which has no pid in --pids", *topic, p, leader)
	}

	start := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("cannot signal broker %d (pid %d): %w", leader, pid, err)
	}
	err = produceWithin(ctx, cl, &kgo.Record{Partition: p, Value: []byte("after-" + *sigName)})
	d := time.Since(start)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no ack within %s", *timeout)
		}
		return fmt.Errorf("produce to %s/%d after signalling broker %d: %w", *topic, p, leader, err)
	}
	return json.NewEncoder(os.Stdout).Encode(result{Leader: leader, Pid: pid, Signal: *sigName,
		FailoverMs: float64(d.Microseconds()) / 1000})
}
