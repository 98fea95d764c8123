package group

// Transactional offset commits (KIP-98 TxnOffsetCommit, KIP-447 EOS v2, KIP-890).
//
// A TxnOffsetCommit stages offsets under (group, producerID) in the durable store; they are
// invisible to OffsetFetch (which, with require_stable, answers UNSTABLE_OFFSET_COMMIT for the
// staged partitions) until the transaction coordinator completes the transaction and calls
// CompleteTxnOffsets for every group of it (commit: the staged set becomes the committed offsets
// in one record; abort: it is discarded).
//
//	TxnOffsetCommit(pid, epoch, gen, member, offsets)
//	   │ group goroutine: take the (group, pid) verification guard
//	   ▼
//	verify (server: TV1 verification / TV2 implicit add at the transaction coordinator)
//	   │ error → that code                                  CompleteTxnOffsets(pid, commit)
//	   ▼                                                      │ group goroutine: the guard of
//	group goroutine: guard still current? ─ no → 48         │ every in-flight request for pid is
//	   │ yes                                                  │ invalidated, then the store
//	   ▼                                                      ▼ completes (durable)
//	validateCommit (generation / member / instance)      pending(group, pid) ─▶ committed | dropped
//	   │ epoch < highest seen for (group, pid) → 47
//	   ▼
//	store.StageTxnOffsets (fsync) → NONE
//
// Why the guard: the transaction may end between the coordinator's "yes, the group is in the
// ongoing transaction" and our staging. Staging afterwards would leave offsets nobody completes,
// or, worse, that the producer's NEXT transaction commits. Apache closes the same race with its
// VerificationGuard (UnifiedLog: a transactional append that is neither part of an ongoing
// transaction nor carries the current guard fails with INVALID_TXN_STATE). Stagings and completions
// of a group are serialised on the group's goroutine and enqueued to the store in that order, so a
// staging accepted before the completion is part of it, and one verified before the completion
// but arriving after it is refused.
//
// Why the epoch check: Apache's offsets partition keeps per-producer state, and an append with an
// epoch older than the producer's current one fails INVALID_PRODUCER_EPOCH (ProducerAppendInfo
// checkProducerEpoch). We keep, per (group, producerID), the highest epoch that staged here: in
// memory for the life of the group object, and durably with the pending staging (so it survives
// a restart while the transaction is open). Outside an open transaction the transaction
// coordinator's check (exact epoch) is the authority, as it is for Apache after producer-state
// expiry.

import (
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// ErrNotRunning is CompleteTxnOffsets' answer when the coordinator is closed, or the group's shard
// is not loaded here (released, or still loading): the caller (the transaction coordinator's marker path) keeps the transaction prepared
// and retries.
var ErrNotRunning = errors.New("group coordinator is not running")

// TxnCommit identifies a transactional committer: the producer, and (TxnOffsetCommit v3+,
// KIP-447) the consumer's group metadata. Generation -1 with no member id and no instance id means
// "no group check" (v0-2 clients, manual assignment), as Apache's validateOffsetCommit.
type TxnCommit struct {
	Commit
	ProducerID    int64
	ProducerEpoch int16
}

// txnGuard is the verification guard of (group, producerID): every TxnOffsetCommit in flight for
// the producer holds the current one; CompleteTxnOffsets invalidates it.
type txnGuard struct {
	refs      int
	completed bool
}

func (g *group) takeTxnGuard(pid int64) *txnGuard {
	if g.txnGuards == nil {
		g.txnGuards = make(map[int64]*txnGuard)
	}
	gd := g.txnGuards[pid]
	if gd == nil {
		gd = &txnGuard{}
		g.txnGuards[pid] = gd
	}
	gd.refs++
	return gd
}

func (g *group) releaseTxnGuard(pid int64, gd *txnGuard) {
	gd.refs--
	if gd.refs == 0 && g.txnGuards[pid] == gd {
		delete(g.txnGuards, pid)
	}
}

// highestTxnEpoch is the highest producer epoch seen staging for pid in this group.
func (g *group) highestTxnEpoch(pid int64) (int16, bool) {
	if e, ok := g.txnEpoch[pid]; ok {
		return e, true
	}
	return g.c.store.PendingEpoch(g.id, pid)
}

// TxnOffsetCommit serves TxnOffsetCommit for the offsets the handler accepted (ACLs, metadata
// size). verify is the transaction-coordinator check (TV1: the group must be in the producer's
// ongoing transaction; TV2: the implicit AddOffsetsToTxn): it is called once, off the group's
// goroutine, and must call its done exactly once with NONE or the code to answer; nil skips it.
// done gets one code for the whole request (Apache answers every partition with it): NONE only
// after the staging is fsync'd. Unknown topic partitions are staged (Apache does too).
func (c *Coordinator) TxnOffsetCommit(tc TxnCommit, offs []storage.GroupOffset, verify func(done func(code int16)), done func(code int16)) {
	// Apache creates the group if it does not exist (GroupCoordinator.handleTxnCommitOffsets).
	if idsTooLong(tc.Group, tc.MemberID, tc.InstanceID) {
		done(codec.CodeInvalidRequest)
		return
	}
	g, code := c.lookup(tc.Group, true)
	if code != codec.CodeNone {
		done(code)
		return
	}
	stampCommitTime(offs)
	if !g.tryDo(func() {
		if g.unloaded {
			done(codec.CodeNotCoordinator)
			return
		}
		gd := g.takeTxnGuard(tc.ProducerID)
		if verify == nil {
			g.stageTxn(tc, offs, gd, done)
			return
		}
		verify(func(code int16) {
			g.do(func() {
				if code != codec.CodeNone {
					g.releaseTxnGuard(tc.ProducerID, gd)
					done(code)
					return
				}
				g.stageTxn(tc, offs, gd, done)
			})
		})
	}) {
		done(codec.CodeCoordinatorNotAvailable)
	}
}

// stageTxn runs on the group's goroutine after a successful verification, in Apache's order:
// guard, group membership (doTxnCommitOffsets → validateOffsetCommit), producer epoch (the append).
func (g *group) stageTxn(tc TxnCommit, offs []storage.GroupOffset, gd *txnGuard, done func(int16)) {
	c := g.c
	g.releaseTxnGuard(tc.ProducerID, gd)
	if g.unloaded {
		done(codec.CodeNotCoordinator)
		return
	}
	if gd.completed {
		g.log.Info("transactional offset commit refused: the transaction ended while it was verified",
			zap.Int64("producerId", tc.ProducerID), zap.Int16("producerEpoch", tc.ProducerEpoch))
		done(codec.CodeInvalidTxnState)
		return
	}
	if code := g.validateCommit(tc.Commit, true); code != codec.CodeNone {
		if code == codec.CodeStaleMemberEpoch {
			// TxnOffsetCommit has no STALE_MEMBER_EPOCH: Apache answers a consumer-group
			// member's stale epoch ILLEGAL_GENERATION, which transactional clients know.
			code = codec.CodeIllegalGeneration
		}
		done(code)
		return
	}
	if cur, ok := g.highestTxnEpoch(tc.ProducerID); ok && tc.ProducerEpoch < cur {
		g.log.Info("fenced transactional offset commit from an older producer epoch",
			zap.Int64("producerId", tc.ProducerID), zap.Int16("producerEpoch", tc.ProducerEpoch), zap.Int16("current", cur))
		done(codec.CodeInvalidProducerEpoch)
		return
	}
	if g.txnEpoch == nil {
		g.txnEpoch = make(map[int64]int16)
	}
	if cur, ok := g.txnEpoch[tc.ProducerID]; !ok || tc.ProducerEpoch > cur {
		g.txnEpoch[tc.ProducerID] = tc.ProducerEpoch
	}
	if !c.beginStore(g) {
		done(codec.CodeNotCoordinator)
		return
	}
	c.store.StageTxnOffsets(g.id, tc.ProducerID, tc.ProducerEpoch, offs, func(err error) {
		defer c.endStore(g)
		if err != nil {
			mCommitFailures.Inc()
			g.log.Warn("transactional offset commit failed", zap.Int64("producerId", tc.ProducerID), zap.Error(err))
		}
		done(storeErrorCode(err))
	})
}

// CompleteTxnOffsets ends producerID's transaction for group: commit makes the offsets it staged
// the group's committed offsets (atomically, one durable record), abort discards them. The
// transaction coordinator's marker path calls it for every group of a completing transaction
// (Apache: the COMMIT/ABORT marker on the group's __consumer_offsets partition) and records the
// completion only after done(nil). Idempotent: a group with nothing staged for the producer (a
// re-driven completion, a deleted group) answers nil once the store has ordered it after every
// earlier write. In-flight TxnOffsetCommits of the producer that were verified before this call
// and have not staged yet are refused (INVALID_TXN_STATE). done may run on another goroutine and
// gets ErrNotRunning or a storage error if nothing could be recorded.
func (c *Coordinator) CompleteTxnOffsets(group string, producerID int64, commit bool, done func(err error)) {
	g, code := c.lookup(group, false)
	if code != codec.CodeNone {
		done(fmt.Errorf("cannot complete transactional offsets (group %s, producer %d): shard %d answers %d: %w",
			group, producerID, ShardFor(group), code, ErrNotRunning))
		return
	}
	if g == nil {
		// Neither in memory nor in the store: nothing is staged and no staging is in flight (a
		// TxnOffsetCommit materialises the group before its verification starts).
		done(nil)
		return
	}
	g.do(func() {
		if g.unloaded {
			done(ErrNotRunning)
			return
		}
		if gd := g.txnGuards[producerID]; gd != nil {
			gd.completed = true
			delete(g.txnGuards, producerID)
		}
		if !c.beginStore(g) {
			done(ErrNotRunning)
			return
		}
		c.store.CompleteTxnOffsets(g.id, producerID, commit, func(err error) {
			defer c.endStore(g)
			if err != nil {
				mCommitFailures.Inc()
				g.log.Warn("cannot complete transactional offsets", zap.Int64("producerId", producerID),
					zap.Bool("commit", commit), zap.Error(err))
				err = fmt.Errorf("cannot complete transactional offsets (group %s, producer %d): %w", group, producerID, err)
			}
			done(err)
		})
	})
}
