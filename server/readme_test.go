package server

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

// TestReadmeListsServedAPIs keeps README.md's "What is served" table true: every registered API
// appears with exactly its registered versions, and nothing else does.
func TestReadmeListsServedAPIs(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(data)
	i := strings.Index(section, "## What is served")
	if i < 0 {
		t.Fatal("README has no 'What is served' section")
	}
	section = section[i:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	documented := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.Contains(line, "---") || strings.TrimSpace(cells[1]) == "API" {
			continue
		}
		names := strings.Split(cells[1], ",")
		vers := strings.Split(cells[2], ",")
		if len(names) != len(vers) {
			t.Fatalf("README row %q: %d names but %d version ranges", line, len(names), len(vers))
		}
		for k := range names {
			documented[strings.ToLower(strings.TrimSpace(names[k]))] = strings.TrimSpace(vers[k])
		}
	}
	for _, r := range codec.Registered() {
		name := strings.ToLower(kmsg.NameForKey(r.Key))
		want := fmt.Sprintf("%d–%d", r.Min, r.Max)
		if r.Min == r.Max {
			want = fmt.Sprint(r.Min)
		}
		got, ok := documented[name]
		if !ok {
			t.Errorf("README does not list %s (%s)", kmsg.NameForKey(r.Key), want)
			continue
		}
		if got != want {
			t.Errorf("README lists %s as %s, served %s", kmsg.NameForKey(r.Key), got, want)
		}
		delete(documented, name)
	}
	for name := range documented {
		t.Errorf("README lists %s, which is not served", name)
	}
}
