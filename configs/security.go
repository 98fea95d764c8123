package configs

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Security holds the listener, TLS and SASL settings, under Apache Kafka's names so that a Kafka
// operator's server.properties works unchanged.
type Security struct {
	ListenerProtocolMap string // listener.security.protocol.map: NAME:PROTOCOL,...
	InterBrokerListener string // inter.broker.listener.name; empty = security.inter.broker.protocol, else the first listener
	InterBrokerProtocol string // security.inter.broker.protocol: names the listener of that name (Apache's older form)
	InterBrokerSASL     string // sasl.mechanism.inter.broker.protocol: the mechanism brokers log in to each other with

	SSLKeystoreType       string // ssl.keystore.type: only PEM
	SSLKeystoreLocation   string // ssl.keystore.location: PEM file holding the chain and the key
	SSLKeystoreChain      string // ssl.keystore.certificate.chain: inline PEM chain
	SSLKeystoreKey        string // ssl.keystore.key: inline PEM private key
	SSLTruststoreType     string // ssl.truststore.type: only PEM
	SSLTruststoreLocation string // ssl.truststore.location: PEM CA bundle for client certificates
	SSLTruststoreCerts    string // ssl.truststore.certificates: inline PEM CA bundle
	SSLClientAuth         string // ssl.client.auth: none | requested | required
	SSLPrincipalMapping   string // ssl.principal.mapping.rules
	SSLEnabledProtocols   string // ssl.enabled.protocols: TLSv1.2,TLSv1.3

	SASLMechanisms    string        // sasl.enabled.mechanisms
	SASLMaxReceive    int32         // sasl.server.max.receive.size: largest SASL token
	ConnMaxReauth     time.Duration // connections.max.reauth.ms (KIP-368); 0 = sessions never expire
	SCRAMMinIteration int           // kaas: smallest SCRAM iteration count accepted (Apache: 4096)

	// ListenerOverrides are the listener-prefixed settings, listener.name.<name>.<key> with the
	// name lower-cased (Kafka's form), e.g. listener.name.sasl_ssl.ssl.keystore.location.
	ListenerOverrides map[string]string
}

func defaultSecurity() Security {
	return Security{
		ListenerProtocolMap: "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
		SSLKeystoreType:     "PEM",
		SSLTruststoreType:   "PEM",
		SSLClientAuth:       "none",
		SSLPrincipalMapping: "DEFAULT",
		SSLEnabledProtocols: "TLSv1.2,TLSv1.3",
		// Apache's default is GSSAPI, which kaas does not serve. PLAIN sends the password itself,
		// so it is served only when listed here (and then belongs on SASL_SSL).
		SASLMechanisms:    "SCRAM-SHA-256,SCRAM-SHA-512",
		SASLMaxReceive:    524288, // Apache's sasl.server.max.receive.size
		SCRAMMinIteration: 4096,
		// Apache's default; kaas does not serve GSSAPI, so a SASL inter-broker listener in a
		// cluster has to name its mechanism (validateInterBroker says which key).
		InterBrokerSASL: "GSSAPI",
	}
}

func (c *Config) securityEntries() []entry {
	s := &c.Security
	return []entry{
		{"listener.security.protocol.map", kString, &s.ListenerProtocolMap, "listener name → security protocol, NAME:PROTOCOL,...", false},
		{"inter.broker.listener.name", kString, &s.InterBrokerListener, "listener brokers use to reach each other; empty = security.inter.broker.protocol, else the first listener", false},
		{"security.inter.broker.protocol", kString, &s.InterBrokerProtocol, "security protocol between brokers: the listener of that name (set this or inter.broker.listener.name, not both)", false},
		{"sasl.mechanism.inter.broker.protocol", kString, &s.InterBrokerSASL, "SASL mechanism brokers authenticate to each other with (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512); the broker's own login is listener.name.<listener>.<mechanism>.sasl.jaas.config", false},
		{"ssl.keystore.type", kString, &s.SSLKeystoreType, "PEM (the only type served)", false},
		{"ssl.keystore.location", kString, &s.SSLKeystoreLocation, "PEM file with the certificate chain and the private key; re-read when it changes", false},
		{"ssl.keystore.certificate.chain", kString, &s.SSLKeystoreChain, "inline PEM certificate chain (instead of ssl.keystore.location)", true},
		{"ssl.keystore.key", kString, &s.SSLKeystoreKey, "inline PEM private key (instead of ssl.keystore.location)", true},
		{"ssl.truststore.type", kString, &s.SSLTruststoreType, "PEM (the only type served)", false},
		{"ssl.truststore.location", kString, &s.SSLTruststoreLocation, "PEM CA bundle client certificates are verified against; re-read when it changes", false},
		{"ssl.truststore.certificates", kString, &s.SSLTruststoreCerts, "inline PEM CA bundle (instead of ssl.truststore.location)", false},
		{"ssl.client.auth", kString, &s.SSLClientAuth, "none | requested | required: ask TLS clients for a certificate", false},
		{"ssl.principal.mapping.rules", kString, &s.SSLPrincipalMapping, "RULE:pattern/replacement/[LU],...,DEFAULT mapping a certificate subject to a principal name", false},
		{"ssl.enabled.protocols", kString, &s.SSLEnabledProtocols, "TLS versions served: TLSv1.2 and/or TLSv1.3", false},
		{"sasl.enabled.mechanisms", kString, &s.SASLMechanisms, "SASL mechanisms served: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", false},
		{"sasl.server.max.receive.size", kInt32, &s.SASLMaxReceive, "largest SASL token accepted before authentication; larger closes the connection", false},
		{"connections.max.reauth.ms", kMillis, &s.ConnMaxReauth, "KIP-368 session lifetime of a SASL connection; 0 = never expires", false},
		{"sasl.scram.min.iterations", kInt, &s.SCRAMMinIteration, "smallest SCRAM iteration count accepted for a credential (>= 4096)", false},
	}
}

// sensitiveKeys are the settings whose values are secrets.
var sensitiveKeys = map[string]bool{"ssl.keystore.certificate.chain": true, "ssl.keystore.key": true}

// Hidden replaces a sensitive value wherever configuration is shown.
const Hidden = "[hidden]"

func redact(sensitive bool, v string) string {
	if sensitive && v != "" {
		return Hidden
	}
	return v
}

// IsSensitive reports whether key (possibly listener-prefixed) holds a secret. A JAAS login
// (listener.name.<l>.<mechanism>.sasl.jaas.config) holds the broker's password.
func IsSensitive(key string) bool {
	b := overrideBase(key)
	return sensitiveKeys[b] || strings.HasSuffix(b, "."+jaasKey)
}

const listenerPrefix = "listener.name."

// overridable are the keys a listener may override (Kafka's listener.name.<name>.<key>).
var overridable = map[string]bool{
	"ssl.keystore.type": true, "ssl.keystore.location": true, "ssl.keystore.certificate.chain": true,
	"ssl.keystore.key": true, "ssl.truststore.type": true, "ssl.truststore.location": true,
	"ssl.truststore.certificates": true, "ssl.client.auth": true, "ssl.principal.mapping.rules": true,
	"ssl.enabled.protocols": true, "sasl.enabled.mechanisms": true,
}

// overrideBase strips listener.name.<name>. from key.
func overrideBase(key string) string {
	if !strings.HasPrefix(key, listenerPrefix) {
		return key
	}
	rest := key[len(listenerPrefix):]
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		return rest[i+1:]
	}
	return rest
}

func (c *Config) setListenerOverride(key, value string) error {
	rest := key[len(listenerPrefix):]
	i := strings.IndexByte(rest, '.')
	if i > 0 {
		// listener.name.<l>.<mechanism>.sasl.jaas.config: the mechanism is kept lower-case, as
		// Apache looks it up.
		if mech, ok := strings.CutSuffix(rest[i+1:], "."+jaasKey); ok && mech != "" && !strings.Contains(mech, ".") {
			if c.ListenerOverrides == nil {
				c.ListenerOverrides = map[string]string{}
			}
			c.ListenerOverrides[listenerPrefix+strings.ToLower(rest[:i])+"."+strings.ToLower(mech)+"."+jaasKey] = strings.TrimSpace(value)
			return nil
		}
	}
	if i <= 0 || !overridable[rest[i+1:]] {
		return fmt.Errorf("unknown config key %q (listener overrides: listener.name.<name>.ssl.*, .sasl.enabled.mechanisms and .<mechanism>.sasl.jaas.config)", key)
	}
	if c.ListenerOverrides == nil {
		c.ListenerOverrides = map[string]string{}
	}
	c.ListenerOverrides[listenerPrefix+strings.ToLower(rest[:i])+"."+rest[i+1:]] = strings.TrimSpace(value)
	return nil
}

// Security protocols (Kafka's SecurityProtocol).
const (
	ProtoPlaintext     = "PLAINTEXT"
	ProtoSSL           = "SSL"
	ProtoSASLPlaintext = "SASL_PLAINTEXT"
	ProtoSASLSSL       = "SASL_SSL"
)

// Listener is one parsed entry of listeners.
type Listener struct {
	Name     string // upper-case, e.g. PLAINTEXT, SASL_SSL, INTERNAL
	Protocol string // one of the Proto* constants
	Host     string // "" binds every address
	Port     int
}

// Addr is the address to bind.
func (l Listener) Addr() string { return net.JoinHostPort(l.Host, strconv.Itoa(l.Port)) }

// TLS reports whether the listener speaks TLS.
func (l Listener) TLS() bool { return l.Protocol == ProtoSSL || l.Protocol == ProtoSASLSSL }

// SASL reports whether the listener requires SASL authentication.
func (l Listener) SASL() bool { return l.Protocol == ProtoSASLPlaintext || l.Protocol == ProtoSASLSSL }

// protocolMap parses listener.security.protocol.map.
func (c *Config) protocolMap() (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range splitList(c.ListenerProtocolMap) {
		name, proto, ok := strings.Cut(kv, ":")
		name, proto = strings.ToUpper(strings.TrimSpace(name)), strings.ToUpper(strings.TrimSpace(proto))
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("listener.security.protocol.map: bad entry %q (want NAME:PROTOCOL)", kv)
		case proto != ProtoPlaintext && proto != ProtoSSL && proto != ProtoSASLPlaintext && proto != ProtoSASLSSL:
			return nil, fmt.Errorf("listener.security.protocol.map: unknown security protocol %q", proto)
		}
		m[name] = proto
	}
	return m, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseEndpoints parses NAME://host:port,... (a bare host:port is PLAINTEXT, kaas's historical form).
func parseEndpoints(key, v string) ([]Listener, error) {
	var out []Listener
	seen := map[string]bool{}
	for _, e := range splitList(v) {
		name, hp := ProtoPlaintext, e
		if n, rest, ok := strings.Cut(e, "://"); ok {
			name, hp = strings.ToUpper(n), rest
		}
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			return nil, fmt.Errorf("%s: bad endpoint %q: %w", key, e, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || p > 65535 {
			return nil, fmt.Errorf("%s: bad port in %q", key, e)
		}
		if seen[name] {
			return nil, fmt.Errorf("%s: listener %s named twice", key, name)
		}
		seen[name] = true
		out = append(out, Listener{Name: name, Host: host, Port: p})
	}
	return out, nil
}

// ParseListeners returns the listeners to bind, with their security protocols.
func (c *Config) ParseListeners() ([]Listener, error) {
	ls, err := parseEndpoints("listeners", c.Listeners)
	if err != nil {
		return nil, err
	}
	if len(ls) == 0 {
		return nil, errors.New("listeners: at least one listener is needed")
	}
	pm, err := c.protocolMap()
	if err != nil {
		return nil, err
	}
	for i := range ls {
		p, ok := pm[ls[i].Name]
		if !ok {
			return nil, fmt.Errorf("listeners: listener %s is not in listener.security.protocol.map", ls[i].Name)
		}
		ls[i].Protocol = p
	}
	return ls, nil
}

// AdvertisedEndpoint returns the advertised host and port of the named listener, if
// advertised.listeners names it.
func (c *Config) AdvertisedEndpoint(listener string) (string, int, bool) {
	ads, err := parseEndpoints("advertised.listeners", c.AdvertisedListeners)
	if err != nil {
		return "", 0, false
	}
	for _, a := range ads {
		if a.Name == listener {
			return a.Host, a.Port, true
		}
	}
	return "", 0, false
}

// InterBrokerListenerName is the listener brokers use to reach each other: inter.broker.listener.name,
// else the listener named by security.inter.broker.protocol (Apache: ListenerName.forSecurityProtocol),
// else the first listener (Apache would take PLAINTEXT; kaas keeps its historical default).
func (c *Config) InterBrokerListenerName() string {
	if c.InterBrokerListener != "" {
		return strings.ToUpper(c.InterBrokerListener)
	}
	if c.InterBrokerProtocol != "" {
		return strings.ToUpper(strings.TrimSpace(c.InterBrokerProtocol))
	}
	ls, err := c.ParseListeners()
	if err != nil || len(ls) == 0 {
		return ProtoPlaintext
	}
	return ls[0].Name
}

// ListenerValue returns a setting as the named listener sees it: listener.name.<name>.<key> if
// set, else the broker-wide key.
func (c *Config) ListenerValue(listener, key string) string {
	if v, ok := c.ListenerOverrides[listenerPrefix+strings.ToLower(listener)+"."+key]; ok {
		return v
	}
	for _, e := range c.securityEntries() {
		if e.key == key {
			return e.String()
		}
	}
	return ""
}

// SASLMechanismList is sasl.enabled.mechanisms for the named listener, upper-cased.
func (c *Config) SASLMechanismList(listener string) []string {
	var out []string
	for _, m := range splitList(c.ListenerValue(listener, "sasl.enabled.mechanisms")) {
		out = append(out, strings.ToUpper(m))
	}
	return out
}

// SupportedSASLMechanisms are the mechanisms kaas serves.
var SupportedSASLMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}

func (c *Config) validateSecurity() []error {
	var errs []error
	ls, err := c.ParseListeners()
	if err != nil {
		return append(errs, err)
	}
	if _, err := parseEndpoints("advertised.listeners", c.AdvertisedListeners); err != nil {
		errs = append(errs, err)
	} else if ads, _ := parseEndpoints("advertised.listeners", c.AdvertisedListeners); len(ads) > 0 {
		names := map[string]bool{}
		for _, l := range ls {
			names[l.Name] = true
		}
		for _, a := range ads {
			if !names[a.Name] {
				errs = append(errs, fmt.Errorf("advertised.listeners: %s is not a listener", a.Name))
			}
		}
	}
	if c.InterBrokerListener != "" {
		found := false
		for _, l := range ls {
			found = found || l.Name == strings.ToUpper(c.InterBrokerListener)
		}
		if !found {
			errs = append(errs, fmt.Errorf("inter.broker.listener.name %s is not a listener", c.InterBrokerListener))
		}
	}
	errs = append(errs, c.validateInterBroker(ls)...)
	for _, l := range ls {
		v := func(k string) string { return c.ListenerValue(l.Name, k) }
		if l.TLS() {
			for _, k := range []string{"ssl.keystore.type", "ssl.truststore.type"} {
				if t := strings.ToUpper(v(k)); t != "PEM" {
					errs = append(errs, fmt.Errorf("listener %s: %s=%s: only PEM is served", l.Name, k, t))
				}
			}
			loc, chain, key := v("ssl.keystore.location"), v("ssl.keystore.certificate.chain"), v("ssl.keystore.key")
			switch {
			case loc == "" && (chain == "" || key == ""):
				errs = append(errs, fmt.Errorf("listener %s: TLS needs ssl.keystore.location or ssl.keystore.certificate.chain + ssl.keystore.key", l.Name))
			case loc != "" && (chain != "" || key != ""):
				errs = append(errs, fmt.Errorf("listener %s: set ssl.keystore.location or the inline keystore, not both", l.Name))
			}
			switch ca := strings.ToLower(v("ssl.client.auth")); ca {
			case "none", "requested", "required":
				if ca != "none" && v("ssl.truststore.location") == "" && v("ssl.truststore.certificates") == "" {
					errs = append(errs, fmt.Errorf("listener %s: ssl.client.auth=%s needs ssl.truststore.location", l.Name, ca))
				}
			default:
				errs = append(errs, fmt.Errorf("listener %s: ssl.client.auth must be none, requested or required", l.Name))
			}
			for _, p := range splitList(v("ssl.enabled.protocols")) {
				if p != "TLSv1.2" && p != "TLSv1.3" {
					errs = append(errs, fmt.Errorf("listener %s: ssl.enabled.protocols: %s is not served (TLSv1.2 and TLSv1.3 only)", l.Name, p))
				}
			}
			if len(splitList(v("ssl.enabled.protocols"))) == 0 {
				errs = append(errs, fmt.Errorf("listener %s: ssl.enabled.protocols is empty", l.Name))
			}
		}
		if l.SASL() {
			ms := c.SASLMechanismList(l.Name)
			if len(ms) == 0 {
				errs = append(errs, fmt.Errorf("listener %s: sasl.enabled.mechanisms is empty", l.Name))
			}
			for _, m := range ms {
				ok := false
				for _, s := range SupportedSASLMechanisms {
					ok = ok || s == m
				}
				if !ok {
					errs = append(errs, fmt.Errorf("listener %s: SASL mechanism %s is not served (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)", l.Name, m))
				}
			}
		}
	}
	if c.SASLMaxReceive < 64 {
		errs = append(errs, errors.New("sasl.server.max.receive.size must be >= 64"))
	}
	if c.ConnMaxReauth < 0 {
		errs = append(errs, errors.New("connections.max.reauth.ms must be >= 0"))
	}
	if c.SCRAMMinIteration < 4096 {
		errs = append(errs, errors.New("sasl.scram.min.iterations must be >= 4096 (Apache's minimum)"))
	}
	return errs
}
