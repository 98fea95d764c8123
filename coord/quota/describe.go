package quota

import "fmt"

// Match types of a DescribeClientQuotas component (Kafka's ClientQuotaFilterComponent).
const (
	MatchExact   int8 = 0
	MatchDefault int8 = 1
	MatchAny     int8 = 2
)

// Component is one filter component: an entity type and how its name must match.
type Component struct {
	Type  string
	Match int8
	Name  *string // MatchExact only
}

// ValidateFilter applies Apache's checks: known entity types, each at most once, a name exactly
// for MatchExact.
func ValidateFilter(cs []Component) error {
	seen := map[string]bool{}
	for _, c := range cs {
		if c.Type != TypeUser && c.Type != TypeClientID {
			return fmt.Errorf("%w: entity type %q is not supported", ErrInvalid, c.Type)
		}
		if seen[c.Type] {
			return fmt.Errorf("%w: entity type %q appears more than once in the filter", ErrInvalid, c.Type)
		}
		seen[c.Type] = true
		switch c.Match {
		case MatchExact:
			if c.Name == nil {
				return fmt.Errorf("%w: an exact match on %s needs a name", ErrInvalid, c.Type)
			}
		case MatchDefault, MatchAny:
			if c.Name != nil {
				return fmt.Errorf("%w: match type %d on %s takes no name", ErrInvalid, c.Match, c.Type)
			}
		default:
			return fmt.Errorf("%w: unknown match type %d", ErrInvalid, c.Match)
		}
	}
	return nil
}

// Describe lists the entries the filter matches; strict excludes entities with entity types
// the filter does not name.
func (m *Manager) Describe(cs []Component, strict bool) []Entry {
	var out []Entry
	for _, e := range m.Entries() {
		if matches(e.Entity, cs, strict) {
			out = append(out, e)
		}
	}
	return out
}

func matches(e Entity, cs []Component, strict bool) bool {
	named := map[string]bool{}
	for _, c := range cs {
		named[c.Type] = true
		n := e.User
		if c.Type == TypeClientID {
			n = e.Client
		}
		switch {
		case !n.Present:
			return false
		case c.Match == MatchExact && (n.Default || n.Name != *c.Name):
			return false
		case c.Match == MatchDefault && !n.Default:
			return false
		}
	}
	if strict {
		if e.User.Present && !named[TypeUser] || e.Client.Present && !named[TypeClientID] {
			return false
		}
	}
	return true
}
