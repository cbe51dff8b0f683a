package aggregator

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func TestTableSize(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{0, 8}, {1, 8}, {6, 8}, {7, 16}, {12, 16}, {13, 32}, {62_500, 131_072}, {98_304, 131_072}, {98_305, 262_144},
	} {
		if got := tableSize(tc.n); got != tc.want {
			t.Errorf("tableSize(%d) = %d, want %d", tc.n, got, tc.want)
		}
		if got := tableSize(tc.n); tc.n*4 > got*3 {
			t.Errorf("tableSize(%d) = %d holds it more than three quarters full", tc.n, got)
		}
	}
}

// TestTableAgainstAMap: random sets and finds, with hashes drawn from a
// small range so that probes collide and wrap around, against a Go map.
func TestTableAgainstAMap(t *testing.T) {
	for _, hashes := range []uint64{1, 7, 1 << 20} {
		t.Run(fmt.Sprintf("%d distinct hashes", hashes), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, hashes))
			var tb table // grows from nothing
			want := map[entryKey]*entry{}
			hashOf := func(k entryKey) uint64 { return (uint64(len(k.key))*31 + uint64(k.window)) % hashes << partBits }
			for i := range 5000 {
				k := entryKey{key: fmt.Sprintf("k%d", r.IntN(800)), window: int64(r.IntN(3))}
				if r.IntN(3) > 0 {
					e := &entry{key: k, accs: []acc{{n: int64(i)}}}
					tb.set(hashOf(k), e)
					want[k] = e
				}
				if got := tb.find(hashOf(k), k); got != want[k] {
					t.Fatalf("step %d: find(%v) = %v, want %v", i, k, got, want[k])
				}
			}
			if tb.n != len(want) {
				t.Fatalf("%d groups, want %d", tb.n, len(want))
			}
			seen := 0
			tb.each(func(e *entry) bool {
				if want[e.key] != e {
					t.Errorf("each yielded %v, not the latest entry of its key", e.key)
				}
				seen++
				return true
			})
			if seen != len(want) {
				t.Fatalf("each yielded %d groups, want %d", seen, len(want))
			}
			if tb.find(hashOf(entryKey{key: "absent"}), entryKey{key: "absent"}) != nil {
				t.Fatal("found a key never set")
			}
		})
	}
}

// TestStateTracksWhatChanged: a group is dirty once however often it
// folds, and a checkpoint's capture starts a new set.
func TestStateTracksWhatChanged(t *testing.T) {
	p := mustCompile(t, streamsv1alpha1.AggregationSpec{Source: "s", Aggregates: []streamsv1alpha1.AggregateSpec{{Name: "n", Function: streamsv1alpha1.AggregateCount}}})
	st := NewState(p, 0)
	for range 3 {
		for _, k := range []string{"a", "b", "a", "c"} {
			st.Fold([]byte(k), nil, 0)
		}
	}
	if st.Len() != 3 || st.Dirty() != 3 {
		t.Fatalf("%d groups, %d dirty; want 3 and 3", st.Len(), st.Dirty())
	}
	if e := st.get(entryKey{key: "a"}); e == nil || e.accs[0].n != 6 {
		t.Fatalf("group a: %+v, want a count of 6", e)
	}
	if got := st.takeDirty(); len(got) != 3 || st.Dirty() != 0 {
		t.Fatalf("took %d dirty groups, %d left; want 3 and 0", len(got), st.Dirty())
	}
	st.Fold([]byte("b"), nil, 0)
	if got := st.takeDirty(); len(got) != 1 || got[0].key.key != "b" {
		t.Fatalf("after one more fold the dirty groups are %v, want b", got)
	}
}

// TestWindowsOfAKeyShareItsPart: a key's groups are looked up in one
// part, each window by its own hash.
func TestWindowsOfAKeyShareItsPart(t *testing.T) {
	p := mustCompile(t, streamsv1alpha1.AggregationSpec{Source: "s", Window: &streamsv1alpha1.WindowSpec{Tumbling: metav1.Duration{Duration: time.Minute}}, Aggregates: []streamsv1alpha1.AggregateSpec{{Name: "n", Function: streamsv1alpha1.AggregateCount}}})
	st := NewState(p, 0)
	for w := range int64(50) {
		st.Fold([]byte("user"), nil, w*60_000+1)
		st.Fold([]byte(fmt.Sprintf("other-%d", w)), nil, w*60_000)
	}
	if st.Len() != 100 {
		t.Fatalf("%d groups, want 100", st.Len())
	}
	got := st.groups("user", 10*60_000, 20*60_000)
	if len(got) != 10 || got[0].window != 10*60_000 || got[9].window != 19*60_000 {
		t.Fatalf("groups of user in [10m, 20m): %v", got)
	}
	part, _ := st.hash(entryKey{key: "user"})
	for w := range int64(50) {
		if p2, _ := st.hash(entryKey{key: "user", window: w * 60_000}); p2 != part {
			t.Fatalf("window %d of user is in part %d, not %d", w, p2, part)
		}
	}
}

// TestFillIsSetInOrder: filling a table from a list (sorted by slot
// before it sets) ends as setting the list in order would, a later group
// of a key winning, into an empty table, a presized one, or one already
// holding groups.
func TestFillIsSetInOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, tc := range []struct {
		name         string
		start, extra int
		presize      int
	}{
		{"empty, grows", 0, 5000, 0},
		{"presized", 0, 5000, 4000},
		{"on top of groups", 3000, 5000, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var filled, want table
			if tc.presize > 0 {
				filled, want = newTable(tc.presize), newTable(tc.presize)
			}
			h := func(k entryKey) uint64 { return maphashOf(k.key) }
			for i := range tc.start {
				e := &entry{key: entryKey{key: fmt.Sprint("s", i)}}
				filled.set(h(e.key), e)
				want.set(h(e.key), e)
			}
			var groups []pendingGroup
			for i := range tc.extra {
				e := &entry{key: entryKey{key: fmt.Sprint("s", r.IntN(tc.start+tc.extra/2+1))}, accs: []acc{{n: int64(i)}}}
				groups = append(groups, pendingGroup{h(e.key), e})
				want.set(h(e.key), e)
			}
			filled.fill(groups, nil)
			if filled.n != want.n {
				t.Fatalf("%d groups, want %d", filled.n, want.n)
			}
			want.each(func(e *entry) bool {
				if got := filled.find(h(e.key), e.key); got != e {
					t.Fatalf("group %v: %v, want the last one set", e.key, got)
				}
				return true
			})
		})
	}
}

func maphashOf(s string) uint64 { return maphash.String(testSeed, s) }

var testSeed = maphash.MakeSeed()

// TestRestoreOnMoreCoresThanParts: a restore's workers each own the parts
// p%workers; with more cores than parts (a 32-core node) a worker owned
// none and the load divided by zero.
func TestRestoreOnMoreCoresThanParts(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(stateParts + 4))
	p := mustCompile(t, streamsv1alpha1.AggregationSpec{Source: "s", Aggregates: []streamsv1alpha1.AggregateSpec{{Name: "n", Function: streamsv1alpha1.AggregateCount}}})
	st := NewState(p, 0)
	for i := range 1000 {
		st.Fold(fmt.Appendf(nil, "k%d", i%300), nil, 0)
	}
	log := newMemLog()
	cp := &Checkpointer{Plan: p, Log: log, Writer: 1}
	if _, err := cp.Write(context.Background(), cp.Capture(st, 1, 0, time.Now())); err != nil {
		t.Fatal(err)
	}
	r, err := Restore(context.Background(), log, p, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.State.Len() != 300 {
		t.Fatalf("restored %d groups, want 300", r.State.Len())
	}
	for i := range 300 {
		k := entryKey{key: fmt.Sprintf("k%d", i)}
		want := int64(4)
		if i >= 1000%300 {
			want = 3
		}
		if e := r.State.get(k); e == nil || e.accs[0].n != want {
			t.Fatalf("group %s restored as %+v, want a count of %d", k.key, e, want)
		}
	}
}
