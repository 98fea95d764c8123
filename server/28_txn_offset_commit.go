package server

// TxnOffsetCommit: v0-5
//
// Behavior (Apache KafkaApis.handleTxnOffsetCommitRequest + GroupCoordinator.handleTxnCommitOffsets):
//   - Gates in Apache's order: WRITE on the TransactionalId (TRANSACTIONAL_ID_AUTHORIZATION_FAILED
//     on every partition), READ on the group (GROUP_AUTHORIZATION_FAILED on every partition), then
//     per topic READ (TOPIC_AUTHORIZATION_FAILED) and existence (UNKNOWN_TOPIC_OR_PARTITION: Apache
//     answers it for a topic or partition its metadata does not know and stages the rest), and
//     metadata at most 4096 bytes (OFFSET_METADATA_TOO_LARGE). The remaining partitions need the
//     group coordinator (COORDINATOR_NOT_AVAILABLE while it is not wired), ownership of the group
//     (NOT_COORDINATOR) and a transaction coordinator (COORDINATOR_NOT_AVAILABLE without one).
//   - Transaction check (KIP-890; txn.Coordinator.TxnOffsetCommitCheck), before any group
//     validation, as Apache does it before doTxnCommitOffsets:
//     v0-4 (TV1): the group must be in the producer's ongoing transaction (AddOffsetsToTxn added
//     it). Apache 3.6+ verifies the group's __consumer_offsets partition with the transaction
//     coordinator (transaction.partition.verification.enable, default true); we verify the group
//     the transaction recorded. Unknown id / other producer id → INVALID_PRODUCER_ID_MAPPING,
//     other epoch → INVALID_PRODUCER_EPOCH (Apache's AddPartitionsToTxnManager turns
//     PRODUCER_FENCED into it), Prepare* → CONCURRENT_TRANSACTIONS, not Ongoing or group not added
//     → INVALID_TXN_STATE (v0-3) / TRANSACTION_ABORTABLE (v4, KIP-890 genericErrorSupported).
//     v5 (TV2): the group is added to the transaction implicitly (the AddOffsetsToTxn the client no
//     longer sends); its errors pass through except PRODUCER_FENCED → INVALID_PRODUCER_EPOCH.
//     A transaction coordinator that cannot answer (closed, not the owner, loading, journal write
//     failed) → COORDINATOR_NOT_AVAILABLE (retriable).
//     When the transaction coordinator is another broker (cluster mode) the group coordinator
//     asks it for the same check, on the client's behalf (txn_offsets_remote.go).
//   - Then the group coordinator: KIP-447 fencing (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
//     FENCED_INSTANCE_ID; generation -1 without member = no group check), the producer epoch
//     (INVALID_PRODUCER_EPOCH for an epoch older than the highest seen for the group and producer),
//     and a guard against the transaction ending while it was being checked (INVALID_TXN_STATE).
//     The offsets are staged durably (fsync'd before NONE), invisible to OffsetFetch until the
//     transaction commits (require_stable answers UNSTABLE_OFFSET_COMMIT meanwhile).
//
// Version notes: v1 = v0; v2: committed_leader_epoch; v3: flexible, generation / member id /
// group instance id (KIP-447); v4: TRANSACTION_ABORTABLE; v5: TV2 implicit AddOffsetsToTxn.
// v6 (topic ids) is not served.

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/group"
	"github.com/kaas-go/kaas/coord/txn"
	"github.com/kaas-go/kaas/storage"
)

func init() { register(kmsg.TxnOffsetCommit, 0, 5, handleTxnOffsetCommit) }

func handleTxnOffsetCommit(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.TxnOffsetCommitRequest)
	resp := req.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewTxnOffsetCommitResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
			sp.Partition = rp.Partition
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	all := func(code int16) (kmsg.Response, error) {
		for i := range resp.Topics {
			for j := range resp.Topics[i].Partitions {
				resp.Topics[i].Partitions[j].ErrorCode = code
			}
		}
		return resp, nil
	}
	if !rc.authorized(OpWrite, ResTransactionalID, req.TransactionalID) {
		return all(codec.CodeTransactionalIDAuthorization)
	}
	if !rc.authorized(OpRead, ResGroup, req.Group) {
		return all(codec.CodeGroupAuthorizationFailed)
	}

	type slot struct{ t, p int }
	var pending []slot
	var offs []storage.GroupOffset
	for ti, rt := range req.Topics {
		topicCode := codec.CodeNone
		var topic *storage.Topic
		if !rc.authorized(OpRead, ResTopic, rt.Topic) {
			topicCode = codec.CodeTopicAuthorizationFailed
		} else if topic = rc.s.deps.Store.Topic(rt.Topic); topic == nil {
			topicCode = codec.CodeUnknownTopicOrPartition
		}
		for pi, rp := range rt.Partitions {
			sp := &resp.Topics[ti].Partitions[pi]
			sp.ErrorCode = topicCode
			if topicCode != codec.CodeNone {
				continue
			}
			epoch := rp.LeaderEpoch
			if req.Version < 2 {
				epoch = -1
			}
			var o storage.GroupOffset
			if o, sp.ErrorCode = groupOffset(topic, rt.Topic, rp.Partition, rp.Offset, epoch, rp.Metadata); sp.ErrorCode == codec.CodeNone {
				offs = append(offs, o)
				pending = append(pending, slot{ti, pi})
			}
		}
	}
	if len(offs) == 0 {
		return resp, nil
	}
	answer := func(code int16) {
		for _, s := range pending {
			resp.Topics[s.t].Partitions[s.p].ErrorCode = code
		}
	}
	switch {
	case rc.s.deps.Groups == nil:
		answer(codec.CodeCoordinatorNotAvailable)
		return resp, nil
	case !rc.s.groupOwner(req.Group).Local:
		answer(codec.CodeNotCoordinator)
		return resp, nil
	case rc.s.deps.Txn == nil:
		answer(codec.CodeCoordinatorNotAvailable)
		return resp, nil
	}

	tc := group.TxnCommit{
		Commit:        group.Commit{Group: req.Group, Generation: -1},
		ProducerID:    req.ProducerID,
		ProducerEpoch: req.ProducerEpoch,
	}
	if req.Version >= 3 {
		tc.Generation, tc.MemberID = req.Generation, req.MemberID
		if req.InstanceID != nil {
			tc.InstanceID = *req.InstanceID
		}
	}
	verify := txnOffsetCommitCheck(rc.s.deps.Txn, req)
	if owner := rc.s.txnOwner(req.TransactionalID); !owner.Local && owner.Known && owner.Broker != rc.s.deps.Topology.LocalID() {
		// The transaction coordinator is another broker: the same check, asked of it
		// (txn_offsets_remote.go). Unknown or loading here: the local coordinator answers 15.
		verify = rc.s.remoteTxnOffsetCommitCheck(owner.Broker, req)
	}
	rc.deferReply()
	rc.s.deps.Groups.TxnOffsetCommit(tc, offs, verify, func(code int16) {
		defer rc.guard()
		answer(code)
		rc.reply(resp)
	})
	return nil, nil
}

// txnOffsetCommitCheck is the transaction-coordinator half of TxnOffsetCommit (see the file
// comment), run by the group coordinator once it holds the group's transactional guard.
func txnOffsetCommitCheck(tc *txn.Coordinator, req *kmsg.TxnOffsetCommitRequest) func(done func(int16)) {
	p := txn.TxnOffsetCommitParams{TransactionalID: req.TransactionalID, ProducerID: req.ProducerID,
		ProducerEpoch: req.ProducerEpoch, Group: req.Group, Version: req.Version}
	return func(done func(int16)) { tc.TxnOffsetCommitCheck(p, done) }
}
