package quota

import (
	"errors"
	"testing"
	"time"
)

func user(n string) Name { return Name{Present: true, Name: n} }
func def() Name          { return Name{Present: true, Default: true} }

func newManager(t *testing.T, dir string) *Manager {
	t.Helper()
	m, err := New(Config{}, NewFileStore(dir))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func set(t *testing.T, m *Manager, e Entity, key string, v float64) {
	t.Helper()
	if err := m.Alter(e, []Op{{Key: key, Value: v}}, false); err != nil {
		t.Fatal(err)
	}
}

// Apache's eight-level order, per key; defaults give each user its own sensor.
func TestResolvePrecedence(t *testing.T) {
	m := newManager(t, t.TempDir())
	set(t, m, Entity{Client: def()}, ProducerByteRate, 8)
	set(t, m, Entity{Client: user("c")}, ProducerByteRate, 7)
	set(t, m, Entity{User: def()}, ProducerByteRate, 6)
	set(t, m, Entity{User: user("alice")}, ProducerByteRate, 3)
	set(t, m, Entity{User: user("alice"), Client: user("c")}, ProducerByteRate, 1)
	set(t, m, Entity{User: user("bob")}, ConsumerByteRate, 100)
	snap := m.snap.Load()
	f := func(k Kind, u, c string, want float64, wantKey sensorKey) {
		t.Helper()
		got, sk, ok := m.resolve(snap, k, u, c)
		if !ok || got != want || sk != wantKey {
			t.Errorf("%d %s/%s: %v %+v %v, want %v %+v", k, u, c, got, sk, ok, want, wantKey)
		}
	}
	f(Produce, "alice", "c", 1, sensorKey{kind: Produce, user: "alice", client: "c", hasUser: true, hasClient: true})
	f(Produce, "alice", "other", 3, sensorKey{kind: Produce, user: "alice", hasUser: true})
	f(Produce, "bob", "c", 6, sensorKey{kind: Produce, user: "bob", hasUser: true})
	f(Fetch, "bob", "c", 100, sensorKey{kind: Fetch, user: "bob", hasUser: true})
	if _, _, ok := m.resolve(snap, Fetch, "carol", "c"); ok {
		t.Error("fetch quota resolved for carol, none is set")
	}
	if err := m.Alter(Entity{User: def()}, []Op{{Key: ProducerByteRate, Remove: true}}, false); err != nil {
		t.Fatal(err)
	}
	snap = m.snap.Load()
	f(Produce, "bob", "c", 7, sensorKey{kind: Produce, client: "c", hasClient: true})
	f(Produce, "bob", "z", 8, sensorKey{kind: Produce, client: "z", hasClient: true})
}

// A client at twice its byte rate is throttled for about as long as it overshot; one under it
// is not.
func TestRecordThrottle(t *testing.T) {
	m := newManager(t, t.TempDir())
	now := time.Unix(1000, 0)
	m.now = func() time.Time { return now }
	set(t, m, Entity{User: user("p")}, ProducerByteRate, 1000)
	// 10 windows at 1000 B/s: no throttle.
	for i := 0; i < 10; i++ {
		if d := m.Record(Produce, "p", "c", 1000); d != 0 {
			t.Fatalf("throttled at the quota: %v", d)
		}
		now = now.Add(time.Second)
	}
	// A burst of 10000 bytes: rate = 20000 / 10 s = 2000 B/s, twice the bound: throttle of one
	// full elapsed span (10 s), as Apache's (rate - bound) / bound × window.
	d := m.Record(Produce, "p", "c", 10000)
	if d < 9*time.Second || d > 11*time.Second {
		t.Fatalf("throttle %v, want about 10s", d)
	}
	// Another user has no quota.
	if d := m.Record(Produce, "q", "c", 1e9); d != 0 {
		t.Fatalf("unquoted user throttled %v", d)
	}
}

func TestAlterValidationAndDurability(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, dir)
	for _, op := range []Op{{Key: ProducerByteRate, Value: 1.5}, {Key: ConsumerByteRate, Value: -1},
		{Key: RequestPercentage, Value: 0}, {Key: "controller_mutation_rate", Value: 1}} {
		if err := m.Alter(Entity{User: user("a")}, []Op{op}, false); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v accepted: %v", op, err)
		}
	}
	if err := m.Alter(Entity{User: user("a")}, []Op{{Key: RequestPercentage, Value: 50}}, true); err != nil || m.Active() {
		t.Fatalf("validate-only stored something: %v", err)
	}
	set(t, m, Entity{User: user("a"), Client: def()}, RequestPercentage, 50)
	set(t, m, Entity{Client: user("c")}, ConsumerByteRate, 2048)
	m2 := newManager(t, dir)
	if got := m2.Entries(); len(got) != 2 {
		t.Fatalf("reopened %d entries: %+v", len(got), got)
	}
	name := "c"
	if got := m2.Describe([]Component{{Type: TypeClientID, Match: MatchExact, Name: &name}}, true); len(got) != 1 || got[0].Values[ConsumerByteRate] != 2048 {
		t.Fatalf("describe exact client: %+v", got)
	}
	if got := m2.Describe([]Component{{Type: TypeUser, Match: MatchAny}}, false); len(got) != 1 || !got[0].Entity.Client.Default {
		t.Fatalf("describe any user: %+v", got)
	}
	if got := m2.Describe([]Component{{Type: TypeUser, Match: MatchAny}}, true); len(got) != 0 {
		t.Fatalf("strict describe any user matched user+client: %+v", got)
	}
	if got := m2.Describe(nil, false); len(got) != 2 {
		t.Fatalf("describe all: %+v", got)
	}
	if err := ValidateFilter([]Component{{Type: TypeUser, Match: MatchExact}}); err == nil {
		t.Fatal("exact match without a name accepted")
	}
}
