package server

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/credentials"
)

// secEnv is a broker with all four listener kinds, a test CA and users alice (both SCRAM
// mechanisms) and bob (SCRAM-SHA-256 only).
type secEnv struct {
	tb  *testBroker
	pki *testPKI
	dir string
}

const (
	alicePW = "alice-secret"
	bobPW   = "bob-secret"
)

func newSecEnv(t *testing.T, opts ...func(*configs.Config)) *secEnv {
	t.Helper()
	pki := newTestPKI(t)
	dir := t.TempDir()
	ks, ts := pki.writeKeystore(dir, "broker-0")
	cfg := testConfig(t)
	cfg.Listeners = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0"
	cfg.SSLKeystoreLocation = ks
	cfg.SSLTruststoreLocation = ts
	cfg.SSLClientAuth = "requested"
	cfg.SASLMechanisms = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
	for _, o := range opts {
		o(&cfg)
	}
	tb := startTestBroker(t, cfg)
	t.Cleanup(func() { tb.stop(t) })
	e := &secEnv{tb: tb, pki: pki, dir: dir}
	e.addUser(t, "alice", alicePW, credentials.SHA256, credentials.SHA512)
	e.addUser(t, "bob", bobPW, credentials.SHA256)
	return e
}

func (e *secEnv) addUser(t *testing.T, user, pw string, ms ...credentials.Mechanism) {
	t.Helper()
	var chs []credentials.Change
	for _, m := range ms {
		c, err := credentials.FromPassword(m, pw, 4096)
		if err != nil {
			t.Fatal(err)
		}
		chs = append(chs, credentials.Change{User: user, Mechanism: m, Cred: c})
	}
	if err := e.tb.srv.deps.Credentials.Apply(chs); err != nil {
		t.Fatal(err)
	}
}

func (e *secEnv) addr(listener string) string { return e.tb.srv.ListenerAddr(listener).String() }

// mechanism builds a franz-go SASL mechanism.
func mechanism(name, user, pw string) sasl.Mechanism {
	switch name {
	case "PLAIN":
		return plain.Auth{User: user, Pass: pw}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: user, Pass: pw}.AsSha256Mechanism()
	}
	return scram.Auth{User: user, Pass: pw}.AsSha512Mechanism()
}

// client is a franz-go client on the named listener.
func (e *secEnv) client(t *testing.T, listener string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	o := []kgo.Opt{kgo.SeedBrokers(e.addr(listener)), kgo.ProducerLinger(0), kgo.RetryTimeout(5 * time.Second), kgo.AllowAutoTopicCreation()}
	if strings.Contains(listener, "SSL") {
		o = append(o, kgo.DialTLSConfig(e.pki.clientTLS(nil)))
	}
	return fxClientOpts(t, append(o, opts...)...)
}

func fxClientOpts(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// seenPrincipals records the principal each client id's requests ran as (testHandlerHook), for
// tests that do not run in parallel.
type seenPrincipals struct {
	mu sync.Mutex
	by map[string]string
}

func recordPrincipals(t *testing.T) *seenPrincipals {
	p := &seenPrincipals{by: map[string]string{}}
	testHandlerHook = func(key int16, h handler) handler {
		return func(rc *reqCtx) (kmsg.Response, error) {
			if rc.hdr.ClientID != nil && key == int16(kmsg.Produce) {
				p.mu.Lock()
				p.by[*rc.hdr.ClientID] = rc.c.principal()
				p.mu.Unlock()
			}
			return h(rc)
		}
	}
	t.Cleanup(func() { testHandlerHook = nil })
	return p
}

func (p *seenPrincipals) of(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.by[id]
}

// produceOne produces one record synchronously.
func produceOne(t *testing.T, cl *kgo.Client, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// TestSASLMechanismsOverPlaintextAndTLS: franz-go with sasl/plain and sasl/scram authenticates on
// SASL_PLAINTEXT and SASL_SSL, its requests run as User:<name>, and Metadata on each listener
// lists that listener's address (advertised.listeners where set).
func TestSASLMechanismsOverPlaintextAndTLS(t *testing.T) {
	rec := recordPrincipals(t)
	e := newSecEnv(t)
	for _, ln := range []string{"SASL_PLAINTEXT", "SASL_SSL"} {
		for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
			id := ln + "/" + mech
			cl := e.client(t, ln, kgo.SASL(mechanism(mech, "alice", alicePW)), kgo.ClientID(id))
			produceOne(t, cl, "sec-"+strings.ToLower(strings.ReplaceAll(ln, "_", "-")))
			if got := rec.of(id); got != "User:alice" {
				t.Errorf("%s: principal %q, want User:alice", id, got)
			}
		}
	}
	// Plain and SSL listeners: ANONYMOUS (no client certificate).
	for _, ln := range []string{"PLAINTEXT", "SSL"} {
		cl := e.client(t, ln, kgo.ClientID(ln))
		produceOne(t, cl, "sec-anon")
		if got := rec.of(ln); got != "User:ANONYMOUS" {
			t.Errorf("%s: principal %q, want User:ANONYMOUS", ln, got)
		}
	}
}

// TestMetadataAnswersWithTheClientsListener: every listener publishes its own endpoint, and a
// client is given the address of the listener it came in on (advertised.listeners overrides it).
func TestMetadataAnswersWithTheClientsListener(t *testing.T) {
	t.Parallel()
	e := newSecEnv(t, func(c *configs.Config) { c.AdvertisedListeners = "SSL://kaas.example:19093" })
	f := func(listener string, wantHost string, wantPort int32) {
		t.Helper()
		var nc net.Conn
		var err error
		if strings.Contains(listener, "SSL") {
			nc, err = tls.Dial("tcp", e.addr(listener), e.pki.clientTLS(nil))
		} else {
			nc, err = net.Dial("tcp", e.addr(listener))
		}
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		rc := &rawConn{t: t, c: nc, br: bufio.NewReader(nc)}
		req := kmsg.NewPtrMetadataRequest()
		req.Version = 12
		resp := rawRoundTrip(t, rc, req).(*kmsg.MetadataResponse)
		if len(resp.Brokers) != 1 || resp.Brokers[0].Host != wantHost || resp.Brokers[0].Port != wantPort {
			t.Fatalf("%s: brokers %+v, want %s:%d", listener, resp.Brokers, wantHost, wantPort)
		}
		dc := kmsg.NewPtrDescribeClusterRequest()
		dresp := rawRoundTrip(t, rc, dc).(*kmsg.DescribeClusterResponse)
		if len(dresp.Brokers) != 1 || dresp.Brokers[0].Host != wantHost || dresp.Brokers[0].Port != wantPort {
			t.Fatalf("%s: DescribeCluster brokers %+v", listener, dresp.Brokers)
		}
	}
	f("PLAINTEXT", "127.0.0.1", int32(e.tb.srv.ListenerAddr("PLAINTEXT").Port))
	f("SSL", "kaas.example", 19093)
	if e.tb.srv.ListenerAddr("PLAINTEXT").Port == e.tb.srv.ListenerAddr("SSL").Port {
		t.Fatal("listeners share a port")
	}
	// Every listener is published to the topology; the inter-broker one defaults to the first.
	for _, ln := range []string{"PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"} {
		ep, ok := e.tb.srv.deps.Topology.Brokers()[0].Endpoint(ln)
		if !ok || (ln != "SSL" && ep.Port != int32(e.tb.srv.ListenerAddr(ln).Port)) {
			t.Fatalf("topology endpoint of %s: %+v %v", ln, ep, ok)
		}
	}
	if ib := e.tb.srv.InterBrokerEndpoint(); ib.Listener != "PLAINTEXT" || ib.Port != int32(e.tb.srv.ListenerAddr("PLAINTEXT").Port) {
		t.Fatalf("inter-broker endpoint %+v", ib)
	}
}

// corrSeq numbers raw requests across the parallel tests of this file.
var corrSeq atomic.Int32

// rawRoundTrip sends req on rc and parses its response.
func rawRoundTrip(t *testing.T, rc *rawConn, req kmsg.Request) kmsg.Response {
	t.Helper()
	corr := corrSeq.Add(1)
	rc.send(req, corr)
	got, body, err := rc.recv()
	if err != nil || got != corr {
		t.Fatalf("%s: corr %d, %v", kmsg.NameForKey(req.Key()), got, err)
	}
	if req.IsFlexible() && req.Key() != int16(kmsg.ApiVersions) {
		body = body[1:]
	}
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if err := resp.ReadFrom(body); err != nil {
		t.Fatalf("%s: %v", kmsg.NameForKey(req.Key()), err)
	}
	return resp
}

// saslRaw dials the SASL_PLAINTEXT listener.
func (e *secEnv) saslRaw(t *testing.T) *rawConn { return dialRaw(t, e.addr("SASL_PLAINTEXT")) }

func handshake(t *testing.T, rc *rawConn, mech string, version int16) *kmsg.SASLHandshakeResponse {
	req := kmsg.NewPtrSASLHandshakeRequest()
	req.Version, req.Mechanism = version, mech
	return rawRoundTrip(t, rc, req).(*kmsg.SASLHandshakeResponse)
}

func authenticate(t *testing.T, rc *rawConn, token []byte, version int16) *kmsg.SASLAuthenticateResponse {
	req := kmsg.NewPtrSASLAuthenticateRequest()
	req.Version, req.SASLAuthBytes = version, token
	return rawRoundTrip(t, rc, req).(*kmsg.SASLAuthenticateResponse)
}

func plainToken(user, pw string) []byte { return []byte("\x00" + user + "\x00" + pw) }

// TestSASLBadInputIsRefused: the bad input of the issue, each on its own connection.
func TestSASLBadInputIsRefused(t *testing.T) {
	t.Parallel()
	e := newSecEnv(t)

	t.Run("request before authentication closes", func(t *testing.T) {
		before := mSASLPreAuthRequests.Get()
		rc := e.saslRaw(t)
		// ApiVersions is allowed first.
		if r := rawRoundTrip(t, rc, kmsg.NewPtrApiVersionsRequest()).(*kmsg.ApiVersionsResponse); r.ErrorCode != 0 {
			t.Fatalf("ApiVersions: %d", r.ErrorCode)
		}
		rc.send(kmsg.NewPtrMetadataRequest(), 9)
		rc.expectClosed()
		if mSASLPreAuthRequests.Get() <= before {
			t.Fatal("not counted")
		}
	})
	t.Run("request between handshake and authenticate closes", func(t *testing.T) {
		rc := e.saslRaw(t)
		if r := handshake(t, rc, "PLAIN", 1); r.ErrorCode != 0 {
			t.Fatal(r.ErrorCode)
		}
		rc.send(kmsg.NewPtrMetadataRequest(), 9)
		rc.expectClosed()
	})
	failed := func(t *testing.T, mech string, tokens ...[]byte) {
		t.Helper()
		before := mSASLFailures.Get()
		rc := e.saslRaw(t)
		if r := handshake(t, rc, mech, 1); r.ErrorCode != 0 {
			t.Fatal(r.ErrorCode)
		}
		var r *kmsg.SASLAuthenticateResponse
		for _, tok := range tokens {
			if r = authenticate(t, rc, tok, 2); r.ErrorCode != 0 {
				break
			}
		}
		if r.ErrorCode != codec.CodeSaslAuthenticationFailed || r.ErrorMessage == nil {
			t.Fatalf("want 58, got %d", r.ErrorCode)
		}
		// Generic: no user name, nothing about which part was wrong.
		if msg := *r.ErrorMessage; strings.Contains(msg, "alice") || strings.Contains(msg, "nobody") || msg != saslFailedMessage+mech {
			t.Fatalf("message %q", msg)
		}
		rc.expectClosed()
		if mSASLFailures.Get() <= before {
			t.Fatal("failure not counted")
		}
	}
	t.Run("PLAIN wrong password", func(t *testing.T) { failed(t, "PLAIN", plainToken("alice", "wrong")) })
	t.Run("PLAIN unknown user", func(t *testing.T) { failed(t, "PLAIN", plainToken("nobody", "x")) })
	t.Run("PLAIN garbage", func(t *testing.T) { failed(t, "PLAIN", []byte("garbage")) })
	t.Run("PLAIN other authzid", func(t *testing.T) { failed(t, "PLAIN", []byte("bob\x00alice\x00"+alicePW)) })
	t.Run("SCRAM garbage", func(t *testing.T) { failed(t, "SCRAM-SHA-256", []byte("\xff\x00not scram")) })
	t.Run("SCRAM unknown user", func(t *testing.T) { failed(t, "SCRAM-SHA-256", []byte("n,,n=nobody,r=abcdefgh")) })
	t.Run("SCRAM mechanism the user lacks", func(t *testing.T) { failed(t, "SCRAM-SHA-512", []byte("n,,n=bob,r=abcdefgh")) })
	t.Run("SCRAM wrong proof", func(t *testing.T) {
		rc := e.saslRaw(t)
		handshake(t, rc, "SCRAM-SHA-256", 1)
		r := authenticate(t, rc, []byte("n,,n=alice,r=abcdefgh"), 2)
		if r.ErrorCode != 0 || !strings.HasPrefix(string(r.SASLAuthBytes), "r=abcdefgh") {
			t.Fatalf("server-first: %d %q", r.ErrorCode, r.SASLAuthBytes)
		}
		nonce := strings.SplitN(strings.TrimPrefix(string(r.SASLAuthBytes), "r="), ",", 2)[0]
		r = authenticate(t, rc, []byte("c=biws,r="+nonce+",p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="), 2)
		if r.ErrorCode != codec.CodeSaslAuthenticationFailed {
			t.Fatalf("want 58, got %d", r.ErrorCode)
		}
		rc.expectClosed()
	})
	t.Run("unsupported mechanism", func(t *testing.T) {
		rc := e.saslRaw(t)
		r := handshake(t, rc, "GSSAPI", 1)
		if r.ErrorCode != codec.CodeUnsupportedSaslMechanism || strings.Join(r.SupportedMechanisms, ",") != "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512" {
			t.Fatalf("%d %v", r.ErrorCode, r.SupportedMechanisms)
		}
		rc.expectClosed()
	})
	t.Run("oversized token before authentication closes", func(t *testing.T) {
		before := mSASLOversized.Get()
		rc := e.saslRaw(t)
		var b []byte
		b = binary.BigEndian.AppendUint32(b, uint32(e.tb.cfg.SASLMaxReceive+1))
		b = append(b, make([]byte, 64)...)
		rc.write(b)
		rc.expectClosed()
		if mSASLOversized.Get() <= before {
			t.Fatal("not counted")
		}
	})
	t.Run("SaslAuthenticate on a plain listener", func(t *testing.T) {
		rc := dialRaw(t, e.addr("PLAINTEXT"))
		if r := authenticate(t, rc, plainToken("alice", alicePW), 1); r.ErrorCode != codec.CodeIllegalSaslState {
			t.Fatalf("%d", r.ErrorCode)
		}
		if r := handshake(t, rc, "PLAIN", 1); r.ErrorCode != codec.CodeIllegalSaslState {
			t.Fatalf("%d", r.ErrorCode)
		}
	})
	t.Run("v0 handshake: raw tokens, then requests", func(t *testing.T) {
		rc := e.saslRaw(t)
		if r := handshake(t, rc, "PLAIN", 0); r.ErrorCode != 0 {
			t.Fatal(r.ErrorCode)
		}
		tok := plainToken("alice", alicePW)
		rc.write(append(binary.BigEndian.AppendUint32(nil, uint32(len(tok))), tok...))
		var sz [4]byte
		if _, err := io.ReadFull(rc.br, sz[:]); err != nil || binary.BigEndian.Uint32(sz[:]) != 0 {
			t.Fatalf("raw PLAIN answer: %v %x", err, sz)
		}
		if r := rawRoundTrip(t, rc, kmsg.NewPtrMetadataRequest()).(*kmsg.MetadataResponse); len(r.Brokers) != 1 {
			t.Fatalf("metadata after v0 authentication: %+v", r)
		}
	})
	t.Run("v0 handshake: bad raw token closes", func(t *testing.T) {
		rc := e.saslRaw(t)
		handshake(t, rc, "PLAIN", 0)
		tok := plainToken("alice", "wrong")
		rc.write(append(binary.BigEndian.AppendUint32(nil, uint32(len(tok))), tok...))
		rc.expectClosed()
	})
}

// TestSASLReauthentication (KIP-368): the session lifetime is connections.max.reauth.ms; a
// connection re-authenticates as the same principal before it ends, may not change principal,
// and a connection that lets it expire is closed at its next request. franz-go re-authenticates
// on its own and keeps producing past several lifetimes.
func TestSASLReauthentication(t *testing.T) {
	t.Parallel()
	const lifetime = 1500 * time.Millisecond
	e := newSecEnv(t, func(c *configs.Config) { c.ConnMaxReauth = lifetime })

	login := func(t *testing.T, user, pw string) *rawConn {
		rc := e.saslRaw(t)
		handshake(t, rc, "PLAIN", 1)
		r := authenticate(t, rc, plainToken(user, pw), 1)
		if r.ErrorCode != 0 || r.SessionLifetimeMillis != lifetime.Milliseconds() {
			t.Fatalf("authenticate: %d lifetime %d", r.ErrorCode, r.SessionLifetimeMillis)
		}
		return rc
	}
	t.Run("same principal re-authenticates", func(t *testing.T) {
		rc := login(t, "alice", alicePW)
		if r := handshake(t, rc, "PLAIN", 1); r.ErrorCode != 0 {
			t.Fatal(r.ErrorCode)
		}
		if r := authenticate(t, rc, plainToken("alice", alicePW), 1); r.ErrorCode != 0 {
			t.Fatal(r.ErrorCode)
		}
		rawRoundTrip(t, rc, kmsg.NewPtrMetadataRequest())
	})
	t.Run("another principal is refused", func(t *testing.T) {
		rc := login(t, "alice", alicePW)
		handshake(t, rc, "PLAIN", 1)
		if r := authenticate(t, rc, plainToken("bob", bobPW), 1); r.ErrorCode != codec.CodeSaslAuthenticationFailed {
			t.Fatalf("%d", r.ErrorCode)
		}
		rc.expectClosed()
	})
	t.Run("expired session is closed", func(t *testing.T) {
		before := mSASLExpiredCloses.Get()
		rc := login(t, "alice", alicePW)
		start := time.Now()
		rawRoundTrip(t, rc, kmsg.NewPtrMetadataRequest()) // inside the session: served
		checkFor(t, 10*time.Second, 100*time.Millisecond, func() error {
			rc.send(kmsg.NewPtrMetadataRequest(), corrSeq.Add(1))
			if _, _, err := rc.recv(); err == nil {
				return fmt.Errorf("still served after %v", time.Since(start))
			}
			return nil
		})
		if time.Since(start) < lifetime {
			t.Fatalf("closed after %v, before the session lifetime", time.Since(start))
		}
		if mSASLExpiredCloses.Get() <= before {
			t.Fatal("not counted")
		}
	})
	t.Run("franz-go re-authenticates", func(t *testing.T) {
		cl := e.client(t, "SASL_PLAINTEXT", kgo.SASL(mechanism("SCRAM-SHA-512", "alice", alicePW)))
		before, expired := mSASLAuthentications.Get(), mSASLExpiredCloses.Get()
		start := time.Now()
		for time.Since(start) < 3*lifetime {
			produceOne(t, cl, "reauth")
			<-time.After(100 * time.Millisecond) // pacing the producer, not waiting for state
		}
		if n := mSASLAuthentications.Get() - before; n < 2 {
			t.Fatalf("%d authentications over %v; want re-authentications", n, 3*lifetime)
		}
		if n := mSASLExpiredCloses.Get() - expired; n != 0 {
			t.Fatalf("franz-go let %d sessions expire instead of re-authenticating", n)
		}
	})
}

// TestMTLSPrincipalMapping: on an SSL listener with ssl.client.auth=required the principal is
// the client certificate's subject through ssl.principal.mapping.rules; a client without a
// certificate is refused.
func TestMTLSPrincipalMapping(t *testing.T) {
	rec := recordPrincipals(t)
	e := newSecEnv(t, func(c *configs.Config) {
		c.Listeners = "PLAINTEXT://127.0.0.1:0,MTLS://127.0.0.1:0"
		c.ListenerProtocolMap = "PLAINTEXT:PLAINTEXT,MTLS:SSL"
		c.ListenerOverrides = map[string]string{
			"listener.name.mtls.ssl.client.auth":             "required",
			"listener.name.mtls.ssl.principal.mapping.rules": `RULE:^CN=([A-Za-z]+),OU=eng,O=Acme$/$1/L,DEFAULT`,
		}
	})
	produce := func(id string, subject *pkix.Name) error {
		cl := fxClientOpts(t, kgo.SeedBrokers(e.addr("MTLS")), kgo.DialTLSConfig(e.pki.clientTLS(subject)),
			kgo.ClientID(id), kgo.RetryTimeout(2*time.Second), kgo.RequestRetries(1), kgo.AllowAutoTopicCreation())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return cl.ProduceSync(ctx, &kgo.Record{Topic: "mtls", Value: []byte("v")}).FirstErr()
	}
	if err := produce("alice", &pkix.Name{CommonName: "Alice", OrganizationalUnit: []string{"eng"}, Organization: []string{"Acme"}}); err != nil {
		t.Fatal(err)
	}
	if got := rec.of("alice"); got != "User:alice" {
		t.Fatalf("mapped principal %q", got)
	}
	if err := produce("ops", &pkix.Name{CommonName: "ops", Organization: []string{"Other"}}); err != nil {
		t.Fatal(err)
	}
	if got := rec.of("ops"); got != "User:CN=ops,O=Other" {
		t.Fatalf("DEFAULT principal %q", got)
	}
	before := mTLSHandshakeFailures.Get()
	if err := produce("nocert", nil); err == nil {
		t.Fatal("client without a certificate served with ssl.client.auth=required")
	}
	if mTLSHandshakeFailures.Get() <= before {
		t.Fatal("handshake failure not counted")
	}
	// TLS 1.1 is refused.
	old := e.pki.clientTLS(nil)
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if c, err := tls.Dial("tcp", e.addr("MTLS"), old); err == nil {
		c.Close()
		t.Fatal("TLS 1.1 accepted")
	}
}

func TestPrincipalMappingRules(t *testing.T) {
	f := func(rules, subject, want string) {
		t.Helper()
		rs, err := parsePrincipalRules(rules)
		if err != nil {
			t.Fatalf("%s: %v", rules, err)
		}
		got, err := mapPrincipal(rs, subject)
		if want == "" {
			if err == nil {
				t.Fatalf("%s on %s: want no match, got %q", rules, subject, got)
			}
			return
		}
		if err != nil || got != want {
			t.Fatalf("%s on %s: %q, %v; want %q", rules, subject, got, err, want)
		}
	}
	f("DEFAULT", "CN=a,O=b", "CN=a,O=b")
	f("", "CN=a,O=b", "CN=a,O=b")
	f(`RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/L`, "CN=Bob,OU=Eng,O=x", "bob@eng")
	f(`RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/U`, "CN=Bob,OU=Eng,O=x", "BOB@ENG")
	f(`RULE:^CN=([a-z]+)$/$1x/,DEFAULT`, "CN=abc", "abcx")
	f(`RULE:^CN=([a-z]+)$/$1/,DEFAULT`, "CN=ABC,O=z", "CN=ABC,O=z")
	f(`RULE:^CN=([a-z]+)$/$1/`, "CN=ABC", "")
	f(`RULE:^CN=(.*),O=a\/b$/$1/`, "CN=x,O=a/b", "x")
	for _, bad := range []string{"RULE:abc", "RULE:(/x/", "NOPE"} {
		if _, err := parsePrincipalRules(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestTLSCertificateReload: replacing ssl.keystore.location takes effect on new connections
// without a restart; a keystore that does not parse keeps the previous certificate.
func TestTLSCertificateReload(t *testing.T) {
	t.Parallel()
	e := newSecEnv(t)
	served := func() string {
		c, err := tls.Dial("tcp", e.addr("SSL"), e.pki.clientTLS(nil))
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != "broker-0" {
		t.Fatalf("served %q", got)
	}
	reloads, failures := mTLSReloads.Get(), mTLSReloadFailures.Get()
	// A half-written keystore: kept out, the old certificate still served.
	if err := os.WriteFile(e.tb.cfg.SSLKeystoreLocation, []byte("-----BEGIN CERTIFICATE-----\ngarbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if got := served(); got != "broker-0" {
			t.Fatalf("served %q while the keystore was broken", got)
		}
		if mTLSReloadFailures.Get() == failures {
			return fmt.Errorf("broken keystore not noticed")
		}
		return nil
	})
	e.pki.writeKeystore(e.dir, "broker-0-renewed")
	checkFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if got := served(); got != "broker-0-renewed" {
			return fmt.Errorf("served %q", got)
		}
		return nil
	})
	if mTLSReloads.Get() <= reloads {
		t.Fatal("reload not counted")
	}
}

// saltedPassword is what kafka-configs computes client-side: Hi(password, salt, i).
func saltedPassword(t *testing.T, m credentials.Mechanism, pw string, salt []byte, iter int) []byte {
	t.Helper()
	h, n := sha256.New, 32
	if m == credentials.SHA512 {
		h, n = sha512.New, 64
	}
	k, err := pbkdf2.Key(h, pw, salt, iter, n)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestAlterUserScramCredentials: the KIP-554 APIs as kafka-configs uses them; the credential
// works for SCRAM and PLAIN at once; low-iteration, duplicate, malformed and missing credentials
// get Apache's codes.
func TestAlterUserScramCredentials(t *testing.T) {
	t.Parallel()
	e := newSecEnv(t)
	admin := e.client(t, "SASL_SSL", kgo.SASL(mechanism("SCRAM-SHA-256", "alice", alicePW)))
	ctx := context.Background()
	salt := []byte("carol-salt-0123456789")
	up := func(user string, m credentials.Mechanism, iter int32, pw string) kmsg.AlterUserSCRAMCredentialsRequestUpsertion {
		u := kmsg.NewAlterUserSCRAMCredentialsRequestUpsertion()
		u.Name, u.Mechanism, u.Iterations, u.Salt = user, int8(m), iter, salt
		u.SaltedPassword = saltedPassword(t, m, pw, salt, int(iter))
		return u
	}
	alter := func(dels []kmsg.AlterUserSCRAMCredentialsRequestDeletion, ups ...kmsg.AlterUserSCRAMCredentialsRequestUpsertion) map[string]int16 {
		req := kmsg.NewPtrAlterUserSCRAMCredentialsRequest()
		req.Deletions, req.Upsertions = dels, ups
		resp, err := req.RequestWith(ctx, admin)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int16{}
		for _, r := range resp.Results {
			out[r.User] = r.ErrorCode
		}
		return out
	}
	del := func(user string, m credentials.Mechanism) kmsg.AlterUserSCRAMCredentialsRequestDeletion {
		d := kmsg.NewAlterUserSCRAMCredentialsRequestDeletion()
		d.Name, d.Mechanism = user, int8(m)
		return d
	}
	low := up("dave", credentials.SHA256, 1000, "pw")
	bad := up("erin", credentials.SHA256, 4096, "pw")
	bad.SaltedPassword = bad.SaltedPassword[:5]
	unknown := up("frank", credentials.SHA256, 4096, "pw")
	unknown.Mechanism = 3
	got := alter([]kmsg.AlterUserSCRAMCredentialsRequestDeletion{del("nobody", credentials.SHA256)},
		up("carol", credentials.SHA512, 8192, "carol-pw"), low, bad, unknown,
		up("gina", credentials.SHA256, 4096, "a"), up("gina", credentials.SHA256, 4096, "b"),
		up("", credentials.SHA256, 4096, "a"))
	want := map[string]int16{"nobody": codec.CodeResourceNotFound, "carol": 0, "dave": codec.CodeUnacceptableCredential,
		"erin": codec.CodeUnacceptableCredential, "frank": codec.CodeUnsupportedSaslMechanism,
		"gina": codec.CodeDuplicateResource, "": codec.CodeUnacceptableCredential}
	for u, c := range want {
		if got[u] != c {
			t.Errorf("user %q: code %d, want %d", u, got[u], c)
		}
	}
	adm := kadm.NewClient(admin)
	described, err := adm.DescribeUserSCRAMs(ctx, "carol", "dave")
	if err != nil && described == nil {
		t.Fatal(err)
	}
	if c := described["carol"]; c.Err != nil || len(c.CredInfos) != 1 || c.CredInfos[0].Iterations != 8192 || c.CredInfos[0].Mechanism != kadm.ScramSha512 {
		t.Fatalf("carol: %+v", c)
	}
	if d := described["dave"]; d.Err == nil {
		t.Fatalf("dave described: %+v", d)
	}
	// The new credential authenticates with SCRAM and with PLAIN, on a new connection.
	for _, mech := range []string{"SCRAM-SHA-512", "PLAIN"} {
		produceOne(t, e.client(t, "SASL_SSL", kgo.SASL(mechanism(mech, "carol", "carol-pw"))), "carol")
	}
	// Deleting it stops new logins.
	if got := alter([]kmsg.AlterUserSCRAMCredentialsRequestDeletion{del("carol", credentials.SHA512)}); got["carol"] != 0 {
		t.Fatalf("delete: %d", got["carol"])
	}
	rc := e.saslRaw(t)
	handshake(t, rc, "PLAIN", 1)
	if r := authenticate(t, rc, plainToken("carol", "carol-pw"), 2); r.ErrorCode != codec.CodeSaslAuthenticationFailed {
		t.Fatalf("deleted user: %d", r.ErrorCode)
	}
}

// TestStoredLowIterationCredentialRefused: a credential under sasl.scram.min.iterations that is
// already in the store (written by an older tool) does not authenticate.
func TestStoredLowIterationCredentialRefused(t *testing.T) {
	t.Parallel()
	e := newSecEnv(t, func(c *configs.Config) { c.SCRAMMinIteration = 8192 })
	rc := e.saslRaw(t) // alice's credentials have 4096 iterations
	handshake(t, rc, "PLAIN", 1)
	if r := authenticate(t, rc, plainToken("alice", alicePW), 2); r.ErrorCode != codec.CodeSaslAuthenticationFailed {
		t.Fatalf("%d", r.ErrorCode)
	}
}

// TestSCRAMAcceptsLibrdkafkaFinalNonce guards the librdkafka form of client-final-message (its
// own nonce, then the whole server nonce), which Apache accepts and kcat sends; a final nonce
// that does not end with the server nonce, or a wrong proof in that form, is still refused.
func TestSCRAMAcceptsLibrdkafkaFinalNonce(t *testing.T) {
	t.Parallel()
	e := newSecEnv(t)
	try := func(mangle func(nonce string) string, pw string) int16 {
		rc := e.saslRaw(t)
		handshake(t, rc, "SCRAM-SHA-256", 1)
		const cnonce = "rdkafkaclientnonce"
		c1b := "n=alice,r=" + cnonce
		r := authenticate(t, rc, []byte("n,,"+c1b), 2)
		if r.ErrorCode != 0 {
			t.Fatalf("server-first: %d", r.ErrorCode)
		}
		s1 := string(r.SASLAuthBytes)
		var snonce, salt64, iters string
		for _, f := range strings.Split(s1, ",") {
			switch f[0] {
			case 'r':
				snonce = f[2:]
			case 's':
				salt64 = f[2:]
			case 'i':
				iters = f[2:]
			}
		}
		salt, _ := base64.StdEncoding.DecodeString(salt64)
		var iter int
		fmt.Sscan(iters, &iter)
		salted := saltedPassword(t, credentials.SHA256, pw, salt, iter)
		hm := func(key []byte, s string) []byte {
			m := hmac.New(sha256.New, key)
			m.Write([]byte(s))
			return m.Sum(nil)
		}
		clientKey := hm(salted, "Client Key")
		stored := sha256.Sum256(clientKey)
		c2wop := "c=biws,r=" + mangle(snonce)
		sig := hm(stored[:], c1b+","+s1+","+c2wop)
		proof := make([]byte, len(sig))
		for i := range sig {
			proof[i] = clientKey[i] ^ sig[i]
		}
		r = authenticate(t, rc, []byte(c2wop+",p="+base64.StdEncoding.EncodeToString(proof)), 2)
		if r.ErrorCode == 0 {
			serverSig := hm(hm(salted, "Server Key"), c1b+","+s1+","+c2wop)
			if string(r.SASLAuthBytes) != "v="+base64.StdEncoding.EncodeToString(serverSig) {
				t.Fatalf("server-final %q", r.SASLAuthBytes)
			}
		}
		return r.ErrorCode
	}
	librdkafka := func(n string) string { return "rdkafkaclientnonce" + n }
	if c := try(func(n string) string { return n }, alicePW); c != 0 {
		t.Fatalf("RFC form refused: %d", c)
	}
	if c := try(librdkafka, alicePW); c != 0 {
		t.Fatalf("librdkafka form refused: %d", c)
	}
	if c := try(librdkafka, "wrong"); c != codec.CodeSaslAuthenticationFailed {
		t.Fatalf("librdkafka form, wrong password: %d", c)
	}
	if c := try(func(n string) string { return n + "x" }, alicePW); c != codec.CodeSaslAuthenticationFailed {
		t.Fatalf("nonce not ending with the server nonce: %d", c)
	}
}
