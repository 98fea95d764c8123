package server

// Listeners, Kafka's way: every entry of `listeners` is a named endpoint with a security protocol
// (listener.security.protocol.map). Clients are given the addresses of the listener they came in
// on (Apache's MetadataCache.getAliveBrokerNodes(listenerName)), so a client on the SASL_SSL
// listener is never sent to a PLAINTEXT port.
//
// How each protocol is served:
//
//	PLAINTEXT, SASL_PLAINTEXT   a gnet engine of its own (gnetListener); framing on the loop
//	SSL, SASL_SSL               net.Listener + crypto/tls; per connection a reader and a writer
//	                            goroutine (tlsTransport), because gnet has no TLS and a TLS read
//	                            or handshake blocks, which must never happen on an event loop
//
// Both hand complete frames to conn.deliver and write through conn.complete, so the executor,
// the handlers and the in-order response window are the same code for every listener. SASL is a
// state on the connection (sasl.go), not a transport.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/topology"
)

// listener is one bound entry of the listeners config.
type listener struct {
	s     *Server
	cfg   configs.Listener
	name  string
	mechs []string   // SASL mechanisms served (sasl.enabled.mechanisms for this listener)
	tls   *tlsSource // nil on a plain listener
	bound atomic.Pointer[net.TCPAddr]

	// gnet (plain listeners)
	g *gnetListener

	// TLS listeners
	nl     net.Listener
	connMu sync.Mutex
	conns  map[*tlsTransport]struct{}
	wg     sync.WaitGroup // accept loop and connection goroutines
}

func newListener(s *Server, lc configs.Listener) (*listener, error) {
	l := &listener{s: s, cfg: lc, name: lc.Name}
	if lc.SASL() {
		l.mechs = s.cfg.SASLMechanismList(lc.Name)
	}
	if lc.TLS() {
		src, err := newTLSSource(s.cfg, lc.Name, s.log.Named("tls").With(zap.String("listener", lc.Name)))
		if err != nil {
			return nil, err
		}
		l.tls = src
	}
	return l, nil
}

func (l *listener) addr() *net.TCPAddr { return l.bound.Load() }

func (l *listener) start() error {
	if l.tls != nil {
		return l.startTLS()
	}
	l.g = &gnetListener{l: l, booted: make(chan struct{}), stopped: make(chan error, 1)}
	return l.g.start()
}

func (l *listener) stop(ctx context.Context) error {
	if l.g != nil {
		return l.g.stop(ctx)
	}
	if l.nl == nil {
		return nil
	}
	_ = l.nl.Close()
	l.connMu.Lock()
	for t := range l.conns {
		t.close()
	}
	l.connMu.Unlock()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gnetListener serves one plain listener with its own gnet engine; its connections know their
// listener without looking at addresses.
type gnetListener struct {
	gnet.BuiltinEventEngine
	l       *listener
	eng     gnet.Engine
	booted  chan struct{}
	stopped chan error
}

func (g *gnetListener) start() error {
	s := g.l.s
	opts := []gnet.Option{
		gnet.WithMulticore(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithReadBufferCap(256 << 10),
		gnet.WithWriteBufferCap(256 << 10),
		gnet.WithLogger(s.log.Named("gnet").Sugar()),
		// No gnet.WithTCPKeepAlive: gnet v2.9 sets it on the listening socket right after
		// opening it and assigns that result over the open's error, so a bind that failed
		// ("address already in use") surfaced as "setsockopt: bad file descriptor" on the
		// already-closed descriptor. Keepalive is set per connection in OnOpen instead.
		// A broker restarted after kill -9 must rebind while old connections sit in TIME_WAIT.
		gnet.WithReuseAddr(true),
	}
	if s.cfg.NumEventLoops > 0 {
		opts = append(opts, gnet.WithNumEventLoop(s.cfg.NumEventLoops))
	}
	go func() {
		g.stopped <- gnet.Run(g, "tcp://"+g.l.cfg.Addr(), opts...)
	}()
	select {
	case <-g.booted:
	case err := <-g.stopped:
		if err == nil {
			err = errors.New("event engine stopped during start")
		}
		return fmt.Errorf("cannot listen on %s: %w", g.l.cfg.Addr(), err)
	}
	// Learn the bound address (the port may have been 0).
	fd, err := g.eng.Dup()
	if err != nil {
		return fmt.Errorf("cannot inspect listener: %w", err)
	}
	defer unix.Close(fd)
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("cannot inspect listener: %w", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		g.l.bound.Store(&net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port})
	case *unix.SockaddrInet6:
		g.l.bound.Store(&net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port})
	default:
		return fmt.Errorf("unexpected listener address %T", sa)
	}
	return nil
}

func (g *gnetListener) stop(ctx context.Context) error {
	if err := g.eng.Stop(ctx); err != nil {
		return err
	}
	select {
	case <-g.stopped:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// OnBoot implements gnet.EventHandler.
func (g *gnetListener) OnBoot(eng gnet.Engine) gnet.Action {
	g.eng = eng
	close(g.booted)
	return gnet.None
}

// OnOpen implements gnet.EventHandler.
func (g *gnetListener) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	addr := ""
	if ra := gc.RemoteAddr(); ra != nil {
		addr = ra.String()
	}
	// Dead peers (a client host that vanished) are found by TCP keepalive, as Kafka's
	// SO_KEEPALIVE on every broker socket: idle 1 min, then 5 probes 12 s apart.
	if err := gc.SetKeepAlive(true, time.Minute, 12*time.Second, 5); err != nil {
		g.l.s.log.Debug("cannot set TCP keepalive", zap.String("remote", addr), zap.Error(err))
	}
	c := newConn(g.l.s, g.l, addr)
	c.gc = gc
	c.t = gnetTransport{c: c, gc: gc}
	c.setPrincipal(anonymous)
	gc.SetContext(c)
	mConnsOpened.Inc()
	mConnsOpen.Inc()
	return nil, gnet.None
}

// OnClose implements gnet.EventHandler.
func (g *gnetListener) OnClose(gc gnet.Conn, err error) gnet.Action {
	c, _ := gc.Context().(*conn)
	if c != nil {
		c.closed.Store(true)
		close(c.quit) // releases an executor muted by a quota throttle (quotas.go)
		if c.frame != nil {
			codec.FramePool.Put(c.frame)
			c.frame = nil
		}
	}
	mConnsOpen.Dec()
	return gnet.None
}

// OnTraffic implements gnet.EventHandler.
func (g *gnetListener) OnTraffic(gc gnet.Conn) gnet.Action {
	c, _ := gc.Context().(*conn)
	if c == nil {
		return gnet.Close
	}
	return c.onTraffic()
}

// anonymous is Kafka's principal of an unauthenticated connection.
const anonymous = "User:ANONYMOUS"

func (c *conn) setPrincipal(p string) { c.princ.Store(&p) }

// authPrincipal is the connection's authenticated principal (principal() in seams.go returns it).
func (c *conn) authPrincipal() string {
	if p := c.princ.Load(); p != nil {
		return *p
	}
	return anonymous
}

// InterBrokerEndpoint is this broker's advertised endpoint on inter.broker.listener.name (the
// first listener when unset): the address other brokers are to dial, and the listener whose
// endpoints a broker looks up for its peers (topology.Broker.Endpoint).
func (s *Server) InterBrokerEndpoint() topology.Endpoint {
	name := s.cfg.InterBrokerListenerName()
	h, p := s.advertised(name)
	return topology.Endpoint{Listener: name, Host: h, Port: p}
}
