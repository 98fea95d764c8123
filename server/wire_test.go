package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
)

// rawConn is a hand-driven Kafka connection for header and framing edge cases.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(req kmsg.Request, corr int32) {
	r.t.Helper()
	var b []byte
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, 4)
	b = append(b, "test"...)
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	r.write(b)
}

func (r *rawConn) write(b []byte) {
	r.t.Helper()
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

// recv reads one response frame and returns correlation id and body (header v0 assumed: callers
// strip the tag byte for flexible non-ApiVersions responses).
func (r *rawConn) recv() (int32, []byte, error) {
	var sz [4]byte
	if _, err := io.ReadFull(r.br, sz[:]); err != nil {
		return 0, nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(sz[:]))
	if _, err := io.ReadFull(r.br, b); err != nil {
		return 0, nil, err
	}
	return int32(binary.BigEndian.Uint32(b)), b[4:], nil
}

// expectClosed asserts the broker closed the connection.
func (r *rawConn) expectClosed() {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := r.recv(); err == nil {
		r.t.Fatal("expected the broker to close the connection")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		r.t.Fatal("connection still open")
	}
}

func TestApiVersionsWire(t *testing.T) {
	addr, _ := newTestBroker(t)
	rc := dialRaw(t, addr)

	// v3 with features and software name.
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName, req.ClientSoftwareVersion = "kaas-test", "1.0"
	rc.send(req, 1)
	corr, body, err := rc.recv()
	if err != nil || corr != 1 {
		t.Fatal(corr, err)
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 3
	if err := resp.ReadFrom(body); err != nil {
		t.Fatalf("ApiVersions v3 must use response header v0: %v", err)
	}
	if resp.ErrorCode != 0 || len(resp.ApiKeys) == 0 {
		t.Fatalf("resp %+v", resp)
	}
	seen := map[int16]bool{}
	for _, k := range resp.ApiKeys {
		seen[k.ApiKey] = true
		if !codec.Supported(k.ApiKey, k.MaxVersion) {
			t.Fatalf("advertised unserved key %d", k.ApiKey)
		}
	}
	for _, k := range []kmsg.Key{kmsg.Produce, kmsg.Fetch, kmsg.Metadata, kmsg.ApiVersions, kmsg.InitProducerID} {
		if !seen[int16(k)] {
			t.Fatalf("key %s not advertised", k.Name())
		}
	}

	// Above our max: KIP-511 v0 answer with error 35 and our keys; the connection stays usable.
	req = kmsg.NewPtrApiVersionsRequest()
	req.Version = 4
	var b []byte
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint16(b, 18)
	b = binary.BigEndian.AppendUint16(b, 77) // unknown future version
	b = binary.BigEndian.AppendUint32(b, 2)
	b = append(b, 0xff, 0xff, 0, 1, 2, 3)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	rc.write(b)
	corr, body, err = rc.recv()
	if err != nil || corr != 2 {
		t.Fatal(corr, err)
	}
	v0 := kmsg.NewPtrApiVersionsResponse()
	if err := v0.ReadFrom(body); err != nil || v0.ErrorCode != codec.CodeUnsupportedVersion || len(v0.ApiKeys) == 0 {
		t.Fatalf("fallback: %v %+v", err, v0)
	}

	// Invalid software name: INVALID_REQUEST.
	req = kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName, req.ClientSoftwareVersion = "bad name!", "1"
	rc.send(req, 3)
	_, body, err = rc.recv()
	if err != nil {
		t.Fatal(err)
	}
	resp = kmsg.NewPtrApiVersionsResponse()
	resp.Version = 3
	if err := resp.ReadFrom(body); err != nil || resp.ErrorCode != codec.CodeInvalidRequest {
		t.Fatalf("%v %+v", err, resp.ErrorCode)
	}
}

// TestPipelinedResponsesInOrder sends many requests without waiting and checks the answers come
// back in request order.
func TestPipelinedResponsesInOrder(t *testing.T) {
	addr, _ := newTestBroker(t)
	rc := dialRaw(t, addr)
	const n = 200
	for i := int32(0); i < n; i++ {
		if i%2 == 0 {
			req := kmsg.NewPtrApiVersionsRequest()
			req.Version = 0
			rc.send(req, i)
		} else {
			req := kmsg.NewPtrMetadataRequest()
			req.Version = 4
			rc.send(req, i)
		}
	}
	for i := int32(0); i < n; i++ {
		corr, _, err := rc.recv()
		if err != nil {
			t.Fatal(err)
		}
		if corr != i {
			t.Fatalf("response %d carries correlation id %d", i, corr)
		}
	}
}

func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	addr, s := newTestBroker(t, func(c *configs.Config) { c.SocketRequestMaxByte = 1 << 20 })
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("bad-input"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("before")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	endBefore := s.deps.Store.Topic("bad-input").Partition(0).LogEndOffset()

	f := func(name string, payload []byte) {
		t.Helper()
		rc := dialRaw(t, addr)
		rc.write(payload)
		rc.expectClosed()
		// Another client is unaffected.
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(name)}).FirstErr(); err != nil {
			t.Fatalf("%s: healthy client failed afterwards: %v", name, err)
		}
	}
	f("negative size", []byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3})
	f("oversized", binary.BigEndian.AppendUint32(nil, 2<<20))
	f("tiny", []byte{0, 0, 0, 3, 1, 2, 3})
	unknown := binary.BigEndian.AppendUint32(nil, 10)
	unknown = append(unknown, 0x7f, 0x00, 0, 0, 0, 0, 0, 1, 0xff, 0xff)
	f("unknown key", unknown)
	garbage := binary.BigEndian.AppendUint32(nil, 20)
	garbage = append(garbage, 0, 3, 0, 9, 0, 0, 0, 1, 0, 200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	f("garbage metadata body", garbage)
	unsupported := binary.BigEndian.AppendUint32(nil, 10)
	unsupported = append(unsupported, 0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0xff) // Produce v1: below our min
	f("unsupported produce version", unsupported)

	// A truncated frame followed by close: nothing written, broker fine.
	rc := dialRaw(t, addr)
	rc.write([]byte{0, 0, 1, 0, 0, 0})
	rc.c.Close()

	// Corrupt CRC produce: answered with CORRUPT_MESSAGE, nothing appended.
	rc = dialRaw(t, addr)
	batch := testBatch(2)
	batch[len(batch)-1] ^= 0xff
	pr := kmsg.NewPtrProduceRequest()
	pr.Version = 7
	pr.Acks = -1
	pr.TimeoutMillis = 5000
	pr.Topics = []kmsg.ProduceRequestTopic{{Topic: "bad-input", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: batch}}}}
	rc.send(pr, 9)
	_, body, err := rc.recv()
	if err != nil {
		t.Fatal(err)
	}
	presp := kmsg.NewPtrProduceResponse()
	presp.Version = 7
	if err := presp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	if got := presp.Topics[0].Partitions[0].ErrorCode; got != codec.CodeCorruptMessage {
		t.Fatalf("corrupt crc answered %d", got)
	}
	endAfter := s.deps.Store.Topic("bad-input").Partition(0).LogEndOffset()
	if want := endBefore + 6; endAfter != want { // the six good records produced by f() above
		t.Fatalf("log end %d, want %d: bad input must write nothing", endAfter, want)
	}
}

// testBatch is an uncompressed v2 batch with n records and no producer id.
func testBatch(n int) []byte {
	var recs []byte
	for i := 0; i < n; i++ {
		var body []byte
		body = append(body, 0)
		body = binary.AppendVarint(body, 0)
		body = binary.AppendVarint(body, int64(i))
		body = binary.AppendVarint(body, -1)
		body = binary.AppendVarint(body, 1)
		body = append(body, 'v')
		body = binary.AppendVarint(body, 0)
		recs = binary.AppendVarint(recs, int64(len(body)))
		recs = append(recs, body...)
	}
	now := time.Now().UnixMilli()
	rb := kmsg.RecordBatch{PartitionLeaderEpoch: -1, Magic: 2, LastOffsetDelta: int32(n - 1),
		FirstTimestamp: now, MaxTimestamp: now, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: int32(n), Records: recs}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}
