package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/acl"
	"github.com/kaas-go/kaas/coord/credentials"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/coord/quota"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

// Broker is one kaas broker: every subsystem wired together, started in dependency order and
// closed in reverse. cmd/kaas, the integration tests and the benchmarks all start brokers through
// StartBroker, so there is exactly one wiring.
//
//	start: data dir lock → cluster id → PID allocator → partition store → committed-offset
//	       store → group coordinator → marker writer → transaction coordinator (it re-drives the
//	       prepared transactions a previous incarnation left: fence, markers, complete) → listener
//	close: listener → transaction coordinator → group coordinator → offset store → partitions
//	       → data dir lock
type Broker struct {
	Server  *Server
	Store   *storage.Store
	Offsets *storage.GroupStore
	Groups  *group.Coordinator
	Txn     *txn.Coordinator
	Markers *MarkerWriter
	Quotas  *quota.Manager

	remote *ClusterMarkerWriter // cluster mode: markers and group completions for other brokers
	peers  *InterBroker         // cluster mode: the inter-broker clients (remote's and Server's)

	log     *zap.Logger
	lock    *storage.DirLock // data.dir/.lock (cluster: data.dir/__cluster/brokers/b<id>/.lock)
	cluster *clusterNode     // nil on a single broker
}

// BrokerOptions are the seams a deployment (or a test) may replace.
type BrokerOptions struct {
	Authz Authorizer // nil allows everything
	// Topology answers who owns each partition, transaction slot and group shard; nil: this
	// broker alone, owning everything at epoch 0 (a topology.Table the listener publishes its
	// bound address to).
	Topology topology.Topology
	// Credentials is the SCRAM credential store; nil: in cluster mode the cluster's shared
	// store (etcd, credentials.SharedStore), else a credentials.FileStore in data.dir/__cluster.
	Credentials credentials.Store
	// PrincipalFor, for tests only: see Deps.PrincipalFor.
	PrincipalFor func(remoteAddr string) string
	// FailStop is called once, in cluster mode, when the liveness lease deadline passes or the
	// lease is gone: the broker must stop publishing. nil: log and os.Exit(3), so a supervisor
	// restarts the broker as a new incarnation. In-process tests pass a hook that crashes the
	// broker instead.
	FailStop func(reason string)
	// EndTxnMarkerWait is how long EndTxn waits for its markers before it answers the retriable
	// COORDINATOR_NOT_AVAILABLE while they are still being written (txn.Config.EndTxnMarkerWait;
	// 0: its default, 20 s). Apache has no such setting, so it is no broker config key; tests
	// shorten it.
	EndTxnMarkerWait time.Duration
}

// StartBroker opens the data directory and starts serving. Any subsystem that cannot open its
// state refuses to start the broker with an error naming what is wrong: guessing would reuse
// producer ids, lose committed offsets or forget prepared transactions.
func StartBroker(cfg configs.Config, log *zap.Logger, opts BrokerOptions) (b *Broker, err error) {
	b = &Broker{log: log}
	// Every error return below sets the named result b to nil, so the deferred cleanup closes
	// what was opened through its own reference, not through b.
	opened := b
	defer func() {
		if err != nil {
			opened.close()
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create data dir %s: %w", cfg.DataDir, err)
	}
	clusterDir := filepath.Join(cfg.DataDir, "__cluster")
	var clusterID string
	if cfg.ClusterMode() {
		// Cluster mode: every refusal (etcd unreachable, another cluster's volume, a volume
		// that fails its self-test, a broker.id held by a live incarnation) happens in
		// joinCluster, before this broker writes anything.
		failStop := opts.FailStop
		if failStop == nil {
			failStop = func(reason string) {
				log.Error("fail-stop: exiting so that nothing more is published", zap.String("reason", reason))
				_ = log.Sync()
				os.Exit(3)
			}
		}
		if b.cluster, err = joinCluster(&cfg, log, failStop); err != nil {
			return nil, err
		}
		// A second process with this broker id on this host (etcd refuses it across hosts).
		lockDir := filepath.Join(clusterDir, "brokers", fmt.Sprintf("b%d", cfg.BrokerID))
		if err := os.MkdirAll(lockDir, 0o755); err != nil {
			return nil, fmt.Errorf("cannot create %s: %w", lockDir, err)
		}
		if b.lock, err = storage.LockDir(lockDir); err != nil {
			return nil, err
		}
		if clusterID, err = readClusterID(clusterDir); err != nil {
			return nil, err
		}
	} else {
		// Before anything reads or writes the directory: a second broker on it would replay and
		// delete the live one's journal and WAL and reissue its producer ids.
		if b.lock, err = storage.LockDir(cfg.DataDir); err != nil {
			return nil, err
		}
		if clusterID, err = loadOrCreateClusterID(clusterDir); err != nil {
			return nil, err
		}
	}
	featuresEpoch, err := loadFinalizedFeatures(clusterDir, finalizedLevels(cfg.TransactionVersion))
	if err != nil {
		return nil, err
	}
	pids, err := storage.OpenPIDAllocator(clusterDir, cfg.BrokerID)
	if err != nil {
		// Never fall back to an in-memory counter: that would reissue producer ids.
		return nil, fmt.Errorf("cannot open producer id allocator (refusing to start): %w", err)
	}
	scfg := storage.Config{
		Dir:                    cfg.DataDir,
		Defaults:               TopicDefaults(cfg),
		RetentionCheckInterval: cfg.RetentionCheckInterval,
		Preallocate:            cfg.LogPreallocate,
		WAL:                    cfg.LogWALEnable,
		ProducerIDExpiration:   cfg.ProducerIDExpiration,
		Logger:                 log.Named("storage"),
		Cleaner: storage.CleanerConfig{
			Enable:              cfg.LogCleanerEnable,
			Threads:             cfg.LogCleanerThreads,
			IOMaxBytesPerSecond: cfg.LogCleanerIOMaxBytes,
			DedupeBufferSize:    cfg.LogCleanerDedupeBytes,
			Backoff:             cfg.LogCleanerBackoff,
		},
	}
	if cn := b.cluster; cn != nil {
		// Partitions open only when the controller gives them to this broker (TakeOver); the WAL
		// lives on the volume, one directory per incarnation, so a successor can salvage it.
		scfg.Lazy = true
		scfg.BrokerID = cfg.BrokerID
		scfg.Incarnation = cn.incarnation()
		scfg.WALDir = walDir(cfg.DataDir, cfg.BrokerID, cn.incarnation())
		scfg.Publish = cn.member.Publishable
	}
	if b.Store, err = storage.Open(scfg); err != nil {
		return nil, fmt.Errorf("cannot open storage: %w", err)
	}
	// A corrupt offsets log (not just a torn tail) refuses to start.
	if b.cluster != nil {
		b.Offsets, err = storage.OpenGroupStoreCluster(cfg.DataDir, cfg.BrokerID, b.cluster.incarnation(), log.Named("storage"))
	} else {
		b.Offsets, err = storage.OpenGroupStore(cfg.DataDir, log.Named("storage"))
	}
	if err != nil {
		return nil, fmt.Errorf("cannot open committed offsets (refusing to start): %w", err)
	}
	gcfg := GroupConfig(cfg)
	gcfg.Topics = consumerTopics(b.Store)
	if b.cluster != nil {
		// Shards load when the controller assigns them (LoadShard at the assignment's epoch);
		// the offsets log acknowledges only while the lease deadline holds (Rule P).
		gcfg.ShardsUnowned = true
		b.Offsets.SetPublish(b.cluster.member.Publishable)
	}
	b.Groups = group.New(gcfg, b.Offsets, log.Named("group"))
	if err := b.Groups.Start(); err != nil {
		return nil, err
	}
	topo := opts.Topology
	if topo == nil && b.cluster != nil {
		topo = b.cluster.table
	}
	if topo == nil {
		topo = topology.NewTable(topology.Broker{ID: cfg.BrokerID})
	}
	// The coordinator reaches partitions through the local marker writer and groups through the
	// group coordinator; it calls neither back into server. Start re-drives every transaction a
	// previous incarnation left prepared in the background (their ids answer
	// CONCURRENT_TRANSACTIONS meanwhile).
	b.Markers = NewMarkerWriter(b.Store, topo, log.Named("txn"))
	b.Markers.groups, b.Markers.offsets = b.Groups, b.Offsets
	var partitions txn.PartitionWriter = b.Markers
	var groups txn.GroupCompleter = groupCompleter{b.Groups}
	if cn := b.cluster; cn != nil {
		// Partitions led, and group shards owned, by other brokers are reached with
		// WriteTxnMarkers on the inter-broker listener (markers_remote.go).
		b.Markers.publish = cn.member.Publishable
		// One pool of inter-broker clients serves markers, KIP-890 verification and the
		// TxnOffsetCommit check; a secured inter-broker listener without this broker's login
		// refuses the start here (peer_clients.go).
		if b.peers, err = NewInterBroker(cfg, topo, log.Named("interbroker")); err != nil {
			return nil, fmt.Errorf("cannot build the inter-broker clients (refusing to start): %w", err)
		}
		b.remote = NewClusterMarkerWriter(b.Markers, groups, topo, b.peers, log.Named("txn"))
		partitions, groups = b.remote, b.remote.Groups()
	}
	var txnInc string
	var txnPublish func() bool
	if b.cluster != nil {
		// Journals per incarnation, epoch-named slot checkpoints, slots only through the agent's
		// LoadSlot, and Rule P on every answer and marker dispatch (coord/txn README, "Cluster mode").
		txnInc, txnPublish = b.cluster.incarnation(), b.cluster.member.Publishable
	}
	if b.Txn, err = txn.New(txn.Config{
		Incarnation:    txnInc,
		Publish:        txnPublish,
		ClusterDir:     clusterDir,
		BrokerID:       cfg.BrokerID,
		Workers:        cfg.TransactionWorkers,
		MaxTimeoutMs:   int32(cfg.TransactionMaxTimeout.Milliseconds()),
		ReaperInterval: cfg.TransactionReapInterval,
		AllocPID:       pids.Next,
		OwnsSlot:       func(slot int) bool { return topo.TxnSlot(slot).Local },
		Partitions:     partitions,
		Groups:         groups,
		IDExpiration:   cfg.TransactionalIDExpiration,
		Logger:         log.Named("txn"),

		EndTxnMarkerWait: opts.EndTxnMarkerWait,
	}); err != nil {
		return nil, fmt.Errorf("cannot start transaction coordinator (refusing to start): %w", err)
	}
	if err := b.Txn.Start(); err != nil {
		return nil, fmt.Errorf("cannot start transaction coordinator (refusing to start): %w", err)
	}
	b.Markers.WatchHanging(cfg.TransactionReapInterval, cfg.TransactionMaxTimeout)

	// Cluster mode keeps ACLs, SCRAM credentials and quotas in etcd, shared by every broker;
	// a single broker keeps them in files in data.dir/__cluster.
	var sec *clusterSecurity
	var aclStore acl.Store = acl.NewFileStore(clusterDir)
	var quotaStore quota.Store = quota.NewFileStore(clusterDir)
	if b.cluster != nil {
		if sec, err = b.cluster.openSecurity(clusterDir); err != nil {
			return nil, fmt.Errorf("cannot open the cluster's security state (refusing to start): %w", err)
		}
		aclStore, quotaStore = sec.acls, sec.quotas
	}
	creds := opts.Credentials
	if creds == nil && sec != nil {
		creds = sec.creds
	}
	if creds == nil {
		fs, err := credentials.OpenFileStore(clusterDir)
		if err != nil {
			return nil, fmt.Errorf("cannot open SCRAM credentials (refusing to start): %w", err)
		}
		creds = fs
	}
	deps := Deps{Store: b.Store, PIDs: pids, Topology: topo, Authz: opts.Authz, Groups: b.Groups, Txn: b.Txn,
		Markers: b.Markers, FeaturesEpoch: featuresEpoch, Credentials: creds, PrincipalFor: opts.PrincipalFor, Peers: b.peers}
	if b.cluster != nil {
		deps.Topics = clusterTopics{cn: b.cluster, store: b.Store}
	}
	if b.Quotas, err = quota.New(quota.Config{}, quotaStore); err != nil {
		return nil, fmt.Errorf("cannot open client quotas (refusing to start): %w", err)
	}
	b.Quotas.ExportMetrics()
	deps.Quotas = b.Quotas
	var authz *acl.Authorizer
	if cfg.AuthorizerClassName != "" {
		a, err := acl.New(acl.Config{SuperUsers: acl.ParseSuperUsers(cfg.SuperUsers), AllowIfNoACL: cfg.AllowEveryoneIfNoACL}, aclStore)
		if err != nil {
			return nil, fmt.Errorf("cannot start authorizer (refusing to start): %w", err)
		}
		authz, deps.ACL = a, a
		if deps.Authz == nil {
			deps.Authz = a
		}
	}
	if sec != nil {
		b.cluster.followSecurity(sec, authz, b.Quotas)
	}
	b.Server = New(cfg, log.Named("server"), deps, clusterID)
	if err := b.Server.Start(); err != nil {
		b.Server = nil
		return nil, err
	}
	if b.cluster != nil {
		if err := b.cluster.start(b); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// Drain hands this broker's partitions, transaction slots and group shards to the other brokers
// of its cluster (SIGTERM; a rolling restart), waiting at most cluster.drain.timeout.ms. A single
// broker has nothing to hand over.
func (b *Broker) Drain() error {
	if b.cluster == nil {
		return nil
	}
	return b.cluster.drain(b.cluster.cfg.Cluster.DrainTimeout)
}

// Addr is the bound Kafka listener address.
func (b *Broker) Addr() *net.TCPAddr { return b.Server.Addr() }

// Close shuts the broker down in reverse start order. In-flight marker dispatches that finish
// after the transaction coordinator closed leave their transactions prepared; the next start
// completes them.
func (b *Broker) Close() error {
	return b.close()
}

func (b *Broker) close() error {
	var errs []error
	if b.cluster != nil {
		b.cluster.stop() // no more loads or releases, no controller
	}
	if b.Server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := b.Server.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("server: %w", err))
		}
		cancel()
	}
	if b.Quotas != nil {
		b.Quotas.Unexport()
	}
	if b.Txn != nil {
		b.Txn.Close()
	}
	if b.remote != nil {
		b.remote.Close() // fails what is still in flight: those transactions stay prepared
	}
	if b.peers != nil {
		b.peers.Close() // after the server and the marker writer, its two users
	}
	if b.Markers != nil {
		b.Markers.Close()
	}
	if b.Groups != nil {
		b.Groups.Close() // answers what is parked, waits for in-flight commits
	}
	if b.Offsets != nil {
		if err := b.Offsets.Close(); err != nil {
			errs = append(errs, fmt.Errorf("offset store: %w", err))
		}
	}
	if b.Store != nil {
		if err := b.Store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("storage: %w", err))
		}
	}
	if b.lock != nil {
		if err := b.lock.Close(); err != nil { // nothing writes the directory any more
			errs = append(errs, fmt.Errorf("data dir lock: %w", err))
		}
	}
	if b.cluster != nil {
		b.cluster.leave() // last: successors may take over the moment the lease is gone
	}
	return errors.Join(errs...)
}

// encodeClusterID renders a cluster id as Kafka prints them (base64url, no padding).
func encodeClusterID(id [16]byte) string { return base64.RawURLEncoding.EncodeToString(id[:]) }

// loadOrCreateClusterID keeps the cluster id (a base64url UUID, as Kafka prints them) stable
// across restarts; it is written tmp + fsync + rename before first use.
func loadOrCreateClusterID(dir string) (string, error) {
	path := filepath.Join(dir, "cluster.json")
	var meta struct {
		ClusterID string `json:"clusterId"`
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &meta); err != nil || meta.ClusterID == "" {
			return "", fmt.Errorf("cannot parse %s (fix or remove it): %v", path, err)
		}
		return meta.ClusterID, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("cannot read %s: %w", path, err)
	}
	meta.ClusterID = newClusterID()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("cannot create %s: %w", dir, err)
	}
	data, _ = json.Marshal(meta)
	if err := storage.WriteFileAtomic(dir, "cluster.json", data); err != nil {
		return "", fmt.Errorf("cannot persist cluster id to %s: %w", path, err)
	}
	return meta.ClusterID, nil
}
