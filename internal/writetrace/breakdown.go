package writetrace

import (
	"bufio"
	"fmt"
	"io"
	"math"
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

// Read reads every trace file in dir: one run's, one file per process. A
// process killed while writing may leave its last line cut short, which
// is dropped; a role with files of several processes means several runs
// traced into one directory, whose offsets would mix, and is refused.
func Read(dir string) ([]Event, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.trace"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no trace files (*.trace) in %s", dir)
	}
	pids := map[string][]string{}
	var events []Event
	for _, path := range files {
		base := strings.TrimSuffix(filepath.Base(path), ".trace")
		cut := strings.LastIndexByte(base, '-')
		if cut <= 0 {
			return nil, fmt.Errorf("%s: not a trace file's name (ROLE-PID.trace)", path)
		}
		role := base[:cut]
		pids[role] = append(pids[role], base[cut+1:])
		if len(pids[role]) > 1 {
			return nil, fmt.Errorf("%s holds traces of %s from processes %s: trace each run into an empty directory", dir, role, strings.Join(pids[role], ", "))
		}
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
	var bad error
	for line := 1; sc.Scan(); line++ {
		if bad != nil {
			return nil, bad // a malformed line before the last
		}
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			bad = fmt.Errorf("line %d: want stage, partition, offset and time, got %q", line, sc.Text())
			continue
		}
		st, ok := ParseStage(f[0])
		part, err1 := strconv.ParseUint(f[1], 10, 32)
		off, err2 := strconv.ParseUint(f[2], 10, 64)
		at, err3 := strconv.ParseInt(f[3], 10, 64)
		if !ok || err1 != nil || err2 != nil || err3 != nil {
			bad = fmt.Errorf("line %d: malformed mark %q", line, sc.Text())
			continue
		}
		events = append(events, Event{Role: role, Stage: st, Partition: uint32(part), Offset: off, At: time.Unix(0, at)})
	}
	// A malformed last line is a write cut short by a kill: dropped.
	return events, sc.Err()
}

// Row is one line of a breakdown: a duration per append that has it,
// sorted.
type Row struct {
	Name      string
	Durations []time.Duration
}

// Quantile is the nearest-rank q-quantile of the row (0 without any).
func (r Row) Quantile(q float64) time.Duration {
	n := len(r.Durations)
	if n == 0 {
		return 0
	}
	return r.Durations[min(n-1, max(0, int(math.Ceil(q*float64(n)))-1))]
}

// Report is a breakdown of a trace.
type Report struct {
	// Reached: when the appends reached each stage, after ingestion sent
	// them to the head.
	Reached []Row
	// Steps: how long each step between two stages took, append by append
	// (a link, a write, an fsync, a durability notice).
	Steps []Row
	// ChainLength is the longest chain of the trace's partitions.
	ChainLength int
	// Appends ingestion sent and answered, in partitions whose chain has
	// that length; Skipped, those of other partitions.
	Appends, Skipped int
	// UpstreamLast counts the appends whose tail heard them durable on
	// every member before it only after its own fsync of them ended: the
	// tail's last wait was for a notice, not for its disk.
	UpstreamLast int
}

// Breakdown follows every append ingestion sent and answered through its
// partition's chain. The chain is read from the marks: the head is the
// member that took appends from ingestion first, each next member the one
// that received the frames its predecessor forwarded first. Members are
// named by their place (head, member 2, ..., tail). An offset that only
// grows (a forward, a durable end, a completion) counts for an append
// from the first mark at or past its end.
func Breakdown(events []Event) (*Report, error) {
	t := index(events)
	ingest := ""
	var parts []uint32
	seen := map[uint32]bool{}
	for _, e := range events {
		if e.Stage != IngestSent {
			continue
		}
		ingest = e.Role
		if !seen[e.Partition] {
			seen[e.Partition] = true
			parts = append(parts, e.Partition)
		}
	}
	if ingest == "" {
		return nil, fmt.Errorf("no %s marks: was ingestion traced?", IngestSent)
	}
	slices.Sort(parts)
	chains := map[uint32][]string{}
	chainLen := 0
	for _, p := range parts {
		chains[p] = t.chain(p)
		chainLen = max(chainLen, len(chains[p]))
	}
	if chainLen == 0 {
		return nil, fmt.Errorf("no %s marks: were the replicas traced?", HeadReceived)
	}
	pts, steps, idx := plan(chainLen)
	rep := &Report{Reached: make([]Row, len(pts)), Steps: make([]Row, len(steps)), ChainLength: chainLen}
	for i, pt := range pts {
		rep.Reached[i].Name = pt.name
	}
	for i, st := range steps {
		rep.Steps[i].Name = st.name
	}
	at := make([]time.Time, len(pts))
	ok := make([]bool, len(pts))
	tail := place(chainLen-1, chainLen)
	tailFsync := idx[tail+" fsync done"]
	tailHeard, relayed := idx[tail+" heard it durable upstream"] // a chain of one has no notices
	for _, p := range parts {
		chain := chains[p]
		for _, sent := range t.events[key{ingest, IngestSent, p}] {
			if _, done := t.exact(ingest, IngestDone, p, sent.Offset); !done {
				continue
			}
			if len(chain) != chainLen {
				rep.Skipped++
				continue
			}
			rep.Appends++
			for i, pt := range pts {
				role := ingest
				if pt.member >= 0 {
					role = chain[pt.member]
				}
				var when time.Time
				if pt.grows {
					when, ok[i] = t.reached(role, pt.stage, p, sent.Offset)
				} else {
					when, ok[i] = t.exact(role, pt.stage, p, sent.Offset)
				}
				ok[i] = ok[i] && !when.Before(sent.At)
				at[i] = when
				if ok[i] {
					rep.Reached[i].Durations = append(rep.Reached[i].Durations, when.Sub(sent.At))
				}
			}
			for i, st := range steps {
				from, have := sent.At, true
				for _, f := range st.from {
					have = have && ok[f]
					if have && at[f].After(from) {
						from = at[f]
					}
				}
				if have && ok[st.to] && !at[st.to].Before(from) {
					rep.Steps[i].Durations = append(rep.Steps[i].Durations, at[st.to].Sub(from))
				}
			}
			if relayed && ok[tailHeard] && ok[tailFsync] && at[tailHeard].After(at[tailFsync]) {
				rep.UpstreamLast++
			}
		}
	}
	for i := range rep.Reached {
		slices.Sort(rep.Reached[i].Durations)
	}
	for i := range rep.Steps {
		slices.Sort(rep.Steps[i].Durations)
	}
	return rep, nil
}

type key struct {
	role      string
	stage     Stage
	partition uint32
}

// marks indexes a trace: each role's marks of a stage and partition in
// time order, the first time each offset was marked, and for offsets that
// only grow, each new high.
type marks struct {
	roles  []string
	events map[key][]Event
	firsts map[key]map[uint64]time.Time
	highs  map[key][]Event
}

func index(events []Event) *marks {
	t := &marks{events: map[key][]Event{}, firsts: map[key]map[uint64]time.Time{}, highs: map[key][]Event{}}
	for _, e := range events {
		k := key{e.Role, e.Stage, e.Partition}
		t.events[k] = append(t.events[k], e)
		if !slices.Contains(t.roles, e.Role) {
			t.roles = append(t.roles, e.Role)
		}
	}
	slices.Sort(t.roles)
	for k, evs := range t.events {
		slices.SortStableFunc(evs, func(a, b Event) int { return a.At.Compare(b.At) })
		firsts := make(map[uint64]time.Time, len(evs))
		var highs []Event
		for _, e := range evs {
			if _, ok := firsts[e.Offset]; !ok {
				firsts[e.Offset] = e.At
			}
			if len(highs) == 0 || e.Offset > highs[len(highs)-1].Offset {
				highs = append(highs, e)
			}
		}
		t.firsts[k], t.highs[k] = firsts, highs
	}
	return t
}

// exact is when role marked stage for the append ending at off.
func (t *marks) exact(role string, st Stage, p uint32, off uint64) (time.Time, bool) {
	at, ok := t.firsts[key{role, st, p}][off]
	return at, ok
}

// reached is when role's growing offset for stage first reached off.
func (t *marks) reached(role string, st Stage, p uint32, off uint64) (time.Time, bool) {
	hs := t.highs[key{role, st, p}]
	i := sort.Search(len(hs), func(i int) bool { return hs[i].Offset >= off })
	if i == len(hs) {
		return time.Time{}, false
	}
	return hs[i].At, true
}

// chain is partition p's chain, head first.
func (t *marks) chain(p uint32) []string {
	var head string
	var first time.Time
	for _, r := range t.roles {
		if evs := t.events[key{r, HeadReceived, p}]; len(evs) > 0 && (head == "" || evs[0].At.Before(first)) {
			head, first = r, evs[0].At
		}
	}
	if head == "" {
		return nil
	}
	chain := []string{head}
	for {
		next := t.successor(chain, p)
		if next == "" {
			return chain
		}
		chain = append(chain, next)
	}
}

// successor is the member after the last of chain: of the roles that
// received a frame the last forwarded, the one that received it first
// (members further down receive it after). A few forwards are tried, in
// case the first one's receipt was not traced.
func (t *marks) successor(chain []string, p uint32) string {
	fwd := t.events[key{chain[len(chain)-1], Forwarded, p}]
	for _, f := range fwd[:min(len(fwd), 16)] {
		next, first := "", time.Time{}
		for _, r := range t.roles {
			if slices.Contains(chain, r) {
				continue
			}
			if at, ok := t.exact(r, Received, p, f.Offset); ok && (next == "" || at.Before(first)) {
				next, first = r, at
			}
		}
		if next != "" {
			return next
		}
	}
	return ""
}

func place(i, n int) string {
	switch {
	case i == 0:
		return "head"
	case i == n-1:
		return "tail"
	}
	return fmt.Sprintf("member %d", i+1)
}

// point is a stage reached in one process: member is the place in the
// chain, or -1 for ingestion.
type point struct {
	name   string
	member int
	stage  Stage
	grows  bool
}

// step runs from the latest of the points from (none: ingestion's send)
// to the point to.
type step struct {
	name string
	from []int
	to   int
}

// plan lists the points and steps of a chain of n members, and each
// point's place in the list by name.
func plan(n int) ([]point, []step, map[string]int) {
	var pts []point
	idx := map[string]int{}
	add := func(name string, member int, st Stage, grows bool) {
		idx[name] = len(pts)
		pts = append(pts, point{name, member, st, grows})
	}
	add("head received", 0, HeadReceived, false)
	add("head written", 0, HeadWritten, false)
	for i := range n {
		me := place(i, n)
		if i > 0 {
			add(me+" received", i, Received, false)
			add(me+" written", i, Written, true)
		}
		if i < n-1 {
			add(me+" forwarded", i, Forwarded, true)
		}
	}
	for i := range n {
		add(place(i, n)+" fsync started", i, SyncStarted, true)
		add(place(i, n)+" fsync done", i, Synced, true)
	}
	for i := range n - 1 {
		add(place(i, n)+" durable sent down", i, DownSent, true)
		add(place(i+1, n)+" heard it durable upstream", i+1, DownReceived, true)
	}
	if n > 1 {
		add(place(n-1, n)+" completion sent", n-1, CompletionSent, true)
		add("ingestion heard the completion", -1, IngestCompleted, true)
	}
	add("ingestion answered", -1, IngestDone, false)

	var steps []step
	span := func(name string, to string, from ...string) {
		s := step{name: name, to: idx[to]}
		for _, f := range from {
			s.from = append(s.from, idx[f])
		}
		steps = append(steps, s)
	}
	span("ingestion to the head", "head received")
	span("head: received to written", "head written", "head received")
	for i := range n {
		me := place(i, n)
		if i > 0 {
			span(me+": received to written", me+" written", me+" received")
		}
		if i < n-1 {
			next := place(i+1, n)
			span(me+": written to forwarded", me+" forwarded", me+" written")
			span("link "+me+" to "+next, next+" received", me+" forwarded")
		}
	}
	for i := range n {
		me := place(i, n)
		span(me+": written to fsync started", me+" fsync started", me+" written")
		span(me+": fsync", me+" fsync done", me+" fsync started")
	}
	if n > 1 {
		span("head: fsync done to durable sent down", "head durable sent down", "head fsync done")
	}
	for i := range n - 1 {
		me, next := place(i, n), place(i+1, n)
		span("durable notice "+me+" to "+next, next+" heard it durable upstream", me+" durable sent down")
		if i+1 < n-1 {
			span(next+": durable here and upstream to sent down", next+" durable sent down", next+" heard it durable upstream", next+" fsync done")
		}
	}
	if n > 1 {
		tail := place(n-1, n)
		span(tail+": durable everywhere to completion sent", tail+" completion sent", tail+" heard it durable upstream", tail+" fsync done")
		span("completion to ingestion", "ingestion heard the completion", tail+" completion sent")
	}
	return pts, steps, idx
}
