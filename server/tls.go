package server

// TLS configuration of an SSL / SASL_SSL listener, from Kafka's ssl.* keys (PEM only), with
// certificate reload and Apache's ssl.principal.mapping.rules.
//
// Reload: every new TLS connection asks configForClient for its tls.Config. At most once per
// tlsReloadInterval that stats ssl.keystore.location and ssl.truststore.location; when either
// file's mtime, size or inode changed it re-reads both and, if they parse, swaps the config in.
// Existing connections keep the certificate they were handshaken with, as in Apache's dynamic
// keystore update. A file that does not parse is logged and counted, and the last good
// configuration stays in force (an operator replacing the file half-way must not take the
// listener down). Inline PEM (ssl.keystore.certificate.chain / ssl.keystore.key) never changes.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/configs"
)

var tlsReloadInterval = time.Second

type tlsSource struct {
	log        *zap.Logger
	keyFile    string // "" = inline chain + key
	chain, key string
	trustFile  string
	trustPEM   string
	clientAuth tls.ClientAuthType
	minVer     uint16
	maxVer     uint16
	rules      []principalRule

	mu      sync.Mutex // serialises reloads
	checked time.Time
	stamps  [2]fileID
	current atomic.Pointer[tls.Config]
}

type fileID struct {
	mod  time.Time
	size int64
	ok   bool
}

func statID(path string) fileID {
	if path == "" {
		return fileID{}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}
	}
	return fileID{mod: fi.ModTime(), size: fi.Size(), ok: true}
}

func newTLSSource(cfg configs.Config, name string, log *zap.Logger) (*tlsSource, error) {
	v := func(k string) string { return cfg.ListenerValue(name, k) }
	t := &tlsSource{log: log, keyFile: v("ssl.keystore.location"), chain: v("ssl.keystore.certificate.chain"),
		key: v("ssl.keystore.key"), trustFile: v("ssl.truststore.location"), trustPEM: v("ssl.truststore.certificates")}
	switch strings.ToLower(v("ssl.client.auth")) {
	case "required":
		t.clientAuth = tls.RequireAndVerifyClientCert
	case "requested":
		t.clientAuth = tls.VerifyClientCertIfGiven
	default:
		t.clientAuth = tls.NoClientCert
	}
	t.minVer, t.maxVer = tls.VersionTLS13, tls.VersionTLS12
	for _, p := range strings.Split(v("ssl.enabled.protocols"), ",") {
		ver := uint16(tls.VersionTLS12)
		if strings.TrimSpace(p) == "TLSv1.3" {
			ver = tls.VersionTLS13
		}
		t.minVer, t.maxVer = min(t.minVer, ver), max(t.maxVer, ver)
	}
	rules, err := parsePrincipalRules(v("ssl.principal.mapping.rules"))
	if err != nil {
		return nil, err
	}
	t.rules = rules
	c, err := t.load()
	if err != nil {
		return nil, err
	}
	t.current.Store(c)
	t.stamps = [2]fileID{statID(t.keyFile), statID(t.trustFile)}
	t.checked = time.Now()
	return t, nil
}

// load reads the keystore and truststore into a tls.Config.
func (t *tlsSource) load() (*tls.Config, error) {
	chain, key := []byte(t.chain), []byte(t.key)
	if t.keyFile != "" {
		data, err := os.ReadFile(t.keyFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read ssl.keystore.location (%s): %w", t.keyFile, err)
		}
		chain, key = data, data
	}
	cert, err := tls.X509KeyPair(chain, key)
	if err != nil {
		return nil, fmt.Errorf("cannot load PEM keystore (chain + unencrypted private key): %w", err)
	}
	c := &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   t.clientAuth,
		MinVersion:   t.minVer,
		MaxVersion:   t.maxVer,
	}
	trust := []byte(t.trustPEM)
	if t.trustFile != "" {
		if trust, err = os.ReadFile(t.trustFile); err != nil {
			return nil, fmt.Errorf("cannot read ssl.truststore.location (%s): %w", t.trustFile, err)
		}
	}
	if len(trust) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(trust) {
			return nil, errors.New("cannot load PEM truststore: no certificate in it")
		}
		c.ClientCAs = pool
	}
	return c, nil
}

// configForClient is tls.Config.GetConfigForClient: the current config, reloaded first if the
// files changed.
func (t *tlsSource) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	t.mu.Lock()
	if time.Since(t.checked) >= tlsReloadInterval {
		t.checked = time.Now()
		now := [2]fileID{statID(t.keyFile), statID(t.trustFile)}
		if now != t.stamps {
			c, err := t.load()
			if err != nil {
				mTLSReloadFailures.Inc()
				t.log.Error("TLS keystore/truststore changed but does not load; keeping the previous one", zap.Error(err))
			} else {
				t.current.Store(c)
				mTLSReloads.Inc()
				t.log.Info("TLS keystore/truststore reloaded")
			}
			t.stamps = now
		}
	}
	t.mu.Unlock()
	return t.current.Load(), nil
}

// principal maps a client certificate's subject to a principal name.
func (t *tlsSource) principal(cert *x509.Certificate) (string, error) {
	return mapPrincipal(t.rules, cert.Subject.String())
}

// principalRule is one ssl.principal.mapping.rules entry (Apache's SslPrincipalMapper):
// RULE:pattern/replacement/[LU] or DEFAULT. A rule applies when pattern matches the whole
// subject; the subject is then rewritten with replacement, then lower- or upper-cased.
type principalRule struct {
	isDefault   bool
	whole       *regexp.Regexp // ^(?:pattern)$
	pattern     *regexp.Regexp
	replacement string
	caseFold    byte // 0, 'L' or 'U'
}

// parsePrincipalRules splits the rules list. Rules are separated by commas, but a pattern may
// contain commas (subjects are comma-separated), so the list is read rule by rule: after
// "RULE:" come pattern/replacement/ with \-escapes, then an optional L or U.
func parsePrincipalRules(s string) ([]principalRule, error) {
	var rules []principalRule
	s = strings.TrimSpace(s)
	for s != "" {
		s = strings.TrimLeft(s, " ,\t\n")
		if s == "" {
			break
		}
		switch {
		case strings.HasPrefix(s, "DEFAULT"):
			rules = append(rules, principalRule{isDefault: true})
			s = s[len("DEFAULT"):]
		case strings.HasPrefix(s, "RULE:"):
			s = s[len("RULE:"):]
			var parts [2]string
			for i := range parts {
				j, esc := 0, false
				for ; j < len(s); j++ {
					if esc {
						esc = false
						continue
					}
					if s[j] == '\\' {
						esc = true
					} else if s[j] == '/' {
						break
					}
				}
				if j >= len(s) {
					return nil, fmt.Errorf("ssl.principal.mapping.rules: unterminated RULE (want RULE:pattern/replacement/[LU])")
				}
				parts[i], s = s[:j], s[j+1:]
			}
			r := principalRule{replacement: javaReplacement(unescapeSlash(parts[1]))}
			if s != "" && (s[0] == 'L' || s[0] == 'U') {
				r.caseFold, s = s[0], s[1:]
			}
			pat := unescapeSlash(parts[0])
			var err error
			if r.pattern, err = regexp.Compile(pat); err != nil {
				return nil, fmt.Errorf("ssl.principal.mapping.rules: bad pattern %q: %w", pat, err)
			}
			r.whole = regexp.MustCompile("^(?:" + pat + ")$")
			rules = append(rules, r)
		default:
			return nil, fmt.Errorf("ssl.principal.mapping.rules: expected RULE: or DEFAULT at %q", s)
		}
		s = strings.TrimSpace(s)
		if s != "" && s[0] != ',' {
			return nil, fmt.Errorf("ssl.principal.mapping.rules: expected ',' at %q", s)
		}
	}
	if len(rules) == 0 {
		rules = append(rules, principalRule{isDefault: true})
	}
	return rules, nil
}

func unescapeSlash(s string) string { return strings.ReplaceAll(s, `\/`, "/") }

// javaReplacement turns Java's $1 group references into Go's ${1}, so "$1x" keeps meaning
// group 1 followed by x.
var javaGroupRef = regexp.MustCompile(`\$(\d)`)

func javaReplacement(s string) string { return javaGroupRef.ReplaceAllString(s, "$${$1}") }

// mapPrincipal applies the first matching rule; no match is an error (Apache refuses the
// connection: "No rules apply to ...").
func mapPrincipal(rules []principalRule, subject string) (string, error) {
	for _, r := range rules {
		if r.isDefault {
			return subject, nil
		}
		if !r.whole.MatchString(subject) {
			continue
		}
		out := r.pattern.ReplaceAllString(subject, r.replacement)
		switch r.caseFold {
		case 'L':
			out = strings.ToLower(out)
		case 'U':
			out = strings.ToUpper(out)
		}
		return out, nil
	}
	return "", fmt.Errorf("no ssl.principal.mapping.rules rule applies to %q", subject)
}
