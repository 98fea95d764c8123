package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/configs"
	"github.com/kaas-go/kaas/coord/acl"
)

// principals names each test connection's principal by its local address (the broker sees it as
// the remote address) through BrokerOptions.PrincipalFor, until SASL authenticates connections.
type principals struct{ m sync.Map }

func (p *principals) of(remote string) string {
	if v, ok := p.m.Load(remote); ok {
		return v.(string)
	}
	return "User:ANONYMOUS"
}

func (p *principals) raw(t *testing.T, addr, principal string) *rawConn {
	rc := dialRaw(t, addr)
	p.m.Store(rc.c.LocalAddr().String(), principal)
	return rc
}

func (p *principals) client(t *testing.T, addr, principal string, opts ...kgo.Opt) *kgo.Client {
	dial := func(ctx context.Context, network, host string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, host)
		if err == nil {
			p.m.Store(c.LocalAddr().String(), principal)
		}
		return c, err
	}
	return fxClient(t, addr, append([]kgo.Opt{kgo.Dialer(dial)}, opts...)...)
}

type aclBroker struct {
	*testBroker
	addr string
	who  *principals
}

const superUser = "User:admin"

// startACLBroker runs a broker with the StandardAuthorizer on and User:admin as super user.
func startACLBroker(t *testing.T, cfg configs.Config) *aclBroker {
	t.Helper()
	cfg.AuthorizerClassName = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
	cfg.SuperUsers = superUser + ";User:other-admin"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	who := &principals{}
	tb := startTestBroker(t, cfg, BrokerOptions{PrincipalFor: who.of})
	return &aclBroker{testBroker: tb, addr: tb.srv.Addr().String(), who: who}
}

func (ab *aclBroker) grant(t *testing.T, bs ...acl.Binding) {
	t.Helper()
	if err := ab.srv.deps.ACL.Create(bs); err != nil {
		t.Fatal(err)
	}
}

func allow(rt acl.ResourceType, name, principal string, op acl.Operation) acl.Binding {
	return acl.Binding{ResourceType: rt, ResourceName: name, PatternType: acl.PatternLiteral,
		Principal: principal, Host: "*", Operation: op, Permission: acl.PermAllow}
}

func code(err error) int16 {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Code
	}
	if err != nil {
		return -2
	}
	return 0
}

// TestACLTxnGateMatrix is the seed's gate table against the real authorizer: for every
// transactional API and every ACL it needs, a principal holding all the others gets exactly
// Apache's error and changes nothing.
func TestACLTxnGateMatrix(t *testing.T) {
	cfg := testConfig(t)
	cfg.NumEventLoops = 1
	ab := startACLBroker(t, cfg)
	t.Cleanup(func() { ab.stop(t) })
	admin := ab.who.raw(t, ab.addr, superUser)
	if _, err := ab.store.CreateTopic("t", 1, nil); err != nil {
		t.Fatal(err)
	}
	leo := func() int64 { return ab.store.Topic("t").Partition(0).LogEndOffset() }

	// needs lists what each API asks for; %d is the row's index.
	type need struct {
		rt   acl.ResourceType
		name string
		op   acl.Operation
	}
	full := []need{
		{acl.ResourceTransactionalID, "tid-%d", acl.OpWrite},
		{acl.ResourceGroup, "g-%d", acl.OpRead},
		{acl.ResourceTopic, "t", acl.OpRead},
		{acl.ResourceTopic, "t", acl.OpWrite},
	}
	row := 0
	// setup gives principal P (missing: the one need left out) a transactional id that is
	// initialized by a fully granted principal and has partition t-0 in an Ongoing transaction
	// when ongoing is set.
	setup := func(missing need, ongoing bool) (rc *rawConn, tid, grp string, pid int64, epoch int16) {
		t.Helper()
		row++
		tid, grp = fmt.Sprintf("tid-%d", row), fmt.Sprintf("g-%d", row)
		p, fullP := fmt.Sprintf("User:p-%d", row), fmt.Sprintf("User:full-%d", row)
		for _, n := range full {
			name := n.name
			if name != "t" {
				name = fmt.Sprintf(n.name, row)
			}
			ab.grant(t, allow(n.rt, name, fullP, n.op))
			if n != missing {
				ab.grant(t, allow(n.rt, name, p, n.op))
			}
		}
		fc := ab.who.raw(t, ab.addr, fullP)
		pid, epoch = rawInit(t, fc, tid)
		if ongoing {
			rawAddPartition(t, fc, tid, pid, epoch, "t", 0)
		}
		return ab.who.raw(t, ab.addr, p), tid, grp, pid, epoch
	}
	txnState := func(tid string) (string, int) {
		t.Helper()
		req := kmsg.NewPtrDescribeTransactionsRequest()
		req.TransactionalIDs = []string{tid}
		r := fxRoundTrip[*kmsg.DescribeTransactionsResponse](t, admin, req)
		st := r.TransactionStates[0]
		if st.ErrorCode != 0 {
			return kerr.ErrorForCode(st.ErrorCode).Error(), 0
		}
		return st.State, len(st.Topics)
	}
	committed := func(grp string) int64 {
		t.Helper()
		of := kmsg.NewPtrOffsetFetchRequest()
		of.Version = 7
		of.Group = grp
		of.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "t", Partitions: []int32{0}}}
		r := fxRoundTrip[*kmsg.OffsetFetchResponse](t, admin, of)
		return r.Topics[0].Partitions[0].Offset
	}
	wantCode := func(what string, got int16, want *kerr.Error) {
		t.Helper()
		if got != want.Code {
			t.Errorf("%s: got %v, want %v", what, kerr.ErrorForCode(got), want)
		}
	}
	writeID, readGroup, readTopic, writeTopic := full[0], full[1], full[2], full[3]

	// FindCoordinator (key type 1): no routing revealed without the transactional id.
	{
		rc, tid, _, _, _ := setup(writeID, false)
		fc := kmsg.NewPtrFindCoordinatorRequest()
		fc.Version, fc.CoordinatorType, fc.CoordinatorKeys = 4, 1, []string{tid}
		r := fxRoundTrip[*kmsg.FindCoordinatorResponse](t, rc, fc)
		wantCode("FindCoordinator without WRITE on the id", r.Coordinators[0].ErrorCode, kerr.TransactionalIDAuthorizationFailed)
		if r.Coordinators[0].Host != "" {
			t.Errorf("FindCoordinator revealed the coordinator: %+v", r.Coordinators[0])
		}
	}
	// InitProducerId: 53, and the id stays unknown.
	{
		rc, _, _, _, _ := setup(writeID, false)
		ip := kmsg.NewPtrInitProducerIDRequest()
		ip.Version, ip.TransactionalID, ip.TransactionTimeoutMillis = 4, kmsg.StringPtr("fresh-id"), 10000
		r := fxRoundTrip[*kmsg.InitProducerIDResponse](t, rc, ip)
		wantCode("InitProducerId without WRITE on the id", r.ErrorCode, kerr.TransactionalIDAuthorizationFailed)
		if st, _ := txnState("fresh-id"); st != kerr.TransactionalIDNotFound.Error() {
			t.Errorf("refused InitProducerId left state %s", st)
		}
	}
	// AddPartitionsToTxn: 53 without the id, 29 without WRITE on the topic; no partition added.
	for _, c := range []struct {
		missing need
		want    *kerr.Error
	}{{writeID, kerr.TransactionalIDAuthorizationFailed}, {writeTopic, kerr.TopicAuthorizationFailed}} {
		rc, tid, _, pid, epoch := setup(c.missing, false)
		req := kmsg.NewPtrAddPartitionsToTxnRequest()
		req.Version = 3
		req.TransactionalID, req.ProducerID, req.ProducerEpoch = tid, pid, epoch
		req.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "t", Partitions: []int32{0}}}
		r := fxRoundTrip[*kmsg.AddPartitionsToTxnResponse](t, rc, req)
		wantCode("AddPartitionsToTxn missing "+c.want.Message, r.Topics[0].Partitions[0].ErrorCode, c.want)
		if st, n := txnState(tid); st != "Empty" || n != 0 {
			t.Errorf("refused AddPartitionsToTxn: state %s with %d topics", st, n)
		}
	}
	// AddOffsetsToTxn: 53, then 30; the transaction does not gain the offsets partition.
	for _, c := range []struct {
		missing need
		want    *kerr.Error
	}{{writeID, kerr.TransactionalIDAuthorizationFailed}, {readGroup, kerr.GroupAuthorizationFailed}} {
		rc, tid, grp, pid, epoch := setup(c.missing, false)
		ao := kmsg.NewPtrAddOffsetsToTxnRequest()
		ao.Version = 3
		ao.TransactionalID, ao.ProducerID, ao.ProducerEpoch, ao.Group = tid, pid, epoch, grp
		r := fxRoundTrip[*kmsg.AddOffsetsToTxnResponse](t, rc, ao)
		wantCode("AddOffsetsToTxn missing "+c.want.Message, r.ErrorCode, c.want)
		if st, n := txnState(tid); st != "Empty" || n != 0 {
			t.Errorf("refused AddOffsetsToTxn: state %s with %d topics", st, n)
		}
	}
	// EndTxn: 53 and the transaction stays Ongoing.
	{
		rc, tid, _, pid, epoch := setup(writeID, true)
		end := kmsg.NewPtrEndTxnRequest()
		end.Version = 3
		end.TransactionalID, end.ProducerID, end.ProducerEpoch, end.Commit = tid, pid, epoch, true
		r := fxRoundTrip[*kmsg.EndTxnResponse](t, rc, end)
		wantCode("EndTxn without WRITE on the id", r.ErrorCode, kerr.TransactionalIDAuthorizationFailed)
		if st, _ := txnState(tid); st != "Ongoing" {
			t.Errorf("refused EndTxn: state %s", st)
		}
	}
	// TxnOffsetCommit: 53, 30, 29; nothing staged (a later commit by the full principal finds
	// no offset staged by the refused call).
	for _, c := range []struct {
		missing need
		want    *kerr.Error
	}{{writeID, kerr.TransactionalIDAuthorizationFailed}, {readGroup, kerr.GroupAuthorizationFailed}, {readTopic, kerr.TopicAuthorizationFailed}} {
		rc, tid, grp, pid, epoch := setup(c.missing, false)
		tc := kmsg.NewPtrTxnOffsetCommitRequest()
		tc.Version = 5
		tc.TransactionalID, tc.Group, tc.ProducerID, tc.ProducerEpoch, tc.Generation = tid, grp, pid, epoch, -1
		p := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset = 0, 42
		tc.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{p}}}
		r := fxRoundTrip[*kmsg.TxnOffsetCommitResponse](t, rc, tc)
		wantCode("TxnOffsetCommit missing "+c.want.Message, r.Topics[0].Partitions[0].ErrorCode, c.want)
		if st, n := txnState(tid); st != "Empty" || n != 0 {
			t.Errorf("refused TxnOffsetCommit: state %s with %d topics", st, n)
		}
		if off := committed(grp); off != -1 {
			t.Errorf("refused TxnOffsetCommit: committed offset %d", off)
		}
	}
	// Produce with a transactional id: 53 without WRITE on the id (the topic WRITE alone is not
	// enough), 29 without WRITE on the topic; nothing appended.
	for _, c := range []struct {
		missing need
		want    *kerr.Error
	}{{writeID, kerr.TransactionalIDAuthorizationFailed}, {writeTopic, kerr.TopicAuthorizationFailed}} {
		rc, tid, _, pid, epoch := setup(c.missing, false)
		before := leo()
		r := rawProduce(t, rc, 11, tid, "t", 0, txnBatch(pid, epoch, 0, "x"))
		wantCode("transactional Produce missing "+c.want.Message, r.ErrorCode, c.want)
		if leo() != before {
			t.Errorf("refused transactional Produce appended (log end %d -> %d)", before, leo())
		}
	}
	// WriteTxnMarkers: CLUSTER_ACTION on the cluster (or ALTER, as Apache 4.1), which
	// kafka-transactions abort needs granted; nothing is written without it.
	for _, grant := range []acl.Operation{acl.OpClusterAction, acl.OpAlter} {
		rc, _, _, pid, epoch := setup(need{}, true)
		wm := kmsg.NewPtrWriteTxnMarkersRequest()
		wm.Markers = []kmsg.WriteTxnMarkersRequestMarker{{ProducerID: pid, ProducerEpoch: epoch, CoordinatorEpoch: -1,
			Topics: []kmsg.WriteTxnMarkersRequestMarkerTopic{{Topic: "t", Partitions: []int32{0}}}}}
		before := leo()
		r := fxRoundTrip[*kmsg.WriteTxnMarkersResponse](t, rc, wm)
		wantCode("WriteTxnMarkers without CLUSTER_ACTION", r.Markers[0].Topics[0].Partitions[0].ErrorCode, kerr.ClusterAuthorizationFailed)
		if leo() != before {
			t.Errorf("refused WriteTxnMarkers appended (log end %d -> %d)", before, leo())
		}
		ab.grant(t, allow(acl.ResourceCluster, acl.ClusterName, fmt.Sprintf("User:p-%d", row), grant))
		r = fxRoundTrip[*kmsg.WriteTxnMarkersResponse](t, rc, wm)
		wantCode(fmt.Sprintf("WriteTxnMarkers with operation %d on the cluster", grant), r.Markers[0].Topics[0].Partitions[0].ErrorCode, &kerr.Error{Message: "NONE"})
		if leo() != before+1 {
			t.Errorf("granted WriteTxnMarkers: log end %d -> %d, want one marker", before, leo())
		}
	}
	// Idempotent InitProducerId (KIP-679 as Apache 4.1): WRITE on any topic or IDEMPOTENT_WRITE
	// on the cluster suffices; a principal with neither gets CLUSTER_AUTHORIZATION_FAILED.
	{
		ip := kmsg.NewPtrInitProducerIDRequest()
		ip.Version = 4
		ab.grant(t, allow(acl.ResourceTopic, "t", "User:writer", acl.OpWrite),
			allow(acl.ResourceCluster, acl.ClusterName, "User:idem", acl.OpIdempotentWrite))
		for p, want := range map[string]int16{"User:writer": 0, "User:idem": 0, "User:reader-only": kerr.ClusterAuthorizationFailed.Code} {
			r := fxRoundTrip[*kmsg.InitProducerIDResponse](t, ab.who.raw(t, ab.addr, p), ip)
			if r.ErrorCode != want || (want == 0 && r.ProducerID < 0) {
				t.Errorf("idempotent InitProducerId as %s: %v (pid %d)", p, kerr.ErrorForCode(r.ErrorCode), r.ProducerID)
			}
		}
	}
}

// A principal whose only bindings are PREFIXED produces to, consumes from and commits offsets
// for the resources under its prefixes, and nothing else.
func TestACLPrefixedOnlyPrincipal(t *testing.T) {
	ab := startACLBroker(t, testConfig(t))
	t.Cleanup(func() { ab.stop(t) })
	for _, tp := range []string{"team-a.orders", "other"} {
		if _, err := ab.store.CreateTopic(tp, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	const p = "User:team"
	pre := func(rt acl.ResourceType, name string, op acl.Operation) acl.Binding {
		b := allow(rt, name, p, op)
		b.PatternType = acl.PatternPrefixed
		return b
	}
	ab.grant(t, pre(acl.ResourceTopic, "team-a.", acl.OpWrite), pre(acl.ResourceTopic, "team-a.", acl.OpRead),
		pre(acl.ResourceGroup, "team-a.", acl.OpRead))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := ab.who.client(t, ab.addr, p, kgo.RecordRetries(0), kgo.ConsumerGroup("team-a.g"),
		kgo.ConsumeTopics("team-a.orders"), kgo.DisableAutoCommit())
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "team-a.orders", Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce under the prefix: %v", err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "other", Value: []byte("v")}).FirstErr(); code(err) != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("produce outside the prefix: %v", err)
	}
	var got int
	for got == 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatal("no record consumed under the prefix")
		}
		got += fs.NumRecords()
	}
	if err := cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit under the group prefix: %v", err)
	}
	adm := kadm.NewClient(ab.who.client(t, ab.addr, p))
	if _, err := adm.FetchOffsets(ctx, "other-group"); code(err) != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("OffsetFetch for a group outside the prefix: %v", err)
	}
	if ab.store.Topic("other").Partition(0).LogEndOffset() != 0 {
		t.Fatal("refused produce appended")
	}
}

// DENY wins over ALLOW, whichever pattern carries it; super users pass whatever the bindings say.
func TestACLDenyOverridesAllowAndSuperUsers(t *testing.T) {
	ab := startACLBroker(t, testConfig(t))
	t.Cleanup(func() { ab.stop(t) })
	for _, tp := range []string{"open", "secret"} {
		if _, err := ab.store.CreateTopic(tp, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	const p = "User:bob"
	deny := allow(acl.ResourceTopic, "secret", p, acl.OpWrite)
	deny.Permission = acl.PermDeny
	denyAll := allow(acl.ResourceTopic, "secret", superUser, acl.OpAll)
	denyAll.Permission = acl.PermDeny
	ab.grant(t, allow(acl.ResourceTopic, "*", p, acl.OpWrite), deny, denyAll)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := ab.who.client(t, ab.addr, p, kgo.RecordRetries(0))
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "open", Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce allowed by the wildcard: %v", err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "secret", Value: []byte("v")}).FirstErr(); code(err) != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("produce to a denied topic: %v", err)
	}
	su := ab.who.client(t, ab.addr, superUser, kgo.RecordRetries(0))
	if err := su.ProduceSync(ctx, &kgo.Record{Topic: "secret", Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("super user refused despite a DENY: %v", err)
	}
	if n := ab.store.Topic("secret").Partition(0).LogEndOffset(); n != 1 {
		t.Fatalf("secret holds %d records, want only the super user's", n)
	}
	// An unknown principal (no bindings, allow.everyone.if.no.acl.found=false) gets nothing.
	adm := kadm.NewClient(ab.who.client(t, ab.addr, "User:nobody"))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "made"); code(err) != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("CreateTopics without CREATE: %v", err)
	}
}

// List-all Metadata leaves out topics the principal may not describe; naming one answers 29;
// auto-creation needs CREATE on the cluster or the topic; KIP-430 bitsets are filled.
func TestACLMetadataHidesTopics(t *testing.T) {
	ab := startACLBroker(t, testConfig(t))
	t.Cleanup(func() { ab.stop(t) })
	for _, tp := range []string{"visible", "hidden"} {
		if _, err := ab.store.CreateTopic(tp, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	const p = "User:carol"
	ab.grant(t, allow(acl.ResourceTopic, "visible", p, acl.OpRead),
		allow(acl.ResourceTopic, "auto", p, acl.OpDescribe),
		allow(acl.ResourceTopic, "auto-ok", p, acl.OpCreate),
		allow(acl.ResourceTopic, "auto-ok", p, acl.OpDescribe),
		allow(acl.ResourceCluster, acl.ClusterName, p, acl.OpDescribe))
	rc := ab.who.raw(t, ab.addr, p)
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 10
	md.IncludeClusterAuthorizedOperations, md.IncludeTopicAuthorizedOperations = true, true
	r := fxRoundTrip[*kmsg.MetadataResponse](t, rc, md)
	var names []string
	for _, tp := range r.Topics {
		names = append(names, *tp.Topic)
		if *tp.Topic == "visible" {
			if want := int32(1<<acl.OpRead | 1<<acl.OpDescribe); tp.AuthorizedOperations != want {
				t.Errorf("visible authorized ops %b, want %b", tp.AuthorizedOperations, want)
			}
		}
	}
	if len(names) != 1 || names[0] != "visible" {
		t.Fatalf("list-all Metadata listed %v, want [visible]", names)
	}
	if want := int32(1 << acl.OpDescribe); r.AuthorizedOperations != want {
		t.Errorf("cluster authorized ops %b, want %b", r.AuthorizedOperations, want)
	}
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr("hidden")}, {Topic: kmsg.StringPtr("auto")}, {Topic: kmsg.StringPtr("auto-ok")}}
	md.AllowAutoTopicCreation = true
	r = fxRoundTrip[*kmsg.MetadataResponse](t, rc, md)
	for i, want := range []int16{kerr.TopicAuthorizationFailed.Code, kerr.TopicAuthorizationFailed.Code, 0} {
		if r.Topics[i].ErrorCode != want {
			t.Errorf("Metadata %s: %v, want %v", *r.Topics[i].Topic, kerr.ErrorForCode(r.Topics[i].ErrorCode), kerr.ErrorForCode(want))
		}
	}
	if ab.store.Topic("auto") != nil || ab.store.Topic("auto-ok") == nil {
		t.Fatal("auto-creation ignored the CREATE ACLs")
	}
	// DescribeCluster and DescribeGroups bitsets.
	dc := kmsg.NewPtrDescribeClusterRequest()
	dc.IncludeClusterAuthorizedOperations = true
	if r := fxRoundTrip[*kmsg.DescribeClusterResponse](t, rc, dc); r.ClusterAuthorizedOperations != 1<<acl.OpDescribe {
		t.Errorf("DescribeCluster ops %b", r.ClusterAuthorizedOperations)
	}
	ab.grant(t, allow(acl.ResourceGroup, "grp", p, acl.OpRead))
	dg := kmsg.NewPtrDescribeGroupsRequest()
	dg.Version, dg.Groups, dg.IncludeAuthorizedOperations = 5, []string{"grp"}, true
	if r := fxRoundTrip[*kmsg.DescribeGroupsResponse](t, rc, dg); r.Groups[0].AuthorizedOperations != 1<<acl.OpRead|1<<acl.OpDescribe {
		t.Errorf("DescribeGroups ops %b (%v)", r.Groups[0].AuthorizedOperations, kerr.ErrorForCode(r.Groups[0].ErrorCode))
	}
}

// The ACL admin APIs round-trip through kadm, need ALTER / DESCRIBE on the cluster, refuse
// invalid bindings with INVALID_REQUEST, take effect at once and survive a restart.
func TestACLAdminRoundTripSurvivesRestart(t *testing.T) {
	cfg := testConfig(t)
	ab := startACLBroker(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := ab.store.CreateTopic("logs", 1, nil); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(ab.who.client(t, ab.addr, superUser))
	// A connection opened before the grant sees it on its next request.
	daveRaw := ab.who.raw(t, ab.addr, "User:dave")
	lo := kmsg.NewPtrListOffsetsRequest()
	lo.Version, lo.ReplicaID = 7, -1
	lp := kmsg.NewListOffsetsRequestTopicPartition()
	lp.Timestamp = -1
	lo.Topics = []kmsg.ListOffsetsRequestTopic{{Topic: "logs", Partitions: []kmsg.ListOffsetsRequestTopicPartition{lp}}}
	if r := fxRoundTrip[*kmsg.ListOffsetsResponse](t, daveRaw, lo); r.Topics[0].Partitions[0].ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("ListOffsets before the grant: %v", kerr.ErrorForCode(r.Topics[0].Partitions[0].ErrorCode))
	}
	b := kadm.NewACLs().Allow("User:dave").Topics("logs").Operations(kadm.OpRead, kadm.OpDescribe)
	res, err := adm.CreateACLs(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("CreateACLs: %v", r.Err)
		}
	}
	pb := kadm.NewACLs().Allow("User:dave").Groups("dave-").ResourcePatternType(kadm.ACLPatternPrefixed).Operations(kadm.OpRead)
	if _, err := adm.CreateACLs(ctx, pb); err != nil {
		t.Fatal(err)
	}
	if r := fxRoundTrip[*kmsg.ListOffsetsResponse](t, daveRaw, lo); r.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("ListOffsets on the same connection after the grant: %v", kerr.ErrorForCode(r.Topics[0].Partitions[0].ErrorCode))
	}
	dave := kadm.NewClient(ab.who.client(t, ab.addr, "User:dave"))
	// Without ALTER / DESCRIBE on the cluster: 31.
	if r, err := dave.CreateACLs(ctx, kadm.NewACLs().Allow("User:dave").Topics("x").Operations(kadm.OpAll)); err != nil || len(r) != 1 || code(r[0].Err) != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("CreateACLs without ALTER on the cluster: %+v %v", r, err)
	}
	if r, err := dave.DescribeACLs(ctx, kadm.NewACLs().AnyResource().Allow().AllowHosts().Operations(kadm.OpAny)); err != nil || len(r) == 0 || code(r[0].Err) != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("DescribeACLs without DESCRIBE on the cluster: %+v %v", r, err)
	}
	// An invalid creation is INVALID_REQUEST (the cluster resource has one name).
	cr := kmsg.NewPtrCreateACLsRequest()
	cr.Version = 3
	c := kmsg.NewCreateACLsRequestCreation()
	c.ResourceType, c.ResourceName, c.Principal, c.Host = kmsg.ACLResourceTypeCluster, "other", "User:x", "*"
	c.Operation, c.PermissionType = kmsg.ACLOperationAlter, kmsg.ACLPermissionTypeAllow
	cr.Creations = []kmsg.CreateACLsRequestCreation{c}
	raw := ab.who.raw(t, ab.addr, superUser)
	if r := fxRoundTrip[*kmsg.CreateACLsResponse](t, raw, cr); r.Results[0].ErrorCode != kerr.InvalidRequest.Code {
		t.Fatalf("invalid creation: %v", kerr.ErrorForCode(r.Results[0].ErrorCode))
	}
	dr := kmsg.NewPtrDescribeACLsRequest()
	dr.Version = 3
	dr.ResourceType, dr.ResourcePatternType, dr.Operation, dr.PermissionType = kmsg.ACLResourceTypeAny, 0, kmsg.ACLOperationAny, kmsg.ACLPermissionTypeAny
	if r := fxRoundTrip[*kmsg.DescribeACLsResponse](t, raw, dr); r.ErrorCode != kerr.InvalidRequest.Code {
		t.Fatalf("describe filter with an UNKNOWN pattern: %v", kerr.ErrorForCode(r.ErrorCode))
	}

	ab.stop(t)
	ab = startACLBroker(t, cfg)
	t.Cleanup(func() { ab.stop(t) })
	adm = kadm.NewClient(ab.who.client(t, ab.addr, superUser))
	desc, err := adm.DescribeACLs(ctx, kadm.NewACLs().AnyResource().Allow().AllowHosts().ResourcePatternType(kadm.ACLPatternAny).Operations(kadm.OpAny))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range desc {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
		n += len(d.Described)
	}
	if n != 3 {
		t.Fatalf("after restart %d bindings described, want 3: %+v", n, desc)
	}
	dave = kadm.NewClient(ab.who.client(t, ab.addr, "User:dave"))
	if _, err := dave.FetchOffsets(ctx, "dave-g"); err != nil {
		t.Fatalf("prefixed group grant after restart: %v", err)
	}
	del, err := adm.DeleteACLs(ctx, kadm.NewACLs().Allow("User:dave").AllowHosts().Topics("logs").Operations(kadm.OpRead))
	if err != nil || len(del) != 1 || len(del[0].Deleted) != 1 || del[0].Err != nil {
		t.Fatalf("DeleteACLs: %+v %v", del, err)
	}
	// DESCRIBE remains, READ is gone: ListOffsets (DESCRIBE) works, a fetch would not.
	if _, err := dave.ListEndOffsets(ctx, "logs"); err != nil {
		t.Fatalf("ListOffsets with DESCRIBE left: %v", err)
	}
	if ab.srv.deps.ACL.Authorize("User:dave", "127.0.0.1", acl.OpRead, acl.ResourceTopic, "logs") {
		t.Fatal("deleted READ still effective")
	}
}

// Without authorizer.class.name the ACL APIs answer SECURITY_DISABLED, and everything is allowed.
func TestACLAPIsSecurityDisabledWithoutAuthorizer(t *testing.T) {
	addr, _ := newTestBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(fxClient(t, addr))
	if d, err := adm.DescribeACLs(ctx, kadm.NewACLs().AnyResource().Allow().AllowHosts().Operations(kadm.OpAny)); err != nil || len(d) == 0 || code(d[0].Err) != kerr.SecurityDisabled.Code {
		t.Fatalf("DescribeACLs: %+v %v", d, err)
	}
	r, err := adm.CreateACLs(ctx, kadm.NewACLs().Allow("User:a").Topics("t").Operations(kadm.OpRead))
	if err != nil || len(r) != 1 || code(r[0].Err) != kerr.SecurityDisabled.Code {
		t.Fatalf("CreateACLs: %+v %v", r, err)
	}
}

func aclAnyFilter() acl.Filter {
	return acl.Filter{ResourceType: acl.ResourceAny, PatternType: acl.PatternAny, Operation: acl.OpAny, Permission: acl.PermAny}
}
