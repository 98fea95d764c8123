package configs

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// The sample file documents every key and parses to the built-in defaults.
func TestSamplePropertiesCoverEveryKey(t *testing.T) {
	f, err := os.Open("kaas.properties")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := Default()
	if err := c.ParseProperties(f, "kaas.properties"); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	def := Default()
	if strings.Join(c.Keys(), "\n") != strings.Join(def.Keys(), "\n") {
		t.Fatalf("sample file differs from defaults:\n%v\nvs\n%v", c.Keys(), def.Keys())
	}
	data, _ := os.ReadFile("kaas.properties")
	for _, e := range def.entries() {
		if !strings.Contains(string(data), "\n"+e.key+"=") {
			t.Errorf("key %s is not documented in kaas.properties", e.key)
		}
	}
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/k.properties"
	if err := os.WriteFile(file, []byte("data.dir=/from-file\nnum.partitions=3\nbroker.id=4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KAAS_NUM_PARTITIONS": "5", "KAAS_BROKER_ID": "6"}
	c, err := Load([]string{"--config=" + file, "--broker.id=7", "--group.initial.rebalance.delay.ms=0"},
		func(k string) string { return env[k] }, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/from-file" || c.NumPartitions != 5 || c.BrokerID != 7 || c.GroupInitialRebalanceDelay != 0 {
		t.Fatalf("precedence wrong: %+v", c)
	}
	if c.TransactionMaxTimeout != 15*time.Minute {
		t.Fatal("default lost")
	}
}

func TestRejectsBadConfig(t *testing.T) {
	f := func(args ...string) {
		t.Helper()
		if _, err := Load(args, func(string) string { return "" }, devNull{}); err == nil {
			t.Fatalf("%v accepted", args)
		}
	}
	f("--num.partitions=0")
	f("--broker.id=x")
	f("--log.message.timestamp.type=Now")
	f("--transaction.version=3")
	f("--transaction.coordinator.workers=0")
	f("--transaction.coordinator.workers=51")
	f("stray")
	c := Default()
	if err := c.Set("no.such.key", "1"); err == nil {
		t.Fatal("unknown key accepted")
	}
	if err := c.Set("log.dirs", "/x"); err != nil || c.DataDir != "/x" {
		t.Fatal("alias log.dirs")
	}
}

type devNull struct{}

func (devNull) Write(p []byte) (int, error) { return len(p), nil }

// TestConnMaxOutboundBytesMustHoldFetches guards the slow-consumer cap against a value that
// would close a consumer reading at full speed (one maximal Fetch response plus the next).
func TestConnMaxOutboundBytesMustHoldFetches(t *testing.T) {
	c := Default()
	c.ConnMaxOutboundBytes = int64(c.FetchMaxBytes)
	if err := c.Validate(); err == nil {
		t.Fatal("connection.max.outbound.bytes == fetch.max.bytes accepted")
	}
	c.ConnMaxOutboundBytes = 2 * int64(c.FetchMaxBytes)
	if err := c.Validate(); err != nil {
		t.Fatalf("2 × fetch.max.bytes refused: %v", err)
	}
	if d := Default(); d.ConnMaxOutboundBytes < 4*int64(d.FetchMaxBytes) {
		t.Fatalf("default cap %d holds fewer than four default fetch responses", d.ConnMaxOutboundBytes)
	}
}

func TestListeners(t *testing.T) {
	f := func(listeners, protoMap string, want ...Listener) {
		t.Helper()
		c := Default()
		c.Listeners = listeners
		if protoMap != "" {
			c.ListenerProtocolMap = protoMap
		}
		got, err := c.ParseListeners()
		if err != nil {
			t.Fatalf("%s: %v", listeners, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: %v, want %v", listeners, got, want)
		}
	}
	f("127.0.0.1:9092", "", Listener{"PLAINTEXT", ProtoPlaintext, "127.0.0.1", 9092})
	f("PLAINTEXT://:9092, sasl_ssl://0.0.0.0:9093", "",
		Listener{"PLAINTEXT", ProtoPlaintext, "", 9092}, Listener{"SASL_SSL", ProtoSASLSSL, "0.0.0.0", 9093})
	f("INTERNAL://127.0.0.1:1,EXTERNAL://[::1]:2", "INTERNAL:SSL,EXTERNAL:SASL_PLAINTEXT",
		Listener{"INTERNAL", ProtoSSL, "127.0.0.1", 1}, Listener{"EXTERNAL", ProtoSASLPlaintext, "::1", 2})

	bad := func(mut func(c *Config)) {
		t.Helper()
		c := Default()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Fatalf("accepted: %+v", c.Security)
		}
	}
	bad(func(c *Config) { c.Listeners = "FOO://127.0.0.1:1" })
	bad(func(c *Config) { c.Listeners = "PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2" })
	bad(func(c *Config) { c.Listeners = "SSL://127.0.0.1:1" }) // no keystore
	bad(func(c *Config) { c.AdvertisedListeners = "SSL://h:1" })
	bad(func(c *Config) { c.InterBrokerListener = "SSL" })
	bad(func(c *Config) {
		c.Listeners, c.SSLKeystoreLocation, c.SSLClientAuth = "SSL://127.0.0.1:1", "/k.pem", "required"
	})
	bad(func(c *Config) {
		c.Listeners, c.SSLKeystoreLocation, c.SSLEnabledProtocols = "SSL://127.0.0.1:1", "/k.pem", "TLSv1.1"
	})
	bad(func(c *Config) { c.Listeners, c.SASLMechanisms = "SASL_PLAINTEXT://127.0.0.1:1", "GSSAPI" })
	bad(func(c *Config) { c.SCRAMMinIteration = 1000 })
	d := Default()
	if err := d.Set("listener.name.x.no.such", "1"); err == nil {
		t.Fatal("unknown listener override accepted")
	}
}

// TestListenerOverridesAndSecrets: listener.name.<name>.<key> wins for that listener only, and
// secrets never appear in Keys (logged at start, described by DescribeConfigs).
func TestListenerOverridesAndSecrets(t *testing.T) {
	c := Default()
	for k, v := range map[string]string{
		"listeners":                                      "PLAINTEXT://127.0.0.1:1,SASL_SSL://127.0.0.1:2",
		"ssl.keystore.certificate.chain":                 "CHAIN",
		"ssl.keystore.key":                               "SECRET-KEY",
		"listener.name.SASL_SSL.ssl.client.auth":         "requested",
		"listener.name.sasl_ssl.ssl.truststore.location": "/ca.pem",
		"listener.name.sasl_ssl.ssl.keystore.key":        "OTHER-SECRET",
		"listener.name.sasl_ssl.sasl.enabled.mechanisms": "plain",
	} {
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.ListenerValue("SASL_SSL", "ssl.client.auth") != "requested" || c.ListenerValue("PLAINTEXT", "ssl.client.auth") != "none" {
		t.Fatal("override not per listener")
	}
	if m := c.SASLMechanismList("SASL_SSL"); len(m) != 1 || m[0] != "PLAIN" {
		t.Fatalf("mechanisms %v", m)
	}
	keys := strings.Join(c.Keys(), "\n")
	if strings.Contains(keys, "SECRET") || !strings.Contains(keys, "ssl.keystore.key="+Hidden) ||
		!strings.Contains(keys, "listener.name.sasl_ssl.ssl.keystore.key="+Hidden) {
		t.Fatalf("secrets in Keys:\n%s", keys)
	}
	if c.InterBrokerListenerName() != "PLAINTEXT" {
		t.Fatal(c.InterBrokerListenerName())
	}
}

// TestInterBrokerLoginAsApacheWritesIt: security.inter.broker.protocol names the inter-broker
// listener, sasl.mechanism.inter.broker.protocol its mechanism, and the broker's login is
// listener.name.<listener>.<mechanism>.sasl.jaas.config, spread over lines with backslashes as
// a server.properties usually has it; the password is never shown.
func TestInterBrokerLoginAsApacheWritesIt(t *testing.T) {
	c := Default()
	props := `listeners=PLAINTEXT://127.0.0.1:1,SASL_PLAINTEXT://127.0.0.1:2
cluster.etcd.endpoints=http://127.0.0.1:2379
security.inter.broker.protocol=SASL_PLAINTEXT
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.SASL_PLAINTEXT.SCRAM-SHA-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="broker" \
    password="s3cret";
`
	if err := c.ParseProperties(strings.NewReader(props), "server.properties"); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	l, err := c.InterBroker()
	if err != nil {
		t.Fatal(err)
	}
	want := InterBrokerLogin{Listener: "SASL_PLAINTEXT", Protocol: ProtoSASLPlaintext, Mechanism: "SCRAM-SHA-512", Username: "broker", Password: "s3cret"}
	if l != want {
		t.Fatalf("login %+v, want %+v", l, want)
	}
	if keys := strings.Join(c.Keys(), "\n"); strings.Contains(keys, "s3cr") ||
		!strings.Contains(keys, "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config="+Hidden) {
		t.Fatalf("the JAAS login shows in Keys:\n%s", keys)
	}
	if !IsSensitive("listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config") {
		t.Fatal("a JAAS login is not sensitive")
	}
}

// TestInterBrokerLoginRefusedWithTheKeyNamed: a cluster broker whose SASL inter-broker listener
// lacks a usable login does not validate, and the error names what to set.
func TestInterBrokerLoginRefusedWithTheKeyNamed(t *testing.T) {
	const jaas = "listener.name.internal.plain.sasl.jaas.config"
	base := map[string]string{
		"listeners":                            "PLAINTEXT://127.0.0.1:1,INTERNAL://127.0.0.1:2",
		"listener.security.protocol.map":       "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_PLAINTEXT",
		"inter.broker.listener.name":           "INTERNAL",
		"cluster.etcd.endpoints":               "http://127.0.0.1:2379",
		"sasl.enabled.mechanisms":              "PLAIN,SCRAM-SHA-256",
		"sasl.mechanism.inter.broker.protocol": "PLAIN",
	}
	for _, tc := range []struct {
		name, want string
		set        map[string]string
	}{
		{"no login", jaas, nil},
		{"mechanism left at Apache's default", "sasl.mechanism.inter.broker.protocol", map[string]string{"sasl.mechanism.inter.broker.protocol": "GSSAPI"}},
		{"mechanism not enabled", "sasl.enabled.mechanisms", map[string]string{"sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512"}},
		{"no password", jaas, map[string]string{jaas: `org.apache.kafka.common.security.plain.PlainLoginModule required username="b";`}},
		{"wrong module", jaas, map[string]string{jaas: `org.apache.kafka.common.security.scram.ScramLoginModule required username="b" password="p";`}},
		{"no semicolon", jaas, map[string]string{jaas: `org.apache.kafka.common.security.plain.PlainLoginModule required username="b" password="p"`}},
		{"two modules", jaas, map[string]string{jaas: `org.apache.kafka.common.security.plain.PlainLoginModule required username="b" password="p"; x required;`}},
		{"both inter-broker keys", "not both", map[string]string{"security.inter.broker.protocol": "SASL_PLAINTEXT"}},
	} {
		c := Default()
		for _, m := range []map[string]string{base, tc.set} {
			for k, v := range m {
				if err := c.Set(k, v); err != nil {
					t.Fatal(err)
				}
			}
		}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	// The same settings with a login validate; a single broker never dials a peer and needs none.
	c := Default()
	for k, v := range base {
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Set(jaas, `org.apache.kafka.common.security.plain.PlainLoginModule required username="b" password="p" user_b="p";`); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("with a login: %v", err)
	}
	delete(c.ListenerOverrides, jaas)
	c.Cluster.EtcdEndpoints = ""
	if err := c.Validate(); err != nil {
		t.Fatalf("single broker without an inter-broker login: %v", err)
	}
}
