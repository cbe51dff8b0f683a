package writetrace

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// traceInto turns marks on, into d, for the test.
func traceInto(t *testing.T, d string) {
	dir, on = d, true
	t.Cleanup(func() {
		// The flushing goroutine lives on: reset under its locks.
		flushMu.Lock()
		defer flushMu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		if out != nil {
			out.Close()
		}
		dir, on, out, pending, role = "", false, nil, nil, "process"
	})
}

func TestMarksAreWrittenAndReadBack(t *testing.T) {
	d := filepath.Join(t.TempDir(), "made on the first flush")
	traceInto(t, d)
	SetRole("r1")
	base := time.Unix(1700000000, 0)
	MarkAt(Received, 3, 42, base)
	MarkAt(Synced, 3, 43, base.Add(time.Microsecond))
	Flush()
	events, err := Read(d)
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{Role: "r1", Stage: Received, Partition: 3, Offset: 42, At: base},
		{Role: "r1", Stage: Synced, Partition: 3, Offset: 43, At: base.Add(time.Microsecond)},
	}
	if !slices.Equal(events, want) {
		t.Fatalf("read back %+v, want %+v", events, want)
	}
}

// Flushes from several goroutines (the ticker's and the one at exit)
// write whole lines, one after another.
func TestConcurrentFlushesKeepLinesWhole(t *testing.T) {
	d := t.TempDir()
	traceInto(t, d)
	SetRole("r2")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				Mark(Synced, uint32(g), uint64(i))
				if i%100 == 0 {
					Flush()
				}
			}
		})
	}
	wg.Wait()
	Flush()
	events, err := Read(d)
	if err != nil || len(events) != 8000 {
		t.Fatalf("read %d marks, %v; want 8000", len(events), err)
	}
}

func TestReadTakesOneRunAndDropsALineCutShort(t *testing.T) {
	write := func(t *testing.T, d, name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(d, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("an empty directory", func(t *testing.T) {
		if _, err := Read(t.TempDir()); err == nil {
			t.Fatal("read as a trace")
		}
	})
	t.Run("a malformed mark before the last line", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "r0-1.trace", "synced 0 five 1\nsynced 0 5 2\n")
		if _, err := Read(d); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Fatalf("error %v, want line 1 named", err)
		}
	})
	t.Run("a last line cut short by a kill", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "r0-1.trace", "synced 0 5 2\nsynced 0 6")
		events, err := Read(d)
		if err != nil || len(events) != 1 || events[0].Offset != 5 {
			t.Fatalf("read %+v, %v; want the whole first mark only", events, err)
		}
	})
	t.Run("two runs in one directory", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "r0-1.trace", "synced 0 5 2\n")
		write(t, d, "r0-2.trace", "synced 0 5 9\n")
		if _, err := Read(d); err == nil || !strings.Contains(err.Error(), "empty directory") {
			t.Fatalf("error %v, want two runs refused", err)
		}
	})
}

func TestQuantileIsTheNearestRank(t *testing.T) {
	var r Row
	for i := 1; i <= 100; i++ {
		r.Durations = append(r.Durations, time.Duration(i))
	}
	for q, want := range map[float64]time.Duration{0.5: 50, 0.9: 90, 0.99: 99, 1: 100, 0: 1} {
		if got := r.Quantile(q); got != want {
			t.Errorf("q%v of 1..100: %v, want %v", q, got, want)
		}
	}
	if got := (Row{Durations: []time.Duration{7, 9}}).Quantile(0.5); got != 7 {
		t.Errorf("median of two: %v, want the lower", got)
	}
	if got := (Row{}).Quantile(0.5); got != 0 {
		t.Errorf("empty row: %v", got)
	}
}

// trace builds marks in microseconds after an epoch.
type trace struct{ events []Event }

func (tr *trace) add(role string, st Stage, off uint64, us int) {
	tr.events = append(tr.events, Event{Role: role, Stage: st, Partition: 7, Offset: off, At: time.Unix(1700000000, 0).Add(time.Duration(us) * time.Microsecond)})
}

func rows(rows []Row) map[string][]time.Duration {
	m := map[string][]time.Duration{}
	for _, r := range rows {
		m[r.Name] = r.Durations
	}
	return m
}

func us(ds ...int) []time.Duration {
	var out []time.Duration
	for _, d := range ds {
		out = append(out, time.Duration(d)*time.Microsecond)
	}
	return out
}

// wantRows checks the named rows of got (others are not checked).
func wantRows(t *testing.T, what string, got []Row, want map[string][]time.Duration) {
	t.Helper()
	have := rows(got)
	for name, w := range want {
		if !slices.Equal(have[name], w) {
			t.Errorf("%s %s: %v, want %v", what, name, have[name], w)
		}
	}
}

// A chain of three (r2 head, r0, r1 tail) and two appends, ending at
// offsets 10 and 11. The tail's fsync of the first ends before the notice
// that the members before it hold it durably (480); its fsync of the
// second ends after that notice (1490 against 1480).
func TestBreakdownFollowsEachAppendThroughTheChain(t *testing.T) {
	var tr trace
	for i, start := range []int{0, 1000} {
		end := uint64(10 + i)
		tr.add("ingest", IngestSent, end, start)
		tr.add("r2", HeadReceived, end, start+50)
		tr.add("r2", HeadWritten, end, start+60)
		tr.add("r2", Forwarded, end, start+70)
		tr.add("r0", Received, end, start+150)
		tr.add("r0", Written, end, start+160)
		tr.add("r0", Forwarded, end, start+170)
		tr.add("r1", Received, end, start+250)
		tr.add("r1", Written, end, start+260)
		tr.add("r2", SyncStarted, end, start+100)
		tr.add("r2", Synced, end, start+300)
		tr.add("r0", Synced, end, start+350)
		tr.add("r2", DownSent, end, start+310)
		tr.add("r0", DownReceived, end, start+400)
		tr.add("r0", DownSent, end, start+410)
		tr.add("r1", DownReceived, end, start+480)
		tr.add("r1", CompletionSent, end, start+500)
		tr.add("ingest", IngestCompleted, end, start+560)
		tr.add("ingest", IngestDone, end, start+570)
	}
	tr.add("r1", Synced, 10, 455)
	tr.add("r1", Synced, 11, 1490)
	rep, err := Breakdown(tr.events)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ChainLength != 3 || rep.Appends != 2 || rep.Skipped != 0 {
		t.Fatalf("chain %d, appends %d, skipped %d; want 3, 2, 0", rep.ChainLength, rep.Appends, rep.Skipped)
	}
	var names []string
	for _, r := range rep.Reached {
		names = append(names, r.Name)
	}
	wantOrder := []string{"head received", "head written", "head forwarded", "member 2 received", "member 2 written",
		"member 2 forwarded", "tail received", "tail written"}
	if !slices.Equal(names[:len(wantOrder)], wantOrder) {
		t.Fatalf("points %v, want them to start %v", names, wantOrder)
	}
	wantRows(t, "reached", rep.Reached, map[string][]time.Duration{
		"head received":                      us(50, 50),
		"member 2 received":                  us(150, 150),
		"tail received":                      us(250, 250),
		"tail fsync done":                    us(455, 490),
		"tail heard it durable upstream":     us(480, 480),
		"member 2 heard it durable upstream": us(400, 400),
		"ingestion answered":                 us(570, 570),
	})
	wantRows(t, "step", rep.Steps, map[string][]time.Duration{
		"ingestion to the head":                            us(50, 50),
		"head: written to fsync started":                   us(40, 40),
		"head: fsync":                                      us(200, 200),
		"link head to member 2":                            us(80, 80),
		"link member 2 to tail":                            us(80, 80),
		"durable notice head to member 2":                  us(90, 90),
		"durable notice member 2 to tail":                  us(70, 70),
		"member 2: durable here and upstream to sent down": us(10, 10),
		"completion to ingestion":                          us(60, 60),
		// From the later of the notice and the tail's own fsync: 500-480
		// for the first append, 1500-1490 for the second.
		"tail: durable everywhere to completion sent": us(10, 20),
	})
	if rep.UpstreamLast != 1 {
		t.Errorf("upstream last for %d appends, want 1 (the first)", rep.UpstreamLast)
	}
}

// Frames of two appends forwarded in one message reach the successor at
// the same moment; both appends are followed.
func TestBreakdownFollowsAppendsForwardedTogether(t *testing.T) {
	var tr trace
	for _, end := range []uint64{5, 6} {
		tr.add("ingest", IngestSent, end, 0)
		tr.add("a", HeadReceived, end, 10)
		tr.add("a", HeadWritten, end, 20)
		tr.add("b", Received, end, 100) // one message, every frame marked
		tr.add("b", Synced, end, 300)
		tr.add("ingest", IngestDone, end, 400)
	}
	tr.add("a", Forwarded, 6, 30)
	tr.add("b", Written, 6, 110)
	rep, err := Breakdown(tr.events)
	if err != nil {
		t.Fatal(err)
	}
	took := rows(rep.Steps)
	if rep.ChainLength != 2 || !slices.Equal(took["link head to tail"], us(70, 70)) {
		t.Fatalf("chain %d, link %v; want 2 and both appends at 70 µs", rep.ChainLength, took["link head to tail"])
	}
}

func TestBreakdownOfAChainOfOne(t *testing.T) {
	var tr trace
	tr.add("ingest", IngestSent, 1, 0)
	tr.add("solo", HeadReceived, 1, 40)
	tr.add("solo", HeadWritten, 1, 50)
	tr.add("solo", SyncStarted, 1, 55)
	tr.add("solo", Synced, 1, 200)
	tr.add("ingest", IngestDone, 1, 260)
	rep, err := Breakdown(tr.events)
	if err != nil {
		t.Fatal(err)
	}
	took := rows(rep.Steps)
	if rep.ChainLength != 1 || !slices.Equal(took["head: fsync"], us(145)) || !slices.Equal(rows(rep.Reached)["ingestion answered"], us(260)) {
		t.Fatalf("chain %d, steps %v", rep.ChainLength, took)
	}
}

func TestBreakdownNamesWhatIsMissing(t *testing.T) {
	var tr trace
	tr.add("r0", HeadReceived, 1, 0)
	if _, err := Breakdown(tr.events); err == nil || !strings.Contains(err.Error(), "ingestion") {
		t.Fatalf("error %v, want ingestion named", err)
	}
	tr = trace{}
	tr.add("ingest", IngestSent, 1, 0)
	if _, err := Breakdown(tr.events); err == nil || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("error %v, want the replicas named", err)
	}
}
