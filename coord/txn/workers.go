package txn

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
)

// Package-level metrics (full Prometheus names, registered once).
var (
	openTxns          atomic.Int64 // Ongoing + Prepare* entries across running coordinators
	oldestOpenStartMs atomic.Int64 // TxnStartMs of the oldest open transaction at the last reaper tick, 0 if none

	// Slot files are checkpoints now (checkpoint.go): one observation per checkpoint, covering
	// every slot file it wrote (tmp writes and fsyncs in parallel, renames, one directory fsync).
	slotWriteDuration     = metrics.NewHistogram("kaas_txn_slot_write_duration_seconds")
	slotWritesTotal       = metrics.NewCounter("kaas_txn_slot_writes_total")
	checkpointsTotal      = metrics.NewCounter("kaas_txn_checkpoints_total")
	checkpointErrorsTotal = metrics.NewCounter("kaas_txn_checkpoint_errors_total")
	// Journal (journal.go): one write and one sync per worker batch that changed anything.
	journalWriteDuration    = metrics.NewHistogram("kaas_txn_journal_write_duration_seconds")
	journalSyncDuration     = metrics.NewHistogram("kaas_txn_journal_sync_duration_seconds")
	journalBatchRecords     = metrics.NewHistogram("kaas_txn_journal_batch_records")
	journalBatchBytes       = metrics.NewHistogram("kaas_txn_journal_batch_bytes")
	journalBytesTotal       = metrics.NewCounter("kaas_txn_journal_bytes_total")
	journalErrorsTotal      = metrics.NewCounter("kaas_txn_journal_errors_total")
	journalFullSyncsTotal   = metrics.NewCounter("kaas_txn_journal_full_syncs_total") // batch past the pre-zeroed region: fsync
	journalRotationsTotal   = metrics.NewCounter("kaas_txn_journal_rotations_total")
	journalTruncationsTotal = metrics.NewCounter("kaas_txn_journal_torn_tail_truncations_total")
	expiredIDsTotal         = metrics.NewCounter("kaas_txn_expired_transactional_ids_total")
	unpublishedTotal        = metrics.NewCounter("kaas_txn_unpublished_total")           // Rule P stopped the coordinator
	ignoredRecordsTotal     = metrics.NewCounter("kaas_txn_load_ignored_records_total")  // other-epoch records a cluster load left out
	deadJournalsDeleted     = metrics.NewCounter("kaas_txn_dead_journals_deleted_total") // RemoveDeadJournals
	_                       = metrics.NewGauge("kaas_txn_open_transactions", func() float64 { return float64(openTxns.Load()) })
	_                       = metrics.NewGauge("kaas_txn_oldest_open_age_seconds", func() float64 {
		start := oldestOpenStartMs.Load()
		if start == 0 {
			return 0
		}
		return float64(time.Now().UnixMilli()-start) / 1000
	})
)

var (
	// ErrNotCoordinator: this broker does not own the transactional.id's slot (answer
	// NOT_COORDINATOR, 16).
	ErrNotCoordinator = errors.New("transaction coordinator does not own this transactional.id")
	// ErrClosed: the coordinator is not running (answer COORDINATOR_NOT_AVAILABLE, 15).
	ErrClosed = errors.New("transaction coordinator is not running")
	// ErrLoadInProgress: the transactional.id's slot is being loaded (answer
	// COORDINATOR_LOAD_IN_PROGRESS, 14; the client retries the same broker).
	ErrLoadInProgress = errors.New("transaction coordinator is loading this transactional.id's slot")
	// ErrPublishFenced: the change is durable in the journal but this broker may no longer
	// publish anything (Rule P, cluster.md §2.2: its liveness lease deadline passed, so a
	// successor may already hold the slot). Nothing is answered from it; the coordinator stops
	// serving (answer NOT_COORDINATOR, 16; the client looks the coordinator up again).
	ErrPublishFenced = fmt.Errorf("transaction coordinator may no longer publish (lease deadline passed): %w", ErrNotCoordinator)
	// ErrSlotFenced: LoadSlot found a checkpoint of the slot at a newer epoch than the one it was
	// given (the caller's assignment is stale).
	ErrSlotFenced = errors.New("transaction slot has a checkpoint of a newer coordinator epoch")
	// ErrBusy: the worker's queue is at MaxWorkerQueue (answer COORDINATOR_NOT_AVAILABLE, 15:
	// Apache's coordinator answers that when it cannot append to its log in time; the client
	// retries with backoff).
	ErrBusy = errors.New("transaction coordinator worker queue is full")
)

// MaxWorkerQueue bounds the client operations queued on one worker. Requests are already
// bounded by each connection's in-flight limit, so this is reached only when the journal cannot
// keep up with very many connections; past it a client operation is refused (ErrBusy, counted in
// kaas_queue_rejected_total{queue="txn_worker"}) instead of growing the queue without limit.
// Operations of a saga in flight (internal) are continuations of admitted work and always queued.
var MaxWorkerQueue = 1 << 16

var workerQueueRejected = metrics.GetOrCreateCounter(`kaas_queue_rejected_total{queue="txn_worker"}`)

// ErrorCode maps an operation's Go error to the Kafka error code the handler answers with: a
// slot write failure or a stopped coordinator is the retriable COORDINATOR_NOT_AVAILABLE.
func ErrorCode(err error) int16 {
	switch {
	case err == nil:
		return codec.CodeNone
	case errors.Is(err, ErrNotCoordinator):
		return codec.CodeNotCoordinator
	case errors.Is(err, ErrRecordTooLarge):
		return codec.CodeInvalidRequest
	case errors.Is(err, ErrLoadInProgress):
		return codec.CodeCoordinatorLoadInProgress
	default:
		return codec.CodeCoordinatorNotAvailable
	}
}

// Config configures a Coordinator.
type Config struct {
	// ClusterDir holds txn_state/slot-N.json and the journal generations.
	ClusterDir string
	// BrokerID names this broker's journal files (journal-b<id>-w<worker>-<gen>.log), so a
	// future owner of a slot can tell whose journal it replays (README.md, "Ownership").
	BrokerID int32
	// Incarnation, set in cluster mode only, is this run of the broker (the etcd lease id): it
	// goes into the journal names (journal-b<id>-i<inc>-w<w>-<gen>.log), so a restarted broker
	// and a zombie of its previous run never write the same file, and it switches the slot
	// files to epoch-named checkpoints (slot-N-e<E>.json) with the epoch-filtered replay of
	// LoadSlot (README.md, "Cluster mode"). Start then loads no slot: LoadSlot does. Letters and
	// digits only.
	Incarnation string
	// Publish is Rule P (cluster mode; nil = always true): asked after every batch is durable and
	// before any of its answers, sagas or marker dispatches leave, and before a writer deletes its
	// own checkpointed generations. Once it returns false the coordinator stops serving: every
	// operation answers NOT_COORDINATOR (ErrPublishFenced) and nothing more is written.
	Publish func() bool
	// CheckpointBytes / CheckpointInterval: a worker checkpoints its changed slots into their
	// slot files once its journal grew by this many bytes, or this long after the last
	// checkpoint, whichever comes first (defaults 4 MiB, 5 s).
	CheckpointBytes    int64
	CheckpointInterval time.Duration
	// Workers is the number of worker goroutines, each with its own journal (default 1). Worker
	// w owns every slot with slot % Workers == w and is the only writer of those slots. One is
	// the default because a batch costs one fdatasync whatever it holds, so a single journal
	// makes the largest batches, and concurrent fdatasync streams on one disk mostly queue
	// behind each other (2-core VM: 1 stream p50 0.14 ms, 5 streams p50 0.36 ms / p99 1.8 ms,
	// while the partitions' fsyncs run too): at 64 transactional producers 1 worker gave about
	// twice the commits/s of 5. Applying a batch in memory costs microseconds per op.
	Workers int
	// MaxTimeoutMs is transaction.max.timeout.ms (default 900000).
	MaxTimeoutMs int32
	// ReaperInterval is transaction.abort.timed.out.transaction.cleanup.interval.ms (default 10 s).
	ReaperInterval time.Duration
	// AllocPID allocates producer ids (required).
	AllocPID AllocPID
	// OwnsSlot names the slots Start loads (nil: every slot, single broker); afterwards
	// LoadSlot / ReleaseSlot change the set at runtime. The unit of ownership is the slot, never
	// the transactional.id: routing ids to brokers by a hash different from the slot hash let two
	// brokers rewrite the same slot file in the reference system. Cluster mode must route
	// FindCoordinator by slot as well (Apache's partitionFor).
	OwnsSlot func(slot int) bool
	// Partitions writes markers and fences (required; saga.go). Groups completes staged
	// transactional offsets (nil: no group coordinator, nothing is ever staged).
	Partitions PartitionWriter
	Groups     GroupCompleter
	// EndTxnMarkerWait bounds how long EndTxn waits for its markers and group completions
	// (default 20 s, design/cluster.md §4). Past it the waiter alone answers
	// COORDINATOR_NOT_AVAILABLE (15, retriable: the Java client and franz-go look the coordinator
	// up again and resend EndTxn) and the saga goes on: the entry stays Prepare* with its dispatch
	// in flight, so a retried EndTxn answers CONCURRENT_TRANSACTIONS (51, as Apache answers an
	// EndTxn during PrepareCommit) until Complete* is durable and then NONE (Apache's answer to a
	// retry of a completed EndTxn), and AddPartitions, AddOffsets, verification and
	// InitProducerId answer 51 meanwhile, so no later transaction overtakes the markers. Apache
	// has no such setting (it answers once PrepareCommit is logged), so this is a Go-level knob.
	EndTxnMarkerWait time.Duration
	// IDExpiration is transactional.id.expiration.ms: the reaper removes (durably) entries that
	// are Empty or Complete* and unchanged for this long (default 7 days, Apache's).
	IDExpiration time.Duration
	Logger       *zap.Logger
	// Now is the clock (default time.Now); tests inject a fake.
	Now func() time.Time
	// FS is the slot-file and journal writer (default OSFileSystem); tests inject failures.
	FS FileSystem
}

// Coordinator is the transaction coordinator core: slots in memory, one worker per shard, group
// commit of journal writes, the commit saga (saga.go), a reaper, runtime slot load / release
// (slots.go). All methods are safe for concurrent use and never block the caller: results arrive
// through the done callback — on a worker goroutine, or on the PartitionWriter's for an answer
// that waited for a fence — only after every state change they depend on is durable. Callbacks
// must not block (hand the response off). The package adds no mutex beyond each worker's queue
// lock (worker.mu, a leaf: nothing is called while it is held).
type Coordinator struct {
	cfg     Config
	dir     string
	log     *zap.Logger
	workers []*worker

	running    atomic.Bool
	stopReaper chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once
	// gen is the last journal generation number handed out.
	gen atomic.Uint64
	// crashed makes Close skip the final checkpoint and leave the journal as a crash would
	// (tests only).
	crashed atomic.Bool
	// pubFenced latches the first false answer of Config.Publish.
	pubFenced atomic.Bool
	// status is each slot's load state (slotStatus), written only by the slot's worker (and by
	// Start before the workers run).
	status [NumSlots]atomic.Int32
	// staleBelow[N] = E+1 once slot N was found stale at coordinator epoch E (staleSlot): a load
	// at an epoch below it is refused. 0: never.
	staleBelow [NumSlots]atomic.Int32
}

type slotState struct {
	epoch int32
	// seq is the journal sequence number of the slot's last durable record.
	seq     uint64
	entries map[string]*Entry
	// releaseDone are the callers of ReleaseSlot waiting for the release to finish.
	releaseDone []func(error)
	// stale: a partition leader answered TRANSACTION_COORDINATOR_FENCED to one of this slot's
	// markers, so a newer holder exists; the slot is being unloaded without waiting for its
	// sagas and without serving their internal ops (staleSlot, slots.go).
	stale bool
}

// op is one queued operation. Exactly one of apply/sweep/list/ctl is set.
type op struct {
	tid  string
	slot int
	// apply runs against the slot's in-memory state in queue order; it returns the next entry
	// (the same pointer when nothing changed) and the result handed to done.
	apply func(e *Entry, now time.Time) (*Entry, any)
	// afterFlush ops (releasing a pending flag) run after the batch's writes so a rollback of
	// another op in the same slot cannot undo them; they must not change persisted fields.
	afterFlush bool
	sweep      bool
	list       *ListFilter
	// ctl runs on the worker between batches (slot load / release steps); done is used only
	// when the op cannot be queued (closed).
	ctl func(w *worker)
	// internal ops belong to a saga in flight and are still served while the slot is being
	// released (client ops answer NOT_COORDINATOR then).
	internal bool
	done     func(any, error)
}

type undoRec struct {
	slot int
	tid  string
	prev *Entry
}

type slotAction struct {
	slot int
	act  Action
}

type worker struct {
	c  *Coordinator
	id int

	mu     sync.Mutex
	queue  []*op
	closed bool
	wake   chan struct{}
	quit   chan struct{}
	exited chan struct{}

	// Owned by the worker goroutine.
	slots     map[int]*slotState
	spare     []*op
	results   []any
	undo      []undoRec
	undoSeen  map[string]struct{}
	failed    [NumSlots]error // an entry of the slot cannot be persisted (checkEntry)
	batchErr  error           // the journal append of the batch failed: every op fails
	acts      []slotAction
	outbox    []*saga          // sagas started by the current batch (saga.go)
	releasing map[int]struct{} // slots being released, waiting for their sagas (slots.go)
	open      int64
	oldest    atomic.Int64

	// Journal and checkpoints (checkpoint.go), owned by the worker goroutine.
	cur, next *journal
	retired   []string         // generations rotated out, deleted by the next complete checkpoint
	unck      [NumSlots]bool   // slot changed since its last checkpoint snapshot
	bseq      [NumSlots]uint64 // per-slot seq being assigned in the current batch (0: untouched)
	recs      []pendingRec
	jbuf      []byte
	sinceCk   int64 // journal bytes since the last checkpoint
	lastCk    time.Time
	lastUsed  int64 // bytes the last retired generation took (sizes the next one)
	ckBusy    bool
	prepRetry time.Time
	ckJobs    chan ckJob
	ckRes     chan ckResult
	ckExited  chan struct{}
}

// New validates the config. Call Start to load the slots and start the workers.
func New(cfg Config) (*Coordinator, error) {
	if cfg.ClusterDir == "" {
		return nil, errors.New("cannot create transaction coordinator: ClusterDir is empty")
	}
	if cfg.AllocPID == nil {
		return nil, errors.New("cannot create transaction coordinator: AllocPID is nil")
	}
	if cfg.Partitions == nil {
		return nil, errors.New("cannot create transaction coordinator: Partitions is nil")
	}
	if cfg.IDExpiration <= 0 {
		cfg.IDExpiration = 7 * 24 * time.Hour
	}
	if cfg.Incarnation != "" && !validIncarnation(cfg.Incarnation) {
		return nil, fmt.Errorf("cannot create transaction coordinator: incarnation %q is not letters and digits", cfg.Incarnation)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Workers > NumSlots {
		cfg.Workers = NumSlots
	}
	if cfg.MaxTimeoutMs <= 0 {
		cfg.MaxTimeoutMs = DefaultMaxTimeoutMs
	}
	if cfg.ReaperInterval <= 0 {
		cfg.ReaperInterval = 10 * time.Second
	}
	if cfg.EndTxnMarkerWait <= 0 {
		cfg.EndTxnMarkerWait = DefaultEndTxnMarkerWait
	}
	if cfg.OwnsSlot == nil {
		cfg.OwnsSlot = func(int) bool { return true }
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.FS == nil {
		cfg.FS = OSFileSystem{}
	}
	if cfg.CheckpointBytes <= 0 {
		cfg.CheckpointBytes = 4 << 20
	}
	if cfg.CheckpointInterval <= 0 {
		cfg.CheckpointInterval = 5 * time.Second
	}
	c := &Coordinator{cfg: cfg, dir: filepath.Join(cfg.ClusterDir, StateDir), log: cfg.Logger, stopReaper: make(chan struct{})}
	for i := 0; i < cfg.Workers; i++ {
		c.workers = append(c.workers, &worker{c: c, id: i, wake: make(chan struct{}, 1), quit: make(chan struct{}),
			exited: make(chan struct{}), slots: map[int]*slotState{}, undoSeen: map[string]struct{}{}, releasing: map[int]struct{}{},
			ckJobs: make(chan ckJob, 1), ckRes: make(chan ckResult, 1), ckExited: make(chan struct{})})
	}
	return c, nil
}

// Owns reports whether tid's slot is loaded here (and not being released).
func (c *Coordinator) Owns(tid string) bool {
	return slotStatus(c.status[SlotFor(tid)].Load()) == slotLoaded
}

func (c *Coordinator) workerFor(slot int) *worker { return c.workers[slot%len(c.workers)] }

// clusterMode: epoch-named checkpoints, journals per incarnation, slots only through LoadSlot.
func (c *Coordinator) clusterMode() bool { return c.cfg.Incarnation != "" }

// slotFile is the checkpoint file a holder of slot at epoch writes.
func (c *Coordinator) slotFile(slot int, epoch int32) string {
	if c.clusterMode() {
		return SlotCheckpointName(slot, epoch)
	}
	return SlotFileName(slot)
}

// publishable is Rule P: true while Config.Publish (if any) says this broker may publish; the
// first false is latched (the lease deadline does not come back; the broker fail-stops).
func (c *Coordinator) publishable() bool {
	if c.cfg.Publish == nil {
		return true
	}
	if c.pubFenced.Load() {
		return false
	}
	if c.cfg.Publish() {
		return true
	}
	if !c.pubFenced.Swap(true) {
		unpublishedTotal.Inc()
		c.log.Error("transaction coordinator stops serving: the lease deadline passed (Rule P); nothing more is answered or written")
	}
	return false
}

// Start loads every owned slot file, replays the journal on top of it (journal.go; README.md
// "Recovery"), bumps and persists each slot's coordinator epoch (markers of this incarnation then
// outrank the previous one's) in a checkpoint that also retires the replayed journal, starts the
// workers and the reaper, and re-drives every prepared transaction found (fence to its current
// epoch, markers, groups, Complete: saga.go) in the background; their ids answer
// CONCURRENT_TRANSACTIONS meanwhile. A slot file or journal that cannot be read, or is damaged
// anywhere but in its torn tail, stops the start with an error naming it.
func (c *Coordinator) Start() error {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("cannot create transaction state dir %s: %w", c.dir, err)
	}
	var (
		prepared  int64
		states    [NumSlots]*slotState
		exists    [NumSlots]bool
		openCount = make([]int64, len(c.workers))
	)
	for slot := 0; slot < NumSlots; slot++ {
		if c.clusterMode() || !c.cfg.OwnsSlot(slot) {
			// Cluster mode: nothing is owned before the assignment agent loads it (LoadSlot),
			// and another incarnation's files are only ever read by a load.
			continue
		}
		ls, err := readSlot(c.dir, slot)
		if err != nil {
			return err
		}
		states[slot] = &slotState{epoch: ls.coordinatorEpoch, seq: ls.seq, entries: ls.entries}
		exists[slot] = ls.exists
	}
	var rep replayResult
	if !c.clusterMode() {
		var err error
		if rep, err = c.replayJournals(&states, false, nil); err != nil {
			return err
		}
	}
	var (
		toWrite []string
		data    [][]byte
	)
	for slot, ss := range states {
		if ss == nil {
			continue
		}
		ss.epoch++
		open, prep := ss.prepareLoaded()
		openCount[slot%len(c.workers)] += open
		prepared += prep
		if exists[slot] || rep.touched[slot] {
			var buf bytes.Buffer
			if err := encodeSlot(&buf, ss.epoch, ss.seq, ss.entries); err != nil {
				return fmt.Errorf("cannot encode transaction slot %d: %w", slot, err)
			}
			toWrite, data = append(toWrite, SlotFileName(slot)), append(data, buf.Bytes())
		}
		c.workerFor(slot).slots[slot] = ss
		c.status[slot].Store(int32(slotLoaded))
	}
	if len(toWrite) > 0 {
		for _, err := range writeSlotFiles(c.cfg.FS, c.dir, toWrite, data) {
			if err != nil {
				return err
			}
		}
	}
	// Every replayed record is in a slot file now: the replayed generations go, so this run
	// starts with fresh ones (and a torn tail can only ever be in this run's newest generation).
	c.retireReplayed(rep)
	c.gen.Store(rep.maxGen)
	if err := c.openJournals(); err != nil {
		return err
	}
	for i, w := range c.workers {
		w.open = openCount[i]
		openTxns.Add(openCount[i])
	}
	c.running.Store(true)
	now := time.Now()
	for _, w := range c.workers {
		w.lastCk = now
		go w.ckLoop()
		go w.run()
	}
	// Re-drive what a previous incarnation left prepared, on each worker's goroutine.
	for _, w := range c.workers {
		c.enqueue(&op{slot: w.id, internal: true, ctl: func(w *worker) {
			for slot, ss := range w.slots {
				w.redriveLoaded(slot, ss)
			}
		}})
	}
	c.wg.Add(1)
	go c.reaperLoop()
	c.log.Info("transaction coordinator started", zap.String("dir", c.dir), zap.Int("workers", len(c.workers)),
		zap.Int64("preparedTransactions", prepared), zap.Int("journalRecordsReplayed", rep.records))
	return nil
}

// prepareLoaded stamps a freshly loaded slot's entries with its coordinator epoch and marks every
// Prepare* entry pending (its dispatch is about to be re-driven by redriveLoaded). The entries are
// not shared with anything yet, so they are changed in place. It returns the number of open and
// of prepared transactions.
func (ss *slotState) prepareLoaded() (open, prepared int64) {
	for _, e := range ss.entries {
		e.CoordinatorEpoch = ss.epoch
		if e.State.IsOpen() {
			open++
		}
		if e.State.IsPrepare() {
			e.pending = true
			prepared++
		}
	}
	return open, prepared
}

// redriveLoaded starts the saga of every prepared transaction of a slot just loaded: fence to its
// current epoch (the fence a crashed incarnation may not have applied), markers, groups, Complete.
func (w *worker) redriveLoaded(slot int, ss *slotState) {
	for _, e := range ss.entries {
		if e.State.IsPrepare() && e.pending {
			w.startSaga(Action{
				TransactionalID: e.TransactionalID,
				Fence:           &Fence{ProducerID: e.ProducerID, OldEpoch: NoProducerEpoch, NewEpoch: e.ProducerEpoch},
				Markers:         markersFor(e, e.State == PrepareCommit),
			}, nil, nil)
		}
	}
}

// openJournals creates every worker's first generation (in parallel: each is a small zeroed
// file plus fsyncs).
func (c *Coordinator) openJournals() error {
	errs := make([]error, len(c.workers))
	var wg sync.WaitGroup
	for i, w := range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.cur, errs[i] = createJournal(c.cfg.FS, c.dir, journalID{broker: c.cfg.BrokerID, inc: c.cfg.Incarnation, worker: w.id, gen: c.gen.Add(1)}, journalMinBytes)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, w := range c.workers {
			if w.cur != nil {
				_ = w.cur.f.Close()
				w.cur = nil
			}
		}
		return err
	}
	return nil
}

// Close stops the reaper, lets every worker finish the operations already queued, checkpoints
// every changed slot and deletes the journal (a cleanly stopped coordinator leaves exactly the
// slot files; if the checkpoint fails the journal stays and is replayed on the next start), and
// waits. Operations submitted afterwards fail with ErrClosed.
func (c *Coordinator) Close() {
	c.closeOnce.Do(func() {
		wasRunning := c.running.Swap(false)
		close(c.stopReaper)
		c.wg.Wait()
		for _, w := range c.workers {
			w.mu.Lock()
			w.closed = true
			w.mu.Unlock()
			close(w.quit)
		}
		// Each worker checkpoints and stops its checkpointer on its way out (worker.shutdown);
		// workers that never started have neither.
		if wasRunning {
			for _, w := range c.workers {
				<-w.exited
				openTxns.Add(-w.open)
			}
		}
	})
}

// submit queues a custom operation on tid's worker (tests). apply runs with the entry (nil if
// unknown) and returns the next entry (the same pointer for no change; a new value otherwise,
// never a mutated input) and a result; done receives the result once every slot write of the
// batch it ran in is durable, or an error (ErrorCode maps it). done runs on the worker goroutine
// and must not block.
func (c *Coordinator) submit(tid string, apply func(e *Entry, now time.Time) (next *Entry, result any), done func(result any, err error)) {
	c.enqueue(&op{tid: tid, slot: SlotFor(tid), apply: apply, done: done})
}

func (c *Coordinator) enqueue(o *op) {
	w := c.workerFor(o.slot)
	w.mu.Lock()
	if w.closed || !c.running.Load() {
		w.mu.Unlock()
		if o.done != nil {
			o.done(nil, ErrClosed)
		}
		return
	}
	if !o.internal && o.apply != nil && len(w.queue) >= MaxWorkerQueue {
		w.mu.Unlock()
		workerQueueRejected.Inc()
		if o.done != nil {
			o.done(nil, ErrBusy)
		}
		return
	}
	w.queue = append(w.queue, o)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// submitTyped wraps a typed transition for the queue without exposing any to callers.
func submitTyped[R any](c *Coordinator, tid string, apply func(*Entry, time.Time) (*Entry, R), done func(R, error)) {
	submitOp(c, &op{tid: tid, slot: SlotFor(tid)}, apply, done)
}

func submitOp[R any](c *Coordinator, o *op, apply func(*Entry, time.Time) (*Entry, R), done func(R, error)) {
	o.apply = func(e *Entry, now time.Time) (*Entry, any) { return apply(e, now) }
	if done != nil {
		o.done = func(r any, err error) {
			if err != nil {
				var zero R
				done(zero, err)
				return
			}
			done(r.(R), nil)
		}
	}
	c.enqueue(o)
}

// InitProducerID runs the transactional InitProducerId. MaxTimeoutMs defaults to the config. Every
// epoch bump is fenced on the partitions before done runs, so the new epoch is already the floor
// when the producer learns it; the abort markers of a rejoin that fenced an Ongoing transaction
// are written in the background (the client retries its CONCURRENT_TRANSACTIONS until they are
// done). The result's Action is always zero: the coordinator carried it out.
func (c *Coordinator) InitProducerID(p InitProducerIDParams, done func(InitProducerIDResult, error)) {
	if p.MaxTimeoutMs <= 0 {
		p.MaxTimeoutMs = c.cfg.MaxTimeoutMs
	}
	slot := SlotFor(p.TransactionalID)
	submitTyped(c, p.TransactionalID, func(e *Entry, now time.Time) (*Entry, InitProducerIDResult) {
		return InitProducerID(e, p, now, c.cfg.AllocPID)
	}, func(res InitProducerIDResult, err error) {
		act := res.Action
		res.Action = Action{}
		if err != nil || act.IsZero() {
			done(res, err)
			return
		}
		c.workerFor(slot).startSaga(act, func(err error) {
			if err != nil {
				done(InitProducerIDResult{}, err)
				return
			}
			done(res, nil)
		}, nil)
	})
}

// AddPartitions runs AddPartitionsToTxn v0-3 or (p.Implicit) the TV2 implicit add.
func (c *Coordinator) AddPartitions(p AddPartitionsParams, done func(AddPartitionsResult, error)) {
	submitTyped(c, p.TransactionalID, func(e *Entry, now time.Time) (*Entry, AddPartitionsResult) {
		return AddPartitions(e, p, now)
	}, done)
}

// Verify runs KIP-890 part-1 verification (read-only; still ordered after earlier operations).
func (c *Coordinator) Verify(p VerifyParams, done func(VerifyResult, error)) {
	submitTyped(c, p.TransactionalID, func(e *Entry, _ time.Time) (*Entry, VerifyResult) {
		return e, Verify(e, p)
	}, done)
}

// AddOffsets runs AddOffsetsToTxn or (p.Implicit) the TxnOffsetCommit v5 group add.
func (c *Coordinator) AddOffsets(p AddOffsetsParams, done func(AddOffsetsResult, error)) {
	submitTyped(c, p.TransactionalID, func(e *Entry, now time.Time) (*Entry, AddOffsetsResult) {
		return AddOffsets(e, p, now)
	}, done)
}

// EndTxn runs the whole end of a transaction (saga.go): Prepare* durable, fence, markers, group
// completion, Complete* durable — and only then done, with NONE (plus, for v5, the producer's
// next id and epoch). Unlike Apache, which answers once the prepare is logged, the answer waits
// for completion, so when commitTransaction() returns read_committed consumers already see the
// data and the committed offsets are fetchable. A dispatch that fails, or that is not done
// within Config.EndTxnMarkerWait (the sending goes on), answers the retriable
// COORDINATOR_NOT_AVAILABLE; the transaction stays prepared and is re-driven (a retry in the
// same direction answers CONCURRENT_TRANSACTIONS while that is in flight, then NONE). The
// result's Action is always zero.
func (c *Coordinator) EndTxn(p EndTxnParams, done func(EndTxnResult, error)) {
	slot := SlotFor(p.TransactionalID)
	c.prepareEndTxn(p, func(res EndTxnResult, err error) {
		act := res.Action
		res.Action = Action{}
		switch {
		case err != nil || act.IsZero():
			done(res, err)
		case res.Code != codec.CodeNone:
			// An error may still carry work: a retried EndTxn on a prepared transaction whose
			// earlier dispatch failed re-drives the markers; this answer is 51.
			c.workerFor(slot).startSaga(act, nil, nil)
			done(res, nil)
		case act.Markers == nil:
			c.workerFor(slot).startSaga(act, func(err error) {
				if err != nil {
					done(EndTxnResult{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch}, err)
					return
				}
				done(res, nil)
			}, nil)
		default:
			c.workerFor(slot).startSaga(act, nil, c.boundedWait(p.TransactionalID, func(code int16) {
				if code != codec.CodeNone {
					res = EndTxnResult{Code: code, ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch}
				}
				done(res, nil)
			}))
		}
	})
}

// prepareEndTxn is EndTxn's first step alone: the transition, durable, with its Action handed to
// done instead of carried out (tests drive the saga's steps by hand through it).
func (c *Coordinator) prepareEndTxn(p EndTxnParams, done func(EndTxnResult, error)) {
	submitTyped(c, p.TransactionalID, func(e *Entry, now time.Time) (*Entry, EndTxnResult) {
		return EndTxn(e, p, now, c.cfg.AllocPID)
	}, done)
}

// complete records that every marker of a prepared transaction is durable and its groups are
// completed (the saga's last step).
func (c *Coordinator) complete(p CompleteParams, done func(CompleteResult, error)) {
	submitOp(c, &op{tid: p.TransactionalID, slot: SlotFor(p.TransactionalID), internal: true},
		func(e *Entry, now time.Time) (*Entry, CompleteResult) { return Complete(e, p, now) }, done)
}

// TxnOffsetCommitCheck is the transaction-coordinator half of TxnOffsetCommit, answered with the
// code the client sees: for v5 (TV2) the implicit add of the group (AddOffsets, Implicit), for
// v0-4 the read-only check that the group is in the producer's Ongoing transaction (VerifyGroup),
// translated as Apache's AddPartitionsToTxnManager does (TranslateTxnOffsetCommitCode). A
// coordinator that cannot answer (closed, not the owner, loading, journal write failed) is the
// retriable COORDINATOR_NOT_AVAILABLE.
func (c *Coordinator) TxnOffsetCommitCheck(p TxnOffsetCommitParams, done func(code int16)) {
	answer := func(code int16, err error) {
		if err != nil {
			code = codec.CodeCoordinatorNotAvailable
		}
		done(TranslateTxnOffsetCommitCode(code, p.Version))
	}
	if p.Version >= 5 {
		c.AddOffsets(AddOffsetsParams{TransactionalID: p.TransactionalID, ProducerID: p.ProducerID,
			ProducerEpoch: p.ProducerEpoch, Group: p.Group, Version: p.Version, Implicit: true},
			func(res AddOffsetsResult, err error) { answer(res.Code, err) })
		return
	}
	submitTyped(c, p.TransactionalID, func(e *Entry, _ time.Time) (*Entry, int16) {
		return e, VerifyGroup(e, p)
	}, answer)
}

// Snapshot hands done a copy of tid's entry (nil if unknown), ordered after every earlier
// operation on it.
func (c *Coordinator) Snapshot(tid string, done func(*Entry, error)) {
	submitTyped(c, tid, func(e *Entry, _ time.Time) (*Entry, *Entry) {
		if e == nil {
			return e, nil
		}
		return e, e.clone()
	}, done)
}

// markersFailed releases the in-flight flag of a prepared transaction whose marker dispatch gave
// up, so a retried EndTxn or the next reaper tick hands the markers out again. done may be nil.
func (c *Coordinator) markersFailed(m *Markers, done func(error)) {
	o := &op{tid: m.TransactionalID, slot: SlotFor(m.TransactionalID), afterFlush: true, internal: true}
	o.apply = func(e *Entry, _ time.Time) (*Entry, any) {
		if e == nil || !e.pending || !e.State.IsPrepare() || e.ProducerID != m.ProducerID || e.ProducerEpoch != m.ProducerEpoch {
			return e, nil
		}
		next := e.clone()
		next.pending = false
		return next, nil
	}
	if done != nil {
		o.done = func(_ any, err error) { done(err) }
	}
	c.enqueue(o)
}

// Describe answers DescribeTransactions for one transactional.id.
func (c *Coordinator) Describe(tid string, done func(DescribeResult, error)) {
	submitTyped(c, tid, func(e *Entry, _ time.Time) (*Entry, DescribeResult) {
		return e, Describe(tid, e)
	}, done)
}

// List answers ListTransactions over every owned slot. Unknown state filters are reported, as
// Apache does, and match nothing.
func (c *Coordinator) List(f ListFilter, done func(txns []ListedTxn, unknownStates []string, err error)) {
	var (
		mu      sync.Mutex
		all     []ListedTxn
		firstEr error
		left    = len(c.workers)
	)
	unknown := f.UnknownStates()
	for _, w := range c.workers {
		o := &op{slot: w.id, list: &f}
		o.done = func(r any, err error) {
			mu.Lock()
			if err != nil && firstEr == nil {
				firstEr = err
			}
			if l, ok := r.([]ListedTxn); ok {
				all = append(all, l...)
			}
			left--
			last := left == 0
			mu.Unlock()
			if last && done != nil {
				sort.Slice(all, func(i, j int) bool { return all[i].TransactionalID < all[j].TransactionalID })
				done(all, unknown, firstEr)
			}
		}
		c.enqueue(o)
	}
}

// ReapNow runs one reaper pass on every worker now (the ticker does the same every
// ReaperInterval); done, if set, gets the number of sagas it started (aborts and re-drives).
func (c *Coordinator) ReapNow(done func(actions int)) {
	var left, total atomic.Int64
	left.Store(int64(len(c.workers)))
	for _, w := range c.workers {
		c.enqueue(&op{slot: w.id, sweep: true, done: func(r any, _ error) {
			n, _ := r.(int)
			total.Add(int64(n))
			if left.Add(-1) == 0 {
				c.publishOldest()
				if done != nil {
					done(int(total.Load()))
				}
			}
		}})
	}
}

func (c *Coordinator) publishOldest() {
	var oldest int64
	for _, w := range c.workers {
		if o := w.oldest.Load(); o != 0 && (oldest == 0 || o < oldest) {
			oldest = o
		}
	}
	oldestOpenStartMs.Store(oldest)
}

func (c *Coordinator) reaperLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.ReaperInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			c.ReapNow(nil)
		case <-c.stopReaper:
			return
		}
	}
}

// ---------------------------------------------------------------------------------------------
// worker

func (w *worker) run() {
	defer close(w.exited)
	// The tick only drives interval checkpoints and retries of a failed generation creation.
	tick := time.NewTicker(min(max(w.c.cfg.CheckpointInterval/4, time.Millisecond), time.Second))
	defer tick.Stop()
	for {
		select {
		case <-w.wake:
		case r := <-w.ckRes:
			w.ckDone(r, time.Now())
		case <-tick.C:
		case <-w.quit:
			// Drain what was queued before Close; nothing can be added any more.
			for {
				w.mu.Lock()
				batch := w.queue
				w.queue = nil
				w.mu.Unlock()
				if len(batch) == 0 {
					// Past the lease deadline (a fail-stop, or a crash in tests) nothing more is
					// written (Rule P): the journal stays as it is, like after kill -9.
					w.shutdown(!w.c.crashed.Load() && w.c.publishable())
					return
				}
				w.processAll(batch)
			}
		}
		w.mu.Lock()
		batch := w.queue
		w.queue = w.spare[:0]
		w.mu.Unlock()
		if len(batch) > 0 {
			w.processAll(batch)
		}
		clear(batch)
		w.spare = batch[:0]
		w.housekeeping(time.Now())
	}
}

// processAll cuts the queue after every after-flush op, so an op submitted after markersFailed
// always sees the released flag (queue order is the order every op observes), and around every
// control op, which runs alone once everything queued before it is durable.
func (w *worker) processAll(batch []*op) {
	for len(batch) > 0 {
		if o := batch[0]; o.ctl != nil {
			o.ctl(w)
			w.dispatchOutbox()
			batch = batch[1:]
			for slot := range w.releasing {
				w.finishRelease(slot)
			}
			continue
		}
		n := len(batch)
		for i, o := range batch {
			if o.afterFlush {
				n = i + 1
				break
			}
			if o.ctl != nil {
				n = i
				break
			}
		}
		w.process(batch[:n])
		batch = batch[n:]
		for slot := range w.releasing {
			w.finishRelease(slot)
		}
	}
}

// process is the group commit: apply every op of the batch in order against the in-memory
// state (later ops see earlier ops' effects), append one journal record per changed entry with
// one write and one fdatasync, roll everything back if that failed, and only then run the
// callbacks.
func (w *worker) process(batch []*op) {
	c := w.c
	now := c.cfg.Now()
	if cap(w.results) < len(batch) {
		w.results = make([]any, len(batch))
	}
	results := w.results[:len(batch)]
	w.undo = w.undo[:0]
	clear(w.undoSeen)
	w.acts = w.acts[:0]
	sweepActs := make([]int, len(batch)) // index into w.acts end for sweep ops; 0 otherwise

	if c.pubFenced.Load() {
		// Rule P stopped this coordinator: nothing is applied, written or answered but 16.
		for _, o := range batch {
			if o.done != nil {
				o.done(nil, ErrPublishFenced)
			}
		}
		return
	}
	for i, o := range batch {
		switch {
		case o.afterFlush:
			continue
		case o.sweep:
			before := len(w.acts)
			w.sweep(now)
			sweepActs[i] = len(w.acts) - before
		case o.list != nil:
			results[i] = w.list(*o.list, now)
		default:
			ss := w.slots[o.slot]
			switch st := slotStatus(c.status[o.slot].Load()); {
			case st == slotLoading:
				results[i] = ErrLoadInProgress
				continue
			case ss == nil || (st == slotReleasing && (!o.internal || ss.stale)):
				results[i] = ErrNotCoordinator
				continue
			}
			cur := ss.entries[o.tid]
			next, res := o.apply(cur, now)
			if next != cur && w.refuseTooLarge(o.tid, next) {
				results[i] = ErrRecordTooLarge
				continue
			}
			w.set(o.slot, ss, o.tid, cur, next)
			results[i] = res
		}
	}

	w.flush()

	for i, o := range batch {
		if !o.afterFlush {
			continue
		}
		if ss := w.slots[o.slot]; ss != nil {
			cur := ss.entries[o.tid]
			next, res := o.apply(cur, now)
			if next != cur {
				if !persistedEqual(cur, next) {
					panic("BUG: after-flush transaction op changed persisted state of " + o.tid)
				}
				ss.entries[o.tid] = next
			}
			results[i] = res
		}
	}

	// Coordinator-initiated follow-ups (reaper aborts and re-drives) join the outbox first.
	if w.batchErr == nil {
		for _, sa := range w.acts {
			if w.failed[sa.slot] == nil {
				w.startSaga(sa.act, nil, nil)
			}
		}
	}
	for i, o := range batch {
		res := results[i]
		results[i] = nil
		if o.done == nil {
			continue
		}
		switch {
		case w.batchErr == ErrPublishFenced:
			o.done(nil, ErrPublishFenced)
		case o.sweep:
			o.done(sweepActs[i], nil)
		case o.list != nil:
			o.done(res, nil)
		case res == ErrNotCoordinator || res == ErrLoadInProgress || res == ErrRecordTooLarge:
			o.done(nil, res.(error))
		case w.batchErr != nil:
			o.done(nil, w.batchErr)
		case w.failed[o.slot] != nil:
			o.done(nil, w.failed[o.slot])
		default:
			o.done(res, nil)
		}
	}
	clear(w.failed[:])
	w.batchErr = nil
	// Every saga the batch started (its callbacks ran above) goes out together.
	w.dispatchOutbox()
}

// set installs next for tid, remembering the pre-batch entry for rollback (flush journals the
// entries whose persisted fields differ from it).
func (w *worker) set(slot int, ss *slotState, tid string, cur, next *Entry) {
	if next == cur {
		return
	}
	if _, seen := w.undoSeen[tid]; !seen {
		w.undoSeen[tid] = struct{}{}
		w.undo = append(w.undo, undoRec{slot: slot, tid: tid, prev: cur})
	}
	if cur == nil && next != nil {
		next.CoordinatorEpoch = ss.epoch
	}
	w.install(ss, tid, cur, next)
}

func (w *worker) install(ss *slotState, tid string, cur, next *Entry) {
	if next == nil {
		delete(ss.entries, tid)
	} else {
		ss.entries[tid] = next
	}
	var d int64
	if cur != nil && cur.State.IsOpen() {
		d--
	}
	if next != nil && next.State.IsOpen() {
		d++
	}
	if d != 0 {
		w.open += d
		openTxns.Add(d)
	}
}

// flush makes the batch durable: one journal record per entry whose persisted fields changed
// (the full entry, or its deletion), appended with one write and one fdatasync. If that fails,
// every change of the batch is rolled back to what is durable and every op gets the error. An
// entry that must never reach the disk (checkEntry) fails and rolls back its slot only.
func (w *worker) flush() {
	recs := w.recs[:0]
	for _, u := range w.undo {
		cur := w.slots[u.slot].entries[u.tid]
		if persistedEqual(u.prev, cur) {
			continue
		}
		if cur != nil {
			if err := checkEntry(u.slot, u.tid, cur); err != nil {
				w.failed[u.slot] = fmt.Errorf("cannot persist transaction slot %d: %w", u.slot, err)
				continue
			}
		}
		recs = append(recs, pendingRec{slot: u.slot, tid: u.tid, entry: cur, prepare: startsPrepare(u.prev, cur)})
	}
	n := 0
	for _, r := range recs {
		if w.failed[r.slot] == nil {
			recs[n] = r
			n++
		}
	}
	clear(recs[n:])
	recs = recs[:n]
	if len(recs) > 0 {
		if err := w.appendBatch(recs); err != nil {
			w.batchErr = err
		} else {
			for _, r := range recs {
				w.slots[r.slot].seq = r.seq
				w.unck[r.slot] = true
				if r.prepare {
					// The entry was created by this batch and is not shared yet.
					r.entry.PrepareSeq = r.seq
				}
			}
		}
		for _, r := range recs {
			w.bseq[r.slot] = 0
		}
	}
	clear(recs)
	w.recs = recs[:0]
	// Rule P: every answer of the batch (and the sagas it starts) is published only if the
	// lease deadline still holds now that its records are durable. A batch that wrote nothing
	// (a Describe, a Verify, a List) is checked too: a successor may have changed that state.
	if w.batchErr == nil && !w.c.publishable() {
		w.batchErr = ErrPublishFenced
	}

	rolledBack := false
	for i := len(w.undo) - 1; i >= 0; i-- {
		u := w.undo[i]
		if w.batchErr == nil && w.failed[u.slot] == nil {
			continue
		}
		ss := w.slots[u.slot]
		w.install(ss, u.tid, ss.entries[u.tid], u.prev)
		rolledBack = true
	}
	if rolledBack {
		if w.batchErr != nil {
			w.c.log.Error("transaction journal write failed; batch rolled back to the durable state", zap.Error(w.batchErr))
		}
		for slot, err := range w.failed {
			if err != nil {
				w.c.log.Error("transaction slot change cannot be persisted; rolled back to the durable state",
					zap.Int("slot", slot), zap.Error(err))
			}
		}
	}
}

// sweep is one reaper pass over the worker's loaded slots: abort timed-out transactions (with a
// fence), re-drive prepared transactions nobody is dispatching (reconcile), remove expired
// transactional.ids, warn about hanging ones, and record the oldest open transaction for the age
// gauge. A slot being released starts nothing new.
func (w *worker) sweep(now time.Time) {
	c := w.c
	var oldest int64
	for slot, ss := range w.slots {
		if slotStatus(c.status[slot].Load()) != slotLoaded {
			continue
		}
		for tid, e := range ss.entries {
			if Expired(e, now, c.cfg.IDExpiration) {
				// Apache's transactional.id.expiration.ms: the id is forgotten (Dead, then
				// removed); the journal records the deletion, the next checkpoint drops it from
				// the slot file. A producer coming back later starts over with a fresh id.
				mustTransition(e.State, Dead)
				w.set(slot, ss, tid, e, nil)
				expiredIDsTotal.Inc()
				c.log.Info("expiring transactional.id", zap.String("transactionalId", tid),
					zap.Int64("producerId", e.ProducerID), zap.Stringer("state", e.State),
					zap.Duration("idleFor", time.Duration(now.UnixMilli()-e.LastUpdateMs)*time.Millisecond))
				continue
			}
			if next, act, ok := ReaperAbort(e, now, c.cfg.AllocPID); ok {
				w.set(slot, ss, tid, e, next)
				w.acts = append(w.acts, slotAction{slot: slot, act: act})
				c.log.Info("aborting timed-out transaction", zap.String("transactionalId", tid),
					zap.Int64("producerId", e.ProducerID), zap.Int16("fencedEpoch", e.ProducerEpoch),
					zap.Int16("abortEpoch", next.ProducerEpoch), zap.Int32("timeoutMs", e.TimeoutMs))
				e = next
			} else if e.State.IsPrepare() && !e.pending {
				next := e.clone()
				next.pending = true
				w.set(slot, ss, tid, e, next)
				w.acts = append(w.acts, slotAction{slot: slot, act: Action{TransactionalID: tid,
					Markers: markersFor(next, e.State == PrepareCommit)}})
				e = next
			} else if openFor, hanging := Hanging(e, now); hanging {
				c.log.Warn("transaction open longer than its timeout", zap.String("transactionalId", tid),
					zap.Int64("producerId", e.ProducerID), zap.Int16("producerEpoch", e.ProducerEpoch),
					zap.Stringer("state", e.State), zap.Duration("openFor", openFor),
					zap.Int32("timeoutMs", e.TimeoutMs))
			}
			if e.State.IsOpen() {
				if s := txnStart(e); s != 0 && (oldest == 0 || s < oldest) {
					oldest = s
				}
			}
		}
	}
	w.oldest.Store(oldest)
}

func (w *worker) list(f ListFilter, now time.Time) []ListedTxn {
	var out []ListedTxn
	for slot, ss := range w.slots {
		if slotStatus(w.c.status[slot].Load()) != slotLoaded {
			continue
		}
		for tid, e := range ss.entries {
			if f.Match(e, now) {
				out = append(out, ListedTxn{TransactionalID: tid, ProducerID: e.ProducerID, State: e.State.String()})
			}
		}
	}
	return out
}
