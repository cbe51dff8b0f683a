package devcluster

import (
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/chainplan"
)

func TestHealthTracker(t *testing.T) {
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
			h := newHealthTracker(time.Second)
			for i, s := range tc.steps {
				now := at(s.ms)
				switch s.op {
				case "start":
					h.started("r0", now)
				case "ok":
					h.observe("r0", now, true)
				case "miss":
					h.observe("r0", now, false)
				case "exit":
					h.exited("r0")
				}
				if got := h.health("r0", now); got != s.want {
					t.Fatalf("step %d (%s at %dms): health %v, want %v", i, s.op, s.ms, got, s.want)
				}
				if s.want != chainplan.Failed || s.silentM > 0 {
					if got := h.silentFor("r0", now); got != time.Duration(s.silentM)*time.Millisecond {
						t.Fatalf("step %d (%s at %dms): silent for %v, want %dms", i, s.op, s.ms, got, s.silentM)
					}
				}
			}
		})
	}
}
