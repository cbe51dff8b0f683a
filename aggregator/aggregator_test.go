package aggregator

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

type rec struct {
	key, value string
	ts         int64
}

func testSpec(window time.Duration, keyField string) streamsv1alpha1.AggregationSpec {
	s := streamsv1alpha1.AggregationSpec{
		Source: "orders",
		Key:    streamsv1alpha1.AggregationKey{Field: keyField},
		Aggregates: []streamsv1alpha1.AggregateSpec{
			{Name: "n", Function: streamsv1alpha1.AggregateCount},
			{Name: "total", Function: streamsv1alpha1.AggregateSum, Field: "amount"},
			{Name: "low", Function: streamsv1alpha1.AggregateMin, Field: "amount"},
			{Name: "high", Function: streamsv1alpha1.AggregateMax, Field: "amount"},
			{Name: "buyers", Function: streamsv1alpha1.AggregateDistinctCount, Field: "user.id"},
		},
		CheckpointInterval: metav1.Duration{Duration: time.Second},
		SnapshotEvery:      4,
	}
	if window > 0 {
		s.Window = &streamsv1alpha1.WindowSpec{Tumbling: metav1.Duration{Duration: window}}
	}
	return s
}

func mustCompile(t testing.TB, s streamsv1alpha1.AggregationSpec) *Plan {
	t.Helper()
	p, err := Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// render is a state in a comparable form: every group's values with
// floats by their bits, and the skipped counter.
func render(st *State) map[string]string {
	out := map[string]string{"#skipped": fmt.Sprint(st.Skipped)}
	for k, e := range st.all {
		var b strings.Builder
		for i, ag := range st.plan.aggregates {
			ac := e.accs[i]
			switch ag.fn {
			case fnDistinct:
				vs := make([]string, 0, len(ac.set))
				for v := range ac.set {
					vs = append(vs, v)
				}
				sort.Strings(vs)
				fmt.Fprintf(&b, "%s=%v ", ag.name, vs)
			default:
				fmt.Fprintf(&b, "%s=%d/%x ", ag.name, ac.n, math.Float64bits(ac.f))
			}
		}
		out[fmt.Sprintf("%q@%d", k.key, k.window)] = b.String()
	}
	return out
}

func sameState(t *testing.T, got, want *State) {
	t.Helper()
	g, w := render(got), render(want)
	for k, v := range w {
		if g[k] != v {
			t.Fatalf("group %s: got %q, want %q (got %d groups, want %d)", k, g[k], v, len(g), len(w))
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			t.Fatalf("group %s should not exist", k)
		}
	}
}

func TestCompileRejects(t *testing.T) {
	good := testSpec(0, "")
	for _, tc := range []struct {
		name string
		mut  func(*streamsv1alpha1.AggregationSpec)
		want string
	}{
		{"no source", func(s *streamsv1alpha1.AggregationSpec) { s.Source = "" }, "spec.source"},
		{"no aggregates", func(s *streamsv1alpha1.AggregationSpec) { s.Aggregates = nil }, "at least one"},
		{"sum without field", func(s *streamsv1alpha1.AggregationSpec) { s.Aggregates[1].Field = "" }, "needs a field"},
		{"unknown function", func(s *streamsv1alpha1.AggregationSpec) { s.Aggregates[0].Function = "Avg" }, "not one of"},
		{"duplicate name", func(s *streamsv1alpha1.AggregationSpec) { s.Aggregates[1].Name = "n" }, "used twice"},
		{"empty path element", func(s *streamsv1alpha1.AggregationSpec) { s.Key.Field = "user..id" }, "empty path element"},
		{"short interval", func(s *streamsv1alpha1.AggregationSpec) { s.CheckpointInterval.Duration = time.Millisecond }, "1s minimum"},
		{"short window", func(s *streamsv1alpha1.AggregationSpec) {
			s.Window = &streamsv1alpha1.WindowSpec{Tumbling: metav1.Duration{Duration: time.Millisecond}}
		}, "1s minimum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := *good.DeepCopy()
			tc.mut(&s)
			_, err := Compile(s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Compile: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := Compile(good); err != nil {
		t.Fatal(err)
	}
}

func TestFingerprintIgnoresOperationalFields(t *testing.T) {
	a := testSpec(0, "")
	b := *a.DeepCopy()
	b.CheckpointInterval.Duration, b.SnapshotEvery, b.Workers = time.Minute, 50, 7
	if mustCompile(t, a).Fingerprint != mustCompile(t, b).Fingerprint {
		t.Fatal("interval, snapshot cadence and workers must not change the fingerprint")
	}
	c := *a.DeepCopy()
	c.Aggregates[1].Field = "price"
	if mustCompile(t, a).Fingerprint == mustCompile(t, c).Fingerprint {
		t.Fatal("a different field must change the fingerprint")
	}
}

func TestFold(t *testing.T) {
	for _, tc := range []struct {
		name     string
		window   time.Duration
		keyField string
		recs     []rec
		// want: group -> rendered values as Get shows them
		want    map[string]string
		skipped uint64
	}{
		{
			name: "record key",
			recs: []rec{
				{"a", `{"amount": 2.5, "user": {"id": "u1"}}`, 0},
				{"a", `{"amount": -1, "user": {"id": "u2"}}`, 0},
				{"a", `{"amount": 4, "user": {"id": "u1"}}`, 0},
				{"b", `{"amount": 7}`, 0},
			},
			want: map[string]string{"a@0": "n=3 total=5.5 low=-1 high=4 buyers=2", "b@0": "n=1 total=7 low=7 high=7 buyers=0"},
		},
		{
			name: "fields missing or not numbers are left out of their aggregate",
			recs: []rec{
				{"a", `{"amount": "12", "user": {"id": 42}}`, 0},
				{"a", `{"user": {"id": "42"}}`, 0},
				{"a", `not json`, 0},
				{"a", `{"amount": 1e400}`, 0},
			},
			want: map[string]string{"a@0": "n=4 total=0 low=- high=- buyers=1"},
		},
		{
			name:     "key from a JSON field; records without it are skipped",
			keyField: "user.id",
			recs: []rec{
				{"x", `{"amount": 1, "user": {"id": "u1"}}`, 0},
				{"y", `{"amount": 2, "user": {"id": "u1"}}`, 0},
				{"z", `{"amount": 3, "user": {"id": 7}}`, 0},
				{"z", `{"amount": 3}`, 0},
				{"z", `[1,2]`, 0},
			},
			want:    map[string]string{"u1@0": "n=2 total=3 low=1 high=2 buyers=1", "7@0": "n=1 total=3 low=3 high=3 buyers=1"},
			skipped: 2,
		},
		{
			name: "records without a key are skipped",
			recs: []rec{{"", `{"amount": 1}`, 0}, {"k", `{"amount": 1}`, 0}},
			want: map[string]string{"k@0": "n=1 total=1 low=1 high=1 buyers=0"}, skipped: 1,
		},
		{
			name:   "tumbling windows by timestamp, before 1970 too",
			window: 10 * time.Second,
			recs: []rec{
				{"a", `{"amount": 1}`, 9_999},
				{"a", `{"amount": 2}`, 10_000},
				{"a", `{"amount": 3}`, 19_999},
				{"a", `{"amount": 5}`, -1},
			},
			want: map[string]string{
				"a@0": "n=1 total=1 low=1 high=1 buyers=0", "a@10000": "n=2 total=5 low=2 high=3 buyers=0",
				"a@-10000": "n=1 total=5 low=5 high=5 buyers=0",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, testSpec(tc.window, tc.keyField))
			st := NewState(p, 0)
			for _, r := range tc.recs {
				st.Fold([]byte(r.key), []byte(r.value), r.ts)
			}
			got := map[string]string{}
			for k, e := range st.all {
				var parts []string
				for _, v := range p.values(e) {
					switch {
					case v.Value == nil:
						parts = append(parts, v.Name+"=-")
					case v.GetFunction() == "Count" || v.GetFunction() == "DistinctCount":
						parts = append(parts, fmt.Sprintf("%s=%d", v.Name, v.GetIntValue()))
					default:
						parts = append(parts, fmt.Sprintf("%s=%g", v.Name, v.GetFloatValue()))
					}
				}
				got[fmt.Sprintf("%s@%d", k.key, k.window)] = strings.Join(parts, " ")
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got  %v\nwant %v", got, tc.want)
			}
			if st.Skipped != tc.skipped {
				t.Fatalf("skipped %d, want %d", st.Skipped, tc.skipped)
			}
		})
	}
}

// genRecords makes n records over keys keys, some of them unfoldable.
func genRecords(r *rand.Rand, n, keys int) []rec {
	out := make([]rec, n)
	for i := range out {
		k := fmt.Sprintf("k%05d", r.IntN(keys))
		var v string
		switch r.IntN(20) {
		case 0:
			v = "garbage"
		case 1:
			k = ""
			v = `{"amount": 1}`
		default:
			v = fmt.Sprintf(`{"amount": %.3f, "user": {"id": "u%d"}}`, r.Float64()*1000-100, r.IntN(50))
		}
		out[i] = rec{k, v, int64(r.IntN(3_600_000))}
	}
	return out
}

func foldAll(p *Plan, recs []rec) *State {
	st := NewState(p, 0)
	for _, r := range recs {
		st.Fold([]byte(r.key), []byte(r.value), r.ts)
	}
	return st
}

func TestCheckpointRoundTrip(t *testing.T) {
	ctx := context.Background()
	for _, window := range []time.Duration{0, time.Minute} {
		p := mustCompile(t, testSpec(window, ""))
		r := rand.New(rand.NewPCG(1, 2))
		recs := genRecords(r, 5000, 700)
		log := newMemLog()
		cp := &Checkpointer{Plan: p, Log: log, Shard: 3, Partition: 1, Writer: 9, ChunkBytes: 4 << 10}
		st := NewState(p, 0)
		for i, x := range recs {
			st.Fold([]byte(x.key), []byte(x.value), x.ts)
			if i%700 == 699 {
				if _, err := cp.Write(ctx, cp.Capture(st, uint64(i+1), 0, time.Now())); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := Restore(ctx, log, p, 3, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got.SourceOffset != 4900 || got.Loaded != 3 || len(got.Skipped) != 0 {
			t.Fatalf("restored at %d from %d checkpoints (skipped %v); want 4900 from a snapshot and 2 increments", got.SourceOffset, got.Loaded, got.Skipped)
		}
		sameState(t, got.State, foldAll(p, recs[:4900]))
		// Another shard's checkpoints in the same partition are not loaded.
		other, err := Restore(ctx, log, p, 4, 1, 0)
		if err != nil || other.State.Len() != 0 || other.Loaded != 0 {
			t.Fatalf("shard 4: %v, %d groups", err, other.State.Len())
		}
	}
}

// TestRestoreFallsBack writes six checkpoints (snapshot every 4: S I I I
// S I) and damages them one way per case.
func TestRestoreFallsBack(t *testing.T) {
	ctx := context.Background()
	p := mustCompile(t, testSpec(0, ""))
	recs := genRecords(rand.New(rand.NewPCG(5, 6)), 600, 90)
	type ck struct{ manifest, end uint64 }
	build := func(log *memLog) []ck {
		cp := &Checkpointer{Plan: p, Log: log, Shard: 0, Partition: 0, Writer: 1, ChunkBytes: 512}
		st := NewState(p, 0)
		var cks []ck
		for i, x := range recs {
			st.Fold([]byte(x.key), []byte(x.value), x.ts)
			if (i+1)%100 == 0 {
				w, err := cp.Write(ctx, cp.Capture(st, uint64(i+1), 0, time.Now()))
				if err != nil {
					t.Fatal(err)
				}
				cks = append(cks, ck{w.ManifestOffset, uint64(i + 1)})
			}
		}
		return cks
	}
	for _, tc := range []struct {
		name   string
		damage func(*memLog, []ck)
		want   uint64 // source offset restored
		loaded int
	}{
		{"intact", func(*memLog, []ck) {}, 600, 2},
		{"torn: chunks of a seventh without its manifest", func(l *memLog, cks []ck) {
			l.Append(ctx, 0, [][]byte{appendChunkHeader(nil, chunkHeader{writer: 1, seq: 7, entries: 0})})
		}, 600, 2},
		{"corrupt chunk in the last increment", func(l *memLog, cks []ck) { l.corrupt(0, cks[5].manifest-1, 40) }, 500, 1},
		{"corrupt manifest of the last increment", func(l *memLog, cks []ck) { l.corrupt(0, cks[5].manifest, 30) }, 500, 1},
		{"corrupt second snapshot: back to the first chain", func(l *memLog, cks []ck) { l.corrupt(0, cks[4].manifest-1, 50) }, 400, 4},
		{"corrupt middle increment of the first chain, second chain intact", func(l *memLog, cks []ck) { l.corrupt(0, cks[2].manifest, 30) }, 600, 2},
		{"everything corrupt: empty state", func(l *memLog, cks []ck) {
			for _, c := range cks {
				l.corrupt(0, c.manifest, 20)
			}
		}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := newMemLog()
			cks := build(log)
			tc.damage(log, cks)
			got, err := Restore(ctx, log, p, 0, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got.SourceOffset != tc.want || got.Loaded != tc.loaded {
				t.Fatalf("restored at %d from %d checkpoints, want %d from %d; skipped: %v", got.SourceOffset, got.Loaded, tc.want, tc.loaded, got.Skipped)
			}
			sameState(t, got.State, foldAll(p, recs[:tc.want]))
		})
	}
	t.Run("another spec's checkpoints are not loaded", func(t *testing.T) {
		log := newMemLog()
		build(log)
		s := testSpec(0, "")
		s.Aggregates = s.Aggregates[:2]
		q := mustCompile(t, s)
		got, err := Restore(ctx, log, q, 0, 0, 0)
		if err != nil || got.Loaded != 0 || got.State.Len() != 0 || len(got.Skipped) == 0 {
			t.Fatalf("got %+v, %v", got, err)
		}
	})
}

// TestKillAtRandomPoints runs a worker over a known log and kills it at
// random points: mid-fold, after capturing a checkpoint, after some of
// its chunks, after all chunks before the manifest, and after the
// manifest but before anything recorded it. Each replacement restores
// from the checkpoint stream alone, resumes at the offset it names, and
// is killed again; the last one runs to the end. Every group must equal
// the fold of the whole log, bit for bit.
func TestKillAtRandomPoints(t *testing.T) {
	ctx := context.Background()
	for seed := uint64(1); seed <= 40; seed++ {
		window := time.Duration(0)
		if seed%2 == 0 {
			window = 5 * time.Minute
		}
		p := mustCompile(t, testSpec(window, ""))
		r := rand.New(rand.NewPCG(seed, 99))
		recs := genRecords(r, 3000, 400)
		log := newMemLog()
		// A zombie: an earlier worker that keeps checkpointing after it was
		// replaced; its checkpoints are valid states too and interleave.
		var zombie *Checkpointer
		var zombieState *State
		var zombieAt int
		kills, pos := 0, 0
		for worker := uint64(1); ; worker++ {
			log.heal()
			res, err := Restore(ctx, log, p, 0, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if res.SourceOffset > uint64(pos) {
				t.Fatalf("seed %d: restored past what any worker folded (%d > %d)", seed, res.SourceOffset, pos)
			}
			st := res.State
			cp := &Checkpointer{Plan: p, Log: log, Shard: 0, Partition: 0, Writer: worker, ChunkBytes: 1 << 10}
			cp.Resume(res)
			off := int(res.SourceOffset)
			last := kills >= 6
			killAt := len(recs) + 1
			if !last && off < len(recs) {
				killAt = off + 1 + r.IntN(len(recs)-off)
			}
			died := false
			for off < len(recs) && !died {
				st.Fold([]byte(recs[off].key), []byte(recs[off].value), recs[off].ts)
				off++
				if off > pos {
					pos = off
				}
				if zombie != nil && r.IntN(200) == 0 && zombieAt < len(recs) {
					// The zombie folds a little further and checkpoints.
					for i := 0; i < 50 && zombieAt < len(recs); i++ {
						zombieState.Fold([]byte(recs[zombieAt].key), []byte(recs[zombieAt].value), recs[zombieAt].ts)
						zombieAt++
					}
					if _, err := zombie.Write(ctx, zombie.Capture(zombieState, uint64(zombieAt), 0, time.Now())); err != nil {
						t.Fatal(err)
					}
					pos = max(pos, zombieAt)
				}
				if off == killAt && r.IntN(3) == 0 {
					died = true // killed mid-fold, between checkpoints
					break
				}
				if r.IntN(150) != 0 && off != len(recs) {
					continue
				}
				c := cp.Capture(st, uint64(off), 0, time.Now())
				if off >= killAt {
					// Killed during this checkpoint: after capture (0),
					// after some chunks, before the manifest, or after it.
					switch stage := r.IntN(4); stage {
					case 0:
					case 1, 2:
						log.failAfter = r.IntN(len(c.chunks)+1) + stage - 1
						if log.failAfter == 0 {
							log.failing = true
						}
						cp.Write(ctx, c)
					case 3:
						if _, err := cp.Write(ctx, c); err != nil {
							t.Fatal(err)
						}
					}
					died = true
					break
				}
				if _, err := cp.Write(ctx, c); err != nil {
					t.Fatal(err)
				}
			}
			if !died {
				sameState(t, st, foldAll(p, recs))
				break
			}
			kills++
			if zombie == nil && r.IntN(2) == 0 {
				log.heal()
				zres, err := Restore(ctx, log, p, 0, 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				zombie = &Checkpointer{Plan: p, Log: log, Shard: 0, Partition: 0, Writer: 1000 + worker}
				zombie.Resume(zres)
				zombieState, zombieAt = zres.State, int(zres.SourceOffset)
			}
		}
		// A restore of the final log must also be a prefix fold.
		log.heal()
		res, err := Restore(ctx, log, p, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		sameState(t, res.State, foldAll(p, recs[:res.SourceOffset]))
	}
}
