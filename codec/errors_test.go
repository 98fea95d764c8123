package codec

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

// The constants must agree with franz-go's table of Kafka's error codes.
func TestErrorCodesMatchKerr(t *testing.T) {
	f := func(code int16, want *kerr.Error) {
		t.Helper()
		if got := kerr.ErrorForCode(code); got != want {
			t.Fatalf("code %d is %v in kerr, want %v", code, got, want)
		}
	}
	f(CodeCorruptMessage, kerr.CorruptMessage)
	f(CodeUnknownTopicOrPartition, kerr.UnknownTopicOrPartition)
	f(CodeNotLeaderForPartition, kerr.NotLeaderForPartition)
	f(CodeMessageTooLarge, kerr.MessageTooLarge)
	f(CodeNotCoordinator, kerr.NotCoordinator)
	f(CodeInvalidRequiredAcks, kerr.InvalidRequiredAcks)
	f(CodeIllegalGeneration, kerr.IllegalGeneration)
	f(CodeUnknownMemberID, kerr.UnknownMemberID)
	f(CodeRebalanceInProgress, kerr.RebalanceInProgress)
	f(CodeTopicAuthorizationFailed, kerr.TopicAuthorizationFailed)
	f(CodeInvalidTimestamp, kerr.InvalidTimestamp)
	f(CodeUnsupportedVersion, kerr.UnsupportedVersion)
	f(CodeTopicAlreadyExists, kerr.TopicAlreadyExists)
	f(CodeInvalidPartitions, kerr.InvalidPartitions)
	f(CodeInvalidReplicationFactor, kerr.InvalidReplicationFactor)
	f(CodeInvalidConfig, kerr.InvalidConfig)
	f(CodeInvalidRequest, kerr.InvalidRequest)
	f(CodeOutOfOrderSequenceNumber, kerr.OutOfOrderSequenceNumber)
	f(CodeDuplicateSequenceNumber, kerr.DuplicateSequenceNumber)
	f(CodeInvalidProducerEpoch, kerr.InvalidProducerEpoch)
	f(CodeInvalidTxnState, kerr.InvalidTxnState)
	f(CodeInvalidProducerIDMapping, kerr.InvalidProducerIDMapping)
	f(CodeInvalidTransactionTimeout, kerr.InvalidTransactionTimeout)
	f(CodeConcurrentTransactions, kerr.ConcurrentTransactions)
	f(CodeTransactionalIDAuthorization, kerr.TransactionalIDAuthorizationFailed)
	f(CodeKafkaStorageError, kerr.KafkaStorageError)
	f(CodeFetchSessionIDNotFound, kerr.FetchSessionIDNotFound)
	f(CodeInvalidFetchSessionEpoch, kerr.InvalidFetchSessionEpoch)
	f(CodeFencedLeaderEpoch, kerr.FencedLeaderEpoch)
	f(CodeUnknownLeaderEpoch, kerr.UnknownLeaderEpoch)
	f(CodeMemberIDRequired, kerr.MemberIDRequired)
	f(CodeFencedInstanceID, kerr.FencedInstanceID)
	f(CodeInvalidRecord, kerr.InvalidRecord)
	f(CodeUnstableOffsetCommit, kerr.UnstableOffsetCommit)
	f(CodeProducerFenced, kerr.ProducerFenced)
	f(CodeUnknownTopicID, kerr.UnknownTopicID)
	f(CodeTransactionAbortable, kerr.TransactionAbortable)
	f(CodeGroupIDNotFound, kerr.GroupIDNotFound)
	f(CodeNonEmptyGroup, kerr.NonEmptyGroup)
	f(CodeTopicDeletionDisabled, kerr.TopicDeletionDisabled)
	f(CodeUnknownProducerID, kerr.UnknownProducerID)
	f(CodeTransactionCoordinatorFenced, kerr.TransactionCoordinatorFenced)
	f(CodeGroupAuthorizationFailed, kerr.GroupAuthorizationFailed)
	f(CodeClusterAuthorizationFailed, kerr.ClusterAuthorizationFailed)
	f(CodeCoordinatorNotAvailable, kerr.CoordinatorNotAvailable)
	f(CodeCoordinatorLoadInProgress, kerr.CoordinatorLoadInProgress)
	f(CodeOffsetOutOfRange, kerr.OffsetOutOfRange)
	f(CodeLeaderNotAvailable, kerr.LeaderNotAvailable)
	f(CodeInvalidTopicException, kerr.InvalidTopicException)
	f(CodeInvalidReplicaAssignment, kerr.InvalidReplicaAssignment)
	f(CodeGroupMaxSizeReached, kerr.GroupMaxSizeReached)
	f(CodeInconsistentGroupProtocol, kerr.InconsistentGroupProtocol)
	f(CodeInvalidSessionTimeout, kerr.InvalidSessionTimeout)
	f(CodeUnknownServerError, kerr.UnknownServerError)
	f(CodeNetworkException, kerr.NetworkException)
}
