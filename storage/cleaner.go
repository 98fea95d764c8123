package storage

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/kaas-go/kaas/codec"
	"go.uber.org/zap"
)

// Log compaction (cleanup.policy=compact, or compact,delete), with Apache's LogCleaner
// semantics.
//
// What a clean of one partition does:
//
//	closed segments          dirty (never cleaned, or newer than the last clean)   uncleanable
//	[ clean ... | firstDirty ...................................... cleanEnd ) [ ... LSO / active
//
//   - The cleanable range is the closed segments from the log start up to the first segment that
//     reaches the LSO (records at or above the LSO are never cleaned), is younger than
//     min.compaction.lag.ms, or is the active segment (never cleaned).
//   - Map: the latest offset of every key in the dirty part (bounded by
//     log.cleaner.dedupe.buffer.size; a map that fills stops at a segment boundary, and the rest
//     stays dirty for the next clean).
//   - Rewrite: every segment of [log start, cleanEnd) is rewritten, and consecutive segments go
//     into one new segment (a group) while they fit, as Apache's groupSegmentsBySize: the
//     group's cleaned bytes stay within segment.bytes and every offset in it within 2^31-1 of
//     its base (the 32-bit relative offsets of the .index and .timeindex, segment.go). The group
//     takes its first segment's base offset and ends where its last one ended; offsets are
//     kept, so the new files have gaps. A segment that may not fit is staged in memory (up to
//     cleanerStageBytes) until its cleaned size is known, so segments a clean empties merge
//     into their neighbour in that same clean (see groupFits).
//     A record survives if no later offset of its key is in the map. Records of aborted
//     transactions go. A tombstone, or a COMMIT/ABORT marker whose transaction has no batch
//     left (an emptied batch kept as its producer's last counts), stays until delete.retention.ms after the clean that first saw it (KIP-534: that
//     clean stamps a delete horizon into the batch, so the rule survives restarts); a later
//     clean removes it.
//     An ABORT marker whose records this clean removed is kept (and its aborted-index entry
//     with it), as Apache does, so its removal waits for the next clean. The last data batch
//     of every producer known to the producer state stays, with no records if need be, so
//     idempotent sequence checks after a restart see the same last sequence.
//   - Swap (swapCleaned): each group is written as <first source's name>.cleaned and fsync'd,
//     then a swap marker (cleaner.swap, atomic) names the groups, one line each: the group's
//     name, then the names of its other sources. Group by group, each .cleaned file is renamed
//     over its first source's name and the other sources' files are deleted; then the
//     directory is fsync'd and the marker removed. Recovery (recoverCleanerSwap) rolls forward
//     when the marker exists (every .cleaned file it needs was durable before it was written:
//     it renames what is left and deletes the sources still there) and otherwise deletes stray
//     .cleaned files: the old set or the new set, never a mix.
//
//	  write *.cleaned + fsync ─► dir fsync ─► marker (atomic) ─► per group: rename its files,
//	  delete its other sources ─► dir fsync ─► publish the list ─► rm marker
//
//	  crash before the marker: old set (recovery deletes the .cleaned files)
//	  crash after it:          new set (recovery finishes the renames and the deletions)
//
// Produce and fetch run during the whole clean; only the swap (the renames, the deletions of
// merged sources and two directory fsyncs) holds the append mutex. Locks: the swap takes
// Partition.mu, then txnIndex.mu (the order partition.go documents); segMu only after mu is
// released, to close the old files. Readers that loaded the old segment list keep reading the
// old files through their open handles (a renamed-over or deleted file stays readable while
// open), which are closed only once the swap has published the new list and no reader holds
// segMu.
//
// Transactions: aborted transactions come from the partition's aborted index (which covers the
// whole retained log). The aborted index, the producer state and the LSO after a clean: the
// index loses the entries of removed ABORT markers (memory and the rewritten .txnindex files);
// the producer state is untouched (the last batch of each producer is kept, and snapshots are
// taken at rolls, above the cleaned range); the LSO is above the cleaned range by construction.
//
// Compressed batches are decompressed to read their keys (cleaner_codec.go), and a batch that
// loses records is written back in its own codec (Apache does the same); one that keeps all of
// them is copied as it is. Aborted batches go whole without being decompressed.
//
// Cluster mode: the cleaner runs on the partition leader (the partitions loaded here). It groups
// the same way, writes files named with the leader's epoch and commits them with a manifest
// (one entry per group) instead of the swap; see cleaner_cluster.go.

// CleanerConfig configures the background cleaner (Apache's log.cleaner.* broker configs).
type CleanerConfig struct {
	// Enable is log.cleaner.enable. Without it no background cleaner runs (RunCleaner still
	// cleans when called).
	Enable bool
	// Threads is log.cleaner.threads: partitions cleaned at the same time (default 1).
	Threads int
	// IOMaxBytesPerSecond is log.cleaner.io.max.bytes.per.second: read plus write bytes of all
	// cleaner threads together (0 or +Inf: unlimited).
	IOMaxBytesPerSecond float64
	// DedupeBufferSize is log.cleaner.dedupe.buffer.size: memory for the key → offset map of
	// all threads together (default 128 MiB).
	DedupeBufferSize int64
	// Backoff is log.cleaner.backoff.ms: pause between checks when nothing needs cleaning.
	Backoff time.Duration
	// Now is the clock (tests inject one); nil = time.Now.
	Now func() time.Time
}

// Apache defaults.
const (
	DefaultCleanerDedupeBufferSize = 128 << 20
	DefaultCleanerBackoff          = 15 * time.Second
)

// cleanerStageBytes bounds the output of one source segment a clean holds in memory to learn
// whether it still fits in the group being written (see groupFits).
const cleanerStageBytes = 1 << 20

// dedupeEntryOverhead is what one map entry costs besides its key bytes (Go map slot, string
// header, offset).
const dedupeEntryOverhead = 48

var (
	cleanerBytesReadTotal    = metrics.NewCounter("kaas_cleaner_bytes_read_total")
	cleanerBytesWrittenTotal = metrics.NewCounter("kaas_cleaner_bytes_written_total")
	cleanerCleansTotal       = metrics.NewCounter("kaas_cleaner_cleans_total")
	cleanerErrorsTotal       = metrics.NewCounter("kaas_cleaner_errors_total")
	// Segments a clean merged into the group before them (their files are gone).
	cleanerSegmentsMergedTotal = metrics.NewCounter("kaas_cleaner_segments_merged_total")
	// Limit: a staged source whose output passed cleanerStageBytes before its end, while the
	// group still had more room than that: it starts a group of its own.
	cleanerStageFullTotal = metrics.NewCounter("kaas_cleaner_stage_full_total")
	// Limits: the I/O throttle and the dedupe buffer.
	cleanerThrottledSeconds = metrics.NewFloatCounter("kaas_cleaner_throttled_seconds_total")
	cleanerDedupeFullTotal  = metrics.NewCounter("kaas_cleaner_dedupe_buffer_full_total")
	cleanerLastDuration     atomic.Uint64 // float64 bits, seconds
	_                       = metrics.NewGauge("kaas_cleaner_last_clean_duration_seconds", func() float64 {
		return math.Float64frombits(cleanerLastDuration.Load())
	})
	cleanerOfflineGauge atomic.Int64
	_                   = metrics.NewGauge("kaas_cleaner_offline_partitions", func() float64 {
		return float64(cleanerOfflineGauge.Load())
	})
	dirtyRatios sync.Map // gauge name → *atomic.Uint64 (float64 bits)
)

// setDirtyRatio publishes a partition's dirty ratio as kaas_cleaner_dirty_ratio{topic,partition}.
// The value lives in dirtyRatios, so a partition reopened under the same name feeds the same
// gauge.
func setDirtyRatio(topic string, part int32, ratio float64) {
	name := fmt.Sprintf(`kaas_cleaner_dirty_ratio{topic=%q,partition="%d"}`, topic, part)
	v, ok := dirtyRatios.Load(name)
	if !ok {
		nv := new(atomic.Uint64)
		if v, ok = dirtyRatios.LoadOrStore(name, nv); !ok {
			metrics.GetOrCreateGauge(name, func() float64 { return math.Float64frombits(nv.Load()) })
		}
	}
	v.(*atomic.Uint64).Store(math.Float64bits(ratio))
}

// compacted and deletes read cleanup.policy.
func (c *TopicConfig) compacted() bool { return strings.Contains(c.CleanupPolicy, "compact") }
func (c *TopicConfig) deletes() bool   { return strings.Contains(c.CleanupPolicy, "delete") }

// inertValue is the value of a TopicConfig.Inert key (its default when not overridden).
func (c *TopicConfig) inertValue(name string) string {
	for i := range inertKeys {
		if inertKeys[i].name == name {
			if v := c.Inert[i]; v != "" {
				return v
			}
			return inertKeys[i].def
		}
	}
	return ""
}

func (c *TopicConfig) inertInt(name string) int64 {
	n, _ := strconv.ParseInt(c.inertValue(name), 10, 64)
	return n
}

// maxSegmentMs is when the active segment rolls by time: segment.ms, or on a compacted topic
// max.compaction.lag.ms if smaller, so the records of a quiet active segment still become
// cleanable within the lag (Apache LogConfig.maxSegmentMs, KIP-354).
func (c *TopicConfig) maxSegmentMs() int64 {
	if c.CleanupPolicy == "delete" {
		return c.SegmentMs
	}
	return min(c.SegmentMs, c.MaxCompactionLagMs())
}

// DeleteRetentionMs is delete.retention.ms.
func (c *TopicConfig) DeleteRetentionMs() int64 { return c.inertInt("delete.retention.ms") }

// MinCompactionLagMs is min.compaction.lag.ms.
func (c *TopicConfig) MinCompactionLagMs() int64 { return c.inertInt("min.compaction.lag.ms") }

// MaxCompactionLagMs is max.compaction.lag.ms.
func (c *TopicConfig) MaxCompactionLagMs() int64 { return c.inertInt("max.compaction.lag.ms") }

// MinCleanableDirtyRatio is min.cleanable.dirty.ratio.
func (c *TopicConfig) MinCleanableDirtyRatio() float64 {
	f, _ := strconv.ParseFloat(c.inertValue("min.cleanable.dirty.ratio"), 64)
	return f
}

// ---- token bucket ----

// ioLimiter is a token bucket shared by the cleaner threads (log.cleaner.io.max.bytes.per.second).
// Its burst is one second of rate, so a clean never overshoots by more than that.
type ioLimiter struct {
	mu     sync.Mutex
	rate   float64 // bytes per second; <= 0: unlimited
	tokens float64
	last   time.Time
}

func newIOLimiter(rate float64) *ioLimiter {
	if math.IsInf(rate, 1) || rate >= math.MaxFloat64/2 {
		rate = 0
	}
	return &ioLimiter{rate: rate, tokens: rate, last: time.Now()}
}

// wait takes n tokens, sleeping until they are there (or stop closes).
func (l *ioLimiter) wait(n int, stop <-chan struct{}) {
	if l == nil || l.rate <= 0 {
		return
	}
	l.mu.Lock()
	now := time.Now()
	l.tokens = min(l.rate, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	l.last = now
	l.tokens -= float64(n)
	debt := -l.tokens
	l.mu.Unlock()
	if debt <= 0 {
		return
	}
	d := time.Duration(debt / l.rate * float64(time.Second))
	cleanerThrottledSeconds.Add(d.Seconds())
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// ---- the background cleaner ----

// cleaner runs the cleans of one Store: a check every Backoff, then up to Threads partitions
// cleaned in parallel, dirtiest first.
type cleaner struct {
	s       *Store
	cfg     CleanerConfig
	limiter *ioLimiter
	stop    chan struct{}
	done    chan struct{}
}

func (s *Store) newCleaner() *cleaner {
	cfg := s.cfg.Cleaner
	if cfg.Threads <= 0 {
		cfg.Threads = 1
	}
	if cfg.DedupeBufferSize <= 0 {
		cfg.DedupeBufferSize = DefaultCleanerDedupeBufferSize
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultCleanerBackoff
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &cleaner{s: s, cfg: cfg, limiter: newIOLimiter(cfg.IOMaxBytesPerSecond), stop: make(chan struct{}), done: make(chan struct{})}
}

// startCleaner starts the background cleaner (Open, when log.cleaner.enable is on).
func (s *Store) startCleaner() {
	c := s.newCleaner()
	s.cleaner = c
	go c.loop()
}

func (c *cleaner) close() {
	close(c.stop)
	<-c.done
}

func (c *cleaner) loop() {
	defer close(c.done)
	t := time.NewTimer(c.cfg.Backoff)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.runOnce(false)
		t.Reset(c.cfg.Backoff)
	}
}

// candidate is a partition the check found worth cleaning.
type candidate struct {
	p     *Partition
	ratio float64
}

// runOnce checks every loaded compacted partition and cleans those that need it (all of them
// with force), Threads at a time. It returns the first error.
func (c *cleaner) runOnce(force bool) error {
	now := c.cfg.Now()
	var cands []candidate
	for _, t := range c.s.Topics() {
		cfg := t.cfg.Load()
		if !cfg.compacted() {
			continue
		}
		for _, p := range *t.parts.Load() {
			if !p.Loaded() || p.cleanerOffline.Load() {
				continue
			}
			plan := p.planClean(now)
			setDirtyRatio(t.Name, p.id, plan.ratio)
			if plan.cleanable > 0 && (force || plan.needed) {
				cands = append(cands, candidate{p: p, ratio: plan.ratio})
			}
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].ratio > cands[j].ratio })
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	work := make(chan *Partition)
	for range min(c.cfg.Threads, len(cands)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				if err := c.cleanPartition(p, now); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, cd := range cands {
		select {
		case work <- cd.p:
		case <-c.stop:
		}
	}
	close(work)
	wg.Wait()
	return firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// cleanPartition cleans p once; an error takes p's cleaning offline (Apache marks the partition
// uncleanable), while p keeps serving produce and fetch.
func (c *cleaner) cleanPartition(p *Partition, now time.Time) error {
	// One clean per partition at a time (the background loop and RunCleaner may meet): two
	// would write the same .cleaned files.
	if !p.cleanMu.TryLock() {
		return nil
	}
	defer p.cleanMu.Unlock()
	start := time.Now()
	st, err := p.clean(now, c.cfg.DedupeBufferSize/int64(c.cfg.Threads), c.limiter, c.stop)
	if err != nil {
		if errors.Is(err, errCleanAborted) || errors.Is(err, ErrFenced) {
			// The partition changed under the clean (retention, shutdown, release): next time.
			// Fenced (cluster mode, Rule P): the store publishes nothing any more.
			return nil
		}
		cleanerErrorsTotal.Inc()
		if !p.cleanerOffline.Swap(true) {
			cleanerOfflineGauge.Add(1)
		}
		p.log.Error("log cleaner failed; cleaning of this partition is offline until restart", zap.Error(err))
		return fmt.Errorf("cannot clean partition (%s-%d): %w", p.topic.Name, p.id, err)
	}
	if st.segments > 0 {
		d := time.Since(start)
		cleanerLastDuration.Store(math.Float64bits(d.Seconds()))
		cleanerCleansTotal.Inc()
		p.log.Info("cleaned log", zap.Int("segments", st.segments), zap.Int("merged", st.merged), zap.Int64("bytesRead", st.read),
			zap.Int64("bytesWritten", st.written), zap.Duration("took", d))
	}
	return nil
}

// RunCleaner cleans every compacted partition that has cleanable segments once, whatever its
// dirty ratio (tests, benchmarks, the cleaner's own loop uses the ratio). now is the cleaner's
// clock (lag and delete horizons). It returns the first error; the failing partitions' cleaning
// goes offline as in the background loop.
func (s *Store) RunCleaner(now time.Time) error {
	c := s.newCleaner()
	c.cfg.Now = func() time.Time { return now }
	if s.cleaner != nil {
		c.limiter = s.cleaner.limiter
	}
	return c.runOnce(true)
}

// FirstDirtyOffset is where the last clean of this partition ended: offsets below it are
// compacted (0 before the first clean).
func (p *Partition) FirstDirtyOffset() int64 { return p.cleanedTo.Load() }

// CleaningOffline reports whether a cleaner error took this partition's cleaning offline.
func (p *Partition) CleaningOffline() bool { return p.cleanerOffline.Load() }

// ---- one clean ----

// cleanPlan is what planClean found.
type cleanPlan struct {
	segs      []*segment // the list the plan was made on
	cleanable int        // segs[:cleanable] may be cleaned
	dirtyFrom int        // index of the first dirty segment
	ratio     float64
	needed    bool
}

// planClean picks the cleanable segments of p (see the comment at the top of this file).
func (p *Partition) planClean(now time.Time) cleanPlan {
	cfg := p.config()
	p.mu.Lock()
	segs := *p.segs.Load()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return cleanPlan{}
	}
	lso := p.LastStableOffset()
	nowMs := now.UnixMilli()
	minLag := cfg.MinCompactionLagMs()
	plan := cleanPlan{segs: segs}
	for i := 0; i < len(segs)-1; i++ { // never the active segment
		next, maxTs, _ := segs[i].stats()
		if next > lso || (minLag > 0 && maxTs > nowMs-minLag) {
			break
		}
		plan.cleanable = i + 1
	}
	firstDirty := p.cleanedTo.Load()
	var total, dirty int64
	plan.dirtyFrom = plan.cleanable
	for i := 0; i < plan.cleanable; i++ {
		size := segs[i].size.Load()
		total += size
		if next, _, _ := segs[i].stats(); next > firstDirty {
			if plan.dirtyFrom == plan.cleanable {
				plan.dirtyFrom = i
			}
			dirty += size
		}
	}
	if total > 0 {
		plan.ratio = float64(dirty) / float64(total)
	}
	if plan.dirtyFrom == plan.cleanable {
		// Nothing dirty: only a forced clean (RunCleaner) rewrites the range, e.g. to remove
		// tombstones whose delete horizon passed.
		return plan
	}
	plan.needed = plan.ratio >= cfg.MinCleanableDirtyRatio()
	if maxLag := cfg.MaxCompactionLagMs(); !plan.needed && maxLag < math.MaxInt64 {
		// max.compaction.lag.ms: the oldest dirty segment waited too long. Its age is its
		// largest timestamp (a lower bound of its records' wait).
		if _, maxTs, _ := segs[plan.dirtyFrom].stats(); maxTs >= 0 && nowMs-maxTs > maxLag {
			plan.needed = true
		}
	}
	return plan
}

type cleanStats struct {
	segments      int // source segments cleaned
	merged        int // of them, merged into a group's first (no file of their own any more)
	read, written int64
}

// done records a committed clean of segments sources into groups new segments.
func (st *cleanStats) done(segments, groups int) {
	st.segments, st.merged = segments, segments-groups
	cleanerBytesReadTotal.Add(int(st.read))
	cleanerBytesWrittenTotal.Add(int(st.written))
	cleanerSegmentsMergedTotal.Add(st.merged)
}

// errCleanAborted: the partition changed while it was being cleaned; nothing was swapped.
var errCleanAborted = errors.New("partition changed during the clean")

// cleanerHooks lets tests stop a clean at a step of the swap, as a kill -9 there would (the
// files written so far stay, nothing after runs). nil in production.
var cleanerCrashAt func(step string) bool

// cleanerStepHook lets tests act between the map and the rewrite pass. nil in production.
var cleanerStepHook func(p *Partition)

// producerLast is the last data batch offset of each producer (kept by the clean).
func (p *Partition) producerLastOffsets() map[int64]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[int64]int64, len(p.producers.m))
	for pid, e := range p.producers.m {
		if e.n > 0 {
			out[pid] = e.newest().lastOffset
		}
	}
	return out
}

// txnTrack is one transaction seen by the rewrite pass.
type txnTrack struct{ retained bool }

// cleaned is one rewritten group, ready to swap in.
type cleaned struct {
	olds    []*segment // the consecutive sources; seg has olds[0]'s base and olds[len-1]'s end
	seg     *segment   // the new one: file <name>.log.cleaned until the swap
	aborted []AbortedTxn
}

// groupFits reports whether the next source (srcSize bytes, ending at srcNext) certainly fits in
// the group being written (base, pos cleaned bytes so far). As Apache's groupSegmentsBySize, a
// group stays within segment.bytes and within what the indexes can address: kaas's .index and
// .timeindex hold 32-bit offsets relative to the base, and the .index 32-bit positions
// (segment.go), so every offset of the group minus its base must fit in an int32. Apache sums
// the sources' sizes before it cleans; here the group's cleaned bytes count, and a source's
// size bounds what it adds. When that bound does not fit but the offsets do, the clean stages
// the source's output (cleanerStageBytes at most) and lets it join only if its cleaned size
// fits: a source the clean emptied or shrank merges now, not one clean later. Neither reads
// or writes anything twice.
//
// segment.index.bytes is no limit here: kaas indexes have no preallocated size (the key is
// inert, config_inert.go), and one entry per index.interval.bytes keeps them in proportion to
// the log, as on a roll.
func groupFits(base, pos, srcSize, srcNext, segBytes int64) bool {
	return pos+srcSize <= segBytes && srcNext-1-base <= math.MaxInt32
}

// withCleaned is cur with every group's sources replaced by its new segment (the sources are
// consecutive in cur: segmentsPresent checked they are all there, and nothing is ever inserted
// between two segments).
func withCleaned(cur []*segment, out []*cleaned) []*segment {
	first := make(map[*segment]*segment, len(out))
	gone := make(map[*segment]bool)
	for _, c := range out {
		first[c.olds[0]] = c.seg
		for _, o := range c.olds[1:] {
			gone[o] = true
		}
	}
	next := make([]*segment, 0, len(cur))
	for _, s := range cur {
		switch {
		case first[s] != nil:
			next = append(next, first[s])
		case !gone[s]:
			next = append(next, s)
		}
	}
	return next
}

// clean runs one clean of p. budget bounds the key map (bytes).
func (p *Partition) clean(now time.Time, budget int64, lim *ioLimiter, stop <-chan struct{}) (cleanStats, error) {
	var st cleanStats
	plan := p.planClean(now)
	if plan.cleanable == 0 {
		return st, nil
	}
	cfg := p.config()
	nowMs := now.UnixMilli()
	segs := plan.segs
	logStart := p.logStart.Load()
	// Cluster mode (cleaner_cluster.go): new names of this epoch and clean sequence, committed
	// by a manifest instead of the rename swap.
	cluster := p.nameEpoch >= 0
	var seq int64
	if cluster {
		p.cleanSeq++
		seq = p.cleanSeq
	}
	// The clean also stops when the partition shuts down (Release and the topic deletions wait
	// for it, holding Topic.mu).
	merged, done := make(chan struct{}), make(chan struct{})
	defer close(done)
	go func(outer <-chan struct{}) {
		select {
		case <-outer:
		case <-p.stop:
		case <-done:
		}
		close(merged)
	}(stop)
	stop = merged

	p.txn.mu.Lock()
	aborted := p.txn.abortedRange(logStart, math.MaxInt64)
	p.txn.mu.Unlock()
	abortedBy := make(map[int64][]AbortedTxn)
	for _, a := range aborted {
		abortedBy[a.ProducerID] = append(abortedBy[a.ProducerID], a)
	}
	isAborted := func(b codec.Batch) bool {
		if !b.IsTransactional() || b.IsControl() {
			return false
		}
		for _, a := range abortedBy[b.ProducerID()] {
			if a.FirstOffset <= b.BaseOffset() && b.BaseOffset() < a.LastOffset {
				return true
			}
		}
		return false
	}

	// Pass 1: the key map over the dirty segments, segment by segment within the budget.
	keys := make(map[string]int64)
	var used int64
	end := plan.dirtyFrom
	for i := plan.dirtyFrom; i < plan.cleanable; i++ {
		seg := segs[i]
		segKeys := make(map[string]int64)
		var segUsed int64
		err := forBatches(seg, lim, stop, &st, func(b codec.Batch) error {
			if b.IsControl() || isAborted(b) {
				return nil
			}
			return walkRecords(b, func(r *rawRecord) error {
				if !r.hasKey {
					return nil
				}
				k := string(r.key)
				if _, ok := keys[k]; !ok {
					if _, ok := segKeys[k]; !ok {
						segUsed += int64(len(k)) + dedupeEntryOverhead
					}
				}
				segKeys[k] = b.BaseOffset() + r.offDelta
				return nil
			})
		})
		if err != nil {
			return st, p.cleanFailure(err, seg, fmt.Sprintf("cannot map segment %d", seg.base))
		}
		if used+segUsed > budget && i > plan.dirtyFrom {
			cleanerDedupeFullTotal.Inc()
			break // this segment stays dirty
		}
		for k, o := range segKeys {
			keys[k] = o
		}
		used += segUsed
		end = i + 1
	}

	if cleanerStepHook != nil {
		cleanerStepHook(p)
	}

	// Pass 2: rewrite [0, end).
	lastOf := p.producerLastOffsets()
	horizon := nowMs + cfg.DeleteRetentionMs()
	if cfg.DeleteRetentionMs() > math.MaxInt64-nowMs {
		horizon = math.MaxInt64
	}
	tracks := make(map[int64]*txnTrack)
	droppedAborts := make(map[int64]bool) // marker offsets of removed ABORT markers
	var out []*cleaned
	fail := func(err error) (cleanStats, error) {
		for _, c := range out {
			_ = c.seg.f.Close()
			removeCleanedFiles(c.seg)
		}
		return st, err
	}
	crash := func(step string) bool { return cleanerCrashAt != nil && cleanerCrashAt(step) }
	// Grouping (see groupFits): consecutive sources go into one new segment while they fit.
	// ns, f and pos are the group being written.
	var (
		ns  *segment
		f   File
		pos int64
	)
	segBytes := min(cfg.SegmentBytes, math.MaxInt32)
	write := func(b codec.Batch) error {
		if pos+int64(len(b)) > math.MaxInt32 {
			// Positions in the .index are 32-bit. A group is kept within segment.bytes (at most
			// 2^31-1) by its sources' sizes or its staged output; only a recompressed batch
			// that came out larger than it went in could get here.
			return fmt.Errorf("cannot write cleaned segment %d: its size would pass 2^31-1 bytes", ns.base)
		}
		lim.wait(len(b), stop)
		if _, err := f.WriteAt(b, pos); err != nil {
			return err
		}
		ns.track(b, pos, p.interval, b.MaxTimestamp())
		pos += int64(len(b))
		st.written += int64(len(b))
		return nil
	}
	// finishGroup makes the group durable: its .log (fsync) and its three index files.
	finishGroup := func() error {
		c := out[len(out)-1]
		next, _, _ := ns.stats()
		ns.size.Store(pos)
		ns.filled.Store(pos)
		if pos == 0 {
			ns.mu.Lock()
			ns.rollTs = -1
			ns.mu.Unlock()
		}
		if cluster && len(out) == 1 && crash("cluster-files-written") {
			return errCrashInjected
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("cannot fsync cleaned segment %d: %w", ns.base, err)
		}
		for _, a := range abortedInRange(aborted, ns.base, next) {
			if !droppedAborts[a.LastOffset] {
				c.aborted = append(c.aborted, a)
			}
		}
		idx, tidx := ns.encodeIndexes()
		for _, w := range []struct {
			ext  string
			data []byte
		}{{".index", idx}, {".timeindex", tidx}, {".txnindex", encodeTxnIndex(c.aborted)}} {
			if err := WriteFileSynced(cleanedPath(ns, w.ext), w.data); err != nil {
				return fmt.Errorf("cannot write cleaned segment %d index: %w", ns.base, err)
			}
		}
		return nil
	}
	// startGroup opens a new group whose first source is old.
	startGroup := func(old *segment) error {
		ns = newSegment(p.dir, old.base, nil)
		ns.epoch = old.epoch
		if cluster {
			ns.epoch, ns.stem, ns.foreign = p.nameEpoch, cleanedStem(old.base, p.nameEpoch, seq), true
		}
		var err error
		f, err = p.fs.OpenFile(cleanedPath(ns, ".log"), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("cannot create cleaned segment %d: %w", old.base, err)
		}
		ns.f = f
		pos = 0
		out = append(out, &cleaned{seg: ns, olds: []*segment{old}})
		return nil
	}
	// A source that may not fit in the group (see groupFits) is staged: its output is held in
	// memory up to stageCap bytes. If it ends within that, it joins the group; if not, the
	// group is finished and the source starts the next one with what was staged.
	var (
		staging  bool
		staged   []codec.Batch
		stageLen int64
		stageCap int64
	)
	var old *segment
	emit := func(b codec.Batch) error {
		if !staging {
			return write(b)
		}
		if stageLen+int64(len(b)) <= stageCap {
			staged = append(staged, slices.Clone(b))
			stageLen += int64(len(b))
			return nil
		}
		staging = false
		if stageCap < segBytes-pos {
			cleanerStageFullTotal.Inc()
		}
		if err := finishGroup(); err != nil {
			return err
		}
		if err := startGroup(old); err != nil {
			return err
		}
		for _, sb := range staged {
			if err := write(sb); err != nil {
				return err
			}
		}
		staged, stageLen = nil, 0
		return write(b)
	}
	var bb batchBuilder
	for i := 0; i < end; i++ {
		old = segs[i]
		next, _, _ := old.stats()
		switch {
		case ns != nil && groupFits(ns.base, pos, old.size.Load(), next, segBytes):
			out[len(out)-1].olds = append(out[len(out)-1].olds, old)
		case ns != nil && next-1-ns.base <= math.MaxInt32:
			staging, staged, stageLen = true, nil, 0
			stageCap = min(segBytes-pos, cleanerStageBytes)
		default:
			if ns != nil {
				if err := finishGroup(); err != nil {
					if errors.Is(err, errCrashInjected) {
						return st, err
					}
					return fail(err)
				}
			}
			if err := startGroup(old); err != nil {
				return fail(err)
			}
		}
		err := forBatches(old, lim, stop, &st, func(b codec.Batch) error {
			pid := b.ProducerID()
			last := pid >= 0 && lastOf[pid] == b.LastOffset() && !b.IsControl()
			if b.IsControl() {
				tr := tracks[pid]
				delete(tracks, pid)
				typ := codec.ControlType(b)
				keep := tr != nil && (typ == codec.ControlAbort || tr.retained)
				if !keep {
					if h, ok := deleteHorizon(b); ok && h <= nowMs {
						if typ == codec.ControlAbort {
							droppedAborts[b.BaseOffset()] = true
						}
						return nil
					}
					if _, ok := deleteHorizon(b); !ok {
						return rebuild(&bb, b, horizon, func(*rawRecord) bool { return true }, emit)
					}
				}
				return emit(b)
			}
			if b.IsTransactional() {
				if tracks[pid] == nil {
					tracks[pid] = &txnTrack{}
				}
			}
			if isAborted(b) {
				if last {
					return rebuild(&bb, b, -1, func(*rawRecord) bool { return false }, emit)
				}
				return nil
			}
			hz, hasHz := deleteHorizon(b)
			removeTombstones := hasHz && hz <= nowMs
			changed, tombs, kept := false, false, 0
			bb.start(b, -1)
			if err := walkRecords(b, func(r *rawRecord) error {
				if !keepRecord(r, b.BaseOffset(), keys, removeTombstones) {
					changed = true
					return nil
				}
				kept++
				tombs = tombs || r.tombstone
				// Collected as they are; re-encoded below only if a horizon is stamped.
				bb.add(r)
				return nil
			}); err != nil {
				return err
			}
			stamp := int64(-1)
			if tombs && !hasHz {
				stamp = horizon
			}
			dropped := (changed || stamp >= 0) && kept == 0 && !last
			if b.IsTransactional() && !dropped {
				// The batch stays, with records or empty as its producer's last: so does its
				// transaction's marker (Apache keeps the marker of a transaction it still
				// traverses a batch of). A replay of the producer state over this range would
				// otherwise open the transaction and never close it (the LSO stuck below it).
				tracks[pid].retained = true
			}
			if !changed && stamp < 0 {
				return emit(b)
			}
			if dropped {
				return nil
			}
			if stamp >= 0 {
				return rebuild(&bb, b, stamp, func(r *rawRecord) bool {
					return keepRecord(r, b.BaseOffset(), keys, removeTombstones)
				}, emit)
			}
			nb, err := bb.finish()
			if err != nil {
				return err
			}
			return emit(nb)
		})
		if err == nil && staging {
			// The source's whole output fits: it joins the group.
			staging = false
			out[len(out)-1].olds = append(out[len(out)-1].olds, old)
			for _, sb := range staged {
				if err = write(sb); err != nil {
					break
				}
			}
			staged, stageLen = nil, 0
		}
		if errors.Is(err, errCrashInjected) {
			return st, err
		}
		if err != nil {
			return fail(p.cleanFailure(err, old, fmt.Sprintf("cannot rewrite segment %d", old.base)))
		}
		// The group ends where its last source ended (the next segment's base), whatever
		// offsets the clean removed at its end.
		ns.mu.Lock()
		ns.next = next
		ns.mu.Unlock()
	}
	if ns != nil {
		if err := finishGroup(); err != nil {
			if errors.Is(err, errCrashInjected) {
				return st, err
			}
			return fail(err)
		}
	}
	if cluster {
		cleanEnd := int64(0)
		if end > 0 {
			cleanEnd, _, _ = segs[end-1].stats()
		}
		if err := p.cleanCommitCluster(out, droppedAborts, seq, cleanEnd); err != nil {
			if errors.Is(err, errCrashInjected) {
				return st, err
			}
			return fail(err) // no manifest: the new files are orphans, removed now
		}
		st.done(end, len(out))
		return st, nil
	}
	if err := p.swapCleaned(out, droppedAborts); err != nil {
		if errors.Is(err, errCleanAborted) {
			return fail(err)
		}
		if !errors.Is(err, errCrashInjected) {
			// The .cleaned files stay for the next open: with the marker written it finishes
			// the swap, without it it deletes them. The partition keeps serving the old files.
			for _, c := range out {
				_ = c.seg.f.Close()
			}
		}
		return st, err
	}
	if end > 0 {
		cleanedTo, _, _ := segs[end-1].stats()
		p.cleanedTo.Store(cleanedTo)
		if err := WriteFileAtomic(p.dir, cleanerCheckpointName, []byte(strconv.FormatInt(cleanedTo, 10))); err != nil {
			p.log.Warn("cannot write cleaner checkpoint (the next clean redoes this one)", zap.Error(err))
		}
	}
	st.done(end, len(out))
	return st, nil
}

// cleanFailure classifies an error reading seg during a clean: if retention, DeleteRecords or a
// shutdown removed the segment (closing its file under the clean, which reads without segMu so
// that it never holds up fetches), the clean is abandoned, not failed.
func (p *Partition) cleanFailure(err error, seg *segment, what string) error {
	if errors.Is(err, errCleanAborted) {
		return err
	}
	p.mu.Lock()
	gone := p.closed || !slices.Contains(*p.segs.Load(), seg)
	p.mu.Unlock()
	if gone {
		return errCleanAborted
	}
	return fmt.Errorf("%s: %w", what, err)
}

// keepRecord is Apache's shouldRetainRecord: keyless records go (a compacted topic requires
// keys), as do records with a later offset of their key in the map, and tombstones past their
// delete horizon.
func keepRecord(r *rawRecord, base int64, keys map[string]int64, removeTombstones bool) bool {
	if !r.hasKey {
		return false
	}
	if o, ok := keys[string(r.key)]; ok && o > base+r.offDelta {
		return false
	}
	return !(r.tombstone && removeTombstones)
}

// rebuild writes b with only the records keep accepts (and horizon stamped if >= 0).
func rebuild(bb *batchBuilder, b codec.Batch, horizon int64, keep func(*rawRecord) bool, write func(codec.Batch) error) error {
	bb.start(b, horizon)
	if err := walkRecords(b, func(r *rawRecord) error {
		if keep(r) {
			bb.add(r)
		}
		return nil
	}); err != nil {
		return err
	}
	nb, err := bb.finish()
	if err != nil {
		return err
	}
	return write(nb)
}

func abortedInRange(ab []AbortedTxn, from, to int64) []AbortedTxn {
	var out []AbortedTxn
	for _, a := range ab {
		if a.LastOffset >= from && a.LastOffset < to {
			out = append(out, a)
		}
	}
	return out
}

// forBatches reads every whole batch of seg (up to its logical size) through the limiter.
func forBatches(seg *segment, lim *ioLimiter, stop <-chan struct{}, st *cleanStats, fn func(codec.Batch) error) error {
	r := batchReader{f: seg.f, end: seg.size.Load()}
	for {
		b, status, err := r.next(true)
		if err != nil {
			return err
		}
		if status == batchEOF {
			return nil
		}
		if status != batchOK {
			return fmt.Errorf("unreadable batch at position %d", r.pos)
		}
		select {
		case <-stop:
			return errCleanAborted
		default:
		}
		lim.wait(len(b), stop)
		st.read += int64(len(b))
		if err := fn(b); err != nil {
			return err
		}
	}
}

// ---- the swap ----

const (
	cleanedSuffix         = ".cleaned"
	cleanerSwapName       = "cleaner.swap"
	cleanerCheckpointName = "cleaner.checkpoint"
)

var cleanedExts = []string{".log", ".index", ".timeindex", ".txnindex"}

var errCrashInjected = errors.New("crash injected by a test")

// cleanedPath is where a clean writes file ext of its new segment s: <name>.cleaned until the
// swap in single-broker mode, the final name (s.stem) in cluster mode.
func cleanedPath(s *segment, ext string) string {
	if s.stem != "" {
		return s.path(ext)
	}
	return s.path(ext) + cleanedSuffix
}

func removeCleanedFiles(s *segment) {
	for _, ext := range cleanedExts {
		_ = os.Remove(cleanedPath(s, ext))
	}
}

// swapCleaned installs the rewritten groups (see the swap diagram at the top of this file).
// Only the renames, the deletions and the directory fsyncs run under the append mutex.
func (p *Partition) swapCleaned(out []*cleaned, droppedAborts map[int64]bool) error {
	crash := func(step string) bool { return cleanerCrashAt != nil && cleanerCrashAt(step) }
	if len(out) == 0 {
		return nil
	}
	if crash("before-dir-sync") {
		return errCrashInjected
	}
	if err := SyncDir(p.dir); err != nil {
		return fmt.Errorf("cannot fsync partition dir: %w", err)
	}
	p.mu.Lock()
	p.waitRollLocked()
	cur := *p.segs.Load()
	if p.closed || !segmentsPresent(cur, out) {
		p.mu.Unlock()
		return errCleanAborted
	}
	if crash("before-marker") {
		p.mu.Unlock()
		return errCrashInjected
	}
	// From here on a failure leaves the disk half way to the new set (the next open finishes
	// it) while the old list serves on: nothing may be deleted by name meanwhile. Set before
	// the marker write: one that fails may still have left the marker in place.
	p.swapPending.Store(true)
	if err := WriteFileAtomic(p.dir, cleanerSwapName, encodeSwapMarker(out)); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("cannot write swap marker: %w", err)
	}
	deleted := 0
	for i, c := range out {
		for _, ext := range cleanedExts {
			if i == len(out)/2 && ext == ".timeindex" && crash("mid-rename") {
				p.mu.Unlock()
				return errCrashInjected
			}
			if err := os.Rename(c.seg.path(ext)+cleanedSuffix, c.seg.path(ext)); err != nil {
				p.mu.Unlock()
				// The marker stays: the next open finishes the renames.
				return fmt.Errorf("cannot rename cleaned segment %d%s: %w", c.seg.base, ext, err)
			}
		}
		// The other sources' files go; readers holding the old list keep their open handles.
		for _, o := range c.olds[1:] {
			if err := removeSourceFiles(o.dir, o.name("")); err != nil {
				p.mu.Unlock()
				return err // the marker stays: the next open finishes the deletions
			}
			if deleted++; deleted == 1 && crash("mid-delete") {
				p.mu.Unlock()
				return errCrashInjected
			}
		}
	}
	if crash("before-final-dir-sync") {
		p.mu.Unlock()
		return errCrashInjected
	}
	if err := SyncDir(p.dir); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("cannot fsync partition dir: %w", err)
	}
	// Publish the new list; the old files close after mu (segMu is never taken under mu).
	next := withCleaned(cur, out)
	p.segs.Store(&next)
	p.swapPending.Store(false)
	p.dropAbortsLocked(droppedAborts)
	crashed := crash("before-marker-removal")
	if !crashed {
		_ = os.Remove(filepath.Join(p.dir, cleanerSwapName))
		_ = SyncDir(p.dir)
	}
	p.mu.Unlock()
	closeSources(p, out)
	if crashed {
		return errCrashInjected
	}
	return nil
}

// closeSources closes the files of every group's sources, once the new list is published.
func closeSources(p *Partition, out []*cleaned) {
	p.segMu.Lock()
	for _, c := range out {
		for _, o := range c.olds {
			if !o.deleted {
				o.deleted = true
				_ = o.f.Close()
			}
		}
	}
	p.segMu.Unlock()
}

func segmentsPresent(cur []*segment, out []*cleaned) bool {
	in := make(map[*segment]bool, len(cur))
	for _, s := range cur {
		in[s] = true
	}
	for _, c := range out {
		for _, o := range c.olds {
			if !in[o] {
				return false
			}
		}
	}
	return true
}

// The swap marker (cleaner.swap) has one line per group: the group's name (which is its first
// source's: the cleaned file takes that base), then the names of the group's other sources,
// separated by spaces. A marker of a clean before grouping (one name a line) reads as groups of
// one source.
func encodeSwapMarker(out []*cleaned) []byte {
	var sb strings.Builder
	for i, c := range out {
		if i > 0 {
			sb.WriteByte('\n')
		}
		sb.WriteString(c.olds[0].name(""))
		for _, o := range c.olds[1:] {
			sb.WriteByte(' ')
			sb.WriteString(o.name(""))
		}
	}
	return []byte(sb.String())
}

// removeSourceFiles deletes the segment files of stem (ENOENT is fine: a recovery repeating a
// swap finds them gone).
func removeSourceFiles(dir, stem string) error {
	for _, ext := range cleanedExts {
		if err := os.Remove(filepath.Join(dir, stem+ext)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("cannot delete merged segment file (%s): %w", stem+ext, err)
		}
	}
	return nil
}

// recoverCleanerSwap finishes or rolls back a swap a crash interrupted (recoverLog, and a
// cluster-mode takeover of a directory a single broker left, before the segment files are
// listed): with the marker, every .cleaned file it names replaces its old file; without it,
// .cleaned files are leftovers of a clean that never reached its swap.
func recoverCleanerSwap(dir string, log *zap.Logger) error {
	marker := filepath.Join(dir, cleanerSwapName)
	buf, err := os.ReadFile(marker)
	found := err == nil
	if found {
		groups := 0
		for _, line := range strings.Split(string(buf), "\n") {
			names := strings.Fields(line)
			if len(names) == 0 {
				continue
			}
			groups++
			name := names[0]
			for _, ext := range cleanedExts {
				from := filepath.Join(dir, name+ext+cleanedSuffix)
				if _, serr := os.Stat(from); serr == nil {
					if err := os.Rename(from, filepath.Join(dir, name+ext)); err != nil {
						return fmt.Errorf("cannot finish cleaner swap (%s): %w", name, err)
					}
				}
			}
			// Every .cleaned file was durable before the marker, so the group file is in
			// place now and the sources merged into it can go.
			for _, src := range names[1:] {
				if err := removeSourceFiles(dir, src); err != nil {
					return fmt.Errorf("cannot finish cleaner swap (%s): %w", name, err)
				}
			}
		}
		if err := SyncDir(dir); err != nil {
			return err
		}
		log.Info("finished a cleaner swap interrupted by a crash", zap.Int("groups", groups))
	} else if !os.IsNotExist(err) {
		return fmt.Errorf("cannot read cleaner swap marker: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	changed := found
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), cleanedSuffix) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
			changed = true
		}
	}
	if !changed {
		return nil // nothing to undo (every open and takeover passes here)
	}
	if found {
		_ = os.Remove(marker)
	}
	return SyncDir(dir)
}

// loadCleanerCheckpoint reads where the last clean ended (0 without one).
func loadCleanerCheckpoint(dir string) int64 {
	buf, err := os.ReadFile(filepath.Join(dir, cleanerCheckpointName))
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(buf)), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}
