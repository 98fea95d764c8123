package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestStartRestartKeepsDataAndEndpoint guards what the cluster tests build on: a key written
// before Restart is read back through the same endpoint afterwards.
func TestStartRestartKeepsDataAndEndpoint(t *testing.T) {
	s := Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	r, err := cli.Get(ctx, "/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("after restart got %v, want /k=v", r.Kvs)
	}
}
