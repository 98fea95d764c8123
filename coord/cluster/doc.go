// Package cluster is kaas's cluster mode control plane: N brokers share one volume, and etcd
// holds membership, liveness, the controller election and the epoch-stamped assignments.
//
// This package only stores CAS-guarded metadata in etcd. The data on the volume is fenced by the
// rules below, not by etcd locks (a lease can lapse while its holder still acts).
//
// # Key layout
//
// Every key lives under Prefix = "/kaas/<cluster.name>/". Values are JSON.
//
//	cluster-id            the volume's __cluster/cluster.json id; created If(CreateRevision==0).
//	                      A broker whose volume carries another id refuses to start.
//	brokers/<id>          {"inc","state","rack","endpoints":[{"listener","host","port"}]}
//	                      put WithLease(liveness lease) If(CreateRevision==0); inc is the lease
//	                      id in hex and names the incarnation's WAL dir, journals and epoch files.
//	topics/<name>         {"id":"<32 hex>","partitions","rf","configs"}; created by any broker
//	                      If(CreateRevision==0); partitions grow by a CAS on ModRevision.
//	controller/…          election keys (Backend.Campaign); every controller write compares the
//	                      leadership key's CreateRevision, so the election revision is a fencing
//	                      token etcd itself checks.
//	assign/…, release/…   written by the controller and by outgoing holders (controller.go,
//	                      agent.go).
//
// Producer-id blocks stay in per-broker files on the volume; they need no etcd key.
//
// # The lease deadline
//
// Holder H of a resource has a deadline D, and two rules make a takeover safe:
//
//   - Rule P: an effect (produce ack, HWM/LSO advance, coordinator answer, fetched bytes) is
//     exposed only if its state is durable and, checked after the sync, now < D
//     (Member.Publishable).
//   - Rule S: a successor starts only after H's release record exists or H's brokers/<id> key
//     is gone (its lease expired).
//
// For the two to compose, D must never be later than the moment etcd expires the lease. The
// server renews a lease when it receives a keepalive, to receipt + TTL. The broker does not
// know the receipt time, but it knows the send time t0, and t0 ≤ receipt. So
//
//	D = t0 + TTL − margin ≤ receipt + TTL = server-side expiry ≤ when S sees brokers/H gone
//
// and everything H published before D was durable before S opened a file. A receive-based
// deadline (what concurrency.Session's stream would give) overstates D by the round trip, which
// can be arbitrarily long under a partition; that is why Member runs its own KeepAliveOnce loop.
// The margin covers clock-rate drift between the two hosts (not offset: no synchronised clocks
// are assumed) and etcd's expiry sweep granularity. D only moves forward and is kept as
// monotonic nanoseconds since a base Clock reading, so a wall-clock step cannot move it.
//
// When now ≥ D, or when a keepalive answers "lease not found", the member fail-stops: it stops
// publishing at once (Publishable turns false without any lock), calls FailStop with a reason
// naming the cause, and the default FailStop exits the process with status 3 so the supervisor
// starts a new incarnation. A member never revokes another incarnation's lease: that process may
// still be inside its own D. A restarted broker whose predecessor's key is still present waits
// up to 2×SessionTimeout+FenceMargin for it to expire (etcd deletes expired leases' keys lazily)
// and refuses if it does not (a live holder).
//
// # Backends
//
// NewEtcd is the production Backend (go.etcd.io/etcd/client/v3); NewFake is an in-memory one
// with revisions, leases and watches on a ManualClock, for deterministic unit tests. The etcd
// server itself is linked only by package etcdtest, which only _test.go files import.
package cluster
