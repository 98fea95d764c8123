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
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Server is one embedded etcd member. Clients reach it through a loopback TCP relay
// (Endpoint), so that Restart can drop every client connection at once, as a real etcd
// process that dies does; the embedded server's own Close would first wait up to its 5 s
// request timeout for open watch streams to end.
type Server struct {
	t        testing.TB
	dir      string
	client   url.URL
	peer     url.URL
	e        *embed.Etcd
	relay    net.Listener
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	up       bool   // relay forwards only while the member is up
	Endpoint string // http://127.0.0.1:<relay port>, stable across Restart
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("cannot listen for the etcd relay: %v", err)
	}
	s.relay, s.conns, s.up = ln, map[net.Conn]struct{}{}, true
	go s.accept()
	s.Endpoint = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		_ = ln.Close()
		s.dropConns(false)
		s.Stop()
	})
	return s
}

// accept relays each client connection to the member's client port.
func (s *Server) accept() {
	for {
		c, err := s.relay.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if !s.up {
			s.mu.Unlock()
			_ = c.Close() // a stopped etcd refuses connections
			continue
		}
		up, err := net.Dial("tcp", s.client.Host)
		if err != nil {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		s.conns[c], s.conns[up] = struct{}{}, struct{}{}
		s.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
			s.mu.Lock()
			delete(s.conns, dst)
			delete(s.conns, src)
			s.mu.Unlock()
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

// dropConns closes every relayed connection; with up=false new ones are refused meanwhile.
func (s *Server) dropConns(up bool) {
	s.mu.Lock()
	s.up = up
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (s *Server) start() error {
	cfg := embed.NewConfig()
	cfg.Name = "t"
	cfg.Dir = s.dir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true
	// A single member elects itself after one election timeout when it restarts; etcd's
	// default (1 s, 100 ms ticks) would eat a third of a 3 s test session. 10 ms ticks and a
	// 100 ms election keep a restart well inside it.
	cfg.TickMs, cfg.ElectionMs = 10, 100
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

// Restart drops every client connection, stops the member and starts it again on the same
// ports and data: leases survive (etcd extends them on recovery), which is what "an etcd
// restart shorter than the session timeout changes nothing" relies on. It returns how long
// clients could not reach etcd.
func (s *Server) Restart() time.Duration {
	s.t.Helper()
	t0 := time.Now()
	s.dropConns(false)
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("cannot restart embedded etcd: %v", err)
	}
	s.dropConns(true)
	return time.Since(t0)
}
