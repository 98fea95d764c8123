package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportLayering enforces the design card: imports flow one way,
// cmd → server → coord → storage → codec, with configs importable by server and cmd only, gnet
// confined to server, and codec free of logging and metrics. codec's only third-party imports are
// kmsg, bytebufferpool and the record compression codecs (klauspost/compress, pierrec/lz4): a
// batch's records cannot be validated or recompressed without them (issue 12).
func TestImportLayering(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "github.com/kaas-go/kaas/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const mod = "github.com/kaas-go/kaas/"
	layer := func(pkg string) (string, int) {
		rel := strings.TrimPrefix(pkg, mod)
		top := strings.SplitN(rel, "/", 2)[0]
		switch top {
		case "codec":
			return top, 0
		case "storage":
			return top, 1
		case "coord":
			return top, 2
		case "server":
			return top, 3
		case "cmd":
			return top, 4
		case "configs":
			return top, -1
		case "bench":
			return top, 5
		}
		return top, 99
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		pkg, imports := f[0], f[1:]
		top, rank := layer(pkg)
		for _, imp := range imports {
			checked++
			switch {
			case strings.HasPrefix(imp, "github.com/panjf2000/gnet") && top != "server" && top != "cmd" && top != "bench":
				t.Errorf("%s imports gnet; only server may", pkg)
			case (top == "codec" || top == "configs") && (strings.HasPrefix(imp, "go.uber.org/zap") || strings.HasPrefix(imp, "github.com/VictoriaMetrics/metrics")):
				t.Errorf("%s imports %s; codec and configs stay free of logging and metrics", pkg, imp)
			case top == "codec" && strings.Contains(imp, ".") && !codecMayImport(imp):
				t.Errorf("codec imports %s; it may import only kmsg, bytebufferpool and the compression codecs", imp)
			}
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			itop, irank := layer(imp)
			if itop == top {
				continue
			}
			switch {
			case itop == "configs":
				if top != "server" && top != "cmd" && top != "bench" {
					t.Errorf("%s imports configs; only server and cmd may", pkg)
				}
			case top == "configs":
				t.Errorf("configs imports %s; configs must stay stdlib-only", imp)
			case irank >= rank:
				t.Errorf("%s imports %s against the flow cmd → server → coord → storage → codec", pkg, imp)
			}
		}
	}
	if checked == 0 {
		t.Fatal("go list returned no imports")
	}
}

func codecMayImport(imp string) bool {
	for _, p := range []string{"github.com/twmb/franz-go/pkg/kmsg", "github.com/valyala/bytebufferpool",
		"github.com/klauspost/compress/", "github.com/pierrec/lz4/v4"} {
		if strings.HasPrefix(imp, p) {
			return true
		}
	}
	return false
}

// TestBinaryDoesNotLinkEtcdServer guards the cluster design's split: the broker talks to etcd
// through the client only; the etcd server (raft, bbolt) is linked into test binaries alone,
// through coord/cluster/etcdtest, which only _test.go files import.
func TestBinaryDoesNotLinkEtcdServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/kaas-go/kaas/cmd/kaas").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	sawClient := false
	for _, d := range deps {
		switch {
		case strings.HasPrefix(d, "go.etcd.io/etcd/server/"), strings.HasPrefix(d, "go.etcd.io/raft/"),
			strings.HasPrefix(d, "go.etcd.io/bbolt"), d == "github.com/kaas-go/kaas/coord/cluster/etcdtest":
			t.Errorf("cmd/kaas links %s; the etcd server belongs to tests only", d)
		case strings.HasPrefix(d, "go.etcd.io/etcd/client/v3"):
			sawClient = true
		}
	}
	if !sawClient {
		t.Error("cmd/kaas does not link go.etcd.io/etcd/client/v3: cluster mode is not wired")
	}
}
