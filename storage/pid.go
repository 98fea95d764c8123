package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// pidBlockSize is how many producer ids one persisted reservation covers.
const pidBlockSize = 1000

// maxLocalPID keeps local ids within the broker's 2^40 range.
const maxLocalPID = int64(1) << 40

// PIDAllocator hands out producer ids for InitProducerId: pid = (brokerID+1)·2^40 + local.
//
// local advances in blocks of pidBlockSize. The block's end ("nextBlock") is persisted (tmp +
// fsync + rename + dir fsync) BEFORE any id of the block is handed out, and opening the
// allocator reserves a fresh block past the persisted mark. A crash therefore skips ids forward
// and never reuses one. There is no fallback: a corrupt file or a failed persist is an error,
// never a counter restarted from 1 (which would hand out ids that live producers still use).
type PIDAllocator struct {
	mu    sync.Mutex
	dir   string
	name  string
	high  int64 // persisted: every local < high may have been issued
	next  int64
	limit int64 // == high once persisted
	top   int64 // (brokerID+1) << 40
}

type pidFile struct {
	NextBlock int64 `json:"nextBlock"`
}

// OpenPIDAllocator opens <clusterDir>/producer_ids/broker-<id>.json and reserves a fresh block.
func OpenPIDAllocator(clusterDir string, brokerID int32) (*PIDAllocator, error) {
	if brokerID < 0 || int64(brokerID)+1 >= 1<<22 {
		return nil, fmt.Errorf("cannot open pid allocator (broker %d): broker id out of range", brokerID)
	}
	a := &PIDAllocator{
		dir:  filepath.Join(clusterDir, "producer_ids"),
		name: fmt.Sprintf("broker-%d.json", brokerID),
		top:  (int64(brokerID) + 1) << 40,
	}
	if err := os.MkdirAll(a.dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create pid dir (%s): %w", a.dir, err)
	}
	path := filepath.Join(a.dir, a.name)
	buf, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// First start of this broker: begin at 0.
	case err != nil:
		return nil, fmt.Errorf("cannot read pid block file (%s): %w", path, err)
	default:
		var f pidFile
		if err := json.Unmarshal(buf, &f); err != nil || f.NextBlock < 0 || f.NextBlock > maxLocalPID {
			return nil, fmt.Errorf("cannot parse pid block file (%s): corrupt content %q; refusing to start (delete it only if no producer id of this broker is in use)", path, truncateForLog(buf))
		}
		a.high = f.NextBlock
	}
	a.next = a.high
	a.limit = a.high
	if err := a.reserveLocked(); err != nil {
		return nil, err
	}
	return a, nil
}

func truncateForLog(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}

// reserveLocked persists the next block's end before any id in it is used.
func (a *PIDAllocator) reserveLocked() error {
	end := a.next + pidBlockSize
	if end > maxLocalPID {
		return fmt.Errorf("cannot reserve pid block (%s): producer id space exhausted", a.name)
	}
	buf, _ := json.Marshal(pidFile{NextBlock: end})
	if err := WriteFileAtomic(a.dir, a.name, buf); err != nil {
		return fmt.Errorf("cannot persist pid block (%s): %w", filepath.Join(a.dir, a.name), err)
	}
	a.high, a.limit = end, end
	return nil
}

// Next returns a fresh producer id. If a new block cannot be persisted it returns the error and
// hands out nothing.
func (a *PIDAllocator) Next() (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next >= a.limit {
		if err := a.reserveLocked(); err != nil {
			return -1, err
		}
	}
	pid := a.top + a.next
	a.next++
	return pid, nil
}
