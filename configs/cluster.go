package configs

import (
	"errors"
	"strings"
	"time"
)

// Cluster is cluster mode (issue 9, design/cluster.md): N brokers share one data.dir on an
// RWX volume and keep membership, leases and epoch-stamped assignments in etcd. With
// cluster.etcd.endpoints empty the broker runs alone, exactly as before (no etcd code runs).
type Cluster struct {
	EtcdEndpoints  string        // cluster.etcd.endpoints: comma list of etcd client URLs
	Name           string        // cluster.name: the etcd key prefix /kaas/<name>/
	SessionTimeout time.Duration // cluster.session.timeout.ms: the liveness lease TTL
	Heartbeat      time.Duration // cluster.session.heartbeat.ms: keepalive period
	FenceMargin    time.Duration // cluster.fence.margin.ms: subtracted from the lease deadline
	DrainTimeout   time.Duration // cluster.drain.timeout.ms: SIGTERM waits this long for handovers
}

func defaultCluster() Cluster {
	// KRaft's broker session is 9 s with 2 s heartbeats; 6 s keeps kill -9 failover near 7 s.
	return Cluster{Name: "kaas", SessionTimeout: 6 * time.Second, Heartbeat: 2 * time.Second,
		FenceMargin: 500 * time.Millisecond, DrainTimeout: 30 * time.Second}
}

func (c *Config) clusterEntries() []entry {
	return []entry{
		{"cluster.etcd.endpoints", kString, &c.Cluster.EtcdEndpoints, "etcd client URLs (comma list); empty = single broker", false},
		{"cluster.name", kString, &c.Cluster.Name, "cluster name: the etcd key prefix /kaas/<name>/", false},
		{"cluster.session.timeout.ms", kMillis, &c.Cluster.SessionTimeout, "liveness lease TTL; a broker that cannot renew within it stops and exits (code 3)", false},
		{"cluster.session.heartbeat.ms", kMillis, &c.Cluster.Heartbeat, "lease keepalive period", false},
		{"cluster.fence.margin.ms", kMillis, &c.Cluster.FenceMargin, "safety margin subtracted from the lease deadline (clock-rate drift)", false},
		{"cluster.drain.timeout.ms", kMillis, &c.Cluster.DrainTimeout, "on SIGTERM, how long to wait for this broker's partitions and coordinators to move before exiting anyway", false},
	}
}

// ClusterMode reports whether cluster.etcd.endpoints is set.
func (c *Config) ClusterMode() bool { return strings.TrimSpace(c.Cluster.EtcdEndpoints) != "" }

// EtcdEndpoints is cluster.etcd.endpoints split and trimmed.
func (c *Config) EtcdEndpoints() []string {
	var out []string
	for _, e := range strings.Split(c.Cluster.EtcdEndpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// ClusterPrefix is the etcd key prefix of this cluster.
func (c *Config) ClusterPrefix() string { return "/kaas/" + c.Cluster.Name + "/" }

func (c *Config) validateCluster() []error {
	if !c.ClusterMode() {
		return nil
	}
	var errs []error
	cl := c.Cluster
	if cl.Name == "" || strings.ContainsAny(cl.Name, "/ ") {
		errs = append(errs, errors.New("cluster.name must be non-empty without '/' or spaces"))
	}
	// etcd's minimum lease TTL is 2 s (1.5 × its election timeout); a heartbeat must fit at
	// least twice into the deadline or one lost keepalive already fails the broker.
	if cl.SessionTimeout < 2*time.Second {
		errs = append(errs, errors.New("cluster.session.timeout.ms must be >= 2000 (etcd's minimum lease TTL)"))
	}
	if cl.Heartbeat <= 0 || 2*cl.Heartbeat+cl.FenceMargin > cl.SessionTimeout {
		errs = append(errs, errors.New("cluster.session.heartbeat.ms must be > 0 and 2 × heartbeat + fence margin <= session timeout"))
	}
	if cl.FenceMargin < 0 {
		errs = append(errs, errors.New("cluster.fence.margin.ms must be >= 0"))
	}
	if cl.DrainTimeout <= 0 {
		errs = append(errs, errors.New("cluster.drain.timeout.ms must be positive"))
	}
	return errs
}
