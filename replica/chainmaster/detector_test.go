package chainmaster

import (
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestDetector(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		ms      int
		op      string // "start", "ok", "miss", "exit", or "" (just ask)
		want    chainplan.Health
		silentM int // want silentFor in ms
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"unknown before anything is known", []step{
			{0, "", chainplan.Unknown, 0},
		}},
		{"answers: alive", []step{
			{0, "start", chainplan.Unknown, 0},
			{100, "ok", chainplan.Alive, 0},
			{5000, "", chainplan.Alive, 0}, // no probe since: the last one answered
		}},
		{"missed probes within the timeout: unknown", []step{
			{0, "start", chainplan.Unknown, 0},
			{100, "ok", chainplan.Alive, 0},
			{300, "miss", chainplan.Unknown, 200},
			{1099, "miss", chainplan.Unknown, 999},
		}},
		{"silent for the timeout: failed", []step{
			{0, "start", chainplan.Unknown, 0},
			{100, "ok", chainplan.Alive, 0},
			{300, "miss", chainplan.Unknown, 200},
			{1100, "miss", chainplan.Failed, 1000},
			{1500, "", chainplan.Failed, 1400},
		}},
		{"never answers after start: failed after the timeout from start", []step{
			{0, "start", chainplan.Unknown, 0},
			{200, "miss", chainplan.Unknown, 200},
			{999, "miss", chainplan.Unknown, 999},
			{1000, "miss", chainplan.Failed, 1000},
		}},
		{"paused then resumed: failed, then alive again", []step{
			{0, "start", chainplan.Unknown, 0},
			{0, "ok", chainplan.Alive, 0},
			{200, "miss", chainplan.Unknown, 200},
			{2000, "miss", chainplan.Failed, 2000},
			{2200, "ok", chainplan.Alive, 0},
			{2400, "miss", chainplan.Unknown, 200},
		}},
		{"exit: failed at once, late answers ignored, restart starts over", []step{
			{0, "start", chainplan.Unknown, 0},
			{100, "ok", chainplan.Alive, 0},
			{150, "exit", chainplan.Failed, 0},
			{160, "ok", chainplan.Failed, 0},
			{400, "start", chainplan.Unknown, 0},
			{600, "miss", chainplan.Unknown, 200},
			{700, "ok", chainplan.Alive, 0},
		}},
		{"restart that never answers fails after the timeout", []step{
			{0, "start", chainplan.Unknown, 0},
			{100, "ok", chainplan.Alive, 0},
			{150, "exit", chainplan.Failed, 0},
			{400, "start", chainplan.Unknown, 0},
			{1399, "miss", chainplan.Unknown, 999},
			{1400, "miss", chainplan.Failed, 1000},
		}},
		{"an out-of-order older answer does not move the last answer back", []step{
			{0, "start", chainplan.Unknown, 0},
			{500, "ok", chainplan.Alive, 0},
			{400, "ok", chainplan.Alive, 0},
			{700, "miss", chainplan.Unknown, 200},
			{1500, "", chainplan.Failed, 1000},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewDetector(time.Second)
			for i, s := range tc.steps {
				now := at(s.ms)
				switch s.op {
				case "start":
					h.Started("r0", now)
				case "ok":
					h.Round(now, []string{"r0"}, map[string]time.Time{"r0": now})
				case "miss":
					h.Round(now, []string{"r0"}, nil)
				case "exit":
					h.Exited("r0")
				}
				if got := h.Health("r0", now, 0); got != s.want {
					t.Fatalf("step %d (%s at %dms): health %v, want %v", i, s.op, s.ms, got, s.want)
				}
				if s.want != chainplan.Failed || s.silentM > 0 {
					if got := h.SilentFor("r0", now); got != time.Duration(s.silentM)*time.Millisecond {
						t.Fatalf("step %d (%s at %dms): silent for %v, want %dms", i, s.op, s.ms, got, s.silentM)
					}
				}
			}
		})
	}
}

// TestDetectorAcrossReplicas: the rules that look at more than one
// replica. A master that hears from nobody suspects itself, and silence
// counts from when it sees again; a predecessor's report of a dead link is
// a second witness.
func TestDetectorAcrossReplicas(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ids := []string{"a", "b", "c"}
	type round struct {
		ms              int
		answered        string // the ids that answered, as letters ("" : nobody; "-": no round, just ask)
		neighbourDownMs map[string]int
		want            string // each id's health: A(live) U(nknown) F(ailed)
	}
	letter := map[chainplan.Health]byte{chainplan.Alive: 'A', chainplan.Unknown: 'U', chainplan.Failed: 'F'}
	for _, tc := range []struct {
		name   string
		rounds []round
	}{
		{"the master cut off from everyone removes no one, then gives each a timeout", []round{
			{0, "abc", nil, "AAA"},
			{200, "", nil, "UUU"},
			{3000, "", nil, "UUU"},   // blind: three seconds of silence prove nothing
			{3200, "ab", nil, "AAU"}, // sight regained; c's connection is slower to return
			{4199, "ab", nil, "AAU"}, // c silent for less than the timeout since sight
			{4200, "ab", nil, "AAF"}, // and now for the timeout: c is failed
		}},
		{"one replica silent while others answer: the timeout from its last answer", []round{
			{0, "abc", nil, "AAA"},
			{200, "ab", nil, "AAU"},
			{1000, "ab", nil, "AAF"},
		}},
		{"a replica that answers after the master's outage is alive at once", []round{
			{0, "abc", nil, "AAA"},
			{2000, "", nil, "UUU"},
			{2200, "abc", nil, "AAA"},
		}},
		{"a predecessor's dead link to a silent replica fails it before the timeout", []round{
			{0, "abc", nil, "AAA"},
			{200, "ab", map[string]int{"c": 100}, "AAU"},
			{600, "ab", map[string]int{"c": 500}, "AAF"},
		}},
		{"a predecessor's dead link to a replica that answers: alive", []round{
			{0, "abc", nil, "AAA"},
			{600, "abc", map[string]int{"c": 5000}, "AAA"},
		}},
		{"blind, a neighbour's old report is no evidence", []round{
			{0, "abc", nil, "AAA"},
			{600, "", map[string]int{"c": 5000}, "UUU"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDetector(time.Second)
			for _, id := range ids {
				d.Started(id, t0)
			}
			for i, r := range tc.rounds {
				now := at(r.ms)
				if r.answered != "-" {
					answered := map[string]time.Time{}
					for _, c := range r.answered {
						answered[string(c)] = now
					}
					d.Round(now, ids, answered)
				}
				got := make([]byte, len(ids))
				for j, id := range ids {
					got[j] = letter[d.Health(id, now, time.Duration(r.neighbourDownMs[id])*time.Millisecond)]
				}
				if string(got) != r.want {
					t.Fatalf("round %d at %dms (answered %q): health %s, want %s", i, r.ms, r.answered, got, r.want)
				}
			}
		})
	}
}

func TestNeighbourDown(t *testing.T) {
	abc := []*catenapb.Member{{Id: "a"}, {Id: "b"}, {Id: "c"}}
	for _, tc := range []struct {
		name    string
		reports map[string]*catenapb.PartitionStatus
		want    map[string]time.Duration
	}{
		{"a predecessor's link down", map[string]*catenapb.PartitionStatus{
			"a": {Members: abc, SuccessorDownMs: 700},  // a cannot reach b
			"b": {Members: abc, SuccessorDownMs: 0},    // b reaches c
			"c": {Members: abc, SuccessorDownMs: 9000}, // a tail has no successor: ignored
		}, map[string]time.Duration{"b": 700 * time.Millisecond}},
		{"ingestion cannot reach the head, carried by its successor", map[string]*catenapb.PartitionStatus{
			"b": {Members: abc, HeadUnreachableMs: 600},
		}, map[string]time.Duration{"a": 600 * time.Millisecond}},
		{"a head report carried by a member that is not the head's successor: ignored", map[string]*catenapb.PartitionStatus{
			"c": {Members: abc, HeadUnreachableMs: 600},
			"a": {Members: abc, HeadUnreachableMs: 600},
		}, map[string]time.Duration{}},
		{"a head report from a carrier stalled downstream: the head waits on it, no evidence", map[string]*catenapb.PartitionStatus{
			"b": {Members: abc, HeadUnreachableMs: 900, SuccessorStalledMs: 400},
		}, map[string]time.Duration{}},
		{"the longest witness wins", map[string]*catenapb.PartitionStatus{
			"a": {Members: abc, SuccessorDownMs: 300},
			"b": {Members: abc, HeadUnreachableMs: 800},
			"c": {Members: abc, SuccessorDownMs: 900}, // a tail has no successor: ignored
		}, map[string]time.Duration{"a": 800 * time.Millisecond, "b": 300 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NeighbourDown(tc.reports)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for id, d := range tc.want {
				if got[id] != d {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}
