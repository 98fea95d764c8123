package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TestE2ETxnAbortNeedsClusterAction: the admin abort of kafka-transactions.sh (KIP-664) sends
// WriteTxnMarkers, which Apache gates with CLUSTER_ACTION (or ALTER) on the cluster. Over a
// SASL_SSL listener (SCRAM-SHA-512) with the ACL authorizer on, a principal holding only what a
// transactional producer needs (WRITE/DESCRIBE on its TransactionalId, WRITE on the topic) gets
// CLUSTER_AUTHORIZATION_FAILED (31) and the transaction stays open (LSO pinned, describe-producers
// still shows it); once kafka-acls grants it CLUSTER_ACTION on the cluster, the same abort
// succeeds and the LSO reaches the high watermark. Every tool logs in with a client.properties as
// an operator writes it.
func TestE2ETxnAbortNeedsClusterAction(t *testing.T) {
	requireKafkaLib(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	ks, ts := e2eTestCA(t, dir)
	saslAddr := fmt.Sprintf("127.0.0.1:%d", e2eFreePort(t))
	e2eCredentialsAdd(t, dataDir, "admin", "SCRAM-SHA-512", "admin-pw")
	e2eCredentialsAdd(t, dataDir, "alice", "SCRAM-SHA-512", "alice-pw")
	e2eKaasListeners = func(plain string) string { return "PLAINTEXT://" + plain + ",SASL_SSL://" + saslAddr }
	e2eExtraKaasArgs = []string{"--data.dir=" + dataDir, "--ssl.keystore.location=" + ks,
		"--sasl.enabled.mechanisms=SCRAM-SHA-512", "--authorizer.class.name=acl", "--super.users=User:admin"}
	t.Cleanup(func() { e2eKaasListeners, e2eExtraKaasArgs = nil, nil })
	startKaas(t)

	adminProps, aliceProps := e2eSCRAMClientProps(t, dir, ts, "admin", "admin-pw"), e2eSCRAMClientProps(t, dir, ts, "alice", "alice-pw")
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(ts); err != nil || !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("cannot load the test CA %s: %v", ts, err)
	}
	secOpts := func(user, pw string) []kgo.Opt {
		return []kgo.Opt{kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
			kgo.SASL(scram.Auth{User: user, Pass: pw}.AsSha512Mechanism())}
	}
	client := func(user, pw string, opts ...kgo.Opt) *kgo.Client {
		t.Helper()
		return e2eTxnClient(t, saslAddr, append(secOpts(user, pw), opts...)...)
	}
	st := newE2EStepTimer(t)

	topic, tid := e2eName("acl-abort"), e2eName("acl-abort-tid")
	admin := client("admin", "admin-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := kadm.NewClient(admin).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatalf("create %s as admin: %v", topic, err)
	}
	acls := func(as string, args ...string) string {
		t.Helper()
		return javaTool(t, 90*time.Second, classACLs, append([]string{"--bootstrap-server", saslAddr, "--command-config", as}, args...)...).stdout
	}
	acls(adminProps, "--add", "--allow-principal", "User:alice", "--operation", "Write", "--operation", "Describe",
		"--transactional-id", tid)
	acls(adminProps, "--add", "--allow-principal", "User:alice", "--operation", "Write", "--topic", topic)
	st.done("kafka-acls: alice's producer ACLs")

	// alice's transaction, left open: a timeout far above the test's length, so that the
	// coordinator's reaper never ends it for us.
	hung := client("alice", "alice-pw", kgo.TransactionalID(tid), kgo.TransactionTimeout(10*time.Minute),
		kgo.DefaultProduceTopic(topic))
	if err := hung.BeginTransaction(); err != nil {
		t.Fatalf("BeginTransaction: %v", err)
	}
	recs := []*kgo.Record{{Value: []byte("hung-0")}, {Value: []byte("hung-1")}}
	if err := hung.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce in alice's transaction: %v", err)
	}
	start, pid, epoch := recs[0].Offset, recs[0].ProducerID, recs[0].ProducerEpoch
	st.done("alice's open transaction")

	// LSO pinned at the transaction's first offset, HWM past its two records.
	lsoPinned := func(what string) {
		t.Helper()
		e2eEventually(t, 10*time.Second, what, func() error {
			h, err := e2eTxnListOffsets(admin, topic, 1, e2eTxnReadUncommitted)
			if err != nil {
				return err
			}
			l, err := e2eTxnListOffsets(admin, topic, 1, e2eTxnReadCommitted)
			if err != nil {
				return err
			}
			if l[0] != start || h[0] != start+2 {
				return fmt.Errorf("LSO %d HWM %d, want LSO %d HWM %d", l[0], h[0], start, start+2)
			}
			return nil
		})
	}
	lsoPinned("LSO pinned by alice's transaction")

	// The coordinator epoch the abort must carry: the one of the producer's last marker on the
	// partition (none yet: -1, and the tool wants a non-negative value).
	openTxn := func() map[string]string {
		t.Helper()
		r := javaTool(t, 60*time.Second, e2eTxnClassTxns, "--bootstrap-server", saslAddr, "--command-config", adminProps,
			"describe-producers", "--topic", topic, "--partition", "0")
		for _, row := range e2eTxnTable(t, r.stdout) {
			if row["ProducerId"] == strconv.FormatInt(pid, 10) {
				return row
			}
		}
		t.Fatalf("describe-producers: no row for producer %d:\n%s", pid, r.stdout)
		return nil
	}
	row := openTxn()
	if row["CurrentTransactionStartOffset"] != strconv.FormatInt(start, 10) {
		t.Fatalf("describe-producers before the abort: %v, want CurrentTransactionStartOffset %d", row, start)
	}
	coordEpoch, err := strconv.Atoi(row["LatestCoordinatorEpoch"])
	if err != nil {
		t.Fatalf("describe-producers LatestCoordinatorEpoch %q: %v", row["LatestCoordinatorEpoch"], err)
	}
	coordEpoch = max(coordEpoch, 0)
	// The explicit form (producer id/epoch) goes straight to WriteTxnMarkers; the --start-offset
	// form would first need READ on the topic for DescribeProducers, which is not what is tested.
	abort := []string{"--bootstrap-server", saslAddr, "--command-config", aliceProps, "abort", "--topic", topic, "--partition", "0",
		"--producer-id", strconv.FormatInt(pid, 10), "--producer-epoch", strconv.Itoa(int(epoch)),
		"--coordinator-epoch", strconv.Itoa(coordEpoch)}
	st.done("describe-producers (admin)")

	out, errOut, aerr := javaToolStreamString(60*time.Second, e2eTxnClassTxns, abort...)
	if aerr == nil {
		t.Fatalf("kafka-transactions abort as alice without CLUSTER_ACTION succeeded:\n%s\n%s", out, errOut)
	}
	// The admin client's AbortTransactionHandler turns CLUSTER_AUTHORIZATION_FAILED (31), and only
	// that code, into a ClusterAuthorizationException "... failed due to cluster authorization error".
	if !strings.Contains(out+errOut, "failed due to cluster authorization error") {
		t.Fatalf("kafka-transactions abort without CLUSTER_ACTION: %v, want CLUSTER_AUTHORIZATION_FAILED (31):\nstdout:\n%s\nstderr:\n%s",
			aerr, e2eTruncate(out, 2000), e2eTruncate(errOut, 2000))
	}
	st.done("abort refused (31)")
	lsoPinned("LSO still pinned after the refused abort")
	if row := openTxn(); row["CurrentTransactionStartOffset"] != strconv.FormatInt(start, 10) {
		t.Fatalf("describe-producers after the refused abort: %v, want the transaction still open at %d", row, start)
	}

	acls(adminProps, "--add", "--allow-principal", "User:alice", "--operation", "ClusterAction", "--cluster")
	st.done("kafka-acls: CLUSTER_ACTION for alice")
	javaTool(t, 60*time.Second, e2eTxnClassTxns, abort...)
	st.done("abort as alice")

	// The abort marker is the only record added; the LSO catches up with the high watermark and
	// read_committed sees neither of the aborted records.
	hwm := e2eTxnWaitStable(t, admin, topic, 1, 15*time.Second)
	if hwm[0] != start+3 {
		t.Errorf("HWM %d after the abort, want %d (two records and one abort marker)", hwm[0], start+3)
	}
	if recs := e2eTxnReadAll(t, saslAddr, topic, hwm, e2eTxnReadCommitted, 30*time.Second, secOpts("admin", "admin-pw")...); len(recs) != 0 {
		t.Errorf("read_committed after the abort: %v, want nothing", recs)
	}
	if row := openTxn(); !e2eTxnNoOpenTxn(row["CurrentTransactionStartOffset"]) {
		t.Errorf("describe-producers after the abort: %v still open", row)
	}
	st.done("verify")
}
