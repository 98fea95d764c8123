package server

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// finalizedFeatures asks a broker for ApiVersions v4 and returns transaction.version's finalized
// level and the FinalizedFeaturesEpoch.
func finalizedTxnVersion(t *testing.T, addr string) (level int16, epoch int64) {
	t.Helper()
	rc := dialRaw(t, addr)
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 4
	req.ClientSoftwareName, req.ClientSoftwareVersion = "kaas-test", "1.0"
	rc.send(req, 1)
	_, body, err := rc.recv()
	if err != nil {
		t.Fatal(err)
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 4
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "transaction.version" {
			return f.MaxVersionLevel, resp.FinalizedFeaturesEpoch
		}
	}
	t.Fatalf("transaction.version not finalized: %+v", resp.FinalizedFeatures)
	return 0, 0
}

// A change of transaction.version across a restart must raise FinalizedFeaturesEpoch (KIP-584:
// clients keep the finalized set with the highest epoch they have seen); a restart without a change
// keeps it.
func TestFinalizedFeaturesEpochGrowsWithTransactionVersion(t *testing.T) {
	cfg := testConfig(t)
	start := func(tv int16) (int16, int64) {
		c := cfg
		c.TransactionVersion = tv
		tb := startTestBroker(t, c)
		defer tb.stop(t)
		return finalizedTxnVersion(t, tb.srv.Addr().String())
	}
	l1, e1 := start(2)
	if l1 != 2 || e1 < 1 {
		t.Fatalf("first start: level %d epoch %d", l1, e1)
	}
	if l, e := start(2); l != 2 || e != e1 {
		t.Fatalf("unchanged restart: level %d epoch %d, want 2 and %d", l, e, e1)
	}
	l2, e2 := start(1)
	if l2 != 1 || e2 <= e1 {
		t.Fatalf("after TV2→TV1: level %d epoch %d, want 1 and > %d", l2, e2, e1)
	}
	if l, e := start(2); l != 2 || e <= e2 {
		t.Fatalf("after TV1→TV2: level %d epoch %d, want 2 and > %d", l, e, e2)
	}
}
