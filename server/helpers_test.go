package server

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/storage"
)

// testBroker is an in-process broker on 127.0.0.1:0 with its own temp data dir.
type testBroker struct {
	cfg   configs.Config
	store *storage.Store
	srv   *Server
	log   *zap.Logger

	closeGroups func() // issue 3: group coordinator, then its offset store
	closeTxn    func() // issue 4: transaction coordinator, then its marker writer binding
}

// newTestBroker starts storage + server on 127.0.0.1:0 in a temp dir and registers cleanup.
func newTestBroker(t *testing.T, opts ...func(*configs.Config)) (string, *Server) {
	t.Helper()
	cfg := configs.Default()
	cfg.Listeners = "127.0.0.1:0"
	cfg.MetricsAddr = ""
	cfg.DataDir = t.TempDir()
	cfg.NumEventLoops = 2
	cfg.GroupInitialRebalanceDelay = 0
	for _, o := range opts {
		o(&cfg)
	}
	tb := startTestBroker(t, cfg)
	t.Cleanup(func() { tb.stop(t) })
	return tb.srv.Addr().String(), tb.srv
}

// startTestBroker starts a broker on cfg (reusing cfg.DataDir); the caller stops it.
func startTestBroker(t *testing.T, cfg configs.Config) *testBroker {
	t.Helper()
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	pids, err := storage.OpenPIDAllocator(filepath.Join(cfg.DataDir, "__cluster"), cfg.BrokerID)
	if err != nil {
		t.Fatal(err)
	}
	store, err := storage.Open(storage.Config{Dir: cfg.DataDir, Defaults: TopicDefaults(cfg), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	deps := Deps{Store: store, PIDs: pids}
	// --- group coordinator wiring (issue 3) ---
	closeGroups := wireGroups(t, cfg, log, &deps)
	// --- end group coordinator wiring ---
	// --- transaction coordinator wiring (issue 4) ---
	closeTxn := wireTxn(t, cfg, log, pids, store, &deps)
	// --- end transaction coordinator wiring ---
	srv := New(cfg, log, deps, "test-cluster-id")
	if err := srv.Start(); err != nil {
		store.Close()
		t.Fatal(err)
	}
	return &testBroker{cfg: cfg, store: store, srv: srv, log: log, closeGroups: closeGroups, closeTxn: closeTxn}
}

func (tb *testBroker) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tb.srv.Close(ctx); err != nil {
		t.Errorf("server close: %v", err)
	}
	if tb.closeTxn != nil { // issue 4
		tb.closeTxn()
	}
	if tb.closeGroups != nil { // issue 3
		tb.closeGroups()
	}
	if err := tb.store.Close(); err != nil {
		t.Errorf("store close: %v", err)
	}
}

// checkFor polls fn until it returns nil or the deadline passes.
func checkFor(t *testing.T, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = fn(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", total, err)
		}
		<-time.After(every)
	}
}
