package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

type docItem struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

// addItem is an Update function adding it unless present.
func addItem(it docItem) func([]docItem) ([]docItem, bool, error) {
	return func(cur []docItem) ([]docItem, bool, error) {
		if slices.Contains(cur, it) {
			return cur, false, nil
		}
		return append(slices.Clone(cur), it), true, nil
	}
}

// TestDocUpdateRetriesOnConflict: broker B writes between broker A's read and A's CAS; A's
// write fails its compare, A reads again, re-runs its change on B's version, and both changes
// land.
func TestDocUpdateRetriesOnConflict(t *testing.T) {
	f := NewFake(NewManualClock(time.Unix(1000, 0)))
	key := SecurityKey("/kaas/t/", "acls")
	a, b := NewDoc[docItem](f, key, "test"), NewDoc[docItem](f.Client(), key, "test")
	conflicts := mDocConflicts.Get()
	runs := 0
	stored, rev, err := a.Update(func(cur []docItem) ([]docItem, bool, error) {
		runs++
		if runs == 1 {
			if _, _, err := b.Update(addItem(docItem{Name: "from-b"})); err != nil {
				t.Fatalf("B's update: %v", err)
			}
		}
		return addItem(docItem{Name: "from-a"})(cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	if runs != 2 || mDocConflicts.Get()-conflicts != 1 {
		t.Fatalf("A's change ran %d times with %d conflicts, want 2 and 1", runs, mDocConflicts.Get()-conflicts)
	}
	want := []docItem{{Name: "from-b"}, {Name: "from-a"}}
	if !slices.Equal(stored, want) {
		t.Fatalf("A stored %v, want %v", stored, want)
	}
	got, modRev, _, err := b.Get(context.Background())
	if err != nil || !slices.Equal(got, want) || modRev != rev {
		t.Fatalf("document = %v at %d (%v), want %v at %d", got, modRev, err, want, rev)
	}
}

// TestDocConcurrentWritersAllLand: eight writers through two clients, each adding its own items
// concurrently; nothing any of them added is lost.
func TestDocConcurrentWritersAllLand(t *testing.T) {
	f := NewFake(NewManualClock(time.Unix(1000, 0)))
	key := SecurityKey("/kaas/t/", "quotas")
	clients := []*Doc[docItem]{NewDoc[docItem](f, key, "test"), NewDoc[docItem](f.Client(), key, "test")}
	const writers, each = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, _, err := clients[w%2].Update(addItem(docItem{Name: fmt.Sprintf("w%d", w), N: i})); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, _, _, err := clients[0].Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != writers*each {
		t.Fatalf("document holds %d items, want %d", len(got), writers*each)
	}
}

// TestDocUpdateWithoutChangeOrWithErrorWritesNothing: no change means no revision is consumed,
// and an error from the change function is returned as is.
func TestDocUpdateWithoutChangeOrWithErrorWritesNothing(t *testing.T) {
	f := NewFake(NewManualClock(time.Unix(1000, 0)))
	d := NewDoc[docItem](f, SecurityKey("/kaas/t/", "scram"), "test")
	if _, _, err := d.Update(addItem(docItem{Name: "x"})); err != nil {
		t.Fatal(err)
	}
	before := f.Rev()
	stored, rev, err := d.Update(addItem(docItem{Name: "x"}))
	if err != nil || len(stored) != 1 || rev != before || f.Rev() != before {
		t.Fatalf("no-op update: %v at %d (%v), store rev %d→%d", stored, rev, err, before, f.Rev())
	}
	boom := errors.New("boom")
	if _, _, err := d.Update(func([]docItem) ([]docItem, bool, error) { return nil, true, boom }); !errors.Is(err, boom) {
		t.Fatalf("update error = %v, want boom", err)
	}
	if f.Rev() != before {
		t.Fatalf("failed update wrote: rev %d→%d", before, f.Rev())
	}
}

// TestDocTooLargeIsRefusedAndCounted: a change past docMaxBytes writes nothing.
func TestDocTooLargeIsRefusedAndCounted(t *testing.T) {
	f := NewFake(NewManualClock(time.Unix(1000, 0)))
	d := NewDoc[docItem](f, SecurityKey("/kaas/t/", "acls"), "test")
	before := mDocTooLarge.Get()
	big := docItem{Name: string(make([]byte, docMaxBytes))}
	if _, _, err := d.Update(addItem(big)); !errors.Is(err, ErrDocTooLarge) || f.Rev() != 0 || mDocTooLarge.Get() != before+1 {
		t.Fatalf("oversized update: %v, rev %d, counted %d", err, f.Rev(), mDocTooLarge.Get()-before)
	}
}

// TestDocSeedCreatesOnce: of two seeds only the first writes; the second keeps what is there.
func TestDocSeedCreatesOnce(t *testing.T) {
	ctx := context.Background()
	f := NewFake(NewManualClock(time.Unix(1000, 0)))
	key := SecurityKey("/kaas/t/", "acls")
	a, b := NewDoc[docItem](f, key, "test"), NewDoc[docItem](f.Client(), key, "test")
	if ok, err := a.Seed(ctx, nil); ok || err != nil || f.Rev() != 0 {
		t.Fatalf("empty seed: %v %v, rev %d", ok, err, f.Rev())
	}
	if ok, err := a.Seed(ctx, []docItem{{Name: "file-a"}}); !ok || err != nil {
		t.Fatalf("first seed: %v %v", ok, err)
	}
	if ok, err := b.Seed(ctx, []docItem{{Name: "file-b"}}); ok || err != nil {
		t.Fatalf("second seed: %v %v", ok, err)
	}
	if got, err := b.Load(); err != nil || !slices.Equal(got, []docItem{{Name: "file-a"}}) {
		t.Fatalf("after seeds: %v %v", got, err)
	}
}

type docVersion struct {
	items []docItem
	rev   int64
}

// TestDocFollowDeliversEveryVersion: Follow delivers the current version, then every write (of
// either client) in revision order, a deletion as no items, and skips an undecodable version.
func TestDocFollowDeliversEveryVersion(t *testing.T) {
	f := NewFake(NewManualClock(time.Unix(1000, 0)))
	key := SecurityKey("/kaas/t/", "acls")
	w := NewDoc[docItem](f, key, "test")
	if _, _, err := w.Update(addItem(docItem{Name: "before"})); err != nil {
		t.Fatal(err)
	}
	// A neighbouring key that shares the prefix is not this document.
	if _, _, err := f.Txn(context.Background(), nil, []Op{{Key: key + "-other", Value: []byte(`{"version":1,"items":[{"name":"other"}]}`)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	versions := make(chan docVersion, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewDoc[docItem](f.Client(), key, "test").Follow(ctx, zaptest.NewLogger(t), func(items []docItem, rev int64) {
			versions <- docVersion{items, rev}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	next := func() docVersion {
		t.Helper()
		select {
		case v := <-versions:
			return v
		case <-time.After(10 * time.Second):
			t.Fatal("no version within 10s")
		}
		return docVersion{}
	}
	first := next()
	if !slices.Equal(first.items, []docItem{{Name: "before"}}) || first.rev != 1 {
		t.Fatalf("first version %+v, want [before] at 1", first)
	}
	_, rev2, err := w.Update(addItem(docItem{Name: "second"}))
	if err != nil {
		t.Fatal(err)
	}
	if v := next(); v.rev != rev2 || len(v.items) != 2 {
		t.Fatalf("second version %+v, want 2 items at %d", v, rev2)
	}
	bad := mDocBad.Get()
	if _, _, err := f.Txn(context.Background(), nil, []Op{{Key: key, Value: []byte("not json")}}); err != nil {
		t.Fatal(err)
	}
	_, rev4, err := NewDoc[docItem](f.Client(), key, "test").Update(func([]docItem) ([]docItem, bool, error) {
		return []docItem{{Name: "rewritten"}}, true, nil
	})
	if err == nil {
		t.Fatal("an update over an undecodable document succeeded")
	}
	// The writer refuses to build on a version it cannot read; an operator's fix is a fresh put.
	if _, rev4, err = f.Txn(context.Background(), nil, []Op{{Key: key, Value: []byte(`{"version":1,"items":[{"name":"fixed"}]}`)}}); err != nil {
		t.Fatal(err)
	}
	if v := next(); v.rev != rev4 || !slices.Equal(v.items, []docItem{{Name: "fixed"}}) {
		t.Fatalf("after the undecodable version: %+v, want [fixed] at %d", v, rev4)
	}
	if mDocBad.Get() != bad+1 {
		t.Fatalf("undecodable versions counted %d, want 1", mDocBad.Get()-bad)
	}
	_, rev5, err := f.Txn(context.Background(), nil, []Op{{Key: key, Delete: true}})
	if err != nil {
		t.Fatal(err)
	}
	if v := next(); v.rev != rev5 || v.items != nil {
		t.Fatalf("after delete: %+v, want none at %d", v, rev5)
	}
}
