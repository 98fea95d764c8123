package storage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Leader epochs (KIP-101 / KIP-279), per partition, as Apache's LeaderEpochFileCache.
//
// A loaded partition has a leader epoch; every batch appended while it is loaded is stamped with
// it (the batch header's partitionLeaderEpoch). The epoch cache lists, for each epoch, the first
// offset appended under it; OffsetsForLeaderEpoch answers from it (EndOffsetForEpoch) so a
// client or follower can find where its copy of the log diverged.
//
// File: <partition dir>/leader-epoch-checkpoint, Kafka's text layout ("0" version line, entry
// count line, then "<epoch> <startOffset>" lines), written tmp + fsync + rename whenever an
// entry is added. No file = epoch 0 from offset 0: a single broker stays at epoch 0 forever and
// never writes one, so its partition directories look as they always did.
const leaderEpochFile = "leader-epoch-checkpoint"

// epochEntry is one epoch and the first offset appended under it.
type epochEntry struct {
	epoch int32
	start int64
}

// implicitEpochs is the cache of a partition without a checkpoint file.
var implicitEpochs = []epochEntry{{epoch: 0, start: 0}}

var errBadEpochFile = errors.New("bad leader epoch checkpoint")

func encodeEpochs(ents []epochEntry) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "0\n%d\n", len(ents))
	for _, e := range ents {
		fmt.Fprintf(&b, "%d %d\n", e.epoch, e.start)
	}
	return b.Bytes()
}

// decodeEpochs parses a checkpoint: epochs strictly increasing, start offsets non-decreasing.
func decodeEpochs(buf []byte) ([]epochEntry, error) {
	sc := bufio.NewScanner(bytes.NewReader(buf))
	var lines []string
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) < 2 || lines[0] != "0" {
		return nil, errBadEpochFile
	}
	n, err := strconv.Atoi(lines[1])
	if err != nil || n < 0 || n != len(lines)-2 {
		return nil, errBadEpochFile
	}
	out := make([]epochEntry, 0, n)
	for _, l := range lines[2:] {
		f := strings.Fields(l)
		if len(f) != 2 {
			return nil, errBadEpochFile
		}
		ep, err1 := strconv.ParseInt(f[0], 10, 32)
		off, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil || ep < 0 || off < 0 {
			return nil, errBadEpochFile
		}
		if k := len(out); k > 0 && (int32(ep) <= out[k-1].epoch || off < out[k-1].start) {
			return nil, errBadEpochFile
		}
		out = append(out, epochEntry{epoch: int32(ep), start: off})
	}
	return out, nil
}

// loadEpochs reads the partition's checkpoint (implicitEpochs if there is none). Entries that
// start past the log end describe offsets a crash took back and are dropped (Apache truncates
// the cache to the log end the same way).
func (p *Partition) loadEpochs(leo int64) error {
	buf, err := os.ReadFile(filepath.Join(p.dir, leaderEpochFile))
	if errors.Is(err, os.ErrNotExist) {
		p.epochs = implicitEpochs
		p.leaderEpoch.Store(0)
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot read leader epoch checkpoint (%s): %w", p.dir, err)
	}
	ents, err := decodeEpochs(buf)
	if err != nil || len(ents) == 0 {
		return fmt.Errorf("cannot parse leader epoch checkpoint (%s): %w", filepath.Join(p.dir, leaderEpochFile), errBadEpochFile)
	}
	for len(ents) > 1 && ents[len(ents)-1].start > leo {
		ents = ents[:len(ents)-1]
	}
	p.epochs = ents
	p.leaderEpoch.Store(ents[len(ents)-1].epoch)
	return nil
}

// setLeaderEpochLocked (under mu) makes epoch the partition's leader epoch from the log end on,
// persisting the new cache entry before any batch is stamped with it. A lower epoch than the
// latest known is refused: a stale leadership must not write.
func (p *Partition) setLeaderEpochLocked(epoch int32) error {
	cur := p.epochs[len(p.epochs)-1]
	switch {
	case epoch == cur.epoch:
		return nil
	case epoch < cur.epoch:
		return fmt.Errorf("cannot set leader epoch (%s-%d): %d is below the latest known epoch %d", p.topic.Name, p.id, epoch, cur.epoch)
	}
	next := append(append(make([]epochEntry, 0, len(p.epochs)+1), p.epochs...), epochEntry{epoch: epoch, start: p.leoLocal})
	if err := WriteFileAtomic(p.dir, leaderEpochFile, encodeEpochs(next)); err != nil {
		return fmt.Errorf("cannot write leader epoch checkpoint (%s-%d): %w", p.topic.Name, p.id, err)
	}
	p.epochMu.Lock()
	p.epochs = next
	p.epochMu.Unlock()
	p.leaderEpoch.Store(epoch)
	return nil
}

// LeaderEpoch is the partition's current leader epoch (0 for a single broker).
func (p *Partition) LeaderEpoch() int32 { return p.leaderEpoch.Load() }

// EndOffsetForEpoch answers OffsetsForLeaderEpoch (KIP-101/KIP-279) as Apache's
// LeaderEpochFileCache.endOffsetFor does:
//
//	requested == -1 (undefined), or partition not loaded ─► (-1, -1)
//	requested == current epoch ─────────────────────────► (current, log end offset)
//	requested above every known epoch ──────────────────► (-1, -1)
//	requested below every known epoch ──────────────────► (requested, start of the first epoch)
//	otherwise ──────────────────────────────────────────► (largest epoch <= requested,
//	                                                       start of the next known epoch)
func (p *Partition) EndOffsetForEpoch(requested int32) (leaderEpoch int32, endOffset int64) {
	if requested < 0 || !p.Loaded() {
		return -1, -1
	}
	p.epochMu.Lock()
	ents := p.epochs
	p.epochMu.Unlock()
	latest := ents[len(ents)-1]
	if requested == latest.epoch {
		return latest.epoch, p.leo.Load()
	}
	hi := sort.Search(len(ents), func(i int) bool { return ents[i].epoch > requested })
	if hi == len(ents) {
		return -1, -1
	}
	if hi == 0 {
		return requested, ents[0].start
	}
	return ents[hi-1].epoch, ents[hi].start
}
