package quota

import "testing"

// TestReplaceAppliesNewerVersionsOnly: a version from the cluster watch replaces the quotas,
// an older one is ignored, and one with an invalid value is refused whole.
func TestReplaceAppliesNewerVersionsOnly(t *testing.T) {
	m := newManager(t, t.TempDir())
	alice := Entity{User: user("alice")}
	if err := m.Replace([]Entry{{Entity: alice, Values: Values{ProducerByteRate: 10}}}, 7); err != nil {
		t.Fatal(err)
	}
	if es := m.Entries(); len(es) != 1 || es[0].Values[ProducerByteRate] != 10 || m.Revision() != 7 || !m.Active() {
		t.Fatalf("after revision 7: %+v rev %d", es, m.Revision())
	}
	if err := m.Replace(nil, 6); err != nil || len(m.Entries()) != 1 || m.Revision() != 7 {
		t.Fatalf("older revision 6 applied: %v, %+v", err, m.Entries())
	}
	if err := m.Replace([]Entry{{Entity: alice, Values: Values{ProducerByteRate: -1}}}, 8); err == nil || m.Entries()[0].Values[ProducerByteRate] != 10 {
		t.Fatalf("invalid version applied: %v, %+v", err, m.Entries())
	}
	if err := m.Replace(nil, 9); err != nil || m.Active() || m.Revision() != 9 {
		t.Fatalf("deletion at revision 9 not applied: %v, %+v", err, m.Entries())
	}
}
