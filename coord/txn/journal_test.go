package txn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// ---------------------------------------------------------------------------------------------
// helpers

// fastCheckpoints makes every worker checkpoint (and rotate) after a few KiB or milliseconds.
func fastCheckpoints(c *Config) {
	c.CheckpointBytes = 4 << 10
	c.CheckpointInterval = 2 * time.Millisecond
}

// workload runs n producers concurrently, each through cycles TV2 transactions (implicit add,
// EndTxn commit or abort, Complete); afterwards producer i%5==1 leaves a transaction Ongoing,
// i%5==2 leaves one prepared (markers never completed) and i%5==3 is deleted. Every operation
// is waited for, so everything it did was acknowledged.
func workload(t *testing.T, tc *testCoord, prefix string, n, cycles int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tid := fmt.Sprintf("%s%d", prefix, i)
			r, err := call(t, func(d func(InitProducerIDResult, error)) {
				tc.InitProducerID(InitProducerIDParams{TransactionalID: tid, TimeoutMs: 60_000, ProducerID: -1, ProducerEpoch: -1, Version: 4}, d)
			})
			if err != nil || r.Code != 0 {
				errs <- fmt.Errorf("init %s: %+v %v", tid, r, err)
				return
			}
			pid, epoch := r.ProducerID, r.ProducerEpoch
			add := func(p int32) error {
				a, err := call(t, func(d func(AddPartitionsResult, error)) {
					tc.AddPartitions(AddPartitionsParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch,
						Partitions: []TopicPartitions{{Topic: "t", Partitions: []int32{p}}, {Topic: "u", Partitions: []int32{p + 1, p + 3}}}, Version: 5, Implicit: true}, d)
				})
				if err != nil || a.Code != 0 {
					return fmt.Errorf("add %s: %+v %v", tid, a, err)
				}
				return nil
			}
			end := func(commit bool) (EndTxnResult, error) {
				e, err := call(t, func(d func(EndTxnResult, error)) {
					tc.prepareEndTxn(EndTxnParams{TransactionalID: tid, ProducerID: pid, ProducerEpoch: epoch, Commit: commit, Version: 5}, d)
				})
				if err != nil || e.Code != 0 || e.Action.Markers == nil {
					return e, fmt.Errorf("end %s: %+v %v", tid, e, err)
				}
				return e, nil
			}
			for c := 0; c < cycles; c++ {
				if err := add(int32(c % 4)); err != nil {
					errs <- err
					return
				}
				commit := c%3 != 2
				e, err := end(commit)
				if err != nil {
					errs <- err
					return
				}
				m := e.Action.Markers
				cr, err := call(t, func(d func(CompleteResult, error)) {
					tc.complete(CompleteParams{TransactionalID: tid, ProducerID: m.ProducerID, ProducerEpoch: m.ProducerEpoch, Commit: commit}, d)
				})
				if err != nil || cr.Code != 0 {
					errs <- fmt.Errorf("complete %s: %+v %v", tid, cr, err)
					return
				}
				pid, epoch = e.ProducerID, e.ProducerEpoch
			}
			switch i % 5 {
			case 1:
				if err := add(7); err != nil {
					errs <- err
				}
			case 2:
				if err := add(8); err != nil {
					errs <- err
					return
				}
				if _, err := end(true); err != nil {
					errs <- err
				}
			case 3:
				if _, err := call(t, func(d func(any, error)) {
					tc.submit(tid, func(*Entry, time.Time) (*Entry, any) { return nil, nil }, d)
				}); err != nil {
					errs <- err
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// entriesOf copies every entry of a stopped coordinator (its workers have exited) with the
// coordinator epoch cleared: a restart bumps it on purpose.
func entriesOf(c *Coordinator) map[string]Entry {
	out := map[string]Entry{}
	for _, w := range c.workers {
		for _, ss := range w.slots {
			for tid, e := range ss.entries {
				x := *e.clone()
				x.CoordinatorEpoch, x.pending = 0, false
				out[tid] = x
			}
		}
	}
	return out
}

func sameEntries(t *testing.T, what string, want, got map[string]Entry) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s: %d entries, want %d", what, len(got), len(want))
	}
	for tid, w := range want {
		g, ok := got[tid]
		if !ok || !persistedEqual(&w, &g) {
			t.Fatalf("%s: entry %s = %+v (present %v), want %+v", what, tid, g, ok, w)
		}
	}
}

// stateFiles lists the names in dir/txn_state, sorted.
func stateFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, StateDir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func journalFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, n := range stateFiles(t, dir) {
		if _, ok := parseJournalName(n); ok {
			out = append(out, n)
		}
	}
	return out
}

// newestWithData returns the path and scan of the newest generation holding data.
func newestWithData(t *testing.T, dir string) (string, genScan) {
	t.Helper()
	var best string
	var bestID journalID
	var bestScan genScan
	for _, n := range journalFiles(t, dir) {
		id, _ := parseJournalName(n)
		path := filepath.Join(dir, StateDir, n)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := scanJournal(data)
		if err != nil {
			t.Fatal(err)
		}
		if len(sc.recs) > 0 && (best == "" || id.gen > bestID.gen) {
			best, bestID, bestScan = path, id, sc
		}
	}
	if best == "" {
		t.Fatal("no journal generation holds data")
	}
	return best, bestScan
}

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func tryStart(dir string, mod func(*Config)) error {
	cfg := Config{ClusterDir: dir, AllocPID: (&atomicAlloc{}).alloc, ReaperInterval: time.Hour, Partitions: newFakeParts()}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		return err
	}
	err = c.Start()
	c.Close()
	return err
}

func preparedCount(m map[string]Entry) int {
	n := 0
	for _, e := range m {
		if e.State.IsPrepare() {
			n++
		}
	}
	return n
}

// ---------------------------------------------------------------------------------------------
// format

func TestJournalRecordRoundTrip(t *testing.T) {
	full := &Entry{TransactionalID: "rt", ProducerID: 1 << 41, ProducerEpoch: 32766, LastProducerID: 77, LastProducerEpoch: -1,
		NextProducerID: 1<<41 + 5, State: PrepareAbort, TimeoutMs: 900_000, TxnStartMs: 1_700_000_000_123, LastUpdateMs: 1_700_000_000_456,
		Partitions: map[string][]int32{"b": {0, 5, 2147483647}, "a": {-1, 3}, "c": {1}}, Groups: []string{"g1", "g2"},
		TxnVersion: 2, CoordinatorEpoch: 9}
	for _, r := range []journalRec{
		{batch: 3, last: true, slot: SlotFor("rt"), seq: 1 << 40, epoch: 9, tid: "rt", entry: full},
		{batch: 1, slot: SlotFor("rt"), seq: 1, epoch: 0, tid: "rt", entry: &Entry{TransactionalID: "rt", State: Empty, TxnVersion: 1}},
		{batch: 1, last: true, slot: SlotFor("gone"), seq: 2, epoch: 1, tid: "gone"},
	} {
		b := appendRecord(nil, &r)
		payload, ok := readFrame(b)
		if !ok || len(payload) != len(b)-journalFrameHdr {
			t.Fatalf("frame of %+v not readable", r)
		}
		got, err := decodeRecord(payload)
		if err != nil {
			t.Fatal(err)
		}
		if got.batch != r.batch || got.last != r.last || got.slot != r.slot || got.seq != r.seq || got.epoch != r.epoch || got.tid != r.tid ||
			(r.entry == nil) != (got.entry == nil) || (r.entry != nil && !persistedEqual(r.entry, got.entry)) {
			t.Fatalf("round trip: %+v (%+v), want %+v (%+v)", got, got.entry, r, r.entry)
		}
		// Any single flipped bit is caught by the CRC.
		for i := 0; i < len(b); i++ {
			c := bytes.Clone(b)
			c[i] ^= 0x10
			if p, ok := readFrame(c); ok && bytes.Equal(p, payload) && i >= journalFrameHdr {
				t.Fatalf("flip at %d not detected", i)
			}
		}
	}
	// Pinned on-disk state codes (README.md): the enum may move, the format may not.
	for st, code := range map[State]byte{Empty: 0, Ongoing: 1, PrepareCommit: 2, PrepareAbort: 3, CompleteCommit: 4, CompleteAbort: 5, Dead: 7} {
		if got := stateCode(st); got != code {
			t.Fatalf("stateCode(%s) = %d, want %d", st, got, code)
		}
		if back, ok := stateFromCode(code); !ok || back != st {
			t.Fatalf("stateFromCode(%d) = %s", code, back)
		}
	}
	if _, ok := stateFromCode(6); ok {
		t.Fatal("PrepareEpochFence has an on-disk code")
	}
	// Records that a slot file would refuse are refused here too.
	for _, r := range []journalRec{
		{batch: 1, slot: (SlotFor("rt") + 1) % NumSlots, seq: 1, tid: "rt", entry: full},
		{batch: 1, slot: (SlotFor("rt") + 1) % NumSlots, seq: 1, tid: "rt"},
		{batch: 0, slot: SlotFor("rt"), seq: 1, tid: "rt"},
		{batch: 1, slot: SlotFor("rt"), seq: 0, tid: "rt"},
	} {
		if _, err := decodeRecord(appendRecord(nil, &r)[journalFrameHdr:]); err == nil {
			t.Fatalf("invalid record %+v decoded", r)
		}
	}
	unsorted := full.clone()
	unsorted.Groups = []string{"g2", "g1"}
	if _, err := decodeRecord(appendRecord(nil, &journalRec{batch: 1, slot: SlotFor("rt"), seq: 1, tid: "rt", entry: unsorted})[journalFrameHdr:]); err == nil {
		t.Fatal("unsorted groups decoded")
	}
}

func TestJournalNames(t *testing.T) {
	id := journalID{broker: 7, worker: 3, gen: 42}
	name := journalName(id)
	if name != "journal-b7-w3-00000000000000000042.log" {
		t.Fatalf("name %s", name)
	}
	if got, ok := parseJournalName(name); !ok || got != id {
		t.Fatalf("parse %s: %+v %v", name, got, ok)
	}
	for _, bad := range []string{"journal-b7-w3-42.log", "journal-b-1-w3-00000000000000000042.log", "journal-b7-w3-00000000000000000042.log.tmp",
		"slot-1.json", "journal-b07-w3-00000000000000000042.log", "journal-b7-x3-00000000000000000042.log"} {
		if _, ok := parseJournalName(bad); ok {
			t.Fatalf("parsed %s", bad)
		}
	}
	h := appendJournalHeader(nil, id)
	if got, err := parseJournalHeader(h); err != nil || got != id {
		t.Fatalf("header: %+v %v", got, err)
	}
	h[20] ^= 1
	if _, err := parseJournalHeader(h); err == nil {
		t.Fatal("damaged header accepted")
	}
}

// FuzzScanJournal: the scan of arbitrary bytes never panics, and whatever it accepts decodes to
// records that pass the slot-file validation.
func FuzzScanJournal(f *testing.F) {
	file := appendJournalHeader(nil, journalID{gen: 1})
	e := &Entry{TransactionalID: "fz", ProducerID: 3, State: Ongoing, TxnVersion: 2, Partitions: map[string][]int32{"t": {1, 2}}, Groups: []string{"g"}}
	file = appendRecord(file, &journalRec{batch: 1, slot: SlotFor("fz"), seq: 1, tid: "fz", entry: e})
	file = appendRecord(file, &journalRec{batch: 1, last: true, slot: SlotFor("x"), seq: 1, tid: "x"})
	file = appendRecord(file, &journalRec{batch: 2, last: true, slot: SlotFor("fz"), seq: 2, tid: "fz", entry: e})
	f.Add(file)
	f.Add(append(bytes.Clone(file), make([]byte, 64)...))
	f.Add(file[:len(file)-5])
	torn := bytes.Clone(file)
	torn[journalHeaderSize+12] ^= 0xff
	f.Add(torn)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < journalHeaderSize {
			return
		}
		sc, err := scanJournal(data)
		if err != nil {
			return
		}
		if sc.end < journalHeaderSize || sc.end > int64(len(data)) {
			t.Fatalf("end %d of %d bytes", sc.end, len(data))
		}
		for _, r := range sc.recs {
			if r.entry != nil {
				if err := checkEntry(r.slot, r.tid, r.entry); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// ---------------------------------------------------------------------------------------------
// crash and recovery

// TestCrashKeepsAcknowledgedState: everything acknowledged before a kill is there after the
// restart — from the journal alone (no checkpoint yet) and from checkpoints + journal.
func TestCrashKeepsAcknowledgedState(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  func(*Config)
	}{{"journal only", nil}, {"checkpoints and journal, 3 workers", func(c *Config) {
		fastCheckpoints(c)
		c.Workers = 3
	}}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tc, _ := startCoord(t, dir, tt.mod)
			workload(t, tc, "ck-", 40, 6)
			tc.Coordinator.crash()
			want := entriesOf(tc.Coordinator)
			crashed := journalFiles(t, dir)
			if len(crashed) == 0 {
				t.Fatal("no journal left by the crash")
			}
			if tt.mod == nil {
				for _, n := range stateFiles(t, dir) {
					if strings.HasPrefix(n, "slot-") {
						t.Fatalf("slot file %s written without a checkpoint", n)
					}
				}
			}

			tc2, acts := startCoord(t, dir, tt.mod)
			if len(acts) != preparedCount(want) || len(acts) == 0 {
				t.Fatalf("%d prepared transactions returned, want %d", len(acts), preparedCount(want))
			}
			for _, a := range acts {
				if a.Markers == nil || a.Markers.CoordinatorEpoch != 2 {
					t.Fatalf("reconcile action %+v: coordinator epoch not bumped past the journal's", a.Markers)
				}
			}
			// The replay was checkpointed: the old generations are gone.
			for _, n := range journalFiles(t, dir) {
				if slices.Contains(crashed, n) {
					t.Fatalf("replayed generation %s still there", n)
				}
			}
			// Keep working on top of the replayed state, crash again, restart again.
			workload(t, tc2, "ck2-", 10, 2)
			tc2.Coordinator.crash()
			want2 := entriesOf(tc2.Coordinator)
			sameEntries(t, "after first restart", want, func() map[string]Entry {
				m := map[string]Entry{}
				for k, v := range want2 {
					if strings.HasPrefix(k, "ck-") {
						m[k] = v
					}
				}
				return m
			}())
			tc3, _ := startCoord(t, dir, tt.mod)
			tc3.Coordinator.crash()
			sameEntries(t, "after second restart", want2, entriesOf(tc3.Coordinator))
		})
	}
}

// TestTornTailTruncated: damage at the end of the newest generation — garbage, half a record, a
// batch without its last record, a stray record of the unfinished batch behind zeros — is an
// unacknowledged batch: truncated with a log line, everything before it kept.
func TestTornTailTruncated(t *testing.T) {
	ghost := func(batch uint64, last bool) []byte {
		return appendRecord(nil, &journalRec{batch: batch, last: last, slot: SlotFor("ghost"), seq: 1, epoch: 1, tid: "ghost",
			entry: &Entry{TransactionalID: "ghost", ProducerID: 99, State: Empty, TxnVersion: 1}})
	}
	for _, tt := range []struct {
		name   string
		damage func(sc genScan) (off int64, b []byte)
	}{
		{"garbage", func(sc genScan) (int64, []byte) { return sc.end, bytes.Repeat([]byte{0xab}, 100) }},
		{"half a record", func(sc genScan) (int64, []byte) {
			r := ghost(sc.recs[len(sc.recs)-1].batch+1, true)
			return sc.end, r[:len(r)/2]
		}},
		{"incomplete batch", func(sc genScan) (int64, []byte) { return sc.end, ghost(sc.recs[len(sc.recs)-1].batch+1, false) }},
		{"stray record behind zeros", func(sc genScan) (int64, []byte) {
			return sc.end + 4096, ghost(sc.recs[len(sc.recs)-1].batch+1, true)
		}},
		{"short header", func(sc genScan) (int64, []byte) { return sc.end, []byte{0, 0, 1} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tc, _ := startCoord(t, dir, nil)
			workload(t, tc, "tt-", 12, 3)
			tc.Coordinator.crash()
			want := entriesOf(tc.Coordinator)
			path, sc := newestWithData(t, dir)
			off, b := tt.damage(sc)
			writeAt(t, path, off, b)

			core, logs := observer.New(zapcore.WarnLevel)
			tc2, _ := startCoord(t, dir, func(c *Config) { c.Logger = zap.New(core) })
			if logs.FilterMessage("truncating torn tail of transaction journal (a batch that was never acknowledged)").
				FilterField(zap.String("file", path)).Len() != 1 {
				t.Fatalf("no truncation logged: %+v", logs.All())
			}
			tc2.Coordinator.crash()
			sameEntries(t, "after torn tail", want, entriesOf(tc2.Coordinator))
		})
	}
}

// keepJournals makes every journal deletion fail, so all generations stay on disk.
func keepJournals(fs *countingFS) {
	fs.failRemove = func(path string) error {
		if _, ok := parseJournalName(filepath.Base(path)); ok {
			return errors.New("kept by the test")
		}
		return nil
	}
}

// TestCorruptJournalRefusesToStart: damage that is not a torn tail is acknowledged state;
// the coordinator refuses to start rather than drop it silently.
func TestCorruptJournalRefusesToStart(t *testing.T) {
	// Several generations per worker: deletions fail (and, for the gap case, checkpoints too).
	setup := func(t *testing.T, failCheckpoints bool) (dir string, gens []string) {
		dir = t.TempDir()
		tc, _ := startCoord(t, dir, func(c *Config) {
			c.Workers = 1
			fastCheckpoints(c)
		})
		tc.fs.mu.Lock()
		keepJournals(tc.fs)
		if failCheckpoints {
			tc.fs.failWrite = func(string) error { return errors.New("no checkpoints") }
		}
		tc.fs.mu.Unlock()
		for i := 0; len(gensWithData(t, dir)) < 4; i++ {
			if i > 200 {
				t.Fatal("the journal does not rotate")
			}
			workload(t, tc, fmt.Sprintf("cj%d-", i), 8, 2)
		}
		tc.Coordinator.crash()
		return dir, gensWithData(t, dir)
	}
	var removedGen string
	cases := []struct {
		name, want string
		gap        bool
		damage     func(t *testing.T, gens []string)
	}{
		{"flipped byte mid generation", "followed by acknowledged records", false, func(t *testing.T, gens []string) {
			for _, p := range slices.Backward(gens) {
				data, _ := os.ReadFile(p)
				if sc, _ := scanJournal(data); sc.recs[len(sc.recs)-1].batch >= 2 {
					writeAt(t, p, journalHeaderSize+journalFrameHdr+3, []byte{data[journalHeaderSize+journalFrameHdr+3] ^ 0x40})
					return
				}
			}
			t.Fatal("no generation with two batches")
		}},
		{"torn tail of an older generation", "a later generation of worker 0 holds data", false, func(t *testing.T, gens []string) {
			p := gens[len(gens)-2]
			data, _ := os.ReadFile(p)
			sc, _ := scanJournal(data)
			writeAt(t, p, sc.end, []byte{0, 0, 0, 40, 1, 2, 3, 4, 'P'})
		}},
		{"damaged header", "header checksum mismatch", false, func(t *testing.T, gens []string) {
			writeAt(t, gens[0], 17, []byte{0x55})
		}},
		{"missing generation", "records are missing", true, func(t *testing.T, gens []string) {
			// A generation one of whose slots has records in a later generation: its loss
			// shows as a seq gap (a generation whose slots never reappear cannot be missed).
			slotsOf := func(p string) map[int]bool {
				data, _ := os.ReadFile(p)
				sc, _ := scanJournal(data)
				m := map[int]bool{}
				for _, r := range sc.recs {
					m[r.slot] = true
				}
				return m
			}
			for i := 1; i < len(gens)-1; i++ {
				later := slotsOf(gens[len(gens)-1])
				for s := range slotsOf(gens[i]) {
					if later[s] {
						if err := os.Remove(gens[i]); err != nil {
							t.Fatal(err)
						}
						removedGen = gens[i]
						return
					}
				}
			}
			t.Fatal("no generation shares a slot with the newest")
		}},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			dir, gens := setup(t, tt.gap)
			if err := tryStart(dir, func(c *Config) { c.Workers = 1 }); err != nil {
				t.Fatalf("undamaged journal refused: %v", err)
			}
			// tryStart replayed and retired everything; set it up again and damage it.
			dir, gens = setup(t, tt.gap)
			tt.damage(t, gens)
			err := tryStart(dir, func(c *Config) { c.Workers = 1 })
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "refusing to start") {
				t.Fatalf("start on a damaged journal: %v, want %q", err, tt.want)
			}
			// Nothing was deleted by the refused start.
			for _, g := range gens {
				if _, err := os.Stat(g); err != nil && g != removedGen {
					t.Fatalf("refused start removed %s: %v", g, err)
				}
			}
		})
	}
}

// gensWithData lists the generations that hold at least one record, oldest first.
func gensWithData(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, n := range journalFiles(t, dir) {
		p := filepath.Join(dir, StateDir, n)
		data, err := os.ReadFile(p)
		if err != nil {
			continue // deleted meanwhile
		}
		if sc, err := scanJournal(data); err == nil && len(sc.recs) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// TestReplayIdempotentAtAnyCheckpoint: every slot file a checkpoint ever wrote is recorded; the
// journal is never deleted. Restarting from the slot files as they were at any checkpoint point
// (each slot at its latest version up to that point, i.e. a crash right after that rename and
// before the journal deletion) plus the whole journal yields the same state.
func TestReplayIdempotentAtAnyCheckpoint(t *testing.T) {
	dir := t.TempDir()
	type version struct {
		name string
		data []byte
	}
	var mu sync.Mutex
	var history []version
	tc, _ := startCoord(t, dir, fastCheckpoints)
	tc.fs.mu.Lock()
	keepJournals(tc.fs)
	tc.fs.onRename = func(_, to string) {
		if !strings.HasPrefix(filepath.Base(to), "slot-") {
			return
		}
		data, err := os.ReadFile(to)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		history = append(history, version{filepath.Base(to), data})
		mu.Unlock()
	}
	tc.fs.mu.Unlock()
	for i := 0; i < 3; i++ {
		workload(t, tc, fmt.Sprintf("id%d-", i), 16, 3)
	}
	tc.Coordinator.crash()
	want := entriesOf(tc.Coordinator)
	mu.Lock()
	hist := slices.Clone(history)
	mu.Unlock()
	if len(hist) < 10 {
		t.Fatalf("only %d checkpoint slot writes", len(hist))
	}
	journals := journalFiles(t, dir)
	points := []int{0, 1, len(hist) / 3, len(hist) / 2, len(hist) - 1, len(hist)}
	for _, k := range points {
		t.Run(fmt.Sprintf("point=%d", k), func(t *testing.T) {
			d := t.TempDir()
			sd := filepath.Join(d, StateDir)
			if err := os.MkdirAll(sd, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, n := range journals {
				data, err := os.ReadFile(filepath.Join(dir, StateDir, n))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(sd, n), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, v := range hist[:k] {
				if err := os.WriteFile(filepath.Join(sd, v.name), v.data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tc2, acts := startCoord(t, d, nil)
			tc2.Coordinator.crash()
			sameEntries(t, "replayed", want, entriesOf(tc2.Coordinator))
			if len(acts) != preparedCount(want) {
				t.Fatalf("%d prepared, want %d", len(acts), preparedCount(want))
			}
		})
	}
}

// TestCheckpointFailureLosesNothing: slot file writes fail for a while; operations keep
// succeeding on the journal alone, the journal is kept, a crash loses nothing, and once the
// disk heals a checkpoint covers everything and the old generations go.
func TestCheckpointFailureLosesNothing(t *testing.T) {
	dir := t.TempDir()
	core, logs := observer.New(zapcore.ErrorLevel)
	tc, _ := startCoord(t, dir, func(c *Config) {
		fastCheckpoints(c)
		c.Logger = zap.New(core)
	})
	tc.fs.setFail(func(string) error { return errors.New("slot files unwritable") })
	workload(t, tc, "cf-", 20, 4)
	waitFor(t, "a failed checkpoint", func() bool {
		return logs.FilterMessage("transaction checkpoint failed; the journal keeps the slot's changes and the next checkpoint retries").Len() > 0
	})
	// Heal, and wait for a checkpoint to clear the backlog: at most the current and the
	// prepared next generation per worker remain.
	tc.fs.setFail(nil)
	waitFor(t, "the journal backlog to be checkpointed", func() bool {
		return len(gensWithData(t, dir)) <= len(tc.workers)
	})
	workload(t, tc, "cf2-", 20, 2)
	tc.Coordinator.crash()
	want := entriesOf(tc.Coordinator)
	tc2, _ := startCoord(t, dir, nil)
	tc2.Coordinator.crash()
	sameEntries(t, "after crash", want, entriesOf(tc2.Coordinator))

	// Checkpoints failing at the moment of the crash.
	dir = t.TempDir()
	tc, _ = startCoord(t, dir, fastCheckpoints)
	tc.fs.setFail(func(string) error { return errors.New("slot files unwritable") })
	workload(t, tc, "cf3-", 20, 4)
	tc.Coordinator.crash()
	want = entriesOf(tc.Coordinator)
	tc2, _ = startCoord(t, dir, nil)
	tc2.Coordinator.crash()
	sameEntries(t, "after crash with failing checkpoints", want, entriesOf(tc2.Coordinator))
}

// TestCleanCloseLeavesOnlySlotFiles: a clean Close checkpoints everything and removes the
// journal; the slot files alone carry the state, with the journal sequence they include.
func TestCleanCloseLeavesOnlySlotFiles(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, nil)
	workload(t, tc, "cc-", 24, 3)
	tc.Close()
	want := entriesOf(tc.Coordinator)
	slotName := regexp.MustCompile(`^slot-\d+\.json$`)
	names := stateFiles(t, dir)
	for _, n := range names {
		if !slotName.MatchString(n) {
			t.Fatalf("clean close left %s (files: %v)", n, names)
		}
	}
	var maxSeq uint64
	for slot := 0; slot < NumSlots; slot++ {
		ls, err := readSlot(filepath.Join(dir, StateDir), slot)
		if err != nil {
			t.Fatal(err)
		}
		maxSeq = max(maxSeq, ls.seq)
	}
	if maxSeq == 0 {
		t.Fatal("slot files carry no journal sequence")
	}
	tc2, _ := startCoord(t, dir, nil)
	tc2.Close()
	sameEntries(t, "after clean restart", want, entriesOf(tc2.Coordinator))
}

// TestCheckpointsRetireGenerations: under steady load, checkpoints keep the journal short and
// advance the slot files' seq.
func TestCheckpointsRetireGenerations(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, func(c *Config) {
		fastCheckpoints(c)
		c.Workers = 2
	})
	for i := 0; i < 4; i++ {
		workload(t, tc, fmt.Sprintf("rg%d-", i), 16, 3)
	}
	waitFor(t, "old generations deleted", func() bool { return len(journalFiles(t, dir)) <= 2*2 })
	seqs := 0
	for slot := 0; slot < NumSlots; slot++ {
		if ls, err := readSlot(filepath.Join(dir, StateDir), slot); err == nil && ls.seq > 0 {
			seqs++
		}
	}
	if seqs == 0 {
		t.Fatal("no checkpoint reached the slot files")
	}
}

// TestForeignJournalKept: a journal of ours holding changes of a slot we no longer own is not
// deleted by the start (the slot's owner replays it; README "Ownership").
func TestForeignJournalKept(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, nil)
	tc.init(t, "mine", 60_000)
	tc.init(t, "theirs", 60_000)
	tc.Coordinator.crash()
	before := journalFiles(t, dir)
	theirs := SlotFor("theirs")
	if theirs == SlotFor("mine") {
		t.Fatal("test ids share a slot")
	}
	tc2, _ := startCoord(t, dir, func(c *Config) { c.OwnsSlot = func(s int) bool { return s != theirs } })
	if d := tc2.describe(t, "mine"); d.State != "Empty" {
		t.Fatalf("mine: %+v", d)
	}
	tc2.Close()
	kept := 0
	for _, n := range journalFiles(t, dir) {
		if slices.Contains(before, n) {
			kept++
		}
	}
	if kept == 0 {
		t.Fatal("the generation holding another owner's slot was deleted")
	}
	// The owner (here: a start that owns every slot) finds the entry.
	tc3, _ := startCoord(t, dir, nil)
	if d := tc3.describe(t, "theirs"); d.State != "Empty" {
		t.Fatalf("theirs after takeover: %+v", d)
	}
}

// sanity for the damage scan helper on large zero regions.
func TestFindFrameSkipsZeros(t *testing.T) {
	data := make([]byte, 1<<20)
	r := appendRecord(nil, &journalRec{batch: 1, last: true, slot: SlotFor("z"), seq: 1, tid: "z"})
	copy(data[700_001:], r)
	if p := findFrame(data, 0); p != 700_001 {
		t.Fatalf("findFrame = %d", p)
	}
	binary.BigEndian.PutUint32(data[700_001+4:], 0)
	if p := findFrame(data, 0); p != -1 {
		t.Fatalf("findFrame on a bad CRC = %d", p)
	}
}

// TestOtherBrokersJournalReplayed: a journal written under another broker id (broker.id changed
// after a crash, or a slot taken over from a crashed broker) is replayed for the owned slots,
// read-only: it is neither truncated nor deleted, and replaying it again changes nothing.
func TestOtherBrokersJournalReplayed(t *testing.T) {
	dir := t.TempDir()
	tc, _ := startCoord(t, dir, func(c *Config) { c.Workers = 2 })
	workload(t, tc, "ob-", 16, 3)
	tc.Coordinator.crash()
	want := entriesOf(tc.Coordinator)
	old := journalFiles(t, dir)
	// A torn tail in the old broker's newest generation stays as it is.
	path, sc := newestWithData(t, dir)
	writeAt(t, path, sc.end, []byte{0, 0, 0, 9, 'x'})
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		tc2, _ := startCoord(t, dir, func(c *Config) { c.BrokerID = 7 })
		tc2.Coordinator.crash()
		sameEntries(t, fmt.Sprintf("start %d as broker 7", i+1), want, entriesOf(tc2.Coordinator))
		for _, n := range old {
			if _, err := os.Stat(filepath.Join(dir, StateDir, n)); err != nil {
				t.Fatalf("another broker's journal %s was deleted: %v", n, err)
			}
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
			t.Fatal("another broker's journal was modified")
		}
	}
	for _, n := range journalFiles(t, dir) {
		if id, _ := parseJournalName(n); id.broker != 0 && id.broker != 7 {
			t.Fatalf("unexpected journal %s", n)
		}
	}
}
