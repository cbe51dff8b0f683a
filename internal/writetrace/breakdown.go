package writetrace

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Event is one mark as read back: the process's role, the stage, the
// partition and offset, and when.
type Event struct {
	Role      string
	Stage     Stage
	Partition uint32
	Offset    uint64
	At        time.Time
}

// Read reads every trace file in dir.
func Read(dir string) ([]Event, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.trace"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no trace files (*.trace) in %s", dir)
	}
	var events []Event
	for _, path := range files {
		base := strings.TrimSuffix(filepath.Base(path), ".trace")
		role := base[:max(strings.LastIndexByte(base, '-'), 0)]
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		evs, err := parse(f, role)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		events = append(events, evs...)
	}
	return events, nil
}

func parse(r io.Reader, role string) ([]Event, error) {
	var events []Event
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			return nil, fmt.Errorf("line %d: want stage, partition, offset and time, got %q", line, sc.Text())
		}
		st, ok := ParseStage(f[0])
		part, err1 := strconv.ParseUint(f[1], 10, 32)
		off, err2 := strconv.ParseUint(f[2], 10, 64)
		at, err3 := strconv.ParseInt(f[3], 10, 64)
		if !ok || err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("line %d: malformed mark %q", line, sc.Text())
		}
		events = append(events, Event{Role: role, Stage: st, Partition: uint32(part), Offset: off, At: time.Unix(0, at)})
	}
	return events, sc.Err()
}

// Row is one point of the breakdown: how long after ingestion sent an
// append it was reached, over the appends that reached it.
type Row struct {
	Name  string
	Since []time.Duration // one per append, sorted
}

// Quantile of the row's times (0 without any).
func (r Row) Quantile(q float64) time.Duration {
	if len(r.Since) == 0 {
		return 0
	}
	return r.Since[min(len(r.Since)-1, int(q*float64(len(r.Since))))]
}

// Breakdown works out, for every append ingestion sent and answered, when
// it reached each stage in each member, measured from ingestion's send
// (points), and how long each step between two stages took (steps: a hop,
// a write, an fsync, a notice);
// the members are named by their place in the chain (head, member 2, ...,
// tail), learned from who received what who forwarded. An offset that
// only grows (a durable end, a completion) counts for an append from the
// first mark at or past its end.
func Breakdown(events []Event) (reachedRows, stepRows []Row, err error) {
	type key struct {
		role      string
		stage     Stage
		partition uint32
	}
	byKey := map[key][]Event{}
	for _, e := range events {
		k := key{e.Role, e.Stage, e.Partition}
		byKey[k] = append(byKey[k], e)
	}
	// The first time each append's end was marked, and for offsets that
	// only grow, the times each new high was first marked.
	type high struct {
		offset uint64
		at     time.Time
	}
	firsts := map[key]map[uint64]time.Time{}
	highs := map[key][]high{}
	for k, evs := range byKey {
		slices.SortFunc(evs, func(a, b Event) int { return a.At.Compare(b.At) })
		m := make(map[uint64]time.Time, len(evs))
		var hs []high
		for _, e := range evs {
			if _, ok := m[e.Offset]; !ok {
				m[e.Offset] = e.At
			}
			if len(hs) == 0 || e.Offset > hs[len(hs)-1].offset {
				hs = append(hs, high{e.Offset, e.At})
			}
		}
		firsts[k], highs[k] = m, hs
	}
	// exact: when role passed stage with an append ending at off.
	exact := func(role string, st Stage, p uint32, off uint64) (time.Time, bool) {
		t, ok := firsts[key{role, st, p}][off]
		return t, ok
	}
	// reached: when role's growing offset first reached off.
	reached := func(role string, st Stage, p uint32, off uint64) (time.Time, bool) {
		hs := highs[key{role, st, p}]
		i := sort.Search(len(hs), func(i int) bool { return hs[i].offset >= off })
		if i == len(hs) {
			return time.Time{}, false
		}
		return hs[i].at, true
	}
	roles := map[string]bool{}
	for _, e := range events {
		roles[e.Role] = true
	}
	// The chain of each partition, head first: the first member to take
	// an append from ingestion (a trace is read as of one chain; one that
	// spans a reconfiguration counts the appends of the first).
	chainOf := func(p uint32) []string {
		var head string
		var first time.Time
		for r := range roles {
			if evs := byKey[key{r, HeadReceived, p}]; len(evs) > 0 && (head == "" || evs[0].At.Before(first)) {
				head, first = r, evs[0].At
			}
		}
		if head == "" {
			return nil
		}
		chain := []string{head}
		for {
			last := chain[len(chain)-1]
			fwd := byKey[key{last, Forwarded, p}]
			if len(fwd) == 0 {
				return chain
			}
			// Its successor received those frames first; members further
			// down received them after.
			next, first := "", time.Time{}
			for r := range roles {
				if slices.Contains(chain, r) {
					continue
				}
				if t, ok := exact(r, Received, p, fwd[0].Offset); ok && (next == "" || t.Before(first)) {
					next, first = r, t
				}
			}
			if next == "" {
				return chain
			}
			chain = append(chain, next)
		}
	}
	type point struct {
		name string
		at   func(chain []string, p uint32, end uint64) (time.Time, bool)
	}
	place := func(i, n int) string {
		switch {
		case i == 0:
			return "head"
		case i == n-1:
			return "tail"
		}
		return fmt.Sprintf("member %d", i+1)
	}
	var chainLen int
	var points []point
	at := func(name string, f func(chain []string, p uint32, end uint64) (time.Time, bool)) {
		points = append(points, point{name, f})
	}
	ingest := ""
	for _, e := range events {
		if e.Stage == IngestSent {
			ingest = e.Role
			break
		}
	}
	if ingest == "" {
		return nil, nil, fmt.Errorf("no %s marks: was ingestion traced?", IngestSent)
	}
	var parts []uint32
	seen := map[uint32]bool{}
	for _, e := range events {
		if e.Stage == IngestSent && !seen[e.Partition] {
			seen[e.Partition] = true
			parts = append(parts, e.Partition)
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	for _, p := range parts {
		chainLen = max(chainLen, len(chainOf(p)))
	}
	if chainLen == 0 {
		return nil, nil, fmt.Errorf("no %s marks: were the replicas traced?", HeadReceived)
	}
	member := func(i int, st Stage, growing bool) func(chain []string, p uint32, end uint64) (time.Time, bool) {
		return func(chain []string, p uint32, end uint64) (time.Time, bool) {
			if i >= len(chain) {
				return time.Time{}, false
			}
			if growing {
				return reached(chain[i], st, p, end)
			}
			return exact(chain[i], st, p, end)
		}
	}
	at(place(0, chainLen)+" received", member(0, HeadReceived, false))
	at(place(0, chainLen)+" written", member(0, HeadWritten, false))
	for i := range chainLen {
		if i > 0 {
			at(place(i, chainLen)+" received", member(i, Received, false))
			at(place(i, chainLen)+" written", member(i, Written, true))
		}
		if i < chainLen-1 {
			at(place(i, chainLen)+" forwarded", member(i, Forwarded, true))
		}
	}
	for i := range chainLen {
		at(place(i, chainLen)+" fsync started", member(i, SyncStarted, true))
		at(place(i, chainLen)+" fsync done", member(i, Synced, true))
	}
	for i := range chainLen - 1 {
		at(place(i, chainLen)+" durable sent down", member(i, DownSent, true))
		at(place(i+1, chainLen)+" heard it durable upstream", member(i+1, DownReceived, true))
	}
	at(place(chainLen-1, chainLen)+" completion sent", member(chainLen-1, CompletionSent, true))
	at("ingestion heard the completion", func(_ []string, p uint32, end uint64) (time.Time, bool) {
		return reached(ingest, IngestCompleted, p, end)
	})
	at("ingestion answered", func(_ []string, p uint32, end uint64) (time.Time, bool) { return exact(ingest, IngestDone, p, end) })

	// Spans: how long each step took, append by append.
	index := map[string]int{}
	for i, pt := range points {
		index[pt.name] = i
	}
	type span struct {
		name     string
		from, to int // -1: ingestion's send
	}
	var spans []span
	step := func(name, from, to string) {
		f, ok1 := index[from]
		t, ok2 := index[to]
		if from == "" {
			f, ok1 = -1, true
		}
		if ok1 && ok2 {
			spans = append(spans, span{name, f, t})
		}
	}
	step("ingestion to the head", "", "head received")
	step("head: received to written", "head received", "head written")
	for i := range chainLen {
		me := place(i, chainLen)
		if i > 0 {
			step(me+": received to written", me+" received", me+" written")
		}
		if i < chainLen-1 {
			next := place(i+1, chainLen)
			step(me+": written to forwarded", me+" written", me+" forwarded")
			step("link "+me+" to "+next, me+" forwarded", next+" received")
		}
	}
	for i := range chainLen {
		me := place(i, chainLen)
		step(me+": fsync", me+" fsync started", me+" fsync done")
	}
	if chainLen > 1 {
		step("head: fsync done to durable sent down", "head fsync done", "head durable sent down")
	}
	for i := range chainLen - 1 {
		me, next := place(i, chainLen), place(i+1, chainLen)
		step("durable notice "+me+" to "+next, me+" durable sent down", next+" heard it durable upstream")
		if i+1 < chainLen-1 {
			step(next+": heard durable to sent down", next+" heard it durable upstream", next+" durable sent down")
		}
	}
	tail := place(chainLen-1, chainLen)
	step(tail+": durable everywhere to completion sent", tail+" heard it durable upstream", tail+" completion sent")
	step("completion to ingestion", tail+" completion sent", "ingestion heard the completion")

	rows := make([]Row, len(points))
	for i, pt := range points {
		rows[i].Name = pt.name
	}
	steps := make([]Row, len(spans))
	for i, sp := range spans {
		steps[i].Name = sp.name
	}
	times := make([]time.Time, len(points))
	reachedAt := make([]bool, len(points))
	for _, p := range parts {
		chain := chainOf(p)
		if len(chain) != chainLen {
			continue
		}
		for _, sent := range byKey[key{ingest, IngestSent, p}] {
			if _, ok := exact(ingest, IngestDone, p, sent.Offset); !ok {
				continue
			}
			for i, pt := range points {
				t, ok := pt.at(chain, p, sent.Offset)
				times[i], reachedAt[i] = t, ok && !t.Before(sent.At)
				if reachedAt[i] {
					rows[i].Since = append(rows[i].Since, t.Sub(sent.At))
				}
			}
			for i, sp := range spans {
				from, ok := sent.At, true
				if sp.from >= 0 {
					from, ok = times[sp.from], reachedAt[sp.from]
				}
				if ok && reachedAt[sp.to] && !times[sp.to].Before(from) {
					steps[i].Since = append(steps[i].Since, times[sp.to].Sub(from))
				}
			}
		}
	}
	for i := range rows {
		slices.Sort(rows[i].Since)
	}
	for i := range steps {
		slices.Sort(steps[i].Since)
	}
	return rows, steps, nil
}
