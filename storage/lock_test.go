package storage

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestLockDirRefusesSecondHolderInProcess(t *testing.T) {
	dir := t.TempDir()
	l, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := os.ReadFile(filepath.Join(dir, LockFileName))
	if err != nil || strings.TrimSpace(string(buf)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q (%v), want our pid %d", buf, err, os.Getpid())
	}
	// flock belongs to the open file description: a second open in this process conflicts.
	if l2, err := LockDir(dir); err == nil {
		l2.Close()
		t.Fatal("second LockDir on the same dir succeeded")
	} else if !errors.Is(err, ErrDirLocked) || !strings.Contains(err.Error(), dir) ||
		!strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("refusal does not name dir and holder pid: %v", err)
	}
	// The refusal did not clobber the holder's pid.
	if buf2, _ := os.ReadFile(filepath.Join(dir, LockFileName)); string(buf2) != string(buf) {
		t.Fatalf("refused LockDir rewrote the lock file: %q -> %q", buf, buf2)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l3, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir after Close: %v", err)
	}
	l3.Close()
}

// TestLockDirHelperProcess is not a test: TestLockDirRefusesSecondProcess runs the test binary
// with KAAS_LOCKDIR_HELPER set, and this takes the lock in that child process.
func TestLockDirHelperProcess(t *testing.T) {
	dir := os.Getenv("KAAS_LOCKDIR_HELPER")
	if dir == "" {
		return
	}
	l, err := LockDir(dir)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(3)
	}
	l.Close()
	os.Exit(0)
}

func TestLockDirRefusesSecondProcess(t *testing.T) {
	dir := t.TempDir()
	l, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	run := func() (int, string) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLockDirHelperProcess$")
		cmd.Env = append(os.Environ(), "KAAS_LOCKDIR_HELPER="+dir)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	code, out := run()
	if code != 3 || !strings.Contains(out, dir) || !strings.Contains(out, "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("child: exit %d, output %q; want exit 3 naming %s and pid %d", code, out, dir, os.Getpid())
	}
	l.Close()
	if code, out := run(); code != 0 {
		t.Fatalf("child after release: exit %d, output %q", code, out)
	}
}
