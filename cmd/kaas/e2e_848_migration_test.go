package main

// End-to-end test of KIP-848 online migration driven by the Apache Kafka 4.1.1 Java consumer: a
// rolling upgrade of three exactly-once copiers (testdata/Copier848.java) from group.protocol=classic
// to group.protocol=consumer, one member at a time (SIGTERM, then restart with the new protocol),
// mid-copy. The first consumer-protocol member converts the classic group online; the classic
// members go on inside the consumer group until they are replaced. The verdict is the one of
// TestKIP848JavaTxnCopy: read_committed output holds every input record exactly once and the
// group's committed offsets are the input end offsets.

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestKIP848JavaRollingUpgrade(t *testing.T) {
	requireKafkaLib(t)
	b := startE2EBroker(t)
	addr := b.Addr()
	const inParts, outParts, n = 6, 3, 16000
	in, out, group := e2eName("inmig"), e2eName("outmig"), e2eName("grpmig")
	e2eCreateTopic(t, addr, in, inParts)
	e2eCreateTopic(t, addr, out, outParts)
	seeded := e2eTxnSeed(t, addr, in, n)
	classes := e2e848Compile(t)

	cl := e2eTxnClient(t, addr)
	adm := kadm.NewClient(cl)
	inEnds, err := e2eTxnListOffsets(cl, in, inParts, e2eTxnReadUncommitted)
	if err != nil {
		t.Fatalf("ListOffsets %s: %v", in, err)
	}
	progress := func() (done int64) {
		c, err := e2e848Committed(adm, group, in)
		if err != nil {
			return 0
		}
		for _, o := range c {
			done += o
		}
		return done
	}
	waitAssigned := func(m *e2e848Member) {
		t.Helper()
		e2eEventually(t, 90*time.Second, "member "+m.name+" assigned partitions", func() error {
			if m.exited() {
				return fmt.Errorf("member %s exited: %s: %w", m.name, m.stderrTail(), errPollAbort)
			}
			if a, _, _ := m.snapshot(); len(a) == 0 {
				return fmt.Errorf("member %s owns no partition yet", m.name)
			}
			return nil
		})
	}
	// describe is ConsumerGroupDescribe of the group: (error code, members, classic members).
	describe := func() (int16, int, int) {
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Groups = []string{group}
		resp, err := req.RequestWith(t.Context(), cl)
		if err != nil || len(resp.Groups) != 1 {
			return -1, 0, 0
		}
		g := resp.Groups[0]
		classic := 0
		for _, m := range g.Members {
			if m.MemberType == 0 {
				classic++
			}
		}
		return g.ErrorCode, len(g.Members), classic
	}

	members := map[string]*e2e848Member{}
	for _, name := range []string{"c1", "c2", "c3"} {
		members[name] = e2e848StartProtocol(t, classes, addr, in, out, group, name, "classic")
	}
	for _, name := range []string{"c1", "c2", "c3"} {
		waitAssigned(members[name])
	}
	e2eEventually(t, 60*time.Second, "first commits", func() error {
		if p := progress(); p == 0 {
			return fmt.Errorf("nothing committed yet")
		}
		return nil
	})
	// The rolling upgrade: each classic member is stopped and replaced by a consumer-protocol one.
	for i, name := range []string{"c1", "c2", "c3"} {
		if p := progress(); p >= n {
			t.Fatalf("the copy finished (%d/%d) before step %d of the upgrade: too fast for the test", p, n, i+1)
		}
		t.Logf("upgrading %s at progress %d/%d", name, progress(), n)
		old := members[name]
		old.signal(syscall.SIGTERM)
		<-old.done
		if _, _, closed := old.snapshot(); !closed {
			t.Errorf("%s did not close cleanly: %v\n%s", name, old.exitErr, old.stderrTail())
		}
		up := "u" + name[1:]
		members[up] = e2e848StartProtocol(t, classes, addr, in, out, group, up, "consumer")
		waitAssigned(members[up])
		wantClassic := 2 - i
		e2eEventually(t, 60*time.Second, "the consumer group with its classic members", func() error {
			code, all, classic := describe()
			if code != 0 || all != 3 || classic != wantClassic {
				return fmt.Errorf("ConsumerGroupDescribe: code %d, %d members, %d classic (want 3, %d)", code, all, classic, wantClassic)
			}
			return nil
		})
	}
	start := time.Now()
	e2e848WaitCopied(t, adm, group, in, inParts, inEnds, members, "u1", "u2", "u3")
	t.Logf("copy done %s after the last upgrade", time.Since(start).Round(time.Millisecond))
	for _, name := range []string{"u1", "u2", "u3"} {
		m := members[name]
		m.signal(syscall.SIGTERM)
		<-m.done
	}

	hwm := e2eTxnWaitStable(t, cl, out, outParts, 30*time.Second)
	e2e848ExactlyOnce(t, addr, out, hwm, seeded, n)
}
