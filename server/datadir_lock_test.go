package server

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// dirTree lists every file under dir with its size, mtime and mode.
func dirTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = fmt.Sprintf("%v size=%d mtime=%d", st.Mode(), st.Size(), st.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A second broker on a live broker's data dir is refused before it reads or writes anything:
// the error names the directory and the holder's pid, every file keeps its size and mtime, and
// the first broker keeps serving every acknowledged record.
func TestSecondBrokerOnSameDataDirIsRefusedAndTouchesNothing(t *testing.T) {
	cfg := testConfig(t)
	a := startTestBroker(t, cfg)
	defer a.stop(t)
	addr := a.srv.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("locked"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, "locked"); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := 0; i < n; i++ {
		r := &kgo.Record{Key: []byte(strconv.Itoa(i % 7)), Value: []byte(fmt.Sprintf("v%04d", i))}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// Background work of A (pre-zeroing a WAL spare, ...) settles first, so a change seen
	// below can only come from B.
	var before map[string]string
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		cur := dirTree(t, cfg.DataDir)
		stable := reflect.DeepEqual(cur, before)
		before = cur
		if !stable {
			return fmt.Errorf("data dir still changing")
		}
		return nil
	})

	cfgB := cfg
	cfgB.Listeners = "127.0.0.1:0" // another free port: only the lock can stop it
	b, err := StartBroker(cfgB, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), BrokerOptions{})
	if err == nil {
		b.Close()
		t.Fatal("second broker on the same data dir started")
	}
	if b != nil {
		t.Fatal("StartBroker returned a broker with an error")
	}
	if !strings.Contains(err.Error(), cfg.DataDir) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("refusal does not name the dir and the holder pid: %v", err)
	}
	after := dirTree(t, cfg.DataDir)
	if !reflect.DeepEqual(before, after) {
		for k, v := range before {
			if after[k] != v {
				t.Errorf("%s: %s -> %q", k, v, after[k])
			}
		}
		for k, v := range after {
			if _, ok := before[k]; !ok {
				t.Errorf("%s: new file %s", k, v)
			}
		}
		t.Fatal("the refused broker touched the data dir")
	}

	// A still serves: more produces succeed and every record is readable.
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("after")}).FirstErr(); err != nil {
		t.Fatalf("produce after the refused start: %v", err)
	}
	c, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("locked"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seen := map[string]bool{}
	for len(seen) < n+1 {
		fs := c.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true })
	}
	for i := 0; i < n; i++ {
		if !seen[fmt.Sprintf("v%04d", i)] {
			t.Fatalf("record v%04d missing", i)
		}
	}
	if !seen["after"] {
		t.Fatal("record produced after the refusal missing")
	}
}
