package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kaas-go/kaas/coord/cluster"
	"github.com/kaas-go/kaas/coord/cluster/etcdtest"
	"github.com/kaas-go/kaas/coord/credentials"
)

// TestCredentialsCommandWritesToEtcdInClusterMode: with --cluster.etcd.endpoints, `kaas
// credentials add` writes where cluster brokers read SCRAM credentials (etcd), after seeding the
// cluster's document from the volume's file, so a user added earlier in single mode survives.
func TestCredentialsCommandWritesToEtcdInClusterMode(t *testing.T) {
	dir := t.TempDir()
	if err := runCredentials([]string{"add", "--data.dir=" + dir, "--user=old", "--password=pw-old"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	e := etcdtest.Start(t)
	args := []string{"add", "--data.dir=" + dir, "--user=alice", "--password=pw-alice", "--mechanism=SCRAM-SHA-512",
		"--cluster.etcd.endpoints=" + e.Endpoint, "--cluster.name=c1"}
	var out strings.Builder
	if err := runCredentials(args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	be, err := cluster.NewEtcd([]string{e.Endpoint}, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	store, err := credentials.OpenSharedStore(cluster.NewDoc[credentials.Record](be, cluster.SecurityKey("/kaas/c1/", "scram"), "SCRAM credential"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []struct {
		name string
		m    credentials.Mechanism
	}{{"old", credentials.SHA256}, {"alice", credentials.SHA512}} {
		if _, ok, err := store.Lookup(u.name, u.m); err != nil || !ok {
			t.Fatalf("etcd has no %v credential for %s (err %v); command said %q", u.m, u.name, err, out.String())
		}
	}
}
