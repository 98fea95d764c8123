package server

// The inter-broker clients (cluster mode): ONE pool per broker process, shared by everything
// that talks to another broker —
//
//   - the cluster marker writer (markers_remote.go): WriteTxnMarkers to partition leaders and
//     group coordinators;
//   - a partition leader's KIP-890 verification with a remote transaction coordinator
//     (verify_remote.go): AddPartitionsToTxn v4+;
//   - a group coordinator's TxnOffsetCommit check (txn_offsets_remote.go): AddOffsetsToTxn.
//
// The pool holds one franz-go client per peer broker, seeded with that broker's endpoint on the
// inter-broker listener as the topology lists it (topology.Broker.Endpoints), and every request
// goes to that seed itself: the broker addresses the broker the topology names, as Apache's
// InterBrokerSendThread addresses a Node, never one kgo's metadata would pick. The pool only
// connects; how many requests are in flight to a destination is its callers' business (the
// marker writer keeps one per destination in its own queue).
//
//	Broker(id) ── topology: id's endpoint on the listener ──► none: errPeerUnknown
//	    │
//	    ├─ client for (id, same endpoint) ──► reuse
//	    └─ none, or for an old endpoint ────► new client; the old one is closed, which fails its
//	                                          in-flight requests (their callers retry)
//
// Security is the inter-broker listener's, under Apache's names (configs.InterBroker):
// PLAINTEXT; SSL, verifying the peer against the listener's ssl.truststore.* and presenting the
// listener's keystore as client certificate, both re-read as the listener's own TLS is
// (tlsSource); SASL_PLAINTEXT / SASL_SSL with sasl.mechanism.inter.broker.protocol and the
// username and password of listener.name.<listener>.<mechanism>.sasl.jaas.config. A missing
// login refuses the broker's start (NewInterBroker, configs.Validate).
//
// With ACLs on, the peer authorizes this broker's principal (the SASL user, the mapped
// certificate subject, or User:ANONYMOUS on PLAINTEXT) for CLUSTER_ACTION on every one of these
// requests, as Apache does; a refusal (CLUSTER_AUTHORIZATION_FAILED) is counted and logged here
// (noteClusterAuthz), naming the principal to grant.
//
// Lock order: InterBroker.mu is a leaf; no request is sent and no client is closed under it.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/topology"
)

// peerRequestTimeout bounds one inter-broker request, as Apache's request.timeout.ms (30 s)
// bounds an InterBrokerSendThread request.
const peerRequestTimeout = 30 * time.Second

// peerDialTimeout bounds one connection attempt (TCP, TLS and SASL included).
const peerDialTimeout = 10 * time.Second

// clusterAuthzLogEvery spaces the log lines of refused inter-broker requests (each is counted).
const clusterAuthzLogEvery = 10 * time.Second

var (
	mPeerClientsCreated = metrics.NewCounter(`kaas_interbroker_clients_created_total`)
	mPeerUnknown        = metrics.NewCounter(`kaas_interbroker_peer_unknown_total`)
	mPeerClusterAuthz   = metrics.NewCounter(`kaas_interbroker_cluster_authorization_failed_total`)
)

// errPeerUnknown: the topology lists no endpoint of the broker on the inter-broker listener
// (it left, or it does not listen there).
var errPeerUnknown = errors.New("peer broker has no endpoint on the inter-broker listener")

// errPeersClosed: the broker is closing.
var errPeersClosed = errors.New("inter-broker clients are closed")

// InterBroker is the pool of inter-broker clients of one broker.
type InterBroker struct {
	self  int32
	topo  topology.Topology
	login configs.InterBrokerLogin
	tls   *tlsSource // the inter-broker listener's TLS (SSL, SASL_SSL); nil otherwise
	log   *zap.Logger
	// broken, if set, is why the pool could not be built; every Broker call returns it (a
	// Server built without Deps.Peers whose configuration has no usable inter-broker login).
	broken error

	lastAuthzLog atomic.Int64 // unix nanos of the last CLUSTER_AUTHORIZATION_FAILED line

	mu     sync.Mutex
	m      map[int32]*peerConn
	closed bool
}

type peerConn struct {
	addr string
	cl   *kgo.Client
}

// NewInterBroker builds the pool of cfg's broker over topo. It fails, naming the config key,
// when the inter-broker listener is secured and this broker's login or TLS material is missing
// or does not load: a broker that cannot reach its peers must not start.
func NewInterBroker(cfg configs.Config, topo topology.Topology, log *zap.Logger) (*InterBroker, error) {
	if log == nil {
		log = zap.NewNop()
	}
	login, err := cfg.InterBroker()
	if err != nil {
		return nil, fmt.Errorf("cannot configure the inter-broker client (broker %d): %w", cfg.BrokerID, err)
	}
	p := &InterBroker{self: cfg.BrokerID, topo: topo, login: login, log: log}
	if login.Protocol == configs.ProtoSSL || login.Protocol == configs.ProtoSASLSSL {
		if p.tls, err = newTLSSource(cfg, login.Listener, log); err != nil {
			return nil, fmt.Errorf("cannot load the inter-broker TLS settings (broker %d, listener %s): %w", cfg.BrokerID, login.Listener, err)
		}
	}
	return p, nil
}

// brokenInterBroker is a pool whose every call fails with err.
func brokenInterBroker(err error) *InterBroker { return &InterBroker{broken: err, log: zap.NewNop()} }

// Principal is the principal peers see this broker as, for log lines and error messages (a
// certificate subject is mapped by the peer's rules, so it is named by its listener only).
func (p *InterBroker) Principal() string {
	switch {
	case p.login.Username != "":
		return "User:" + p.login.Username
	case p.tls != nil:
		return "the certificate of listener " + p.login.Listener
	}
	return "User:ANONYMOUS"
}

// Broker returns a handle that sends requests straight to broker id on the inter-broker
// listener.
func (p *InterBroker) Broker(id int32) (*kgo.Broker, error) {
	if p.broken != nil {
		return nil, p.broken
	}
	addr, ok := p.addr(id)
	if !ok {
		mPeerUnknown.Inc()
		return nil, fmt.Errorf("cannot reach broker %d: %w", id, errPeerUnknown)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errPeersClosed
	}
	if cur := p.m[id]; cur != nil && cur.addr == addr {
		p.mu.Unlock()
		return seedOf(cur.cl, id, addr)
	}
	p.mu.Unlock()
	// Built outside the lock (kgo.NewClient starts goroutines); a race with another builder for
	// the same endpoint keeps the first and closes the second.
	cl, err := kgo.NewClient(p.opts(addr)...)
	if err != nil {
		return nil, fmt.Errorf("cannot create a client for broker %d (%s): %w", id, addr, err)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		cl.Close()
		return nil, errPeersClosed
	}
	if p.m == nil {
		p.m = map[int32]*peerConn{}
	}
	old := p.m[id]
	if old != nil && old.addr == addr {
		p.mu.Unlock()
		cl.Close()
		return seedOf(old.cl, id, addr)
	}
	p.m[id] = &peerConn{addr: addr, cl: cl}
	p.mu.Unlock()
	mPeerClientsCreated.Inc()
	if old != nil {
		go old.cl.Close() // the peer's previous incarnation: fails what is still in flight to it
	}
	return seedOf(cl, id, addr)
}

func seedOf(cl *kgo.Client, id int32, addr string) (*kgo.Broker, error) {
	seeds := cl.SeedBrokers()
	if len(seeds) == 0 {
		return nil, fmt.Errorf("cannot reach broker %d (%s): the client has no seed", id, addr)
	}
	return seeds[0], nil
}

// opts are the client options for one peer endpoint.
func (p *InterBroker) opts(addr string) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(addr),
		kgo.ClientID("kaas-broker-" + strconv.Itoa(int(p.self))),
		kgo.DialTimeout(peerDialTimeout),
		kgo.RequestRetries(0), // every caller answers or resends on its own terms
	}
	if p.tls != nil {
		src := p.tls
		opts = append(opts, kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
			// The listener's current keystore and truststore, re-read when their files change,
			// so a rotated certificate is used by the next connection to a peer.
			cur, _ := src.configForClient(nil)
			c := &tls.Config{RootCAs: cur.ClientCAs, MinVersion: cur.MinVersion, MaxVersion: cur.MaxVersion,
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
					return clientCertificate(cur.Certificates), nil
				}}
			c.ServerName, _, _ = net.SplitHostPort(host)
			d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: peerDialTimeout}, Config: c}
			return d.DialContext(ctx, network, host)
		}))
	}
	if m := p.saslMechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts
}

// clientCertificate is the keystore's certificate if it may authenticate a client (its extended
// key usages allow clientAuth, or it has none), else none: a server-only certificate would make a
// peer with ssl.client.auth=requested fail the handshake, where presenting nothing leaves the
// SASL login (or ANONYMOUS) to name this broker.
func clientCertificate(certs []tls.Certificate) *tls.Certificate {
	if len(certs) == 0 {
		return &tls.Certificate{}
	}
	c := certs[0]
	leaf := c.Leaf
	if leaf == nil && len(c.Certificate) > 0 {
		leaf, _ = x509.ParseCertificate(c.Certificate[0])
	}
	if leaf == nil || len(leaf.ExtKeyUsage) == 0 || slices.ContainsFunc(leaf.ExtKeyUsage, func(u x509.ExtKeyUsage) bool {
		return u == x509.ExtKeyUsageClientAuth || u == x509.ExtKeyUsageAny
	}) {
		return &c
	}
	return &tls.Certificate{}
}

func (p *InterBroker) saslMechanism() sasl.Mechanism {
	u, pw := p.login.Username, p.login.Password
	switch p.login.Mechanism {
	case "PLAIN":
		return plain.Auth{User: u, Pass: pw}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: u, Pass: pw}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		return scram.Auth{User: u, Pass: pw}.AsSha512Mechanism()
	}
	return nil
}

// addr is broker id's host:port on the inter-broker listener, from the topology.
func (p *InterBroker) addr(id int32) (string, bool) {
	for _, b := range p.topo.Brokers() {
		if b.ID != id {
			continue
		}
		ep, ok := b.Endpoint(p.login.Listener)
		if !ok || ep.Host == "" || ep.Port <= 0 {
			return "", false
		}
		return net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port))), true
	}
	return "", false
}

// noteClusterAuthz counts a CLUSTER_AUTHORIZATION_FAILED answer from peer to an inter-broker
// request and logs it (at most every clusterAuthzLogEvery): the operator has to grant this
// broker's principal CLUSTER_ACTION on the cluster, or list it in super.users, on every broker.
func (p *InterBroker) noteClusterAuthz(api string, peer int32, code int16) {
	if code != codec.CodeClusterAuthorizationFailed {
		return
	}
	mPeerClusterAuthz.Inc()
	now := time.Now().UnixNano()
	last := p.lastAuthzLog.Load()
	if now-last < int64(clusterAuthzLogEvery) || !p.lastAuthzLog.CompareAndSwap(last, now) {
		return
	}
	p.log.Error("a peer broker refused an inter-broker request with CLUSTER_AUTHORIZATION_FAILED: grant this broker's principal CLUSTER_ACTION on the cluster (kafka-acls --add --allow-principal <it> --operation ClusterAction --cluster) or list it in super.users",
		zap.String("api", api), zap.Int32("peer", peer), zap.String("principal", p.Principal()),
		zap.String("listener", p.login.Listener))
}

// Close closes every client; later Broker calls fail with errPeersClosed.
func (p *InterBroker) Close() {
	p.mu.Lock()
	p.closed = true
	m := p.m
	p.m = nil
	p.mu.Unlock()
	for _, c := range m {
		c.cl.Close()
	}
}
