package server

import (
	"context"
	"crypto/rand"
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

	log  *zap.Logger
	lock *storage.DirLock // data.dir/.lock, held from before the first read until close ends
}

// BrokerOptions are the seams a deployment (or a test) may replace.
type BrokerOptions struct {
	Authz Authorizer // nil allows everything
	// Topology answers who owns each partition, transaction slot and group shard; nil: this
	// broker alone, owning everything at epoch 0 (a topology.Table the listener publishes its
	// bound address to).
	Topology topology.Topology
	// Credentials is the SCRAM credential store; nil: a credentials.FileStore in
	// data.dir/__cluster (cluster mode passes its shared store).
	Credentials credentials.Store
	// PrincipalFor, for tests only: see Deps.PrincipalFor.
	PrincipalFor func(remoteAddr string) string
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
	// Before anything reads or writes the directory: a second broker on it would replay and
	// delete the live one's journal and WAL and reissue its producer ids.
	if b.lock, err = storage.LockDir(cfg.DataDir); err != nil {
		return nil, err
	}
	clusterDir := filepath.Join(cfg.DataDir, "__cluster")
	clusterID, err := loadOrCreateClusterID(clusterDir)
	if err != nil {
		return nil, err
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
	if b.Store, err = storage.Open(storage.Config{
		Dir:                    cfg.DataDir,
		Defaults:               TopicDefaults(cfg),
		RetentionCheckInterval: cfg.RetentionCheckInterval,
		Preallocate:            cfg.LogPreallocate,
		WAL:                    cfg.LogWALEnable,
		ProducerIDExpiration:   cfg.ProducerIDExpiration,
		Logger:                 log.Named("storage"),
	}); err != nil {
		return nil, fmt.Errorf("cannot open storage: %w", err)
	}
	// A corrupt offsets log (not just a torn tail) refuses to start.
	if b.Offsets, err = storage.OpenGroupStore(cfg.DataDir, log.Named("storage")); err != nil {
		return nil, fmt.Errorf("cannot open committed offsets (refusing to start): %w", err)
	}
	b.Groups = group.New(GroupConfig(cfg), b.Offsets, log.Named("group"))
	if err := b.Groups.Start(); err != nil {
		return nil, err
	}
	topo := opts.Topology
	if topo == nil {
		topo = topology.NewTable(topology.Broker{ID: cfg.BrokerID})
	}
	// The coordinator reaches partitions through the local marker writer and groups through the
	// group coordinator; it calls neither back into server. Start re-drives every transaction a
	// previous incarnation left prepared in the background (their ids answer
	// CONCURRENT_TRANSACTIONS meanwhile).
	b.Markers = NewMarkerWriter(b.Store, topo, log.Named("txn"))
	if b.Txn, err = txn.New(txn.Config{
		ClusterDir:     clusterDir,
		BrokerID:       cfg.BrokerID,
		Workers:        cfg.TransactionWorkers,
		MaxTimeoutMs:   int32(cfg.TransactionMaxTimeout.Milliseconds()),
		ReaperInterval: cfg.TransactionReapInterval,
		AllocPID:       pids.Next,
		OwnsSlot:       func(slot int) bool { return topo.TxnSlot(slot).Local },
		Partitions:     b.Markers,
		Groups:         groupCompleter{b.Groups},
		IDExpiration:   cfg.TransactionalIDExpiration,
		Logger:         log.Named("txn"),
	}); err != nil {
		return nil, fmt.Errorf("cannot start transaction coordinator (refusing to start): %w", err)
	}
	if err := b.Txn.Start(); err != nil {
		return nil, fmt.Errorf("cannot start transaction coordinator (refusing to start): %w", err)
	}
	b.Markers.WatchHanging(cfg.TransactionReapInterval, cfg.TransactionMaxTimeout)

	creds := opts.Credentials
	if creds == nil {
		fs, err := credentials.OpenFileStore(clusterDir)
		if err != nil {
			return nil, fmt.Errorf("cannot open SCRAM credentials (refusing to start): %w", err)
		}
		creds = fs
	}
	deps := Deps{Store: b.Store, PIDs: pids, Topology: topo, Authz: opts.Authz, Groups: b.Groups, Txn: b.Txn,
		Markers: b.Markers, FeaturesEpoch: featuresEpoch, Credentials: creds, PrincipalFor: opts.PrincipalFor}
	if b.Quotas, err = quota.New(quota.Config{}, quota.NewFileStore(clusterDir)); err != nil {
		return nil, fmt.Errorf("cannot open client quotas (refusing to start): %w", err)
	}
	b.Quotas.ExportMetrics()
	deps.Quotas = b.Quotas
	if cfg.AuthorizerClassName != "" {
		// The bindings live next to the cluster id; a cluster-wide acl.Store replaces the file.
		a, err := acl.New(acl.Config{SuperUsers: acl.ParseSuperUsers(cfg.SuperUsers), AllowIfNoACL: cfg.AllowEveryoneIfNoACL},
			acl.NewFileStore(clusterDir))
		if err != nil {
			return nil, fmt.Errorf("cannot start authorizer (refusing to start): %w", err)
		}
		deps.ACL = a
		if deps.Authz == nil {
			deps.Authz = a
		}
	}
	b.Server = New(cfg, log.Named("server"), deps, clusterID)
	if err := b.Server.Start(); err != nil {
		b.Server = nil
		return nil, err
	}
	return b, nil
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
	if err := b.lock.Close(); err != nil { // last: nothing writes the directory any more
		errs = append(errs, fmt.Errorf("data dir lock: %w", err))
	}
	return errors.Join(errs...)
}

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
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	meta.ClusterID = base64.RawURLEncoding.EncodeToString(id[:])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("cannot create %s: %w", dir, err)
	}
	data, _ = json.Marshal(meta)
	if err := storage.WriteFileAtomic(dir, "cluster.json", data); err != nil {
		return "", fmt.Errorf("cannot persist cluster id to %s: %w", path, err)
	}
	return meta.ClusterID, nil
}
