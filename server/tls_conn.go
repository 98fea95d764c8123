package server

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
)

// tlsHandshakeTimeout bounds a TLS handshake; a client that connects and says nothing must not
// hold a goroutine forever.
const tlsHandshakeTimeout = 10 * time.Second

// startTLS binds an SSL / SASL_SSL listener and starts its accept loop.
func (l *listener) startTLS() error {
	nl, err := net.Listen("tcp", l.cfg.Addr())
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", l.cfg.Addr(), err)
	}
	l.nl = nl
	l.conns = map[*tlsTransport]struct{}{}
	l.bound.Store(nl.Addr().(*net.TCPAddr))
	base := &tls.Config{GetConfigForClient: l.tls.configForClient}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			nc, err := nl.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					l.s.log.Warn("TLS accept failed; listener stops", zap.String("listener", l.name), zap.Error(err))
				}
				return
			}
			if tc, ok := nc.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
				_ = tc.SetKeepAlivePeriod(time.Minute)
			}
			l.serveTLS(tls.Server(nc, base))
		}
	}()
	return nil
}

// tlsTransport is one TLS connection: the reader goroutine handshakes, derives the principal and
// frames requests; the writer goroutine writes queued responses in order, coalescing them through
// a buffer into as few TLS records as it can.
//
//	reader goroutine                         writer goroutine
//	────────────────                         ────────────────
//	handshake → principal                    wait for kick
//	loop: pause at max in flight             take the queue (in order)
//	      read size, frame → conn.deliver    write + flush → done callbacks
//	exit: close, release frame, gauges       exit on close (queued callbacks get an error)
//
// Lock order: mu is a leaf (taken under conn.writeMu by writev).
type tlsTransport struct {
	c  *conn
	tc *tls.Conn

	mu         sync.Mutex
	queue      []tlsWrite
	closing    bool // closeAfterWrites: close once the queue drains
	kick       chan struct{}
	resume     chan struct{}
	done       chan struct{} // closed by close
	closeOnce  sync.Once
	readerDone chan struct{}
}

type tlsWrite struct {
	bufs [][]byte
	done func(error, int64)
}

func (l *listener) serveTLS(tc *tls.Conn) {
	addr := tc.RemoteAddr().String()
	c := newConn(l.s, l, addr)
	t := &tlsTransport{c: c, tc: tc, kick: make(chan struct{}, 1), resume: make(chan struct{}, 1),
		done: make(chan struct{}), readerDone: make(chan struct{})}
	c.t = t
	l.connMu.Lock()
	l.conns[t] = struct{}{}
	l.connMu.Unlock()
	mConnsOpened.Inc()
	mConnsOpen.Inc()
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		t.readLoop()
	}()
	go func() {
		defer l.wg.Done()
		t.writeLoop()
	}()
}

func (t *tlsTransport) readLoop() {
	c := t.c
	defer func() {
		t.close()
		c.closed.Store(true)
		close(c.quit) // releases an executor muted by a quota throttle (quotas.go)
		l := c.ln
		l.connMu.Lock()
		delete(l.conns, t)
		l.connMu.Unlock()
		mConnsOpen.Dec()
		close(t.readerDone)
	}()
	_ = t.tc.SetDeadline(time.Now().Add(tlsHandshakeTimeout))
	if err := t.tc.Handshake(); err != nil {
		mTLSHandshakeFailures.Inc()
		c.log.Info("TLS handshake failed", zap.Error(err))
		return
	}
	_ = t.tc.SetDeadline(time.Time{})
	st := t.tc.ConnectionState()
	p := anonymous
	if len(st.PeerCertificates) > 0 {
		name, err := c.ln.tls.principal(st.PeerCertificates[0])
		if err != nil {
			mTLSHandshakeFailures.Inc()
			c.log.Warn("closing connection: no principal mapping rule matches the client certificate",
				zap.String("subject", st.PeerCertificates[0].Subject.String()))
			return
		}
		p = "User:" + name
	}
	c.setPrincipal(p)
	br := bufio.NewReaderSize(t.tc, 16<<10)
	var hdr [4]byte
	for {
		for int(c.inflight.Load()) >= c.s.cfg.MaxInflightPerConn {
			// Stop reading; TCP pushes back on the client. A completion wakes us (wake).
			select {
			case <-t.resume:
			case <-t.done:
				return
			}
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		size := int32(binary.BigEndian.Uint32(hdr[:]))
		if !c.frameSizeOK(size) {
			return
		}
		f := newFrame(size)
		if _, err := io.ReadFull(br, f.B); err != nil {
			codec.FramePool.Put(f)
			return
		}
		if !c.deliver(f) {
			return
		}
	}
}

func (t *tlsTransport) writeLoop() {
	bw := bufio.NewWriterSize(t.tc, 64<<10)
	var err error
	for {
		select {
		case <-t.kick:
		case <-t.done:
			t.failQueued()
			return
		}
		t.mu.Lock()
		q := t.queue
		t.queue = nil
		closing := t.closing
		t.mu.Unlock()
		for _, w := range q {
			for _, b := range w.bufs {
				if err == nil {
					_, err = bw.Write(b)
				}
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		for _, w := range q {
			w.done(err, 0)
		}
		if err != nil || (closing && t.queueEmpty()) {
			t.close()
		}
		t.wake()
	}
}

func (t *tlsTransport) queueEmpty() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue) == 0
}

func (t *tlsTransport) failQueued() {
	t.mu.Lock()
	q := t.queue
	t.queue = nil
	t.mu.Unlock()
	for _, w := range q {
		w.done(net.ErrClosed, 0)
	}
}

func (t *tlsTransport) writev(bufs [][]byte, done func(error, int64)) error {
	t.mu.Lock()
	select {
	case <-t.done:
		t.mu.Unlock()
		return net.ErrClosed
	default:
	}
	t.queue = append(t.queue, tlsWrite{bufs: bufs, done: done})
	t.mu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
	return nil
}

func (t *tlsTransport) wake() {
	select {
	case t.resume <- struct{}{}:
	default:
	}
}

func (t *tlsTransport) close() {
	t.closeOnce.Do(func() {
		close(t.done)
		_ = t.tc.Close()
	})
}

func (t *tlsTransport) closeAfterWrites() {
	t.mu.Lock()
	t.closing = true
	empty := len(t.queue) == 0
	t.mu.Unlock()
	if empty {
		// Nothing queued: either already written (close now) or about to be queued by the
		// writev that follows — a kick makes the writer look at closing again.
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}
