package main

// Process tests of cluster mode (issue 9, design cluster.md §9 tier C): a real etcd server
// (Debian's etcd-server binary, installed by `make deps`) and N kaas processes sharing one data
// dir, crashed with kill -9, paused with SIGSTOP, and rolled with SIGTERM while Apache's and
// franz-go's clients keep working. They use the test session settings of the issue:
// cluster.session.timeout.ms=3000, heartbeat 1000, fence margin 300.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The session settings every cluster test runs with, and what follows from them.
const (
	e2eClusterSessionMs = 3000
	e2eClusterBeatMs    = 1000
	e2eClusterMarginMs  = 300
	// e2eClusterFailoverMax is the bound on failover with the test timeouts: the lease
	// of a killed broker expires within the session timeout, the controller reassigns, the
	// successor takes over (scan + salvage) and the client's next metadata refresh finds it.
	e2eClusterFailoverMax = 5 * time.Second
	// e2eClusterDrainWait bounds a SIGTERM drain (release every partition, slot and shard,
	// then revoke the lease); the k8s manifests give 40 s.
	e2eClusterDrainWait = 40 * time.Second
)

// ---------------------------------------------------------------------------------------------
// etcd

// e2eEtcd is one real etcd server process on loopback ports with its data in a temp dir.
type e2eEtcd struct {
	url     string // client URL, http://127.0.0.1:port
	dir     string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// startE2EEtcd starts a single-member etcd and waits for its /health; it is stopped in
// t.Cleanup (registered before the brokers', so it runs after the brokers are gone).
func startE2EEtcd(t *testing.T) *e2eEtcd {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("etcd not on PATH (`make deps` installs Debian's etcd-server; cluster tests need a real etcd): %v", err)
	}
	cport, pport := e2eFreePort(t), e2eFreePort(t)
	e := &e2eEtcd{
		url:     fmt.Sprintf("http://127.0.0.1:%d", cport),
		dir:     filepath.Join(t.TempDir(), "etcd"),
		logPath: filepath.Join(e2eLogDir(t), "etcd.log"),
		exited:  make(chan struct{}),
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", pport)
	logf, err := os.Create(e.logPath)
	if err != nil {
		t.Fatalf("cannot create etcd log: %v", err)
	}
	e.cmd = exec.Command(bin, "--name", "e2e", "--data-dir", e.dir,
		"--listen-client-urls", e.url, "--advertise-client-urls", e.url,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "e2e="+peer, "--logger", "zap", "--log-level", "warn")
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := e.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("cannot start %s: %v", bin, err)
	}
	go func() {
		_ = e.cmd.Wait()
		logf.Close()
		close(e.exited)
	}()
	t.Cleanup(func() {
		e.stop(t)
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", e.logPath, e2eTailFile(e.logPath, 30))
		}
	})
	client := &http.Client{Timeout: time.Second}
	err = e2ePoll(30*time.Second, 50*time.Millisecond, func() error {
		select {
		case <-e.exited:
			return fmt.Errorf("etcd exited during startup (%v): %w", e.cmd.ProcessState, errPollAbort)
		default:
		}
		resp, err := client.Get(e.url + "/health")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"health":"true"`) {
			return fmt.Errorf("GET /health: %s %s", resp.Status, b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("etcd on %s not healthy: %v\n%s", e.url, err, e2eTailFile(e.logPath, 30))
	}
	t.Logf("etcd on %s ready in %s", e.url, time.Since(start).Round(time.Millisecond))
	return e
}

// stop sends SIGTERM and waits (SIGKILL after 10 s); a no-op once the process is gone.
func (e *e2eEtcd) stop(t *testing.T) {
	t.Helper()
	select {
	case <-e.exited:
		return
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
		t.Errorf("etcd did not exit within 10 s of SIGTERM; killed")
	}
}

// ---------------------------------------------------------------------------------------------
// Brokers

// e2eCluster is etcd plus n kaas processes on one shared data dir. Broker i (0-based) has
// broker.id i+1.
type e2eCluster struct {
	t       *testing.T
	etcd    *e2eEtcd
	vol     string
	brokers []*kaasProc
}

// startE2ECluster starts etcd and n brokers and waits until every broker's Metadata lists all n.
func startE2ECluster(t *testing.T, n int) *e2eCluster {
	t.Helper()
	if e2eKaasBuildErr != nil {
		t.Fatalf("kaas binary unavailable: %v", e2eKaasBuildErr)
	}
	if e2eKaasBin == "" {
		t.Fatalf("cluster tests run the kaas binary only (KAAS_E2E_BROKER=%s builds none); exclude them with -run", e2eBrokerKind())
	}
	c := &e2eCluster{t: t, etcd: startE2EEtcd(t), vol: filepath.Join(t.TempDir(), "vol")}
	logDir := e2eLogDir(t)
	for i := 0; i < n; i++ {
		p := &kaasProc{
			addr:    fmt.Sprintf("127.0.0.1:%d", e2eFreePort(t)),
			metrics: fmt.Sprintf("127.0.0.1:%d", e2eFreePort(t)),
			logPath: filepath.Join(logDir, fmt.Sprintf("kaas-%d.log", i+1)),
		}
		p.args = []string{
			"--broker.id=" + strconv.Itoa(i+1),
			"--listeners=" + p.addr,
			"--advertised.listeners=PLAINTEXT://" + p.addr,
			"--data.dir=" + c.vol, // the shared volume: the same path for every broker
			"--metrics.addr=" + p.metrics,
			"--cluster.etcd.endpoints=" + c.etcd.url,
			"--cluster.name=e2e",
			"--cluster.session.timeout.ms=" + strconv.Itoa(e2eClusterSessionMs),
			"--cluster.session.heartbeat.ms=" + strconv.Itoa(e2eClusterBeatMs),
			"--cluster.fence.margin.ms=" + strconv.Itoa(e2eClusterMarginMs),
			"--auto.create.topics.enable=false",
			"--log.level=info",
			"--group.initial.rebalance.delay.ms=0",
		}
		p.args = append(p.args, e2eExtraKaasArgs...)
		c.brokers = append(c.brokers, p)
	}
	// Registered after etcd's cleanup, so it runs first: brokers drain while etcd still serves.
	t.Cleanup(c.cleanup)
	for _, p := range c.brokers {
		p.Restart(t)
	}
	c.waitMembers(t, n, 60*time.Second)
	return c
}

// cleanup resumes any paused broker, SIGTERMs all running ones at once (their drains overlap)
// and waits for each; a broker that exited on its own is reported when nothing else failed.
func (c *e2eCluster) cleanup() {
	t := c.t
	var wg sync.WaitGroup
	for i, p := range c.brokers {
		p.mu.Lock()
		cmd, exited := p.cmd, p.exited
		p.mu.Unlock()
		if cmd == nil {
			continue
		}
		select {
		case <-exited:
			if !t.Failed() {
				t.Errorf("broker %d exited before the test ended: %v", i+1, p.exitErr())
			}
			continue
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGCONT)
		wg.Add(1)
		go func(p *kaasProc) {
			defer wg.Done()
			if err := p.signal(t, syscall.SIGTERM, e2eClusterDrainWait); err != nil {
				t.Error(err)
			}
		}(p)
	}
	wg.Wait()
	if t.Failed() {
		for _, p := range c.brokers {
			if p.starts > 0 {
				p.dumpLog(t)
			}
		}
	}
}

// seeds lists every broker's address (the "3 seeds" bootstrap); bootstrap joins them.
func (c *e2eCluster) seeds() []string {
	s := make([]string, len(c.brokers))
	for i, p := range c.brokers {
		s[i] = p.addr
	}
	return s
}

func (c *e2eCluster) bootstrap() string { return strings.Join(c.seeds(), ",") }

// index maps a broker id to the harness's 0-based index.
func (c *e2eCluster) index(t *testing.T, id int32) int {
	t.Helper()
	if id < 1 || int(id) > len(c.brokers) {
		t.Fatalf("broker id %d is not one of the cluster's 1..%d", id, len(c.brokers))
	}
	return int(id) - 1
}

func (c *e2eCluster) process(t *testing.T, i int) *exec.Cmd {
	t.Helper()
	p := c.brokers[i]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		t.Fatalf("broker %d is not running", i+1)
	}
	return p.cmd
}

// kill9 SIGKILLs broker i and waits until the process is gone.
func (c *e2eCluster) kill9(t *testing.T, i int) { t.Helper(); c.brokers[i].Kill(t) }

// sigstop / sigcont pause and resume broker i; the process stays the harness's child.
func (c *e2eCluster) sigstop(t *testing.T, i int) {
	t.Helper()
	if err := c.process(t, i).Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("cannot SIGSTOP broker %d: %v", i+1, err)
	}
}

func (c *e2eCluster) sigcont(t *testing.T, i int) {
	t.Helper()
	if err := c.process(t, i).Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("cannot SIGCONT broker %d: %v", i+1, err)
	}
}

// sigterm asks broker i to drain and exit; waitExit collects the exit.
func (c *e2eCluster) sigterm(t *testing.T, i int) {
	t.Helper()
	if err := c.process(t, i).Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("cannot SIGTERM broker %d: %v", i+1, err)
	}
}

// waitExit waits up to timeout for broker i to exit and returns its exit code (-1 when a
// signal ended it). It fails the test when the process is still running at the deadline.
func (c *e2eCluster) waitExit(t *testing.T, i int, timeout time.Duration) int {
	t.Helper()
	p := c.brokers[i]
	c.process(t, i)
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(timeout):
		t.Fatalf("broker %d still running %s after it was expected to exit", i+1, timeout)
	}
	p.mu.Lock()
	p.cmd = nil
	err := p.err
	p.mu.Unlock()
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	t.Fatalf("broker %d: cannot read its exit status: %v", i+1, err)
	return -1
}

// restart starts broker i again with the same flags (after kill9, waitExit) and waits for
// /healthz and for it to be back in the cluster's Metadata.
func (c *e2eCluster) restart(t *testing.T, i int) {
	t.Helper()
	c.brokers[i].Restart(t)
	c.waitMembers(t, len(c.brokers), 60*time.Second)
}

// waitMembers polls every running broker's Metadata until each lists want brokers and a
// controller.
func (c *e2eCluster) waitMembers(t *testing.T, want int, timeout time.Duration) {
	t.Helper()
	e2eEventually(t, timeout, fmt.Sprintf("every broker lists %d brokers and a controller", want), func() error {
		for i, p := range c.brokers {
			p.mu.Lock()
			running := p.cmd != nil
			p.mu.Unlock()
			if !running {
				continue
			}
			md, err := e2eClusterMetadata(p.addr)
			if err != nil {
				return fmt.Errorf("broker %d: %w", i+1, err)
			}
			if len(md.Brokers) != want || md.Controller < 0 {
				return fmt.Errorf("broker %d lists brokers %v, controller %d", i+1, md.Brokers.NodeIDs(), md.Controller)
			}
		}
		return nil
	})
}

// e2eClusterMetadata asks exactly the broker at addr (a fresh client seeded with it alone) for
// the cluster's metadata.
func e2eClusterMetadata(addr string, topics ...string) (kadm.Metadata, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequestRetries(0))
	if err != nil {
		return kadm.Metadata{}, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	for _, tp := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(tp)
		req.Topics = append(req.Topics, rt)
	}
	// A fresh client knows only its seed, so this first request goes there: the answer is that
	// broker's own view (kadm.Metadata on a used client may ask any discovered broker).
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return kadm.Metadata{}, err
	}
	md := kadm.Metadata{Controller: resp.ControllerID, Topics: kadm.TopicDetails{}}
	for _, b := range resp.Brokers {
		md.Brokers = append(md.Brokers, kadm.BrokerDetail{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
	}
	for _, rt := range resp.Topics {
		td := kadm.TopicDetail{Topic: *rt.Topic, Partitions: kadm.PartitionDetails{}}
		for _, rp := range rt.Partitions {
			pd := kadm.PartitionDetail{Topic: td.Topic, Partition: rp.Partition, Leader: rp.Leader,
				LeaderEpoch: rp.LeaderEpoch, Replicas: rp.Replicas, ISR: rp.ISR}
			if rp.ErrorCode != 0 {
				pd.Err = fmt.Errorf("partition %d: error code %d", rp.Partition, rp.ErrorCode)
			}
			td.Partitions[rp.Partition] = pd
		}
		if rt.ErrorCode != 0 {
			td.Err = fmt.Errorf("topic %s: error code %d", td.Topic, rt.ErrorCode)
		}
		md.Topics[td.Topic] = td
	}
	return md, nil
}

// runningAddr is the address of some running broker other than skip (-1: any).
func (c *e2eCluster) runningAddr(t *testing.T, skip int) string {
	t.Helper()
	for i, p := range c.brokers {
		p.mu.Lock()
		running := p.cmd != nil
		p.mu.Unlock()
		if running && i != skip {
			return p.addr
		}
	}
	t.Fatalf("no broker running")
	return ""
}

// leaderOf polls a running broker's Metadata (other than skip) until partition p of topic
// has a leader, and returns its harness index.
func (c *e2eCluster) leaderOf(t *testing.T, topic string, p int32, skip int) int {
	t.Helper()
	var leader int32 = -1
	e2eEventually(t, 30*time.Second, fmt.Sprintf("a leader of %s/%d", topic, p), func() error {
		md, err := e2eClusterMetadata(c.runningAddr(t, skip), topic)
		if err != nil {
			return err
		}
		pd, ok := md.Topics[topic].Partitions[p]
		if !ok || pd.Err != nil || pd.Leader < 1 || int(pd.Leader-1) == skip {
			return fmt.Errorf("partition %d: %+v", p, pd)
		}
		leader = pd.Leader
		return nil
	})
	return c.index(t, leader)
}

// createTopic creates topic with kadm through the 3-seed bootstrap and waits until every
// broker's Metadata shows each partition with a leader and rf replicas.
func (c *e2eCluster) createTopic(t *testing.T, topic string, partitions int32, rf int16) {
	t.Helper()
	adm := e2eAdminSeeds(t, c.seeds()...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, rf, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("cannot create topic %s (%d partitions, RF %d): %v", topic, partitions, rf, err)
	}
	e2eEventually(t, 30*time.Second, "every broker's metadata of "+topic, func() error {
		for _, addr := range c.seeds() {
			md, err := e2eClusterMetadata(addr, topic)
			if err != nil {
				return err
			}
			td := md.Topics[topic]
			if td.Err != nil || len(td.Partitions) != int(partitions) {
				return fmt.Errorf("%s: topic %s not ready: %+v", addr, topic, td)
			}
			for _, p := range td.Partitions {
				if p.Err != nil || p.Leader < 1 || len(p.Replicas) != int(rf) {
					return fmt.Errorf("%s: partition %d not ready: leader %d replicas %v err %v", addr, p.Partition, p.Leader, p.Replicas, p.Err)
				}
			}
		}
		return nil
	})
}

func e2eAdminSeeds(t *testing.T, seeds ...string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatalf("cannot create kgo client: %v", err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// e2eClusterClientOpts are what the cluster tests' franz-go clients share: a metadata refresh
// may follow a move within 100 ms (kgo's 5 s default minimum age would dominate every failover
// figure; Apache clients refresh on NOT_LEADER after retry.backoff.ms = 100 ms), and a short
// constant retry backoff.
func e2eClusterClientOpts(seeds ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.MetadataMinAge(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
	}
}

// e2eClusterRecord is one record read back: its partition, offset and value.
type e2eClusterRecord struct {
	p     int32
	o     int64
	value string
}

// e2eClusterReadAll reads topic from the start of every partition up to the high watermarks
// listed now, failing on a fetch error, an offset returned twice or a timeout.
func e2eClusterReadAll(t *testing.T, seeds []string, topic string) (map[int32][]e2eClusterRecord, map[int32]int64) {
	t.Helper()
	adm := e2eAdminSeeds(t, seeds...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("cannot list end offsets of %s: %v", topic, err)
	}
	hwm := map[int32]int64{}
	offsets := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset of %s/%d: %v", topic, o.Partition, o.Err)
		}
		hwm[o.Partition] = o.Offset
		offsets[o.Partition] = kgo.NewOffset().AtStart()
	})
	cons, err := kgo.NewClient(append(e2eClusterClientOpts(seeds...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchMaxWait(200*time.Millisecond))...)
	if err != nil {
		t.Fatalf("cannot create consumer: %v", err)
	}
	defer cons.Close()
	got := map[int32][]e2eClusterRecord{}
	next := map[int32]int64{}
	reached := func() bool {
		for p, h := range hwm {
			if next[p] < h {
				return false
			}
		}
		return true
	}
	for !reached() {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read back of %s timed out: next offsets %v, high watermarks %v", topic, next, hwm)
		}
		fs.EachError(func(tp string, p int32, err error) {
			t.Fatalf("fetch %s/%d: %v", tp, p, err)
		})
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < next[r.Partition] {
				t.Fatalf("partition %d offset %d returned again (next was %d)", r.Partition, r.Offset, next[r.Partition])
			}
			if r.Offset >= hwm[r.Partition] {
				return // produced after ListEndOffsets
			}
			got[r.Partition] = append(got[r.Partition], e2eClusterRecord{r.Partition, r.Offset, string(r.Value)})
			next[r.Partition] = r.Offset + 1
		})
	}
	return got, hwm
}

// ---------------------------------------------------------------------------------------------
// Tests

// TestClusterKill9LeaderAcksAll is design tier C1: 200k acks=all idempotent records to a
// 3-partition RF 3 topic while the leader of partition 0 is killed with kill -9 four times (and
// restarted after each). Every acknowledged record must be read back exactly once, in produce
// order per partition, and each failover (kill → the first successful produce to partition 0
// after it) must take at most 5 s.
func TestClusterKill9LeaderAcksAll(t *testing.T) {
	const (
		partitions = 3
		kills      = 4
		records    = 200_000
		// The last tail records wait until the kills are done, so every kill lands under load
		// however fast the cluster is; rate spreads the rest over the kill phase.
		tail         = 10_000
		rate         = 8_000
		progressStep = 2_000
		killEvery    = 1500 * time.Millisecond
	)
	c := startE2ECluster(t, 3)
	topic := e2eName("c-kill9")
	c.createTopic(t, topic, partitions, 3)

	type ack struct {
		v      int
		p      int32
		offset int64
	}
	var (
		mu       sync.Mutex
		acked    []ack
		ackedN   atomic.Int64
		failedN  atomic.Int64
		firstErr []string
	)
	prod, err := kgo.NewClient(append(e2eClusterClientOpts(c.seeds()...),
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), // with idempotence, kgo's default: the property under test
		kgo.RecordDeliveryTimeout(2*time.Minute),
		kgo.RetryTimeout(2*time.Minute),
		kgo.MaxBufferedRecords(5_000),
		kgo.ProducerLinger(2*time.Millisecond))...)
	if err != nil {
		t.Fatalf("cannot create producer: %v", err)
	}
	defer prod.Close()
	// probe produces one record at a time to partition 0 after each kill: its first success
	// is the failover time (its request is necessarily served by a live broker).
	probe, err := kgo.NewClient(append(e2eClusterClientOpts(c.seeds()...),
		kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RecordDeliveryTimeout(30*time.Second))...)
	if err != nil {
		t.Fatalf("cannot create probe producer: %v", err)
	}
	defer probe.Close()

	killsDone := make(chan struct{})
	prodCtx, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		paceStart := time.Now()
		for i := 0; i < records && prodCtx.Err() == nil; i++ {
			if i == records-tail {
				select {
				case <-killsDone:
				case <-prodCtx.Done():
					return
				}
			}
			if i%1000 == 0 && i < records-tail { // rate limit (pacing, not waiting for state)
				if ahead := time.Duration(i)*time.Second/rate - time.Since(paceStart); ahead > 0 {
					time.Sleep(ahead)
				}
			}
			v := i
			r := &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i%61)), Value: []byte(strconv.Itoa(i))}
			prod.Produce(prodCtx, r, func(r *kgo.Record, err error) {
				if err != nil {
					failedN.Add(1)
					mu.Lock()
					if len(firstErr) < 5 {
						firstErr = append(firstErr, fmt.Sprintf("value %d: %v", v, err))
					}
					mu.Unlock()
					return
				}
				mu.Lock()
				acked = append(acked, ack{v, r.Partition, r.Offset})
				mu.Unlock()
				ackedN.Add(1)
			})
		}
	}()

	waitProgress := func(what string) {
		t.Helper()
		from, since := ackedN.Load(), time.Now()
		e2eEventually(t, 60*time.Second, what, func() error {
			if got := ackedN.Load(); got < from+progressStep || time.Since(since) < killEvery {
				return fmt.Errorf("%d acks since %d (failed %d)", got-from, from, failedN.Load())
			}
			return nil
		})
	}

	probeAcks := map[string]ack{}
	var failovers []time.Duration
	start := time.Now()
	for k := 1; k <= kills; k++ {
		waitProgress(fmt.Sprintf("producer progress before kill %d", k))
		leader := c.leaderOf(t, topic, 0, -1)
		before := ackedN.Load()
		killed := time.Now()
		c.kill9(t, leader)
		pv := fmt.Sprintf("probe-%d", k)
		r, err := e2eProduceWithin(probe, 30*time.Second, &kgo.Record{Partition: 0, Value: []byte(pv)})
		if err != nil {
			t.Fatalf("kill %d: probe produce to partition 0 after killing broker %d: %v", k, leader+1, err)
		}
		d := time.Since(killed)
		failovers = append(failovers, d)
		probeAcks[pv] = ack{-1, r.Partition, r.Offset}
		t.Logf("kill -9 #%d of broker %d (leader of partition 0) at %s with %d acked: failover %s",
			k, leader+1, killed.Sub(start).Round(time.Millisecond), before, d.Round(time.Millisecond))
		if d > e2eClusterFailoverMax {
			t.Errorf("kill %d: failover took %s, want <= %s", k, d.Round(time.Millisecond), e2eClusterFailoverMax)
		}
		c.restart(t, leader)
	}
	close(killsDone)
	t.Logf("failover times after kill -9 (session timeout %d ms): %v", e2eClusterSessionMs, failovers)
	<-prodDone
	flushCtx, cancelFlush := context.WithTimeout(context.Background(), 2*time.Minute)
	if err := prod.Flush(flushCtx); err != nil {
		t.Errorf("flush: %v", err)
	}
	cancelFlush()
	mu.Lock()
	acks := append([]ack(nil), acked...)
	errs := append([]string(nil), firstErr...)
	mu.Unlock()
	t.Logf("%d kills in %s; acked %d of %d, failed %d (first errors: %q)",
		kills, time.Since(start).Round(time.Millisecond), len(acks), records, failedN.Load(), errs)
	if failedN.Load() > 0 {
		t.Errorf("%d records failed: with 3 seeds and a 2 min delivery timeout every record should be acknowledged", failedN.Load())
	}

	got, hwm := e2eClusterReadAll(t, c.seeds(), topic)
	e2eClusterCheckAcked(t, got, hwm, func(check func(v string, p int32, o int64)) {
		for _, a := range acks {
			check(strconv.Itoa(a.v), a.p, a.offset)
		}
		for pv, a := range probeAcks {
			check(pv, a.p, a.offset)
		}
	})
}

// e2eProduceWithin produces one record and waits at most d for its ack. kgo ignores a record's
// context once the record may have been sent (an idempotent producer cannot give up on it
// without risking a sequence gap), so ProduceSync alone can block forever when no broker ever
// takes the partition over; the test must fail instead.
func e2eProduceWithin(cl *kgo.Client, d time.Duration, r *kgo.Record) (*kgo.Record, error) {
	done := make(chan error, 1)
	cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		return r, err
	case <-time.After(d):
		return nil, fmt.Errorf("no ack within %s", d)
	}
}

// e2eClusterCheckAcked asserts what an acks=all ack promises after any number of failovers:
// numeric values (the main producer's) strictly increase with the offset inside each partition,
// no value is stored twice anywhere, and every acknowledged (value, partition, offset) that
// acks reports is there.
func e2eClusterCheckAcked(t *testing.T, got map[int32][]e2eClusterRecord, hwm map[int32]int64, acks func(check func(v string, p int32, o int64))) {
	t.Helper()
	where := map[string]string{}
	at := map[int32]map[int64]string{}
	total := 0
	for p, recs := range got {
		sort.Slice(recs, func(i, j int) bool { return recs[i].o < recs[j].o })
		at[p] = map[int64]string{}
		prev := -1
		for _, r := range recs {
			at[p][r.o] = r.value
			if w, dup := where[r.value]; dup {
				t.Errorf("value %q stored twice: %s and %d/%d", r.value, w, p, r.o)
			}
			where[r.value] = fmt.Sprintf("%d/%d", p, r.o)
			if v, err := strconv.Atoi(r.value); err == nil {
				if v <= prev {
					t.Errorf("partition %d offset %d: value %d after %d (reordered or duplicated)", p, r.o, v, prev)
				}
				prev = v
			}
		}
		total += len(recs)
	}
	lost, n := 0, 0
	acks(func(v string, p int32, o int64) {
		n++
		if have, ok := at[p][o]; !ok || have != v {
			if lost < 10 {
				t.Errorf("acked value %q at partition %d offset %d: read back %q (present %v)", v, p, o, have, ok)
			}
			lost++
		}
	})
	if lost > 0 {
		t.Errorf("%d of %d acked records lost or moved", lost, n)
	}
	t.Logf("read back %d records (high watermarks %v); %d acked, %d present without an ack (allowed: the ack was lost in a crash)",
		total, hwm, n, total-n)
}

// TestClusterSIGSTOPLeaderFailStops is design tier C3: the leader of a partition is paused
// with SIGSTOP for twice the session timeout, so its lease expires and another broker takes
// over while it cannot notice. After SIGCONT it must acknowledge nothing (Rule P: its lease
// deadline has passed, so no sync it completes may become an ack) and exit with code 3
// (fail-stop). A produce request sent to it directly while it is paused, and others sent
// right after SIGCONT, must all fail; every record acknowledged through the cluster meanwhile
// must be readable.
func TestClusterSIGSTOPLeaderFailStops(t *testing.T) {
	c := startE2ECluster(t, 3)
	topic := e2eName("c-stop")
	c.createTopic(t, topic, 1, 3)
	leader := c.leaderOf(t, topic, 0, -1)
	leaderID := int32(leader + 1)

	// A request to the paused broker gets no answer, so the client must give up on it soon
	// (2 s produce timeout + 1 s overhead) and refresh metadata instead of waiting kgo's 10+10 s;
	// the idempotent retry to the new leader is deduplicated there.
	prod, err := kgo.NewClient(append(e2eClusterClientOpts(c.seeds()...),
		kgo.DefaultProduceTopic(topic), kgo.RecordDeliveryTimeout(time.Minute),
		kgo.ProduceRequestTimeout(2*time.Second), kgo.RequestTimeoutOverhead(time.Second))...)
	if err != nil {
		t.Fatalf("cannot create producer: %v", err)
	}
	defer prod.Close()
	type ack struct {
		v string
		o int64
	}
	var acks []ack
	produce := func(v string) {
		t.Helper()
		r, err := e2eProduceWithin(prod, time.Minute, &kgo.Record{Value: []byte(v)})
		if err != nil {
			t.Fatalf("produce %s: %v", v, err)
		}
		acks = append(acks, ack{v, r.Offset})
	}
	for i := 0; i < 100; i++ {
		produce(fmt.Sprintf("before-%d", i))
	}

	// pinned talks to the paused broker only: Broker(id).Request sends each request on that
	// broker's connection and never follows a leadership move. The first request opens the
	// connection while the broker still runs, so the later ones sit in its socket buffer.
	pinned, err := kgo.NewClient(kgo.SeedBrokers(c.brokers[leader].addr), kgo.RequestRetries(0))
	if err != nil {
		t.Fatalf("cannot create pinned client: %v", err)
	}
	defer pinned.Close()
	pinnedProduce := func(ctx context.Context, v string) (int16, int64, error) {
		req := kmsg.NewPtrProduceRequest()
		req.Acks = -1
		req.TimeoutMillis = 5000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition = 0
		rp.Records = e2eClusterBatch([]byte(v))
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := pinned.Broker(int(leaderID)).Request(ctx, req)
		if err != nil {
			return 0, 0, err
		}
		pr := resp.(*kmsg.ProduceResponse)
		if len(pr.Topics) != 1 || len(pr.Topics[0].Partitions) != 1 {
			return 0, 0, fmt.Errorf("malformed produce response: %+v", pr)
		}
		p := pr.Topics[0].Partitions[0]
		return p.ErrorCode, p.BaseOffset, nil
	}
	// Broker(id) needs the id discovered: one metadata round trip through the seed.
	if _, err := kadm.NewClient(pinned).BrokerMetadata(context.Background()); err != nil {
		t.Fatalf("pinned client metadata: %v", err)
	}
	if code, off, err := pinnedProduce(context.Background(), "pinned-before"); err != nil || code != 0 {
		t.Fatalf("produce to the leader (broker %d) before the pause: code %d err %v", leaderID, code, err)
	} else {
		acks = append(acks, ack{"pinned-before", off})
	}

	c.sigstop(t, leader)
	stopped := time.Now()
	t.Logf("SIGSTOP broker %d (leader of %s/0)", leaderID, topic)
	type pinnedResult struct {
		v    string
		code int16
		off  int64
		err  error
	}
	results := make(chan pinnedResult, 64)
	var pinnedWG sync.WaitGroup
	sendPinned := func(v string) {
		pinnedWG.Add(1)
		go func() {
			defer pinnedWG.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 4*e2eClusterSessionMs*time.Millisecond)
			defer cancel()
			code, off, err := pinnedProduce(ctx, v)
			results <- pinnedResult{v, code, off, err}
		}()
	}
	sendPinned("pinned-during-pause") // lands in the paused broker's socket buffer

	// The cluster moves on without it: the next acks come from the new leader.
	for i := 0; i < 100; i++ {
		produce(fmt.Sprintf("during-%d", i))
	}
	newLeader := c.leaderOf(t, topic, 0, leader)
	t.Logf("partition 0 moved to broker %d %s after the pause", newLeader+1, time.Since(stopped).Round(time.Millisecond))

	// Pausing for 2 × the session timeout is the scenario itself, not a wait for state.
	if rest := 2*e2eClusterSessionMs*time.Millisecond - time.Since(stopped); rest > 0 {
		time.Sleep(rest)
	}
	c.sigcont(t, leader)
	t.Logf("SIGCONT broker %d after %s", leaderID, time.Since(stopped).Round(time.Millisecond))
	for i := 0; i < 5; i++ {
		sendPinned(fmt.Sprintf("pinned-after-cont-%d", i))
	}
	code := c.waitExit(t, leader, 15*time.Second)
	if code != 3 {
		t.Errorf("paused broker %d exited with code %d after SIGCONT, want 3 (fail-stop)", leaderID, code)
	}
	pinnedWG.Wait()
	close(results)
	for r := range results {
		if r.err == nil && r.code == 0 {
			t.Errorf("the paused broker acknowledged %q at offset %d after its lease expired", r.v, r.off)
		} else {
			t.Logf("pinned produce %q: code %d, err %v", r.v, r.code, r.err)
		}
	}
	for i := 0; i < 100; i++ {
		produce(fmt.Sprintf("after-%d", i))
	}

	got, hwm := e2eClusterReadAll(t, c.seeds(), topic)
	for _, r := range got[0] {
		if strings.HasPrefix(r.value, "pinned-") && r.value != "pinned-before" {
			t.Errorf("offset %d holds %q, written by the broker after its lease expired (it must not be visible)", r.o, r.value)
		}
	}
	e2eClusterCheckAcked(t, got, hwm, func(check func(v string, p int32, o int64)) {
		for _, a := range acks {
			check(a.v, 0, a.o)
		}
	})
	// The paused broker's slot is free again: it can rejoin once its old key expired.
	c.restart(t, leader)
}

// e2eClusterBatch is a v2 record batch (KIP-98 format) holding one record with value v and no
// producer id, as a plain non-idempotent producer sends it; the broker assigns the offsets.
func e2eClusterBatch(v []byte) []byte {
	var rec []byte
	rec = append(rec, 0)              // attributes
	rec = binary.AppendVarint(rec, 0) // timestamp delta
	rec = binary.AppendVarint(rec, 0) // offset delta
	rec = binary.AppendVarint(rec, -1)
	rec = binary.AppendVarint(rec, int64(len(v)))
	rec = append(rec, v...)
	rec = binary.AppendVarint(rec, 0) // headers
	body := binary.AppendVarint(nil, int64(len(rec)))
	body = append(body, rec...)

	now := time.Now().UnixMilli()
	b := make([]byte, 61, 61+len(body))
	binary.BigEndian.PutUint64(b[0:], 0)                       // base offset
	binary.BigEndian.PutUint32(b[8:], uint32(61-12+len(body))) // batch length
	binary.BigEndian.PutUint32(b[12:], 0xffffffff)             // partition leader epoch
	b[16] = 2                                                  // magic
	binary.BigEndian.PutUint16(b[21:], 0)                      // attributes
	binary.BigEndian.PutUint32(b[23:], 0)                      // last offset delta
	binary.BigEndian.PutUint64(b[27:], uint64(now))            // first timestamp
	binary.BigEndian.PutUint64(b[35:], uint64(now))            // max timestamp
	binary.BigEndian.PutUint64(b[43:], 0xffffffffffffffff)     // producer id -1
	binary.BigEndian.PutUint16(b[51:], 0xffff)                 // producer epoch -1
	binary.BigEndian.PutUint32(b[53:], 0xffffffff)             // base sequence -1
	binary.BigEndian.PutUint32(b[57:], 1)                      // record count
	b = append(b, body...)
	crc := crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)) // from attributes to the end
	binary.BigEndian.PutUint32(b[17:], crc)
	return b
}

// TestClusterRollingRestartPerfTest is design tier C4: kafka-producer-perf-test against the 3
// seeds while each broker in turn gets SIGTERM (drain: release records, no scan for the
// successor) and is restarted once it exited. The perf test must send every record with a max
// latency under 2 s, and a consumer group that stays connected throughout keeps its generation
// (group metadata is persisted, so a coordinator move causes no rebalance).
func TestClusterRollingRestartPerfTest(t *testing.T) {
	requireKafkaLib(t)
	const (
		partitions = 6
		records    = 150_000
		throughput = 2_500 // records/s: the perf test runs about a minute, longer than the roll
	)
	c := startE2ECluster(t, 3)
	topic := e2eName("c-roll")
	c.createTopic(t, topic, partitions, 3)
	group := e2eName("c-roll-g")

	// The group member: consumes the perf topic with auto-commit for the whole run.
	var assigned, revoked atomic.Int32
	cons, err := kgo.NewClient(append(e2eClusterClientOpts(c.seeds()...),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { assigned.Add(1) }),
		kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) { revoked.Add(1) }),
		kgo.OnPartitionsLost(func(context.Context, *kgo.Client, map[string][]int32) { revoked.Add(1) }))...)
	if err != nil {
		t.Fatalf("cannot create group consumer: %v", err)
	}
	defer cons.Close()
	consCtx, stopConsuming := context.WithCancel(context.Background())
	var consumed atomic.Int64
	consDone := make(chan struct{})
	go func() {
		defer close(consDone)
		for consCtx.Err() == nil {
			fs := cons.PollFetches(consCtx)
			consumed.Add(int64(fs.NumRecords()))
		}
	}()
	defer func() { stopConsuming(); <-consDone }()

	adm := e2eAdminSeeds(t, c.seeds()...)
	describe := func() kadm.DescribedGroup {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		gs, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			t.Fatalf("describe group %s: %v", group, err)
		}
		return gs[group]
	}
	var gen0 int32
	var member0 string
	e2eEventually(t, 30*time.Second, "group "+group+" stable with one member", func() error {
		g := describe()
		m, gen := cons.GroupMetadata()
		if g.Err != nil || g.State != "Stable" || len(g.Members) != 1 || gen < 1 || g.Members[0].MemberID != m {
			return fmt.Errorf("state %s members %d generation %d err %v", g.State, len(g.Members), gen, g.Err)
		}
		member0, gen0 = m, gen
		return nil
	})
	t.Logf("group %s stable: member %s generation %d, coordinator %d", group, member0, gen0, describe().Coordinator.NodeID)

	type perfOut struct {
		stdout, stderr string
		err            error
	}
	perfDone := make(chan perfOut, 1)
	go func() {
		var out strings.Builder
		stderr, _, err := javaToolStream(5*time.Minute, &out, classPerfProducer, "--topic", topic,
			"--num-records", strconv.Itoa(records), "--record-size", "512", "--throughput", strconv.Itoa(throughput),
			"--producer-props", "bootstrap.servers="+c.bootstrap(), "acks=all", "enable.idempotence=true",
			"retry.backoff.ms=100")
		perfDone <- perfOut{out.String(), stderr, err}
	}()
	// Let the perf test reach full speed before the first broker goes.
	e2eEventually(t, 60*time.Second, "perf-test producing", func() error {
		if n := consumed.Load(); n < 5_000 {
			return fmt.Errorf("%d records consumed so far", n)
		}
		return nil
	})

	roll := time.Now()
	for i := range c.brokers {
		t0 := time.Now()
		c.sigterm(t, i)
		if code := c.waitExit(t, i, e2eClusterDrainWait); code != 0 {
			t.Errorf("broker %d exited with code %d after SIGTERM, want 0 (drained)", i+1, code)
		}
		drained := time.Since(t0)
		c.restart(t, i)
		t.Logf("broker %d: drained and exited in %s, back in %s", i+1, drained.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	}
	t.Logf("rolling restart of 3 brokers took %s", time.Since(roll).Round(time.Millisecond))
	select {
	case r := <-perfDone:
		t.Fatalf("perf-test ended before the roll did (raise records): err %v\n%s", r.err, e2eTruncate(r.stdout, 2000))
	default:
	}

	var r perfOut
	select {
	case r = <-perfDone:
	case <-time.After(4 * time.Minute):
		t.Fatalf("perf-test still running 4 min after the roll")
	}
	if r.err != nil {
		t.Fatalf("perf-test: %v\nstdout:\n%s\nstderr:\n%s", r.err, e2eTruncate(r.stdout, 3000), e2eTruncate(r.stderr, 3000))
	}
	var summary []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if m := perfSummaryRE.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			summary = m
		}
	}
	if summary == nil {
		t.Fatalf("no final summary line in perf-test output:\n%s", e2eTruncate(r.stdout, 3000))
	}
	t.Logf("perf-test during the roll: %s", summary[0])
	if sent, _ := strconv.Atoi(summary[1]); sent != records {
		t.Errorf("perf-test sent %d records, want %d", sent, records)
	}
	if maxLat, _ := strconv.ParseFloat(summary[5], 64); maxLat >= 2000 {
		t.Errorf("perf-test max latency %.0f ms during the roll, want < 2000 ms", maxLat)
	}
	// A leadership move is seen by the Java producer as a retriable NOT_LEADER_OR_FOLLOWER,
	// logged at WARN before it refreshes metadata and resends, and a request in flight when the
	// drained broker exits as a retriable NetworkException ("Disconnected from node", also at
	// WARN; Apache's controlled shutdown closes its connections the same way, and a fresh-clone
	// CI run saw one). Anything else, and any ERROR, is a failure; the records and latency
	// checks above hold either way.
	var bad []string
	for _, l := range e2eErrorLines(r.stdout + r.stderr) {
		if strings.Contains(l, " WARN ") && (strings.Contains(l, "NotLeaderOrFollowerException") ||
			strings.Contains(l, "NetworkException: Disconnected from node")) {
			continue
		}
		bad = append(bad, l)
	}
	if len(bad) > 0 {
		t.Errorf("perf-test reported %d error lines, first: %q", len(bad), bad[0])
	}

	g := describe()
	m, gen := cons.GroupMetadata()
	if m != member0 || gen != gen0 {
		t.Errorf("group member/generation %s/%d after the roll, want %s/%d (no rebalance)", m, gen, member0, gen0)
	}
	if g.State != "Stable" || len(g.Members) != 1 || g.Members[0].MemberID != member0 {
		t.Errorf("group after the roll: state %s, members %+v; want Stable with %s", g.State, g.Members, member0)
	}
	if a, rv := assigned.Load(), revoked.Load(); a != 1 || rv != 0 {
		t.Errorf("consumer saw %d assignments and %d revocations/losses, want 1 and 0", a, rv)
	}
	t.Logf("group %s after the roll: generation %d, coordinator %d, %d records consumed", group, gen, g.Coordinator.NodeID, consumed.Load())
}

// TestClusterApacheTools drives Apache's kafka-topics, kafka-console-producer,
// kafka-console-consumer and kafka-consumer-groups against a 3-seed bootstrap: RF 3 is
// accepted and described with 3 replicas (the leader and its failover candidates), RF 4 on 3
// brokers is refused with INVALID_REPLICATION_FACTOR.
func TestClusterApacheTools(t *testing.T) {
	requireKafkaLib(t)
	const (
		partitions = 6
		n          = 600
	)
	c := startE2ECluster(t, 3)
	bs := c.bootstrap()
	topic := e2eName("c-tools")
	group := e2eName("c-tools-g")
	st := newE2EStepTimer(t)

	out := javaTool(t, 60*time.Second, classTopics, "--bootstrap-server", bs, "--create", "--topic", topic,
		"--partitions", strconv.Itoa(partitions), "--replication-factor", "3").stdout
	if !strings.Contains(out, "Created topic "+topic) {
		t.Fatalf("kafka-topics --create: unexpected output %q", out)
	}
	st.done("create RF 3")
	var desc string
	e2eEventually(t, 30*time.Second, "kafka-topics --describe with 6 partitions × 3 replicas", func() error {
		desc = javaTool(t, 60*time.Second, classTopics, "--bootstrap-server", bs, "--describe", "--topic", topic).stdout
		if !strings.Contains(desc, "ReplicationFactor: 3") {
			return fmt.Errorf("no ReplicationFactor: 3 in:\n%s", desc)
		}
		seen := map[string]bool{}
		rows := 0
		for _, l := range strings.Split(desc, "\n") {
			f := e2eClusterDescribeFields(l)
			if f["Partition"] == "" {
				continue
			}
			rows++
			reps := strings.Split(f["Replicas"], ",")
			distinct := map[string]bool{}
			for _, r := range reps {
				distinct[r] = true
				seen[r] = true
			}
			if len(reps) != 3 || len(distinct) != 3 {
				return fmt.Errorf("partition %s replicas %q, want 3 distinct brokers", f["Partition"], f["Replicas"])
			}
			if reps[0] != f["Leader"] {
				return fmt.Errorf("partition %s: leader %s is not first in replicas %q", f["Partition"], f["Leader"], f["Replicas"])
			}
		}
		if rows != partitions {
			return fmt.Errorf("%d partition rows, want %d:\n%s", rows, partitions, desc)
		}
		for id := 1; id <= 3; id++ {
			if !seen[strconv.Itoa(id)] {
				return fmt.Errorf("broker %d in no replica list:\n%s", id, desc)
			}
		}
		return nil
	})
	t.Logf("describe:\n%s", strings.TrimSpace(desc))
	st.done("describe")

	var lines strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&lines, "line-%d\n", i)
	}
	e2eRunCmd(t, 2*time.Minute, lines.String(), filepath.Join(e2eRepoRoot, "bench", "kafka-tools.sh"), "run",
		"org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", bs, "--topic", topic,
		"--producer-property", "acks=all",
		// Every partition gets records (the default sticky partitioner may put all 600 in one
		// batch), so the consumer below reads from all six leaders and, on close, commits a
		// position for each; a Java consumer commits nothing for an empty partition whose position
		// it never resolved before --max-messages ended it, which left --describe short.
		"--producer-property", "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner")
	st.done("console-producer")

	r := javaTool(t, 2*time.Minute, classConsole, "--bootstrap-server", bs, "--topic", topic, "--group", group,
		"--from-beginning", "--max-messages", strconv.Itoa(n), "--timeout-ms", "30000")
	if got := consoleProcessed(t, r.stderr); got != n {
		t.Fatalf("console consumer processed %d records, want %d", got, n)
	}
	seen := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		seen[l]++
	}
	for i := 0; i < n; i++ {
		if v := fmt.Sprintf("line-%d", i); seen[v] != 1 {
			t.Errorf("console consumer printed %q %d times, want once", v, seen[v])
		}
	}
	st.done("console-consumer --group")

	ends := endOffsetsJava(t, bs, topic)
	var total int64
	for _, e := range ends {
		total += e
	}
	if total != n {
		t.Fatalf("end offsets %v add up to %d, want %d", ends, total, n)
	}
	dr := e2eGroupsCLI(t, bs, "--describe", "--group", group)
	e2eGroupsNoError(t, "kafka-consumer-groups --describe", dr)
	e2eGroupsCheckOffsets(t, "kafka-consumer-groups --describe", e2eGroupsOffsets(t, dr.stdout, group, topic), ends, ends)
	st.done("consumer-groups --describe")

	var errOut strings.Builder
	stderr, _, err := javaToolStream(60*time.Second, &errOut, classTopics, "--bootstrap-server", bs, "--create",
		"--topic", topic+"-rf4", "--partitions", "1", "--replication-factor", "4")
	if err == nil || !strings.Contains(errOut.String()+stderr, "InvalidReplicationFactorException") {
		t.Errorf("kafka-topics --create --replication-factor 4 on 3 brokers: err %v, want InvalidReplicationFactorException in:\n%s\n%s",
			err, e2eTruncate(errOut.String(), 2000), e2eTruncate(stderr, 2000))
	}
	st.done("create RF 4 refused")
}

// e2eClusterDescribeFields splits one kafka-topics --describe partition line ("\tTopic: t\t
// Partition: 0\tLeader: 1\tReplicas: 1,2,3\tIsr: 1,2,3...") into its fields.
func e2eClusterDescribeFields(l string) map[string]string {
	f := map[string]string{}
	for _, kv := range strings.Split(l, "\t") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), ": ")
		if ok {
			f[k] = strings.TrimSpace(v)
		}
	}
	return f
}

// TestClusterGroupConsumersOnDifferentBrokers is franz-go's group test pattern across the
// cluster: three consumers in one group, each bootstrapped on a different broker only (so
// FindCoordinator answers the owner of the group's shard from any broker), consume a 6-partition
// topic; every record is consumed exactly once and the committed offsets reach the end offsets.
func TestClusterGroupConsumersOnDifferentBrokers(t *testing.T) {
	const (
		partitions = 6
		n          = 6_000
	)
	c := startE2ECluster(t, 3)
	topic := e2eName("c-grp")
	group := e2eName("c-grp-g")
	c.createTopic(t, topic, partitions, 3)

	type seen struct {
		consumer int
		p        int32
		o        int64
	}
	var (
		mu    sync.Mutex
		byVal = map[string][]seen{}
		count atomic.Int64
		perC  [3]atomic.Int64
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	clients := make([]*kgo.Client, len(c.brokers))
	for i, p := range c.brokers {
		cl, err := kgo.NewClient(append(e2eClusterClientOpts(p.addr),
			kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
			kgo.FetchMaxWait(200*time.Millisecond))...)
		if err != nil {
			t.Fatalf("cannot create consumer %d: %v", i, err)
		}
		clients[i] = cl
		wg.Add(1)
		go func(i int, cl *kgo.Client) {
			defer wg.Done()
			for ctx.Err() == nil {
				fs := cl.PollFetches(ctx)
				fs.EachError(func(tp string, p int32, err error) {
					if ctx.Err() == nil {
						t.Errorf("consumer %d: fetch %s/%d: %v", i, tp, p, err)
					}
				})
				fs.EachRecord(func(r *kgo.Record) {
					mu.Lock()
					byVal[string(r.Value)] = append(byVal[string(r.Value)], seen{i, r.Partition, r.Offset})
					mu.Unlock()
					count.Add(1)
					perC[i].Add(1)
				})
				// Commit what this poll returned before a rebalance may move a partition
				// (BlockRebalanceOnPoll holds it until AllowRebalance).
				if err := cl.CommitUncommittedOffsets(context.Background()); err != nil && ctx.Err() == nil {
					t.Errorf("consumer %d: commit: %v", i, err)
				}
				cl.AllowRebalance()
			}
		}(i, cl)
	}
	defer func() {
		cancel()
		wg.Wait()
		for _, cl := range clients {
			cl.Close()
		}
	}()

	adm := e2eAdminSeeds(t, c.seeds()...)
	e2eEventually(t, 60*time.Second, "group "+group+" stable with 3 members, 2 partitions each", func() error {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		gs, err := adm.DescribeGroups(dctx, group)
		if err != nil {
			return err
		}
		g := gs[group]
		if g.Err != nil || g.State != "Stable" || len(g.Members) != 3 {
			return fmt.Errorf("state %s members %d err %v", g.State, len(g.Members), g.Err)
		}
		for _, m := range g.Members {
			ca, ok := m.Assigned.AsConsumer()
			if !ok {
				return fmt.Errorf("member %s: no consumer assignment", m.MemberID)
			}
			np := 0
			for _, tp := range ca.Topics {
				np += len(tp.Partitions)
			}
			if np != partitions/3 {
				return fmt.Errorf("member %s holds %d partitions", m.MemberID, np)
			}
		}
		return nil
	})

	prod, err := kgo.NewClient(append(e2eClusterClientOpts(c.seeds()...), kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		t.Fatalf("cannot create producer: %v", err)
	}
	defer prod.Close()
	for i := 0; i < n; i++ {
		prod.Produce(ctx, &kgo.Record{Key: []byte(strconv.Itoa(i)), Value: []byte(fmt.Sprintf("v%d", i))}, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Errorf("produce: %v", err)
			}
		})
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	e2eEventually(t, 60*time.Second, fmt.Sprintf("%d records consumed", n), func() error {
		if got := count.Load(); got < n {
			return fmt.Errorf("%d consumed", got)
		}
		return nil
	})

	mu.Lock()
	for i := 0; i < n; i++ {
		v := fmt.Sprintf("v%d", i)
		if len(byVal[v]) != 1 {
			t.Errorf("%s consumed %d times (%v), want once", v, len(byVal[v]), byVal[v])
		}
	}
	mu.Unlock()
	for i := range perC {
		if perC[i].Load() == 0 {
			t.Errorf("consumer %d (seeded with broker %d only) consumed nothing", i, i+1)
		}
	}
	t.Logf("consumed per consumer: %d %d %d", perC[0].Load(), perC[1].Load(), perC[2].Load())

	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	e2eEventually(t, 30*time.Second, "committed offsets at the end offsets", func() error {
		fo, err := adm.FetchOffsets(context.Background(), group)
		if err != nil {
			return err
		}
		var bad []string
		ends.Each(func(o kadm.ListedOffset) {
			if c, ok := fo.Lookup(topic, o.Partition); !ok || c.Err != nil || c.At != o.Offset {
				bad = append(bad, fmt.Sprintf("%d: committed %+v, end %d", o.Partition, c, o.Offset))
			}
		})
		if len(bad) > 0 {
			return errors.New(strings.Join(bad, "; "))
		}
		return nil
	})
}
