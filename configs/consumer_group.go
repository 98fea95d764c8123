package configs

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// ConsumerGroup holds the group.consumer.* settings of the KIP-848 consumer group protocol, with
// Apache 4.1's names, defaults and bounds (GroupCoordinatorConfig).
type ConsumerGroup struct {
	// ConsumerSessionTimeout is group.consumer.session.timeout.ms: a member that does not
	// heartbeat for this long is removed. The member does not choose it (unlike the classic
	// protocol); it must lie within the min/max below.
	ConsumerSessionTimeout    time.Duration
	ConsumerMinSessionTimeout time.Duration
	ConsumerMaxSessionTimeout time.Duration
	// ConsumerHeartbeatInterval is group.consumer.heartbeat.interval.ms, handed to every member
	// in each heartbeat response; within the min/max below and below the session timeout.
	ConsumerHeartbeatInterval    time.Duration
	ConsumerMinHeartbeatInterval time.Duration
	ConsumerMaxHeartbeatInterval time.Duration
	ConsumerMaxSize              int    // group.consumer.max.size
	ConsumerAssignors            string // group.consumer.assignors: comma-separated; the first is the default
	// ConsumerMigrationPolicy is group.consumer.migration.policy (KIP-848 online migration):
	// disabled, upgrade (a non-empty classic group converts on a ConsumerGroupHeartbeat),
	// downgrade (a consumer group whose last consumer-protocol member leaves converts back) or
	// bidirectional. Case-insensitive, as Apache's.
	ConsumerMigrationPolicy string
}

func defaultConsumerGroup() ConsumerGroup {
	return ConsumerGroup{
		ConsumerSessionTimeout:       45 * time.Second,
		ConsumerMinSessionTimeout:    45 * time.Second,
		ConsumerMaxSessionTimeout:    60 * time.Second,
		ConsumerHeartbeatInterval:    5 * time.Second,
		ConsumerMinHeartbeatInterval: 5 * time.Second,
		ConsumerMaxHeartbeatInterval: 15 * time.Second,
		ConsumerMaxSize:              math.MaxInt32,
		ConsumerAssignors:            "uniform,range",
		ConsumerMigrationPolicy:      "bidirectional",
	}
}

func (c *Config) consumerGroupEntries() []entry {
	g := &c.ConsumerGroup
	return []entry{
		{"group.consumer.session.timeout.ms", kMillis, &g.ConsumerSessionTimeout, "KIP-848 consumer groups: a member without a heartbeat for this long is removed", false},
		{"group.consumer.min.session.timeout.ms", kMillis, &g.ConsumerMinSessionTimeout, "lower bound of group.consumer.session.timeout.ms", false},
		{"group.consumer.max.session.timeout.ms", kMillis, &g.ConsumerMaxSessionTimeout, "upper bound of group.consumer.session.timeout.ms", false},
		{"group.consumer.heartbeat.interval.ms", kMillis, &g.ConsumerHeartbeatInterval, "KIP-848 consumer groups: heartbeat interval given to members", false},
		{"group.consumer.min.heartbeat.interval.ms", kMillis, &g.ConsumerMinHeartbeatInterval, "lower bound of group.consumer.heartbeat.interval.ms", false},
		{"group.consumer.max.heartbeat.interval.ms", kMillis, &g.ConsumerMaxHeartbeatInterval, "upper bound of group.consumer.heartbeat.interval.ms", false},
		{"group.consumer.max.size", kInt, &g.ConsumerMaxSize, "members per KIP-848 consumer group", false},
		{"group.consumer.migration.policy", kString, &g.ConsumerMigrationPolicy, "KIP-848 online migration of non-empty groups: disabled, upgrade, downgrade or bidirectional", false},
		{"group.consumer.assignors", kString, &g.ConsumerAssignors, "server-side assignors (uniform, range; Apache's class names are accepted); the first is the default", false},
	}
}

// ConsumerAssignorNames returns group.consumer.assignors as short names (uniform, range), in order.
// Apache's class names (org.apache.kafka.coordinator.group.assignor.UniformAssignor,
// ...RangeAssignor) map to their short names.
func (g *ConsumerGroup) ConsumerAssignorNames() ([]string, error) {
	var out []string
	for _, a := range strings.Split(g.ConsumerAssignors, ",") {
		a = strings.TrimSpace(a)
		switch a {
		case "":
			continue
		case "uniform", "org.apache.kafka.coordinator.group.assignor.UniformAssignor":
			a = "uniform"
		case "range", "org.apache.kafka.coordinator.group.assignor.RangeAssignor":
			a = "range"
		default:
			return nil, fmt.Errorf("group.consumer.assignors: unknown assignor %q (uniform, range)", a)
		}
		for _, o := range out {
			if o == a {
				return nil, fmt.Errorf("group.consumer.assignors: %q is listed twice", a)
			}
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("group.consumer.assignors must name at least one assignor")
	}
	return out, nil
}

// validateConsumerGroup applies Apache's GroupCoordinatorConfig checks.
func (c *Config) validateConsumerGroup() []error {
	g := &c.ConsumerGroup
	var errs []error
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"group.consumer.session.timeout.ms", g.ConsumerSessionTimeout},
		{"group.consumer.min.session.timeout.ms", g.ConsumerMinSessionTimeout},
		{"group.consumer.max.session.timeout.ms", g.ConsumerMaxSessionTimeout},
		{"group.consumer.heartbeat.interval.ms", g.ConsumerHeartbeatInterval},
		{"group.consumer.min.heartbeat.interval.ms", g.ConsumerMinHeartbeatInterval},
		{"group.consumer.max.heartbeat.interval.ms", g.ConsumerMaxHeartbeatInterval},
	} {
		if d.v < time.Millisecond {
			errs = append(errs, fmt.Errorf("%s must be >= 1", d.key))
		}
	}
	if g.ConsumerMaxSize < 1 {
		errs = append(errs, errors.New("group.consumer.max.size must be >= 1"))
	}
	if g.ConsumerMinSessionTimeout > g.ConsumerMaxSessionTimeout {
		errs = append(errs, errors.New("group.consumer.min.session.timeout.ms must be <= group.consumer.max.session.timeout.ms"))
	}
	if g.ConsumerSessionTimeout < g.ConsumerMinSessionTimeout || g.ConsumerSessionTimeout > g.ConsumerMaxSessionTimeout {
		errs = append(errs, errors.New("group.consumer.session.timeout.ms must be within group.consumer.min.session.timeout.ms and group.consumer.max.session.timeout.ms"))
	}
	if g.ConsumerMinHeartbeatInterval > g.ConsumerMaxHeartbeatInterval {
		errs = append(errs, errors.New("group.consumer.min.heartbeat.interval.ms must be <= group.consumer.max.heartbeat.interval.ms"))
	}
	if g.ConsumerHeartbeatInterval < g.ConsumerMinHeartbeatInterval || g.ConsumerHeartbeatInterval > g.ConsumerMaxHeartbeatInterval {
		errs = append(errs, errors.New("group.consumer.heartbeat.interval.ms must be within group.consumer.min.heartbeat.interval.ms and group.consumer.max.heartbeat.interval.ms"))
	}
	if g.ConsumerHeartbeatInterval >= g.ConsumerSessionTimeout {
		errs = append(errs, errors.New("group.consumer.heartbeat.interval.ms must be less than group.consumer.session.timeout.ms"))
	}
	if _, err := g.ConsumerAssignorNames(); err != nil {
		errs = append(errs, err)
	}
	switch strings.ToLower(g.ConsumerMigrationPolicy) {
	case "disabled", "upgrade", "downgrade", "bidirectional":
	default:
		errs = append(errs, fmt.Errorf("group.consumer.migration.policy: %q is not one of disabled, upgrade, downgrade, bidirectional", g.ConsumerMigrationPolicy))
	}
	return errs
}
