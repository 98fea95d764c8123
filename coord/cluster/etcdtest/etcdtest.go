// Package etcdtest runs a real, single-member etcd server inside a test process.
//
// It is the only package that imports the etcd server (go.etcd.io/etcd/server/v3/embed), and
// only _test.go files import it, so the kaas binary links the etcd client alone (a test in
// cmd/kaas checks this). The server keeps its data in a test temp dir, binds 127.0.0.1 on
// ports the kernel picks, and skips fsync (UnsafeNoFsync): these tests exercise kaas's use of
// etcd, not etcd's durability.
package etcdtest

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Server is one embedded etcd member.
type Server struct {
	t        testing.TB
	dir      string
	client   url.URL
	peer     url.URL
	e        *embed.Etcd
	Endpoint string // http://127.0.0.1:<port>, stable across Restart
}

// Start starts a member and registers its shutdown with t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir()}
	c, _ := url.Parse("http://127.0.0.1:0")
	p, _ := url.Parse("http://127.0.0.1:0")
	s.client, s.peer = *c, *p
	if err := s.start(); err != nil {
		t.Fatalf("cannot start embedded etcd: %v", err)
	}
	// Restart must come back on the same client port (clients keep their endpoint list), so the
	// kernel-picked ports are pinned after the first start.
	s.client.Host = s.e.Clients[0].Addr().String()
	s.peer.Host = s.e.Peers[0].Addr().String()
	s.Endpoint = "http://" + s.client.Host
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() error {
	cfg := embed.NewConfig()
	cfg.Name = "t"
	cfg.Dir = s.dir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{s.client}, []url.URL{s.client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{s.peer}, []url.URL{s.peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("embedded etcd in %s not ready after 30s", s.dir)
	}
	s.e = e
	return nil
}

// Stop shuts the member down (idempotent).
func (s *Server) Stop() {
	if s.e != nil {
		s.e.Close()
		s.e = nil
	}
}

// Restart stops the member and starts it again on the same ports and data: leases survive
// (etcd extends them on recovery), which is what "an etcd restart shorter than the session
// timeout changes nothing" relies on.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("cannot restart embedded etcd: %v", err)
	}
}
