package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// e2eTestCA writes a CA and a server certificate for 127.0.0.1, generated for this test only,
// and returns the keystore (chain + key PEM) and truststore (CA PEM) paths.
func e2eTestCA(t *testing.T, dir string) (keystore, truststore string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kaas e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keystore, truststore = filepath.Join(dir, "broker.pem"), filepath.Join(dir, "ca.pem")
	ks := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})...)
	if err := os.WriteFile(keystore, ks, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(truststore, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return keystore, truststore
}

// e2eCredentialsAdd runs `kaas credentials add` (the broker may or may not be running).
func e2eCredentialsAdd(t *testing.T, dataDir, user, mech, pw string) {
	t.Helper()
	out := e2eRunCmd(t, 30*time.Second, "", e2eKaasBin, "credentials", "add", "--data.dir="+dataDir,
		"--user="+user, "--mechanism="+mech, "--password="+pw)
	if !strings.Contains(out, "stored "+mech) {
		t.Fatalf("kaas credentials add %s: %q", user, out)
	}
}

// e2eSCRAMClientProps writes a Java client.properties for SASL_SSL with SCRAM-SHA-512 (as an
// operator writes it) into dir and returns its path; truststore is the test CA's PEM.
func e2eSCRAMClientProps(t *testing.T, dir, truststore, user, pw string) string {
	t.Helper()
	p := filepath.Join(dir, user+".properties")
	body := "security.protocol=SASL_SSL\n" +
		"sasl.mechanism=SCRAM-SHA-512\n" +
		`sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="` + user + `" password="` + pw + "\";\n" +
		"ssl.truststore.type=PEM\n" +
		"ssl.truststore.location=" + truststore + "\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestE2ESecuritySASLSSL: the first user is created with `kaas credentials add` before the broker
// starts; Apache's kafka-configs adds a SCRAM-SHA-512 user over SASL_SSL (client.properties, as an
// operator writes it); kafka-producer-perf-test produces as that user; kcat produces and consumes
// with -X security.protocol=SASL_SSL; a user added by `kaas credentials add` while the broker runs
// can log in without a restart.
func TestE2ESecuritySASLSSL(t *testing.T) {
	requireKafkaLib(t)
	kcat := e2eLookTool(t, "kcat", "apt-get install kcat")
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	ks, ts := e2eTestCA(t, dir)
	saslAddr := fmt.Sprintf("127.0.0.1:%d", e2eFreePort(t))

	e2eCredentialsAdd(t, dataDir, "admin", "SCRAM-SHA-512", "admin-pw")

	e2eKaasListeners = func(plain string) string { return "PLAINTEXT://" + plain + ",SASL_SSL://" + saslAddr }
	e2eExtraKaasArgs = []string{"--data.dir=" + dataDir, "--ssl.keystore.location=" + ks,
		"--sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512"}
	t.Cleanup(func() { e2eKaasListeners, e2eExtraKaasArgs = nil, nil })
	startKaas(t)

	props := func(user, pw string) string { return e2eSCRAMClientProps(t, dir, ts, user, pw) }
	adminProps := props("admin", "admin-pw")

	steps := newE2EStepTimer(t)
	javaTool(t, 90*time.Second, classConfigs, "--bootstrap-server", saslAddr, "--command-config", adminProps,
		"--alter", "--add-config", "SCRAM-SHA-512=[iterations=8192,password=alice-pw]", "--entity-type", "users", "--entity-name", "alice")
	steps.done("kafka-configs --alter SCRAM-SHA-512 alice")

	// The credential kafka-configs sent (client-salted) is stored with its iterations.
	tlsCfg := func() *tls.Config {
		pool := x509.NewCertPool()
		data, _ := os.ReadFile(ts)
		pool.AppendCertsFromPEM(data)
		return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(saslAddr), kgo.DialTLSConfig(tlsCfg()),
		kgo.SASL(scram.Auth{User: "admin", Pass: "admin-pw"}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	described, err := kadm.NewClient(cl).DescribeUserSCRAMs(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if a := described["alice"]; a.Err != nil || len(a.CredInfos) != 1 || a.CredInfos[0].Iterations != 8192 || a.CredInfos[0].Mechanism != kadm.ScramSha512 {
		t.Fatalf("alice after kafka-configs: %+v", a)
	}
	// kafka-configs --describe for users asks for the user's client quotas (DescribeClientQuotas)
	// and then its SCRAM credentials (DescribeUserScramCredentials); both must answer, and the
	// SCRAM line must carry the mechanism and iterations kafka-configs stored.
	run, derrOut, derr := javaToolStreamString(90*time.Second, classConfigs, "--bootstrap-server", saslAddr, "--command-config", adminProps,
		"--describe", "--entity-type", "users", "--entity-name", "alice")
	if derr != nil {
		t.Fatalf("kafka-configs --describe users: %v\n%s", derr, e2eTruncate(derrOut, 2000))
	}
	if !strings.Contains(run, "SCRAM-SHA-512=iterations=8192") {
		t.Fatalf("kafka-configs --describe: no SCRAM-SHA-512 line in %q", run)
	}
	steps.done("describe")

	topic := e2eName("sasl-ssl")
	perf := javaTool(t, 120*time.Second, classPerfProducer, "--topic", topic, "--num-records", "2000",
		"--record-size", "100", "--throughput", "-1", "--producer.config", props("alice", "alice-pw"),
		"--producer-props", "bootstrap.servers="+saslAddr, "acks=all")
	if !strings.Contains(perf.stdout, "2000 records sent") {
		t.Fatalf("perf test output: %s", e2eTruncate(perf.stdout, 2000))
	}
	steps.done("kafka-producer-perf-test over SASL_SSL")

	kc := func(user, pw string, args ...string) []string {
		return append([]string{"-b", saslAddr, "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-512",
			"-X", "sasl.username=" + user, "-X", "sasl.password=" + pw, "-X", "ssl.ca.location=" + ts}, args...)
	}
	ktopic := e2eName("kcat-sasl")
	e2eRunCmd(t, 60*time.Second, "one\ntwo\nthree\n", kcat, kc("alice", "alice-pw", "-P", "-t", ktopic)...)
	out := e2eRunCmd(t, 60*time.Second, "", kcat, kc("alice", "alice-pw", "-C", "-t", ktopic, "-o", "beginning", "-e", "-q")...)
	if strings.Fields(out) == nil || strings.Join(strings.Fields(out), ",") != "one,two,three" {
		t.Fatalf("kcat consumed %q", out)
	}
	steps.done("kcat SASL_SSL produce + consume")

	// A user added while the broker runs logs in without a restart.
	e2eCredentialsAdd(t, dataDir, "late", "SCRAM-SHA-512", "late-pw")
	out = e2eRunCmd(t, 60*time.Second, "", kcat, kc("late", "late-pw", "-L", "-t", ktopic)...)
	if !strings.Contains(out, ktopic) {
		t.Fatalf("kcat -L as a user added at runtime: %q", out)
	}
	steps.done("kaas credentials add on a running broker")
}

// javaToolStreamString runs a Java tool and returns its stdout, stderr and error without failing.
func javaToolStreamString(timeout time.Duration, main string, args ...string) (string, string, error) {
	var out strings.Builder
	errOut, _, err := javaToolStream(timeout, &out, main, args...)
	return out.String(), errOut, err
}
