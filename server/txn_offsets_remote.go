package server

// The transaction half of TxnOffsetCommit when the group coordinator G (this broker) and the
// transaction coordinator C of the transactional id are different brokers (design cluster.md
// §6, reference §9a #1).
//
// Apache's group coordinator verifies the group's __consumer_offsets partition with C through
// AddPartitionsToTxnManager before it writes the offsets: verify-only for v0-4 (TV1) and, for
// v5 (TV2, txnOffsetCommitRequestVersionToTransactionSupportedOperation = ADD_PARTITION), the
// implicit add of that partition. kaas records a transaction's groups by name (EndTxn sends
// each group's shard its marker), so G asks C about the group, not about a partition: an
// AddOffsetsToTxn v4 (the form the client itself would have sent to add the group) carrying
// the tagged field tagTxnOffsetCommitVersion = the TxnOffsetCommit version. C, seeing the tag
// from a caller with CLUSTER_ACTION, runs exactly the check a local TxnOffsetCommit runs
// (txn.Coordinator.TxnOffsetCommitCheck: for v5 the implicit add, for v0-4 the read-only
// check that the group is in the Ongoing transaction) and answers its code, already
// translated for the client. G then stages the offsets durably (StageTxnOffsets, KIP-447
// checks) only if the answer is NONE.
//
// A C that cannot answer — unknown to the topology, unreachable, timed out, not (or no longer)
// the owner, loading — is the retriable COORDINATOR_NOT_AVAILABLE, as the local check answers
// for a coordinator that cannot answer; CLUSTER_AUTHORIZATION_FAILED (G may not talk to C) is
// INVALID_TXN_STATE, as Apache's AddPartitionsToTxnManager turns it.

import (
	"context"
	"encoding/binary"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/txn"
)

// tagTxnOffsetCommitVersion is the tagged field (AddOffsetsToTxn v3+, flexible) by which a
// group coordinator asks for the TxnOffsetCommit check: its value is the TxnOffsetCommit
// version, two bytes big-endian. Apache defines no tagged field on AddOffsetsToTxn; the number
// is far from the low ones Apache hands out.
const tagTxnOffsetCommitVersion = 0x6b61

var (
	mTxnOffsetRemoteChecks = metrics.NewCounter(`kaas_txn_offset_commit_remote_checks_total`)
	mTxnOffsetRemoteFailed = metrics.NewCounter(`kaas_txn_offset_commit_remote_failures_total`)
)

// remoteTxnOffsetCommitCheck is txnOffsetCommitCheck for a transaction coordinator on broker
// coord: done gets the code the client is to see.
func (s *Server) remoteTxnOffsetCommitCheck(coord int32, req *kmsg.TxnOffsetCommitRequest) func(done func(int16)) {
	return func(done func(int16)) {
		mTxnOffsetRemoteChecks.Inc()
		b, err := s.peers.Broker(coord)
		if err != nil {
			mTxnOffsetRemoteFailed.Inc()
			done(codec.CodeCoordinatorNotAvailable)
			return
		}
		ar := kmsg.NewPtrAddOffsetsToTxnRequest()
		ar.TransactionalID, ar.ProducerID, ar.ProducerEpoch, ar.Group = req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Group
		var v [2]byte
		binary.BigEndian.PutUint16(v[:], uint16(req.Version))
		ar.UnknownTags.Set(tagTxnOffsetCommitVersion, v[:])
		// The group coordinator's callbacks must not block: the request runs on its own goroutine.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), peerRequestTimeout)
			kresp, err := b.Request(ctx, ar)
			cancel()
			if err != nil {
				mTxnOffsetRemoteFailed.Inc()
				done(codec.CodeCoordinatorNotAvailable)
				return
			}
			code := kresp.(*kmsg.AddOffsetsToTxnResponse).ErrorCode
			s.peers.noteClusterAuthz("AddOffsetsToTxn", coord, code)
			done(remoteTxnOffsetCommitCode(code))
		}()
	}
}

// remoteTxnOffsetCommitCode maps C's answer for the client of TxnOffsetCommit.
func remoteTxnOffsetCommitCode(code int16) int16 {
	switch code {
	case codec.CodeNotCoordinator, codec.CodeCoordinatorLoadInProgress, codec.CodeCoordinatorNotAvailable:
		return codec.CodeCoordinatorNotAvailable
	case codec.CodeClusterAuthorizationFailed:
		return codec.CodeInvalidTxnState
	}
	return code
}

// txnOffsetCommitTag returns the TxnOffsetCommit version a group coordinator put into an
// AddOffsetsToTxn request, if it did.
func txnOffsetCommitTag(req *kmsg.AddOffsetsToTxnRequest) (int16, bool) {
	var (
		version int16
		ok      bool
	)
	req.UnknownTags.Each(func(key uint32, val []byte) {
		if key == tagTxnOffsetCommitVersion && len(val) == 2 {
			version, ok = int16(binary.BigEndian.Uint16(val)), true
		}
	})
	return version, ok
}

// serveTxnOffsetCommitCheck is C's side: CLUSTER_ACTION (only a broker asks this; the client's
// WRITE on the id and READ on the group were checked by G), ownership, then the check.
func serveTxnOffsetCommitCheck(rc *reqCtx, req *kmsg.AddOffsetsToTxnRequest, resp *kmsg.AddOffsetsToTxnResponse, version int16) (kmsg.Response, error) {
	switch {
	case !rc.authorized(OpClusterAction, ResCluster, clusterResource):
		resp.ErrorCode = codec.CodeClusterAuthorizationFailed
		return resp, nil
	case !rc.s.txnOwner(req.TransactionalID).Local:
		resp.ErrorCode = codec.CodeNotCoordinator
		return resp, nil
	case rc.s.deps.Txn == nil:
		resp.ErrorCode = codec.CodeCoordinatorNotAvailable
		return resp, nil
	}
	rc.deferReply()
	rc.s.deps.Txn.TxnOffsetCommitCheck(txn.TxnOffsetCommitParams{TransactionalID: req.TransactionalID,
		ProducerID: req.ProducerID, ProducerEpoch: req.ProducerEpoch, Group: req.Group, Version: version},
		func(code int16) {
			defer rc.guard()
			resp.ErrorCode = code
			rc.reply(resp)
		})
	return nil, nil
}
