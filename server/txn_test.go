package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/txn"
)

// txnVersions runs f once per finalized transaction.version (2 = default, 1 = TV1 fallback).
func txnVersions(t *testing.T, f func(t *testing.T, tv int16)) {
	for _, tv := range []int16{2, 1} {
		t.Run("TV"+strconv.Itoa(int(tv)), func(t *testing.T) { f(t, tv) })
	}
}

func withTV(tv int16) func(*configs.Config) {
	return func(c *configs.Config) { c.TransactionVersion = tv }
}

func txnProducer(t *testing.T, addr, tid string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return fxClient(t, addr, append([]kgo.Opt{kgo.TransactionalID(tid), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequestRetries(50), kgo.RetryTimeout(20 * time.Second)}, opts...)...)
}

func txnCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// txnRun produces vals to partition p in one transaction and commits or aborts it.
func txnRun(t *testing.T, cl *kgo.Client, topic string, p int32, commit bool, vals ...string) {
	t.Helper()
	ctx := txnCtx(t)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range vals {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", v, err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction (commit=%v): %v", commit, err)
	}
}

// sentinel appends a plain (non-transactional) "END" record to every partition: once a
// read_committed consumer sees it, everything before it is decided.
func sentinel(t *testing.T, addr, topic string, parts int32) {
	t.Helper()
	cl := fxClient(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := int32(0); p < parts; p++ {
		if err := cl.ProduceSync(txnCtx(t), &kgo.Record{Topic: topic, Partition: p, Value: []byte("END")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// consumeUntilEnd reads every partition from the start at the given isolation until the END
// sentinel of each, and returns the values before it per partition.
func consumeUntilEnd(t *testing.T, addr, topic string, parts int32, committed bool) map[int32][]string {
	t.Helper()
	offs := map[int32]kgo.Offset{}
	for p := int32(0); p < parts; p++ {
		offs[p] = kgo.NewOffset().AtStart()
	}
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	cl := fxClient(t, addr, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offs}), kgo.FetchIsolationLevel(iso),
		kgo.FetchMaxWait(200*time.Millisecond))
	out := map[int32][]string{}
	done := map[int32]bool{}
	ctx := txnCtx(t)
	for len(done) < int(parts) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consume %s (read_committed=%v): saw END on %d of %d partitions; so far %v", topic, committed, len(done), parts, out)
		}
		for _, e := range fs.Errors() {
			t.Fatalf("fetch error %s/%d: %v", e.Topic, e.Partition, e.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			switch {
			case done[r.Partition]:
				t.Errorf("record %q after END on partition %d", r.Value, r.Partition)
			case string(r.Value) == "END":
				done[r.Partition] = true
			default:
				out[r.Partition] = append(out[r.Partition], string(r.Value))
			}
		})
	}
	return out
}

func txnTopic(t *testing.T, addr, topic string, parts int32) {
	t.Helper()
	fxCreateTopic(t, fxClient(t, addr), topic, parts)
}

func equalParts(t *testing.T, what string, got, want map[int32][]string) {
	t.Helper()
	for p := range want {
		if !slices.Equal(got[p], want[p]) {
			t.Errorf("%s partition %d:\n got %v\nwant %v", what, p, got[p], want[p])
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok && len(got[p]) > 0 {
			t.Errorf("%s partition %d: unexpected %v", what, p, got[p])
		}
	}
}

func TestTxnCommitAbortVisibility(t *testing.T) {
	txnVersions(t, func(t *testing.T, tv int16) {
		addr, srv := newTestBroker(t, withTV(tv))
		txnTopic(t, addr, "vis", 1)
		cl := txnProducer(t, addr, "vis-producer")
		txnRun(t, cl, "vis", 0, true, "a1", "a2")
		txnRun(t, cl, "vis", 0, false, "b1", "b2", "b3")
		txnRun(t, cl, "vis", 0, true, "c1")
		sentinel(t, addr, "vis", 1)

		// read_committed: the aborted records are below the LSO and come back in the fetch; the
		// consumer drops them only because AbortedTransactions names them.
		equalParts(t, "read_committed", consumeUntilEnd(t, addr, "vis", 1, true), map[int32][]string{0: {"a1", "a2", "c1"}})
		equalParts(t, "read_uncommitted", consumeUntilEnd(t, addr, "vis", 1, false),
			map[int32][]string{0: {"a1", "a2", "b1", "b2", "b3", "c1"}})

		p := srv.deps.Store.Topic("vis").Partition(0)
		if lso, hwm := p.LastStableOffset(), p.HighWatermark(); lso != hwm {
			t.Errorf("LSO %d != HWM %d with no open transaction", lso, hwm)
		}
		// Raw read_committed fetch: the abort is listed by the overlap rule.
		rc := dialRaw(t, addr)
		req := fxFetchReq(11, 0, 0, 1<<20)
		req.IsolationLevel = 1
		fxAddPart(req, "vis", [16]byte{}, 0, 0, 1<<20)
		part := fxParts(fxRoundTrip[*kmsg.FetchResponse](t, rc, req))["vis/0"]
		if len(part.AbortedTransactions) != 1 || part.AbortedTransactions[0].FirstOffset != 3 {
			t.Errorf("AbortedTransactions %+v, want one starting at 3 (after a1 a2 COMMIT)", part.AbortedTransactions)
		}
		// A fetch starting inside the aborted transaction still learns about it (Apache overlap).
		req = fxFetchReq(11, 0, 0, 1<<20)
		req.IsolationLevel = 1
		fxAddPart(req, "vis", [16]byte{}, 0, 4, 1<<20)
		part = fxParts(fxRoundTrip[*kmsg.FetchResponse](t, rc, req))["vis/0"]
		if len(part.AbortedTransactions) != 1 {
			t.Errorf("fetch from inside the aborted txn: AbortedTransactions %+v, want 1", part.AbortedTransactions)
		}

		// TV2 bumps the epoch on every EndTxn; TV1 never does.
		var d txn.DescribeResult
		done := make(chan struct{})
		srv.deps.Txn.Describe("vis-producer", func(r txn.DescribeResult, _ error) { d = r; close(done) })
		<-done
		wantEpoch := int16(0)
		if tv == 2 {
			wantEpoch = 3
		}
		if d.ProducerEpoch != wantEpoch || d.State != "CompleteCommit" {
			t.Errorf("coordinator state %s epoch %d, want CompleteCommit epoch %d", d.State, d.ProducerEpoch, wantEpoch)
		}
	})
}

func TestTxnInterleavedProducers(t *testing.T) {
	txnVersions(t, func(t *testing.T, tv int16) {
		// Three coordinator workers (the default is one): the producers' ids spread over
		// several workers, each with its own journal.
		addr, _ := newTestBroker(t, withTV(tv), func(c *configs.Config) { c.TransactionWorkers = 3 })
		const parts = 3
		txnTopic(t, addr, "mix", parts)
		want := map[int32][]string{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := 0; i < 3; i++ {
			cl := txnProducer(t, addr, fmt.Sprintf("mix-%d", i))
			rng := rand.New(rand.NewSource(int64(i)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := txnCtx(t)
				for n := 0; n < 8; n++ {
					commit := rng.Intn(3) != 0
					if err := cl.BeginTransaction(); err != nil {
						t.Error(err)
						return
					}
					var vals []kgo.Record
					for k := 0; k < 1+rng.Intn(4); k++ {
						p := int32(rng.Intn(parts))
						vals = append(vals, kgo.Record{Topic: "mix", Partition: p, Value: []byte(fmt.Sprintf("p%d-t%d-r%d", i, n, k))})
					}
					for k := range vals {
						if err := cl.ProduceSync(ctx, &vals[k]).FirstErr(); err != nil {
							t.Errorf("produce: %v", err)
							return
						}
					}
					if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
						t.Errorf("end: %v", err)
						return
					}
					if commit {
						mu.Lock()
						for _, r := range vals {
							want[r.Partition] = append(want[r.Partition], string(r.Value))
						}
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		sentinel(t, addr, "mix", parts)
		got := consumeUntilEnd(t, addr, "mix", parts, true)
		// Producers interleave on a partition; compare as multisets per partition, and each
		// producer's own records in order.
		for p := int32(0); p < parts; p++ {
			g, w := slices.Clone(got[p]), slices.Clone(want[p])
			slices.Sort(g)
			slices.Sort(w)
			if !slices.Equal(g, w) {
				t.Errorf("partition %d read_committed:\n got %v\nwant %v", p, got[p], want[p])
			}
			for i := 0; i < 3; i++ {
				pre := fmt.Sprintf("p%d-", i)
				var gi, wi []string
				for _, v := range got[p] {
					if v[:3] == pre {
						gi = append(gi, v)
					}
				}
				for _, v := range want[p] {
					if v[:3] == pre {
						wi = append(wi, v)
					}
				}
				if !slices.Equal(gi, wi) {
					t.Errorf("partition %d producer %d order: got %v want %v", p, i, gi, wi)
				}
			}
		}
	})
}

func TestTxnZombieFenced(t *testing.T) {
	txnVersions(t, func(t *testing.T, tv int16) {
		addr, _ := newTestBroker(t, withTV(tv))
		txnTopic(t, addr, "zombie", 1)
		ctx := txnCtx(t)
		old := txnProducer(t, addr, "zombie-id")
		if err := old.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := old.ProduceSync(ctx, &kgo.Record{Topic: "zombie", Value: []byte("zombie-1")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		// A new session of the same transactional.id: its InitProducerId aborts the open
		// transaction and fences the old epoch everywhere.
		fresh := txnProducer(t, addr, "zombie-id")
		txnRun(t, fresh, "zombie", 0, true, "fresh-1")

		// The zombie's late write and its commit are rejected.
		perr := old.ProduceSync(ctx, &kgo.Record{Topic: "zombie", Value: []byte("zombie-2")}).FirstErr()
		cerr := old.EndTransaction(ctx, kgo.TryCommit)
		if perr == nil && cerr == nil {
			t.Fatal("zombie produce and commit both succeeded")
		}
		t.Logf("zombie produce: %v; zombie commit: %v", perr, cerr)
		txnRun(t, fresh, "zombie", 0, true, "fresh-2")
		sentinel(t, addr, "zombie", 1)
		equalParts(t, "read_committed", consumeUntilEnd(t, addr, "zombie", 1, true), map[int32][]string{0: {"fresh-1", "fresh-2"}})
	})
}

func TestTxnReaperAbortFences(t *testing.T) {
	txnVersions(t, func(t *testing.T, tv int16) {
		addr, srv := newTestBroker(t, withTV(tv), func(c *configs.Config) { c.TransactionReapInterval = 50 * time.Millisecond })
		txnTopic(t, addr, "reap", 1)
		ctx := txnCtx(t)
		cl := txnProducer(t, addr, "reap-id", kgo.TransactionTimeout(time.Second))
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "reap", Value: []byte("timed-out")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		p := srv.deps.Store.Topic("reap").Partition(0)
		if p.LastStableOffset() != 0 {
			t.Fatalf("LSO %d with an open transaction at 0", p.LastStableOffset())
		}
		// The reaper aborts it: the LSO moves past the abort marker.
		checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			if lso, hwm := p.LastStableOffset(), p.HighWatermark(); lso != hwm || hwm < 2 {
				return fmt.Errorf("LSO %d HWM %d", lso, hwm)
			}
			return nil
		})
		// The producer's epoch is fenced: its next write is rejected, never appended.
		hwm := p.HighWatermark()
		err := cl.ProduceSync(ctx, &kgo.Record{Topic: "reap", Value: []byte("late")}).FirstErr()
		if err == nil {
			err = cl.EndTransaction(ctx, kgo.TryCommit)
		}
		if err == nil {
			t.Fatal("a producer whose transaction the reaper aborted committed anyway")
		}
		t.Logf("fenced producer: %v", err)
		if p.HighWatermark() != hwm {
			t.Errorf("fenced write appended: HWM %d -> %d", hwm, p.HighWatermark())
		}
		sentinel(t, addr, "reap", 1)
		equalParts(t, "read_committed", consumeUntilEnd(t, addr, "reap", 1, true), map[int32][]string{})
	})
}

// ---- raw wire tests ----

// txnBatch is a transactional v2 batch with one record.
func txnBatch(pid int64, epoch int16, seq int32, val string) []byte {
	var body []byte
	body = append(body, 0)
	body = binary.AppendVarint(body, 0)
	body = binary.AppendVarint(body, 0)
	body = binary.AppendVarint(body, -1)
	body = binary.AppendVarint(body, int64(len(val)))
	body = append(body, val...)
	body = binary.AppendVarint(body, 0)
	recs := binary.AppendVarint(nil, int64(len(body)))
	recs = append(recs, body...)
	now := time.Now().UnixMilli()
	rb := kmsg.RecordBatch{PartitionLeaderEpoch: -1, Magic: 2, Attributes: 0x10, LastOffsetDelta: 0,
		FirstTimestamp: now, MaxTimestamp: now, ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq,
		NumRecords: 1, Records: recs}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func rawInit(t *testing.T, rc *rawConn, tid string) (int64, int16) {
	t.Helper()
	req := kmsg.NewPtrInitProducerIDRequest()
	req.Version = 4
	req.TransactionalID = kmsg.StringPtr(tid)
	req.TransactionTimeoutMillis = 60000
	resp := fxRoundTrip[*kmsg.InitProducerIDResponse](t, rc, req)
	if resp.ErrorCode != 0 {
		t.Fatalf("InitProducerId: %v", kerr.ErrorForCode(resp.ErrorCode))
	}
	return resp.ProducerID, resp.ProducerEpoch
}

func rawProduce(t *testing.T, rc *rawConn, version int16, tid, topic string, p int32, batch []byte) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Version = version
	req.Acks = -1
	req.TimeoutMillis = 5000
	req.TransactionID = kmsg.StringPtr(tid)
	req.Topics = []kmsg.ProduceRequestTopic{{Topic: topic, Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: p, Records: batch}}}}
	resp := fxRoundTrip[*kmsg.ProduceResponse](t, rc, req)
	return resp.Topics[0].Partitions[0]
}

func rawAddPartition(t *testing.T, rc *rawConn, tid string, pid int64, epoch int16, topic string, p int32) {
	t.Helper()
	req := kmsg.NewPtrAddPartitionsToTxnRequest()
	req.Version = 3
	req.TransactionalID, req.ProducerID, req.ProducerEpoch = tid, pid, epoch
	req.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: topic, Partitions: []int32{p}}}
	resp := fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, req)
	if c := resp.Topics[0].Partitions[0].ErrorCode; c != 0 {
		t.Fatalf("AddPartitionsToTxn: %v", kerr.ErrorForCode(c))
	}
}

func TestTxnEndTxnV5NextProducerEpoch(t *testing.T) {
	addr, srv := newTestBroker(t)
	txnTopic(t, addr, "v5", 1)
	rc := dialRaw(t, addr)
	pid, epoch := rawInit(t, rc, "v5-id")
	// Produce v12 adds the partition implicitly (TV2).
	if r := rawProduce(t, rc, 12, "v5-id", "v5", 0, txnBatch(pid, epoch, 0, "x")); r.ErrorCode != 0 {
		t.Fatalf("produce v12: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	p := srv.deps.Store.Topic("v5").Partition(0)
	if p.LastStableOffset() != 0 {
		t.Fatalf("LSO %d, want 0 while the transaction is open", p.LastStableOffset())
	}
	end := kmsg.NewPtrEndTxnRequest()
	end.Version = 5
	end.TransactionalID, end.ProducerID, end.ProducerEpoch, end.Commit = "v5-id", pid, epoch, true
	resp := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end)
	if resp.ErrorCode != 0 || resp.ProducerID != pid || resp.ProducerEpoch != epoch+1 {
		t.Fatalf("EndTxn v5: code %d next (%d, %d), want 0 (%d, %d)", resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch, pid, epoch+1)
	}
	// Answered only once complete: the marker is durable and the LSO has moved.
	if lso, hwm := p.LastStableOffset(), p.HighWatermark(); lso != 2 || hwm != 2 {
		t.Errorf("after EndTxn: LSO %d HWM %d, want 2 2", lso, hwm)
	}
	// A retry at the old epoch is recognised (TV2 retry) and answered with the same next epoch.
	resp = fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end)
	if resp.ErrorCode != 0 || resp.ProducerEpoch != epoch+1 {
		t.Errorf("EndTxn v5 retry: code %d epoch %d", resp.ErrorCode, resp.ProducerEpoch)
	}
	// The old epoch is fenced on the partition.
	if r := rawProduce(t, rc, 12, "v5-id", "v5", 0, txnBatch(pid, epoch, 1, "zombie")); r.ErrorCode != int16(kerr.InvalidProducerEpoch.Code) {
		t.Errorf("produce at the old epoch: %v, want INVALID_PRODUCER_EPOCH", kerr.ErrorForCode(r.ErrorCode))
	}
	// EndTxn v4 against the same id is TV1 (keyed on the request version): the completed commit
	// accepts only a retry of itself; an abort is INVALID_TXN_STATE (48, Apache's code).
	end.Version, end.ProducerEpoch, end.Commit = 4, epoch+1, false
	resp = fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end)
	if resp.ErrorCode != int16(kerr.InvalidTxnState.Code) {
		t.Errorf("EndTxn v4 abort of a committed txn: %v, want INVALID_TXN_STATE", kerr.ErrorForCode(resp.ErrorCode))
	}
	end.Commit = true
	if resp = fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end); resp.ErrorCode != 0 {
		t.Errorf("EndTxn v4 retry of the commit: %v, want NONE", kerr.ErrorForCode(resp.ErrorCode))
	}
}

func TestTxnVerificationRejectsUnaddedPartition(t *testing.T) {
	addr, srv := newTestBroker(t, withTV(1))
	txnTopic(t, addr, "kip890", 2)
	rc := dialRaw(t, addr)
	pid, epoch := rawInit(t, rc, "kip890-id")
	rawAddPartition(t, rc, "kip890-id", pid, epoch, "kip890", 0)
	// Partition 1 was never added: v11 (TV1) verification rejects the write, nothing is appended.
	r := rawProduce(t, rc, 11, "kip890-id", "kip890", 1, txnBatch(pid, epoch, 0, "x"))
	if r.ErrorCode != int16(kerr.InvalidTxnState.Code) && r.ErrorCode != int16(kerr.TransactionAbortable.Code) {
		t.Fatalf("produce to an unadded partition: %v, want INVALID_TXN_STATE", kerr.ErrorForCode(r.ErrorCode))
	}
	// Below v11 the client does not understand TRANSACTION_ABORTABLE: exactly 48.
	r = rawProduce(t, rc, 10, "kip890-id", "kip890", 1, txnBatch(pid, epoch, 0, "x"))
	if r.ErrorCode != int16(kerr.InvalidTxnState.Code) {
		t.Fatalf("produce v10 to an unadded partition: %v, want INVALID_TXN_STATE", kerr.ErrorForCode(r.ErrorCode))
	}
	if leo := srv.deps.Store.Topic("kip890").Partition(1).LogEndOffset(); leo != 0 {
		t.Errorf("rejected transactional write appended: log end %d", leo)
	}
	// The added partition verifies and appends.
	if r := rawProduce(t, rc, 11, "kip890-id", "kip890", 0, txnBatch(pid, epoch, 0, "ok")); r.ErrorCode != 0 {
		t.Fatalf("produce to the added partition: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	// Pipelined: two batches of the same producer on one connection, the first needing
	// verification; they must append in order (the second queues behind the first).
	rawAddPartition(t, rc, "kip890-id", pid, epoch, "kip890", 1)
	for i, seq := range []int32{0, 1} {
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks, req.TimeoutMillis = 11, -1, 5000
		req.TransactionID = kmsg.StringPtr("kip890-id")
		req.Topics = []kmsg.ProduceRequestTopic{{Topic: "kip890", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 1,
			Records: txnBatch(pid, epoch, seq, "pipelined")}}}}
		rc.send(req, int32(100+i))
	}
	for i := 0; i < 2; i++ {
		corr, body, err := rc.recv()
		if err != nil || corr != int32(100+i) {
			t.Fatalf("pipelined response %d: corr %d err %v", i, corr, err)
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.Version = 11
		if err := resp.ReadFrom(body[1:]); err != nil {
			t.Fatal(err)
		}
		if pr := resp.Topics[0].Partitions[0]; pr.ErrorCode != 0 || pr.BaseOffset != int64(i) {
			t.Errorf("pipelined produce %d: code %v offset %d, want 0 at %d", i, kerr.ErrorForCode(pr.ErrorCode), pr.BaseOffset, i)
		}
	}
}

func TestTxnWriteTxnMarkersAbortMovesLSO(t *testing.T) {
	addr, srv := newTestBroker(t)
	txnTopic(t, addr, "hang", 1)
	rc := dialRaw(t, addr)
	pid, epoch := rawInit(t, rc, "hang-id")
	if r := rawProduce(t, rc, 12, "hang-id", "hang", 0, txnBatch(pid, epoch, 0, "open")); r.ErrorCode != 0 {
		t.Fatalf("produce: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	p := srv.deps.Store.Topic("hang").Partition(0)

	// KIP-664 views of the open transaction.
	dp := kmsg.NewPtrDescribeProducersRequest()
	dp.Topics = []kmsg.DescribeProducersRequestTopic{{Topic: "hang", Partitions: []int32{0, 7}}, {Topic: "nope", Partitions: []int32{0}}}
	dpr := fxRoundTrip[*kmsg.DescribeProducersResponse](t, rc, dp)
	ps := dpr.Topics[0].Partitions
	if len(ps) != 2 || ps[0].ErrorCode != 0 || len(ps[0].ActiveProducers) != 1 || ps[0].ActiveProducers[0].ProducerID != pid ||
		ps[0].ActiveProducers[0].CurrentTxnStartOffset != 0 || ps[1].ErrorCode != int16(kerr.UnknownTopicOrPartition.Code) ||
		dpr.Topics[1].Partitions[0].ErrorCode != int16(kerr.UnknownTopicOrPartition.Code) {
		t.Errorf("DescribeProducers: %+v", dpr.Topics)
	}
	dt := kmsg.NewPtrDescribeTransactionsRequest()
	dt.TransactionalIDs = []string{"hang-id", "unknown-id"}
	dtr := fxRoundTrip[*kmsg.DescribeTransactionsResponse](t, rc, dt)
	st := dtr.TransactionStates
	if len(st) != 2 || st[0].ErrorCode != 0 || st[0].State != "Ongoing" || st[0].ProducerID != pid || st[0].StartTimestamp <= 0 ||
		len(st[0].Topics) != 1 || st[0].Topics[0].Topic != "hang" || st[1].ErrorCode != int16(kerr.TransactionalIDNotFound.Code) {
		t.Errorf("DescribeTransactions: %+v", st)
	}
	lt := kmsg.NewPtrListTransactionsRequest()
	lt.Version = 1
	lt.StateFilters = []string{"Ongoing", "Bogus"}
	lt.DurationFilterMillis = -1
	ltr := fxRoundTrip[*kmsg.ListTransactionsResponse](t, rc, lt)
	if ltr.ErrorCode != 0 || len(ltr.TransactionStates) != 1 || ltr.TransactionStates[0].TransactionalID != "hang-id" ||
		!slices.Equal(ltr.UnknownStateFilters, []string{"Bogus"}) {
		t.Errorf("ListTransactions: %+v", ltr)
	}
	lt.StateFilters, lt.DurationFilterMillis = nil, time.Hour.Milliseconds()
	if ltr = fxRoundTrip[*kmsg.ListTransactionsResponse](t, rc, lt); len(ltr.TransactionStates) != 0 {
		t.Errorf("ListTransactions open > 1h: %+v", ltr.TransactionStates)
	}
	if p.LastStableOffset() != 0 {
		t.Fatalf("LSO %d, want 0 (hanging transaction)", p.LastStableOffset())
	}
	// ListOffsets LATEST: the LSO at READ_COMMITTED, the HWM at READ_UNCOMMITTED.
	for iso, want := range map[int8]int64{0: 1, 1: 0} {
		lo := kmsg.NewPtrListOffsetsRequest()
		lo.Version, lo.IsolationLevel, lo.ReplicaID = 5, iso, -1
		lo.Topics = []kmsg.ListOffsetsRequestTopic{{Topic: "hang", Partitions: []kmsg.ListOffsetsRequestTopicPartition{{Partition: 0, Timestamp: -1, CurrentLeaderEpoch: -1}}}}
		lor := fxRoundTrip[*kmsg.ListOffsetsResponse](t, rc, lo)
		if got := lor.Topics[0].Partitions[0]; got.ErrorCode != 0 || got.Offset != want {
			t.Errorf("ListOffsets latest isolation %d: code %d offset %d, want %d", iso, got.ErrorCode, got.Offset, want)
		}
	}

	// The partition-side hanging watch: open longer than transaction.max.timeout.ms.
	mw := srv.deps.Markers
	mw.scanHanging(time.Now(), 15*time.Minute)
	if n := mHangingPartitionTxns.Load(); n != 0 {
		t.Errorf("hanging count %d for a fresh transaction", n)
	}
	mw.scanHanging(time.Now().Add(20*time.Minute), 15*time.Minute)
	if n := mHangingPartitionTxns.Load(); n != 1 {
		t.Errorf("hanging count %d, want 1", n)
	}

	// kafka-transactions.sh abort: WriteTxnMarkers(ABORT) to the leader.
	wm := kmsg.NewPtrWriteTxnMarkersRequest()
	wm.Version = 1
	wm.Markers = []kmsg.WriteTxnMarkersRequestMarker{{ProducerID: pid, ProducerEpoch: epoch, Committed: false,
		CoordinatorEpoch: ps[0].ActiveProducers[0].CoordinatorEpoch,
		Topics:           []kmsg.WriteTxnMarkersRequestMarkerTopic{{Topic: "hang", Partitions: []int32{0, 9}}}}}
	wmr := fxRoundTrip[*kmsg.WriteTxnMarkersResponse](t, rc, wm)
	wp := wmr.Markers[0].Topics[0].Partitions
	if wp[0].ErrorCode != 0 || wp[1].ErrorCode != int16(kerr.UnknownTopicOrPartition.Code) {
		t.Fatalf("WriteTxnMarkers: %+v", wp)
	}
	if lso, hwm := p.LastStableOffset(), p.HighWatermark(); lso != 2 || hwm != 2 {
		t.Errorf("after abort marker: LSO %d HWM %d, want 2 2", lso, hwm)
	}
	mw.scanHanging(time.Now().Add(20*time.Minute), 15*time.Minute)
	if n := mHangingPartitionTxns.Load(); n != 0 {
		t.Errorf("hanging count %d after the abort", n)
	}
	sentinel(t, addr, "hang", 1)
	equalParts(t, "read_committed", consumeUntilEnd(t, addr, "hang", 1, true), map[int32][]string{})
}

func TestTxnGatesAndErrors(t *testing.T) {
	addr, _ := newTestBroker(t)
	txnTopic(t, addr, "gate", 1)
	rc := dialRaw(t, addr)
	pid, epoch := rawInit(t, rc, "gate-id")
	// Unknown topic in AddPartitionsToTxn v3: UNKNOWN_TOPIC_OR_PARTITION there, OPERATION_NOT_ATTEMPTED
	// on the rest, coordinator untouched.
	ap := kmsg.NewPtrAddPartitionsToTxnRequest()
	ap.Version = 3
	ap.TransactionalID, ap.ProducerID, ap.ProducerEpoch = "gate-id", pid, epoch
	ap.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "gate", Partitions: []int32{0}}, {Topic: "missing", Partitions: []int32{0}}}
	apr := fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, ap)
	if apr.Topics[0].Partitions[0].ErrorCode != int16(kerr.OperationNotAttempted.Code) ||
		apr.Topics[1].Partitions[0].ErrorCode != int16(kerr.UnknownTopicOrPartition.Code) {
		t.Errorf("AddPartitionsToTxn with a missing topic: %+v", apr.Topics)
	}
	// Wrong epoch → PRODUCER_FENCED (v2+).
	ap.Topics, ap.ProducerEpoch = ap.Topics[:1], epoch+5
	apr = fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, ap)
	if apr.Topics[0].Partitions[0].ErrorCode != int16(kerr.ProducerFenced.Code) {
		t.Errorf("AddPartitionsToTxn stale epoch: %v", kerr.ErrorForCode(apr.Topics[0].Partitions[0].ErrorCode))
	}
	// v4 batched VerifyOnly: not in the transaction → TRANSACTION_ABORTABLE at v5.
	ap = kmsg.NewPtrAddPartitionsToTxnRequest()
	ap.Version = 5
	tx := kmsg.NewAddPartitionsToTxnRequestTransaction()
	tx.TransactionalID, tx.ProducerID, tx.ProducerEpoch, tx.VerifyOnly = "gate-id", pid, epoch, true
	tx.Topics = []kmsg.AddPartitionsToTxnRequestTransactionTopic{{Topic: "gate", Partitions: []int32{0}}}
	ap.Transactions = []kmsg.AddPartitionsToTxnRequestTransaction{tx}
	apr = fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, ap)
	if len(apr.Transactions) != 1 || apr.Transactions[0].Topics[0].Partitions[0].ErrorCode != int16(kerr.TransactionAbortable.Code) {
		t.Errorf("verify-only of an unadded partition: %+v", apr)
	}
	// AddOffsetsToTxn opens the transaction; EndTxn v3 abort completes it (no partitions).
	ao := kmsg.NewPtrAddOffsetsToTxnRequest()
	ao.Version = 3
	ao.TransactionalID, ao.ProducerID, ao.ProducerEpoch, ao.Group = "gate-id", pid, epoch, "g"
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, ao); r.ErrorCode != 0 {
		t.Errorf("AddOffsetsToTxn: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	end := kmsg.NewPtrEndTxnRequest()
	end.Version = 3
	end.TransactionalID, end.ProducerID, end.ProducerEpoch = "gate-id", pid, epoch
	if r := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end); r.ErrorCode != 0 {
		t.Errorf("EndTxn abort of an offsets-only txn: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	// Unknown producer id → INVALID_PRODUCER_ID_MAPPING.
	end.ProducerID = pid + 1000
	if r := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end); r.ErrorCode != int16(kerr.InvalidProducerIDMapping.Code) {
		t.Errorf("EndTxn unknown pid: %v", kerr.ErrorForCode(r.ErrorCode))
	}
}

func TestTxnPreparedCompletedAfterRestart(t *testing.T) {
	cfg := configs.Default()
	cfg.Listeners = "127.0.0.1:0"
	cfg.MetricsAddr = ""
	cfg.DataDir = t.TempDir()
	cfg.NumEventLoops = 2
	tb := startTestBroker(t, cfg)
	addr := tb.srv.Addr().String()
	txnTopic(t, addr, "crash", 2)
	rc := dialRaw(t, addr)
	pid, epoch := rawInit(t, rc, "crash-id")
	for p := int32(0); p < 2; p++ {
		if r := rawProduce(t, rc, 12, "crash-id", "crash", p, txnBatch(pid, epoch, 0, fmt.Sprintf("kept-%d", p))); r.ErrorCode != 0 {
			t.Fatalf("produce: %v", kerr.ErrorForCode(r.ErrorCode))
		}
	}
	// Swallow the marker dispatch: the broker goes away exactly between "PrepareCommit durable"
	// and "markers written". The EndTxn never answers.
	tb.Markers.swallow.Store(true)
	tb.srv.deps.Txn.EndTxn(txn.EndTxnParams{TransactionalID: "crash-id", ProducerID: pid, ProducerEpoch: epoch, Commit: true, Version: 5},
		func(r txn.EndTxnResult, err error) {
			t.Errorf("EndTxn answered %+v %v with its markers swallowed", r, err)
		})
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		d := make(chan txn.DescribeResult, 1)
		tb.srv.deps.Txn.Describe("crash-id", func(r txn.DescribeResult, _ error) { d <- r })
		if r := <-d; r.State != "PrepareCommit" {
			return fmt.Errorf("state %s", r.State)
		}
		return nil
	})
	if lso := tb.store.Topic("crash").Partition(0).LastStableOffset(); lso != 0 {
		t.Fatalf("LSO %d before restart, want 0", lso)
	}
	tb.stop(t)

	tb = startTestBroker(t, cfg)
	t.Cleanup(func() { tb.stop(t) })
	addr = tb.srv.Addr().String()
	for p := int32(0); p < 2; p++ {
		part := tb.store.Topic("crash").Partition(p)
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if lso, hwm := part.LastStableOffset(), part.HighWatermark(); lso != hwm || hwm != 2 {
				return fmt.Errorf("partition %d LSO %d HWM %d", p, lso, hwm)
			}
			return nil
		})
	}
	sentinel(t, addr, "crash", 2)
	equalParts(t, "read_committed", consumeUntilEnd(t, addr, "crash", 2, true), map[int32][]string{0: {"kept-0"}, 1: {"kept-1"}})
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		d := make(chan txn.DescribeResult, 1)
		tb.srv.deps.Txn.Describe("crash-id", func(r txn.DescribeResult, _ error) { d <- r })
		if r := <-d; r.State != "CompleteCommit" {
			return fmt.Errorf("state %s", r.State)
		}
		return nil
	})
}

// txnDeny denies exactly the listed (operation, resource type, name) triples.
type txnDeny map[string]bool

func (d txnDeny) Authorize(_, _ string, op Operation, rt ResourceType, name string) bool {
	return !d[fmt.Sprintf("%d/%d/%s", op, rt, name)]
}

func denyKey(op Operation, rt ResourceType, name string) string {
	return fmt.Sprintf("%d/%d/%s", op, rt, name)
}

func TestTxnACLGates(t *testing.T) {
	cfg := testConfig(t)
	cfg.NumEventLoops = 1
	tb := startTestBroker(t, cfg, BrokerOptions{Authz: txnDeny{
		denyKey(OpWrite, ResTransactionalID, "denied-id"):     true,
		denyKey(OpRead, ResGroup, "denied-group"):             true,
		denyKey(OpClusterAction, ResCluster, clusterResource): true,
		// Apache 4.1 also lets ALTER on the cluster write markers.
		denyKey(OpAlter, ResCluster, clusterResource): true,
	}})
	t.Cleanup(func() { tb.stop(t) })
	if _, err := tb.store.CreateTopic("acl", 1, nil); err != nil {
		t.Fatal(err)
	}
	srv := tb.srv
	rc := dialRaw(t, srv.Addr().String())

	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.Version = 4
	ip.TransactionalID = kmsg.StringPtr("denied-id")
	ip.TransactionTimeoutMillis = 10000
	if r := fxRoundTrip[*kmsg.InitProducerIDResponse](t, rc, ip); r.ErrorCode != int16(kerr.TransactionalIDAuthorizationFailed.Code) {
		t.Errorf("InitProducerId denied id: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	ip.TransactionalID = nil // idempotent path: not gated (KIP-679)
	if r := fxRoundTrip[*kmsg.InitProducerIDResponse](t, rc, ip); r.ErrorCode != 0 || r.ProducerID < 0 {
		t.Errorf("idempotent InitProducerId: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	pid, epoch := rawInit(t, rc, "ok-id")
	ao := kmsg.NewPtrAddOffsetsToTxnRequest()
	ao.Version = 3
	ao.TransactionalID, ao.ProducerID, ao.ProducerEpoch, ao.Group = "ok-id", pid, epoch, "denied-group"
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, ao); r.ErrorCode != int16(kerr.GroupAuthorizationFailed.Code) {
		t.Errorf("AddOffsetsToTxn denied group: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	ao.TransactionalID = "denied-id" // WRITE on the id is checked first
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, ao); r.ErrorCode != int16(kerr.TransactionalIDAuthorizationFailed.Code) {
		t.Errorf("AddOffsetsToTxn denied id: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	end := kmsg.NewPtrEndTxnRequest()
	end.Version = 3
	end.TransactionalID, end.ProducerID, end.ProducerEpoch = "denied-id", pid, epoch
	if r := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end); r.ErrorCode != int16(kerr.TransactionalIDAuthorizationFailed.Code) {
		t.Errorf("EndTxn denied id: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	ap := kmsg.NewPtrAddPartitionsToTxnRequest()
	ap.Version = 4
	ap.Transactions = []kmsg.AddPartitionsToTxnRequestTransaction{{TransactionalID: "ok-id", ProducerID: pid, ProducerEpoch: epoch, VerifyOnly: true}}
	if r := fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, ap); r.ErrorCode != int16(kerr.ClusterAuthorizationFailed.Code) {
		t.Errorf("AddPartitionsToTxn v4 without CLUSTER_ACTION: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	wm := kmsg.NewPtrWriteTxnMarkersRequest()
	wm.Markers = []kmsg.WriteTxnMarkersRequestMarker{{ProducerID: pid, ProducerEpoch: epoch,
		Topics: []kmsg.WriteTxnMarkersRequestMarkerTopic{{Topic: "acl", Partitions: []int32{0}}}}}
	if r := fxRoundTrip[*kmsg.WriteTxnMarkersResponse](t, rc, wm); r.Markers[0].Topics[0].Partitions[0].ErrorCode != int16(kerr.ClusterAuthorizationFailed.Code) {
		t.Errorf("WriteTxnMarkers without CLUSTER_ACTION: %+v", r.Markers)
	}
	if r := rawProduce(t, rc, 11, "denied-id", "acl", 0, txnBatch(pid, epoch, 0, "x")); r.ErrorCode != int16(kerr.TransactionalIDAuthorizationFailed.Code) {
		t.Errorf("transactional produce with a denied id: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	// A transactional batch with a null transactional id is refused the same way (Apache).
	pr := kmsg.NewPtrProduceRequest()
	pr.Version, pr.Acks, pr.TimeoutMillis = 11, -1, 5000
	pr.Topics = []kmsg.ProduceRequestTopic{{Topic: "acl", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: txnBatch(pid, epoch, 0, "x")}}}}
	if r := fxRoundTrip[*kmsg.ProduceResponse](t, rc, pr); r.Topics[0].Partitions[0].ErrorCode != int16(kerr.TransactionalIDAuthorizationFailed.Code) {
		t.Errorf("transactional produce with a null id: %v", kerr.ErrorForCode(r.Topics[0].Partitions[0].ErrorCode))
	}
	if leo := tb.store.Topic("acl").Partition(0).LogEndOffset(); leo != 0 {
		t.Errorf("refused writes appended: log end %d", leo)
	}
}

// EndTxn commits (or discards) the offsets TxnOffsetCommit staged, before it answers: TV1 through
// AddOffsetsToTxn + TxnOffsetCommit v3, TV2 through TxnOffsetCommit v5's implicit add + EndTxn v5.
func TestTxnEndTxnCompletesGroupOffsets(t *testing.T) {
	addr, _ := newTestBroker(t)
	txnTopic(t, addr, "eos", 1)
	rc := dialRaw(t, addr)
	committed := func(grp string) int64 {
		t.Helper()
		of := kmsg.NewPtrOffsetFetchRequest()
		of.Version = 7
		of.Group = grp
		of.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "eos", Partitions: []int32{0}}}
		r := fxRoundTrip[*kmsg.OffsetFetchResponse](t, rc, of)
		if r.ErrorCode != 0 || r.Topics[0].Partitions[0].ErrorCode != 0 {
			t.Fatalf("OffsetFetch: %+v", r)
		}
		return r.Topics[0].Partitions[0].Offset
	}
	stage := func(version int16, tid, grp string, pid int64, epoch int16, offset int64) {
		t.Helper()
		tc := kmsg.NewPtrTxnOffsetCommitRequest()
		tc.Version = version
		tc.TransactionalID, tc.Group, tc.ProducerID, tc.ProducerEpoch, tc.Generation = tid, grp, pid, epoch, -1
		p := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset = 0, offset
		tc.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "eos", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{p}}}
		r := fxRoundTrip[*kmsg.TxnOffsetCommitResponse](t, rc, tc)
		if c := r.Topics[0].Partitions[0].ErrorCode; c != 0 {
			t.Fatalf("TxnOffsetCommit v%d: %v", version, kerr.ErrorForCode(c))
		}
	}
	end := func(version int16, tid string, pid int64, epoch int16, commit bool) *kmsg.EndTxnResponse {
		t.Helper()
		e := kmsg.NewPtrEndTxnRequest()
		e.Version = version
		e.TransactionalID, e.ProducerID, e.ProducerEpoch, e.Commit = tid, pid, epoch, commit
		r := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, e)
		if r.ErrorCode != 0 {
			t.Fatalf("EndTxn v%d: %v", version, kerr.ErrorForCode(r.ErrorCode))
		}
		return r
	}

	// TV1.
	pid, epoch := rawInit(t, rc, "eos-v1")
	ao := kmsg.NewPtrAddOffsetsToTxnRequest()
	ao.Version = 3
	ao.TransactionalID, ao.ProducerID, ao.ProducerEpoch, ao.Group = "eos-v1", pid, epoch, "g1"
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, ao); r.ErrorCode != 0 {
		t.Fatalf("AddOffsetsToTxn: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	stage(3, "eos-v1", "g1", pid, epoch, 42)
	if o := committed("g1"); o != -1 {
		t.Fatalf("staged offset visible before commit: %d", o)
	}
	end(3, "eos-v1", pid, epoch, true)
	if o := committed("g1"); o != 42 {
		t.Fatalf("offset after EndTxn commit: %d, want 42", o)
	}
	if r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, ao); r.ErrorCode != 0 {
		t.Fatal(kerr.ErrorForCode(r.ErrorCode))
	}
	stage(3, "eos-v1", "g1", pid, epoch, 99)
	end(3, "eos-v1", pid, epoch, false)
	if o := committed("g1"); o != 42 {
		t.Fatalf("offset after EndTxn abort: %d, want 42 (staged 99 discarded)", o)
	}

	// TV2.
	pid, epoch = rawInit(t, rc, "eos-v2")
	stage(5, "eos-v2", "g2", pid, epoch, 7)
	r := end(5, "eos-v2", pid, epoch, true)
	if o := committed("g2"); o != 7 {
		t.Fatalf("TV2 offset after EndTxn commit: %d, want 7", o)
	}
	stage(5, "eos-v2", "g2", r.ProducerID, r.ProducerEpoch, 8)
	end(5, "eos-v2", r.ProducerID, r.ProducerEpoch, false)
	if o := committed("g2"); o != 7 {
		t.Fatalf("TV2 offset after abort: %d, want 7", o)
	}
}
