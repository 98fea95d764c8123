package configs

import (
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
