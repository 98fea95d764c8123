package server

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
)

// ---- helpers shared by the fetch / list-offsets / epoch tests (fx prefix: other test files
// in this package are written in parallel) ----

// fxRoundTrip sends req at exactly req's version on a raw connection and decodes the answer.
func fxRoundTrip[R kmsg.Response](t *testing.T, rc *rawConn, req kmsg.Request) R {
	t.Helper()
	rc.send(req, 7)
	corr, body, err := rc.recv()
	if err != nil {
		t.Fatalf("%s v%d: %v", kmsg.NameForKey(req.Key()), req.GetVersion(), err)
	}
	if corr != 7 {
		t.Fatalf("correlation id %d, want 7", corr)
	}
	resp := req.ResponseKind()
	if resp.IsFlexible() {
		body = body[1:] // empty header tag section
	}
	if err := resp.ReadFrom(body); err != nil {
		t.Fatalf("decode %s v%d: %v", kmsg.NameForKey(req.Key()), req.GetVersion(), err)
	}
	return resp.(R)
}

func fxClient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.ProducerLinger(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// fxCreateTopic creates topic with n partitions and returns its id.
func fxCreateTopic(t *testing.T, cl *kgo.Client, topic string, n int32) [16]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, n, 1, nil, topic); err != nil {
		t.Fatalf("create %s: %v", topic, err)
	}
	var id [16]byte
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		td, err := adm.ListTopics(ctx, topic)
		if err != nil {
			return err
		}
		d, ok := td[topic]
		if !ok || d.Err != nil || len(d.Partitions) != int(n) {
			return fmt.Errorf("topic %s not visible yet", topic)
		}
		id = d.ID
		return nil
	})
	return id
}

// fxProduceEach produces each record in its own request, so each lands in its own batch.
func fxProduceEach(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range recs {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// fxBatches counts the whole v2 batches in a records blob and returns their base offsets.
func fxBatches(t *testing.T, b []byte) []int64 {
	t.Helper()
	var bases []int64
	for len(b) > 0 {
		bt, ok, _ := codec.FrameBatch(b)
		if !ok {
			t.Fatalf("partial or bad batch in fetch response (%d bytes left)", len(b))
		}
		bases = append(bases, bt.BaseOffset())
		b = b[len(bt):]
	}
	return bases
}

func fxFetchReq(version int16, maxWait, minBytes, maxBytes int32) *kmsg.FetchRequest {
	r := kmsg.NewPtrFetchRequest()
	r.Version = version
	r.MaxWaitMillis, r.MinBytes, r.MaxBytes = maxWait, minBytes, maxBytes
	r.SessionID, r.SessionEpoch = 0, -1
	return r
}

func fxAddPart(r *kmsg.FetchRequest, topic string, id [16]byte, p int32, offset int64, maxBytes int32) {
	var t *kmsg.FetchRequestTopic
	for i := range r.Topics {
		if r.Topics[i].Topic == topic && r.Topics[i].TopicID == id {
			t = &r.Topics[i]
		}
	}
	if t == nil {
		nt := kmsg.NewFetchRequestTopic()
		nt.Topic, nt.TopicID = topic, id
		r.Topics = append(r.Topics, nt)
		t = &r.Topics[len(r.Topics)-1]
	}
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = p, offset, maxBytes
	t.Partitions = append(t.Partitions, fp)
}

// fxParts flattens a fetch response into "topic/partition" → partition.
func fxParts(r *kmsg.FetchResponse) map[string]kmsg.FetchResponseTopicPartition {
	m := map[string]kmsg.FetchResponseTopicPartition{}
	for _, t := range r.Topics {
		name := t.Topic
		if name == "" {
			name = fmt.Sprintf("%x", t.TopicID)
		}
		for _, p := range t.Partitions {
			m[fmt.Sprintf("%s/%d", name, p.Partition)] = p
		}
	}
	return m
}

// ---- tests ----

// A fetch parked on an empty partition is answered by the produce, not by its (much longer)
// max wait: the response arrives while the wait still has ~30 s to run.
func TestFetchLongPollWakesOnProduce(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := fxClient(t, addr)
	fxCreateTopic(t, cl, "lp", 1)

	rc := dialRaw(t, addr) // 20 s deadline: far below the 60 s max wait
	req := fxFetchReq(12, 60_000, 1, 1<<20)
	fxAddPart(req, "lp", [16]byte{}, 0, 0, 1<<20)
	before := mFetchWaiting.Get()
	rc.send(req, 7)
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if mFetchWaiting.Get() <= before {
			return fmt.Errorf("fetch not parked yet")
		}
		return nil
	})
	fxProduceEach(t, cl, &kgo.Record{Topic: "lp", Value: []byte("wake up")})

	_, body, err := rc.recv()
	if err != nil {
		t.Fatalf("long-poll fetch not answered after produce: %v", err)
	}
	resp := kmsg.NewPtrFetchResponse()
	resp.Version = 12
	if err := resp.ReadFrom(body[1:]); err != nil {
		t.Fatal(err)
	}
	p := fxParts(resp)["lp/0"]
	if p.ErrorCode != 0 || p.HighWatermark != 1 || len(fxBatches(t, p.RecordBatches)) != 1 {
		t.Fatalf("got err %d hwm %d records %d bytes, want the produced batch", p.ErrorCode, p.HighWatermark, len(p.RecordBatches))
	}
	if !bytes.Contains(p.RecordBatches, []byte("wake up")) {
		t.Fatal("fetched batch does not hold the produced value")
	}
}

// Nothing arrives: the fetch is answered empty once max wait has passed (and not before).
func TestFetchLongPollTimesOutEmpty(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := fxClient(t, addr)
	fxCreateTopic(t, cl, "idle", 1)
	rc := dialRaw(t, addr)
	req := fxFetchReq(11, 150, 1, 1<<20)
	fxAddPart(req, "idle", [16]byte{}, 0, 0, 1<<20)
	start := time.Now()
	resp := fxRoundTrip[*kmsg.FetchResponse](t, rc, req)
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Fatalf("empty fetch answered after %v, before its max wait", waited)
	}
	p := fxParts(resp)["idle/0"]
	if p.ErrorCode != 0 || len(p.RecordBatches) != 0 || p.HighWatermark != 0 || p.LogStartOffset != 0 {
		t.Fatalf("got %+v, want an empty, error-free partition at hwm 0", p)
	}
	if p.AbortedTransactions != nil {
		t.Fatal("read_uncommitted fetch must carry null aborted transactions")
	}
}

// Record bytes, offsets and errors of plain (sessionless) fetches, including the limits.
func TestFetchLimitsAndErrors(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := fxClient(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	fxCreateTopic(t, cl, "lim", 2)
	big := strings.Repeat("x", 1000)
	for i := 0; i < 3; i++ {
		fxProduceEach(t, cl, &kgo.Record{Topic: "lim", Partition: 0, Value: []byte(big)})
		fxProduceEach(t, cl, &kgo.Record{Topic: "lim", Partition: 1, Value: []byte(big)})
	}
	rc := dialRaw(t, addr)

	fetch := func(version int16, maxBytes, partMax int32, iso int8, offs ...int64) *kmsg.FetchResponse {
		req := fxFetchReq(version, 0, 0, maxBytes)
		req.IsolationLevel = iso
		for p, o := range offs {
			fxAddPart(req, "lim", [16]byte{}, int32(p), o, partMax)
		}
		return fxRoundTrip[*kmsg.FetchResponse](t, rc, req)
	}

	// Everything fits.
	r := fxParts(fetch(11, 1<<20, 1<<20, 0, 0, 0))
	for _, k := range []string{"lim/0", "lim/1"} {
		if got := fxBatches(t, r[k].RecordBatches); len(got) != 3 || r[k].HighWatermark != 3 || r[k].LastStableOffset != 3 {
			t.Fatalf("%s: batches %v hwm %d lso %d, want 3 batches at hwm 3", k, got, r[k].HighWatermark, r[k].LastStableOffset)
		}
	}
	one := len(r["lim/0"].RecordBatches) / 3
	// The oldest served version (v4: no sessions, no log start offset) sees the same.
	r = fxParts(fetch(4, 1<<20, 1<<20, 0, 0, 0))
	if got := fxBatches(t, r["lim/1"].RecordBatches); len(got) != 3 || r["lim/1"].LastStableOffset != 3 {
		t.Fatalf("v4: batches %v lso %d", got, r["lim/1"].LastStableOffset)
	}

	// KIP-74: max_bytes 1 still returns one whole batch, from the first partition only.
	r = fxParts(fetch(11, 1, 1<<20, 0, 0, 0))
	if got := fxBatches(t, r["lim/0"].RecordBatches); len(got) != 1 || got[0] != 0 {
		t.Fatalf("max_bytes=1: partition 0 batches %v, want just [0]", got)
	}
	if n := len(r["lim/1"].RecordBatches); n != 0 || r["lim/1"].HighWatermark != 3 {
		t.Fatalf("max_bytes=1: partition 1 got %d bytes (hwm %d), want none but its hwm", n, r["lim/1"].HighWatermark)
	}

	// Partition max bytes of two batches: two whole batches per partition.
	r = fxParts(fetch(11, 1<<20, int32(2*one), 0, 0, 1))
	if got := fxBatches(t, r["lim/0"].RecordBatches); len(got) != 2 {
		t.Fatalf("partition_max_bytes=2 batches: got %v", got)
	}
	if got := fxBatches(t, r["lim/1"].RecordBatches); len(got) != 2 || got[0] != 1 {
		t.Fatalf("partition 1 from offset 1: got %v, want [1 2]", got)
	}

	// Response budget of 1.5 batches: partition 0 gets one, partition 1 none (not a partial one).
	r = fxParts(fetch(11, int32(one+one/2), 1<<20, 0, 0, 0))
	if a, b := len(fxBatches(t, r["lim/0"].RecordBatches)), len(r["lim/1"].RecordBatches); a != 1 || b != 0 {
		t.Fatalf("max_bytes=1.5 batches: got %d batches + %d bytes", a, b)
	}

	// read_committed: non-null aborted transactions, LSO = HWM here.
	r = fxParts(fetch(11, 1<<20, 1<<20, 1, 0, 0))
	if r["lim/0"].AbortedTransactions == nil || r["lim/0"].LastStableOffset != 3 {
		t.Fatalf("read_committed: aborted %v lso %d", r["lim/0"].AbortedTransactions, r["lim/0"].LastStableOffset)
	}

	// At the end: empty, no error. Past the end: OFFSET_OUT_OF_RANGE with the offsets filled in.
	r = fxParts(fetch(11, 1<<20, 1<<20, 0, 3, 4))
	if p := r["lim/0"]; p.ErrorCode != 0 || len(p.RecordBatches) != 0 {
		t.Fatalf("fetch at hwm: %+v", p)
	}
	if p := r["lim/1"]; p.ErrorCode != codec.CodeOffsetOutOfRange || p.HighWatermark != 3 || p.LogStartOffset != 0 {
		t.Fatalf("fetch past end: err %d hwm %d logStart %d", p.ErrorCode, p.HighWatermark, p.LogStartOffset)
	}

	// Unknown topic / partition; with topic ids (v13) an unknown id.
	req := fxFetchReq(12, 0, 0, 1<<20)
	fxAddPart(req, "nope", [16]byte{}, 0, 0, 1<<20)
	fxAddPart(req, "lim", [16]byte{}, 9, 0, 1<<20)
	r = fxParts(fxRoundTrip[*kmsg.FetchResponse](t, rc, req))
	if r["nope/0"].ErrorCode != codec.CodeUnknownTopicOrPartition || r["lim/9"].ErrorCode != codec.CodeUnknownTopicOrPartition {
		t.Fatalf("unknown topic/partition: %d %d", r["nope/0"].ErrorCode, r["lim/9"].ErrorCode)
	}
	req = fxFetchReq(13, 0, 0, 1<<20)
	fxAddPart(req, "", [16]byte{1, 2, 3}, 0, 0, 1<<20)
	resp := fxRoundTrip[*kmsg.FetchResponse](t, rc, req)
	if len(resp.Topics) != 1 || resp.Topics[0].Partitions[0].ErrorCode != codec.CodeUnknownTopicID {
		t.Fatalf("unknown topic id: %+v", resp.Topics)
	}

	// A stale or future CurrentLeaderEpoch (v9+, KIP-320).
	req = fxFetchReq(12, 0, 0, 1<<20)
	fxAddPart(req, "lim", [16]byte{}, 0, 0, 1<<20)
	req.Topics[0].Partitions[0].CurrentLeaderEpoch = 1
	if p := fxParts(fxRoundTrip[*kmsg.FetchResponse](t, rc, req))["lim/0"]; p.ErrorCode != codec.CodeUnknownLeaderEpoch {
		t.Fatalf("future leader epoch: %d", p.ErrorCode)
	}
}

// Fetch by topic id (v13+) returns the same records as by name.
func TestFetchByTopicID(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := fxClient(t, addr)
	id := fxCreateTopic(t, cl, "ids", 1)
	fxProduceEach(t, cl, &kgo.Record{Topic: "ids", Value: []byte("a")}, &kgo.Record{Topic: "ids", Value: []byte("b")})
	rc := dialRaw(t, addr)
	for _, v := range []int16{13, 17} {
		req := fxFetchReq(v, 0, 0, 1<<20)
		fxAddPart(req, "", id, 0, 0, 1<<20)
		resp := fxRoundTrip[*kmsg.FetchResponse](t, rc, req)
		if len(resp.Topics) != 1 || resp.Topics[0].TopicID != id {
			t.Fatalf("v%d: topics %+v", v, resp.Topics)
		}
		p := resp.Topics[0].Partitions[0]
		if p.ErrorCode != 0 || len(fxBatches(t, p.RecordBatches)) != 2 || p.HighWatermark != 2 {
			t.Fatalf("v%d: err %d hwm %d", v, p.ErrorCode, p.HighWatermark)
		}
	}
}

// KIP-227 sessions driven by hand: create, incremental (only changed partitions), epoch
// mismatch, unknown id, forgetting the last partition, closing.
func TestFetchSessions(t *testing.T) {
	addr, srv := newTestBroker(t)
	cl := fxClient(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	fxCreateTopic(t, cl, "s", 2)
	fxProduceEach(t, cl, &kgo.Record{Topic: "s", Partition: 0, Value: []byte("p0-a")})
	rc := dialRaw(t, addr)

	send := func(id, epoch int32, build func(r *kmsg.FetchRequest)) *kmsg.FetchResponse {
		req := fxFetchReq(12, 0, 0, 1<<20)
		req.SessionID, req.SessionEpoch = id, epoch
		if build != nil {
			build(req)
		}
		return fxRoundTrip[*kmsg.FetchResponse](t, rc, req)
	}
	both := func(o0, o1 int64) func(r *kmsg.FetchRequest) {
		return func(r *kmsg.FetchRequest) {
			fxAddPart(r, "s", [16]byte{}, 0, o0, 1<<20)
			fxAddPart(r, "s", [16]byte{}, 1, o1, 1<<20)
		}
	}

	// Sessionless: id 0, epoch -1.
	if r := send(0, -1, both(0, 0)); r.SessionID != 0 || len(fxParts(r)) != 2 {
		t.Fatalf("sessionless: id %d parts %d", r.SessionID, len(fxParts(r)))
	}

	// Open: epoch 0 answers a new id and every partition.
	r := send(0, 0, both(0, 0))
	id := r.SessionID
	if r.ErrorCode != 0 || id == 0 || len(fxParts(r)) != 2 {
		t.Fatalf("open: err %d id %d parts %d", r.ErrorCode, id, len(fxParts(r)))
	}
	if n := srv.fetchSessions.len(); n != 1 {
		t.Fatalf("%d sessions cached, want 1", n)
	}

	// Incremental, client moved partition 0 to offset 1: nothing new anywhere → no partitions.
	r = send(id, 1, func(r *kmsg.FetchRequest) { fxAddPart(r, "s", [16]byte{}, 0, 1, 1<<20) })
	if r.ErrorCode != 0 || r.SessionID != id || len(r.Topics) != 0 {
		t.Fatalf("idle incremental: err %d id %d topics %+v", r.ErrorCode, r.SessionID, r.Topics)
	}

	// New data on partition 1 only: the empty incremental answers partition 1 alone, with its
	// record read from the session's remembered offset 0.
	fxProduceEach(t, cl, &kgo.Record{Topic: "s", Partition: 1, Value: []byte("p1-a")})
	r = send(id, 2, nil)
	parts := fxParts(r)
	if len(parts) != 1 || len(fxBatches(t, parts["s/1"].RecordBatches)) != 1 || parts["s/1"].HighWatermark != 1 {
		t.Fatalf("incremental after produce: %+v", parts)
	}

	// Wrong epoch, unknown id.
	if r := send(id, 7, nil); r.ErrorCode != codec.CodeInvalidFetchSessionEpoch || len(r.Topics) != 0 {
		t.Fatalf("epoch mismatch: err %d", r.ErrorCode)
	}
	if r := send(id^0x5a5a, 1, nil); r.ErrorCode != codec.CodeFetchSessionIDNotFound {
		t.Fatalf("unknown id: err %d", r.ErrorCode)
	}
	// The failed attempts did not consume an epoch.
	if r := send(id, 3, func(r *kmsg.FetchRequest) { fxAddPart(r, "s", [16]byte{}, 1, 1, 1<<20) }); r.ErrorCode != 0 || len(r.Topics) != 0 {
		t.Fatalf("incremental 3: err %d topics %+v", r.ErrorCode, r.Topics)
	}

	// A v13 request on a name-keyed session.
	req13 := fxFetchReq(13, 0, 0, 1<<20)
	req13.SessionID, req13.SessionEpoch = id, 4
	if r := fxRoundTrip[*kmsg.FetchResponse](t, rc, req13); r.ErrorCode != codec.CodeFetchSessionTopicIDError {
		t.Fatalf("v13 on name session: err %d", r.ErrorCode)
	}

	// Forget both partitions: the session closes and the request is served sessionless.
	r = send(id, 4, func(r *kmsg.FetchRequest) {
		ft := kmsg.NewFetchRequestForgottenTopic()
		ft.Topic, ft.Partitions = "s", []int32{0, 1}
		r.ForgottenTopics = append(r.ForgottenTopics, ft)
	})
	if r.ErrorCode != 0 || r.SessionID != 0 {
		t.Fatalf("forget all: err %d id %d", r.ErrorCode, r.SessionID)
	}
	if r := send(id, 5, nil); r.ErrorCode != codec.CodeFetchSessionIDNotFound {
		t.Fatalf("after forgetting everything: err %d", r.ErrorCode)
	}

	// Close with epoch -1: full sessionless answer, and the id is gone.
	id = send(0, 0, both(1, 1)).SessionID
	if id == 0 {
		t.Fatal("second session not created")
	}
	r = send(id, -1, both(0, 0))
	if r.ErrorCode != 0 || r.SessionID != 0 || len(fxParts(r)) != 2 {
		t.Fatalf("close: err %d id %d parts %d", r.ErrorCode, r.SessionID, len(fxParts(r)))
	}
	if r := send(id, 1, nil); r.ErrorCode != codec.CodeFetchSessionIDNotFound {
		t.Fatalf("closed session still answers: err %d", r.ErrorCode)
	}
}

// A full cache answers session id 0 (the fetch itself is still served).
func TestFetchSessionCacheFull(t *testing.T) {
	addr, _ := newTestBroker(t, func(c *configs.Config) { c.FetchSessionCacheSize = 1 })
	cl := fxClient(t, addr)
	fxCreateTopic(t, cl, "full", 1)
	rc := dialRaw(t, addr)
	open := func() *kmsg.FetchResponse {
		req := fxFetchReq(12, 0, 0, 1<<20)
		req.SessionEpoch = 0
		fxAddPart(req, "full", [16]byte{}, 0, 0, 1<<20)
		return fxRoundTrip[*kmsg.FetchResponse](t, rc, req)
	}
	if open().SessionID == 0 {
		t.Fatal("first session not created")
	}
	r := open()
	if r.SessionID != 0 || r.ErrorCode != 0 || len(fxParts(r)) != 1 {
		t.Fatalf("second session with a full cache: id %d err %d", r.SessionID, r.ErrorCode)
	}
}

// End to end with kgo, which uses sessions, long-poll and ListOffsets on its own.
func TestFetchConsumeWithKgo(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := fxClient(t, addr)
	fxCreateTopic(t, cl, "e2e", 3)
	var recs []*kgo.Record
	for i := 0; i < 30; i++ {
		recs = append(recs, &kgo.Record{Topic: "e2e", Key: []byte(fmt.Sprint(i)), Value: []byte(fmt.Sprint(i))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cons := fxClient(t, addr, kgo.ConsumeTopics("e2e"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	seen := map[string]bool{}
	for len(seen) < 30 {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of 30: %v", len(seen), err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("%s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true })
	}
	// Produce more while the consumer is long-polling; it must see them too.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "e2e", Value: []byte("late")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for !seen["late"] {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("late record not consumed: %v", err)
		}
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true })
	}
}

// Sessions keyed by topic id (v13+): incremental answers carry the id, a name-based request on
// the session is refused, and forgetting by id works.
func TestFetchSessionsByTopicID(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := fxClient(t, addr)
	id := fxCreateTopic(t, cl, "sid", 1)
	rc := dialRaw(t, addr)
	send := func(version int16, sid, epoch int32, build func(r *kmsg.FetchRequest)) *kmsg.FetchResponse {
		req := fxFetchReq(version, 0, 0, 1<<20)
		req.SessionID, req.SessionEpoch = sid, epoch
		if build != nil {
			build(req)
		}
		return fxRoundTrip[*kmsg.FetchResponse](t, rc, req)
	}
	r := send(13, 0, 0, func(r *kmsg.FetchRequest) { fxAddPart(r, "", id, 0, 0, 1<<20) })
	sid := r.SessionID
	if sid == 0 || len(r.Topics) != 1 || r.Topics[0].TopicID != id {
		t.Fatalf("open v13 session: id %d topics %+v", sid, r.Topics)
	}
	if r := send(13, sid, 1, nil); r.ErrorCode != 0 || len(r.Topics) != 0 {
		t.Fatalf("idle v13 incremental: err %d topics %d", r.ErrorCode, len(r.Topics))
	}
	fxProduceEach(t, cl, &kgo.Record{Topic: "sid", Value: []byte("v")})
	r = send(13, sid, 2, nil)
	if len(r.Topics) != 1 || r.Topics[0].TopicID != id || len(fxBatches(t, r.Topics[0].Partitions[0].RecordBatches)) != 1 {
		t.Fatalf("v13 incremental after produce: %+v", r.Topics)
	}
	if r := send(12, sid, 3, nil); r.ErrorCode != codec.CodeFetchSessionTopicIDError {
		t.Fatalf("v12 on an id session: err %d", r.ErrorCode)
	}
	r = send(13, sid, 3, func(r *kmsg.FetchRequest) {
		ft := kmsg.NewFetchRequestForgottenTopic()
		ft.TopicID, ft.Partitions = id, []int32{0}
		r.ForgottenTopics = append(r.ForgottenTopics, ft)
	})
	if r.ErrorCode != 0 || r.SessionID != 0 {
		t.Fatalf("forget by id: err %d session %d", r.ErrorCode, r.SessionID)
	}
}

// A produce smaller than MinBytes wakes the waiter but does not answer it: the record comes back
// when the max wait is over.
func TestFetchLongPollHonoursMinBytes(t *testing.T) {
	addr, _ := newTestBroker(t)
	cl := fxClient(t, addr)
	fxCreateTopic(t, cl, "mb", 1)
	rc := dialRaw(t, addr)
	req := fxFetchReq(12, 400, 1<<20, 1<<20)
	fxAddPart(req, "mb", [16]byte{}, 0, 0, 1<<20)
	before := mFetchWaiting.Get()
	start := time.Now()
	rc.send(req, 7)
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if mFetchWaiting.Get() <= before {
			return fmt.Errorf("fetch not parked yet")
		}
		return nil
	})
	fxProduceEach(t, cl, &kgo.Record{Topic: "mb", Value: []byte("small")})
	_, body, err := rc.recv()
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("answered after %v with less than MinBytes, before the max wait", waited)
	}
	resp := kmsg.NewPtrFetchResponse()
	resp.Version = 12
	if err := resp.ReadFrom(body[1:]); err != nil {
		t.Fatal(err)
	}
	if p := fxParts(resp)["mb/0"]; len(fxBatches(t, p.RecordBatches)) != 1 {
		t.Fatalf("the small record is missing at max wait: %+v", p)
	}
}
