package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/xdg-go/scram"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/txn"
)

// Inter-broker security (issue 10): markers, KIP-890 verification and the TxnOffsetCommit check
// travel over the inter-broker listener with its TLS and SASL, as one pool of clients per
// broker (peer_clients.go), and the principal a broker logs in as needs CLUSTER_ACTION once ACLs
// are on.

const (
	brokerUser = "broker"
	brokerPW   = "broker-secret"
)

// scramConn is a raw connection to the SASL_PLAINTEXT listener at addr, logged in as user with
// SCRAM-SHA-256; the caller closes it.
func scramConn(t *testing.T, addr, user, pw string) (*rawConn, error) {
	t.Helper()
	rc := dialRaw(t, addr)
	if r := handshake(t, rc, "SCRAM-SHA-256", 1); r.ErrorCode != 0 {
		rc.c.Close()
		return nil, fmt.Errorf("handshake: %w", kerr.ErrorForCode(r.ErrorCode))
	}
	cl, err := scram.SHA256.NewClient(user, pw, "")
	if err != nil {
		t.Fatal(err)
	}
	conv := cl.NewConversation()
	msg, err := conv.Step("")
	for err == nil && !conv.Done() {
		r := authenticate(t, rc, []byte(msg), 2)
		if r.ErrorCode != 0 {
			rc.c.Close()
			return nil, fmt.Errorf("login as %s: %w", user, kerr.ErrorForCode(r.ErrorCode))
		}
		msg, err = conv.Step(string(r.SASLAuthBytes))
	}
	if err != nil {
		rc.c.Close()
		return nil, fmt.Errorf("SCRAM conversation: %w", err)
	}
	return rc, nil
}

// brokerClusterAction is what broker id answers the broker principal's CLUSTER_ACTION check: an
// empty AddPartitionsToTxn v4 (the verification form) over its SASL listener.
func (tc *testCluster) brokerClusterAction(t *testing.T, id int32) error {
	rc, err := scramConn(t, tc.broker(id).Server.ListenerAddr("SASL_PLAINTEXT").String(), brokerUser, brokerPW)
	if err != nil {
		return err
	}
	defer rc.c.Close()
	req := kmsg.NewPtrAddPartitionsToTxnRequest()
	req.Version = 4
	return kerr.ErrorForCode(fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, req).ErrorCode)
}

// TestClusterTxnOverSASLInterBrokerNeedsClusterAction: three brokers whose inter-broker listener
// is SASL_PLAINTEXT with SCRAM-SHA-256, each logging in as User:broker from its
// listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config, with the ACL authorizer on.
// Holding CLUSTER_ACTION and nothing else (Apache asks a v4+ AddPartitionsToTxn for no WRITE),
// a transaction whose partitions are all led by brokers other than its coordinator commits: verification and markers went over SASL. With the grant revoked, the next
// transaction's markers are refused with CLUSTER_AUTHORIZATION_FAILED (counted on the
// coordinator), the transaction stays PrepareCommit and nothing of it is visible; granting
// CLUSTER_ACTION again lets the producer's retried EndTxn complete it, and it is read committed.
func TestClusterTxnOverSASLInterBrokerNeedsClusterAction(t *testing.T) {
	tc := startTestClusterWith(t, 3, func(id int32, cfg *configs.Config, opts *BrokerOptions) {
		cfg.Listeners = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
		cfg.SASLMechanisms = "SCRAM-SHA-256"
		cfg.InterBrokerListener = "SASL_PLAINTEXT"
		cfg.InterBrokerSASL = "SCRAM-SHA-256"
		if err := cfg.Set("listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config",
			`org.apache.kafka.common.security.scram.ScramLoginModule required username="`+brokerUser+`" password="`+brokerPW+`";`); err != nil {
			t.Fatal(err)
		}
		cfg.AuthorizerClassName = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
		// The test's own clients use PLAINTEXT (User:ANONYMOUS) and may do anything; the
		// brokers' principal, User:broker, holds only what the ACLs below grant it.
		cfg.SuperUsers = superUser + ";User:ANONYMOUS"
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	})
	tc.waitSpread()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	adm := kadm.NewClient(tc.client())
	if _, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: brokerUser, Mechanism: kadm.ScramSha256,
		Iterations: 4096, Password: brokerPW}}); err != nil {
		t.Fatal(err)
	}
	grant := kadm.NewACLs().Allow("User:" + brokerUser).AllowHosts().Clusters().
		Operations(kadm.OpClusterAction).ResourcePatternType(kadm.ACLPatternLiteral)
	everyBroker := func(what string, want error) {
		t.Helper()
		checkFor(t, 60*time.Second, 50*time.Millisecond, func() error {
			for id := int32(1); id <= 3; id++ {
				if got := tc.brokerClusterAction(t, id); !errors.Is(got, want) && got != want {
					return fmt.Errorf("%s: broker %d answers User:%s's CLUSTER_ACTION with %v, want %v", what, id, brokerUser, got, want)
				}
			}
			return nil
		})
	}
	mustACL := func(what string, rs kadm.CreateACLsResults, err error) {
		t.Helper()
		if err == nil {
			for _, r := range rs {
				err = errors.Join(err, r.Err)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	rs, err := adm.CreateACLs(ctx, grant)
	mustACL("grant CLUSTER_ACTION", rs, err)
	everyBroker("granted", nil)

	// Partitions led by the two brokers that do not coordinate tid: every marker and every
	// verification of the transaction crosses brokers.
	const topic = "ibsasl"
	tc.createTopic(topic, 3, 3)
	tc.waitTopicSpread(topic)
	tid, coord := tc.txnIDAvoiding(t, "ibsasl")
	var parts []int32
	for p := int32(0); p < 3; p++ {
		if tc.owner(topic, p).Broker != coord.Broker {
			parts = append(parts, p)
		}
	}
	if len(parts) != 2 {
		t.Fatalf("partitions %v led away from coordinator %d, want 2", parts, coord.Broker)
	}
	// kgo retries EndTxn's retriable answers (COORDINATOR_NOT_AVAILABLE after failed markers,
	// then CONCURRENT_TRANSACTIONS while they are re-driven) for as long as this allows.
	cl := tc.client(kgo.TransactionalID(tid), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0), kgo.RequestRetries(1<<20), kgo.RetryTimeout(3*time.Minute))
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	produce := func(txnNo int) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			if err := cl.ProduceSync(ctx, &kgo.Record{Partition: p, Value: fmt.Appendf(nil, "t%d-p%d", txnNo, p)}).FirstErr(); err != nil {
				t.Fatalf("transaction %d, write to partition %d: %v", txnNo, p, err)
			}
		}
	}
	verified, authzRefused := mVerifyRemoteRequests.Get(), mPeerClusterAuthz.Get()
	sent := func() (n uint64) {
		for _, p := range parts {
			n += metrics.GetOrCreateCounter(fmt.Sprintf(`kaas_txn_marker_requests_sent_total{broker="%d"}`, tc.owner(topic, p).Broker)).Get()
		}
		return n
	}
	markers := sent()
	produce(1)
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit of transaction 1 (User:%s holds CLUSTER_ACTION): %v", brokerUser, err)
	}
	if mVerifyRemoteRequests.Get() == verified || sent() == markers {
		t.Fatalf("transaction 1 did not cross brokers: verifications %d → %d, marker requests %d → %d",
			verified, mVerifyRemoteRequests.Get(), markers, sent())
	}

	// Transaction 2 writes while the grant holds, then loses it before committing.
	produce(2)
	type lso struct{ lso, hwm int64 }
	offsets := func() map[int32]lso {
		m := map[int32]lso{}
		for _, p := range parts {
			pt := tc.broker(tc.owner(topic, p).Broker).Store.Topic(topic).Partition(p)
			m[p] = lso{pt.LastStableOffset(), pt.HighWatermark()}
		}
		return m
	}
	open := offsets()
	for p, o := range open {
		// Transaction 1: a record and its marker; transaction 2: one open record.
		if o.lso != 2 || o.hwm != 3 {
			t.Fatalf("partition %d before the commit of transaction 2: LSO %d HWM %d, want 2 3", p, o.lso, o.hwm)
		}
	}
	drs, err := adm.DeleteACLs(ctx, grant)
	if err == nil {
		for _, r := range drs {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatalf("revoke CLUSTER_ACTION: %v", err)
	}
	everyBroker("revoked", kerr.ClusterAuthorizationFailed)

	ended := make(chan error, 1)
	go func() { ended <- cl.EndTransaction(ctx, kgo.TryCommit) }()
	checkFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		if mPeerClusterAuthz.Get() == authzRefused {
			return errors.New("no CLUSTER_AUTHORIZATION_FAILED from a partition leader counted yet")
		}
		return nil
	})
	if e := txnEntry(t, tc.broker(coord.Broker), tid); e == nil || e.State != txn.PrepareCommit {
		t.Fatalf("transaction 2 with its markers refused: %+v, want PrepareCommit", e)
	}
	if now := offsets(); !maps.Equal(now, open) {
		t.Fatalf("transaction 2 became visible while its markers were refused: %v, before %v", now, open)
	}
	select {
	case err := <-ended:
		t.Fatalf("EndTxn answered while its markers were refused: %v", err)
	default:
	}

	rs, err = adm.CreateACLs(ctx, grant)
	mustACL("grant CLUSTER_ACTION again", rs, err)
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("commit of transaction 2 after the grant: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the commit of transaction 2 did not complete after CLUSTER_ACTION was granted again")
	}
	for p, o := range offsets() {
		if o.lso != 4 || o.hwm != 4 {
			t.Fatalf("partition %d after the commit: LSO %d HWM %d, want 4 4 (two records, two markers)", p, o.lso, o.hwm)
		}
	}
	got := consumeCommitted(t, tc, topic, 2*len(parts))
	var want []string
	for _, n := range []int{1, 2} {
		for _, p := range parts {
			want = append(want, fmt.Sprintf("t%d-p%d", n, p))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("read committed %v, want %v", got, want)
	}
}

// consumeCommitted reads n records of topic from the start, read_committed.
func consumeCommitted(t *testing.T, tc *testCluster, topic string, n int) []string {
	t.Helper()
	cl := tc.client(kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got []string
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read committed %d of %d records of %s: %v", len(got), n, topic, got)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	return got
}

// TestClusterTxnOverTLSInterBroker: three brokers whose inter-broker listener is SSL with
// ssl.client.auth=required: a transaction whose partitions are led away from its coordinator
// is verified and committed over TLS (each broker verifying its peers against the listener's
// truststore and presenting its keystore), and read committed.
func TestClusterTxnOverTLSInterBroker(t *testing.T) {
	pki := newTestPKI(t)
	ks, ts := pki.writeKeystore(t.TempDir(), "kaas-broker")
	tc := startTestClusterWith(t, 3, func(id int32, cfg *configs.Config, opts *BrokerOptions) {
		cfg.Listeners = "PLAINTEXT://127.0.0.1:0,INTERNAL://127.0.0.1:0"
		cfg.ListenerProtocolMap = "PLAINTEXT:PLAINTEXT,INTERNAL:SSL"
		cfg.InterBrokerListener = "INTERNAL"
		cfg.SSLKeystoreLocation, cfg.SSLTruststoreLocation = ks, ts
		if err := cfg.Set("listener.name.internal.ssl.client.auth", "required"); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	})
	tc.waitSpread()
	const topic = "ibtls"
	tc.createTopic(topic, 3, 3)
	tc.waitTopicSpread(topic)
	tid, coord := tc.txnIDAvoiding(t, "ibtls")
	var parts []int32
	for p := int32(0); p < 3; p++ {
		if tc.owner(topic, p).Broker != coord.Broker {
			parts = append(parts, p)
		}
	}
	cl := tc.client(kgo.TransactionalID(tid), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	verified, created := mVerifyRemoteRequests.Get(), mPeerClientsCreated.Get()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range parts {
		v := fmt.Sprintf("tls-p%d", p)
		want = append(want, v)
		if err := cl.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("write to partition %d (verified by coordinator %d over TLS): %v", p, coord.Broker, err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit over the TLS inter-broker listener: %v", err)
	}
	if mVerifyRemoteRequests.Get() == verified || mPeerClientsCreated.Get() == created {
		t.Fatalf("the transaction did not cross brokers: verifications %d → %d, inter-broker clients %d → %d",
			verified, mVerifyRemoteRequests.Get(), created, mPeerClientsCreated.Get())
	}
	got := consumeCommitted(t, tc, topic, len(want))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("read committed %v, want %v", got, want)
	}
}
