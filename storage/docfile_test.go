package storage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDocFileRoundTripAndRefusals(t *testing.T) {
	type item struct{ A string }
	d := DocFile[item]{Dir: filepath.Join(t.TempDir(), "sub"), Name: "x.json", Key: "items", What: "test"}
	if got, err := d.Load(); err != nil || got != nil {
		t.Fatalf("missing file: %v %v", got, err)
	}
	if err := d.Save([]item{{"a"}, {"b"}}); err != nil {
		t.Fatal(err)
	}
	got, err := d.Load()
	if err != nil || len(got) != 2 || got[1].A != "b" {
		t.Fatalf("round trip: %v %v", got, err)
	}
	for name, body := range map[string]string{
		"garbage":       "{not json",
		"other version": `{"version":2,"items":[]}`,
		"no version":    `{"items":[]}`,
		"bad items":     `{"version":1,"items":{"A":1}}`,
	} {
		if err := os.WriteFile(filepath.Join(d.Dir, d.Name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Load(); err == nil || !strings.Contains(err.Error(), "x.json") {
			t.Fatalf("%s: err %v, want a refusal naming the file", name, err)
		}
	}
}
