package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	// rebalancePartitions is enough for every member of the largest case to own a partition,
	// so "everyone has an assignment" is a real condition and not satisfied by empty ones.
	rebalancePartitions = 100
	// rebalanceHeartbeat is the members' heartbeat interval. A member already in the group learns
	// that a newcomer forced a rebalance from its next heartbeat (REBALANCE_IN_PROGRESS), so with
	// Kafka's 3 s default every join would cost up to 3 s of client timer; 100 ms keeps the
	// figure about the coordinator. 100 members × 10/s is negligible load.
	rebalanceHeartbeat = 100 * time.Millisecond
	// rebalanceBound fails an iteration that has not converged: 100 members must settle in
	// seconds, not minutes.
	rebalanceBound = 60 * time.Second
)

// startRebalanceBroker starts kaas as a subprocess on a free loopback port with a fresh data
// dir, no initial rebalance delay (as the e2e harness and the reference broker runs use), and
// creates the topic every member subscribes to.
//
// A subprocess rather than server.StartBroker: importing package server here registers the
// Produce API a second time (produce_timing_test.go's init registers it for its codec
// benchmarks) and codec.Register panics on that.
func startRebalanceBroker(b *testing.B) (addr, topic string) {
	b.Helper()
	if addr = os.Getenv("KAAS_BENCH_BOOTSTRAP"); addr != "" {
		// An already running broker, e.g. Apache Kafka from `bench/kafka-tools.sh ref-start`,
		// for a side-by-side figure. A fresh topic per run: the previous one may still exist.
		topic = fmt.Sprintf("rebalance-%d", time.Now().UnixNano())
		rebalanceCreateTopic(b, addr, topic)
		return addr, topic
	}
	// The parent benchmark body runs once, so this builds once per `go test -bench` run.
	dir := b.TempDir()
	bin := filepath.Join(dir, "kaas")
	build := exec.Command("go", "build", "-o", bin, "./cmd/kaas")
	build.Dir = ".." // the module root: go test runs benchmarks in the package directory
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("cannot build ./cmd/kaas: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatalf("cannot reserve a loopback port: %v", err)
	}
	addr = l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(dir, "kaas.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "--listeners="+addr, "--data.dir="+filepath.Join(dir, "data"), "--metrics.addr=",
		"--log.level=warn", "--auto.create.topics.enable=false",
		"--group.initial.rebalance.delay.ms=0")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatalf("cannot start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				b.Errorf("kaas exited uncleanly after SIGTERM: %v", err)
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			b.Errorf("kaas did not exit within 15 s of SIGTERM")
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			exited <- err // for the cleanup above
			b.Fatalf("kaas exited during startup: %v\n%s", err, rebalanceReadTail(filepath.Join(dir, "kaas.log")))
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("kaas not listening on %s within 30 s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	topic = "rebalance"
	rebalanceCreateTopic(b, addr, topic)
	return addr, topic
}

func rebalanceCreateTopic(b *testing.B, addr, topic string) {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		b.Fatalf("cannot create admin client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, rebalancePartitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		b.Fatalf("cannot create topic %s: %v", topic, err)
	}
}

// rebalanceRound tracks the assignments the members of one group were handed. Members use the
// eager range assignor (what Java consumers pick first from their default
// [range, cooperative-sticky]), so every generation revokes everything and calls
// OnPartitionsAssigned with each member's whole assignment.
type rebalanceRound struct {
	members int
	done    chan struct{}

	mu       sync.Mutex
	byMember map[string]rebalanceAssigned // member id → its latest assignment
	closed   bool
	lastGen  atomic.Int32
}

type rebalanceAssigned struct {
	gen        int32
	partitions int
}

func (r *rebalanceRound) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	member, gen := cl.GroupMetadata()
	n := 0
	for _, ps := range assigned {
		n += len(ps)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byMember[member] = rebalanceAssigned{gen: gen, partitions: n}
	if gen > r.lastGen.Load() {
		r.lastGen.Store(gen)
	}
	if r.closed || len(r.byMember) < r.members {
		return
	}
	// Done once all N members hold an assignment of one and the same generation and together
	// they own every partition: the group has settled, nobody is still to be told.
	total := 0
	for _, a := range r.byMember {
		if a.gen != gen {
			return
		}
		total += a.partitions
	}
	if total == rebalancePartitions {
		r.closed = true
		close(r.done)
	}
}

func (r *rebalanceRound) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	gens := map[int32]int{}
	for _, a := range r.byMember {
		gens[a.gen]++
	}
	keys := make([]int, 0, len(gens))
	for g := range gens {
		keys = append(keys, int(g))
	}
	sort.Ints(keys)
	s := fmt.Sprintf("%d of %d members assigned; members per generation:", len(r.byMember), r.members)
	for _, g := range keys {
		s += fmt.Sprintf(" %d:%d", g, gens[int32(g)])
	}
	return s
}

// BenchmarkRebalanceJoin measures how long N consumers that start together take to form one new
// group: from creating N franz-go group consumers to the moment every one of them has been
// handed its share of the 100 partitions in the same generation. That covers FindCoordinator,
// the MEMBER_ID_REQUIRED round trip of KIP-394, as many JoinGroup/SyncGroup generations as the
// staggered arrivals cause, and the leader's range assignment. Closing the members (LeaveGroup)
// is outside the timed region.
func BenchmarkRebalanceJoin(b *testing.B) {
	addr, topic := startRebalanceBroker(b)
	var groupSeq atomic.Int64
	for _, members := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) {
			b.ReportAllocs()
			var total time.Duration
			var gens int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				group := fmt.Sprintf("rebalance-%d-%d", members, groupSeq.Add(1))
				r := &rebalanceRound{members: members, done: make(chan struct{}), byMember: map[string]rebalanceAssigned{}}
				clients := make([]*kgo.Client, 0, members)
				b.StartTimer()

				start := time.Now()
				for m := 0; m < members; m++ {
					cl, err := kgo.NewClient(
						kgo.SeedBrokers(addr),
						kgo.ClientID(fmt.Sprintf("bench-%d", m)),
						kgo.ConsumerGroup(group),
						kgo.ConsumeTopics(topic),
						kgo.Balancers(kgo.RangeBalancer()),
						kgo.SessionTimeout(6*time.Second), // the broker minimum (group.min.session.timeout.ms)
						kgo.HeartbeatInterval(rebalanceHeartbeat),
						kgo.OnPartitionsAssigned(r.onAssigned),
					)
					if err != nil {
						b.Fatalf("cannot create member %d: %v", m, err)
					}
					clients = append(clients, cl)
				}
				var timedOut bool
				select {
				case <-r.done:
				case <-time.After(rebalanceBound):
					timedOut = true
				}
				elapsed := time.Since(start)

				b.StopTimer()
				if timedOut {
					b.Errorf("group %s with %d members not settled within %s: %s", group, members, rebalanceBound, r)
				}
				var wg sync.WaitGroup
				for _, cl := range clients {
					wg.Add(1)
					go func() { defer wg.Done(); cl.Close() }()
				}
				wg.Wait()
				if timedOut {
					b.FailNow()
				}
				total += elapsed
				gens += int64(r.lastGen.Load())
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/rebalance")
			b.ReportMetric(float64(gens)/float64(b.N), "generations")
		})
	}
}

func rebalanceReadTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}
