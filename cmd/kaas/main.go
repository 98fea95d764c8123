// Command kaas runs one Kafka-wire-compatible broker.
//
//	kaas [--config=server.properties] [--key=value ...]
//
// Every key of configs/kaas.properties can be given as a flag (--data.dir=./data) or as an
// environment variable (KAAS_DATA_DIR=./data); flags win over the environment, which wins over
// the file.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/server"
	"github.com/kaas-go/kaas/storage"
)

func main() {
	if err := run(os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kaas:", err)
		os.Exit(1)
	}
}

func run(args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := configs.Load(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.LogLevel)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck
	log.Info("starting kaas", zap.Strings("config", cfg.Keys()))

	b, err := startBroker(cfg, log)
	if err != nil {
		return err
	}
	if cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			b.close(log)
			return fmt.Errorf("cannot listen for metrics on %s: %w", cfg.MetricsAddr, err)
		}
		srv := &http.Server{Handler: httpMux(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info("metrics listening", zap.String("addr", ln.Addr().String()))
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	log.Info("shutting down", zap.String("signal", s.String()))
	b.close(log)
	return nil
}

// broker is everything one process runs, in start order.
type broker struct {
	store *storage.Store
	srv   *server.Server

	groups  *group.Coordinator  // issue 3
	offsets *storage.GroupStore // issue 3

	txn     *txn.Coordinator     // issue 4
	markers *server.MarkerWriter // issue 4
}

func startBroker(cfg configs.Config, log *zap.Logger) (*broker, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create data dir %s: %w", cfg.DataDir, err)
	}
	clusterDir := filepath.Join(cfg.DataDir, "__cluster")
	clusterID, err := loadOrCreateClusterID(clusterDir)
	if err != nil {
		return nil, err
	}
	pids, err := storage.OpenPIDAllocator(clusterDir, cfg.BrokerID)
	if err != nil {
		// Never fall back to an in-memory counter: that would reissue producer ids.
		return nil, fmt.Errorf("cannot open producer id allocator (refusing to start): %w", err)
	}
	store, err := storage.Open(storage.Config{
		Dir:                    cfg.DataDir,
		Defaults:               server.TopicDefaults(cfg),
		RetentionCheckInterval: cfg.RetentionCheckInterval,
		Logger:                 log.Named("storage"),
	})
	if err != nil {
		return nil, fmt.Errorf("cannot open storage: %w", err)
	}
	deps := server.Deps{Store: store, PIDs: pids}
	// --- group coordinator wiring (issue 3) ---
	// A corrupt offsets log (not just a torn tail) refuses to start: guessing would lose or
	// resurrect committed offsets.
	offsets, err := storage.OpenGroupStore(cfg.DataDir, log.Named("storage"))
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("cannot open committed offsets (refusing to start): %w", err)
	}
	groups := group.New(server.GroupConfig(cfg), offsets, log)
	if err := groups.Start(); err != nil {
		offsets.Close()
		store.Close()
		return nil, err
	}
	deps.Groups = groups
	// --- end group coordinator wiring ---
	// --- transaction coordinator wiring (issue 4) ---
	// The marker writer exists first: it is the coordinator's OnAction (reaper aborts, re-drives).
	// Start returns every transaction a previous incarnation left prepared; the reconcile pass
	// fences and writes their markers right away, before the listener accepts clients, and
	// completes them in the background (their ids answer CONCURRENT_TRANSACTIONS meanwhile).
	markers := server.NewMarkerWriter(server.MarkerWriterConfig{Store: store, Groups: groups, Logger: log.Named("txn")})
	tc, err := txn.New(txn.Config{
		ClusterDir:     clusterDir,
		MaxTimeoutMs:   int32(cfg.TransactionMaxTimeout.Milliseconds()),
		ReaperInterval: cfg.TransactionReapInterval,
		AllocPID:       pids.Next,
		OwnsSlot:       func(int) bool { return true }, // single broker: every slot
		OnAction:       markers.OnAction,
		Logger:         log.Named("txn"),
	})
	if err == nil {
		markers.Attach(tc)
		var prepared []txn.Action
		if prepared, err = tc.Start(); err == nil {
			markers.Reconcile(prepared, func(failed int) {
				if failed > 0 {
					log.Warn("prepared transactions not completed at start; the reaper retries them", zap.Int("failed", failed))
				}
			})
		}
	}
	if err != nil {
		if tc != nil {
			tc.Close()
		}
		markers.Detach()
		groups.Close()
		offsets.Close()
		store.Close()
		return nil, fmt.Errorf("cannot start transaction coordinator (refusing to start): %w", err)
	}
	markers.WatchHanging(cfg.TransactionReapInterval, cfg.TransactionMaxTimeout)
	deps.Txn = tc
	// --- end transaction coordinator wiring ---
	srv := server.New(cfg, log.Named("server"), deps, clusterID)
	if err := srv.Start(); err != nil {
		tc.Close()       // issue 4
		markers.Detach() // issue 4
		groups.Close()   // issue 3
		offsets.Close()  // issue 3
		store.Close()
		return nil, err
	}
	return &broker{store: store, srv: srv, groups: groups, offsets: offsets, txn: tc, markers: markers}, nil
}

func (b *broker) close(log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.srv.Close(ctx); err != nil {
		log.Warn("server close", zap.Error(err))
	}
	// issue 4: the transaction coordinator drains its queue (in-flight marker dispatches that
	// complete later find it closed and leave their transactions prepared for the next start).
	b.txn.Close()
	b.markers.Detach()
	// issue 3: the coordinator answers what is parked and waits for in-flight commits; then the
	// offsets log is closed.
	b.groups.Close()
	if err := b.offsets.Close(); err != nil {
		log.Warn("offset store close", zap.Error(err))
	}
	if err := b.store.Close(); err != nil {
		log.Warn("storage close", zap.Error(err))
	}
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
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return "", fmt.Errorf("cannot write %s: %w", tmp, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		if d, derr := os.Open(dir); derr == nil {
			err = d.Sync()
			d.Close()
		}
	}
	if err != nil {
		return "", fmt.Errorf("cannot persist cluster id to %s: %w", path, err)
	}
	return meta.ClusterID, nil
}

func httpMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		metrics.WritePrometheus(w, true)
		metrics.WriteFDMetrics(w)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func newLogger(level string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad log.level %q: %w", level, err)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Encoding = "console"
	zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	zc.Sampling = nil
	return zc.Build()
}
