package acl

import (
	"path/filepath"
	"testing"
)

func lit(rt ResourceType, name, principal string, op Operation, perm Permission) Binding {
	return Binding{ResourceType: rt, ResourceName: name, PatternType: PatternLiteral, Principal: principal, Host: "*", Operation: op, Permission: perm}
}

func pre(rt ResourceType, name, principal string, op Operation, perm Permission) Binding {
	b := lit(rt, name, principal, op, perm)
	b.PatternType = PatternPrefixed
	return b
}

func newAuth(t testing.TB, cfg Config, bs ...Binding) *Authorizer {
	t.Helper()
	a, err := New(cfg, NewFileStore(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Create(bs); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAuthorizeSemantics(t *testing.T) {
	const alice, bob = "User:alice", "User:bob"
	a := newAuth(t, Config{SuperUsers: []string{"User:admin"}},
		lit(ResourceTopic, "orders", alice, OpRead, PermAllow),
		pre(ResourceTopic, "pay-", alice, OpWrite, PermAllow),
		lit(ResourceTopic, "pay-secret", alice, OpWrite, PermDeny),
		lit(ResourceTopic, "*", bob, OpDescribe, PermAllow),
		lit(ResourceGroup, "g", alice, OpAll, PermAllow),
		lit(ResourceTopic, "cfg", alice, OpAlterConfigs, PermAllow),
		Binding{ResourceType: ResourceTopic, ResourceName: "hosted", PatternType: PatternLiteral, Principal: alice, Host: "10.0.0.1", Operation: OpRead, Permission: PermAllow},
		lit(ResourceTopic, "everyone", WildcardPrincipal, OpRead, PermAllow),
		lit(ResourceTopic, "orders", alice, OpDescribe, PermDeny),
	)
	f := func(p, host string, op Operation, rt ResourceType, name string, want bool) {
		t.Helper()
		if got := a.Authorize(p, host, op, rt, name); got != want {
			t.Errorf("%s@%s %d on %s %q = %v, want %v", p, host, op, rt, name, got, want)
		}
	}
	f(alice, "1.2.3.4", OpRead, ResourceTopic, "orders", true)
	f(alice, "1.2.3.4", OpWrite, ResourceTopic, "orders", false)
	// DENY of DESCRIBE on orders wins over the READ implication.
	f(alice, "1.2.3.4", OpDescribe, ResourceTopic, "orders", false)
	f(alice, "1.2.3.4", OpWrite, ResourceTopic, "pay-in", true)
	f(alice, "1.2.3.4", OpDescribe, ResourceTopic, "pay-in", true) // WRITE implies DESCRIBE
	f(alice, "1.2.3.4", OpWrite, ResourceTopic, "pay-secret", false)
	f(alice, "1.2.3.4", OpWrite, ResourceTopic, "pa", false)
	f(bob, "1.2.3.4", OpDescribe, ResourceTopic, "anything", true)
	f(bob, "1.2.3.4", OpRead, ResourceTopic, "anything", false)
	f(alice, "1.2.3.4", OpDelete, ResourceGroup, "g", true)
	f(alice, "1.2.3.4", OpDescribeConfigs, ResourceTopic, "cfg", true)
	f(alice, "1.2.3.4", OpDescribe, ResourceTopic, "cfg", false) // ALTER_CONFIGS implies only DESCRIBE_CONFIGS
	f(alice, "10.0.0.1", OpRead, ResourceTopic, "hosted", true)
	f(alice, "10.0.0.2", OpRead, ResourceTopic, "hosted", false)
	f(bob, "1.1.1.1", OpRead, ResourceTopic, "everyone", true)
	f("User:admin", "1.1.1.1", OpAlter, ResourceCluster, ClusterName, true)
	f(alice, "1.1.1.1", OpRead, ResourceTopic, "uncovered", false)
	// Resource types do not leak into each other.
	f(alice, "1.1.1.1", OpRead, ResourceGroup, "orders", false)
}

func TestAllowEveryoneIfNoACLFound(t *testing.T) {
	a := newAuth(t, Config{AllowIfNoACL: true}, lit(ResourceTopic, "t", "User:alice", OpRead, PermAllow))
	if !a.Authorize("User:bob", "h", OpWrite, ResourceTopic, "free") {
		t.Fatal("uncovered resource denied with allow.everyone.if.no.acl.found")
	}
	if a.Authorize("User:bob", "h", OpRead, ResourceTopic, "t") {
		t.Fatal("covered resource allowed to a principal without a binding")
	}
}

func TestAuthorizeByResourceType(t *testing.T) {
	a := newAuth(t, Config{},
		lit(ResourceTopic, "a", "User:alice", OpWrite, PermAllow),
		lit(ResourceTopic, "a", "User:alice", OpWrite, PermDeny),
		pre(ResourceTopic, "b", "User:bob", OpWrite, PermAllow),
		pre(ResourceTopic, "x", "User:carol", OpWrite, PermAllow),
		pre(ResourceTopic, "", "User:carol", OpWrite, PermDeny),
	)
	if a.AuthorizeByResourceType("User:alice", "h", OpWrite, ResourceTopic) {
		t.Error("alice's only WRITE is denied on the same literal")
	}
	if !a.AuthorizeByResourceType("User:bob", "h", OpWrite, ResourceTopic) {
		t.Error("bob has a prefixed WRITE")
	}
	if a.AuthorizeByResourceType("User:dave", "h", OpWrite, ResourceTopic) {
		t.Error("dave has nothing")
	}
}

func TestFilterMatch(t *testing.T) {
	name := "pay-in"
	bs := []Binding{
		lit(ResourceTopic, "pay-in", "User:a", OpRead, PermAllow),
		lit(ResourceTopic, "*", "User:a", OpRead, PermAllow),
		pre(ResourceTopic, "pay-", "User:a", OpRead, PermAllow),
		pre(ResourceTopic, "pax", "User:a", OpRead, PermAllow),
		lit(ResourceTopic, "other", "User:a", OpRead, PermAllow),
		lit(ResourceGroup, "pay-in", "User:a", OpRead, PermAllow),
	}
	count := func(f Filter) int {
		n := 0
		for _, b := range bs {
			if f.Matches(b) {
				n++
			}
		}
		return n
	}
	if n := count(Filter{ResourceType: ResourceTopic, Name: &name, PatternType: PatternMatch, Operation: OpAny, Permission: PermAny}); n != 3 {
		t.Errorf("MATCH found %d, want 3", n)
	}
	if n := count(Filter{ResourceType: ResourceAny, Name: &name, PatternType: PatternAny, Operation: OpAny, Permission: PermAny}); n != 2 {
		t.Errorf("ANY by name found %d, want 2", n)
	}
	if n := count(Filter{ResourceType: ResourceAny, PatternType: PatternPrefixed, Operation: OpAny, Permission: PermAny}); n != 2 {
		t.Errorf("PREFIXED found %d, want 2", n)
	}
}

func TestBindingsSurviveReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "__cluster")
	a, err := New(Config{}, NewFileStore(dir))
	if err != nil {
		t.Fatal(err)
	}
	b := pre(ResourceTopic, "p", "User:a", OpRead, PermAllow)
	if err := a.Create([]Binding{b, b}); err != nil {
		t.Fatal(err)
	}
	a2, err := New(Config{}, NewFileStore(dir))
	if err != nil {
		t.Fatal(err)
	}
	if got := a2.Describe(Filter{ResourceType: ResourceAny, PatternType: PatternAny, Operation: OpAny, Permission: PermAny}); len(got) != 1 || got[0] != b {
		t.Fatalf("reopened bindings = %+v", got)
	}
	if !a2.Authorize("User:a", "h", OpRead, ResourceTopic, "pq") {
		t.Fatal("reopened binding not effective")
	}
	del, err := a2.Delete([]Filter{{ResourceType: ResourceTopic, PatternType: PatternAny, Operation: OpAny, Permission: PermAny}})
	if err != nil || len(del[0]) != 1 {
		t.Fatalf("delete = %v, %v", del, err)
	}
	if a2.Authorize("User:a", "h", OpRead, ResourceTopic, "pq") {
		t.Fatal("deleted binding still effective")
	}
}

func TestValidateBinding(t *testing.T) {
	good := lit(ResourceTopic, "t", "User:a", OpRead, PermAllow)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, mut := range []func(*Binding){
		func(b *Binding) { b.ResourceType = ResourceAny },
		func(b *Binding) { b.PatternType = PatternMatch },
		func(b *Binding) { b.ResourceName = "" },
		func(b *Binding) { b.Operation = OpAny },
		func(b *Binding) { b.Permission = PermAny },
		func(b *Binding) { b.Principal = "alice" },
		func(b *Binding) { b.ResourceType, b.ResourceName = ResourceCluster, "c" },
	} {
		b := good
		mut(&b)
		if b.Validate() == nil {
			t.Errorf("%+v accepted", b)
		}
	}
}
