package main

// Process tests of transactions across brokers (issue 10, "Tests: Processes" and the
// kafka-transactions.sh bullet of "Fencing and KIP-890 across brokers"): three kaas processes on
// one shared volume with a real etcd (e2e_cluster_test.go), driven by Kafka's
// TransactionalMessageCopier processes, franz-go's GroupTransactSession in this process and
// kafka-transactions.sh, with brokers killed with kill -9 and bounced with SIGTERM meanwhile.
// Where it matters, the transaction coordinator of an id, the partition leaders and the group
// coordinator are picked to be different brokers (FindCoordinator and Metadata say which).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// coordinators asks FindCoordinator (through the 3 seeds) which broker coordinates each key:
// groups (txn false) or transactional ids (txn true). Retried until every key has an owner,
// since a slot or shard may be between owners right after a broker came or went.
func (c *e2eCluster) coordinators(t *testing.T, txnKeys bool, keys ...string) map[string]int32 {
	t.Helper()
	adm := e2eAdminSeeds(t, c.seeds()...)
	out := map[string]int32{}
	e2eEventually(t, 60*time.Second, fmt.Sprintf("a coordinator for each of %d keys", len(keys)), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var resps kadm.FindCoordinatorResponses
		if txnKeys {
			resps = adm.FindTxnCoordinators(ctx, keys...)
		} else {
			resps = adm.FindGroupCoordinators(ctx, keys...)
		}
		for _, k := range keys {
			r, ok := resps[k]
			if !ok || r.Err != nil || r.NodeID < 1 {
				return fmt.Errorf("key %q: %+v", k, r)
			}
			out[k] = r.NodeID
		}
		return nil
	})
	return out
}

// waitSpread waits until the controller has spread the transaction slots and the group shards
// over every broker evenly (a fresh cluster starts with the first broker holding all of them):
// FindCoordinator for one key of each slot and shard.
func (c *e2eCluster) waitSpread(t *testing.T) {
	t.Helper()
	var tids, groups []string
	for i := 0; len(tids) < topology.NumTxnSlots || len(groups) < topology.NumGroupShards; i++ {
		k := fmt.Sprintf("spread-%d", i)
		if topology.TxnSlot(k) == len(tids) {
			tids = append(tids, k)
		}
		if topology.GroupShard(k) == len(groups) {
			groups = append(groups, k)
		}
	}
	n := len(c.brokers)
	e2eEventually(t, 90*time.Second, "slots and shards spread over every broker", func() error {
		for _, kind := range []struct {
			txn  bool
			keys []string
		}{{true, tids}, {false, groups}} {
			held := map[int32]int{}
			for _, id := range c.coordinators(t, kind.txn, kind.keys...) {
				held[id]++
			}
			for id := int32(1); id <= int32(n); id++ {
				if h := held[id]; h < len(kind.keys)/n || h > len(kind.keys)/n+1 {
					return fmt.Errorf("coordinators per broker %v: not spread yet (transactional ids: %v)", held, kind.txn)
				}
			}
		}
		return nil
	})
}

// pickKey returns a fresh name (prefix plus a suffix) whose coordinator — of a transactional id
// (txnKey) or a group — is a broker accepted by want, and that broker's id.
func (c *e2eCluster) pickKey(t *testing.T, prefix string, txnKey bool, want func(id int32) bool) (string, int32) {
	t.Helper()
	base := e2eName(prefix)
	var keys []string
	for i := 0; i < 64; i++ {
		keys = append(keys, fmt.Sprintf("%s-%d", base, i))
	}
	owners := c.coordinators(t, txnKey, keys...)
	for _, k := range keys {
		if want(owners[k]) {
			return k, owners[k]
		}
	}
	t.Fatalf("none of %d %s names has a coordinator accepted by the test: %v", len(keys), prefix, owners)
	return "", -1
}

// leaders is the leader (broker id) of every partition of topic, from a running broker's Metadata.
func (c *e2eCluster) leaders(t *testing.T, topic string, parts int32) map[int32]int32 {
	t.Helper()
	out := map[int32]int32{}
	for p := int32(0); p < parts; p++ {
		out[p] = int32(c.leaderOf(t, topic, p, -1) + 1)
	}
	return out
}

// running reports whether broker i's process is up.
func (c *e2eCluster) running(i int) bool {
	p := c.brokers[i]
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// kill9AndRestart kills broker i with kill -9, waits until the survivors' Metadata no longer
// lists it (its lease expired: the controller moves what it held to them), and starts it again.
func (c *e2eCluster) kill9AndRestart(t *testing.T, i int) {
	t.Helper()
	killed := time.Now()
	c.kill9(t, i)
	e2eEventually(t, 30*time.Second, fmt.Sprintf("the survivors drop broker %d", i+1), func() error {
		for j, p := range c.brokers {
			if j == i {
				continue
			}
			md, err := e2eClusterMetadata(p.addr)
			if err != nil {
				return fmt.Errorf("broker %d: %w", j+1, err)
			}
			if slices.Contains(md.Brokers.NodeIDs(), int32(i+1)) {
				return fmt.Errorf("broker %d still lists broker %d", j+1, i+1)
			}
		}
		return nil
	})
	t.Logf("broker %d gone from the survivors' Metadata %s after the kill", i+1, time.Since(killed).Round(time.Millisecond))
	c.restart(t, i)
}

// bounce stops broker i with SIGTERM (a drain that must end with exit code 0) and starts it again.
func (c *e2eCluster) bounce(t *testing.T, i int) {
	t.Helper()
	c.sigterm(t, i)
	if code := c.waitExit(t, i, e2eClusterDrainWait); code != 0 {
		t.Errorf("broker %d exited with code %d after SIGTERM, want 0 (drained)", i+1, code)
	}
	c.restart(t, i)
}

// e2eClusterTxnFindHanging runs find-hanging --broker-id id through bootstrap bs. The tool exits
// 1 on any NOT_LEADER_OR_FOLLOWER (it pins DescribeProducers to that broker), which a partition
// between owners answers for a moment after a broker came or went (retriable for every other
// client): the run is retried until it completes.
func e2eClusterTxnFindHanging(t *testing.T, bs string, id int) []map[string]string {
	t.Helper()
	args := []string{"--bootstrap-server", bs, "find-hanging", "--broker-id", strconv.Itoa(id), "--max-transaction-timeout", "1"}
	var out strings.Builder
	err := e2ePoll(60*time.Second, time.Second, func() error {
		out.Reset()
		stderr, _, err := javaToolStream(60*time.Second, &out, e2eTxnClassTxns, args...)
		if err != nil {
			t.Logf("find-hanging --broker-id %d: %v (retrying): %s", id, err, e2eTruncate(stderr, 600))
		}
		return err
	})
	if err != nil {
		t.Fatalf("kafka-transactions %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("kafka-transactions find-hanging --broker-id %d through %s:\n%s", id, bs, strings.TrimRight(out.String(), "\n"))
	return e2eTxnTable(t, out.String())
}

// e2eClusterTxnNoHanging runs find-hanging for every broker id (each through another broker's
// seed) and fails on any row.
func e2eClusterTxnNoHanging(t *testing.T, c *e2eCluster, what string) {
	t.Helper()
	for i := range c.brokers {
		rows := e2eClusterTxnFindHanging(t, c.seeds()[(i+1)%len(c.brokers)], i+1)
		if len(rows) != 0 {
			t.Errorf("%s: find-hanging --broker-id %d lists %v", what, i+1, rows)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// 1. TransactionalMessageCopier against 3 seeds, with kill -9 and clean bounces

// TestClusterTxnMessageCopierChaos is transactions_test.py across brokers: 4
// TransactionalMessageCopier processes (one per input partition, random aborts, KIP-447 group
// metadata) copy numbered records through the 3 seeds while a random broker is killed with
// kill -9 every 10 s for 3 rounds (restarted after each; the survivors take its partitions,
// slots and shards over), then every broker in turn is bounced with SIGTERM, 3 s apart; every
// failure must land inside the copy. Afterwards read_committed output holds every input record
// exactly once, each input partition in order, the group's offsets are the input end offsets, and
// nothing is left open: no transaction listed Ongoing or Prepare*, find-hanging empty on every
// broker id.
func TestClusterTxnMessageCopierChaos(t *testing.T) {
	requireKafkaLib(t)
	const (
		parts = 4
		// A kill -9 every 10 s for 3 rounds (as the test plan says), then a clean bounce
		// of each broker 3 s apart, all inside the copy: ~50 s of copying on an idle machine. The
		// 4 copiers with 10-record transactions copy 1.5k–2.2k records/s here (loaded CI / idle;
		// 130 000 records ended 7 s after the last bounce on an idle machine, too close), so
		// 200 000 last about 90 s idle and leave room for a faster machine. (65 000 were too few:
		// the third kill and the bounces landed after the copy.)
		n         = 200_000
		killEvery = 10 * time.Second
		kills     = 3
		bounceGap = 3 * time.Second
	)
	c := startE2ECluster(t, 3)
	bs := c.bootstrap()
	cfg := e2eTxnCopyCfg{in: e2eName("c-cp-in"), out: e2eName("c-cp-out"), group: e2eName("c-cp-grp"),
		// Small transactions: many of them cross each failure.
		inParts: parts, n: n, bootstrap: bs, txnSize: 10, timeout: 5 * time.Minute,
		// A copier restarted after a broker failure may wait for its dead session's transaction to
		// be reaped (see e2eTxnCopy): keep that short.
		txnTimeout: 10 * time.Second}
	c.createTopic(t, cfg.in, parts, 3)
	c.createTopic(t, cfg.out, parts, 3)
	c.waitSpread(t)
	t.Logf("input leaders %v, output leaders %v", c.leaders(t, cfg.in, parts), c.leaders(t, cfg.out, parts))
	st := newE2EStepTimer(t)
	seeded := e2eTxnSeed(t, bs, cfg.in, n)
	st.done("seed (VerifiableProducer)")

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 10))
	var (
		start    time.Time
		lastFail time.Time
		atChaos  []float64
	)
	cfg.chaos = func(progress float64) bool {
		i := len(atChaos)
		if i == kills+len(c.brokers) {
			return false
		}
		if start.IsZero() {
			if progress == 0 {
				return true // the JVMs are still starting: the clock starts with the copy
			}
			start, lastFail = time.Now(), time.Now()
			t.Logf("every copier is copying: kill -9 every %s from now, then bounces %s apart", killEvery, bounceGap)
		}
		if i < kills {
			if time.Since(lastFail) < killEvery {
				return true
			}
			b := rng.IntN(len(c.brokers))
			t.Logf("kill -9 #%d: broker %d at %.0f%% progress, %s into the copy", i+1, b+1, 100*progress, time.Since(start).Round(time.Millisecond))
			c.kill9AndRestart(t, b)
		} else {
			if time.Since(lastFail) < bounceGap {
				return true
			}
			b := i - kills
			t.Logf("clean bounce of broker %d at %.0f%% progress, %s into the copy", b+1, 100*progress, time.Since(start).Round(time.Millisecond))
			c.bounce(t, b)
		}
		lastFail = time.Now()
		atChaos = append(atChaos, progress)
		return len(atChaos) < kills+len(c.brokers)
	}
	e2eTxnCopy(t, nil, cfg)
	st.done("copy under kill -9 and bounces")
	t.Logf("progress at each kill / bounce: %.2f", atChaos)
	// Every failure must have hit a running copy (a failure after the last record was copied
	// tests only the checks below).
	for i, p := range atChaos {
		if p >= 1 {
			t.Errorf("failure #%d came after the copy had finished (raise n): progress at each %.2f", i+1, atChaos)
		}
	}

	c.waitSpread(t) // the last bounce's moves settle before the checks ask every broker
	e2eTxnCheckCopy(t, bs, seeded, cfg, parts, true)
	rows := e2eTxnTable(t, e2eTxnTool(t, bs, "list"))
	for _, r := range rows {
		if s := r["TransactionState"]; s == "Ongoing" || strings.HasPrefix(s, "Prepare") {
			t.Errorf("kafka-transactions list: %s is still %s on coordinator %s", r["TransactionalId"], s, r["Coordinator"])
		}
	}
	e2eClusterTxnNoHanging(t, c, "after the copy")
	st.done("verify")
}

// ---------------------------------------------------------------------------------------------
// 2. franz-go GroupTransactSession against the 3 brokers

// TestClusterTxnGroupTransactSession is consume-transform-produce with kgo's
// GroupTransactSession in this process against the 3 broker processes, with the transaction
// coordinator and the group coordinator on different brokers, once with transaction.version 2
// (the default: Produce v12 implicit adds, EndTxn v5 epoch bumps) and once with the brokers
// finalizing transaction.version 1 (AddPartitionsToTxn, AddOffsetsToTxn, the leaders' VerifyOnly
// checks). Mid-run, inside a transaction (records produced, End not called yet), one broker is
// killed with kill -9: the transaction coordinator in the TV2 run, the group coordinator in the
// TV1 run; it is restarted a while later. Afterwards every input record's transformed value is in
// the read_committed output exactly once, in input order per partition, and the group's
// committed offsets are the input end offsets.
func TestClusterTxnGroupTransactSession(t *testing.T) {
	t.Run("tv2-kill-txn-coordinator", func(t *testing.T) { e2eClusterTxnGTS(t, 2, true) })
	t.Run("tv1-kill-group-coordinator", func(t *testing.T) { e2eClusterTxnGTS(t, 1, false) })
}

func e2eClusterTxnGTS(t *testing.T, tv int16, killTxnCoordinator bool) {
	const (
		parts   = 3
		n       = 9_000
		perTxn  = 150
		maxSess = 6 // sessions created in all (each End error closes the session and opens a new one)
	)
	if tv != 2 {
		e2eExtraKaasArgs = []string{fmt.Sprintf("--transaction.version=%d", tv)}
		defer func() { e2eExtraKaasArgs = nil }()
	}
	c := startE2ECluster(t, 3)
	for _, addr := range c.seeds() {
		got, err := e2eTxnFinalizedTV(addr)
		if err != nil || got != tv {
			t.Fatalf("broker %s finalizes transaction.version %d (err %v), want %d", addr, got, err, tv)
		}
	}
	in, out := e2eName("c-gts-in"), e2eName("c-gts-out")
	c.createTopic(t, in, parts, 3)
	c.createTopic(t, out, parts, 3)
	c.waitSpread(t)
	tid, tc := c.pickKey(t, "c-gts-tid", true, func(int32) bool { return true })
	group, gc := c.pickKey(t, "c-gts-grp", false, func(id int32) bool { return id != tc })
	t.Logf("transaction coordinator of %s: broker %d; group coordinator of %s: broker %d; input leaders %v, output leaders %v",
		tid, tc, group, gc, c.leaders(t, in, parts), c.leaders(t, out, parts))

	// The input: n numbered records, idempotent, spread over the partitions by key.
	prod, err := kgo.NewClient(append(e2eClusterClientOpts(c.seeds()...), kgo.DefaultProduceTopic(in))...)
	if err != nil {
		t.Fatalf("cannot create producer: %v", err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var rs []*kgo.Record
	for i := 0; i < n; i++ {
		rs = append(rs, &kgo.Record{Key: []byte(strconv.Itoa(i)), Value: []byte(fmt.Sprintf("v-%d", i))})
	}
	if err := prod.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce the input: %v", err)
	}
	inAt := map[string]e2ePos{} // value → where it is in the input
	for _, r := range rs {
		inAt[string(r.Value)] = e2ePos{int(r.Partition), r.Offset}
	}

	newSession := func() *kgo.GroupTransactSession {
		t.Helper()
		sess, err := kgo.NewGroupTransactSession(append(e2eClusterClientOpts(c.seeds()...),
			kgo.TransactionalID(tid), kgo.TransactionTimeout(20*time.Second),
			kgo.ConsumerGroup(group), kgo.ConsumeTopics(in),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.RequireStableFetchOffsets(),
			kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(10*time.Second),
			kgo.FetchMaxWait(200*time.Millisecond),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(out))...)
		if err != nil {
			t.Fatalf("cannot create GroupTransactSession: %v", err)
		}
		return sess
	}
	sess := newSession()
	defer func() { sess.Close() }()
	sessions := 1
	victim := tc
	if !killTxnCoordinator {
		victim = gc
	}
	var (
		committed, aborted, txns int
		killedAt                 time.Time
		endErrs                  []string
	)
	start := time.Now()
	for committed < n {
		if ctx.Err() != nil {
			t.Fatalf("committed %d of %d transformed records before the deadline (%d aborted, End errors %q)", committed, n, aborted, endErrs)
		}
		// The loop goes on without the victim for a while (the survivors serve its slot or
		// shard), then it comes back and may take things over again.
		if !killedAt.IsZero() && !c.running(c.index(t, victim)) && (committed >= 2*n/3 || time.Since(killedAt) > 20*time.Second) {
			c.restart(t, c.index(t, victim))
			t.Logf("broker %d back after %d committed records (%s after the kill)", victim, committed, time.Since(killedAt).Round(time.Millisecond))
		}
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		fs := sess.PollRecords(pctx, perTxn)
		pcancel()
		if fs.Empty() {
			continue
		}
		if err := sess.Begin(); err != nil {
			t.Fatalf("begin: %v", err)
		}
		k := 0
		fs.EachRecord(func(r *kgo.Record) {
			sess.Produce(ctx, &kgo.Record{Partition: r.Partition, Key: r.Key,
				Value: []byte("t-" + strings.TrimPrefix(string(r.Value), "v-"))}, nil)
			k++
		})
		if killedAt.IsZero() && committed >= n/3 {
			// Mid-transaction: its records are produced (maybe not yet acknowledged), its offsets
			// not yet committed, EndTxn not sent.
			t.Logf("kill -9 broker %d (the %s coordinator) inside a transaction, after %d committed records", victim,
				map[bool]string{true: "transaction", false: "group"}[killTxnCoordinator], committed)
			c.kill9(t, c.index(t, victim))
			killedAt = time.Now()
		}
		ok, err := sess.End(ctx, kgo.TryCommit)
		txns++
		switch {
		case err != nil:
			// kgo: no error End returns is retriable; the application closes the session and
			// starts again from the committed offsets (a restarted process does the same).
			endErrs = append(endErrs, err.Error())
			t.Logf("End after %d committed records: %v; new session", committed, err)
			sess.Close()
			if sessions >= maxSess {
				t.Fatalf("%d sessions ended in errors: %q", sessions, endErrs)
			}
			sess = newSession()
			sessions++
		case ok:
			committed += k
		default:
			aborted += k
		}
	}
	if !c.running(c.index(t, victim)) {
		c.restart(t, c.index(t, victim))
	}
	t.Logf("%d transactions in %s: %d records committed, %d aborted (rebalance), %d sessions, End errors %q",
		txns, time.Since(start).Round(time.Millisecond), committed, aborted, sessions, endErrs)
	if committed != n {
		t.Errorf("committed %d transformed records, want %d (each input record once)", committed, n)
	}

	cl := e2eTxnClient(t, c.bootstrap())
	hwm := e2eTxnWaitStable(t, cl, out, parts, 30*time.Second)
	recs := e2eTxnReadAll(t, c.bootstrap(), out, hwm, e2eTxnReadCommitted, 90*time.Second)
	sort.Slice(recs, func(i, j int) bool {
		if recs[i].p != recs[j].p {
			return recs[i].p < recs[j].p
		}
		return recs[i].o < recs[j].o
	})
	count := map[string]int{}
	last := map[int32]int64{}
	bad := 0
	for _, r := range recs {
		src, ok := inAt["v-"+strings.TrimPrefix(r.value, "t-")]
		if !ok || !strings.HasPrefix(r.value, "t-") {
			t.Errorf("output %d/%d holds %q, not the transform of an input record", r.p, r.o, r.value)
			continue
		}
		count[r.value]++
		if int32(src.p) != r.p {
			t.Errorf("output %d/%d holds %q from input partition %d", r.p, r.o, r.value, src.p)
		}
		if prev, seen := last[r.p]; seen && src.o <= prev && bad < 5 {
			t.Errorf("output %d/%d: %q from input offset %d after input offset %d (order broken)", r.p, r.o, r.value, src.o, prev)
			bad++
		}
		last[r.p] = src.o
	}
	dups, missing := 0, 0
	for i := 0; i < n; i++ {
		v := fmt.Sprintf("t-%d", i)
		switch count[v] {
		case 1:
		case 0:
			if missing < 5 {
				t.Errorf("read_committed output lacks %s", v)
			}
			missing++
		default:
			if dups < 5 {
				t.Errorf("read_committed output holds %s %d times", v, count[v])
			}
			dups++
		}
	}
	t.Logf("read_committed output: %d records (high watermarks %v), %d missing, %d duplicated", len(recs), hwm, missing, dups)

	adm := kadm.NewClient(cl)
	inEnds, err := e2eTxnListOffsets(cl, in, parts, e2eTxnReadUncommitted)
	if err != nil {
		t.Fatalf("ListOffsets %s: %v", in, err)
	}
	e2eEventually(t, 30*time.Second, "the group's offsets at the input end offsets", func() error {
		octx, ocancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ocancel()
		offs, err := adm.FetchOffsets(octx, group)
		if err == nil {
			err = offs.Error()
		}
		if err != nil {
			return err
		}
		for p := int32(0); p < parts; p++ {
			if o, ok := offs.Lookup(in, p); !ok || o.At != inEnds[p] {
				return fmt.Errorf("partition %d: committed %+v, end offset %d", p, o, inEnds[p])
			}
		}
		return nil
	})
}

// ---------------------------------------------------------------------------------------------
// 3. kafka-transactions.sh across brokers

// e2eClusterTxnForget makes the coordinator lose a transactional id, so that the partitions of
// its open transaction hang for good (what find-hanging exists for). The whole cluster is
// stopped with SIGTERM (each drain checkpoints the slots it holds, so the newest checkpoint of
// the id's slot holds everything), the id is dropped from that checkpoint, and the brokers are
// started again.
func e2eClusterTxnForget(t *testing.T, c *e2eCluster, tid string) {
	t.Helper()
	for i := range c.brokers {
		c.sigterm(t, i) // the drains overlap; waitExit below collects them one by one
	}
	for i := range c.brokers {
		if code := c.waitExit(t, i, e2eClusterDrainWait); code != 0 {
			t.Fatalf("broker %d exited with %d after SIGTERM, want 0 (drained)", i+1, code)
		}
	}
	slot := txn.SlotFor(tid)
	dir := filepath.Join(c.vol, "__cluster", txn.StateDir)
	var newest string
	var newestEpoch int32 = -1
	for e := int32(0); e < 1000; e++ {
		name := txn.SlotCheckpointName(slot, e)
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil && e > newestEpoch {
			newest, newestEpoch = name, e
		}
	}
	if newest == "" {
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("no checkpoint of slot %d in %s: %v", slot, dir, names)
	}
	e2eDropSlotEntry(t, filepath.Join(dir, newest), tid)
	t.Logf("dropped %s from %s", tid, newest)
	for _, p := range c.brokers {
		p.Restart(t)
	}
	c.waitMembers(t, len(c.brokers), 60*time.Second)
	c.waitSpread(t)
}

// e2eClusterTxnSame runs one kafka-transactions.sh command through each single seed and through
// the 3 seeds, and requires the same table from all four (after drop removes columns that
// legitimately change between runs, e.g. a duration); it returns that table.
func e2eClusterTxnSame(t *testing.T, c *e2eCluster, keep func(map[string]string) bool, drop []string, args ...string) []map[string]string {
	t.Helper()
	var first []map[string]string
	var firstKey string
	for _, bs := range append([]string{c.bootstrap()}, c.seeds()...) {
		rows := e2eTxnTable(t, e2eTxnTool(t, bs, args...))
		var kept []map[string]string
		var lines []string
		for _, r := range rows {
			if keep != nil && !keep(r) {
				continue
			}
			kept = append(kept, r)
			var cols []string
			for k, v := range r {
				if !slices.Contains(drop, k) {
					cols = append(cols, k+"="+v)
				}
			}
			sort.Strings(cols)
			lines = append(lines, strings.Join(cols, " "))
		}
		sort.Strings(lines)
		key := strings.Join(lines, "\n")
		if first == nil {
			first, firstKey = kept, key
			if first == nil {
				first = []map[string]string{}
			}
			continue
		}
		if key != firstKey {
			t.Errorf("kafka-transactions %s through %s:\n%s\nthrough %s:\n%s", strings.Join(args, " "), c.bootstrap(), firstKey, bs, key)
		}
	}
	return first
}

// TestClusterTxnToolsAcrossBrokers drives kafka-transactions.sh list, describe,
// describe-producers, find-hanging and abort against 3 brokers where the coordinator of the
// transactional id and the leader of the partition it wrote are different brokers: every
// command gives the same answer through any seed, find-hanging reports nothing on any broker id
// while the coordinator tracks the transaction, reports it on every broker id (each is a
// replica) once the coordinator has lost the id, and abort ends it on the leader.
func TestClusterTxnToolsAcrossBrokers(t *testing.T) {
	requireKafkaLib(t)
	const parts = 3
	c := startE2ECluster(t, 3)
	topic := e2eName("c-tools-txn")
	c.createTopic(t, topic, parts, 3)
	c.waitSpread(t)
	st := newE2EStepTimer(t)
	leader := int32(c.leaderOf(t, topic, 0, -1) + 1)
	hungID, hungC := c.pickKey(t, "c-tools-hung", true, func(id int32) bool { return id != leader })
	okID, okC := c.pickKey(t, "c-tools-ok", true, func(id int32) bool { return id != leader })
	t.Logf("partition 0 led by broker %d; coordinator of %s: broker %d, of %s: broker %d", leader, hungID, hungC, okID, okC)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The abandoned producer, as in TestTxnToolsFlows: a long transaction timeout (the reaper
	// never ends it) and records stamped 10 minutes in the past (find-hanging measures age from
	// DescribeProducers' LastTimestamp, one minute at least).
	mk := func(tid string) *kgo.Client {
		cl, err := kgo.NewClient(append(e2eClusterClientOpts(c.seeds()...), kgo.TransactionalID(tid),
			kgo.TransactionTimeout(10*time.Minute), kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
		if err != nil {
			t.Fatalf("cannot create producer %s: %v", tid, err)
		}
		return cl
	}
	hung := mk(hungID)
	defer hung.Close()
	if err := hung.BeginTransaction(); err != nil {
		t.Fatalf("BeginTransaction: %v", err)
	}
	oldTs := time.Now().Add(-10 * time.Minute).Truncate(time.Millisecond)
	var hungRecs []*kgo.Record
	for i := 0; i < 3; i++ {
		hungRecs = append(hungRecs, &kgo.Record{Partition: 0, Value: []byte(fmt.Sprintf("hung-%d", i)), Timestamp: oldTs})
	}
	if err := hung.ProduceSync(ctx, hungRecs...).FirstErr(); err != nil {
		t.Fatalf("produce in the abandoned transaction: %v", err)
	}
	startOffset, hungPID := hungRecs[0].Offset, hungRecs[0].ProducerID
	ok := mk(okID)
	defer ok.Close()
	okVals := e2eCommitOnPartition0(t, ctx, ok, "ok-", 5)
	st.done("abandoned + committed producers")

	cl := e2eTxnClient(t, c.bootstrap())
	var hwm0 int64
	e2eEventually(t, 10*time.Second, "LSO pinned at the abandoned transaction", func() error {
		h, err := e2eTxnListOffsets(cl, topic, parts, e2eTxnReadUncommitted)
		if err != nil {
			return err
		}
		l, err := e2eTxnListOffsets(cl, topic, parts, e2eTxnReadCommitted)
		if err != nil {
			return err
		}
		if l[0] != startOffset || h[0] != startOffset+9 { // 3 hung, 5 committed, 1 commit marker
			return fmt.Errorf("partition 0: LSO %d HWM %d, want LSO %d HWM %d", l[0], h[0], startOffset, startOffset+9)
		}
		hwm0 = h[0]
		return nil
	})

	ours := func(r map[string]string) bool { return r["TransactionalId"] == hungID || r["TransactionalId"] == okID }
	rows := e2eClusterTxnSame(t, c, ours, nil, "list")
	states := map[string]map[string]string{}
	for _, r := range rows {
		states[r["TransactionalId"]] = r
	}
	if r := states[hungID]; r == nil || r["TransactionState"] != "Ongoing" || r["ProducerId"] != strconv.FormatInt(hungPID, 10) ||
		r["Coordinator"] != strconv.Itoa(int(hungC)) {
		t.Errorf("list: %s row %v, want Ongoing, producer id %d, coordinator %d", hungID, r, hungPID, hungC)
	}
	if r := states[okID]; r == nil || r["TransactionState"] != "CompleteCommit" || r["Coordinator"] != strconv.Itoa(int(okC)) {
		t.Errorf("list: %s row %v, want CompleteCommit on coordinator %d", okID, r, okC)
	}
	st.done("list")

	rows = e2eClusterTxnSame(t, c, nil, []string{"TransactionDurationMs"}, "describe", "--transactional-id", hungID)
	if len(rows) != 1 {
		t.Fatalf("describe: %d rows", len(rows))
	}
	if d := rows[0]; d["CoordinatorId"] != strconv.Itoa(int(hungC)) || d["TransactionState"] != "Ongoing" ||
		d["ProducerId"] != strconv.FormatInt(hungPID, 10) || d["TransactionTimeoutMs"] != "600000" ||
		!strings.Contains(","+d["TopicPartitions"]+",", ","+topic+"-0,") {
		t.Errorf("describe %s: %v, want coordinator %d, Ongoing, producer %d, timeout 600000, partitions containing %s-0", hungID, d, hungC, hungPID, topic)
	}
	st.done("describe")

	describeProducers := func() []map[string]string {
		t.Helper()
		return e2eClusterTxnSame(t, c, nil, nil, "describe-producers", "--topic", topic, "--partition", "0")
	}
	rows = describeProducers()
	sawHung := false
	for _, r := range rows {
		if r["ProducerId"] == strconv.FormatInt(hungPID, 10) {
			sawHung = true
			if r["CurrentTransactionStartOffset"] != strconv.FormatInt(startOffset, 10) || r["LastTimestamp"] != strconv.FormatInt(oldTs.UnixMilli(), 10) {
				t.Errorf("describe-producers: %v, want CurrentTransactionStartOffset %d LastTimestamp %d", r, startOffset, oldTs.UnixMilli())
			}
		} else if !e2eTxnNoOpenTxn(r["CurrentTransactionStartOffset"]) {
			t.Errorf("describe-producers: producer %s has an open transaction: %v", r["ProducerId"], r)
		}
	}
	if !sawHung || len(rows) != 2 {
		t.Errorf("describe-producers: %d rows, abandoned producer %d present: %v", len(rows), hungPID, sawHung)
	}
	st.done("describe-producers")

	// Tracked by its coordinator (which will write the markers when it ends or times out): by
	// Kafka's definition not hanging, on any broker.
	e2eClusterTxnNoHanging(t, c, "while the coordinator tracks the transaction")
	st.done("find-hanging (tracked)")

	hung.Close() // the producer is gone mid-transaction
	e2eClusterTxnForget(t, c, hungID)
	st.done("coordinator loses the id")
	for _, r := range e2eTxnTable(t, e2eTxnTool(t, c.bootstrap(), "list")) {
		if r["TransactionalId"] == hungID {
			t.Fatalf("list after the coordinator lost %s: %v", hungID, r)
		}
	}
	// Every broker is a replica of every partition (shared volume; Metadata lists all three), so
	// find-hanging finds the transaction from each broker id (asked through another broker's
	// seed each time; e2eClusterTxnNoHanging does the same).
	for i := range c.brokers {
		rows := e2eClusterTxnFindHanging(t, c.seeds()[(i+1)%len(c.brokers)], i+1)
		if len(rows) != 1 || rows[0]["Topic"] != topic || rows[0]["Partition"] != "0" ||
			rows[0]["ProducerId"] != strconv.FormatInt(hungPID, 10) || rows[0]["StartOffset"] != strconv.FormatInt(startOffset, 10) {
			t.Fatalf("find-hanging --broker-id %d: %v, want the transaction of producer %d at %s-0 offset %d", i+1, rows, hungPID, topic, startOffset)
		}
	}
	st.done("find-hanging (hanging)")

	// abort through a seed that leads nothing of it (the admin client finds the leader).
	other := c.seeds()[c.index(t, hungC)]
	e2eTxnTool(t, other, "abort", "--topic", topic, "--partition", "0", "--start-offset", strconv.FormatInt(startOffset, 10))
	st.done("abort")

	hwm := e2eTxnWaitStable(t, cl, topic, parts, 15*time.Second)
	if hwm[0] != hwm0+1 {
		t.Errorf("partition 0 HWM %d after abort, want %d (one abort marker)", hwm[0], hwm0+1)
	}
	var got []string
	for _, r := range e2eTxnReadAll(t, c.bootstrap(), topic, hwm, e2eTxnReadCommitted, 30*time.Second) {
		got = append(got, r.value)
	}
	if strings.Join(got, ",") != strings.Join(okVals, ",") {
		t.Errorf("read_committed after abort: %q, want %q", got, okVals)
	}
	if n := len(e2eTxnReadAll(t, c.bootstrap(), topic, hwm, e2eTxnReadUncommitted, 30*time.Second)); n != 8 {
		t.Errorf("read_uncommitted after abort: %d records, want 8", n)
	}
	e2eClusterTxnNoHanging(t, c, "after abort")
	for _, r := range e2eTxnTable(t, e2eTxnTool(t, c.bootstrap(), "describe-producers", "--topic", topic, "--partition", "0")) {
		if !e2eTxnNoOpenTxn(r["CurrentTransactionStartOffset"]) {
			t.Errorf("describe-producers after abort: %v still open", r)
		}
	}
	st.done("verify")
}
