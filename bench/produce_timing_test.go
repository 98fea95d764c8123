// Package bench holds kaas's benchmarks: Go micro-benchmarks of the hot paths here, and scripts
// that drive the broker with Apache Kafka's own perf tools (see README.md in this directory).
package bench

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	_ "github.com/kaas-go/kaas/server" // registers the served API versions the decoder checks
	"github.com/kaas-go/kaas/storage"
)

// batchOf builds an idempotent producer's v2 batch of n records of size bytes each.
func batchOf(n, size int, pid int64, seq int32) []byte {
	val := make([]byte, size)
	var recs []byte
	for i := 0; i < n; i++ {
		var body []byte
		body = append(body, 0)
		body = binary.AppendVarint(body, 0)
		body = binary.AppendVarint(body, int64(i))
		body = binary.AppendVarint(body, -1)
		body = binary.AppendVarint(body, int64(size))
		body = append(body, val...)
		body = binary.AppendVarint(body, 0)
		recs = binary.AppendVarint(recs, int64(len(body)))
		recs = append(recs, body...)
	}
	now := time.Now().UnixMilli()
	rb := kmsg.RecordBatch{PartitionLeaderEpoch: -1, Magic: 2, LastOffsetDelta: int32(n - 1),
		FirstTimestamp: now, MaxTimestamp: now, ProducerID: pid, ProducerEpoch: 0, FirstSequence: seq,
		NumRecords: int32(n), Records: recs}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// produceFrame is a whole Produce v9 request frame (no size prefix) carrying one batch.
func produceFrame(batch []byte) []byte {
	req := kmsg.NewPtrProduceRequest()
	req.Version = 9
	req.Acks = -1
	req.TimeoutMillis = 30000
	req.Topics = []kmsg.ProduceRequestTopic{{Topic: "bench", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: batch}}}}
	var b []byte
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint16(b, 9)
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint16(b, 0xffff)
	b = append(b, 0)
	return req.AppendTo(b)
}

// BenchmarkDecodeValidate measures frame decode + batch validation of a 16 KiB batch
// (16 × 1 KiB records, what kafka-producer-perf-test sends with default batch.size).
func BenchmarkDecodeValidate(b *testing.B) {
	frame := produceFrame(batchOf(16, 1000, -1, -1))
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for i := 0; i < b.N; i++ {
		req, err := codec.ParseRequest(frame)
		if err != nil {
			b.Fatal(err)
		}
		recs := req.Msg.(*kmsg.ProduceRequest).Topics[0].Partitions[0].Records
		if _, code := codec.ValidateProduce(recs, codec.ValidateOptions{MaxMessageBytes: 1 << 20, TimestampBeforeMaxMs: -1, TimestampAfterMaxMs: -1}); code != 0 {
			b.Fatal(code)
		}
	}
}

func openBench(b *testing.B) (*storage.Store, *storage.Partition) {
	b.Helper()
	st, err := storage.Open(storage.Config{Dir: b.TempDir(), Defaults: storage.DefaultTopicConfig(), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	t, err := st.CreateTopic("bench", 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	return st, t.Partition(0)
}

// BenchmarkProducePath is decode → validate → append → fsync-wait for P concurrent producers,
// each waiting for its own acknowledgement (acks=all), as a broker does per connection.
func BenchmarkProducePath(b *testing.B) {
	for _, producers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("producers=%d", producers), func(b *testing.B) {
			_, p := openBench(b)
			frames := make([][]byte, producers)
			for i := range frames {
				frames[i] = produceFrame(batchOf(16, 1000, int64(1000+i), 0))
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(frames[0])))
			var wg sync.WaitGroup
			per := b.N / producers
			if per == 0 {
				per = 1
			}
			b.ResetTimer()
			for w := 0; w < producers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					frame := append([]byte(nil), frames[w]...)
					done := make(chan error, 1)
					for i := 0; i < per; i++ {
						req, err := codec.ParseRequest(frame)
						if err != nil {
							b.Error(err)
							return
						}
						recs := req.Msg.(*kmsg.ProduceRequest).Topics[0].Partitions[0].Records
						batch, code := codec.ValidateProduce(recs, codec.ValidateOptions{MaxMessageBytes: 1 << 20, TimestampBeforeMaxMs: -1, TimestampAfterMaxMs: -1})
						if code != 0 {
							b.Error(code)
							return
						}
						// Each iteration is the producer's next batch: advance the sequence.
						binary.BigEndian.PutUint32(batch[53:], uint32(i*16))
						binary.BigEndian.PutUint32(batch[17:], batch.ComputeCRC())
						res := p.Append(batch, time.Now().UnixMilli())
						if res.Code != 0 {
							b.Errorf("append: %d", res.Code)
							return
						}
						p.Sync(res.LastOffset+1, func(err error) { done <- err })
						if err := <-done; err != nil {
							b.Error(err)
							return
						}
					}
				}(w)
			}
			wg.Wait()
		})
	}
}
