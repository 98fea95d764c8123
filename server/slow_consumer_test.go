package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/sys/unix"

	"github.com/kaas-go/kaas/configs"
)

// slowReaderConfig keeps fetch responses at 1 MiB and closes a connection with 4 MiB unread.
func slowReaderConfig(c *configs.Config) {
	c.FetchMaxBytes = 1 << 20
	c.ConnMaxOutboundBytes = 4 << 20
}

// fillTopic produces ~8 MiB of 64 KiB records to one partition.
func fillTopic(t *testing.T, cl *kgo.Client, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	val := make([]byte, 64<<10)
	var recs []*kgo.Record
	for i := 0; i < 128; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Value: val})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// TestSlowConsumerClosed: a client that keeps sending Fetch requests and never reads the
// answers is closed once its unread responses pass connection.max.outbound.bytes, and counted; a
// normal consumer reading the same data is not.
func TestSlowConsumerClosed(t *testing.T) {
	addr, _ := newTestBroker(t, slowReaderConfig)
	cl := fxClient(t, addr, kgo.ProducerBatchMaxBytes(1<<20))
	id := fxCreateTopic(t, cl, "slow", 1)
	fillTopic(t, cl, "slow")

	// A normal consumer reads everything and is never closed.
	before := mSlowConsumerCloses.Get()
	consumer := fxClient(t, addr, kgo.ConsumeTopics("slow"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(1<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for n := 0; n < 128; {
		fs := consumer.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("consume after %d records: %v", n, err)
		}
		n += fs.NumRecords()
	}
	if got := mSlowConsumerCloses.Get() - before; got != 0 {
		t.Fatalf("a normal consumer was closed as slow (%d closes)", got)
	}

	// A raw client with a small receive buffer that never reads.
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 32<<10) })
		return errors.Join(err, serr)
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := fxFetchReq(12, 0, 1, 1<<20)
	fxAddPart(req, "slow", id, 0, 0, 1<<20)
	var frame []byte
	frame = binary.BigEndian.AppendUint32(frame, 0)
	frame = binary.BigEndian.AppendUint16(frame, uint16(kmsg.Fetch))
	frame = binary.BigEndian.AppendUint16(frame, uint16(req.Version))
	frame = binary.BigEndian.AppendUint32(frame, 1)
	frame = binary.BigEndian.AppendUint16(frame, 4)
	frame = append(frame, "slow"...)
	frame = append(frame, 0) // flexible header tags
	frame = req.AppendTo(frame)
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))

	before = mSlowConsumerCloses.Get()
	_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
	for i := 0; i < 200 && mSlowConsumerCloses.Get() == before; i++ {
		if _, err := c.Write(frame); err != nil {
			break // the broker closed us
		}
	}
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if mSlowConsumerCloses.Get() == before {
			return fmt.Errorf("no slow-consumer close counted yet")
		}
		return nil
	})
	// The connection is gone: reading drains what the kernel held, then ends.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the slow connection is still open")
	}
}
