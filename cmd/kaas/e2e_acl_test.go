package main

import (
	"strings"
	"testing"
	"time"
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
