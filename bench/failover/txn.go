package main

// failover txn: the time a transactional producer is stopped by a kill -9 of its transaction
// coordinator, and where that time goes.
//
// Timeline, every mark measured from the kill (this process sends SIGKILL itself):
//
//	kill ──▶ lease_gone ──▶ reassigned ──▶ serving ──▶ first commit
//	         brokers/<C>     assign/txn/<slot>   DescribeTransactions   EndTxn answered by a
//	         deleted in etcd put, owner ≠ C      on the new owner       broker other than C
//	         (session TTL)   (controller)        answers (slot loaded)  (client retries + one commit)
//
// The two etcd marks come from watches opened before the kill (receive time here, so they
// include etcd's own delivery, well under a millisecond on loopback). "serving" polls
// DescribeTransactions for the id every 5 ms at the two surviving brokers: kaas answers
// NOT_COORDINATOR until the agent has finished loading the slot (Owner.Local), so the first
// answer with no error is the moment the new coordinator serves. The commit mark needs the
// producer's own retries too: kgo backs off (100 ms here, as in run) between FindCoordinator
// and EndTxn attempts, so serving → commit is mostly that backoff.
//
// The producer writes to a partition led by another broker than the coordinator, so the figure
// is the coordinator's failover alone, not a partition's as well.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// txnResult is txn's JSON line; every *_ms is measured from the kill, -1 when not observed.
type txnResult struct {
	TxnID          string  `json:"txn_id"`
	Slot           int     `json:"slot"`
	Coordinator    int32   `json:"coordinator"`
	Pid            int     `json:"pid"`
	Partition      int32   `json:"partition"`
	Leader         int32   `json:"leader"`
	NewCoordinator int32   `json:"new_coordinator"`
	LeaseGoneMs    float64 `json:"lease_gone_ms"`
	ReassignedMs   float64 `json:"reassigned_ms"`
	ServingMs      float64 `json:"serving_ms"`
	FailoverMs     float64 `json:"failover_ms"` // kill → the first commit answered by another broker
	CommitsBefore  int64   `json:"commits_before"`
	Errors         int64   `json:"errors"` // failed transactions (each aborted, then the loop goes on)
	FirstError     string  `json:"first_error,omitempty"`
}

// txnSlot is the transaction slot of a transactional id: fnv1a32(id) % 50, the same function
// the brokers use (coord/topology), written out here so the driver stays a plain client.
func txnSlot(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % 50)
}

// endTxnNode is a kgo hook that remembers which broker answered the last EndTxn read without
// an error: EndTransaction runs on one goroutine, so the last such read before it returns nil
// is the answer it acted on.
type endTxnNode struct{ node atomic.Int32 }

func (h *endTxnNode) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.EndTxn) && err == nil {
		h.node.Store(meta.NodeID)
	}
}

func cmdTxn(args []string) error {
	fs := flag.NewFlagSet("txn", flag.ExitOnError)
	brokers := fs.String("brokers", "", "comma-separated seeds")
	topic := fs.String("topic", "", "an existing topic")
	txnID := fs.String("txn-id", "failover-txn", "transactional.id of the producer")
	pidList := fs.String("pids", "", "broker id → pid, e.g. 1=123,2=456,3=789")
	etcdURL := fs.String("etcd", "", "etcd endpoint of the cluster (for the lease and reassignment marks)")
	prefix := fs.String("etcd-prefix", "/kaas/bench/", "the cluster's key prefix, /kaas/<cluster.name>/")
	warm := fs.Int("warmup", 20, "commits before the kill")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after")
	_ = fs.Parse(args)
	seeds := strings.Split(*brokers, ",")
	pids, err := parsePids(*pidList)
	if err != nil {
		return err
	}
	res := txnResult{TxnID: *txnID, Slot: txnSlot(*txnID), NewCoordinator: -1, LeaseGoneMs: -1, ReassignedMs: -1, ServingMs: -1}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	// The coordinator, the broker addresses and a partition led by another broker.
	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer admin.Close()
	res.Coordinator, err = findTxnCoordinator(ctx, admin, *txnID)
	if err != nil {
		return err
	}
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(*topic)
	mreq.Topics = append(mreq.Topics, mt)
	md, err := mreq.RequestWith(ctx, admin)
	if err != nil || len(md.Topics) != 1 {
		return fmt.Errorf("cannot read metadata of %s: %v", *topic, err)
	}
	addrs := map[int32]string{}
	for _, b := range md.Brokers {
		addrs[b.NodeID] = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
	}
	res.Partition, res.Leader = -1, -1
	for _, p := range md.Topics[0].Partitions {
		if p.ErrorCode == 0 && p.Leader >= 0 && p.Leader != res.Coordinator {
			res.Partition, res.Leader = p.Partition, p.Leader
			break
		}
	}
	if res.Partition < 0 {
		return fmt.Errorf("every partition of %s is led by the coordinator %d of %s", *topic, res.Coordinator, *txnID)
	}
	pid, ok := pids[res.Coordinator]
	if !ok {
		return fmt.Errorf("coordinator %d of %s has no pid in --pids", res.Coordinator, *txnID)
	}
	res.Pid = pid

	// etcd watches, opened before the kill so no event can be missed.
	var killAt atomic.Pointer[time.Time]
	since := func() float64 {
		if t := killAt.Load(); t != nil {
			return float64(time.Since(*t).Microseconds()) / 1000
		}
		return -1
	}
	var marks sync.Mutex
	if *etcdURL != "" {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return fmt.Errorf("cannot connect to etcd (%s): %w", *etcdURL, err)
		}
		defer cli.Close()
		brokerKey := *prefix + "brokers/" + strconv.Itoa(int(res.Coordinator))
		assignKey := *prefix + "assign/txn/" + strconv.Itoa(res.Slot)
		cur, err := cli.Get(ctx, assignKey)
		if err != nil {
			return fmt.Errorf("cannot read %s: %w", assignKey, err)
		}
		from := cur.Header.Revision + 1
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		go func() {
			for wr := range cli.Watch(wctx, brokerKey, clientv3.WithRev(from)) {
				for _, ev := range wr.Events {
					if ev.Type == mvccpb.DELETE {
						marks.Lock()
						if res.LeaseGoneMs < 0 {
							res.LeaseGoneMs = since()
						}
						marks.Unlock()
					}
				}
			}
		}()
		go func() {
			for wr := range cli.Watch(wctx, assignKey, clientv3.WithRev(from)) {
				for _, ev := range wr.Events {
					var a struct {
						Owner *int32 `json:"owner"`
					}
					if ev.Type != mvccpb.PUT || json.Unmarshal(ev.Kv.Value, &a) != nil || a.Owner == nil || *a.Owner == res.Coordinator {
						continue
					}
					marks.Lock()
					if res.ReassignedMs < 0 {
						res.ReassignedMs = since()
					}
					marks.Unlock()
				}
			}
		}()
	}

	// The producer: begin → 1 record → commit until stopped.
	hook := &endTxnNode{}
	hook.node.Store(-1)
	newProducer := func() (*kgo.Client, error) {
		return kgo.NewClient(append(clientOpts(seeds), kgo.TransactionalID(*txnID), kgo.DefaultProduceTopic(*topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0), kgo.WithHooks(hook))...)
	}
	cl, err := newProducer()
	if err != nil {
		return err
	}
	var (
		commits, errs atomic.Int64
		firstErr      atomic.Pointer[string]
		stop          atomic.Bool
		after         = make(chan int32, 1) // the first commit after the kill answered by another broker
	)
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		defer func() {
			if cl != nil {
				cl.Close()
			}
		}()
		for !stop.Load() && ctx.Err() == nil {
			err := txnCycle(ctx, cl, res.Partition)
			if err != nil {
				errs.Add(1)
				s := err.Error()
				firstErr.CompareAndSwap(nil, &s)
				// A commit that failed with the coordinator gone (kgo gives up on a refused dial
				// at once) leaves the client's transaction state unknown, and kgo's abort then
				// answers without reaching any broker, so the client is replaced, as an
				// application does with a producer whose commit failed: the new client's
				// InitProducerId goes through FindCoordinator to whichever broker serves the
				// slot, bumps the epoch and aborts what was open. Retried at the client's backoff.
				cl.Close()
				for ctx.Err() == nil && !stop.Load() {
					time.Sleep(100 * time.Millisecond) // the client's retry backoff (clientOpts)
					if cl, err = newProducer(); err == nil {
						break
					}
				}
				continue
			}
			commits.Add(1)
			if n := hook.node.Load(); killAt.Load() != nil && n != res.Coordinator {
				select {
				case after <- n:
				default:
				}
				return
			}
		}
	}()
	for commits.Load() < int64(*warm) {
		if ctx.Err() != nil || errs.Load() > 0 {
			stop.Store(true)
			<-loopDone
			return fmt.Errorf("warm-up: %d commits, %d errors (%v)", commits.Load(), errs.Load(), deref(firstErr.Load()))
		}
		time.Sleep(10 * time.Millisecond) // polling the producer's counter
	}
	res.CommitsBefore = commits.Load()

	// Probes of the surviving brokers for the slot's serving moment.
	probeCtx, probeCancel := context.WithCancel(ctx)
	defer probeCancel()
	var survivors []string
	for id, a := range addrs {
		if id != res.Coordinator {
			survivors = append(survivors, a)
		}
	}

	t := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("cannot kill coordinator %d (pid %d): %w", res.Coordinator, pid, err)
	}
	killAt.Store(&t)
	for _, a := range survivors {
		go probeServing(probeCtx, a, *txnID, func() {
			marks.Lock()
			if res.ServingMs < 0 {
				res.ServingMs = since()
			}
			marks.Unlock()
		})
	}
	select {
	case n := <-after:
		res.FailoverMs = since()
		res.NewCoordinator = n
	case <-ctx.Done():
		stop.Store(true)
		return fmt.Errorf("no commit by another broker than %d within %s (errors %d, first %v)", res.Coordinator, *timeout, errs.Load(), deref(firstErr.Load()))
	}
	<-loopDone
	probeCancel()
	// The watches may deliver a mark a moment after the commit only if it happened after it;
	// give them a short grace so a late event is still recorded.
	deadline := time.Now().Add(2 * time.Second)
	for *etcdURL != "" && time.Now().Before(deadline) {
		marks.Lock()
		done := res.LeaseGoneMs >= 0 && res.ReassignedMs >= 0
		marks.Unlock()
		if done {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the watch goroutines' marks
	}
	marks.Lock()
	defer marks.Unlock()
	res.Errors = errs.Load()
	res.FirstError = deref(firstErr.Load())
	return json.NewEncoder(os.Stdout).Encode(res)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// txnCycle runs begin → produce one record → commit.
func txnCycle(ctx context.Context, cl *kgo.Client, part int32) error {
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("cannot begin transaction: %w", err)
	}
	if err := produceWithin(ctx, cl, &kgo.Record{Partition: part, Value: []byte("txn")}); err != nil {
		return fmt.Errorf("cannot produce in transaction (partition %d): %w", part, err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return fmt.Errorf("cannot commit transaction: %w", err)
	}
	return nil
}

// findTxnCoordinator asks FindCoordinator (key type 1) until the slot has an owner.
func findTxnCoordinator(ctx context.Context, cl *kgo.Client, id string) (int32, error) {
	for {
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.CoordinatorType = 1
		req.CoordinatorKeys = []string{id}
		resp, err := req.RequestWith(ctx, cl)
		if err == nil && len(resp.Coordinators) == 1 && resp.Coordinators[0].ErrorCode == 0 {
			return resp.Coordinators[0].NodeID, nil
		}
		if ctx.Err() != nil {
			return -1, fmt.Errorf("cannot find the coordinator of %s: %w", id, ctx.Err())
		}
		time.Sleep(100 * time.Millisecond) // polling the cluster for the slot's owner
	}
}

// probeServing asks the broker at addr to describe id every 5 ms and calls served once it
// answers without an error: that broker coordinates the slot and has loaded it.
func probeServing(ctx context.Context, addr, id string, served func()) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequestRetries(0))
	if err != nil {
		return
	}
	defer cl.Close()
	for ctx.Err() == nil {
		req := kmsg.NewPtrDescribeTransactionsRequest()
		req.TransactionalIDs = []string{id}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		// Pinned to the seed broker: kgo would route DescribeTransactions to the coordinator it
		// finds, which is what this probe must not assume.
		kresp, err := cl.SeedBrokers()[0].Request(rctx, req)
		cancel()
		resp, _ := kresp.(*kmsg.DescribeTransactionsResponse)
		if err == nil && resp != nil && len(resp.TransactionStates) == 1 && resp.TransactionStates[0].ErrorCode == 0 {
			served()
			return
		}
		time.Sleep(5 * time.Millisecond) // probe interval
	}
}

// slotProbeIDs holds one transactional id per slot (found by trying "slot-probe-<k>" until all
// 50 slots are covered), so one FindCoordinator names every slot's owner.
var slotProbeIDs = func() []string {
	ids := make([]string, 50)
	left := 50
	for k := 0; left > 0; k++ {
		id := "slot-probe-" + strconv.Itoa(k)
		if s := txnSlot(id); ids[s] == "" {
			ids[s] = id
			left--
		}
	}
	return ids
}()

// txnSlotsBalanced is nil once every one of n brokers coordinates 50/n ±1 transaction slots:
// right after the brokers join, the first one holds every slot and the controller moves them
// over a few ticks, and a measurement taken meanwhile would see one coordinator and moves.
func txnSlotsBalanced(seeds []string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RequestRetries(0))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorType = 1
	req.CoordinatorKeys = slotProbeIDs
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	load := map[int32]int{}
	for _, c := range resp.Coordinators {
		if c.ErrorCode != 0 {
			return fmt.Errorf("slot of %s: error %d", c.Key, c.ErrorCode)
		}
		load[c.NodeID]++
	}
	lo, hi := 50/n, (50+n-1)/n
	if len(load) != n {
		return fmt.Errorf("transaction slots on %d brokers, want %d (%v)", len(load), n, load)
	}
	for b, k := range load {
		if k < lo || k > hi {
			return fmt.Errorf("broker %d coordinates %d slots, want %d..%d (%v)", b, k, lo, hi, load)
		}
	}
	return nil
}
