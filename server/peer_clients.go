package server

// Inter-broker clients (cluster mode). A partition leader asks the transaction coordinator on
// another broker to verify a producer's first transactional write (verify_remote.go, KIP-890),
// and a group coordinator asks it to check or add the group of a TxnOffsetCommit. Both go
// through one franz-go client per peer broker, seeded with that broker's endpoint on
// inter.broker.listener.name as the topology lists it (topology.Broker.Endpoints), and every
// request goes to that seed itself: the broker addresses the coordinator the topology names,
// as Apache's InterBrokerSendThread addresses a Node, never one kgo's metadata would pick.
//
// A peer that comes back at another address (a restart on a new port) gets a new client; the
// old one is closed, which fails its in-flight requests (their callers answer the retriable
// error of a lost connection).
//
// The connection is PLAINTEXT and authenticates as nothing (User:ANONYMOUS), as an Apache
// broker's PLAINTEXT inter-broker listener does: with ACLs on, that principal must be granted
// CLUSTER_ACTION (or be a super user) for the coordinator to serve these requests. There is no
// inter-broker TLS or SASL client configuration yet: an inter-broker listener that is not
// PLAINTEXT is refused here (logged once, counted) instead of failing every handshake.

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/configs"
)

// peerRequestTimeout bounds one inter-broker request, as Apache's request.timeout.ms (30 s)
// bounds an InterBrokerSendThread request.
const peerRequestTimeout = 30 * time.Second

var (
	mPeerClientsCreated = metrics.NewCounter(`kaas_interbroker_clients_created_total`)
	mPeerUnknown        = metrics.NewCounter(`kaas_interbroker_peer_unknown_total`)
	mPeerUnsupported    = metrics.NewCounter(`kaas_interbroker_listener_unsupported_total`)
)

// errInterBrokerSecured: inter.broker.listener.name is a TLS or SASL listener, which the
// inter-broker clients do not speak yet.
var errInterBrokerSecured = errors.New("the inter-broker listener is not PLAINTEXT; inter-broker TLS/SASL clients are not implemented")

// errPeerUnknown: the topology lists no endpoint of the broker on the inter-broker listener
// (it left, or it does not listen there).
var errPeerUnknown = errors.New("peer broker has no endpoint on the inter-broker listener")

// errPeersClosed: the server is closing.
var errPeersClosed = errors.New("inter-broker clients are closed")

// peerClients is the pool of inter-broker clients of one Server. Its mutex is a leaf: nothing
// else is locked while it is held, and no request is sent under it.
type peerClients struct {
	s      *Server
	mu     sync.Mutex
	m      map[int32]*peerClient
	closed bool
	warned atomic.Bool // the unsupported listener was logged
}

type peerClient struct {
	addr string
	cl   *kgo.Client
}

// broker returns a handle that sends requests straight to broker id.
func (pc *peerClients) broker(id int32) (*kgo.Broker, error) {
	if err := pc.listenerSupported(); err != nil {
		return nil, err
	}
	addr, ok := pc.addr(id)
	if !ok {
		mPeerUnknown.Inc()
		return nil, fmt.Errorf("cannot reach broker %d: %w", id, errPeerUnknown)
	}
	pc.mu.Lock()
	if pc.closed {
		pc.mu.Unlock()
		return nil, errPeersClosed
	}
	if pc.m == nil {
		pc.m = map[int32]*peerClient{}
	}
	cur := pc.m[id]
	var stale *kgo.Client
	if cur == nil || cur.addr != addr {
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(addr),
			kgo.ClientID("kaas-broker-"+strconv.Itoa(int(pc.s.cfg.BrokerID))),
			kgo.DialTimeout(10*time.Second),
			kgo.RequestRetries(0), // the callers answer a retriable code; the producer retries
		)
		if err != nil {
			pc.mu.Unlock()
			return nil, fmt.Errorf("cannot create a client for broker %d (%s): %w", id, addr, err)
		}
		mPeerClientsCreated.Inc()
		if cur != nil {
			stale = cur.cl
		}
		cur = &peerClient{addr: addr, cl: cl}
		pc.m[id] = cur
	}
	pc.mu.Unlock()
	if stale != nil {
		go stale.Close()
	}
	seeds := cur.cl.SeedBrokers()
	if len(seeds) == 0 {
		return nil, fmt.Errorf("cannot reach broker %d (%s): the client has no seed", id, addr)
	}
	return seeds[0], nil
}

// listenerSupported refuses an inter-broker listener the clients cannot speak.
func (pc *peerClients) listenerSupported() error {
	name := pc.s.cfg.InterBrokerListenerName()
	ls, err := pc.s.cfg.ParseListeners()
	if err != nil {
		return err
	}
	for _, l := range ls {
		if l.Name == name && l.Protocol != configs.ProtoPlaintext {
			mPeerUnsupported.Inc()
			if !pc.warned.Swap(true) {
				pc.s.log.Error("cannot reach other brokers: transactional verification and TxnOffsetCommit across brokers answer retriable errors until inter.broker.listener.name names a PLAINTEXT listener",
					zap.String("listener", name), zap.String("protocol", l.Protocol))
			}
			return fmt.Errorf("cannot use inter-broker listener %s (%s): %w", name, l.Protocol, errInterBrokerSecured)
		}
	}
	return nil
}

// addr is broker id's host:port on the inter-broker listener, from the topology.
func (pc *peerClients) addr(id int32) (string, bool) {
	name := pc.s.cfg.InterBrokerListenerName()
	for _, b := range pc.s.deps.Topology.Brokers() {
		if b.ID != id {
			continue
		}
		ep, ok := b.Endpoint(name)
		if !ok || ep.Host == "" || ep.Port <= 0 {
			return "", false
		}
		return net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port))), true
	}
	return "", false
}

// close closes every client (Server.Close); later calls of broker fail.
func (pc *peerClients) close() {
	pc.mu.Lock()
	pc.closed = true
	m := pc.m
	pc.m = nil
	pc.mu.Unlock()
	for _, c := range m {
		c.cl.Close()
	}
}
