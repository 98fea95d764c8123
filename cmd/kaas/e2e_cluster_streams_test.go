package main

// The Kafka Streams exactly_once_v2 count application (e2e_streams_test.go) against a 3-broker
// cluster (e2e_cluster_test.go): issue 12's "in cluster mode the cleaner runs on the partition
// leader" under the heaviest client of compaction and transactions, with the leader of the
// store's changelog killed with kill -9 and another broker bounced with SIGTERM while the app
// processes, then a restore of the store from the compacted changelog after those moves.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// e2eClusterStreamsManifest is the newest clean manifest of one partition on the shared volume
// (storage/cleaner_cluster.go: clean-<epoch>-<seq>.json, written by the leader at that epoch).
type e2eClusterStreamsManifest struct {
	epoch int32
	seq   int64
}

func (m e2eClusterStreamsManifest) String() string {
	if m.epoch < 0 {
		return "none"
	}
	return fmt.Sprintf("clean-%d-%d", m.epoch, m.seq)
}

// manifests lists the newest clean manifest of every partition of topic on the volume (epoch -1:
// none yet). A manifest is the commit point of a clean, so its epoch says which leader's clean
// the partition's compacted prefix comes from.
func (c *e2eCluster) manifests(topic string, parts int32) (map[int32]e2eClusterStreamsManifest, error) {
	out := map[int32]e2eClusterStreamsManifest{}
	for p := int32(0); p < parts; p++ {
		best := e2eClusterStreamsManifest{epoch: -1, seq: -1}
		names, err := filepath.Glob(filepath.Join(c.vol, "topics", topic, strconv.Itoa(int(p)), "clean-*.json"))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			var m e2eClusterStreamsManifest
			if _, err := fmt.Sscanf(filepath.Base(n), "clean-%d-%d.json", &m.epoch, &m.seq); err != nil {
				continue // a .tmp of a manifest being written
			}
			if m.epoch > best.epoch || (m.epoch == best.epoch && m.seq > best.seq) {
				best = m
			}
		}
		out[p] = best
	}
	return out, nil
}

// leaderEpochs is every partition's (leader id, leader epoch) from a running broker's Metadata.
func (c *e2eCluster) leaderEpochs(topic string, parts int32) (map[int32][2]int32, error) {
	md, err := e2eClusterMetadata(c.runningAddr(c.t, -1), topic)
	if err != nil {
		return nil, err
	}
	out := map[int32][2]int32{}
	for p := int32(0); p < parts; p++ {
		pd, ok := md.Topics[topic].Partitions[p]
		if !ok || pd.Err != nil || pd.Leader < 1 {
			return nil, fmt.Errorf("%s/%d has no leader yet: %+v", topic, p, pd)
		}
		out[p] = [2]int32{pd.Leader, pd.LeaderEpoch}
	}
	return out, nil
}

// metric reads one counter of every running broker (index → value; a stopped broker is absent).
func (c *e2eCluster) metric(name string) (map[int]float64, error) {
	out := map[int]float64{}
	for i, p := range c.brokers {
		if !c.running(i) {
			continue
		}
		v, err := e2eStreamsMetric(p.metrics, name)
		if err != nil {
			return nil, fmt.Errorf("broker %d: %w", i+1, err)
		}
		out[i] = v
	}
	return out, nil
}

// e2eClusterStreamsPolicyAt asks exactly the broker at addr (its seed connection, before any
// metadata could send the request elsewhere) for topic's cleanup.policy.
func e2eClusterStreamsPolicyAt(addr, topic string) (string, error) {
	return e2eClusterStreamsConfigAt(addr, topic, "cleanup.policy")
}

// e2eClusterStreamsConfigAt asks exactly the broker at addr for one config of topic.
func e2eClusterStreamsConfigAt(addr, topic, key string) (string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequestRetries(0))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrDescribeConfigsRequest()
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeTopic
	r.ResourceName = topic
	r.ConfigNames = []string{key}
	req.Resources = append(req.Resources, r)
	resp, err := cl.SeedBrokers()[0].Request(ctx, req)
	if err != nil {
		return "", err
	}
	dr := resp.(*kmsg.DescribeConfigsResponse)
	if len(dr.Resources) != 1 || dr.Resources[0].ErrorCode != 0 {
		return "", fmt.Errorf("DescribeConfigs %s at %s: %+v", topic, addr, dr.Resources)
	}
	for _, c := range dr.Resources[0].Configs {
		if c.Name == key && c.Value != nil {
			return *c.Value, nil
		}
	}
	return "(absent)", nil
}

// e2eClusterStreamsAlterAt sets one config of topic with IncrementalAlterConfigs sent to exactly
// the broker at addr.
func e2eClusterStreamsAlterAt(addr, topic, key, value string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequestRetries(0))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeTopic
	r.ResourceName = topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value, c.Op = key, kmsg.StringPtr(value), kmsg.IncrementalAlterConfigOpSet
	r.Configs = append(r.Configs, c)
	req.Resources = append(req.Resources, r)
	resp, err := cl.SeedBrokers()[0].Request(ctx, req)
	if err != nil {
		return err
	}
	ar := resp.(*kmsg.IncrementalAlterConfigsResponse)
	if len(ar.Resources) != 1 || ar.Resources[0].ErrorCode != 0 {
		return fmt.Errorf("IncrementalAlterConfigs %s=%s on %s at %s: %+v", key, value, topic, addr, ar.Resources)
	}
	return nil
}

// TestClusterStreamsEOSWithCompactionAndKill runs the Streams EOS count application (2 stream
// threads, RocksDB store, no record cache) against 3 kaas processes on one volume, with its
// input, output and the changelog Streams creates all at replication factor 3, and the changelog
// compacted eagerly (100 ms segments, dirty ratio 0.01, cleaner backoff 100 ms). It guards:
//
//   - the changelog is compacted by its partition leaders while the app runs: every partition
//     shrinks, the leaders' kaas_cleaner_cleans_total and kaas_cleaner_cluster_manifests_total
//     move, and each partition's newest manifest on the volume is at its leader's epoch;
//   - DescribeConfigs on any broker, and kafka-configs --describe through a broker that does not
//     lead the partition, show cleanup.policy=compact;
//   - a kill -9 of the leader of changelog partition 0 while a round is being processed (and its
//     restart), after which partition 0 is cleaned again by a later leader (a manifest at a
//     newer epoch), then a SIGTERM bounce of another broker leading changelog partitions (the
//     app's group coordinator when it is one) while the next round is processed;
//   - a restore of the store from the compacted changelog after those moves (the app's state dir
//     wiped) that reads cleaned segments written by a previous leader: before round 3 the
//     cleaner is held off the changelog (min.compaction.lag.ms of an hour), so the partitions
//     the bounce moves keep the manifest their leader before the bounce committed;
//   - exactly-once at the end: every key's read_committed counts are 1, 2, ..., n once each.
//
// Failures are placed by progress (the app has written part of the round), not by the clock.
func TestClusterStreamsEOSWithCompactionAndKill(t *testing.T) {
	requireKafkaLib(t)
	const (
		per    = 25 // records per key per round; 200 keys
		parts  = int32(e2eStreamsParts)
		rounds = 5 // 0-1 compaction, 2 kill -9, 3 bounce, 4 after the restore
	)
	e2eExtraKaasArgs = []string{"--log.cleaner.backoff.ms=100"}
	defer func() { e2eExtraKaasArgs = nil }() // copied into each broker's flags, which restarts reuse
	c := startE2ECluster(t, 3)
	st := newE2EStepTimer(t)
	bs := c.bootstrap()
	in, out, appID := e2eName("c-streams-in"), e2eName("c-streams-out"), e2eName("c-streams-app")
	changelog := e2eStreamsChangelogName(appID)
	c.createTopic(t, in, parts, 3)
	c.createTopic(t, out, parts, 3)
	// Coordinators spread over the brokers, so that the kill and the bounce each move a part of
	// them and the group coordinator can be told apart from the changelog leader.
	c.waitSpread(t)
	cl, err := kgo.NewClient(append(e2eClusterClientOpts(c.seeds()...),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(2*time.Minute))...)
	if err != nil {
		t.Fatalf("cannot create kgo client: %v", err)
	}
	defer cl.Close()
	st.done("cluster + topics")

	stateDir := t.TempDir()
	app := newE2EStreamsApp(t, bs, appID, in, out, stateDir,
		"replication.factor=3", // Streams' internal topics (here the changelog) at RF 3
		"topic.segment.ms=100", "topic.min.cleanable.dirty.ratio=0.01", "topic.min.compaction.lag.ms=0")
	app.start(t)

	// Rounds 0 and 1, the second produced once the first is counted, so that the first round's
	// changelog records sit in rolled (cleanable) segments whatever the speed of the machine.
	for r := 0; r < 2; r++ {
		e2eStreamsProduce(t, cl, in, r*per, (r+1)*per)
		e2eStreamsWaitCounts(t, app, cl, bs, out, int64((r+1)*per), 150*time.Second)
	}
	st.done("count rounds 0-1")

	e2eEventually(t, 30*time.Second, "every broker's metadata of "+changelog+" at RF 3", func() error {
		for _, addr := range c.seeds() {
			md, err := e2eClusterMetadata(addr, changelog)
			if err != nil {
				return err
			}
			td := md.Topics[changelog]
			if td.Err != nil || len(td.Partitions) != int(parts) {
				return fmt.Errorf("%s: %s: %+v", addr, changelog, td)
			}
			for _, p := range td.Partitions {
				if p.Err != nil || p.Leader < 1 || len(p.Replicas) != 3 {
					return fmt.Errorf("%s: %s/%d: leader %d replicas %v err %v", addr, changelog, p.Partition, p.Leader, p.Replicas, p.Err)
				}
			}
		}
		return nil
	})

	// Compaction by the leaders: every partition drops the superseded values of round 0 (3/8 of
	// what it received), its newest manifest is at its current leader's epoch, and each leader's
	// cleaner counters moved.
	e2eClusterStreamsWaitCompacted(t, cl, bs, changelog, 2*per)
	var le map[int32][2]int32
	e2eEventually(t, 60*time.Second, "a manifest of every changelog partition at its leader's epoch", func() error {
		var err error
		if le, err = c.leaderEpochs(changelog, parts); err != nil {
			return err
		}
		ms, err := c.manifests(changelog, parts)
		if err != nil {
			return err
		}
		cleans, err := c.metric("kaas_cleaner_cleans_total")
		if err != nil {
			return err
		}
		mans, err := c.metric("kaas_cleaner_cluster_manifests_total")
		if err != nil {
			return err
		}
		for p := int32(0); p < parts; p++ {
			leader, epoch := le[p][0], le[p][1]
			i := int(leader) - 1
			if ms[p].epoch != epoch {
				return fmt.Errorf("%s/%d: newest manifest %s, leader %d at epoch %d", changelog, p, ms[p], leader, epoch)
			}
			if cleans[i] == 0 || mans[i] == 0 {
				return fmt.Errorf("broker %d leads %s/%d: cleans_total %v, cluster_manifests_total %v", leader, changelog, p, cleans[i], mans[i])
			}
		}
		return nil
	})
	t.Logf("changelog leaders (id, epoch) after rounds 0-1: %v", le)
	st.done("compaction by the leaders")

	// cleanup.policy as every broker answers it, and as kafka-configs shows it through a broker
	// that does not lead partition 0.
	for _, addr := range c.seeds() {
		if policy, err := e2eClusterStreamsPolicyAt(addr, changelog); err != nil || policy != "compact" {
			t.Errorf("DescribeConfigs of %s at %s: cleanup.policy %q (%v), want compact", changelog, addr, policy, err)
		}
	}
	nonLeader := int(le[0][0]) % len(c.brokers) // the broker after the leader of partition 0
	desc := javaTool(t, 60*time.Second, classConfigs, "--bootstrap-server", c.brokers[nonLeader].addr,
		"--entity-type", "topics", "--entity-name", changelog, "--describe").stdout
	if !strings.Contains(desc, "cleanup.policy=compact") {
		t.Errorf("kafka-configs --describe of %s through broker %d: no cleanup.policy=compact in:\n%s", changelog, nonLeader+1, desc)
	}
	t.Logf("kafka-configs --describe through broker %d (not the leader of %s/0):\n%s", nonLeader+1, changelog, strings.TrimSpace(desc))
	st.done("describe configs")

	// Round 2: kill -9 of the leader of changelog partition 0 in the middle of it.
	before := e2eStreamsOutputOffsets(t, cl, out)
	e2eStreamsProduce(t, cl, in, 2*per, 3*per)
	where := e2eStreamsMidRound(t, app, cl, out, before, "round 2")
	killed := c.leaderOf(t, changelog, 0, -1)
	le, err = c.leaderEpochs(changelog, parts)
	if err != nil {
		t.Fatal(err)
	}
	killedEpoch := le[0][1]
	baseline, err := c.metric("kaas_cleaner_cluster_manifests_total")
	if err != nil {
		t.Fatal(err)
	}
	baseline[killed] = 0 // its counters start over with the restart
	gc := c.coordinators(t, false, appID)[appID]
	t.Logf("round 2: kill -9 of broker %d (leader of %s/0 at epoch %d; group coordinator %d) with %s",
		killed+1, changelog, killedEpoch, gc, where)
	c.kill9AndRestart(t, killed)
	e2eStreamsWaitCounts(t, app, cl, bs, out, 3*per, 150*time.Second)
	st.done("round 2 with kill -9")

	// The cleaner goes on with partition 0 on a later leader: a manifest at a newer epoch than
	// the killed leader's, and the manifests counter of some broker moved since the kill.
	var after e2eClusterStreamsManifest
	e2eEventually(t, 60*time.Second, changelog+"/0 cleaned by a leader after the kill", func() error {
		ms, err := c.manifests(changelog, parts)
		if err != nil {
			return err
		}
		after = ms[0]
		if after.epoch <= killedEpoch {
			return fmt.Errorf("newest manifest of %s/0 is %s, killed leader's epoch %d", changelog, after, killedEpoch)
		}
		mans, err := c.metric("kaas_cleaner_cluster_manifests_total")
		if err != nil {
			return err
		}
		for i, v := range mans {
			if v > baseline[i] {
				return nil
			}
		}
		return fmt.Errorf("kaas_cleaner_cluster_manifests_total %v, at the kill %v", mans, baseline)
	})
	if le, err = c.leaderEpochs(changelog, parts); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s/0 after the kill: newest manifest %s (the killed leader's epoch was %d), leader now %d at epoch %d",
		changelog, after, killedEpoch, le[0][0], le[0][1])

	// From here on the cleaner leaves the changelog alone (nothing is older than the lag), so
	// what the restore reads of a partition moved by the bounce below was cleaned by a leader
	// before the move. Set through one broker (the first): every broker must then describe it
	// and clean by it (the registry carries topic configs cluster-wide).
	const frozenLag = "3600000"
	e2eEventually(t, 30*time.Second, "min.compaction.lag.ms altered through broker 1", func() error {
		return e2eClusterStreamsAlterAt(c.brokers[0].addr, changelog, "min.compaction.lag.ms", frozenLag)
	})
	for i, p := range c.brokers {
		e2eEventually(t, 30*time.Second, fmt.Sprintf("min.compaction.lag.ms=%s on broker %d", frozenLag, i+1), func() error {
			if v, err := e2eClusterStreamsConfigAt(p.addr, changelog, "min.compaction.lag.ms"); err != nil || v != frozenLag {
				return fmt.Errorf("broker %d describes min.compaction.lag.ms=%q (%v)", i+1, v, err)
			}
			return nil
		})
	}

	// Round 3: a SIGTERM bounce of another broker in the middle of it: one that leads changelog
	// partitions (so the restore has partitions to read from a previous leader), the group
	// coordinator when it is such a broker.
	gc = c.coordinators(t, false, appID)[appID]
	if le, err = c.leaderEpochs(changelog, parts); err != nil {
		t.Fatal(err)
	}
	bounced := -1
	for p := int32(0); p < parts; p++ {
		if i := int(le[p][0]) - 1; i != killed && (bounced < 0 || le[p][0] == gc) {
			bounced = i
		}
	}
	if bounced < 0 {
		t.Fatalf("every changelog partition is led by broker %d, the killed one: %v", killed+1, le)
	}
	var moved []int32 // the changelog partitions the bounce takes from their leader
	for p := int32(0); p < parts; p++ {
		if int(le[p][0])-1 == bounced {
			moved = append(moved, p)
		}
	}
	before = e2eStreamsOutputOffsets(t, cl, out)
	e2eStreamsProduce(t, cl, in, 3*per, 4*per)
	where = e2eStreamsMidRound(t, app, cl, out, before, "round 3")
	t.Logf("round 3: SIGTERM bounce of broker %d (leader of %s partitions %v; group coordinator %d) with %s",
		bounced+1, changelog, moved, gc, where)
	c.bounce(t, bounced)
	e2eStreamsWaitCounts(t, app, cl, bs, out, 4*per, 150*time.Second)
	app.stop(t)
	st.done("round 3 with a bounce")

	// Restore: the app loses its local state and rebuilds the store from the compacted
	// changelog, through the leaders the cluster moved to, before it counts round 4. A wrong
	// restore (a lost or stale latest value, an aborted record that survived a clean) shows as a
	// sequence that does not continue 101, 102, ...
	kept := e2eClusterStreamsWaitCompacted(t, cl, bs, changelog, 4*per)
	ms, err := c.manifests(changelog, parts)
	if err != nil {
		t.Fatal(err)
	}
	if le, err = c.leaderEpochs(changelog, parts); err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < parts; p++ {
		t.Logf("restore of %s/%d: %d records kept, newest manifest %s, leader %d at epoch %d",
			changelog, p, kept[p], ms[p], le[p][0], le[p][1])
	}
	for _, p := range moved {
		if ms[p].epoch < 0 || ms[p].epoch >= le[p][1] {
			t.Errorf("%s/%d, moved by the bounce: newest manifest %s, leader epoch %d; want a manifest of an earlier leader",
				changelog, p, ms[p], le[p][1])
		}
	}
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	app.start(t)
	e2eStreamsProduce(t, cl, in, 4*per, rounds*per)
	e2eStreamsWaitCounts(t, app, cl, bs, out, rounds*per, 150*time.Second)
	app.stop(t)
	st.done("restore + round 4")
	e2eStreamsCheckExact(t, cl, bs, out, rounds*per)
}

// e2eClusterStreamsWaitCompacted polls until every changelog partition holds less than 3/4 of
// the records it received (perKey per key, one changelog record per input record without a
// record cache) and returns the records kept per partition.
func e2eClusterStreamsWaitCompacted(t *testing.T, cl *kgo.Client, bootstrap, changelog string, perKey int) map[int32]int {
	t.Helper()
	var kept map[int32]int
	e2eEventually(t, 60*time.Second, "every partition of "+changelog+" compacted", func() error {
		k, keys, err := e2eStreamsChangelog(cl, bootstrap, changelog)
		if err != nil {
			return err
		}
		total, written := 0, 0
		for p := int32(0); p < e2eStreamsParts; p++ {
			w := keys[p] * perKey
			if keys[p] == 0 || k[p] >= w*3/4 {
				return fmt.Errorf("%s/%d: %d records kept of %d written", changelog, p, k[p], w)
			}
			total, written = total+k[p], written+w
		}
		kept = k
		t.Logf("changelog %s: %d records kept of %d written (%v per partition)", changelog, total, written, k)
		return nil
	})
	return kept
}
