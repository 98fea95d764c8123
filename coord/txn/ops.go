package txn

// Pure transition functions, one per coordinator API, with the semantics of Apache Kafka's
// TransactionCoordinator (3.x / 4.0 incl. KIP-360, KIP-588, KIP-890 part 1 and 2). Each takes the
// current entry (nil if the transactional.id is unknown), the request parameters, the clock and a
// producer-id allocator, and returns the next entry (the same pointer when nothing changed) and a
// result carrying Kafka error codes plus the Action the caller must carry out once the change is
// durable (fence partitions, write markers). None of them mutates its input.
//
// Validation order is Apache's: empty transactional.id → INVALID_REQUEST; unknown id → 49;
// producer id mismatch → 49; epoch mismatch → PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for request
// versions older than KIP-588); transition in flight → CONCURRENT_TRANSACTIONS; illegal
// transition → INVALID_TXN_STATE (48). Deviations from that order are Apache's own and are named
// where they happen (KAFKA-18464: pending before epoch under TV2).

import (
	"math"
	"slices"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kaas-go/kaas/codec"
)

// mTooLongIDs counts requests refused for a transactional.id over MaxTransactionalIDLen.
var mTooLongIDs = metrics.NewCounter("kaas_txn_transactional_id_too_long_total")

// AllocPID hands out a fresh, cluster-unique producer id (the persisted block allocator).
type AllocPID func() (int64, error)

const (
	// DefaultMaxTimeoutMs is transaction.max.timeout.ms (15 min).
	DefaultMaxTimeoutMs int32 = 900_000
	maxEpoch                  = math.MaxInt16
)

// isEpochExhausted is Apache's TransactionMetadata.isEpochExhausted: epochs stop being handed to
// clients at Short.MaxValue-1 so the coordinator can always fence with one more bump.
func isEpochExhausted(e int16) bool { return e >= maxEpoch-1 }

// Request versions that introduced PRODUCER_FENCED (KIP-588, Kafka 2.7). Older clients get
// INVALID_PRODUCER_EPOCH instead, exactly like Apache's KafkaApis response callbacks.
const (
	initProducerIDFencedSince int16 = 4
	addPartitionsFencedSince  int16 = 2
	addOffsetsFencedSince     int16 = 2
	endTxnFencedSince         int16 = 2
)

func fencedCode(version, since int16) int16 {
	if version < since {
		return codec.CodeInvalidProducerEpoch
	}
	return codec.CodeProducerFenced
}

// MaxTransactionalIDLen is the longest transactional.id accepted: Apache writes it as a
// length-prefixed string with a signed 16-bit length in __transaction_state, so it refuses
// anything longer than Short.MAX_VALUE bytes. Flexible request versions can carry longer
// strings; they never reach the state.
const MaxTransactionalIDLen = math.MaxInt16

// CheckTransactionalID is the caller's first gate: an empty transactional.id on a coordinator API
// is INVALID_REQUEST (a null one on InitProducerId is the idempotent path and never gets here), and
// so is one longer than MaxTransactionalIDLen bytes.
func CheckTransactionalID(tid string) int16 {
	if tid == "" || len(tid) > MaxTransactionalIDLen {
		if len(tid) > MaxTransactionalIDLen {
			mTooLongIDs.Inc()
		}
		return codec.CodeInvalidRequest
	}
	return codec.CodeNone
}

// Fence tells the caller to raise ProducerID's epoch to NewEpoch on every partition (local and,
// in cluster mode, peers), so batches from the old session are rejected with
// INVALID_PRODUCER_EPOCH. Every epoch bump produces one, the reaper's included.
type Fence struct {
	ProducerID int64
	OldEpoch   int16
	NewEpoch   int16
}

// Markers is a COMMIT/ABORT marker dispatch owed for a Prepare* transaction. Once every marker is
// durable the caller submits Complete with the same (ProducerID, ProducerEpoch, Commit). An empty
// dispatch set (offset-only or empty transaction) still requires Complete: that is what commits or
// discards the staged offsets and unblocks the next transaction.
type Markers struct {
	TransactionalID  string
	ProducerID       int64
	ProducerEpoch    int16
	Commit           bool
	CoordinatorEpoch int32
	TxnVersion       int8
	// PrepareSeq is the prepared entry's Entry.PrepareSeq, filled in when the saga starts (the
	// journal assigns it when the prepare is appended, after the op that built these Markers).
	PrepareSeq uint64
	Partitions []TopicPartitions
	Groups     []string
}

// Action is the follow-up work of an operation, carried out by the coordinator's saga (saga.go).
// Fence, when set, is applied before the markers are written (markers carry the new epoch, so
// order matters only for the in-memory dedupe window, but fencing first also stops zombie appends
// racing the markers).
type Action struct {
	TransactionalID string
	Fence           *Fence
	Markers         *Markers
}

// IsZero reports an action with nothing to do.
func (a Action) IsZero() bool { return a.Fence == nil && a.Markers == nil }

func markersFor(e *Entry, commit bool) *Markers {
	return &Markers{
		TransactionalID:  e.TransactionalID,
		ProducerID:       e.ProducerID,
		ProducerEpoch:    e.ProducerEpoch,
		Commit:           commit,
		CoordinatorEpoch: e.CoordinatorEpoch,
		TxnVersion:       e.TxnVersion,
		Partitions:       e.partitionList(),
		Groups:           slices.Clone(e.Groups),
	}
}

// PartitionResult is one partition's outcome in AddPartitionsToTxn / verification.
type PartitionResult struct {
	Topic     string
	Partition int32
	Code      int16
}

func repeatCode(tps []TopicPartitions, code int16) []PartitionResult {
	n := 0
	for _, tp := range tps {
		n += len(tp.Partitions)
	}
	out := make([]PartitionResult, 0, n)
	for _, tp := range tps {
		for _, p := range tp.Partitions {
			out = append(out, PartitionResult{Topic: tp.Topic, Partition: p, Code: code})
		}
	}
	return out
}

// ---------------------------------------------------------------------------------------------
// InitProducerId (key 22, v0-5)

// InitProducerIDParams is a transactional InitProducerId request.
type InitProducerIDParams struct {
	TransactionalID string
	TimeoutMs       int32
	// ProducerID / ProducerEpoch are the KIP-360 (v3+) "expected" pair; -1/-1 when absent.
	ProducerID    int64
	ProducerEpoch int16
	Version       int16
	// MaxTimeoutMs is transaction.max.timeout.ms; <= 0 means DefaultMaxTimeoutMs. The Coordinator
	// fills it from its config.
	MaxTimeoutMs int32
}

// InitProducerIDResult is the response data plus follow-up.
type InitProducerIDResult struct {
	Code          int16
	ProducerID    int64
	ProducerEpoch int16
	// Action: Fence for every bump of an epoch that was handed out; Fence+Markers(abort) when the
	// call fenced an Ongoing transaction (then Code is CONCURRENT_TRANSACTIONS and the client
	// retries once the abort completes, getting a second bump — Apache's behaviour).
	Action Action
}

// InitProducerID implements TransactionCoordinator.handleInitProducerId for a non-empty
// transactional.id.
func InitProducerID(e *Entry, p InitProducerIDParams, now time.Time, alloc AllocPID) (*Entry, InitProducerIDResult) {
	res := InitProducerIDResult{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch}
	fail := func(code int16) (*Entry, InitProducerIDResult) {
		res.Code = code
		return e, res
	}
	if c := CheckTransactionalID(p.TransactionalID); c != codec.CodeNone {
		return fail(c)
	}
	maxTimeout := p.MaxTimeoutMs
	if maxTimeout <= 0 {
		maxTimeout = DefaultMaxTimeoutMs
	}
	if p.TimeoutMs <= 0 || p.TimeoutMs > maxTimeout {
		return fail(codec.CodeInvalidTransactionTimeout)
	}
	nowMs := now.UnixMilli()
	fenced := fencedCode(p.Version, initProducerIDFencedSince)

	cur := e
	if cur == nil {
		// Apache creates the metadata at epoch -1 and runs the ordinary bump, which yields 0.
		pid, err := alloc()
		if err != nil {
			return fail(codec.CodeCoordinatorNotAvailable)
		}
		cur = &Entry{
			TransactionalID:   p.TransactionalID,
			ProducerID:        pid,
			ProducerEpoch:     NoProducerEpoch,
			LastProducerID:    NoProducerID,
			LastProducerEpoch: NoProducerEpoch,
			NextProducerID:    NoProducerID,
			State:             Empty,
			TimeoutMs:         p.TimeoutMs,
			TxnVersion:        1,
		}
	}
	if cur.pending {
		return fail(codec.CodeConcurrentTransactions)
	}
	hasExpected := p.ProducerID != NoProducerID
	// KIP-360 isValidProducerId: a fresh entry, the current id, or the previous id with an
	// exhausted epoch (a retry that lost the response of a rotation).
	if hasExpected && !(cur.ProducerEpoch == NoProducerEpoch || p.ProducerID == cur.ProducerID ||
		(p.ProducerID == cur.LastProducerID && isEpochExhausted(p.ProducerEpoch))) {
		return fail(fenced)
	}

	switch cur.State {
	case PrepareCommit, PrepareAbort:
		return fail(codec.CodeConcurrentTransactions)

	case Ongoing:
		// Rejoin during a transaction: fence the old session (PrepareEpochFence) and abort its
		// transaction with the bumped epoch, keeping its partitions and groups as the abort's
		// dispatch set. The bumped epoch is never returned: the client gets 51, retries after the
		// abort completes and receives a second bump (Apache prepareFenceProducerEpoch).
		next, act, code := fenceAbort(cur, nowMs, alloc)
		if code != codec.CodeNone {
			return fail(code)
		}
		res.Code = codec.CodeConcurrentTransactions
		res.Action = act
		return next, res

	case Empty, CompleteCommit, CompleteAbort:
		next := cur.clone()
		switch {
		case isEpochExhausted(cur.ProducerEpoch) && (!hasExpected || p.ProducerEpoch == cur.ProducerEpoch):
			// prepareProducerIdRotation: a fresh id at epoch 0; the old id is remembered so a
			// retry carrying (old id, exhausted epoch) is recognised.
			pid, err := alloc()
			if err != nil {
				return fail(codec.CodeCoordinatorNotAvailable)
			}
			next.LastProducerID = cur.ProducerID
			next.LastProducerEpoch = NoProducerEpoch
			if hasExpected {
				next.LastProducerEpoch = cur.ProducerEpoch
			}
			next.ProducerID, next.ProducerEpoch = pid, 0
			// The old id is retired: fence it at the top epoch on every partition.
			res.Action.Fence = &Fence{ProducerID: cur.ProducerID, OldEpoch: cur.ProducerEpoch, NewEpoch: maxEpoch}
		case isEpochExhausted(cur.ProducerEpoch):
			// Expected epoch given and different from the exhausted current one: only a retry
			// of the call that produced the current epoch is acceptable.
			if p.ProducerEpoch == cur.LastProducerEpoch {
				return successInit(cur, res)
			}
			return fail(fenced)
		default:
			// prepareIncrementProducerEpoch.
			switch {
			case !hasExpected:
				next.ProducerEpoch, next.LastProducerEpoch = cur.ProducerEpoch+1, NoProducerEpoch
			case cur.ProducerEpoch == NoProducerEpoch || p.ProducerEpoch == cur.ProducerEpoch:
				next.ProducerEpoch, next.LastProducerEpoch = cur.ProducerEpoch+1, cur.ProducerEpoch
			case p.ProducerEpoch == cur.LastProducerEpoch:
				// Retry of a successful call: answer the current epoch without bumping. A new
				// producer calling in between would have reset LastProducerEpoch to -1.
				return successInit(cur, res)
			default:
				return fail(fenced)
			}
			if cur.ProducerEpoch != NoProducerEpoch {
				res.Action.Fence = &Fence{ProducerID: cur.ProducerID, OldEpoch: cur.ProducerEpoch, NewEpoch: next.ProducerEpoch}
			}
		}
		mustTransition(cur.State, Empty)
		next.State = Empty
		next.NextProducerID = NoProducerID
		next.Partitions, next.Groups = nil, nil
		next.TxnStartMs = 0
		next.TimeoutMs = p.TimeoutMs
		next.LastUpdateMs = nowMs
		if res.Action.Fence != nil {
			res.Action.TransactionalID = cur.TransactionalID
		}
		return successInit(next, res)
	}
	panic("BUG: InitProducerId on transactional.id " + cur.TransactionalID + " in state " + cur.State.String())
}

func successInit(e *Entry, res InitProducerIDResult) (*Entry, InitProducerIDResult) {
	res.Code = codec.CodeNone
	res.ProducerID, res.ProducerEpoch = e.ProducerID, e.ProducerEpoch
	return e, res
}

// fenceAbort moves an Ongoing entry through PrepareEpochFence to PrepareAbort with the epoch bumped
// once, keeping partitions and groups (the abort's dispatch set). Used by the rejoin path and the
// reaper. LastProducerEpoch is cleared: after a fence no request of the old epoch is a retry.
func fenceAbort(cur *Entry, nowMs int64, alloc AllocPID) (*Entry, Action, int16) {
	mustTransition(cur.State, PrepareEpochFence)
	mustTransition(PrepareEpochFence, PrepareAbort)
	next := cur.clone()
	next.State = PrepareAbort
	next.LastProducerEpoch = NoProducerEpoch
	next.NextProducerID = NoProducerID
	if cur.ProducerEpoch < maxEpoch {
		next.ProducerEpoch = cur.ProducerEpoch + 1
		if isEpochExhausted(next.ProducerEpoch) {
			// The fence used up the id's last epochs: rotate when the abort completes so nothing
			// ever runs at an epoch that cannot be fenced again.
			pid, err := alloc()
			if err != nil {
				return cur, Action{}, codec.CodeCoordinatorNotAvailable
			}
			next.NextProducerID = pid
		}
	} else {
		// Unreachable by construction (clients never hold Short.MaxValue), but never wrap to 0 on
		// the same id (a zombie at epoch 0 would pass the fence again): keep the epoch and rotate
		// on completion.
		pid, err := alloc()
		if err != nil {
			return cur, Action{}, codec.CodeCoordinatorNotAvailable
		}
		next.NextProducerID = pid
	}
	next.LastUpdateMs = nowMs
	next.pending = true
	return next, Action{
		TransactionalID: cur.TransactionalID,
		Fence:           &Fence{ProducerID: cur.ProducerID, OldEpoch: cur.ProducerEpoch, NewEpoch: next.ProducerEpoch},
		Markers:         markersFor(next, false),
	}, codec.CodeNone
}

// ---------------------------------------------------------------------------------------------
// AddPartitionsToTxn (key 24) and the TV2 implicit add

// AddPartitionsParams is a client AddPartitionsToTxn (v0-3, TV1) or, with Implicit, the add a
// partition leader performs for Produce v12 (AddPartitionsToTxn v5 VerifyOnly=false, TV2).
type AddPartitionsParams struct {
	TransactionalID string
	ProducerID      int64
	ProducerEpoch   int16
	Partitions      []TopicPartitions
	Version         int16
	Implicit        bool
}

// AddPartitionsResult: Code is the top-level outcome; Results repeats it on every requested
// partition (v0-3 responses have no top-level error field).
type AddPartitionsResult struct {
	Code    int16
	Results []PartitionResult
}

// AddPartitions implements handleAddPartitionsToTransaction. Implicit adds answer
// PRODUCER_FENCED; the partition leader translates it for the producer (Apache's
// AddPartitionsToTxnManager maps it to INVALID_PRODUCER_EPOCH).
func AddPartitions(e *Entry, p AddPartitionsParams, now time.Time) (*Entry, AddPartitionsResult) {
	txnVersion, fenced := int8(1), fencedCode(p.Version, addPartitionsFencedSince)
	if p.Implicit {
		txnVersion, fenced = 2, codec.CodeProducerFenced
	}
	next, code := addToTxn(e, p.TransactionalID, p.ProducerID, p.ProducerEpoch, p.Implicit, fenced, txnVersion, now,
		func(c *Entry) bool { return c.containsAll(p.Partitions) },
		func(n *Entry) { n.addPartitions(p.Partitions) })
	return next, AddPartitionsResult{Code: code, Results: repeatCode(p.Partitions, code)}
}

// addToTxn is the shared body of AddPartitions and AddOffsets (Apache routes AddOffsetsToTxn
// through handleAddPartitionsToTransaction with the group's __consumer_offsets partition).
func addToTxn(e *Entry, tid string, pid int64, epoch int16, implicit bool, fenced int16, txnVersion int8,
	now time.Time, present func(*Entry) bool, add func(*Entry)) (*Entry, int16) {
	if c := CheckTransactionalID(tid); c != codec.CodeNone {
		return e, c
	}
	if e == nil {
		return e, codec.CodeInvalidProducerIDMapping
	}
	if implicit && e.State.IsPrepare() && (e.pending || (e.NextProducerID != NoProducerID && e.NextProducerID == pid)) {
		// TV2: EndTxn v5 answered with the next (pid, epoch) as soon as the prepare was durable, so
		// the producer's next transaction can race the previous markers (and, after a rotation,
		// arrive with the id that becomes current only on completion). Retriable 51, not 49/90
		// (KAFKA-18464 / KAFKA-18662 spirit).
		return e, codec.CodeConcurrentTransactions
	}
	if e.ProducerID != pid {
		return e, codec.CodeInvalidProducerIDMapping
	}
	if e.ProducerEpoch != epoch {
		return e, fenced
	}
	if e.pending || e.State.IsPrepare() {
		return e, codec.CodeConcurrentTransactions
	}
	if e.State == Ongoing && present(e) {
		// Already recorded: answer without a write (Apache's subsetOf optimisation).
		return e, codec.CodeNone
	}
	mustTransition(e.State, Ongoing)
	next := e.clone()
	if e.State != Ongoing {
		// A new transaction starts: the reaper's clock starts now and the version is the one of
		// the request that started it.
		next.Partitions, next.Groups = nil, nil
		next.TxnStartMs = now.UnixMilli()
		next.TxnVersion = txnVersion
		next.NextProducerID = NoProducerID
	}
	next.State = Ongoing
	add(next)
	next.LastUpdateMs = now.UnixMilli()
	return next, codec.CodeNone
}

// VerifyParams is AddPartitionsToTxn v4+ with VerifyOnly=true (KIP-890 part 1), sent by a
// partition leader before a producer's first transactional append to a partition.
type VerifyParams struct {
	TransactionalID string
	ProducerID      int64
	ProducerEpoch   int16
	Partitions      []TopicPartitions
	// Abortable: the caller understands TRANSACTION_ABORTABLE (AddPartitionsToTxn v5 / Kafka
	// 3.8+); otherwise a partition not in the transaction is INVALID_TXN_STATE.
	Abortable bool
}

// VerifyResult is read-only: Code is a whole-request error (49/90/51), otherwise Results has the
// per-partition answer.
type VerifyResult struct {
	Code    int16
	Results []PartitionResult
}

// Verify implements handleVerifyPartitionsInTransaction. It never changes the entry.
func Verify(e *Entry, p VerifyParams) VerifyResult {
	code := codec.CodeNone
	switch {
	case CheckTransactionalID(p.TransactionalID) != codec.CodeNone:
		code = codec.CodeInvalidRequest
	case e == nil || e.ProducerID != p.ProducerID:
		code = codec.CodeInvalidProducerIDMapping
	case e.ProducerEpoch != p.ProducerEpoch:
		code = codec.CodeProducerFenced
	case e.pending || e.State.IsPrepare():
		code = codec.CodeConcurrentTransactions
	}
	if code != codec.CodeNone {
		return VerifyResult{Code: code, Results: repeatCode(p.Partitions, code)}
	}
	missing := codec.CodeInvalidTxnState
	if p.Abortable {
		missing = codec.CodeTransactionAbortable
	}
	out := repeatCode(p.Partitions, codec.CodeNone)
	for i := range out {
		if e.State != Ongoing || !e.hasPartition(out[i].Topic, out[i].Partition) {
			out[i].Code = missing
		}
	}
	return VerifyResult{Results: out}
}

// ---------------------------------------------------------------------------------------------
// AddOffsetsToTxn (key 25) and the TV2 implicit group add (TxnOffsetCommit v5)

// AddOffsetsParams adds a consumer group to the transaction.
type AddOffsetsParams struct {
	TransactionalID string
	ProducerID      int64
	ProducerEpoch   int16
	Group           string
	Version         int16
	// Implicit: TxnOffsetCommit v5 (TV2) adding the group on the client's behalf; the group
	// coordinator translates PRODUCER_FENCED for its caller.
	Implicit bool
}

// AddOffsetsResult is the single top-level error code of AddOffsetsToTxn.
type AddOffsetsResult struct {
	Code int16
}

// AddOffsets implements handleAddOffsetsToTransaction with the same state rules as AddPartitions.
func AddOffsets(e *Entry, p AddOffsetsParams, now time.Time) (*Entry, AddOffsetsResult) {
	txnVersion, fenced := int8(1), fencedCode(p.Version, addOffsetsFencedSince)
	if p.Implicit {
		txnVersion, fenced = 2, codec.CodeProducerFenced
	}
	next, code := addToTxn(e, p.TransactionalID, p.ProducerID, p.ProducerEpoch, p.Implicit, fenced, txnVersion, now,
		func(c *Entry) bool { return c.hasGroup(p.Group) },
		func(n *Entry) { n.addGroup(p.Group) })
	return next, AddOffsetsResult{Code: code}
}

// ---------------------------------------------------------------------------------------------
// EndTxn (key 26, v0-5)

// EndTxnParams is an EndTxn request. Version > 4 means TV2 (Apache transactionVersionForEndTxn).
type EndTxnParams struct {
	TransactionalID string
	ProducerID      int64
	ProducerEpoch   int16
	Commit          bool
	Version         int16
}

// EndTxnResult: ProducerID/ProducerEpoch are the v5 response fields (the producer's next id and
// epoch), -1 for errors and TV1. Action carries the marker dispatch (and, TV2, the fence) of a new
// prepare, or the re-drive of a prepared transaction whose earlier dispatch failed.
type EndTxnResult struct {
	Code          int16
	ProducerID    int64
	ProducerEpoch int16
	Action        Action
}

// EndTxn implements TransactionCoordinator.endTransaction (TV1 for v0-4, TV2 for v5).
func EndTxn(e *Entry, p EndTxnParams, now time.Time, alloc AllocPID) (*Entry, EndTxnResult) {
	if p.Version >= 5 {
		return endTxnV2(e, p, now, alloc)
	}
	return endTxnV1(e, p, now)
}

func endErr(e *Entry, code int16) (*Entry, EndTxnResult) {
	return e, EndTxnResult{Code: code, ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch}
}

// redrive answers CONCURRENT_TRANSACTIONS for a retried EndTxn on a prepared transaction and,
// when no dispatch is in flight (an earlier one failed), hands the markers out again so the
// transaction cannot stay prepared forever.
func redrive(e *Entry) (*Entry, EndTxnResult) {
	next, res := endErr(e, codec.CodeConcurrentTransactions)
	if !e.pending {
		next = e.clone()
		next.pending = true
		res.Action = Action{TransactionalID: e.TransactionalID, Markers: markersFor(next, e.State == PrepareCommit)}
	}
	return next, res
}

func endTxnV1(e *Entry, p EndTxnParams, now time.Time) (*Entry, EndTxnResult) {
	if c := CheckTransactionalID(p.TransactionalID); c != codec.CodeNone {
		return endErr(e, c)
	}
	if e == nil || e.ProducerID != p.ProducerID {
		return endErr(e, codec.CodeInvalidProducerIDMapping)
	}
	// Client requests must match the epoch exactly: TV1 never bumps on EndTxn.
	if e.ProducerEpoch != p.ProducerEpoch {
		return endErr(e, fencedCode(p.Version, endTxnFencedSince))
	}
	if e.pending {
		return endErr(e, codec.CodeConcurrentTransactions)
	}
	switch e.State {
	case Ongoing:
		target := PrepareAbort
		if p.Commit {
			target = PrepareCommit
		}
		mustTransition(e.State, target)
		next := e.clone()
		next.State = target
		next.TxnVersion = 1
		next.LastUpdateMs = now.UnixMilli()
		next.pending = true
		return next, EndTxnResult{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch,
			Action: Action{TransactionalID: e.TransactionalID, Markers: markersFor(next, p.Commit)}}
	case CompleteCommit, CompleteAbort:
		if p.Commit == (e.State == CompleteCommit) {
			return endErr(e, codec.CodeNone) // idempotent retry: no new markers
		}
		return endErr(e, codec.CodeInvalidTxnState)
	case PrepareCommit, PrepareAbort:
		if p.Commit == (e.State == PrepareCommit) {
			return redrive(e)
		}
		return endErr(e, codec.CodeInvalidTxnState)
	case Empty:
		return endErr(e, codec.CodeInvalidTxnState)
	}
	panic("BUG: EndTxn on transactional.id " + e.TransactionalID + " in state " + e.State.String())
}

// endTxnV2 is Apache's TV2 endTransaction. Truth table for the settled states (Retry = request
// epoch is the stored epoch - 1, Current = equal; PF = PRODUCER_FENCED, ITS = INVALID_TXN_STATE,
// EB = prepare with an epoch bump):
//
//	                 Abort/Retry  Abort/Current  Commit/Retry  Commit/Current
//	Empty            PF           EB             PF            ITS
//	CompleteAbort    NONE         EB             PF*           ITS
//	CompleteCommit   ITS          EB             NONE          ITS
//
// * Apache's table says ITS; KAFKA-20785 answers PRODUCER_FENCED because a commit at the retry
// epoch against an abort means the coordinator (timeout) bumped the epoch under the producer.
func endTxnV2(e *Entry, p EndTxnParams, now time.Time, alloc AllocPID) (*Entry, EndTxnResult) {
	if c := CheckTransactionalID(p.TransactionalID); c != codec.CodeNone {
		return endErr(e, c)
	}
	if e == nil {
		return endErr(e, codec.CodeInvalidProducerIDMapping)
	}
	// KAFKA-18464: a transition in flight is checked before the producer id and epoch. The
	// producer learns its next (id, epoch) from the previous EndTxn before the markers are done;
	// checking the epoch first would fence it (commit followed by an empty abort).
	if e.pending {
		return endErr(e, codec.CodeConcurrentTransactions)
	}
	retryOnOverflow := e.LastProducerID != NoProducerID && e.LastProducerID == p.ProducerID &&
		p.ProducerEpoch == maxEpoch-1 && e.ProducerEpoch == 0
	retryOnEpochBump := int32(e.ProducerEpoch) == int32(p.ProducerEpoch)+1
	if e.ProducerID != p.ProducerID && !retryOnOverflow {
		return endErr(e, codec.CodeInvalidProducerIDMapping)
	}
	var valid bool
	switch e.State {
	case Ongoing, Empty:
		valid = p.ProducerEpoch == e.ProducerEpoch
	case PrepareCommit, PrepareAbort:
		valid = retryOnEpochBump
	case CompleteCommit, CompleteAbort:
		valid = retryOnEpochBump || retryOnOverflow || p.ProducerEpoch == e.ProducerEpoch
	default:
		panic("BUG: EndTxn on transactional.id " + e.TransactionalID + " in state " + e.State.String())
	}
	if !valid {
		return endErr(e, codec.CodeProducerFenced)
	}
	isRetry := retryOnEpochBump || retryOnOverflow
	switch e.State {
	case Ongoing:
		target := PrepareAbort
		if p.Commit {
			target = PrepareCommit
		}
		return prepareV2(e, target, false, now, alloc)
	case Empty:
		if !p.Commit {
			return prepareV2(e, PrepareAbort, true, now, alloc)
		}
		return endErr(e, codec.CodeInvalidTxnState)
	case CompleteCommit:
		switch {
		case p.Commit && isRetry:
			return endRetryOK(e)
		case !p.Commit && !isRetry:
			return prepareV2(e, PrepareAbort, true, now, alloc)
		}
		return endErr(e, codec.CodeInvalidTxnState)
	case CompleteAbort:
		switch {
		case !p.Commit && isRetry:
			return endRetryOK(e)
		case !p.Commit:
			return prepareV2(e, PrepareAbort, true, now, alloc)
		case isRetry:
			return endErr(e, codec.CodeProducerFenced) // KAFKA-20785
		}
		return endErr(e, codec.CodeInvalidTxnState)
	case PrepareCommit:
		if p.Commit {
			return redrive(e)
		}
		return endErr(e, codec.CodeInvalidTxnState)
	default: // PrepareAbort; valid implies a retry epoch
		if !p.Commit {
			return redrive(e)
		}
		return endErr(e, codec.CodeProducerFenced) // KAFKA-20785: commit raced a timeout abort
	}
}

// endRetryOK answers a recognised retry of a completed EndTxn v5 with the current id and epoch.
func endRetryOK(e *Entry) (*Entry, EndTxnResult) {
	return e, EndTxnResult{ProducerID: e.ProducerID, ProducerEpoch: e.ProducerEpoch}
}

// prepareV2 is Apache's prepareAbortOrCommit under TV2: every completed transaction bumps the
// epoch at prepare time, so the markers carry the new epoch and fence every zombie of the old
// one. An exhausted epoch allocates the next producer id now; the id switches on completion
// (markers still carry the old id).
func prepareV2(e *Entry, target State, emptyTxn bool, now time.Time, alloc AllocPID) (*Entry, EndTxnResult) {
	mustTransition(e.State, target)
	next := e.clone()
	if isEpochExhausted(e.ProducerEpoch) {
		pid, err := alloc()
		if err != nil {
			return endErr(e, codec.CodeCoordinatorNotAvailable)
		}
		next.NextProducerID = pid
	} else {
		next.NextProducerID = NoProducerID
	}
	if e.ProducerEpoch < maxEpoch {
		next.ProducerEpoch = e.ProducerEpoch + 1
	}
	next.LastProducerEpoch = e.ProducerEpoch
	if emptyTxn {
		// TV2 allows aborting a transaction that added nothing; its start time is now.
		next.Partitions, next.Groups = nil, nil
		next.TxnStartMs = now.UnixMilli()
	}
	next.State = target
	next.TxnVersion = 2
	next.LastUpdateMs = now.UnixMilli()
	next.pending = true
	res := EndTxnResult{ProducerID: next.ProducerID, ProducerEpoch: next.ProducerEpoch}
	if next.NextProducerID != NoProducerID {
		res.ProducerID, res.ProducerEpoch = next.NextProducerID, 0
	}
	res.Action = Action{
		TransactionalID: e.TransactionalID,
		Fence:           &Fence{ProducerID: e.ProducerID, OldEpoch: e.ProducerEpoch, NewEpoch: next.ProducerEpoch},
		Markers:         markersFor(next, target == PrepareCommit),
	}
	return next, res
}

// ---------------------------------------------------------------------------------------------
// Complete: every marker of a Prepare* transaction is durable

// CompleteParams identifies the dispatch that finished (copy it from the Markers).
type CompleteParams struct {
	TransactionalID string
	ProducerID      int64
	ProducerEpoch   int16
	Commit          bool
}

// CompleteResult: Groups are the consumer groups whose staged offsets must now be committed
// (Commit) or discarded (abort). ProducerID/ProducerEpoch are the entry's afterwards (rotated
// under TV2 epoch exhaustion). A non-zero Code means the completion did not match the prepared
// transaction (stale or duplicate) and nothing changed.
type CompleteResult struct {
	Code          int16
	Commit        bool
	Groups        []string
	ProducerID    int64
	ProducerEpoch int16
}

// Complete implements prepareComplete: Prepare* → Complete*, lists cleared, start time kept.
func Complete(e *Entry, p CompleteParams, now time.Time) (*Entry, CompleteResult) {
	res := CompleteResult{Commit: p.Commit, ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch}
	switch {
	case e == nil || e.ProducerID != p.ProducerID:
		res.Code = codec.CodeInvalidProducerIDMapping
	case e.ProducerEpoch != p.ProducerEpoch:
		res.Code = codec.CodeProducerFenced
	case !e.State.IsPrepare() || (e.State == PrepareCommit) != p.Commit:
		res.Code = codec.CodeInvalidTxnState
	}
	if res.Code != codec.CodeNone {
		return e, res
	}
	target := CompleteAbort
	if p.Commit {
		target = CompleteCommit
	}
	mustTransition(e.State, target)
	next := e.clone()
	next.State = target
	if e.NextProducerID != NoProducerID {
		// Epoch exhaustion: continue on the new id. LastProducerEpoch keeps the last epoch the
		// client saw (Short.MaxValue-1) for retryOnOverflow.
		next.LastProducerID = e.ProducerID
		next.ProducerID, next.ProducerEpoch = e.NextProducerID, 0
		next.NextProducerID = NoProducerID
	}
	// TxnStartMs is kept: DescribeTransactions of a completed transaction reports when it started
	// (Apache keeps txnStartTimestamp through prepareComplete). The reaper only reads it while a
	// transaction is open.
	next.Partitions, next.Groups = nil, nil
	next.LastUpdateMs = now.UnixMilli()
	next.pending = false
	res.Groups = slices.Clone(e.Groups)
	res.ProducerID, res.ProducerEpoch = next.ProducerID, next.ProducerEpoch
	return next, res
}

// ---------------------------------------------------------------------------------------------
// Reaper

func txnStart(e *Entry) int64 {
	if e.TxnStartMs != 0 {
		return e.TxnStartMs
	}
	return e.LastUpdateMs
}

// TimedOut reports an Ongoing transaction whose TxnStartMs + TimeoutMs <= now.
func TimedOut(e *Entry, now time.Time) bool {
	return e != nil && e.State == Ongoing && !e.pending && e.TimeoutMs > 0 &&
		txnStart(e)+int64(e.TimeoutMs) <= now.UnixMilli()
}

// ReaperAbort aborts a timed-out Ongoing transaction the way Apache's abortTimedOutTransactions
// does: fence (epoch bump, reported as Action.Fence so partitions reject the zombie) and
// PrepareAbort keeping partitions AND groups, so offset-only transactions are completed too
// (an offsets-only transaction is aborted and completed too). ok is false (and e returned unchanged) when the entry is not due.
func ReaperAbort(e *Entry, now time.Time, alloc AllocPID) (next *Entry, act Action, ok bool) {
	if !TimedOut(e, now) {
		return e, Action{}, false
	}
	next, act, code := fenceAbort(e, now.UnixMilli(), alloc)
	if code != codec.CodeNone {
		return e, Action{}, false
	}
	return next, act, true
}

// Expired reports an entry the reaper removes under transactional.id.expiration.ms (Apache's
// TransactionStateManager.removeExpiredTransactionalIds): no transaction open (Empty or
// Complete*), nothing in flight, and unchanged for at least expiration.
func Expired(e *Entry, now time.Time, expiration time.Duration) bool {
	return e != nil && expiration > 0 && !e.pending && (e.State == Empty || e.State.IsComplete()) &&
		now.UnixMilli()-e.LastUpdateMs >= expiration.Milliseconds()
}

// Hanging reports a transaction open (Ongoing or prepared) for longer than its timeout: an
// Ongoing one the reaper has not caught yet, or a prepared one whose markers are not landing. Both
// pin the LSO of their partitions.
func Hanging(e *Entry, now time.Time) (openFor time.Duration, hanging bool) {
	if e == nil || !e.State.IsOpen() {
		return 0, false
	}
	openFor = time.Duration(now.UnixMilli()-txnStart(e)) * time.Millisecond
	return openFor, openFor > time.Duration(e.TimeoutMs)*time.Millisecond
}

// ---------------------------------------------------------------------------------------------
// TxnOffsetCommit (key 28): the transaction-coordinator check

// TxnOffsetCommitParams is the transaction half of a TxnOffsetCommit request.
type TxnOffsetCommitParams struct {
	TransactionalID string
	ProducerID      int64
	ProducerEpoch   int16
	Group           string
	Version         int16
}

// VerifyGroup is Apache's handleVerifyPartitionsInTransaction for the group's offsets partition
// (TxnOffsetCommit v0-4; 3.6+ verifies by default, transaction.partition.verification.enable),
// read-only: the group must be part of the producer's Ongoing transaction. A missing group answers
// TRANSACTION_ABORTABLE (3.8+ coordinators); TranslateTxnOffsetCommitCode downgrades it for old
// clients.
func VerifyGroup(e *Entry, p TxnOffsetCommitParams) int16 {
	switch {
	case CheckTransactionalID(p.TransactionalID) != codec.CodeNone:
		return codec.CodeInvalidRequest
	case e == nil || e.ProducerID != p.ProducerID:
		return codec.CodeInvalidProducerIDMapping
	case e.ProducerEpoch != p.ProducerEpoch:
		return codec.CodeProducerFenced
	case e.pending || e.State.IsPrepare():
		return codec.CodeConcurrentTransactions
	case e.State != Ongoing || !e.hasGroup(p.Group):
		return codec.CodeTransactionAbortable
	}
	return codec.CodeNone
}

// TranslateTxnOffsetCommitCode is AddPartitionsToTxnManager's translation for the client of
// TxnOffsetCommit: PRODUCER_FENCED → INVALID_PRODUCER_EPOCH (the producer aborts and may carry
// on), TRANSACTION_ABORTABLE → INVALID_TXN_STATE for versions that predate it (v0-3).
func TranslateTxnOffsetCommitCode(code, version int16) int16 {
	switch {
	case code == codec.CodeProducerFenced:
		return codec.CodeInvalidProducerEpoch
	case code == codec.CodeTransactionAbortable && version <= 3:
		return codec.CodeInvalidTxnState
	}
	return code
}

// ---------------------------------------------------------------------------------------------
// KIP-664: DescribeTransactions (key 65), ListTransactions (key 66)

// DescribeResult is one DescribeTransactions entry.
type DescribeResult struct {
	TransactionalID string
	Code            int16
	State           string
	TimeoutMs       int32
	StartTimeMs     int64 // -1 when no transaction is open
	ProducerID      int64
	ProducerEpoch   int16
	Topics          []TopicPartitions
}

// Describe answers DescribeTransactions for one id; unknown → TRANSACTIONAL_ID_NOT_FOUND.
func Describe(tid string, e *Entry) DescribeResult {
	if e == nil {
		return DescribeResult{TransactionalID: tid, Code: codec.CodeTransactionalIDNotFound,
			ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch, StartTimeMs: -1}
	}
	start := e.TxnStartMs
	if start == 0 {
		start = -1
	}
	return DescribeResult{TransactionalID: tid, State: e.State.String(), TimeoutMs: e.TimeoutMs,
		StartTimeMs: start, ProducerID: e.ProducerID, ProducerEpoch: e.ProducerEpoch, Topics: e.partitionList()}
}

// ListFilter is ListTransactions' filters. Empty slices match everything; DurationMs < 0 disables
// the v1 duration filter (KIP-994: only transactions running longer than DurationMs).
type ListFilter struct {
	States      []string
	ProducerIDs []int64
	DurationMs  int64
}

// ListedTxn is one ListTransactions entry.
type ListedTxn struct {
	TransactionalID string
	ProducerID      int64
	State           string
}

// UnknownStates returns the state filters that name no state (ListTransactions'
// UnknownStateFilters).
func (f ListFilter) UnknownStates() []string {
	var out []string
	for _, s := range f.States {
		if _, ok := ParseState(s); !ok {
			out = append(out, s)
		}
	}
	return out
}

// Match reports whether e passes the filters (Apache listTransactionStates: Dead never listed).
func (f ListFilter) Match(e *Entry, now time.Time) bool {
	if e == nil || e.State == Dead {
		return false
	}
	if len(f.ProducerIDs) > 0 && !slices.Contains(f.ProducerIDs, e.ProducerID) {
		return false
	}
	if len(f.States) > 0 && !slices.Contains(f.States, e.State.String()) {
		return false
	}
	if f.DurationMs >= 0 {
		start := e.TxnStartMs
		if start == 0 {
			start = -1 // Apache's txnStartTimestamp of a transaction that is not running
		}
		if now.UnixMilli()-start <= f.DurationMs {
			return false
		}
	}
	return true
}
