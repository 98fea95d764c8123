package acl

import (
	"fmt"
	"testing"
)

// BenchmarkAuthorize checks one topic READ against n bindings: literal topics, prefixes of
// varying length and a handful of wildcard entries. ns/op stays flat as n grows (the index
// looks up the name, the "*" literal and each distinct prefix length, never the whole set).
func BenchmarkAuthorize(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("bindings=%d", n), func(b *testing.B) {
			bs := make([]Binding, 0, n)
			for i := 0; len(bs) < n; i++ {
				p := fmt.Sprintf("User:u%d", i%50)
				switch i % 4 {
				case 0, 1:
					bs = append(bs, lit(ResourceTopic, fmt.Sprintf("topic-%d", i), p, OpRead, PermAllow))
				case 2:
					bs = append(bs, pre(ResourceTopic, fmt.Sprintf("team%d-", i), p, OpWrite, PermAllow))
				case 3:
					bs = append(bs, lit(ResourceGroup, fmt.Sprintf("group-%d", i), p, OpRead, PermAllow))
				}
			}
			bs = append(bs, lit(ResourceTopic, "*", "User:ops", OpDescribe, PermAllow))
			a := newAuth(b, Config{}, bs...)
			name := "topic-" + fmt.Sprint((n/2)&^3)
			want := fmt.Sprintf("User:u%d", ((n/2)&^3)%50)
			if !a.Authorize(want, "127.0.0.1", OpRead, ResourceTopic, name) {
				b.Fatal("expected allow")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				a.Authorize(want, "127.0.0.1", OpRead, ResourceTopic, name)
			}
		})
	}
}
