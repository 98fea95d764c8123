package cluster

import (
	"sync"
	"time"
)

// Clock is the time source of the lease deadline and of every wait in this package. Production
// uses RealClock (time.Now carries a monotonic reading, so deadlines survive wall-clock steps);
// tests use a ManualClock so that lease expiry and renewals happen exactly when the test says.
type Clock interface {
	Now() time.Time
	// After behaves like time.After on this clock: the channel receives once the clock has
	// advanced by d (at once when d <= 0).
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// RealClock is the process clock.
var RealClock Clock = realClock{}

// ManualClock is a Clock that moves only when Advance is called. Timers created by After fire
// during the Advance that reaches them. A Fake backend registers itself so that leases expire
// inside Advance, before the timers fire: code woken by a timer already sees the expiry.
type ManualClock struct {
	mu      sync.Mutex // Lock order: leaf (hooks and timers run after it is released)
	now     time.Time
	timers  []manualTimer
	onTicks []func(time.Time)
}

type manualTimer struct {
	at time.Time
	ch chan time.Time
}

// NewManualClock starts at start (a zero start means a fixed arbitrary instant).
func NewManualClock(start time.Time) *ManualClock {
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &ManualClock{now: start}
}

// Now returns the current manual time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives when the clock reaches Now()+d.
func (c *ManualClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, manualTimer{at: c.now.Add(d), ch: ch})
	return ch
}

// Pending is the number of timers not yet fired; tests wait on it to know a goroutine is
// parked on the clock before they advance it.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Advance moves the clock forward by d, runs the tick hooks (lease expiry), then fires every
// timer that is due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	hooks := append([]func(time.Time){}, c.onTicks...)
	c.mu.Unlock()
	for _, h := range hooks {
		h(now)
	}
	c.mu.Lock()
	var due []manualTimer
	kept := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(now) {
			due = append(due, t)
		} else {
			kept = append(kept, t)
		}
	}
	c.timers = kept
	c.mu.Unlock()
	for _, t := range due {
		t.ch <- now
	}
}

// onTick registers a hook run inside every Advance, before timers fire.
func (c *ManualClock) onTick(f func(time.Time)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onTicks = append(c.onTicks, f)
}
