package server

import (
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/coord/quota"
)

// Client quota enforcement (KIP-13 byte rates, KIP-124 request_percentage, KIP-219 muting).
//
//	handler ─▶ usage recorded (produce: record bytes; request: handler time) ─┐
//	reply   ─▶ fetch: response bytes recorded ─────────────────────────────────┤
//	                                                                           ▼
//	         throttle = max over the kinds ─▶ throttle_time_ms in the response
//	                                        └▶ conn.mutedUntil: the executor runs the
//	                                           connection's next request only after it
//
// The response leaves at once (KIP-219: the client backs off too, and the broker reads no
// further request from the connection meanwhile). Muting parks the connection's executor
// goroutine on a timer, never a gnet event loop; the unread requests stay in gnet's buffers
// under the usual in-flight bound. Deviation: Apache answers a Fetch that trips the quota with
// an empty response; kaas delivers it and mutes for the overshoot, which keeps the same rate.

// quotaUser is the user quota entity of the connection: the principal's name (User:alice → alice).
func (rc *reqCtx) quotaUser() string {
	p := rc.c.principal()
	if i := strings.IndexByte(p, ':'); i >= 0 {
		return p[i+1:]
	}
	return p
}

func (rc *reqCtx) quotaClient() string {
	if rc.hdr.ClientID != nil {
		return *rc.hdr.ClientID
	}
	return ""
}

// recordUsage adds v of kind to this request's client and keeps the longest throttle.
func (rc *reqCtx) recordUsage(k quota.Kind, v float64) {
	q := rc.s.deps.Quotas
	if q == nil || !q.Active() {
		return
	}
	if d := q.Record(k, rc.quotaUser(), rc.quotaClient(), v); d > 0 {
		rc.throttleAtLeast(d)
	}
}

func (rc *reqCtx) throttleAtLeast(d time.Duration) {
	for {
		cur := rc.throttle.Load()
		if int64(d) <= cur || rc.throttle.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// applyThrottle writes the throttle into resp and mutes the connection for it.
func (rc *reqCtx) applyThrottle(resp kmsg.Response) {
	d := time.Duration(rc.throttle.Load())
	if d <= 0 {
		return
	}
	if tr, ok := resp.(interface {
		kmsg.ThrottleResponse
		kmsg.SetThrottleResponse
	}); ok {
		ms := d.Milliseconds()
		if cur, _ := tr.Throttle(); int64(cur) < ms {
			tr.SetThrottle(int32(ms))
		}
	}
	rc.c.muteFor(d)
}

// muteFor keeps the executor from starting the connection's next request for d.
func (c *conn) muteFor(d time.Duration) {
	until := time.Now().Add(d).UnixNano()
	for {
		cur := c.mutedUntil.Load()
		if until <= cur || c.mutedUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// waitMuted runs on the executor before each request: it parks until the mute passes or the
// connection closes.
func (c *conn) waitMuted() {
	d := time.Until(time.Unix(0, c.mutedUntil.Load()))
	if d <= 0 {
		return
	}
	mMutedWaits.Inc()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.quit:
	}
}
