package server

// SASL authentication on SASL_PLAINTEXT / SASL_SSL listeners: SaslHandshake v0–1 and
// SaslAuthenticate v0–2 (KIP-43, KIP-152), PLAIN and SCRAM-SHA-256/512 (RFC 5802 / 7677, served
// by github.com/xdg-go/scram), KIP-368 re-authentication. The state lives on the connection and
// only its executor touches it: a connection runs its requests one at a time, so the gate in
// Server.handle sees every request in order.
//
//	          ApiVersions (any time)
//	              ┌──┐
//	              ▼  │
//	 ┌──────────────────┐  SaslHandshake v1  ┌────────────────────┐  SaslAuthenticate…  ┌───────────────┐
//	 │ awaitHandshake   │───────────────────▶│ awaitAuthenticate  │────────────────────▶│ authenticated │
//	 └──────────────────┘                    └────────────────────┘      (done)         └───────────────┘
//	   │ SaslHandshake v0                        ▲  (re-auth, KIP-368: SaslHandshake v1      │  │
//	   ▼                                         └── on a v1+ session, same mechanism) ─────┘  │
//	 ┌──────────────────┐  raw tokens (done)                                                  │
//	 │ awaitRawToken    │────────────────────────────────────────────────────────────────────▶│
//	 └──────────────────┘
//
//	any other request before authenticated, or a failed step → answer (if the protocol has
//	one: 58 SASL_AUTHENTICATION_FAILED) and close; a session past connections.max.reauth.ms
//	that was not re-authenticated is closed at its next request, as Apache's Selector does.

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/xdg-go/scram"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/credentials"
)

type saslStep int8

const (
	saslAwaitHandshake saslStep = iota
	saslAwaitAuthenticate
	saslAwaitRawToken
	saslAuthenticated
)

// saslState is a SASL connection's authentication state (executor-only).
type saslState struct {
	step      saslStep
	mech      string
	conv      saslMech
	principal string    // "" until the first success; a re-authentication must keep it
	expiry    time.Time // zero = the session never expires
	reauthOK  bool      // authenticated with SaslAuthenticate v1+, so it may re-authenticate
}

// saslMech is one mechanism's server side of one exchange.
type saslMech interface {
	// step consumes a client token and returns the server's; done means authenticated. An
	// error is a failed authentication (its text is logged, never sent: it may name the user).
	step(in []byte) (out []byte, done bool, err error)
	user() string
}

var errBadCredentials = errors.New("invalid credentials")

func (s *Server) newMech(name string) saslMech {
	switch name {
	case "PLAIN":
		return &plainMech{s: s}
	case "SCRAM-SHA-256":
		return s.newSCRAM(credentials.SHA256)
	case "SCRAM-SHA-512":
		return s.newSCRAM(credentials.SHA512)
	}
	return nil
}

// lookupCredential asks the store, refusing credentials under the configured iteration minimum.
func (s *Server) lookupCredential(user string, m credentials.Mechanism) (credentials.Credential, error) {
	if s.deps.Credentials == nil {
		return credentials.Credential{}, errBadCredentials
	}
	c, ok, err := s.deps.Credentials.Lookup(user, m)
	if err != nil {
		mCredentialStoreErrors.Inc()
		s.log.Error("cannot read SCRAM credentials", zap.Error(err))
	}
	if !ok {
		return credentials.Credential{}, errBadCredentials
	}
	if credentials.CheckIterations(c.Iterations, s.cfg.SCRAMMinIteration) != nil {
		return credentials.Credential{}, fmt.Errorf("%w: stored credential has too few iterations", errBadCredentials)
	}
	return c, nil
}

// plainMech is SASL/PLAIN (RFC 4616): one token "authzid NUL authcid NUL password", verified
// against the user's stored SCRAM credential (SHA-512 if present, else SHA-256) by deriving the
// StoredKey from the password and comparing in constant time. No password is stored.
type plainMech struct {
	s    *Server
	name string
}

// dummyCredential is what an unknown user's PLAIN password is checked against, so that an
// unknown user costs the same PBKDF2 as a known one and cannot be told apart by timing.
var dummyCredential = func() credentials.Credential {
	salt := make([]byte, 32)
	_, _ = rand.Read(salt)
	return credentials.FromSaltedPassword(credentials.SHA512, salt, make([]byte, 64), credentials.MinIterations)
}()

func (p *plainMech) step(in []byte) ([]byte, bool, error) {
	parts := bytes.Split(in, []byte{0})
	if len(parts) != 3 || len(parts[1]) == 0 || len(parts[2]) == 0 {
		return nil, false, errors.New("malformed PLAIN token")
	}
	authz, user, pass := string(parts[0]), string(parts[1]), string(parts[2])
	if authz != "" && authz != user {
		// Apache's PlainSaslServer: an authorization id must be the authenticated user.
		return nil, false, errors.New("PLAIN authorization id differs from the user")
	}
	var c credentials.Credential
	var err error
	for _, m := range []credentials.Mechanism{credentials.SHA512, credentials.SHA256} {
		if c, err = p.s.lookupCredential(user, m); err == nil {
			break
		}
	}
	if err != nil {
		dummyCredential.VerifyPassword(pass)
		return nil, false, fmt.Errorf("PLAIN user %q: %w", user, err)
	}
	if !c.VerifyPassword(pass) {
		return nil, false, fmt.Errorf("PLAIN user %q: %w", user, errBadCredentials)
	}
	p.name = user
	return []byte{}, true, nil
}

func (p *plainMech) user() string { return p.name }

// scramMech is one xdg-go/scram server conversation, plus the one leniency Apache has that
// xdg-go has not. librdkafka (kcat, confluent-kafka-*) builds its client-final nonce as its own
// nonce followed by the whole server nonce, which already starts with its own nonce; Apache's
// ScramSaslServer only checks that the final nonce ends with the server nonce, so those clients
// work against Apache. xdg-go requires the exact nonce (RFC 5802 §5.1). For that case alone the
// proof is checked here with the RFC's formulas over the AuthMessage the client signed
// (ClientKey = proof XOR HMAC(StoredKey, AuthMessage), then H(ClientKey) == StoredKey in constant
// time); every other message goes through xdg-go.
type scramMech struct {
	m     credentials.Mechanism
	conv  *scram.ServerConversation
	cred  credentials.Credential // as the lookup found it
	steps int
	gs2   string // client-first gs2 header ("n,,")
	c1b   string // client-first-message-bare
	s1    string // server-first-message
	nonce string // the server nonce (client nonce + ours)
	name  string
}

func (s *Server) newSCRAM(m credentials.Mechanism) saslMech {
	sm := &scramMech{m: m}
	srv, err := m.HashGen().NewServer(func(user string) (scram.StoredCredentials, error) {
		c, err := s.lookupCredential(user, m)
		if err != nil {
			return scram.StoredCredentials{}, fmt.Errorf("SCRAM user %q: %w", user, err)
		}
		sm.cred = c
		return c.Stored(), nil
	})
	if err != nil {
		panic(fmt.Sprintf("BUG: cannot build SCRAM server: %v", err))
	}
	sm.conv = srv.NewConversation()
	return sm
}

func (m *scramMech) step(in []byte) ([]byte, bool, error) {
	m.steps++
	msg := string(in)
	if m.steps == 2 && m.nonce != "" {
		if r := scramAttr(msg, 'r'); r != m.nonce && len(r) > len(m.nonce) && strings.HasSuffix(r, m.nonce) {
			return m.finalLenient(msg)
		}
	}
	out, err := m.conv.Step(msg)
	if err != nil {
		return nil, false, err
	}
	if m.steps == 1 {
		// gs2-header = cbind-flag "," [authzid] ","; what follows is client-first-message-bare.
		if i := strings.IndexByte(msg, ','); i >= 0 {
			if j := strings.IndexByte(msg[i+1:], ','); j >= 0 {
				m.gs2, m.c1b = msg[:i+j+2], msg[i+j+2:]
			}
		}
		m.s1, m.nonce = out, scramAttr(out, 'r')
	}
	if m.conv.Done() {
		if !m.conv.Valid() {
			return nil, false, errBadCredentials
		}
		m.name = m.conv.Username()
		return []byte(out), true, nil
	}
	return []byte(out), false, nil
}

// finalLenient verifies a client-final-message whose nonce ends with, but is longer than, the
// server nonce (see scramMech).
func (m *scramMech) finalLenient(c2 string) ([]byte, bool, error) {
	cut := strings.LastIndex(c2, ",p=")
	if cut < 0 || m.c1b == "" || scramAttr(c2, 'c') != base64.StdEncoding.EncodeToString([]byte(m.gs2)) {
		return nil, false, errors.New("malformed SCRAM client-final-message")
	}
	proof, err := base64.StdEncoding.DecodeString(c2[cut+3:])
	if err != nil || len(proof) != len(m.cred.StoredKey) {
		return nil, false, errors.New("malformed SCRAM proof")
	}
	authMsg := []byte(m.c1b + "," + m.s1 + "," + c2[:cut])
	h := m.m.HashGen()
	mac := hmac.New(h, m.cred.StoredKey)
	mac.Write(authMsg)
	sig := mac.Sum(nil)
	clientKey := make([]byte, len(proof))
	for i := range proof {
		clientKey[i] = proof[i] ^ sig[i]
	}
	sum := h()
	sum.Write(clientKey)
	if !hmac.Equal(sum.Sum(nil), m.cred.StoredKey) {
		return nil, false, errBadCredentials
	}
	mac = hmac.New(h, m.cred.ServerKey)
	mac.Write(authMsg)
	m.name = m.conv.Username()
	return []byte("v=" + base64.StdEncoding.EncodeToString(mac.Sum(nil))), true, nil
}

// scramAttr returns the value of attribute a ("a=value") of a SCRAM message.
func scramAttr(msg string, a byte) string {
	for _, f := range strings.Split(msg, ",") {
		if len(f) >= 2 && f[0] == a && f[1] == '=' {
			return f[2:]
		}
	}
	return ""
}

func (m *scramMech) user() string { return m.name }

// saslAllowed is the gate Server.handle runs before dispatching a request on a SASL listener;
// false closes the connection (Apache: InvalidRequestException / IllegalSaslStateException in
// SaslServerAuthenticator, or an expired session in Selector).
func (c *conn) saslAllowed(key int16) bool {
	a := c.auth
	switch a.step {
	case saslAwaitHandshake:
		if key == int16(kmsg.ApiVersions) || key == int16(kmsg.SASLHandshake) {
			return true
		}
		mSASLPreAuthRequests.Inc()
		c.log.Warn("closing connection: request before SASL authentication", zap.String("api", kmsg.NameForKey(key)))
		return false
	case saslAwaitAuthenticate:
		if key == int16(kmsg.SASLAuthenticate) {
			return true
		}
		mSASLPreAuthRequests.Inc()
		c.log.Warn("closing connection: request during SASL authentication", zap.String("api", kmsg.NameForKey(key)))
		return false
	case saslAuthenticated:
		if !a.expiry.IsZero() && time.Now().After(a.expiry) {
			mSASLExpiredCloses.Inc()
			c.log.Info("closing connection: SASL session expired without re-authentication (connections.max.reauth.ms)",
				zap.String("principal", a.principal))
			return false
		}
		return true
	}
	return false
}

func init() {
	register(kmsg.SASLHandshake, 0, 1, handleSaslHandshake)
	register(kmsg.SASLAuthenticate, 0, 2, handleSaslAuthenticate)
}

func handleSaslHandshake(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.SASLHandshakeRequest)
	resp := req.ResponseKind().(*kmsg.SASLHandshakeResponse)
	c := rc.c
	a := c.auth
	if a == nil {
		// Apache's KafkaApis on a listener without SASL.
		resp.ErrorCode = codec.CodeIllegalSaslState
		return resp, nil
	}
	resp.SupportedMechanisms = c.ln.mechs
	switch a.step {
	case saslAwaitHandshake:
	case saslAuthenticated:
		// KIP-368: a re-authentication starts with a v1 handshake, on a session that was
		// authenticated with SaslAuthenticate v1+, with the same mechanism.
		if !a.reauthOK || req.Version < 1 {
			return nil, errors.New("SaslHandshake on an authenticated connection that cannot re-authenticate")
		}
		if req.Mechanism != a.mech {
			resp.ErrorCode = codec.CodeIllegalSaslState
			rc.closeAfter = true
			mSASLFailures.Inc()
			return resp, nil
		}
	default:
		return nil, errors.New("SaslHandshake in the middle of a SASL exchange")
	}
	if !contains(c.ln.mechs, req.Mechanism) {
		// Apache answers with the served mechanisms, then closes.
		resp.ErrorCode = codec.CodeUnsupportedSaslMechanism
		rc.closeAfter = true
		mSASLFailures.Inc()
		return resp, nil
	}
	a.mech = req.Mechanism
	a.conv = rc.s.newMech(req.Mechanism)
	if req.Version == 0 {
		// v0: the SASL tokens follow as raw size-prefixed frames, not SaslAuthenticate
		// requests. Set before the response goes out: the client sends them only after reading it.
		a.step = saslAwaitRawToken
		c.rawTokens.Store(true)
	} else {
		a.step = saslAwaitAuthenticate
	}
	return resp, nil
}

const saslFailedMessage = "Authentication failed: invalid credentials with SASL mechanism "

func handleSaslAuthenticate(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.SASLAuthenticateRequest)
	resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
	c := rc.c
	a := c.auth
	if a == nil || a.step == saslAuthenticated {
		resp.ErrorCode = codec.CodeIllegalSaslState
		msg := "SaslAuthenticate is not expected now: authenticate with SaslHandshake first, on a SASL listener"
		resp.ErrorMessage = &msg
		return resp, nil
	}
	if a.step != saslAwaitAuthenticate {
		return nil, errors.New("SaslAuthenticate out of order")
	}
	out, done, err := c.saslStep(req.SASLAuthBytes)
	if err != nil {
		resp.ErrorCode = codec.CodeSaslAuthenticationFailed
		msg := saslFailedMessage + a.mech
		resp.ErrorMessage = &msg
		rc.closeAfter = true
		return resp, nil
	}
	resp.SASLAuthBytes = out
	if done {
		if req.Version >= 1 {
			a.reauthOK = true
			if lt := rc.s.cfg.ConnMaxReauth; lt > 0 {
				resp.SessionLifetimeMillis = lt.Milliseconds()
			}
		}
	}
	return resp, nil
}

// saslStep runs one mechanism step for SaslAuthenticate or a raw v0 token and, when the exchange
// completes, authenticates the connection. An error has been logged and counted.
func (c *conn) saslStep(in []byte) ([]byte, bool, error) {
	a := c.auth
	if len(in) > int(c.s.cfg.SASLMaxReceive) {
		mSASLOversized.Inc()
		mSASLFailures.Inc()
		c.log.Warn("SASL token over sasl.server.max.receive.size", zap.Int("size", len(in)))
		a.step = saslAwaitHandshake
		return nil, false, errBadCredentials
	}
	out, done, err := a.conv.step(in)
	if err == nil && done {
		p := "User:" + a.conv.user()
		if a.principal != "" && a.principal != p {
			err = errors.New("re-authentication may not change the principal")
		} else {
			a.step, a.principal = saslAuthenticated, p
			if lt := c.s.cfg.ConnMaxReauth; lt > 0 {
				a.expiry = time.Now().Add(lt)
			}
			c.setPrincipal(p)
			c.authed.Store(true)
			c.rawTokens.Store(false)
			mSASLAuthentications.Inc()
			return out, true, nil
		}
	}
	if err != nil {
		mSASLFailures.Inc()
		c.log.Info("SASL authentication failed", zap.String("mechanism", a.mech), zap.Error(err))
		a.step = saslAwaitHandshake
		return nil, false, err
	}
	return out, false, nil
}

// saslRawToken serves one raw token frame after a v0 handshake: the reply is a raw size-prefixed
// token (possibly empty, as Apache sends for PLAIN). A failure cannot be answered in this framing,
// so the connection is closed.
func (s *Server) saslRawToken(r *request) {
	c := r.c
	out, _, err := c.saslStep(r.frame.B)
	if err != nil {
		c.closeWith("SASL authentication failed (SaslHandshake v0)")
		r.release()
		return
	}
	b := codec.ResponsePool.Get()
	b.B = binary.BigEndian.AppendUint32(b.B[:0], uint32(len(out)))
	b.B = append(b.B, out...)
	c.complete(r, b)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
