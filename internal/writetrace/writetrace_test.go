package writetrace

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestMarksAreWrittenAndReadBack(t *testing.T) {
	d := t.TempDir()
	dir, on = d, true
	t.Cleanup(func() { dir, on = "", false })
	SetRole("r1")
	base := time.Unix(1700000000, 0)
	MarkAt(Received, 3, 42, base)
	MarkAt(Synced, 3, 43, base.Add(time.Microsecond))
	Flush()
	files, _ := filepath.Glob(filepath.Join(d, "*.trace"))
	if len(files) != 1 {
		t.Fatalf("trace files %v, want one", files)
	}
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

func TestReadRefusesWhatIsNotATrace(t *testing.T) {
	d := t.TempDir()
	if _, err := Read(d); err == nil {
		t.Fatal("an empty directory read as a trace")
	}
	if err := os.WriteFile(filepath.Join(d, "r0-1.trace"), []byte("synced 0 five 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(d); err == nil {
		t.Fatal("a malformed mark was read")
	}
}

// A chain of three (r2 head, r0, r1 tail) and two appends, ending at
// offsets 10 and 11, with a fsync at the tail that covers both.
func TestBreakdownFollowsEachAppendThroughTheChain(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	us := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Microsecond) }
	var events []Event
	add := func(role string, st Stage, off uint64, at int) {
		events = append(events, Event{Role: role, Stage: st, Partition: 7, Offset: off, At: us(at)})
	}
	for i, start := range []int{0, 1000} {
		end := uint64(10 + i)
		add("ingest", IngestSent, end, start)
		add("r2", HeadReceived, end, start+50)
		add("r2", HeadWritten, end, start+60)
		add("r2", Forwarded, end, start+70)
		add("r0", Received, end, start+150)
		add("r0", Written, end, start+160)
		add("r0", Forwarded, end, start+170)
		add("r1", Received, end, start+250)
		add("r1", Written, end, start+260)
		add("r2", Synced, end, start+300)
		add("r0", Synced, end, start+350)
		add("r2", DownSent, end, start+310)
		add("r0", DownReceived, end, start+400)
		add("r0", DownSent, end, start+410)
		add("r1", DownReceived, end, start+480)
		add("r1", CompletionSent, end, start+500)
		add("ingest", IngestCompleted, end, start+560)
		add("ingest", IngestDone, end, start+570)
	}
	add("r1", Synced, 11, 1450) // covers both appends
	rows, steps, err := Breakdown(events)
	if err != nil {
		t.Fatal(err)
	}
	took := map[string][]time.Duration{}
	for _, r := range steps {
		took[r.Name] = r.Since
	}
	for name, want := range map[string][]time.Duration{
		"ingestion to the head":                       {50 * time.Microsecond, 50 * time.Microsecond},
		"link head to member 2":                       {80 * time.Microsecond, 80 * time.Microsecond},
		"link member 2 to tail":                       {80 * time.Microsecond, 80 * time.Microsecond},
		"durable notice head to member 2":             {90 * time.Microsecond, 90 * time.Microsecond},
		"member 2: heard durable to sent down":        {10 * time.Microsecond, 10 * time.Microsecond},
		"durable notice member 2 to tail":             {70 * time.Microsecond, 70 * time.Microsecond},
		"tail: durable everywhere to completion sent": {20 * time.Microsecond, 20 * time.Microsecond},
		"completion to ingestion":                     {60 * time.Microsecond, 60 * time.Microsecond},
	} {
		if !slices.Equal(took[name], want) {
			t.Errorf("step %s: %v, want %v", name, took[name], want)
		}
	}
	got := map[string][]time.Duration{}
	var names []string
	for _, r := range rows {
		got[r.Name] = r.Since
		names = append(names, r.Name)
	}
	wantOrder := []string{"head received", "head written", "head forwarded", "member 2 received", "member 2 written",
		"member 2 forwarded", "tail received", "tail written"}
	if !slices.Equal(names[:len(wantOrder)], wantOrder) {
		t.Fatalf("rows %v, want them to start %v", names, wantOrder)
	}
	for name, want := range map[string][]time.Duration{
		"head received":                      {50 * time.Microsecond, 50 * time.Microsecond},
		"member 2 received":                  {150 * time.Microsecond, 150 * time.Microsecond},
		"tail received":                      {250 * time.Microsecond, 250 * time.Microsecond},
		"tail fsync done":                    {450 * time.Microsecond, 1450 * time.Microsecond},
		"tail heard it durable upstream":     {480 * time.Microsecond, 480 * time.Microsecond},
		"member 2 heard it durable upstream": {400 * time.Microsecond, 400 * time.Microsecond},
		"ingestion answered":                 {570 * time.Microsecond, 570 * time.Microsecond},
	} {
		if !slices.Equal(got[name], want) {
			t.Errorf("%s: %v, want %v", name, got[name], want)
		}
	}
	if q := (Row{Since: got["tail fsync done"]}).Quantile(0.5); q != 1450*time.Microsecond {
		t.Errorf("median of the tail's fsync %v, want the second of two", q)
	}
}
