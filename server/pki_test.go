package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testPKI is a certificate authority generated for one test: keys live in memory and in the
// test's temp dir only, never in the repository.
type testPKI struct {
	t      testing.TB
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	serial int64
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kaas test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	return &testPKI{t: t, ca: ca, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), serial: 1}
}

// issue signs a leaf certificate for subject; a server certificate is valid for 127.0.0.1.
func (p *testPKI) issue(subject pkix.Name, server bool) (certPEM, keyPEM []byte) {
	p.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		// A broker's keystore is also its client certificate towards the other brokers.
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		p.t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// writeKeystore writes a PEM keystore (chain + key, ssl.keystore.location's format) for a
// server certificate named cn, and the CA as a truststore; it returns both paths.
func (p *testPKI) writeKeystore(dir, cn string) (keystore, truststore string) {
	p.t.Helper()
	cert, key := p.issue(pkix.Name{CommonName: cn}, true)
	keystore = filepath.Join(dir, "broker.pem")
	truststore = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(keystore, append(cert, key...), 0o600); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(truststore, p.caPEM, 0o644); err != nil {
		p.t.Fatal(err)
	}
	return keystore, truststore
}

// clientTLS is a client config trusting the CA, with an optional client certificate.
func (p *testPKI) clientTLS(client *pkix.Name) *tls.Config {
	p.t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	c := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if client != nil {
		cert, key := p.issue(*client, false)
		kp, err := tls.X509KeyPair(cert, key)
		if err != nil {
			p.t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c
}

func pkixName(cn string) pkix.Name { return pkix.Name{CommonName: cn} }
