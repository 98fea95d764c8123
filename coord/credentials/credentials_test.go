package credentials

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func mustCred(t *testing.T, m Mechanism, pw string, iter int) Credential {
	t.Helper()
	c, err := FromPassword(m, pw, iter)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestVerifyPasswordAndSaltedPasswordAgree(t *testing.T) {
	for _, m := range Mechanisms {
		c := mustCred(t, m, "pencil", 4096)
		if !c.VerifyPassword("pencil") || c.VerifyPassword("pencil ") || c.VerifyPassword("") {
			t.Fatalf("%v: VerifyPassword wrong", m)
		}
		if len(c.Salt) != 32 || c.Iterations != 4096 {
			t.Fatalf("%v: %+v", m, c)
		}
	}
}

// TestFileStoreSeesAnotherWriter: the broker's store picks up a credential written by another
// process (`kaas credentials add` on the same data dir), and concurrent writers lose nothing.
func TestFileStoreSeesAnotherWriter(t *testing.T) {
	dir := t.TempDir()
	broker, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Apply([]Change{{User: "alice", Mechanism: SHA256, Cred: mustCred(t, SHA256, "pw", 4096)}}); err != nil {
		t.Fatal(err)
	}
	// The broker's store stats the file at most every statInterval; with 0 it looks on every
	// Lookup, and the replaced file (a new inode, WriteFileAtomic) is seen at once.
	old := statInterval
	statInterval = 0
	t.Cleanup(func() { statInterval = old })
	c, ok, err := broker.Lookup("alice", SHA256)
	if err != nil || !ok || !c.VerifyPassword("pw") {
		t.Fatalf("broker store did not see the new user: %v %v", ok, err)
	}
	var wg sync.WaitGroup
	for i, s := range []*FileStore{broker, cli, broker, cli} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := string(rune('p' + i))
			if err := s.Apply([]Change{{User: user, Mechanism: SHA512, Cred: mustCred(t, SHA512, "x", 4096)}}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	reopened, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	users, _ := reopened.Users()
	if len(users) != 5 {
		t.Fatalf("lost a concurrent write: %d users", len(users))
	}
	// The file holds no password, only derived keys.
	data, _ := os.ReadFile(filepath.Join(dir, FileName))
	if strings.Contains(string(data), `"pw"`) || !strings.Contains(string(data), "stored_key") {
		t.Fatalf("file content: %s", data)
	}
}

func TestFileStoreRefusesBadChanges(t *testing.T) {
	s, err := OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	low := mustCred(t, SHA256, "pw", 4096)
	low.Iterations = 1000
	if err := s.Apply([]Change{{User: "a", Mechanism: SHA256, Cred: low}}); !errors.Is(err, ErrUnacceptable) {
		t.Fatalf("low iterations: %v", err)
	}
	if err := s.Apply([]Change{{User: "a", Mechanism: SHA256, Delete: true}}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing delete: %v", err)
	}
	if err := CheckIterations(20000, 4096); err == nil {
		t.Fatal("too many iterations accepted")
	}
	if err := CheckIterations(4096, 8192); err == nil {
		t.Fatal("configured minimum ignored")
	}
}

func TestOpenFileStoreRefusesCorruptFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte(`{"users":{"a":[{"mechanism":"SCRAM-SHA-256","iterations":10}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFileStore(dir); err == nil {
		t.Fatal("corrupt credentials accepted")
	}
}
