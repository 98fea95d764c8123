package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/xdg-go/scram"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/acl"
	"github.com/kaas-go/kaas/coord/credentials"
	"github.com/kaas-go/kaas/coord/quota"
)

// In cluster mode ACL bindings, SCRAM credentials and client quotas are cluster-wide at once: a
// change made through one broker is applied by the others through the etcd watch, without a
// restart (Apache replays them from its metadata log on every broker).

// secureCluster is three brokers with the StandardAuthorizer on, User:admin a super user,
// PLAINTEXT (principals named by who) and SASL_PLAINTEXT listeners. A binding for
// User:from-file is in the volume's acls.json before the first start.
type secureCluster struct {
	*testCluster
	who *principals
}

var seededBinding = allow(acl.ResourceTopic, "seeded", "User:from-file", acl.OpRead)

func startSecureCluster(t *testing.T) *secureCluster {
	t.Helper()
	who := &principals{}
	tc := startTestClusterWith(t, 3, func(id int32, cfg *configs.Config, opts *BrokerOptions) {
		cfg.Listeners = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
		cfg.SASLMechanisms = "SCRAM-SHA-256"
		cfg.AuthorizerClassName = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
		cfg.SuperUsers = superUser
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		opts.PrincipalFor = who.of
		if id == 1 {
			// A single broker's data dir becoming a cluster's: its file seeds etcd once.
			if err := acl.NewFileStore(filepath.Join(cfg.DataDir, "__cluster")).Save([]acl.Binding{seededBinding}); err != nil {
				t.Fatal(err)
			}
		}
	})
	return &secureCluster{testCluster: tc, who: who}
}

func (sc *secureCluster) plain(id int32) string {
	return sc.broker(id).Server.ListenerAddr("PLAINTEXT").String()
}

// as opens a raw connection to broker id's PLAINTEXT listener as principal.
func (sc *secureCluster) as(id int32, principal string) *rawConn {
	return sc.who.raw(sc.t, sc.plain(id), principal)
}

// topicCode is the Metadata error of topic as rc's principal sees it.
func topicCode(t *testing.T, rc *rawConn, topic string) int16 {
	t.Helper()
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 10
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = &topic
	md.Topics = []kmsg.MetadataRequestTopic{mt}
	md.AllowAutoTopicCreation = false
	r := fxRoundTrip[*kmsg.MetadataResponse](t, rc, md)
	if len(r.Topics) != 1 {
		t.Fatalf("metadata for %s: %d topics", topic, len(r.Topics))
	}
	return r.Topics[0].ErrorCode
}

func expectCode(t *testing.T, what string, got, want int16) error {
	if got != want {
		return fmt.Errorf("%s: %v, want %v", what, kerr.ErrorForCode(got), kerr.ErrorForCode(want))
	}
	return nil
}

// TestClusterACLChangeAppliesOnEveryBroker: CreateAcls through broker 1 lets the principal in
// on broker 3, DeleteAcls through broker 2 shuts it out again there, with no restart; the
// volume's file seeded etcd and is no longer written.
func TestClusterACLChangeAppliesOnEveryBroker(t *testing.T) {
	sc := startSecureCluster(t)
	adm := kadm.NewClient(sc.who.client(t, sc.plain(1), superUser))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := adm.CreateTopic(ctx, 1, 1, nil, "secured"); err != nil || r.Err != nil {
		t.Fatalf("create topic: %v %v", err, r.Err)
	}
	const alice = "User:alice"
	onB3 := sc.as(3, alice)
	if c := topicCode(t, onB3, "secured"); c != codec.CodeTopicAuthorizationFailed {
		t.Fatalf("before the ACL: %v, want TOPIC_AUTHORIZATION_FAILED", kerr.ErrorForCode(c))
	}

	cr := kmsg.NewPtrCreateACLsRequest()
	cr.Version = 3
	c := kmsg.NewCreateACLsRequestCreation()
	c.ResourceType, c.ResourceName, c.ResourcePatternType = kmsg.ACLResourceTypeTopic, "secured", kmsg.ACLResourcePatternTypeLiteral
	c.Principal, c.Host, c.Operation, c.PermissionType = alice, "*", kmsg.ACLOperationDescribe, kmsg.ACLPermissionTypeAllow
	cr.Creations = []kmsg.CreateACLsRequestCreation{c}
	if r := fxRoundTrip[*kmsg.CreateACLsResponse](t, sc.as(1, superUser), cr); r.Results[0].ErrorCode != 0 {
		t.Fatalf("CreateAcls through broker 1: %v", kerr.ErrorForCode(r.Results[0].ErrorCode))
	}
	acked := time.Now()
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		return expectCode(t, "broker 3 after CreateAcls on broker 1", topicCode(t, onB3, "secured"), 0)
	})
	t.Logf("CreateAcls answered by broker 1 → applied by broker 3 within %v", time.Since(acked))

	dr := kmsg.NewPtrDeleteACLsRequest()
	dr.Version = 3
	f := kmsg.NewDeleteACLsRequestFilter()
	name, principal := "secured", alice
	f.ResourceType, f.ResourceName, f.ResourcePatternType = kmsg.ACLResourceTypeTopic, &name, kmsg.ACLResourcePatternTypeLiteral
	f.Principal, f.Operation, f.PermissionType = &principal, kmsg.ACLOperationAny, kmsg.ACLPermissionTypeAny
	dr.Filters = []kmsg.DeleteACLsRequestFilter{f}
	if r := fxRoundTrip[*kmsg.DeleteACLsResponse](t, sc.as(2, superUser), dr); r.Results[0].ErrorCode != 0 || len(r.Results[0].MatchingACLs) != 1 {
		t.Fatalf("DeleteAcls through broker 2: %v, %d matched", kerr.ErrorForCode(r.Results[0].ErrorCode), len(r.Results[0].MatchingACLs))
	}
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return expectCode(t, "broker 3 after DeleteAcls on broker 2", topicCode(t, onB3, "secured"), codec.CodeTopicAuthorizationFailed)
	})

	// The file's binding reached every broker through etcd, and the file was not rewritten by
	// the changes above (in cluster mode it only seeds). Each broker applies the delete from its
	// own etcd watch, so broker 3 having it says nothing of broker 1: poll each.
	for id := int32(1); id <= 3; id++ {
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if got := sc.broker(id).Server.deps.ACL.Describe(acl.Filter{ResourceType: acl.ResourceAny, PatternType: acl.PatternAny,
				Operation: acl.OpAny, Permission: acl.PermAny}); len(got) != 1 || got[0] != seededBinding {
				return fmt.Errorf("broker %d bindings %+v, want only the seeded one", id, got)
			}
			return nil
		})
	}
	if got, err := acl.NewFileStore(filepath.Join(sc.dir, "__cluster")).Load(); err != nil || len(got) != 1 || got[0] != seededBinding {
		t.Fatalf("acls.json now %+v (%v), want the seed left as it was", got, err)
	}
}

// TestClusterConcurrentACLChangesThroughTwoBrokersAllLand: CreateAcls racing through brokers 1
// and 2 (the CAS loser re-reads and re-applies) leaves every binding on broker 3.
func TestClusterConcurrentACLChangesThroughTwoBrokersAllLand(t *testing.T) {
	sc := startSecureCluster(t)
	const each = 10
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for _, id := range []int32{1, 2} {
		a := sc.broker(id).Server.deps.ACL
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := a.Create([]acl.Binding{allow(acl.ResourceGroup, fmt.Sprintf("g-%d-%d", id, i), "User:racer", acl.OpRead)}); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	filter := acl.Filter{ResourceType: acl.ResourceGroup, PatternType: acl.PatternAny, Operation: acl.OpAny, Permission: acl.PermAny}
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for id := int32(1); id <= 3; id++ {
			if got := len(sc.broker(id).Server.deps.ACL.Describe(filter)); got != 2*each {
				return fmt.Errorf("broker %d holds %d group bindings, want %d", id, got, 2*each)
			}
		}
		return nil
	})
}

// scramLogin runs a whole SCRAM-SHA-256 exchange with the SASL_PLAINTEXT listener at addr and
// returns the SaslAuthenticate error (0: authenticated, server signature verified).
func scramLogin(t *testing.T, addr, user, pw string) int16 {
	t.Helper()
	rc := dialRaw(t, addr)
	defer rc.c.Close()
	if r := handshake(t, rc, "SCRAM-SHA-256", 1); r.ErrorCode != 0 {
		t.Fatalf("handshake: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	cl, err := scram.SHA256.NewClient(user, pw, "")
	if err != nil {
		t.Fatal(err)
	}
	conv := cl.NewConversation()
	msg, err := conv.Step("")
	for err == nil && !conv.Done() {
		r := authenticate(t, rc, []byte(msg), 2)
		if r.ErrorCode != 0 {
			return r.ErrorCode
		}
		msg, err = conv.Step(string(r.SASLAuthBytes))
	}
	if err != nil {
		t.Fatalf("SCRAM conversation: %v", err)
	}
	return 0
}

// TestClusterSCRAMCredentialAppliesOnEveryBroker: AlterUserScramCredentials through broker 2
// lets the user log in on broker 3; deleting it through broker 1 refuses the next login there.
func TestClusterSCRAMCredentialAppliesOnEveryBroker(t *testing.T) {
	sc := startSecureCluster(t)
	sasl3 := sc.broker(3).Server.ListenerAddr("SASL_PLAINTEXT").String()
	const user, pw = "carol", "carol-secret"
	if c := scramLogin(t, sasl3, user, pw); c != codec.CodeSaslAuthenticationFailed {
		t.Fatalf("login before the credential exists: %v", kerr.ErrorForCode(c))
	}
	salt := make([]byte, 24)
	if _, err := rand.Read(salt); err != nil {
		t.Fatal(err)
	}
	ar := kmsg.NewPtrAlterUserSCRAMCredentialsRequest()
	up := kmsg.NewAlterUserSCRAMCredentialsRequestUpsertion()
	up.Name, up.Mechanism, up.Iterations, up.Salt = user, int8(credentials.SHA256), 4096, salt
	up.SaltedPassword = saltedPassword(t, credentials.SHA256, pw, salt, 4096)
	ar.Upsertions = []kmsg.AlterUserSCRAMCredentialsRequestUpsertion{up}
	if r := fxRoundTrip[*kmsg.AlterUserSCRAMCredentialsResponse](t, sc.as(2, superUser), ar); r.Results[0].ErrorCode != 0 {
		t.Fatalf("AlterUserScramCredentials through broker 2: %v", kerr.ErrorForCode(r.Results[0].ErrorCode))
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		return expectCode(t, "login on broker 3", scramLogin(t, sasl3, user, pw), 0)
	})
	if c := scramLogin(t, sasl3, user, "wrong"); c != codec.CodeSaslAuthenticationFailed {
		t.Fatalf("wrong password on broker 3: %v", kerr.ErrorForCode(c))
	}

	del := kmsg.NewPtrAlterUserSCRAMCredentialsRequest()
	d := kmsg.NewAlterUserSCRAMCredentialsRequestDeletion()
	d.Name, d.Mechanism = user, int8(credentials.SHA256)
	del.Deletions = []kmsg.AlterUserSCRAMCredentialsRequestDeletion{d}
	if r := fxRoundTrip[*kmsg.AlterUserSCRAMCredentialsResponse](t, sc.as(1, superUser), del); r.Results[0].ErrorCode != 0 {
		t.Fatalf("credential deletion through broker 1: %v", kerr.ErrorForCode(r.Results[0].ErrorCode))
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		return expectCode(t, "login on broker 3 after the deletion", scramLogin(t, sasl3, user, pw), codec.CodeSaslAuthenticationFailed)
	})
	// Nothing went to the volume's credential file: in cluster mode it only seeds etcd.
	if _, err := os.Stat(filepath.Join(sc.dir, "__cluster", credentials.FileName)); !os.IsNotExist(err) {
		t.Fatalf("credential file written in cluster mode: %v", err)
	}
}

// TestClusterClientQuotaAppliesOnEveryBroker: AlterClientQuotas through broker 1 shows in
// DescribeClientQuotas on broker 2 and is enforced by broker 3's quota manager.
func TestClusterClientQuotaAppliesOnEveryBroker(t *testing.T) {
	sc := startSecureCluster(t)
	user := "alice"
	ar := kmsg.NewPtrAlterClientQuotasRequest()
	ar.Version = 1
	e := kmsg.NewAlterClientQuotasRequestEntry()
	ent := kmsg.NewAlterClientQuotasRequestEntryEntity()
	ent.Type, ent.Name = "user", &user
	op := kmsg.NewAlterClientQuotasRequestEntryOp()
	op.Key, op.Value = "producer_byte_rate", 1024
	e.Entity, e.Ops = []kmsg.AlterClientQuotasRequestEntryEntity{ent}, []kmsg.AlterClientQuotasRequestEntryOp{op}
	ar.Entries = []kmsg.AlterClientQuotasRequestEntry{e}
	if r := fxRoundTrip[*kmsg.AlterClientQuotasResponse](t, sc.as(1, superUser), ar); r.Entries[0].ErrorCode != 0 {
		t.Fatalf("AlterClientQuotas through broker 1: %v", kerr.ErrorForCode(r.Entries[0].ErrorCode))
	}
	onB2 := sc.as(2, superUser)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		dr := kmsg.NewPtrDescribeClientQuotasRequest()
		dr.Version = 1
		comp := kmsg.NewDescribeClientQuotasRequestComponent()
		comp.EntityType, comp.MatchType, comp.Match = "user", 0, &user
		dr.Components = []kmsg.DescribeClientQuotasRequestComponent{comp}
		r := fxRoundTrip[*kmsg.DescribeClientQuotasResponse](t, onB2, dr)
		if r.ErrorCode != 0 {
			t.Fatalf("DescribeClientQuotas on broker 2: %v", kerr.ErrorForCode(r.ErrorCode))
		}
		if len(r.Entries) != 1 || len(r.Entries[0].Values) != 1 || r.Entries[0].Values[0].Key != "producer_byte_rate" || r.Entries[0].Values[0].Value != 1024 {
			return fmt.Errorf("broker 2 describes %+v, want user=alice producer_byte_rate=1024", r.Entries)
		}
		return nil
	})
	// 1 MB produced against 1024 B/s: broker 3 throttles alice (and nobody else).
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if d := sc.broker(3).Quotas.Record(quota.Produce, "alice", "c", 1<<20); d <= 0 {
			return fmt.Errorf("broker 3 does not throttle alice (%v)", d)
		}
		return nil
	})
	if d := sc.broker(3).Quotas.Record(quota.Produce, "bob", "c", 1<<20); d != 0 {
		t.Fatalf("broker 3 throttles bob, who has no quota, for %v", d)
	}
}
