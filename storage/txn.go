package storage

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kaas-go/kaas/codec"
)

// Transactions on a partition (KIP-98 partition-leader side, modelled on Apache's
// ProducerStateManager / ProducerAppendInfo / TransactionIndex).
//
// Per producer (producerEntry, under the append mutex) the partition keeps the ongoing transaction
// (txnSpan: first offset), the coordinator epoch of the last marker, and (in memory) a KIP-890
// verification guard. A producer's transaction on this partition moves through:
//
//	               VerificationGuard (coordinator says "in txn")
//	  ┌──────┐  ─────────────────────────────────────────────►  ┌──────────┐
//	  │ none │                                                  │ verified │ (guard token)
//	  └──────┘  ◄──────── marker / fence clears the guard ──────└──────────┘
//	     ▲                                                           │ AppendTxn(guard) = first batch
//	     │ AppendMarker (COMMIT / ABORT)                             ▼
//	     │                                                     ┌─────────┐
//	     └─────────────────────────────────────────────────────│ ongoing │ txn.first = base offset
//	                                                           └─────────┘
//	  marker written (closed in producer state) ─► "decided" for the LSO only once the marker's
//	  offset is below the HWM (fsync'd): Apache's rule that markers are replicated before the LSO
//	  moves past the transaction.
//
// The partition-level txnIndex holds what readers need without the append mutex:
//   - queue: the transactions that may still hold the LSO back, ordered by first offset (they are
//     opened at increasing offsets). LSO = first offset of the first one that is undecided or whose
//     marker is not yet durable, capped at the HWM.
//   - aborted: every aborted transaction whose marker is in the retained log, sorted by marker
//     offset. Closed segments persist their part in <base>.txnindex (encodeTxnIndex) at roll; the
//     active segment's part is rebuilt on open from the producer snapshot's tail and the replay.

// AbortedTxn is one aborted transaction: its first offset on this partition and the offset of its
// ABORT marker.
type AbortedTxn struct{ ProducerID, FirstOffset, LastOffset int64 }

// OpenTxn is a transaction still open on this partition (no marker written yet).
type OpenTxn struct {
	ProducerID     int64
	Epoch          int16 // the epoch that opened it
	FirstOffset    int64
	StartTimestamp int64 // max timestamp of the transaction's first batch (broker time on LogAppendTime topics)
}

// txnSpan is one transaction of one producer on this partition.
type txnSpan struct {
	pid     int64
	epoch   int16 // producer epoch that opened it
	first   int64
	startTs int64
	end     int64 // offset of the closing marker, -1 while undecided; guarded by txnIndex.mu
}

type txnIndex struct {
	mu      sync.Mutex
	queue   []*txnSpan   // by first offset
	aborted []AbortedTxn // by LastOffset
	maxSpan int64        // max LastOffset-FirstOffset in aborted (bounds AbortedTransactions' scan)
}

// lso computes the last stable offset for the given HWM and log start, dropping decided, durable
// transactions from the head of the queue.
func (t *txnIndex) lso(hwm, logStart int64) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.queue) > 0 {
		s := t.queue[0]
		if s.end < 0 || s.end >= hwm {
			break
		}
		t.queue[0] = nil
		t.queue = t.queue[1:]
	}
	lso := hwm
	if len(t.queue) > 0 && t.queue[0].first < lso {
		lso = t.queue[0].first
	}
	// Apache never reports a first unstable offset below the log start (retention may have
	// removed the start of a still-open transaction).
	return max(lso, logStart)
}

// LastStableOffset is the first offset of the earliest transaction on this partition that is not
// decided yet (no marker, or a marker not yet durable), capped at the HWM; HWM when none is open.
// Fetch at READ_COMMITTED reads below it; ListOffsets LATEST at READ_COMMITTED answers it.
func (p *Partition) LastStableOffset() int64 {
	return p.txn.lso(p.hwm.Load(), p.logStart.Load())
}

// AbortedTransactions returns every aborted transaction overlapping [fetchOffset, upperBound):
// LastOffset >= fetchOffset && FirstOffset < upperBound (Apache collectAbortedTransactions), sorted
// by FirstOffset, or nil. A fetch starting inside an aborted transaction still gets it, so the
// consumer drops its records up to the ABORT marker.
func (p *Partition) AbortedTransactions(fetchOffset, upperBound int64) []AbortedTxn {
	t := &p.txn
	t.mu.Lock()
	ab := t.aborted
	i := sort.Search(len(ab), func(i int) bool { return ab[i].LastOffset >= fetchOffset })
	var out []AbortedTxn
	// FirstOffset >= LastOffset-maxSpan, so past LastOffset >= upperBound+maxSpan nothing overlaps.
	for ; i < len(ab) && ab[i].LastOffset-t.maxSpan < upperBound; i++ {
		if ab[i].FirstOffset < upperBound {
			out = append(out, ab[i])
		}
	}
	t.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].FirstOffset < out[j].FirstOffset })
	return out
}

// OpenTransactions lists the transactions without a marker on this partition, by first offset
// (hanging-transaction detection, lastStableOffsetLag metrics).
func (p *Partition) OpenTransactions() []OpenTxn {
	p.mu.Lock()
	var out []OpenTxn
	for pid, e := range p.producers.m {
		if e.txn != nil {
			out = append(out, OpenTxn{ProducerID: pid, Epoch: e.txn.epoch, FirstOffset: e.txn.first, StartTimestamp: e.txn.startTs})
		}
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].FirstOffset < out[j].FirstOffset })
	return out
}

// applyTxnEventLocked publishes what record did (under mu) to the readers' index.
func (p *Partition) applyTxnEventLocked(ev txnEvent, markerOffset int64) {
	if ev.opened == nil && ev.closed == nil {
		return
	}
	t := &p.txn
	t.mu.Lock()
	if ev.opened != nil {
		t.queue = append(t.queue, ev.opened)
	}
	if ev.closed != nil {
		ev.closed.end = markerOffset
		if ev.abort {
			t.aborted = append(t.aborted, AbortedTxn{ProducerID: ev.closed.pid, FirstOffset: ev.closed.first, LastOffset: markerOffset})
			t.maxSpan = max(t.maxSpan, markerOffset-ev.closed.first)
		}
	}
	t.mu.Unlock()
}

// installProducersLocked replaces the producer state after a rebuild (open, repair) and derives the
// readers' index from it. Everything is durable at that point (HWM = log end), so the queue holds
// only the open transactions. Verification guards survive a repair (they are not in the log).
func (p *Partition) installProducersLocked(ps *producerState, aborted []AbortedTxn) {
	var queue []*txnSpan
	for _, e := range ps.m {
		if e.txn != nil {
			queue = append(queue, e.txn)
		}
	}
	sort.Slice(queue, func(i, j int) bool { return queue[i].first < queue[j].first })
	var span int64
	for _, a := range aborted {
		span = max(span, a.LastOffset-a.FirstOffset)
	}
	if p.producers != nil {
		ps.guards = p.producers.guards
	}
	ps.snapTail = nil
	old := p.producers
	p.producers = ps
	if old != nil {
		for pid := range old.m {
			p.untrackPIDLocked(pid)
		}
	}
	for pid := range ps.m {
		p.trackPIDLocked(pid)
	}
	p.txn.mu.Lock()
	p.txn.queue, p.txn.aborted, p.txn.maxSpan = queue, aborted, span
	p.txn.mu.Unlock()
}

// mergeAborted unions index sources (earlier sources win on the same marker offset), keeps
// markers in [logStart, end) and sorts by marker offset.
func mergeAborted(logStart, end int64, sources ...[]AbortedTxn) []AbortedTxn {
	var all []AbortedTxn
	for _, src := range sources {
		for _, a := range src {
			if a.LastOffset >= logStart && a.LastOffset < end {
				all = append(all, a)
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].LastOffset < all[j].LastOffset })
	out := all[:0]
	for _, a := range all {
		if n := len(out); n > 0 && out[n-1].LastOffset == a.LastOffset {
			continue
		}
		out = append(out, a)
	}
	return out
}

// abortedRange returns the aborted entries with LastOffset in [from, to) (under mu or txn.mu).
func (t *txnIndex) abortedRange(from, to int64) []AbortedTxn {
	ab := t.aborted
	i := sort.Search(len(ab), func(i int) bool { return ab[i].LastOffset >= from })
	j := sort.Search(len(ab), func(i int) bool { return ab[i].LastOffset >= to })
	return append([]AbortedTxn(nil), ab[i:j]...)
}

// trimBelow drops the aborted entries whose marker is below the new log start (under mu): they
// can no longer affect any fetch (Apache drops them with their segment's .txnindex). Whatever
// advances the log start (retention, a future DeleteRecords) must call it.
func (t *txnIndex) trimBelow(logStart int64) {
	t.mu.Lock()
	i := sort.Search(len(t.aborted), func(i int) bool { return t.aborted[i].LastOffset >= logStart })
	t.aborted = append([]AbortedTxn(nil), t.aborted[i:]...)
	// The scan bound shrinks with what is left: one long transaction that left the index must
	// not make every later AbortedTransactions scan the whole index.
	var span int64
	for _, a := range t.aborted {
		span = max(span, a.LastOffset-a.FirstOffset)
	}
	t.maxSpan = span
	t.mu.Unlock()
}

// ---- KIP-890 part 1 verification guards ----

// verifyGuard is a token handed out before a producer's first transactional append here.
type verifyGuard struct {
	token uint64
	epoch int16
}

// maxGuardsPerPartition bounds the guards a partition remembers. A guard lives from the
// verification request to the first append (a coordinator round trip), so the oldest are stale;
// at the bound the oldest is evicted (its append then gets INVALID_TXN_STATE and is retried).
const maxGuardsPerPartition = 1024

// guardSeq issues guard tokens, unique in the process (seeded from the clock so that a token from
// before a partition re-open is never reissued).
var guardSeq atomic.Uint64

func init() { guardSeq.Store(uint64(time.Now().UnixNano()) | 1) }

// VerificationGuard starts KIP-890 verification of pid's first transactional append here. It
// returns ongoing=true if pid already has an ongoing transaction on this partition at this epoch
// (no verification needed); otherwise a guard token to pass to AppendTxn once the coordinator
// confirmed the partition is in the transaction. Concurrent requests of one producer share the
// token (Apache's computeIfAbsent); any marker or fence for pid invalidates it, which defeats
// the ABA race verify → abort marker → new transaction → stale "ok".
func (p *Partition) VerificationGuard(pid int64, epoch int16) (guard uint64, ongoing bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, false // released or deleted: the append that follows answers 6 or 3
	}
	ps := p.producers
	if e := ps.m[pid]; e != nil && e.txn != nil && e.txn.epoch == epoch {
		return 0, true
	}
	if g, ok := ps.guards[pid]; ok && g.epoch == epoch {
		return g.token, false
	}
	if _, ok := ps.guards[pid]; !ok && len(ps.guards) >= maxGuardsPerPartition {
		oldest, tok := int64(0), uint64(math.MaxUint64)
		for id, g := range ps.guards {
			if g.token < tok {
				oldest, tok = id, g.token
			}
		}
		delete(ps.guards, oldest)
		p.untrackPIDLocked(oldest)
	}
	g := verifyGuard{token: guardSeq.Add(1), epoch: epoch}
	ps.guards[pid] = g
	p.topic.store.pids.add(pid, p)
	return g.token, false
}

// AppendTxn appends a transactional batch (already validated by codec.ValidateProduce). It is
// allowed if the producer has an ongoing transaction here at the batch's epoch, or if guard is
// still pid's current verification guard; otherwise INVALID_TXN_STATE (48). Every idempotence
// check of Append applies, the epoch check first (KAFKA-19690: a stale epoch gets 47, not 48).
// The first transactional batch opens the transaction (its offset pins the LSO).
func (p *Partition) AppendTxn(b codec.Batch, nowMs int64, guard uint64) AppendResult {
	return p.append(b, nowMs, kindClient, guard, markerArgs{})
}

// AppendMarker writes a COMMIT or ABORT marker for pid and closes the producer's ongoing
// transaction here (ABORT: an aborted-index entry, if a transaction was ongoing). Checks, as
// Apache's ProducerAppendInfo.appendEndTxnMarker: epoch below the producer's current epoch (or
// the store-wide fenced epoch) → INVALID_PRODUCER_EPOCH (47); coordinatorEpoch below the recorded
// one → TRANSACTION_COORDINATOR_FENCED (52). The marker raises the producer's epoch (fencing older
// epochs: a zombie's later data gets 47 and can never open a hanging transaction) and resets its
// sequence window when the epoch grows. A marker for a producer without an ongoing transaction
// here is written too (coordinator retry after a crash, kafka-transactions abort) and creates no
// aborted entry. Durability: the caller waits on Sync(res.LastOffset+1, ...); the LSO moves past
// the transaction only once the marker is durable.
func (p *Partition) AppendMarker(pid int64, epoch int16, commit bool, coordinatorEpoch int32, nowMs int64) AppendResult {
	return p.AppendMarkerSeq(pid, epoch, commit, coordinatorEpoch, 0, nowMs)
}

// AppendMarkerSeq is AppendMarker for a marker that names the prepared transaction it ends:
// prepareSeq, the coordinator's sequence of that prepare (unique and increasing per
// transactional id; 0 = not given, AppendMarker's rules alone). A marker whose (pid, epoch,
// coordinatorEpoch) match the producer here and whose prepareSeq is not above the last one
// written for it is a resend of a marker already applied: it is answered like any resend
// (Duplicate, at the log end) and not written, even if the producer's next transaction of the same
// epoch (TV1) is ongoing here by now. Without the sequence such a late copy, queued here while
// the coordinator's retry after a timeout landed and the producer moved on, would close that next
// transaction's records with the wrong result.
//
// The last sequence lives in the producer's in-memory state only (not in snapshots): a late copy
// is a request queued in this process, addressed to this leader at this epoch, so it cannot
// outlive the process or a leadership change (a request that reaches a broker that no longer leads
// the partition gets NOT_LEADER). After a restart or a takeover AppendMarker's rule applies until
// the next sequenced marker, and no late copy can arrive from before it.
func (p *Partition) AppendMarkerSeq(pid int64, epoch int16, commit bool, coordinatorEpoch int32, prepareSeq uint64, nowMs int64) AppendResult {
	var buf [128]byte
	b := codec.Batch(codec.AppendControlBatch(buf[:0], pid, epoch, commit, coordinatorEpoch, nowMs))
	return p.append(b, nowMs, kindMarker, 0, markerArgs{coordEpoch: coordinatorEpoch, prepareSeq: prepareSeq})
}

// checkMarkerLocked applies AppendMarker's fencing checks.
func (p *Partition) checkMarkerLocked(pid int64, epoch int16, coordEpoch int32) int16 {
	e := p.producers.m[pid]
	if e == nil {
		if min, ok := p.topic.store.fences.get(pid); ok && epoch < min {
			return codec.CodeInvalidProducerEpoch
		}
		return codec.CodeNone
	}
	if epoch < e.epoch {
		return codec.CodeInvalidProducerEpoch
	}
	if coordEpoch < e.coordEpoch {
		return codec.CodeTransactionCoordinatorFenced
	}
	return codec.CodeNone
}

// resentMarkerLocked reports whether a marker for (pid, epoch) from coordinator epoch coordEpoch
// would repeat the last one: the producer's transaction here is already closed by a marker of
// the same producer epoch and coordinator epoch, so this one closes nothing and changes no
// state. That is a coordinator resending after a lost answer (design/cluster.md §4: a marker
// request that timed out is sent again), and it is not written a second time. The verification
// guard is dropped as a written marker would drop it, so a late first write of the ended
// transaction still needs a fresh verification.
//
// With a prepare sequence (AppendMarkerSeq), a marker of the same epochs whose sequence is not
// above the last one written for the producer is a resend too, whether or not a transaction is
// ongoing: the ongoing one is the next transaction, not the one this marker ends.
func (p *Partition) resentMarkerLocked(pid int64, epoch int16, mk markerArgs, nowMs int64) bool {
	e := p.producers.m[pid]
	if e == nil || e.epoch != epoch || mk.coordEpoch < 0 || e.coordEpoch != mk.coordEpoch {
		return false
	}
	if mk.prepareSeq > e.prepareSeq {
		// A transaction after the last sequenced one: not a resend of it. With no transaction
		// ongoing here it still closes nothing; remember its sequence, as a written one would.
		if e.txn != nil {
			return false
		}
		e.prepareSeq = mk.prepareSeq
	} else if mk.prepareSeq == 0 && e.txn != nil {
		return false
	}
	delete(p.producers.guards, pid)
	if nowMs > e.touchMs {
		e.touchMs = nowMs
	}
	markersResentTotal.Inc()
	return true
}

// controlCoordinatorEpoch reads the coordinator epoch from a marker's value (int16 version,
// int32 coordinatorEpoch).
func controlCoordinatorEpoch(b codec.Batch) (int32, bool) {
	if len(b) < codec.BatchHeaderSize+1 {
		return 0, false
	}
	p := b.Records()
	l, k := binary.Varint(p)
	if k <= 0 || l <= 0 || int64(len(p)-k) < l {
		return 0, false
	}
	rec := p[k : k+int(l)][1:] // skip attributes
	for i := 0; i < 2; i++ {   // timestamp delta, offset delta
		_, k = binary.Varint(rec)
		if k <= 0 {
			return 0, false
		}
		rec = rec[k:]
	}
	kl, k := binary.Varint(rec)
	if k <= 0 || kl < 0 || int64(len(rec)-k) < kl {
		return 0, false
	}
	rec = rec[k+int(kl):]
	vl, k := binary.Varint(rec)
	if k <= 0 || vl < 6 || int64(len(rec)-k) < vl {
		return 0, false
	}
	return int32(binary.BigEndian.Uint32(rec[k+2:])), true
}

// ---- store-wide fencing ----

// fenceMemoryMax bounds how many producer ids the store remembers a fenced epoch for (about
// 2 MiB). The oldest fence is forgotten first: after that a partition that never saw the producer
// accepts its old epoch again, which is what Apache always does (it has no cross-partition memory).
const fenceMemoryMax = 1 << 16

// fenceMemory is the store's pid → minimum epoch map, FIFO-bounded, in memory only.
type fenceMemory struct {
	mu    sync.Mutex
	m     map[int64]int16
	order []int64 // ring of pids in insertion order
	next  int
}

func (f *fenceMemory) get(pid int64) (int16, bool) {
	f.mu.Lock()
	e, ok := f.m[pid]
	f.mu.Unlock()
	return e, ok
}

func (f *fenceMemory) remember(pid int64, epoch int16) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[int64]int16)
	}
	if old, ok := f.m[pid]; ok {
		f.m[pid] = max(old, epoch)
		return
	}
	if len(f.order) < fenceMemoryMax {
		f.order = append(f.order, pid)
	} else {
		delete(f.m, f.order[f.next])
		f.order[f.next] = pid
		f.next = (f.next + 1) % fenceMemoryMax
	}
	f.m[pid] = epoch
}

// pidIndex maps a producer id to the partitions that hold state (an entry or a verification
// guard) for it, so that FenceProducer visits those and not every partition of the store.
// Partitions add a pid when they create its entry or guard and remove it when both are gone
// (expiration, guard eviction, a rebuild, release, close), always under their append mutex.
//
// Lock order: Partition.mu → pidIndex.mu (FenceProducer copies the list and drops pidIndex.mu
// before it takes any partition's mutex).
type pidIndex struct {
	mu sync.Mutex
	m  map[int64]map[*Partition]struct{}
}

func (x *pidIndex) add(pid int64, p *Partition) {
	x.mu.Lock()
	if x.m == nil {
		x.m = make(map[int64]map[*Partition]struct{})
	}
	set := x.m[pid]
	if set == nil {
		set = make(map[*Partition]struct{}, 1)
		x.m[pid] = set
	}
	set[p] = struct{}{}
	x.mu.Unlock()
}

func (x *pidIndex) remove(pid int64, p *Partition) {
	x.mu.Lock()
	if set := x.m[pid]; set != nil {
		delete(set, p)
		if len(set) == 0 {
			delete(x.m, pid)
		}
	}
	x.mu.Unlock()
}

func (x *pidIndex) partitions(pid int64) []*Partition {
	x.mu.Lock()
	defer x.mu.Unlock()
	set := x.m[pid]
	out := make([]*Partition, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	return out
}

// len is the number of producer ids indexed (tests).
func (x *pidIndex) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.m)
}

// trackPIDLocked records (under mu) that this partition now holds state for pid. A producer
// entry created by an append is checked against the fence memory once more afterwards: a
// FenceProducer that read the index just before this add remembered its epoch before reading,
// so the entry is fenced here instead ("rejected or fenced afterwards", see FenceProducer).
func (p *Partition) trackPIDLocked(pid int64) {
	s := p.topic.store
	s.pids.add(pid, p)
	if min, ok := s.fences.get(pid); ok {
		if e := p.producers.m[pid]; e != nil && e.epoch < min {
			p.producers.fence(pid, min)
		}
	}
}

// untrackPIDLocked drops pid from the index if this partition no longer holds anything for it.
func (p *Partition) untrackPIDLocked(pid int64) {
	_, known := p.producers.m[pid]
	_, guarded := p.producers.guards[pid]
	if !known && !guarded {
		p.topic.store.pids.remove(pid, p)
	}
}

// FenceProducer fences every epoch of pid below epoch (an epoch bump: rejoin, reaper abort, TV2
// per-transaction bump). Partitions holding state for pid (found through the store's pid index,
// plus any given in also, e.g. the transaction's partitions) raise its epoch, reset its window
// and drop its verification guard; the store also remembers pid → epoch (bounded, see
// fenceMemoryMax; lost on restart) so a partition that has no state for pid rejects the zombie's
// older epoch with INVALID_PRODUCER_EPOCH as well. The memory is set before the index is read,
// so an append racing with the fence is either rejected or fenced afterwards (trackPIDLocked).
// The cost is that of the partitions holding state for pid, not of the store's partition count.
func (s *Store) FenceProducer(pid int64, epoch int16, also ...*Partition) {
	s.fences.remember(pid, epoch)
	parts := s.pids.partitions(pid)
	fencesTotal.Inc()
	fencePartitionsTotal.Add(len(parts))
	for _, p := range parts {
		p.fenceIfKnown(pid, epoch)
	}
	for _, p := range also {
		p.fenceIfKnown(pid, epoch)
	}
}

// fenceIfKnown fences pid here only if this partition holds state (or a guard) for it.
func (p *Partition) fenceIfKnown(pid int64, epoch int16) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.producers == nil || p.closed {
		return
	}
	_, known := p.producers.m[pid]
	_, guarded := p.producers.guards[pid]
	if known || guarded {
		p.producers.fence(pid, epoch)
		p.touchLocked(pid)
	}
}

// ---- .txnindex files ----

// Transaction index file (big endian), <base %020d>.txnindex, one per closed segment: the aborted
// transactions whose ABORT marker lies in the segment, sorted by marker offset.
//
//	"KTI1" | count u32 | count × { pid i64 | firstOffset i64 | lastOffset i64 } | crc32c u32
//
// Written atomically (tmp + fsync + rename) when the segment is closed, like the offset indexes;
// a missing or invalid file is rebuilt on open by replaying the log (partition.go recoverLog).
const txnIndexMagic = "KTI1"

var errBadTxnIndex = errors.New("bad transaction index")

func encodeTxnIndex(ents []AbortedTxn) []byte {
	buf := make([]byte, 0, 8+24*len(ents)+4)
	buf = append(buf, txnIndexMagic...)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(ents)))
	for _, a := range ents {
		buf = binary.BigEndian.AppendUint64(buf, uint64(a.ProducerID))
		buf = binary.BigEndian.AppendUint64(buf, uint64(a.FirstOffset))
		buf = binary.BigEndian.AppendUint64(buf, uint64(a.LastOffset))
	}
	return binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf, crcTable))
}

// decodeTxnIndex parses a .txnindex for the segment [base, next) and checks every entry: marker
// inside the segment, strictly increasing, first offset not after the marker, pid >= 0.
func decodeTxnIndex(buf []byte, base, next int64) ([]AbortedTxn, error) {
	if len(buf) < 12 || string(buf[:4]) != txnIndexMagic {
		return nil, errBadTxnIndex
	}
	body := buf[:len(buf)-4]
	if crc32.Checksum(body, crcTable) != binary.BigEndian.Uint32(buf[len(buf)-4:]) {
		return nil, errBadTxnIndex
	}
	n := binary.BigEndian.Uint32(body[4:])
	p := body[8:]
	if uint64(len(p)) != uint64(n)*24 {
		return nil, errBadTxnIndex
	}
	out := make([]AbortedTxn, 0, n)
	for i := uint32(0); i < n; i++ {
		a := AbortedTxn{ProducerID: int64(binary.BigEndian.Uint64(p)), FirstOffset: int64(binary.BigEndian.Uint64(p[8:])),
			LastOffset: int64(binary.BigEndian.Uint64(p[16:]))}
		p = p[24:]
		if a.ProducerID < 0 || a.LastOffset < base || a.LastOffset >= next || a.FirstOffset > a.LastOffset || a.FirstOffset < 0 ||
			(len(out) > 0 && a.LastOffset <= out[len(out)-1].LastOffset) {
			return nil, errBadTxnIndex
		}
		out = append(out, a)
	}
	return out, nil
}

// loadTxnIndex reads a closed segment's .txnindex; ok=false if it is missing or invalid.
func (s *segment) loadTxnIndex(next int64) ([]AbortedTxn, bool) {
	buf, err := os.ReadFile(s.path(".txnindex"))
	if err != nil {
		return nil, false
	}
	ents, err := decodeTxnIndex(buf, s.base, next)
	return ents, err == nil
}

// writeTxnIndex persists a closed segment's aborted transactions (removing the file on failure
// so a stale one is never trusted).
func (s *segment) writeTxnIndex(ents []AbortedTxn) error {
	err := WriteFileAtomic(s.dir, s.name(".txnindex"), encodeTxnIndex(ents))
	if err != nil {
		_ = os.Remove(s.path(".txnindex"))
	}
	return err
}
