package server

import (
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage/mailbox"
)

// conn is the per-connection state.
//
// Threading: the framing fields (frame, need, filled, paused, nextSeq) are touched only by the
// connection's event loop (OnTraffic / OnClose / Wake callbacks), or on a TLS listener by its
// reader goroutine (tls_conn.go), which frames with conn.frameSizeOK and conn.deliver too. Decoded frames go to a per-connection executor
// goroutine that runs handlers one at a time in request order — so a producer's pipelined batches
// are appended in the order it sent them — while handlers that wait (fsync, long-poll, rebalance)
// defer their answer and let the executor move on. Responses complete in any order on any goroutine
// and are written strictly in request order (Kafka's per-connection contract) through the reorder
// window below, under writeMu so successive AsyncWritev calls enqueue in order.
//
//	event loop                 executor (one per conn)          any goroutine
//	──────────                 ───────────────────────          ─────────────
//	frame bytes ──enqueue──▶   parse → handler ──sync resp──▶ complete(seq) ─▶ in-order AsyncWritev
//	                                     └─defer─▶ (fsync, fetch wait) ─────▶ complete(seq)
type conn struct {
	s    *Server
	ln   *listener // the listener the client came in on
	t    transport // how bytes move: gnet (plain listeners) or a TLS connection (tls_conn.go)
	gc   gnet.Conn // nil on a TLS listener; the framing below runs on the gnet loop only
	log  *zap.Logger
	addr string

	// auth is the SASL state on a SASL listener (sasl.go), nil elsewhere. Only the executor
	// touches it; the loop reads the two atomics below.
	auth *saslState
	// authed is set once SASL authentication succeeded: until then frames are bounded by
	// sasl.server.max.receive.size. rawTokens is set while a SaslHandshake v0 exchange expects
	// raw (headerless) SASL token frames, which may be shorter than a request header.
	authed    atomic.Bool
	rawTokens atomic.Bool
	// principal is the authenticated identity: User:ANONYMOUS, the mTLS-mapped certificate
	// subject, or the SASL user (principal()).
	princ atomic.Pointer[string]

	// loop-only framing state
	frame  *bytebufferpool.ByteBuffer
	need   int
	filled int
	paused bool // stopped decoding because too many requests are in flight

	inflight atomic.Int32 // frames decoded and not yet answered
	closed   atomic.Bool

	exec    *mailbox.Queue[*request] // the executor: runs handlers one at a time, in order
	nextSeq uint64                   // loop-only: sequence of the next decoded frame

	writeMu   sync.Mutex
	nextWrite uint64
	ready     map[uint64]*bytebufferpool.ByteBuffer // completed, not yet written; nil value = no response (acks=0)

	// Outbound backlog (slow readers): bytes handed to AsyncWritev whose callback has not run,
	// and gnet's outbound buffer as the last callback saw it (bytes the socket did not take).
	// Their sum past connection.max.outbound.bytes closes the connection (noteOutbound).
	outPending  atomic.Int64
	outBuffered atomic.Int64
	slowClosed  atomic.Bool

	// Client-quota muting (quotas.go): the executor starts no request before mutedUntil (unix
	// nanos); quit is closed when the connection closes, to release a muted executor.
	mutedUntil atomic.Int64
	quit       chan struct{}
}

// request is one decoded frame travelling through the pipeline.
type request struct {
	c     *conn
	seq   uint64
	frame *bytebufferpool.ByteBuffer
	done  atomic.Bool
}

func newConn(s *Server, ln *listener, addr string) *conn {
	c := &conn{
		s:     s,
		ln:    ln,
		addr:  addr,
		log:   s.log.With(zap.String("conn", addr), zap.String("listener", ln.name)),
		ready: make(map[uint64]*bytebufferpool.ByteBuffer),
		quit:  make(chan struct{}),
	}
	if ln.cfg.SASL() {
		c.auth = &saslState{}
	}
	// Decoding pauses at MaxInflightPerConn requests in flight, and queued requests are in
	// flight, so the bound is never reached by a well-behaved loop; if it is, the connection
	// is closed (enqueue).
	c.exec = mailbox.New(mailbox.Config[*request]{Name: "conn", MaxLen: s.cfg.MaxInflightPerConn}, c.run)
	return c
}

// onTraffic frames as many requests as are buffered. Each frame is copied exactly once, from
// gnet's buffers into a pooled buffer the request owns (gnet's slices die when OnTraffic returns).
func (c *conn) onTraffic() gnet.Action {
	for {
		if c.frame == nil {
			if int(c.inflight.Load()) >= c.s.cfg.MaxInflightPerConn {
				// Stop decoding; the completion that brings inflight under the limit wakes us.
				// The unread bytes stay in gnet's inbound buffer; a client that keeps pushing
				// while we are paused is bounded by the check below.
				c.paused = true
				if c.gc.InboundBuffered() > 2*int(c.s.cfg.SocketRequestMaxByte)+4 {
					c.log.Warn("closing connection: inbound backlog too large while paused",
						zap.Int("buffered", c.gc.InboundBuffered()))
					mInboundOverflow.Inc()
					return gnet.Close
				}
				return gnet.None
			}
			c.paused = false
			hdr, err := c.gc.Peek(4)
			if err != nil || len(hdr) < 4 {
				return gnet.None
			}
			size := int32(binary.BigEndian.Uint32(hdr))
			if !c.frameSizeOK(size) {
				return gnet.Close
			}
			_, _ = c.gc.Discard(4)
			c.frame = newFrame(size)
			c.need, c.filled = int(size), 0
		}
		n, _ := c.gc.Read(c.frame.B[c.filled:c.need])
		c.filled += n
		if c.filled < c.need {
			return gnet.None
		}
		f := c.frame
		c.frame = nil
		if !c.deliver(f) {
			return gnet.Close
		}
	}
}

// frameSizeOK checks a frame's size prefix; false (logged and counted) closes the connection.
func (c *conn) frameSizeOK(size int32) bool {
	min := int32(8) // api key, version, correlation id, client id length
	if c.rawTokens.Load() {
		min = 1 // a raw SASL token (SaslHandshake v0) has no header: PLAIN's is a few bytes
	}
	if size < min || size > c.s.cfg.SocketRequestMaxByte {
		// Kafka's SocketServer closes on an invalid size (InvalidReceiveException).
		c.log.Warn("closing connection: invalid request size",
			zap.Int32("size", size), zap.Int32("max", c.s.cfg.SocketRequestMaxByte))
		mFrameRejected.Inc()
		return false
	}
	if c.auth != nil && !c.authed.Load() && size > c.s.cfg.SASLMaxReceive {
		// Apache bounds every receive before authentication by sasl.server.max.receive.size, so
		// an unauthenticated client cannot make the broker buffer socket.request.max.bytes.
		c.log.Warn("closing connection: frame over sasl.server.max.receive.size before authentication",
			zap.Int32("size", size), zap.Int32("max", c.s.cfg.SASLMaxReceive))
		mSASLOversized.Inc()
		return false
	}
	return true
}

// newFrame returns a pooled buffer of length size.
func newFrame(size int32) *bytebufferpool.ByteBuffer {
	f := codec.FramePool.Get()
	if cap(f.B) < int(size) {
		f.B = make([]byte, size)
	}
	f.B = f.B[:size]
	return f
}

// deliver hands one complete frame to the executor; false closes the connection.
func (c *conn) deliver(f *bytebufferpool.ByteBuffer) bool {
	r := &request{c: c, seq: c.nextSeq, frame: f}
	c.nextSeq++
	c.inflight.Add(1)
	mBytesIn.Add(len(f.B) + 4)
	return c.enqueue(r)
}

// enqueue hands r to the executor; false means the executor queue is full, which the inflight
// pause makes impossible unless something is broken, so the caller closes the connection.
func (c *conn) enqueue(r *request) bool {
	if c.exec.TryPush(r) {
		return true
	}
	c.log.Error("closing connection: executor queue full", zap.Int("queued", c.exec.Len()))
	r.release()
	return false
}

// run is the connection's executor (the mailbox's drainer): it handles queued requests one at
// a time, in order.
func (c *conn) run(rs []*request) {
	r := rs[0]
	c.waitMuted()
	if c.closed.Load() {
		r.release()
		return
	}
	c.s.handle(r)
}

// release returns the request's frame to the pool; the decoded request aliases it, so this runs
// only once the handler no longer needs the request.
func (r *request) release() {
	if r.frame != nil {
		codec.FramePool.Put(r.frame)
		r.frame = nil
	}
}

// complete records the response (nil = none, for acks=0 Produce) for r and writes every response
// that is now contiguous with what was already written.
func (c *conn) complete(r *request, resp *bytebufferpool.ByteBuffer) {
	if !r.done.CompareAndSwap(false, true) {
		panic("BUG: request completed twice")
	}
	r.release()
	c.writeMu.Lock()
	c.ready[r.seq] = resp
	var bufs [][]byte
	var owned []*bytebufferpool.ByteBuffer
	for {
		b, ok := c.ready[c.nextWrite]
		if !ok {
			break
		}
		delete(c.ready, c.nextWrite)
		c.nextWrite++
		if b != nil {
			bufs = append(bufs, b.B)
			owned = append(owned, b)
			mBytesOut.Add(len(b.B))
		}
		c.inflight.Add(-1)
	}
	if len(bufs) == 0 {
		c.writeMu.Unlock()
		c.maybeResume()
		return
	}
	var n int64
	for _, b := range bufs {
		n += int64(len(b))
	}
	c.noteOutbound(c.outPending.Add(n) + c.outBuffered.Load())
	err := c.t.writev(bufs, func(err error, buffered int64) {
		for _, b := range owned {
			codec.ResponsePool.Put(b)
		}
		if err != nil { // closed meanwhile: nothing is buffered any more
			c.outPending.Add(-n)
			return
		}
		c.outBuffered.Store(buffered)
		c.noteOutbound(c.outPending.Add(-n) + buffered)
	})
	c.writeMu.Unlock()
	if err != nil {
		// The connection is gone; the buffers may already be queued, so let the GC have them.
		return
	}
}

// noteOutbound closes the connection once its unwritten response bytes pass
// connection.max.outbound.bytes: the client is not reading (NATS's slow-consumer rule). Without
// the cap a consumer that stops reading while it keeps sending Fetch requests makes the broker
// buffer responses without bound. Logged and counted once per connection.
func (c *conn) noteOutbound(backlog int64) {
	max := c.s.cfg.ConnMaxOutboundBytes
	if max <= 0 || backlog <= max || !c.slowClosed.CompareAndSwap(false, true) {
		return
	}
	mSlowConsumerCloses.Inc()
	c.closeWith("slow consumer: unread response bytes over connection.max.outbound.bytes",
		zap.Int64("backlog", backlog), zap.Int64("max", max))
}

// maybeResume wakes the loop if decoding was paused and there is room again.
func (c *conn) maybeResume() {
	if int(c.inflight.Load()) < c.s.cfg.MaxInflightPerConn && !c.closed.Load() {
		c.t.wake()
	}
}

// onResume runs on the loop: decode whatever was left buffered while paused.
func (c *conn) onResume() error {
	if c.closed.Load() {
		return nil
	}
	if c.onTraffic() == gnet.Close {
		return c.gc.Close()
	}
	return nil
}

// closeWith logs why and closes the connection (safe from any goroutine).
func (c *conn) closeWith(msg string, fields ...zap.Field) {
	c.log.Warn("closing connection: "+msg, fields...)
	c.t.close()
}

// transport moves a connection's bytes. Plain listeners use gnet (gnetTransport); TLS listeners
// use a crypto/tls connection served by two goroutines of its own (tls_conn.go), so the blocking
// TLS reads and writes never run on a gnet event loop. Both feed the same pipeline: frames go
// to conn.deliver, responses leave through conn.complete in request order.
type transport interface {
	// writev queues bufs after everything queued before; done runs once they are written (or
	// the connection is gone, err != nil) with the bytes still buffered for the socket.
	writev(bufs [][]byte, done func(err error, buffered int64)) error
	// wake resumes decoding paused at max.inflight.requests.per.connection.
	wake()
	// close closes the connection; closeAfterWrites closes it once what writev queued has been
	// written (a SASL failure answers, then closes).
	close()
	closeAfterWrites()
}

// gnetTransport is a connection of a gnet loop. gnet runs AsyncWritev callbacks at high priority
// and Close at low priority on the same loop, and flushes its outbound buffer on close, so a
// Close after a write never drops the write.
type gnetTransport struct {
	c  *conn
	gc gnet.Conn
}

func (t gnetTransport) writev(bufs [][]byte, done func(error, int64)) error {
	c := t.c
	return t.gc.AsyncWritev(bufs, func(gc gnet.Conn, err error) error {
		if err != nil {
			done(err, 0)
			return nil
		}
		// On the loop: OutboundBuffered is what the socket has not taken yet.
		done(nil, int64(gc.OutboundBuffered()))
		if c.paused && int(c.inflight.Load()) < c.s.cfg.MaxInflightPerConn {
			return c.onResume()
		}
		return nil
	})
}

func (t gnetTransport) wake() {
	c := t.c
	_ = t.gc.Wake(func(gc gnet.Conn, err error) error {
		if err != nil || !c.paused {
			return nil
		}
		return c.onResume()
	})
}

func (t gnetTransport) close()            { _ = t.gc.Close() }
func (t gnetTransport) closeAfterWrites() { _ = t.gc.Close() }
