package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

// TestProduceConsume100k produces 100,000 keyed records over 6 partitions with an idempotent
// franz-go producer and reads them back, checking per-partition order and every byte.
func TestProduceConsume100k(t *testing.T) {
	addr, _ := newTestBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adm, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 6, 1, nil, "hundredk"); err != nil {
		t.Fatal(err)
	}
	p, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("hundredk"), kgo.ProducerLinger(2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 100_000
	var (
		mu       sync.Mutex
		produced = map[int32][]string{} // partition -> values in offset order
		offsets  = map[int32][]int64{}
		firstErr error
		wg       sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		v := fmt.Sprintf("value-%06d-%s", i, "payload")
		p.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i%97)), Value: []byte(v)}, func(r *kgo.Record, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			produced[r.Partition] = append(produced[r.Partition], string(r.Value))
			offsets[r.Partition] = append(offsets[r.Partition], r.Offset)
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	// Acks arrive in offset order per partition, and offsets are dense from 0.
	for part, offs := range offsets {
		for i, o := range offs {
			if o != int64(i) {
				t.Fatalf("partition %d: ack %d has offset %d", part, i, o)
			}
		}
	}

	c, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("hundredk"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := map[int32][]string{}
	total := 0
	for total < n {
		fs := c.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if int64(len(got[r.Partition])) != r.Offset {
				t.Fatalf("partition %d: record at offset %d after %d records", r.Partition, r.Offset, len(got[r.Partition]))
			}
			got[r.Partition] = append(got[r.Partition], string(r.Value))
			total++
		})
	}
	for part, vals := range produced {
		if len(got[part]) != len(vals) {
			t.Fatalf("partition %d: %d consumed, %d produced", part, len(got[part]), len(vals))
		}
		for i := range vals {
			if got[part][i] != vals[i] {
				t.Fatalf("partition %d offset %d: got %q want %q", part, i, got[part][i], vals[i])
			}
		}
	}
	if len(produced) != 6 {
		t.Fatalf("records landed on %d partitions, want 6", len(produced))
	}
}

// idemBatch is a v2 batch from producer pid/epoch starting at sequence seq with n records.
func idemBatch(pid int64, epoch int16, seq int32, n int) []byte {
	var recs []byte
	for i := 0; i < n; i++ {
		var body []byte
		body = append(body, 0)
		body = binary.AppendVarint(body, 0)
		body = binary.AppendVarint(body, int64(i))
		body = binary.AppendVarint(body, -1)
		v := fmt.Sprintf("s%d", int(seq)+i)
		body = binary.AppendVarint(body, int64(len(v)))
		body = append(body, v...)
		body = binary.AppendVarint(body, 0)
		recs = binary.AppendVarint(recs, int64(len(body)))
		recs = append(recs, body...)
	}
	now := time.Now().UnixMilli()
	rb := kmsg.RecordBatch{PartitionLeaderEpoch: -1, Magic: 2, LastOffsetDelta: int32(n - 1),
		FirstTimestamp: now, MaxTimestamp: now, ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq,
		NumRecords: int32(n), Records: recs}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// TestIdempotentProduceRaw drives the idempotence window with hand-built batches: a retried
// batch gets its original offset and writes nothing, a gap is OUT_OF_ORDER_SEQUENCE_NUMBER, an
// older epoch is INVALID_PRODUCER_EPOCH, and a new epoch must restart at sequence 0.
func TestIdempotentProduceRaw(t *testing.T) {
	addr, s := newTestBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "idem"); err != nil {
		t.Fatal(err)
	}
	ipReq := kmsg.NewPtrInitProducerIDRequest()
	ipResp, err := ipReq.RequestWith(ctx, cl)
	if err != nil || ipResp.ErrorCode != 0 {
		t.Fatalf("init producer id: %v %+v", err, ipResp)
	}
	pid := ipResp.ProducerID
	if pid < 1<<40 {
		t.Fatalf("pid %d is not in broker 0's block range", pid)
	}
	produce := func(b []byte) kmsg.ProduceResponseTopicPartition {
		t.Helper()
		req := kmsg.NewPtrProduceRequest()
		req.Acks = -1
		req.TimeoutMillis = 10000
		req.Topics = []kmsg.ProduceRequestTopic{{Topic: "idem", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: b}}}}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Topics[0].Partitions[0]
	}
	f := func(name string, b []byte, wantCode int16, wantOffset int64) {
		t.Helper()
		r := produce(b)
		if r.ErrorCode != wantCode || (wantCode == 0 && r.BaseOffset != wantOffset) {
			t.Fatalf("%s: code %d offset %d, want code %d offset %d", name, r.ErrorCode, r.BaseOffset, wantCode, wantOffset)
		}
	}
	f("first", idemBatch(pid, 0, 0, 3), 0, 0)
	f("second", idemBatch(pid, 0, 3, 2), 0, 3)
	f("retry of first", idemBatch(pid, 0, 0, 3), 0, 0)
	f("retry of second", idemBatch(pid, 0, 3, 2), 0, 3)
	f("gap", idemBatch(pid, 0, 9, 1), codec.CodeOutOfOrderSequenceNumber, 0)
	f("next", idemBatch(pid, 0, 5, 1), 0, 5)
	f("new epoch not at 0", idemBatch(pid, 1, 6, 1), codec.CodeOutOfOrderSequenceNumber, 0)
	f("new epoch", idemBatch(pid, 1, 0, 1), 0, 6)
	f("stale epoch", idemBatch(pid, 0, 6, 1), codec.CodeInvalidProducerEpoch, 0)
	if end := s.deps.Store.Topic("idem").Partition(0).LogEndOffset(); end != 7 {
		t.Fatalf("log end %d, want 7: duplicates must write nothing", end)
	}
}

// TestAcksZeroSendsNoResponse: an acks=0 produce is appended but never answered, and the next
// request's answer is not held back behind it.
func TestAcksZeroSendsNoResponse(t *testing.T) {
	addr, s := newTestBroker(t)
	rc := dialRaw(t, addr)
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 4
	md.AllowAutoTopicCreation = true
	t0 := "acks0"
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: &t0}}
	rc.send(md, 1)
	if corr, _, err := rc.recv(); err != nil || corr != 1 {
		t.Fatal(corr, err)
	}
	pr := kmsg.NewPtrProduceRequest()
	pr.Version = 7
	pr.Acks = 0
	pr.Topics = []kmsg.ProduceRequestTopic{{Topic: "acks0", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: testBatch(4)}}}}
	rc.send(pr, 2)
	av := kmsg.NewPtrApiVersionsRequest()
	rc.send(av, 3)
	corr, _, err := rc.recv()
	if err != nil || corr != 3 {
		t.Fatalf("expected the ApiVersions answer (3) next, got %d %v", corr, err)
	}
	p := s.deps.Store.Topic("acks0").Partition(0)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if hw := p.HighWatermark(); hw != 4 {
			return fmt.Errorf("hwm %d", hw)
		}
		return nil
	})
}

// TestHandlerPanicClosesOnlyThatConnection: a bug in one handler — in its synchronous part or in
// a deferred continuation (a coordinator or flusher callback, caught by rc.guard) — is counted,
// closes the connection that hit it, and the broker keeps serving everyone else.
func TestHandlerPanicClosesOnlyThatConnection(t *testing.T) {
	f := func(name string, injected handler) {
		t.Run(name, func(t *testing.T) {
			testHandlerHook = func(key int16, h handler) handler {
				if key != int16(kmsg.DescribeCluster) {
					return h
				}
				return injected
			}
			t.Cleanup(func() { testHandlerHook = nil })
			addr, _ := newTestBroker(t)
			before := mPanics.Get()
			rc := dialRaw(t, addr)
			rc.send(kmsg.NewPtrDescribeClusterRequest(), 1)
			rc.expectClosed()
			if mPanics.Get() != before+1 {
				t.Fatalf("panic not counted")
			}
			other := dialRaw(t, addr)
			other.send(kmsg.NewPtrApiVersionsRequest(), 2)
			if corr, _, err := other.recv(); err != nil || corr != 2 {
				t.Fatalf("broker stopped serving after a handler panic: %d %v", corr, err)
			}
		})
	}
	f("sync", func(rc *reqCtx) (kmsg.Response, error) { panic("injected") })
	f("deferred", func(rc *reqCtx) (kmsg.Response, error) {
		rc.deferReply()
		go func() {
			defer rc.guard()
			panic("injected in a callback")
		}()
		return nil, nil
	})
}
