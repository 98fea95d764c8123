package group

import (
	"fmt"
	"testing"
)

// BenchmarkUniformAssignorRebalance times one target computation of a sticky rebalance: 100
// members over 1000 partitions of 10 topics, one member joining a balanced group.
func BenchmarkUniformAssignorRebalance(b *testing.B) {
	parts := map[topicID]int32{}
	var all []topicID
	for i := 0; i < 10; i++ {
		parts[tid(byte(i+1))] = 100
		all = append(all, tid(byte(i+1)))
	}
	var ms []assignMember
	for i := 0; i < 99; i++ {
		ms = append(ms, assignMember{id: fmt.Sprintf("m%03d", i), topics: subs(all...)})
	}
	first := uniformAssignor{}.assign(ms, parts)
	for i := range ms {
		ms[i].current = first[ms[i].id]
	}
	ms = append(ms, assignMember{id: "new", topics: subs(all...)})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		uniformAssignor{}.assign(ms, parts)
	}
}

// BenchmarkRangeAssignor times the range assignor on the same group.
func BenchmarkRangeAssignor(b *testing.B) {
	parts := map[topicID]int32{}
	var all []topicID
	for i := 0; i < 10; i++ {
		parts[tid(byte(i+1))] = 100
		all = append(all, tid(byte(i+1)))
	}
	var ms []assignMember
	for i := 0; i < 100; i++ {
		ms = append(ms, assignMember{id: fmt.Sprintf("m%03d", i), topics: subs(all...)})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rangeAssignor{}.assign(ms, parts)
	}
}
