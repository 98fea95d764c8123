package storage

import (
	"errors"
	"fmt"

	"github.com/kaas-go/kaas/codec"
)

// Sentinel errors returned by the Store's admin operations. Handlers map them to Kafka error codes
// with ErrorCode.
var (
	ErrTopicExists       = errors.New("topic already exists")
	ErrUnknownTopic      = errors.New("unknown topic")
	ErrInvalidTopic      = errors.New("invalid topic name")
	ErrInvalidPartitions = errors.New("invalid partition count")
	ErrClosed            = errors.New("partition or store is closed")
	// ErrNotLoaded: the partition was released from this broker (NOT_LEADER_OR_FOLLOWER, 6).
	ErrNotLoaded = errors.New("partition is not loaded on this broker")
)

// ConfigError reports an unknown topic config key or an invalid value (INVALID_CONFIG, 40).
type ConfigError struct {
	Key    string
	Value  string
	Reason string
}

func (e *ConfigError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("invalid topic config %q: %s", e.Key, e.Reason)
	}
	return fmt.Sprintf("invalid value %q for topic config %q: %s", e.Value, e.Key, e.Reason)
}

// ErrorCode maps an error returned by the Store's admin operations to a Kafka error code.
func ErrorCode(err error) int16 {
	var ce *ConfigError
	switch {
	case err == nil:
		return codec.CodeNone
	case errors.Is(err, ErrTopicExists):
		return codec.CodeTopicAlreadyExists
	case errors.Is(err, ErrUnknownTopic):
		return codec.CodeUnknownTopicOrPartition
	case errors.Is(err, ErrInvalidTopic):
		return codec.CodeInvalidTopicException
	case errors.Is(err, ErrNotLoaded), errors.Is(err, ErrFenced):
		return codec.CodeNotLeaderForPartition
	case errors.Is(err, ErrInvalidPartitions):
		return codec.CodeInvalidPartitions
	case errors.As(err, &ce):
		return codec.CodeInvalidConfig
	default:
		return codec.CodeKafkaStorageError
	}
}
