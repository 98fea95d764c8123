// Package server is the Kafka wire front end: gnet event loops (plain listeners) or per-connection
// TLS goroutines (SSL listeners) frame requests, a per-connection
// executor runs the handlers (one file per API, NN_name.go, registering its versions in init), and
// responses go back strictly in request order. It is the only package that knows gnet.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/acl"
	"github.com/kaas-go/kaas/coord/credentials"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/coord/quota"
	"github.com/kaas-go/kaas/coord/topology"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

// Deps are the subsystems the server fronts.
type Deps struct {
	Store *storage.Store
	PIDs  *storage.PIDAllocator
	// Topics creates, deletes and grows topics (topic_admin.go); nil: the local store.
	Topics TopicAdmin
	// Topology answers who leads each partition and coordinates each transaction slot and group
	// shard, at which epoch and where (topology.go); nil is the single broker: a
	// topology.Table that owns everything at epoch 0 and lists this broker at its bound address.
	Topology topology.Topology
	// Authz decides whether a principal may perform an operation; nil allows everything.
	Authz Authorizer
	// ACL is the StandardAuthorizer behind CreateAcls / DescribeAcls / DeleteAcls; nil (no
	// authorizer.class.name) answers them SECURITY_DISABLED.
	ACL *acl.Authorizer
	// PrincipalFor, for tests only, names the principal of a connection from its remote
	// address (ip:port) until SASL authenticates connections; nil = User:ANONYMOUS.
	PrincipalFor func(remoteAddr string) string
	// Quotas are the client quotas (AlterClientQuotas / DescribeClientQuotas, throttling); nil
	// answers the quota APIs UNKNOWN_SERVER_ERROR and throttles nothing.
	Quotas *quota.Manager
	// Groups is the classic consumer-group coordinator; nil answers the group APIs
	// COORDINATOR_NOT_AVAILABLE.
	Groups *group.Coordinator
	// Txn is the transaction coordinator; nil answers the transactional APIs
	// COORDINATOR_NOT_AVAILABLE.
	Txn *txn.Coordinator
	// Markers is the local marker writer Txn writes through (and the hanging-transaction watch).
	Markers *MarkerWriter
	// Credentials holds the SCRAM credentials SASL authenticates against and
	// Describe/AlterUserScramCredentials manage; nil: no user can authenticate, and those APIs
	// answer SECURITY_DISABLED.
	Credentials credentials.Store
	// FeaturesEpoch is the persisted KIP-584 finalizing epoch of the advertised feature levels
	// (features.go); 0 = 1.
	FeaturesEpoch int64
	// Peers is the broker's pool of inter-broker clients (peer_clients.go), shared with the
	// cluster marker writer; its owner closes it. nil: the server builds and closes its own.
	Peers *InterBroker
}

// Server is one broker's Kafka front end: its listeners (listener.go) and the request pipeline.
type Server struct {
	cfg       configs.Config
	log       *zap.Logger
	deps      Deps
	clusterID string

	listeners []*listener // in the order of the listeners config; [0] is Addr()

	fetchSessions *fetchSessionCache
	internal      [2]internalTopic // __consumer_offsets, __transaction_state

	// peers are the inter-broker clients (Deps.Peers, or the server's own, closed with it),
	// verifier the KIP-890 verification with a remote transaction coordinator (cluster mode;
	// peer_clients.go, verify_remote.go).
	peers     *InterBroker
	ownsPeers bool
	verifier  remoteVerifier

	mu     sync.Mutex
	closed bool
}

// New builds a server; Start binds it.
func New(cfg configs.Config, log *zap.Logger, deps Deps, clusterID string) *Server {
	if deps.Topology == nil {
		deps.Topology = topology.NewTable(topology.Broker{ID: cfg.BrokerID})
	}
	if deps.Authz == nil {
		deps.Authz = allowAll{}
	}
	s := &Server{
		cfg:           cfg,
		log:           log,
		deps:          deps,
		clusterID:     clusterID,
		fetchSessions: newFetchSessionCache(cfg.FetchSessionCacheSize),
		internal:      newInternalTopics(clusterID),
	}
	s.verifier.s = s
	if s.peers = deps.Peers; s.peers == nil {
		// A server without a broker around it (tests, the single broker) builds its own; a
		// login it cannot build fails its inter-broker requests instead (a cluster broker is
		// refused before this, by StartBroker).
		p, err := NewInterBroker(cfg, deps.Topology, log.Named("interbroker"))
		if err != nil {
			p = brokenInterBroker(err)
		}
		s.peers, s.ownsPeers = p, true
	}
	return s
}

// Start binds every listener and returns once all accept connections.
func (s *Server) Start() error {
	ls, err := s.cfg.ParseListeners()
	if err != nil {
		return err
	}
	for _, lc := range ls {
		l, err := newListener(s, lc)
		if err == nil {
			err = l.start()
		}
		if err != nil {
			s.stopListeners(context.Background())
			return fmt.Errorf("cannot start listener %s (%s): %w", lc.Name, lc.Addr(), err)
		}
		s.listeners = append(s.listeners, l)
		s.log.Info("listening", zap.String("listener", l.name), zap.String("protocol", lc.Protocol),
			zap.String("addr", l.addr().String()), zap.Int32("broker.id", s.cfg.BrokerID))
	}
	s.publishLocalEndpoint()
	return nil
}

// Addr is the bound address of the first listener.
func (s *Server) Addr() *net.TCPAddr { return s.listeners[0].addr() }

// ListenerAddr is the bound address of the named listener (nil if there is none).
func (s *Server) ListenerAddr(name string) *net.TCPAddr {
	if l := s.listener(name); l != nil {
		return l.addr()
	}
	return nil
}

func (s *Server) listener(name string) *listener {
	for _, l := range s.listeners {
		if l.name == name {
			return l
		}
	}
	return nil
}

// advertised returns the host and port given to clients of the named listener in Metadata,
// FindCoordinator and DescribeCluster: its advertised.listeners entry, else its bound address.
func (s *Server) advertised(name string) (string, int32) {
	if h, p, ok := s.cfg.AdvertisedEndpoint(name); ok {
		return h, int32(p)
	}
	l := s.listener(name)
	if l == nil {
		l = s.listeners[0]
	}
	a := l.addr()
	return a.IP.String(), int32(a.Port)
}

// Close stops accepting, closes every connection and waits for the listeners to exit.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := s.stopListeners(ctx)
	if s.ownsPeers {
		s.peers.Close()
	}
	return err
}

func (s *Server) stopListeners(ctx context.Context) error {
	var errs []error
	for _, l := range s.listeners {
		if err := l.stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// reqCtx is what a handler sees of one request.
type reqCtx struct {
	s        *Server
	c        *conn
	r        *request
	hdr      codec.RequestHeader
	req      kmsg.Request
	start    time.Time
	deferred bool
	// closeAfter closes the connection once the response is written (a failed SASL step).
	closeAfter bool
	throttle   atomic.Int64 // nanoseconds of client-quota throttle (quotas.go)
}

// handler serves one API. It returns the response, or (nil, nil) after calling rc.deferReply()
// (the reply comes later) or rc.noReply() (acks=0). A Go error closes the connection.
type handler func(rc *reqCtx) (kmsg.Response, error)

var handlers [128]handler

// testHandlerHook lets tests wrap a handler (fault injection, kfake's ControlKey idea). It is set
// only by tests, before any broker starts.
var testHandlerHook func(key int16, h handler) handler

// register binds an API key to its handler and advertises [min, max] in ApiVersions.
func register(key kmsg.Key, min, max int16, h handler) {
	if int(key) >= len(handlers) || handlers[key] != nil {
		panic(fmt.Sprintf("BUG: cannot register handler for key %d", key))
	}
	codec.Register(int16(key), min, max)
	handlers[key] = h
}

// handle parses and dispatches one request on the connection's executor.
func (s *Server) handle(r *request) {
	c := r.c
	if c.auth != nil && c.auth.step == saslAwaitRawToken {
		s.saslRawToken(r) // not a Kafka request: a SASL token after SaslHandshake v0 (sasl.go)
		return
	}
	req, err := codec.ParseRequest(r.frame.B)
	if err != nil {
		s.parseFailed(r, req, err)
		return
	}
	rc := &reqCtx{s: s, c: c, r: r, hdr: req.Header, req: req.Msg, start: time.Now()}
	key := req.Header.Key
	if c.auth != nil && !c.saslAllowed(key) {
		c.t.close()
		r.release()
		return
	}
	mRequests[key].Inc()
	h := handlers[key]
	if testHandlerHook != nil {
		h = testHandlerHook(key, h)
	}
	var t0 time.Time
	if s.deps.Quotas != nil && s.deps.Quotas.Active() {
		t0 = time.Now()
	}
	resp, herr := s.runHandler(rc, h)
	if !t0.IsZero() {
		// request_percentage: handler time as a percentage of one thread (Apache's
		// nanosToPercentage), the synchronous part that occupies this executor.
		rc.recordUsage(quota.Request, float64(time.Since(t0))*100/float64(time.Second))
	}
	if herr != nil {
		c.closeWith("handler error", zap.String("api", kmsg.NameForKey(key)), zap.Error(herr))
		r.release()
		return
	}
	if rc.deferred {
		rc.c.muteFor(time.Duration(rc.throttle.Load()))
		return
	}
	rc.reply(resp)
	if rc.closeAfter {
		c.t.closeAfterWrites()
	}
}

// runHandler calls h, turning a panic into a closed connection with a logged stack: a bug in one
// handler must not take the broker down.
func (s *Server) runHandler(rc *reqCtx, h handler) (resp kmsg.Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			mPanics.Inc()
			s.log.Error("panic in handler; closing connection",
				zap.String("api", kmsg.NameForKey(rc.hdr.Key)), zap.Any("panic", p),
				zap.ByteString("stack", debug.Stack()))
			resp, err = nil, fmt.Errorf("panic: %v", p)
			rc.deferred = false
		}
	}()
	return h(rc)
}

func (s *Server) parseFailed(r *request, req *codec.Request, err error) {
	c := r.c
	switch {
	case req != nil && errors.Is(err, codec.ErrUnsupportedVersion) && req.Header.Key == int16(kmsg.ApiVersions):
		// KIP-511: answer v0 with UNSUPPORTED_VERSION and our versions so the client can retry.
		c.complete(r, encode(req.Header.CorrelationID, codec.ApiVersionsFallback()))
		return
	case req != nil && errors.Is(err, codec.ErrUnsupportedVersion):
		c.closeWith("unsupported version", zap.String("api", kmsg.NameForKey(req.Header.Key)),
			zap.Int16("version", req.Header.Version))
	case req != nil && errors.Is(err, codec.ErrUnknownKey):
		c.closeWith("unknown api key", zap.Int16("key", req.Header.Key))
	default:
		c.closeWith("malformed request", zap.Error(err))
	}
	mBadRequests.Inc()
	r.release()
}

// encode renders a response frame into a pooled buffer.
func encode(corr int32, resp kmsg.Response) *bytebufferpool.ByteBuffer {
	b := codec.ResponsePool.Get()
	b.B = codec.AppendResponse(b.B[:0], corr, resp)
	return b
}

// reply sends resp for this request (in request order). Safe from any goroutine, exactly once.
func (rc *reqCtx) reply(resp kmsg.Response) {
	mLatency[rc.hdr.Key].UpdateDuration(rc.start)
	if resp == nil {
		rc.applyThrottle(nil)
		rc.c.complete(rc.r, nil)
		return
	}
	rc.applyThrottle(resp)
	b := encode(rc.hdr.CorrelationID, resp)
	if rc.hdr.Key == int16(kmsg.Fetch) && rc.s.deps.Quotas != nil && rc.s.deps.Quotas.Active() {
		// consumer_byte_rate counts the response as sent; a throttle it causes is in this
		// response already (re-encoded), as Apache records before it answers.
		before := rc.throttle.Load()
		rc.recordUsage(quota.Fetch, float64(len(b.B)))
		if rc.throttle.Load() != before {
			codec.ResponsePool.Put(b)
			rc.applyThrottle(resp)
			b = encode(rc.hdr.CorrelationID, resp)
		}
	}
	rc.c.complete(rc.r, b)
}

// deferReply marks the request as answered later through rc.reply (or rc.fail).
func (rc *reqCtx) deferReply() { rc.deferred = true }

// noReply completes the request without a response (acks=0 Produce): the ordering window still
// advances so later responses on the connection are not held back.
func (rc *reqCtx) noReply() {
	rc.deferred = true
	rc.c.complete(rc.r, nil)
}

// guard is deferred first thing in every continuation of a deferred handler (coordinator and
// flusher callbacks): a panic there is treated like one in the handler itself — logged with its
// stack, counted, that connection closed — instead of killing the coordinator worker or
// partition flusher goroutine it runs on, and with it the broker.
func (rc *reqCtx) guard() {
	p := recover()
	if p == nil {
		return
	}
	mPanics.Inc()
	rc.s.log.Error("panic in deferred handler; closing connection",
		zap.String("api", kmsg.NameForKey(rc.hdr.Key)), zap.Any("panic", p),
		zap.ByteString("stack", debug.Stack()))
	rc.c.t.close()
}

// fail closes the connection for a deferred request that cannot be answered.
func (rc *reqCtx) fail(err error) {
	rc.c.closeWith("deferred handler error", zap.String("api", kmsg.NameForKey(rc.hdr.Key)), zap.Error(err))
	rc.r.release()
}
