package server

// Cluster mode (issue 9, design/cluster.md): N brokers share one data.dir on an RWX volume and
// keep membership, leases and epoch-stamped assignments in etcd (coord/cluster). This file is
// the broker's side of it: joining, the storage and coordinator settings that differ from a
// single broker, the Resources the assignment agent loads and releases, topic administration
// through the etcd registry, the SIGTERM drain and the fail-stop.
//
// Start (cluster branch of StartBroker), each step before anything later is written:
//
//	etcd reachable? ─no─► refuse (exit 1, nothing written)
//	  │ volume cluster id (read only) vs etcd cluster-id ─differ─► refuse
//	  │ volume self-test (write, sync, fresh open, read) ─fail─► refuse
//	  │ Join: brokers/<id> free (a dead predecessor's key expires within the TTL) ─held─► refuse
//	  ▼
//	data.dir/__cluster/brokers/b<id>/.lock → cluster.json (exclusive create) → PIDs → lazy store
//	(WAL in __cluster/wal/b<id>-i<inc>) → offsets (log per incarnation) → coordinators
//	→ security documents (etcd security/*, seeded once from the volume's files; watched) → listener
//	→ assignment agent (loads what the controller gives this broker) → controller candidacy
//
// Rule P: the store, the offsets log and the answers publish only while Member.Publishable
// (the lease deadline D has not passed, checked after each sync). When D passes the member
// calls failStop: the broker stops answering and the process exits with code 3; a supervisor
// restarts it as a new incarnation.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/acl"
	"github.com/kaas-go/kaas/coord/cluster"
	"github.com/kaas-go/kaas/coord/credentials"
	"github.com/kaas-go/kaas/coord/quota"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

// clusterNode is one broker's membership in a cluster.
type clusterNode struct {
	cfg    configs.Config
	log    *zap.Logger
	prefix string
	be     cluster.Backend
	member *cluster.Member
	table  *topology.Table
	agent  *cluster.Agent

	ctx      context.Context // ends at close: agent, controller
	cancel   context.CancelFunc
	ctrlDone chan struct{}

	rf sync.Map // topic name → int16 replication factor (from etcd topics/<name>)

	secCancel context.CancelFunc // ends the security document watches (followSecurity)
	secWG     sync.WaitGroup

	failed   atomic.Bool
	failStop func(reason string)
}

// deadIncarnationGCEvery is how often the controller looks for dead incarnations' WALs, offset
// logs and journals to delete (a variable for tests).
var deadIncarnationGCEvery = time.Minute

// joinTimeout bounds every etcd call made while starting.
const joinTimeout = 30 * time.Second

// joinCluster runs the refusals of the start sequence and registers this broker. Nothing is
// written to the volume before it returns without error, except the self-test's probe file,
// which the self-test removes.
func joinCluster(cfg *configs.Config, log *zap.Logger, failStop func(string)) (*clusterNode, error) {
	if err := resolveZeroPorts(cfg); err != nil {
		return nil, err
	}
	be, err := cluster.NewEtcd(cfg.EtcdEndpoints(), 5*time.Second, log.Named("etcd"))
	if err != nil {
		return nil, fmt.Errorf("cannot reach etcd at %s (refusing to start): %w", cfg.Cluster.EtcdEndpoints, err)
	}
	cn := &clusterNode{cfg: *cfg, log: log.Named("cluster"), prefix: cfg.ClusterPrefix(), be: be, ctrlDone: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			_ = be.Close()
		}
	}()
	clusterDir := filepath.Join(cfg.DataDir, "__cluster")
	volumeID, err := readClusterID(clusterDir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	clusterID := volumeID
	if clusterID == "" {
		// A fresh volume takes the cluster id etcd has. Brokers that start together on a fresh
		// cluster all propose one: the create-if-absent below lets exactly one proposal win and
		// every broker then reads the winner, so none of them is refused as "another cluster".
		key := cluster.ClusterIDKey(cn.prefix)
		if _, _, err := be.Txn(ctx, []cluster.Compare{{Key: key, Field: cluster.CreateRevision, Rev: 0}},
			[]cluster.Op{{Key: key, Value: []byte(newClusterID())}}); err != nil {
			return nil, fmt.Errorf("cannot propose a cluster id to etcd (refusing to start): %w", err)
		}
		kvs, _, err := be.Get(ctx, key, false)
		if err != nil || len(kvs) != 1 {
			return nil, fmt.Errorf("cannot read the cluster id from etcd (refusing to start): %v", err)
		}
		clusterID = string(kvs[0].Value)
	}
	if err := storage.SelfTestVolume(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("data.dir %s failed the shared-volume self-test (refusing to start; see deploy/VOLUME.md): %w", cfg.DataDir, err)
	}
	info, err := brokerInfo(cfg)
	if err != nil {
		return nil, err
	}
	cn.failStop = func(reason string) {
		if cn.failed.Swap(true) {
			return
		}
		mFailStops.Inc()
		failStop(reason)
	}
	cn.member, err = cluster.Join(ctx, be, cluster.MemberConfig{
		Prefix:         cn.prefix,
		BrokerID:       cfg.BrokerID,
		ClusterID:      clusterID,
		Info:           info,
		SessionTimeout: cfg.Cluster.SessionTimeout,
		Heartbeat:      cfg.Cluster.Heartbeat,
		FenceMargin:    cfg.Cluster.FenceMargin,
		Clock:          cluster.RealClock,
		Logger:         cn.log,
		FailStop:       cn.failStop,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot join cluster %q (refusing to start): %w", cfg.Cluster.Name, err)
	}
	if volumeID == "" {
		if err := createClusterID(clusterDir, clusterID); err != nil {
			_ = cn.member.Leave(context.Background())
			return nil, err
		}
	}
	if cfg.LogFlushIntervalMsgs > 1 {
		warnPageCacheAcks(cn.log, "broker default log.flush.interval.messages", strconv.FormatInt(cfg.LogFlushIntervalMsgs, 10))
	}
	cn.table = topology.NewTable(topology.Broker{ID: cfg.BrokerID, Rack: info.Rack, Endpoints: info.Endpoints})
	cn.table.RequireLoad() // nothing is local until the agent has loaded it
	ok = true
	return cn, nil
}

// warnPageCacheAcks says loudly what flush.messages > 1 means on a shared volume: those acks
// come from this host's page cache, and a successor on another host cannot see unsynced bytes,
// so a host loss takes them back (design risk 6; Apache's flush.messages has the same meaning,
// but Apache also has replicas).
func warnPageCacheAcks(log *zap.Logger, what, v string) {
	log.Warn("flush.messages > 1 in cluster mode: acknowledged records not yet fsync'd are lost if this broker's host fails; keep flush.messages=1 for acks=all durability",
		zap.String("where", what), zap.String("flush.messages", v))
}

// incarnation names this run of the broker in file names (WAL, journals, offsets log).
func (cn *clusterNode) incarnation() string { return cn.member.Incarnation() }

// walDir is broker id's WAL directory for incarnation inc on the shared volume: a successor
// salvages a crashed holder's acknowledged records from it (design §2.5).
func walDir(dataDir string, broker int32, inc string) string {
	return storage.ClusterWALDir(dataDir, broker, inc)
}

// start begins serving assignments: the agent loads what the controller gives this broker,
// and this broker stands for controller.
func (cn *clusterNode) start(b *Broker) error {
	cn.ctx, cn.cancel = context.WithCancel(context.Background())
	sctx, scancel := context.WithTimeout(cn.ctx, joinTimeout) // bounds the first listing only
	defer scancel()
	agent, err := cluster.StartAgent(sctx, cn.be, cluster.AgentConfig{
		Prefix:         cn.prefix,
		BrokerID:       cn.cfg.BrokerID,
		Member:         cn.member,
		Table:          cn.table,
		Res:            clusterResources{b: b, cn: cn},
		Logger:         cn.log.Named("agent"),
		SessionTimeout: cn.cfg.Cluster.SessionTimeout,
	})
	if err != nil {
		close(cn.ctrlDone) // no controller was started: stop must not wait for one
		return fmt.Errorf("cannot start the assignment agent: %w", err)
	}
	cn.agent = agent
	go func() {
		defer close(cn.ctrlDone)
		cluster.RunController(cn.ctx, cn.be, cluster.ControllerConfig{
			Prefix:         cn.prefix,
			BrokerID:       cn.cfg.BrokerID,
			Member:         cn.member,
			MovesPerTick:   64,
			Tick:           time.Second,
			Logger:         cn.log.Named("controller"),
			SessionTimeout: cn.cfg.Cluster.SessionTimeout,
		})
	}()
	go cn.collectDeadWALs(b)
	return nil
}

// drain hands everything this broker holds to the others (SIGTERM, rolling restarts): the
// controller moves draining brokers' partitions, slots and shards away, each as a graceful
// handover (release record, no scan), and drain returns when none is left or after timeout.
func (cn *clusterNode) drain(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := cn.member.SetState(ctx, "draining"); err != nil {
		return fmt.Errorf("cannot mark broker %d draining: %w", cn.cfg.BrokerID, err)
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-cn.agent.Drained():
			return nil
		case <-ctx.Done():
			p, s, g := cn.agent.Held()
			return fmt.Errorf("drain timed out after %s with %d partitions, %d transaction slots and %d group shards still held; successors will wait for the lease to expire", timeout, p, s, g)
		case <-cn.member.Done():
			return errors.New("lease lost while draining")
		case <-tick.C:
			// When every broker stops at once (Ctrl-C on make run-cluster) nobody can take
			// anything over: stop waiting; the successors of the next start recover as after
			// a crash (scan and salvage), which loses nothing.
			if !cn.othersAlive(ctx) {
				return errors.New("no other live broker to hand over to")
			}
		}
	}
}

// othersAlive reports whether another registered broker is alive and not draining.
func (cn *clusterNode) othersAlive(ctx context.Context) bool {
	recs, _, err := cluster.ListBrokers(ctx, cn.be, cn.prefix)
	if err != nil {
		return true // unknown: keep waiting for the drain or its timeout
	}
	for _, r := range recs {
		if r.ID != cn.cfg.BrokerID && r.State != "draining" {
			return true
		}
	}
	return false
}

// stop ends the agent, the controller candidacy and the security watches (the first half of
// close).
func (cn *clusterNode) stop() {
	if cn.secCancel != nil {
		cn.secCancel()
		cn.secWG.Wait()
	}
	if cn.cancel != nil {
		cn.cancel()
		if cn.agent != nil {
			cn.agent.Close()
		}
		<-cn.ctrlDone
	}
}

// leave revokes this incarnation's lease once nothing writes any more (the second half of
// close): successors of whatever was not released may then start at once.
func (cn *clusterNode) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !cn.failed.Load() {
		if err := cn.member.Leave(ctx); err != nil {
			cn.log.Warn("cannot revoke the liveness lease; successors wait for it to expire", zap.Error(err))
		}
	}
	_ = cn.be.Close()
}

var mSecurityApplyErrors = metrics.NewCounter(`kaas_cluster_security_apply_errors_total`) // versions refused by Replace

// clusterSecurity is the cluster-wide security state: ACL bindings, SCRAM credentials and
// client quotas, each one etcd document (cluster.Doc) that any broker changes with a CAS and
// every broker follows with a watch. A single broker keeps them in files in data.dir/__cluster;
// in cluster mode those files are read once, to seed etcd, and never written.
type clusterSecurity struct {
	acls   *cluster.Doc[acl.Binding]
	quotas *cluster.Doc[quota.Entry]
	scram  *cluster.Doc[credentials.Record]
	creds  *credentials.SharedStore
}

// openSecurity opens the security documents. A document etcd does not have yet is seeded from
// the volume's file, if there is one (a single broker's data dir becoming a cluster's, or the
// first user added with `kaas credentials add` before the first start): a CAS create, so of
// several brokers starting at once one seeds and the rest read what it wrote.
func (cn *clusterNode) openSecurity(clusterDir string) (*clusterSecurity, error) {
	sec := &clusterSecurity{
		acls:   cluster.NewDoc[acl.Binding](cn.be, cluster.SecurityKey(cn.prefix, "acls"), "ACL"),
		quotas: cluster.NewDoc[quota.Entry](cn.be, cluster.SecurityKey(cn.prefix, "quotas"), "client quota"),
		scram:  cluster.NewDoc[credentials.Record](cn.be, cluster.SecurityKey(cn.prefix, "scram"), "SCRAM credential"),
	}
	bindings, err := acl.NewFileStore(clusterDir).Load()
	if err != nil {
		return nil, err
	}
	entries, err := quota.NewFileStore(clusterDir).Load()
	if err != nil {
		return nil, err
	}
	fs, err := credentials.OpenFileStore(clusterDir)
	if err != nil {
		return nil, err
	}
	users, err := fs.Users()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	for _, seed := range []struct {
		what string
		n    int
		do   func() (bool, error)
	}{
		{"ACL bindings", len(bindings), func() (bool, error) { return sec.acls.Seed(ctx, bindings) }},
		{"client quotas", len(entries), func() (bool, error) { return sec.quotas.Seed(ctx, entries) }},
		{"SCRAM credentials", len(users), func() (bool, error) { return sec.scram.Seed(ctx, credentials.RecordsOf(users)) }},
	} {
		seeded, err := seed.do()
		if err != nil {
			return nil, err
		}
		if seeded {
			cn.log.Info("seeded the cluster's "+seed.what+" from the volume's file", zap.Int("items", seed.n))
		}
	}
	if sec.creds, err = credentials.OpenSharedStore(sec.scram); err != nil {
		return nil, err
	}
	return sec, nil
}

// followSecurity applies every version of the security documents to this broker's authorizer
// (nil: authorization is off), quota manager and credential store, each by an atomic snapshot
// swap on a goroutine of its own: request handling never waits for etcd.
func (cn *clusterNode) followSecurity(sec *clusterSecurity, a *acl.Authorizer, q *quota.Manager) {
	ctx, cancel := context.WithCancel(context.Background())
	cn.secCancel = cancel
	applied := func(key string, err error) {
		if err != nil {
			mSecurityApplyErrors.Inc()
			cn.log.Error("cannot apply a cluster security document; keeping the previous version", zap.String("key", key), zap.Error(err))
		}
	}
	follow := func(run func()) {
		cn.secWG.Add(1)
		go func() {
			defer cn.secWG.Done()
			run()
		}()
	}
	log := cn.log.Named("security")
	if a != nil {
		follow(func() {
			sec.acls.Follow(ctx, log, func(bs []acl.Binding, rev int64) { applied(sec.acls.Key(), a.Replace(bs, rev)) })
		})
	}
	follow(func() {
		sec.quotas.Follow(ctx, log, func(es []quota.Entry, rev int64) { applied(sec.quotas.Key(), q.Replace(es, rev)) })
	})
	follow(func() {
		sec.scram.Follow(ctx, log, func(rs []credentials.Record, rev int64) { applied(sec.scram.Key(), sec.creds.Replace(rs, rev)) })
	})
}

// collectDeadWALs deletes a dead incarnation's WAL once every partition it covers has a newer
// epoch (storage.RemoveDeadWAL decides from the epoch files). Only the controller does it, once
// a minute; a live incarnation's WAL is never touched.
func (cn *clusterNode) collectDeadWALs(b *Broker) {
	t := time.NewTicker(deadIncarnationGCEvery)
	defer t.Stop()
	for {
		select {
		case <-cn.ctx.Done():
			return
		case <-t.C:
		}
		if cn.table.Controller() != cn.cfg.BrokerID {
			continue
		}
		// The directories are listed BEFORE the live brokers: an incarnation registers before
		// it creates its WAL, so a directory that exists and is alive is in the broker listing
		// too (the other order could take a just-started broker's empty WAL for a dead one's).
		dir := filepath.Join(cn.cfg.DataDir, "__cluster", "wal")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		live := cn.liveSet()
		if live == nil {
			continue // unknown who is alive: collect nothing (an empty list would make everyone "dead")
		}
		for _, e := range ents {
			name := e.Name()
			if !e.IsDir() || live[name] {
				continue
			}
			// The dead incarnation's committed-offset logs go once every op in them is covered
			// by a newer shard checkpoint; its WAL once every partition in it has a newer epoch.
			if id, inc, ok := parseIncarnationDir(name); ok {
				if n, err := storage.RemoveDeadGroupLogs(cn.cfg.DataDir, id, inc); err != nil {
					cn.log.Warn("cannot collect a dead incarnation's offset logs", zap.String("incarnation", name), zap.Error(err))
				} else if n > 0 {
					cn.log.Info("removed a dead incarnation's offset logs", zap.String("incarnation", name), zap.Int("logs", n))
				}

			}
			removed, err := b.Store.RemoveDeadWAL(filepath.Join(dir, name))
			switch {
			case err != nil:
				cn.log.Warn("cannot collect a dead incarnation's WAL", zap.String("dir", name), zap.Error(err))
			case removed:
				cn.log.Info("removed a dead incarnation's WAL", zap.String("dir", name))
			}
		}
		cn.collectDeadJournals()
	}
}

// collectDeadJournals deletes the transaction journal generations of dead incarnations whose
// every record a newer slot checkpoint covers (txn.RemoveDeadJournals). It lists the journals
// themselves, not the WAL directories, so a journal outlives its incarnation's WAL if it must.
//
// The journals are listed BEFORE the live brokers: an incarnation registers before it creates
// its first journal, so one that shows up in the file listing and is alive is in the broker
// listing too (the other order could take a just-started broker's empty first generation for a
// dead one's). An empty broker listing (etcd unreachable) collects nothing.
func (cn *clusterNode) collectDeadJournals() {
	clusterDir := filepath.Join(cn.cfg.DataDir, "__cluster")
	writers, err := txn.JournalWriters(clusterDir)
	if err != nil {
		cn.log.Warn("cannot list transaction journals", zap.Error(err))
		return
	}
	live := cn.liveSet()
	if live == nil {
		return
	}
	for _, w := range writers {
		name := filepath.Base(walDir("", w.Broker, w.Incarnation))
		if live[name] {
			continue
		}
		if n, err := txn.RemoveDeadJournals(clusterDir, w.Broker, w.Incarnation); err != nil {
			cn.log.Warn("cannot collect a dead incarnation's transaction journals", zap.String("incarnation", name), zap.Error(err))
		} else if n > 0 {
			cn.log.Info("removed a dead incarnation's transaction journals", zap.String("incarnation", name), zap.Int("journals", n))
		}
	}
}

// parseIncarnationDir splits a WAL directory name b<id>-i<inc>.
func parseIncarnationDir(name string) (int32, string, bool) {
	rest, ok := strings.CutPrefix(name, "b")
	if !ok {
		return 0, "", false
	}
	idStr, inc, ok := strings.Cut(rest, "-i")
	if !ok || inc == "" {
		return 0, "", false
	}
	id, err := strconv.ParseInt(idStr, 10, 32)
	if err != nil {
		return 0, "", false
	}
	return int32(id), inc, true
}

// liveSet is the set of live incarnations' directory names, this one always included; nil when
// the broker list cannot be read or is empty.
func (cn *clusterNode) liveSet() map[string]bool {
	incs, err := cn.liveIncarnations()
	if err != nil || len(incs) == 0 {
		return nil
	}
	live := map[string]bool{filepath.Base(walDir("", cn.cfg.BrokerID, cn.incarnation())): true}
	for _, br := range incs {
		live[br] = true
	}
	return live
}

// liveIncarnations are the WAL directory names (b<id>-i<inc>) of the registered brokers.
func (cn *clusterNode) liveIncarnations() ([]string, error) {
	ctx, cancel := context.WithTimeout(cn.ctx, 5*time.Second)
	defer cancel()
	recs, _, err := cluster.ListBrokers(ctx, cn.be, cn.prefix)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, filepath.Base(walDir("", r.ID, r.Inc)))
	}
	return out, nil
}

// clusterResources is what the agent loads and releases on this broker.
type clusterResources struct {
	b  *Broker
	cn *clusterNode
}

func (r clusterResources) Acquire(ctx context.Context, res cluster.Resource, epoch int32, h cluster.Handover) error {
	switch res.Kind {
	case cluster.KindPartition:
		sh := storage.Handover{PrevInc: h.PrevInc, PrevEpoch: h.PrevEpoch}
		if h.Release != nil {
			var rec storage.ReleaseRecord
			if err := json.Unmarshal(h.Release, &rec); err != nil {
				return fmt.Errorf("cannot parse release record of %s-%d epoch %d: %w", res.Topic, res.Partition, h.PrevEpoch, err)
			}
			sh.Release = &rec
		}
		if h.PrevInc != "" {
			sh.PrevWALDir = walDir(r.cn.cfg.DataDir, h.PrevBroker, h.PrevInc)
		}
		st, err := r.b.Store.TakeOver(res.Topic, res.Partition, epoch, sh)
		if err != nil {
			if errors.Is(err, storage.ErrSalvageGap) {
				r.cn.log.Error("refusing to lead a partition: its previous leader acknowledged records that are missing from the log and from its WAL",
					zap.String("topic", res.Topic), zap.Int32("partition", res.Partition), zap.Int32("epoch", epoch), zap.Error(err))
			}
			return err
		}
		r.cn.log.Info("leading partition", zap.String("topic", res.Topic), zap.Int32("partition", res.Partition),
			zap.Int32("epoch", epoch), zap.Bool("graceful", h.Release != nil), zap.Int64("scanned_bytes", st.Scanned),
			zap.Int("salvaged", st.Salvaged), zap.Duration("took", st.Duration))
		return nil
	case cluster.KindGroupShard:
		return wait(ctx, func(done func(error)) { r.b.Groups.LoadShard(int(res.Partition), epoch, done) })
	case cluster.KindTxnSlot:
		return wait(ctx, func(done func(error)) { r.b.Txn.LoadSlot(int(res.Partition), epoch, done) })
	}
	return fmt.Errorf("unknown resource kind %d", res.Kind)
}

func (r clusterResources) Release(ctx context.Context, res cluster.Resource) ([]byte, error) {
	switch res.Kind {
	case cluster.KindPartition:
		rec, err := r.b.Store.Release(res.Topic, res.Partition)
		if err != nil {
			return nil, err
		}
		return json.Marshal(rec)
	case cluster.KindGroupShard:
		return nil, wait(ctx, func(done func(error)) { r.b.Groups.ReleaseShard(int(res.Partition), done) })
	case cluster.KindTxnSlot:
		return nil, wait(ctx, func(done func(error)) { r.b.Txn.ReleaseSlot(int(res.Partition), done) })
	}
	return nil, fmt.Errorf("unknown resource kind %d", res.Kind)
}

func (r clusterResources) TopicChanged(t cluster.TopicMeta) {
	r.cn.rf.Store(t.Name, t.RF)
	if v, ok := t.Configs["flush.messages"]; ok && v != "1" {
		warnPageCacheAcks(r.cn.log, "topic "+t.Name, v)
	}
	if _, err := r.b.Store.EnsureTopic(t.Name, t.ID, t.Partitions, t.Configs); err != nil {
		r.cn.log.Error("cannot open topic from the registry", zap.String("topic", t.Name), zap.Error(err))
		return
	}
	// A config change made through any broker (SetTopicConfigs) reaches this one here; the
	// registry's overrides also replace what the volume's topic.json said at start.
	if err := r.b.Store.ApplyTopicConfigsAt(t.Name, t.Configs, t.Rev); err != nil {
		r.cn.log.Error("cannot apply topic configs from the registry", zap.String("topic", t.Name), zap.Error(err))
	}
}

func (r clusterResources) TopicDeleted(name string) {
	r.cn.rf.Delete(name)
	r.cn.table.ForgetTopic(name)
	// The broker that served DeleteTopics parks the files; the others only let go of them.
	if err := r.b.Store.ForgetTopic(name); err != nil && !errors.Is(err, storage.ErrUnknownTopic) {
		r.cn.log.Warn("cannot close deleted topic", zap.String("topic", name), zap.Error(err))
	}
}

// wait runs an asynchronous load or release and waits for it, or for ctx.
func wait(ctx context.Context, start func(done func(error))) error {
	ch := make(chan error, 1)
	start(func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// clusterTopics is the TopicAdmin of cluster mode: etcd's topics/<name> is the truth (a CAS
// any broker may win), the files on the volume follow.
type clusterTopics struct {
	cn    *clusterNode
	store *storage.Store
}

// assignWait bounds how long CreateTopics waits for the controller to place the new
// partitions, so that a produce right after the answer finds leaders (Apache's CreateTopics
// also answers once the controller has the topic; clients retry LEADER_NOT_AVAILABLE anyway).
const assignWait = 5 * time.Second

func (c clusterTopics) CreateTopic(name string, partitions int32, rf int16, kv map[string]string) (*storage.Topic, error) {
	if rf <= 0 {
		rf = 1
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	meta := cluster.TopicMeta{Name: name, ID: id, Partitions: partitions, RF: rf, Configs: kv}
	if err := cluster.CreateTopic(ctx, c.cn.be, c.cn.prefix, meta); err != nil {
		if errors.Is(err, cluster.ErrTopicExists) {
			return nil, fmt.Errorf("%w: %s", storage.ErrTopicExists, name)
		}
		return nil, fmt.Errorf("cannot register topic %s in etcd: %w", name, err)
	}
	c.cn.rf.Store(name, rf)
	t, err := c.store.EnsureNewTopic(name, id, partitions, kv)
	if err != nil {
		return nil, err
	}
	c.waitPlaced(name, partitions)
	return t, nil
}

// waitPlaced polls the topology until every partition of name has a known leader.
func (c clusterTopics) waitPlaced(name string, partitions int32) {
	deadline := time.Now().Add(assignWait)
	for time.Now().Before(deadline) {
		all := true
		for p := int32(0); p < partitions && all; p++ {
			all = c.cn.table.Partition(name, p).Known
		}
		if all {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c clusterTopics) DeleteTopic(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	gone, err := cluster.DeleteTopic(ctx, c.cn.be, c.cn.prefix, name)
	if err != nil {
		if errors.Is(err, cluster.ErrUnknownTopic) {
			return fmt.Errorf("%w: %s", storage.ErrUnknownTopic, name)
		}
		return fmt.Errorf("cannot delete topic %s in etcd: %w", name, err)
	}
	c.cn.rf.Delete(name)
	c.cn.table.ForgetTopic(name)
	// Parked by id whether or not this broker opened the topic, and whether or not this broker's
	// own agent has already let go of it (the watch may beat this call): the directory must be
	// gone before the answer, or a re-create right after it would find the old files.
	return c.store.ParkTopic(name, gone.ID)
}

func (c clusterTopics) CreatePartitions(name string, total int32) error {
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	if err := cluster.SetPartitions(ctx, c.cn.be, c.cn.prefix, name, total); err != nil {
		switch {
		case errors.Is(err, cluster.ErrUnknownTopic):
			return fmt.Errorf("%w: %s", storage.ErrUnknownTopic, name)
		case errors.Is(err, cluster.ErrInvalidPartitions):
			return fmt.Errorf("%w: %v", storage.ErrInvalidPartitions, err)
		}
		return fmt.Errorf("cannot grow topic %s in etcd: %w", name, err)
	}
	if err := c.store.EnsurePartitions(name, total); err != nil {
		return err
	}
	c.waitPlaced(name, total)
	return nil
}

func (c clusterTopics) SetTopicConfigs(name string, edit func(map[string]string) (map[string]string, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	next, rev, err := cluster.SetTopicConfigs(ctx, c.cn.be, c.cn.prefix, name, edit)
	if err != nil {
		if errors.Is(err, cluster.ErrUnknownTopic) {
			return fmt.Errorf("%w: %s", storage.ErrUnknownTopic, name)
		}
		return err
	}
	// Applied here at once, so a DescribeConfigs through this broker right after the answer
	// shows it; the other brokers apply it from their watch (TopicChanged).
	return c.store.ApplyTopicConfigsAt(name, next, rev)
}

func (c clusterTopics) ReplicationFactor(name string) int16 {
	if v, ok := c.cn.rf.Load(name); ok {
		return v.(int16)
	}
	return 1
}

func (c clusterTopics) Registered() []int32 {
	bs := c.cn.table.Brokers()
	out := make([]int32, 0, len(bs))
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return out
}

// brokerInfo is what brokers/<id> advertises: every listener's advertised endpoint (or its
// bound address), so Metadata on any broker lists every broker on the listener it is asked on.
func brokerInfo(cfg *configs.Config) (cluster.BrokerInfo, error) {
	ls, err := cfg.ParseListeners()
	if err != nil {
		return cluster.BrokerInfo{}, err
	}
	var info cluster.BrokerInfo
	for _, l := range ls {
		host, port := l.Host, l.Port
		if h, p, ok := cfg.AdvertisedEndpoint(l.Name); ok {
			host, port = h, p
		}
		if host == "" || host == "0.0.0.0" || host == "::" {
			return info, fmt.Errorf("listener %s binds every address; cluster mode needs advertised.listeners naming this broker's reachable host", l.Name)
		}
		info.Endpoints = append(info.Endpoints, topology.Endpoint{Listener: l.Name, Host: host, Port: int32(port)})
	}
	return info, nil
}

// resolveZeroPorts replaces a listener port 0 (tests) by a free port picked now: brokers/<id>
// must carry the real address before the listener binds, because the incarnation (and with it
// every file name) comes from the lease that registration creates.
func resolveZeroPorts(cfg *configs.Config) error {
	ls, err := cfg.ParseListeners()
	if err != nil {
		return err
	}
	changed := false
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		if l.Port == 0 {
			ln, err := net.Listen("tcp", net.JoinHostPort(l.Host, "0"))
			if err != nil {
				return fmt.Errorf("cannot pick a port for listener %s: %w", l.Name, err)
			}
			l.Port = ln.Addr().(*net.TCPAddr).Port
			_ = ln.Close()
			changed = true
		}
		parts = append(parts, l.Name+"://"+net.JoinHostPort(l.Host, strconv.Itoa(l.Port)))
	}
	if changed {
		cfg.Listeners = strings.Join(parts, ",")
	}
	return nil
}

// readClusterID reads the volume's cluster id without creating one ("" = none yet).
func readClusterID(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("cannot read %s: %w", filepath.Join(dir, "cluster.json"), err)
	}
	var meta struct {
		ClusterID string `json:"clusterId"`
	}
	if err := json.Unmarshal(data, &meta); err != nil || meta.ClusterID == "" {
		return "", fmt.Errorf("cannot parse %s (fix or remove it): %v", filepath.Join(dir, "cluster.json"), err)
	}
	return meta.ClusterID, nil
}

// createClusterID writes the volume's cluster.json unless another broker just did; then the
// file must carry the same id (both took it from etcd).
func createClusterID(dir, id string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", dir, err)
	}
	data, _ := json.Marshal(struct {
		ClusterID string `json:"clusterId"`
	}{id})
	var r [8]byte
	_, _ = rand.Read(r[:])
	tmp := filepath.Join(dir, fmt.Sprintf(".cluster.json.%x.tmp", r)) // unique per writer, not per process
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("cannot write %s: %w", tmp, err)
	}
	defer os.Remove(tmp)
	if f, err := os.Open(tmp); err == nil {
		_ = storage.Fdatasync(f)
		f.Close()
	}
	// link fails if the name exists: the first broker's file wins and is never replaced.
	if err := os.Link(tmp, filepath.Join(dir, "cluster.json")); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("cannot create %s: %w", filepath.Join(dir, "cluster.json"), err)
	}
	got, err := readClusterID(dir)
	if err != nil {
		return err
	}
	if got != id {
		return fmt.Errorf("the volume's cluster id %s differs from etcd's %s (refusing to start)", got, id)
	}
	return storage.SyncDir(dir)
}

func newClusterID() string {
	// Same form as a single broker's id (loadOrCreateClusterID): a base64url UUIDv4.
	var id [16]byte
	_, _ = rand.Read(id[:])
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	return encodeClusterID(id)
}

// crash stops the broker the way kill -9 looks to the rest of the cluster: no drain, no release
// records, the lease is not revoked but left to expire (the member stops renewing it). The
// fail-stop hook of in-process tests and the tests' crash of a leader use it.
func (b *Broker) crash() {
	if cn := b.cluster; cn != nil {
		cn.failed.Store(true)
		cn.member.Abandon()
	}
	_ = b.close()
}
