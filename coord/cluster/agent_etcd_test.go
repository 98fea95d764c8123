package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/kaas-go/kaas/coord/cluster/etcdtest"
)

// The same agents and controllers against a real etcd: the placement settles with one holder
// per resource, and a drain hands everything over with release records, on etcd's own
// elections, leases, compares and watches.
func TestAgentsOverRealEtcdPlaceAndDrain(t *testing.T) {
	s := etcdtest.Start(t)
	reader := newEtcdBackend(t, s)
	c := startCluster(t, &tcluster{t: t, f: reader, client: func() Backend { return newEtcdBackend(t, s) }}, 3, 64)
	ta := createTopic(t, reader, "a", 6, 0xa)
	c.waitBalanced(ta)
	c.noProblems()
	ctl, err := ControllerOf(context.Background(), reader, testPrefix)
	if err != nil || ctl < 1 || ctl > 3 {
		t.Fatalf("ControllerOf = %d, %v", ctl, err)
	}

	d := c.nodes[0]
	before := d.res.holding()
	if err := d.m.SetState(context.Background(), StateDraining); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.agent.Drained():
	case <-time.After(20 * time.Second):
		t.Fatalf("drain did not finish; still held %d", len(d.res.holding()))
	}
	rel := d.res.releases()
	others := c.nodes[1:]
	waitUntil(t, "the other two to hold everything", func() bool { return len(holders(others)) == len(allResources(ta)) })
	hs := holders(others)
	for id, e := range before {
		calls := c.nodeByID(hs[id][0]).res.acquisitions(id)
		last := calls[len(calls)-1]
		if last.epoch != e+1 || last.h.PrevBroker != d.id || string(last.h.Release) != string(rel[id]) || rel[id] == nil {
			t.Fatalf("%v acquired at %d with %+v; want epoch %d from broker %d with record %q", id, last.epoch, last.h, e+1, d.id, rel[id])
		}
	}
	c.noProblems()
	// The drained broker leaves (revokes its lease), as kaas does after a SIGTERM drain.
	c.stop(d)
	d.crashed = true

	// Crash broker 3: its lease runs out at etcd, and only then does broker 2 take over (the
	// oracle in every Acquire reads brokers/3 from etcd).
	victim := c.nodes[2]
	lost := victim.res.holding()
	if len(lost) == 0 {
		t.Fatal("broker 3 holds nothing to lose")
	}
	inc := victim.m.Incarnation()
	c.crash(victim)
	c.waitBalancedWithin(30*time.Second, ta)
	survivor := c.nodes[1]
	for id, e := range lost {
		calls := survivor.res.acquisitions(id)
		last := calls[len(calls)-1]
		if last.epoch != e+1 || last.h.PrevBroker != victim.id || last.h.PrevInc != inc || last.h.Release != nil {
			t.Fatalf("%v taken over at %d with %+v; want epoch %d from broker 3 (inc %s) without a release record", id, last.epoch, last.h, e+1, inc)
		}
	}
	c.noProblems()
}
