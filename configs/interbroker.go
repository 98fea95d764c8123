package configs

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The broker's side as a client of the other brokers (cluster mode): which listener it dials,
// with which security protocol, and, on a SASL listener, which mechanism and which login. The
// names are Apache's:
//
//   - inter.broker.listener.name, or security.inter.broker.protocol (the listener of that
//     name), never both; the listener's protocol comes from listener.security.protocol.map;
//   - sasl.mechanism.inter.broker.protocol, which must be one of the listener's
//     sasl.enabled.mechanisms (Apache refuses to start otherwise);
//   - the login itself is listener.name.<listener>.<mechanism>.sasl.jaas.config (listener and
//     mechanism lower-case), one login module whose username and password options are what the
//     broker authenticates with, as Apache's broker reads the KafkaServer JAAS section for its
//     inter-broker client.
//
// Apache refuses a broker whose inter-broker login is missing when it starts; so does kaas
// (Validate in cluster mode), naming the key, instead of failing every request to a peer.

// jaasKey is the suffix of a listener- and mechanism-prefixed JAAS login.
const jaasKey = "sasl.jaas.config"

// JAASKey is the config key of the JAAS login of mechanism on listener.
func JAASKey(listener, mechanism string) string {
	return listenerPrefix + strings.ToLower(listener) + "." + strings.ToLower(mechanism) + "." + jaasKey
}

// InterBrokerLogin is how this broker connects to its peers.
type InterBrokerLogin struct {
	Listener  string // the inter-broker listener's name
	Protocol  string // its security protocol (Proto*)
	Mechanism string // the SASL mechanism (upper-case); "" unless Protocol is SASL_*
	Username  string
	Password  string
}

// InterBroker returns this broker's inter-broker login, or an error naming the key that is
// missing or wrong.
func (c *Config) InterBroker() (InterBrokerLogin, error) {
	ls, err := c.ParseListeners()
	if err != nil {
		return InterBrokerLogin{}, err
	}
	name := c.InterBrokerListenerName()
	var l *Listener
	for i := range ls {
		if ls[i].Name == name {
			l = &ls[i]
		}
	}
	if l == nil {
		key := "inter.broker.listener.name"
		if c.InterBrokerListener == "" {
			key = "security.inter.broker.protocol"
		}
		return InterBrokerLogin{}, fmt.Errorf("%s: no listener is named %s", key, name)
	}
	out := InterBrokerLogin{Listener: l.Name, Protocol: l.Protocol}
	if !l.SASL() {
		return out, nil
	}
	mech := strings.ToUpper(strings.TrimSpace(c.InterBrokerSASL))
	if !slices.Contains(SupportedSASLMechanisms, mech) {
		return InterBrokerLogin{}, fmt.Errorf("sasl.mechanism.inter.broker.protocol=%s: the inter-broker listener %s is %s and kaas logs in with PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", c.InterBrokerSASL, l.Name, l.Protocol)
	}
	if !slices.Contains(c.SASLMechanismList(l.Name), mech) {
		return InterBrokerLogin{}, fmt.Errorf("sasl.mechanism.inter.broker.protocol=%s is not in the sasl.enabled.mechanisms of the inter-broker listener %s", mech, l.Name)
	}
	key := JAASKey(l.Name, mech)
	v, ok := c.ListenerOverrides[key]
	if !ok || strings.TrimSpace(v) == "" {
		return InterBrokerLogin{}, fmt.Errorf("%s is not set: the inter-broker listener %s is %s with %s, and this broker needs its own username and password to reach the others", key, l.Name, l.Protocol, mech)
	}
	jc, err := ParseJAAS(v)
	if err != nil {
		return InterBrokerLogin{}, fmt.Errorf("%s: %w", key, err)
	}
	want := "org.apache.kafka.common.security.scram.ScramLoginModule"
	if mech == "PLAIN" {
		want = "org.apache.kafka.common.security.plain.PlainLoginModule"
	}
	if jc.Module != want {
		return InterBrokerLogin{}, fmt.Errorf("%s: login module %s, want %s for %s", key, jc.Module, want, mech)
	}
	out.Mechanism, out.Username, out.Password = mech, jc.Options["username"], jc.Options["password"]
	if out.Username == "" || out.Password == "" {
		return InterBrokerLogin{}, fmt.Errorf("%s: the login needs username=\"...\" and password=\"...\"", key)
	}
	return out, nil
}

// validateInterBroker checks the inter-broker settings; the login is checked in cluster mode
// only, where brokers actually dial each other.
func (c *Config) validateInterBroker(ls []Listener) []error {
	var errs []error
	if c.InterBrokerListener != "" && c.InterBrokerProtocol != "" {
		// Apache's KafkaConfig refuses the same.
		errs = append(errs, errors.New("set inter.broker.listener.name or security.inter.broker.protocol, not both"))
	}
	if p := strings.ToUpper(strings.TrimSpace(c.InterBrokerProtocol)); p != "" {
		switch p {
		case ProtoPlaintext, ProtoSSL, ProtoSASLPlaintext, ProtoSASLSSL:
			if !slices.ContainsFunc(ls, func(l Listener) bool { return l.Name == p }) {
				errs = append(errs, fmt.Errorf("security.inter.broker.protocol=%s: no listener is named %s", p, p))
			}
		default:
			errs = append(errs, fmt.Errorf("security.inter.broker.protocol=%s is not a security protocol", c.InterBrokerProtocol))
		}
	}
	if len(errs) == 0 && c.ClusterMode() {
		if _, err := c.InterBroker(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// JAASConfig is one parsed sasl.jaas.config value.
type JAASConfig struct {
	Module  string // the login module class
	Flag    string // required | requisite | sufficient | optional (lower-case)
	Options map[string]string
}

// ParseJAAS parses a sasl.jaas.config value: exactly one
//
//	<LoginModuleClass> <ControlFlag> *(<name>=<value>) ;
//
// where a value is a word or a "double-quoted" string with backslash escapes, as Apache's
// JaasConfig reads it (and it, too, takes one login module only in this property).
func ParseJAAS(s string) (JAASConfig, error) {
	toks, err := jaasTokens(s)
	if err != nil {
		return JAASConfig{}, err
	}
	var jc JAASConfig
	if len(toks) < 3 || toks[0].kind != tokWord || toks[1].kind != tokWord {
		return jc, errors.New("want <LoginModuleClass> <ControlFlag> name=\"value\" ... ;")
	}
	jc.Module, jc.Flag = toks[0].text, strings.ToLower(toks[1].text)
	switch jc.Flag {
	case "required", "requisite", "sufficient", "optional":
	default:
		return jc, fmt.Errorf("control flag %q (want required, requisite, sufficient or optional)", toks[1].text)
	}
	jc.Options = map[string]string{}
	i := 2
	for ; i < len(toks) && toks[i].kind != tokSemi; i += 3 {
		if i+2 >= len(toks) || toks[i].kind != tokWord || toks[i+1].kind != tokEq || toks[i+2].kind == tokSemi || toks[i+2].kind == tokEq {
			return jc, fmt.Errorf("option %d of %s: want name=value", (i-2)/3+1, jc.Module)
		}
		jc.Options[toks[i].text] = toks[i+2].text
	}
	if i >= len(toks) {
		return jc, errors.New("the login module does not end with ';'")
	}
	if i != len(toks)-1 {
		return jc, errors.New("more than one login module (the property takes one)")
	}
	return jc, nil
}

type jaasTokKind int8

const (
	tokWord jaasTokKind = iota
	tokQuoted
	tokEq
	tokSemi
)

type jaasTok struct {
	kind jaasTokKind
	text string
}

func jaasTokens(s string) ([]jaasTok, error) {
	var out []jaasTok
	for i := 0; i < len(s); {
		switch ch := s[i]; {
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f':
			i++
		case ch == '=':
			out = append(out, jaasTok{kind: tokEq})
			i++
		case ch == ';':
			out = append(out, jaasTok{kind: tokSemi})
			i++
		case ch == '"':
			var b strings.Builder
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					b.WriteByte(s[i+1])
					i += 2
					continue
				}
				i++
				if c == '"' {
					closed = true
					break
				}
				b.WriteByte(c)
			}
			if !closed {
				return nil, errors.New("unterminated quoted value")
			}
			out = append(out, jaasTok{kind: tokQuoted, text: b.String()})
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n\r\f=;\"", rune(s[j])) {
				j++
			}
			out = append(out, jaasTok{kind: tokWord, text: s[i:j]})
			i = j
		}
	}
	return out, nil
}
