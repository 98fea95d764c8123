package server

import (
	"math"
	"testing"
	"time"
)

func fxSessionParts(n int) ([]fetchPartReq, []fetchPartResult) {
	parts := make([]fetchPartReq, n)
	res := make([]fetchPartResult, n)
	for i := range parts {
		parts[i] = fetchPartReq{topic: "t", partition: int32(i)}
		res[i] = fetchPartResult{hwm: 5, logStart: 0}
	}
	return parts, res
}

// Kafka's eviction: a stale LRU session goes first; otherwise only a strictly smaller session
// makes room.
func TestFetchSessionCacheEviction(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newFetchSessionCache(2)
	c.now = func() time.Time { return now }

	p2, r2 := fxSessionParts(2)
	p3, r3 := fxSessionParts(3)
	a := c.create(p2, r2, false)
	b := c.create(p3, r3, false)
	if a == 0 || b == 0 || a == b {
		t.Fatalf("ids %d %d", a, b)
	}
	// Same size as the smallest (2): no room.
	if id := c.create(p2, r2, false); id != 0 {
		t.Fatalf("equal-size newcomer evicted a session: %d", id)
	}
	// Bigger than the smallest: evicts a (size 2).
	p4, r4 := fxSessionParts(4)
	d := c.create(p4, r4, false)
	if d == 0 || c.sessions[a] != nil || c.sessions[b] == nil {
		t.Fatalf("bigger newcomer: id %d, a present %v, b present %v", d, c.sessions[a] != nil, c.sessions[b] != nil)
	}
	// After two idle minutes the least recently used (b) goes, whatever its size.
	now = now.Add(fetchSessionEvictIdle + time.Second)
	c.sessions[d].lastUsed = now // d was just used
	c.lru.MoveToBack(c.sessions[d].lru)
	p1, r1 := fxSessionParts(1)
	e := c.create(p1, r1, false)
	if e == 0 || c.sessions[b] != nil || c.sessions[d] == nil || c.len() != 2 {
		t.Fatalf("stale eviction: id %d b present %v d present %v", e, c.sessions[b] != nil, c.sessions[d] != nil)
	}
}

func TestFetchSessionCacheZeroSlots(t *testing.T) {
	c := newFetchSessionCache(0)
	p, r := fxSessionParts(1)
	if id := c.create(p, r, false); id != 0 || c.len() != 0 {
		t.Fatalf("session created with no slots: %d", id)
	}
}

func TestNextFetchEpoch(t *testing.T) {
	for _, c := range [][2]int32{{0, 1}, {1, 2}, {math.MaxInt32, 1}, {-1, -1}} {
		if got := nextFetchEpoch(c[0]); got != c[1] {
			t.Errorf("nextFetchEpoch(%d) = %d, want %d", c[0], got, c[1])
		}
	}
}
