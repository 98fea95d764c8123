package server

import (
	"net"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// A broker whose listener cannot bind (port taken) must fail with an error, release what it had
// opened (storage, coordinators) and leave the data dir reusable — not panic in its cleanup.
func TestStartBrokerPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig(t)
	cfg.Listeners = ln.Addr().String()
	b, err := StartBroker(cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), BrokerOptions{})
	if err == nil {
		b.Close()
		t.Fatal("StartBroker on a port in use succeeded")
	}
	if b != nil {
		t.Fatalf("StartBroker returned a broker with error %v", err)
	}
	// The operator must read the real cause (gnet's listener keepalive once masked it as
	// "setsockopt: bad file descriptor").
	if !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("error does not name the cause: %v", err)
	}
	// Everything was released: the same data dir opens again on a free port.
	cfg.Listeners = "127.0.0.1:0"
	tb := startTestBroker(t, cfg)
	tb.stop(t)
}
