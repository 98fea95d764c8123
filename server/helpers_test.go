package server

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/storage"
)

// testBroker is an in-process broker on 127.0.0.1:0 with its own temp data dir.
type testBroker struct {
	*Broker
	cfg   configs.Config
	store *storage.Store
	srv   *Server
}

// newTestBroker starts a broker (StartBroker: the same wiring as cmd/kaas) on 127.0.0.1:0 in a
// temp dir and registers cleanup.
func newTestBroker(t *testing.T, opts ...func(*configs.Config)) (string, *Server) {
	t.Helper()
	cfg := testConfig(t)
	for _, o := range opts {
		o(&cfg)
	}
	tb := startTestBroker(t, cfg)
	t.Cleanup(func() { tb.stop(t) })
	return tb.srv.Addr().String(), tb.srv
}

// testConfig is the default configuration on a free loopback port and a temp dir.
func testConfig(t *testing.T) configs.Config {
	cfg := configs.Default()
	cfg.Listeners = "127.0.0.1:0"
	cfg.MetricsAddr = ""
	cfg.DataDir = t.TempDir()
	cfg.NumEventLoops = 2
	cfg.GroupInitialRebalanceDelay = 0
	return cfg
}

// startTestBroker starts a broker on cfg (reusing cfg.DataDir); the caller stops it.
func startTestBroker(t *testing.T, cfg configs.Config, opts ...BrokerOptions) *testBroker {
	t.Helper()
	var o BrokerOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	b, err := StartBroker(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), o)
	if err != nil {
		t.Fatal(err)
	}
	return &testBroker{Broker: b, cfg: cfg, store: b.Store, srv: b.Server}
}

func (tb *testBroker) stop(t *testing.T) {
	if err := tb.Close(); err != nil {
		t.Errorf("broker close: %v", err)
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
