package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafka-acls.sh is org.apache.kafka.tools.AclCommand in Kafka 4.1.
const classACLs = "org.apache.kafka.tools.AclCommand"

// TestKafkaACLsAddListRemove drives Apache's kafka-acls against kaas with the StandardAuthorizer
// on (ANONYMOUS, the PLAINTEXT principal, is a super user): --add of a literal and a prefixed
// binding, --list showing both (also after a restart: the bindings are durable), --remove, and
// --list showing nothing left.
func TestKafkaACLsAddListRemove(t *testing.T) {
	requireKafkaLib(t)
	e2eExtraKaasArgs = []string{"--authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
		"--super.users=User:ANONYMOUS"}
	t.Cleanup(func() { e2eExtraKaasArgs = nil })
	p := startKaas(t)
	addr := p.Addr()
	acls := func(args ...string) string {
		t.Helper()
		return javaTool(t, 60*time.Second, classACLs, append([]string{"--bootstrap-server", addr}, args...)...).stdout
	}
	acls("--add", "--allow-principal", "User:alice", "--operation", "Read", "--operation", "Describe", "--topic", "orders")
	acls("--add", "--deny-principal", "User:mallory", "--operation", "Write", "--topic", "pay-",
		"--resource-pattern-type", "prefixed")
	acls("--add", "--allow-principal", "User:alice", "--operation", "Read", "--group", "alice-group")

	check := func(out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("kafka-acls --list lacks %q:\n%s", w, out)
			}
		}
	}
	list := acls("--list")
	check(list, "name=orders, patternType=LITERAL", "principal=User:alice, host=*, operation=READ, permissionType=ALLOW",
		"operation=DESCRIBE, permissionType=ALLOW", "name=pay-, patternType=PREFIXED",
		"principal=User:mallory, host=*, operation=WRITE, permissionType=DENY", "name=alice-group")

	p.Stop(t)
	p.Restart(t)
	check(acls("--list", "--topic", "orders"), "principal=User:alice, host=*, operation=READ, permissionType=ALLOW")
	// --list --topic pay-in shows what applies to that topic: the prefixed DENY.
	check(acls("--list", "--topic", "pay-in", "--resource-pattern-type", "match"), "name=pay-, patternType=PREFIXED")

	acls("--remove", "--force", "--allow-principal", "User:alice", "--operation", "Read", "--operation", "Describe", "--topic", "orders")
	acls("--remove", "--force", "--topic", "pay-", "--resource-pattern-type", "prefixed")
	list = acls("--list")
	if strings.Contains(list, "orders") || strings.Contains(list, "pay-") {
		t.Errorf("removed bindings still listed:\n%s", list)
	}
	check(list, "name=alice-group")
}

// TestKafkaConfigsClientQuotas sets, lists and removes client quotas with Apache's kafka-configs
// (AlterClientQuotas / DescribeClientQuotas) for users, client-ids, a user + client-id pair and
// the defaults, and checks they survive a restart. kafka-configs --describe of a single named
// user also lists its SCRAM credentials (DescribeUserScramCredentials, served with SASL), so
// that one entity is read back through franz-go's kadm instead.
func TestKafkaConfigsClientQuotas(t *testing.T) {
	requireKafkaLib(t)
	p := startKaas(t)
	addr := p.Addr()
	configs := func(args ...string) string {
		t.Helper()
		return javaTool(t, 60*time.Second, classConfigs, append([]string{"--bootstrap-server", addr}, args...)...).stdout
	}
	check := func(out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("kafka-configs --describe lacks %q:\n%s", w, out)
			}
		}
	}
	configs("--alter", "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2097152",
		"--entity-type", "users", "--entity-name", "alice")
	configs("--alter", "--add-config", "request_percentage=50", "--entity-type", "clients", "--entity-default")
	configs("--alter", "--add-config", "consumer_byte_rate=65536", "--entity-type", "users", "--entity-default")
	configs("--alter", "--add-config", "producer_byte_rate=4096", "--entity-type", "users", "--entity-name", "bob",
		"--entity-type", "clients", "--entity-name", "app")

	p.Stop(t)
	p.Restart(t)
	check(configs("--describe", "--entity-type", "clients", "--entity-default"), "request_percentage=50.0")
	check(configs("--describe", "--entity-type", "users", "--entity-default"), "consumer_byte_rate=65536.0")
	check(configs("--describe", "--entity-type", "users", "--entity-name", "bob", "--entity-type", "clients", "--entity-name", "app"),
		"producer_byte_rate=4096.0")
	alice := func() map[string]float64 {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		name := "alice"
		qs, err := kadm.NewClient(cl).DescribeClientQuotas(ctx, true, []kadm.DescribeClientQuotaComponent{{Type: "user", MatchName: &name}})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, q := range qs {
			for _, v := range q.Values {
				out[v.Key] = v.Value
			}
		}
		return out
	}
	if got := alice(); got["producer_byte_rate"] != 1048576 || got["consumer_byte_rate"] != 2097152 {
		t.Fatalf("alice's quotas after restart: %v", got)
	}
	configs("--alter", "--delete-config", "producer_byte_rate", "--entity-type", "users", "--entity-name", "alice")
	if got := alice(); len(got) != 1 || got["consumer_byte_rate"] != 2097152 {
		t.Fatalf("alice's quotas after --delete-config producer_byte_rate: %v", got)
	}
}
