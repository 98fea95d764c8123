package group

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/storage"
)

// TestStoreRefusalsAreInvalidRequest: what the offset store refuses by its write-time limits is
// answered INVALID_REQUEST (a retry cannot succeed); a failed write stays the retriable
// NOT_COORDINATOR.
func TestStoreRefusalsAreInvalidRequest(t *testing.T) {
	for err, want := range map[error]int16{
		nil: codec.CodeNone,
		fmt.Errorf("cannot store offsets of group: %w", storage.ErrGroupIDTooLong):       codec.CodeInvalidRequest,
		fmt.Errorf("cannot store offsets of group: %w", storage.ErrOffsetCommitTooLarge): codec.CodeInvalidRequest,
		errors.New("cannot persist committed offsets: input/output error"):               codec.CodeNotCoordinator,
	} {
		if got := storeErrorCode(err); got != want {
			t.Errorf("storeErrorCode(%v) = %d, want %d", err, got, want)
		}
	}
}
