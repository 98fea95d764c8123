package storage

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kaas-go/kaas/codec"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// tb describes a test batch.
type tb struct {
	pid   int64 // -1 = not idempotent
	epoch int16
	seq   int32
	n     int   // records, default 1
	ts    int64 // first record timestamp; record i has ts+i
	value int   // value size, default 10
	txn   bool  // transactional
}

// makeBatch encodes a v2 batch with kmsg and checks it with codec.ValidateProduce, as a produce
// handler would.
func makeBatch(t testing.TB, o tb) codec.Batch {
	t.Helper()
	if o.n == 0 {
		o.n = 1
	}
	if o.value == 0 {
		o.value = 10
	}
	if o.pid == 0 {
		o.pid = -1
	}
	seq := o.seq
	epoch := o.epoch
	if o.pid < 0 {
		seq, epoch = -1, -1
	}
	var recs []byte
	for i := 0; i < o.n; i++ {
		r := kmsg.Record{TimestampDelta64: int64(i), OffsetDelta: int32(i), Value: make([]byte, o.value)}
		body := r.AppendTo(nil)
		r.Length = int32(len(body) - 1) // the zero length varint is one byte
		recs = r.AppendTo(recs)
	}
	var attrs int16
	if o.txn {
		attrs = codec.AttrTransactional
	}
	rb := kmsg.RecordBatch{Attributes: attrs,
		Length: int32(codec.BatchHeaderSize - codec.LogOverhead + len(recs)), PartitionLeaderEpoch: -1, Magic: 2,
		LastOffsetDelta: int32(o.n - 1), FirstTimestamp: o.ts, MaxTimestamp: o.ts + int64(o.n-1),
		ProducerID: o.pid, ProducerEpoch: epoch, FirstSequence: seq, NumRecords: int32(o.n), Records: recs,
	}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	v, code := codec.ValidateProduce(b, codec.ValidateOptions{})
	if code != codec.CodeNone {
		t.Fatalf("test batch invalid: code %d", code)
	}
	return v
}

// openStore opens a store in dir (a fresh temp dir if empty) with retention loop off.
func openStore(t testing.TB, dir string, mod ...func(*Config)) *Store {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	// The suite runs with log.preallocate on (the harder path: fdatasync into a pre-zeroed tail);
	// `make test` runs it a second time with KAAS_TEST_PREALLOCATE=0, the production default.
	// log.wal.enable likewise: on unless KAAS_TEST_WAL=0 (`make test` runs that once too).
	cfg := Config{Dir: dir, IndexIntervalBytes: 256, Preallocate: os.Getenv("KAAS_TEST_PREALLOCATE") != "0",
		WAL: os.Getenv("KAAS_TEST_WAL") != "0", walGenBytes: 1 << 20,
		// No timed checkpoints unless a test asks: crash tests rely on unsynced segments.
		walCheckpointEvery: time.Hour}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newPartition creates topic "t" with one partition and the given overrides.
func newPartition(t testing.TB, s *Store, kv map[string]string) *Partition {
	t.Helper()
	top, err := s.CreateTopic("t", 1, kv)
	if err != nil {
		t.Fatal(err)
	}
	return top.Partition(0)
}

// crash simulates kill -9: flushers stop and files close with nothing persisted (no snapshot, no
// final fsync, no further WAL write or checkpoint). Written-but-unsynced bytes stay, as they
// would in the page cache.
func crash(s *Store) {
	if s.cleaner != nil {
		s.cleaner.close()
	}
	if s.stopRetention != nil {
		close(s.stopRetention)
		<-s.retentionDone
	}
	if s.wal != nil {
		_ = s.wal.close(false)
	}
	_ = s.closeAll(false)
	s.bg.Wait()
}

// withoutWAL turns log.wal.enable off whatever KAAS_TEST_WAL says: the test is about the
// per-partition fsync path.
func withoutWAL(c *Config) { c.WAL = false }

// waitWALContinues waits until the WAL recovered from an injected failure (appends answer
// KAFKA_STORAGE_ERROR until it did).
func waitWALContinues(t testing.TB, s *Store) {
	t.Helper()
	if s.wal != nil {
		eventually(t, "write-ahead log continues after the failure", func() bool { return !s.wal.broken.Load() })
	}
}

// withWAL turns it on whatever KAAS_TEST_WAL says.
func withWAL(c *Config) { c.WAL = true }

// mustAppend appends and waits for durability.
func mustAppend(t testing.TB, p *Partition, b codec.Batch, now int64) AppendResult {
	t.Helper()
	r := p.Append(b, now)
	if r.Code != codec.CodeNone {
		t.Fatalf("append: code %d", r.Code)
	}
	if err := syncWait(p, r.LastOffset+1); err != nil {
		t.Fatalf("sync: %v", err)
	}
	return r
}

func syncWait(p *Partition, end int64) error {
	ch := make(chan error, 1)
	p.Sync(end, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("sync timed out")
	}
}

// eventually polls cond until it holds or a deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// readAll reads every batch in [from, HWM).
func readAll(t testing.TB, p *Partition, from int64) []codec.Batch {
	t.Helper()
	var out []codec.Batch
	for from < p.HighWatermark() {
		buf, code := p.Read(nil, from, 1<<20, p.HighWatermark())
		if code != codec.CodeNone {
			t.Fatalf("read at %d: code %d", from, code)
		}
		if len(buf) == 0 {
			t.Fatalf("read at %d returned nothing below HWM %d", from, p.HighWatermark())
		}
		for len(buf) > 0 {
			b, ok, bad := codec.FrameBatch(buf)
			if !ok || bad || !b.CRCValid() {
				t.Fatalf("read at %d returned a bad batch", from)
			}
			out = append(out, b)
			buf = buf[len(b):]
			from = b.LastOffset() + 1
		}
	}
	return out
}

// faultFS wraps the OS file system and injects write / fsync errors into segment files.
type faultFS struct {
	mu        sync.Mutex
	writeErr  error
	partial   int // bytes of a failing write that reach the file first
	syncErr   error
	syncs     atomic.Int64
	datasyncs atomic.Int64 // of syncs, the fdatasync ones
	zeroErr   error        // fails the zeroer's writes (all-zero buffers of >= 4 KiB) only
	zeroWrite atomic.Int64 // zero writes seen
	syncDelay time.Duration
	gate      chan struct{} // when set, Sync blocks until it is closed
	// match, when set, limits writeErr, syncErr, syncDelay and gate to files whose path
	// contains it (e.g. "/wal/" for the write-ahead log only).
	match    string
	walSyncs atomic.Int64 // syncs of write-ahead log files
	// synced is every file's size at its last successful sync (loseUnsynced).
	synced map[string]int64
}

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	of, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: of, fs: f}, nil
}

func (f *faultFS) set(fn func(*faultFS)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

type faultFile struct {
	*os.File
	fs *faultFS
}

func (f *faultFile) matches() bool {
	return f.fs.match == "" || strings.Contains(f.Name(), f.fs.match)
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	err, partial := f.fs.writeErr, f.fs.partial
	if !f.matches() {
		err = nil
	}
	if len(p) >= 4096 && allZero(p) {
		f.fs.zeroWrite.Add(1)
		if f.fs.zeroErr != nil {
			err = f.fs.zeroErr
		}
	}
	f.fs.mu.Unlock()
	if err != nil {
		n := min(partial, len(p))
		_, _ = f.File.WriteAt(p[:n], off)
		return n, err
	}
	return f.File.WriteAt(p, off)
}

// Datasync injects the same faults as Sync: the flusher uses it for the pre-zeroed region.
func (f *faultFile) Datasync() error {
	f.fs.datasyncs.Add(1)
	return f.sync(func() error { return Fdatasync(f.File) })
}

func (f *faultFile) Sync() error { return f.sync(f.File.Sync) }

func (f *faultFile) sync(real func() error) error {
	f.fs.syncs.Add(1)
	if strings.Contains(f.Name(), "/"+walDirName+"/") {
		f.fs.walSyncs.Add(1)
	}
	f.fs.mu.Lock()
	err, d, gate := f.fs.syncErr, f.fs.syncDelay, f.fs.gate
	if !f.matches() {
		err, d, gate = nil, 0, nil
	}
	f.fs.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if d > 0 {
		time.Sleep(d) // simulated disk latency, not a wait for state
	}
	if err != nil {
		return err
	}
	if err := real(); err != nil {
		return err
	}
	if st, serr := f.File.Stat(); serr == nil {
		f.fs.mu.Lock()
		if f.fs.synced == nil {
			f.fs.synced = map[string]int64{}
		}
		f.fs.synced[f.Name()] = st.Size()
		f.fs.mu.Unlock()
	}
	return nil
}

// loseUnsynced simulates what a power loss does to segment files after a crash: every .log file
// under dir/topics is cut back to its size at its last sync through ffs (0 if it was never
// synced; new segment files are created empty and their directory entry is synced). It returns
// how many bytes were cut. (With log.preallocate, bytes written over synced zeros stay, which is
// kinder than a real power loss.)
func loseUnsynced(t testing.TB, ffs *faultFS, dir string) int64 {
	t.Helper()
	var cut int64
	err := filepath.WalkDir(filepath.Join(dir, "topics"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
			return err
		}
		st, err := os.Stat(path)
		if err != nil {
			return err
		}
		ffs.mu.Lock()
		size := ffs.synced[path]
		ffs.mu.Unlock()
		if st.Size() > size {
			cut += st.Size() - size
			return os.Truncate(path, size)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return cut
}
