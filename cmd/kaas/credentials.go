package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kaas-go/kaas/coord/cluster"
	"github.com/kaas-go/kaas/coord/credentials"
)

// runCredentials is `kaas credentials add|delete …`, the counterpart of Apache's
// `kafka-storage format --add-scram`: it writes SCRAM credentials into data.dir/__cluster without
// a running broker, so the first user can exist before anyone can authenticate. A broker running
// on the same data dir picks the change up for new connections (the store re-reads the file
// when it is replaced; both sides take the same file lock, so neither loses the other's change).
//
//	kaas credentials add --data.dir=DIR --user=NAME --mechanism=SCRAM-SHA-256 --password=PW [--iterations=4096]
//	kaas credentials delete --data.dir=DIR --user=NAME --mechanism=SCRAM-SHA-256
//
// In cluster mode the brokers keep SCRAM credentials in etcd, not in the file: with
// --cluster.etcd.endpoints (and --cluster.name) the command writes there, first seeding etcd
// from the volume's file if the cluster has no credential document yet (as a broker does).
func runCredentials(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "add" && args[0] != "delete") {
		return errors.New("usage: kaas credentials add|delete --data.dir=DIR --user=NAME --mechanism=SCRAM-SHA-256|SCRAM-SHA-512 [--password=PW] [--iterations=4096]")
	}
	op := args[0]
	fs := flag.NewFlagSet("kaas credentials "+op, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data.dir", "", "the broker's data directory")
	user := fs.String("user", "", "user name (the principal is User:<name>)")
	mech := fs.String("mechanism", "SCRAM-SHA-256", "SCRAM-SHA-256 or SCRAM-SHA-512")
	password := fs.String("password", "", "password (add); never stored, only its salted SCRAM keys")
	iterations := fs.Int("iterations", credentials.MinIterations, "SCRAM iterations, 4096..16384")
	etcdEndpoints := fs.String("cluster.etcd.endpoints", "", "cluster mode: etcd client URLs (comma list); the credentials go to etcd")
	clusterName := fs.String("cluster.name", "kaas", "cluster mode: the cluster name (etcd prefix /kaas/<name>/)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	m, ok := credentials.ParseMechanism(*mech)
	switch {
	case *dataDir == "":
		return errors.New("--data.dir is required")
	case *user == "":
		return errors.New("--user is required")
	case !ok:
		return fmt.Errorf("--mechanism %q: want SCRAM-SHA-256 or SCRAM-SHA-512", *mech)
	case op == "add" && *password == "":
		return errors.New("--password is required")
	}
	file, err := credentials.OpenFileStore(filepath.Join(*dataDir, "__cluster"))
	if err != nil {
		return err
	}
	var store credentials.Store = file
	if *etcdEndpoints != "" {
		be, err := cluster.NewEtcd(strings.Split(*etcdEndpoints, ","), 5*time.Second, zap.NewNop())
		if err != nil {
			return fmt.Errorf("cannot reach etcd at %s: %w", *etcdEndpoints, err)
		}
		defer be.Close()
		doc := cluster.NewDoc[credentials.Record](be, cluster.SecurityKey("/kaas/"+*clusterName+"/", "scram"), "SCRAM credential")
		users, err := file.Users()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := doc.Seed(ctx, credentials.RecordsOf(users)); err != nil {
			return fmt.Errorf("cannot seed the cluster's SCRAM credentials from %s: %w", *dataDir, err)
		}
		if store, err = credentials.OpenSharedStore(doc); err != nil {
			return err
		}
	}
	ch := credentials.Change{User: *user, Mechanism: m, Delete: op == "delete"}
	if op == "add" {
		if err := credentials.CheckIterations(*iterations, credentials.MinIterations); err != nil {
			return err
		}
		if ch.Cred, err = credentials.FromPassword(m, *password, *iterations); err != nil {
			return err
		}
	}
	if err := store.Apply([]credentials.Change{ch}); err != nil {
		return err
	}
	if op == "add" {
		fmt.Fprintf(stdout, "stored %s credential for user %q (%d iterations)\n", m, *user, *iterations)
	} else {
		fmt.Fprintf(stdout, "deleted %s credential of user %q\n", m, *user)
	}
	return nil
}
