// Command kaas runs one Kafka-wire-compatible broker, alone or as a member of a cluster
// (cluster.etcd.endpoints).
//
//	kaas [--config=server.properties] [--key=value ...]
//	kaas credentials add --data.dir=DIR --user=NAME --mechanism=SCRAM-SHA-256 --password=PW
//
// Every key of configs/kaas.properties can be given as a flag (--data.dir=./data) or as an
// environment variable (KAAS_DATA_DIR=./data); flags win over the environment, which wins over
// the file.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/server"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "credentials" {
		if err := runCredentials(os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "kaas credentials:", err)
			os.Exit(1)
		}
		return
	}
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

	b, err := server.StartBroker(cfg, log, server.BrokerOptions{})
	if err != nil {
		return err
	}
	if cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			b.Close()
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
	if s == syscall.SIGTERM {
		// Cluster mode: hand partitions and coordinators over first (a graceful handover each,
		// no scan, no rebalance), as Kafka's controlled shutdown does. A single broker returns
		// at once.
		if err := b.Drain(); err != nil {
			log.Warn("drain incomplete", zap.Error(err))
		}
	}
	if err := b.Close(); err != nil {
		log.Warn("shutdown", zap.Error(err))
	}
	return nil
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
