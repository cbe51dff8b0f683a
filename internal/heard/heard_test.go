package heard

import (
	"testing"
	"time"
)

func TestSilenceCountsFromTheLaterOfOwingAndHearing(t *testing.T) {
	tab := New()
	owed := time.Now().Add(-time.Hour)
	if got := tab.SilentSince("a", owed); got < time.Hour {
		t.Fatalf("never heard: silent %v, want from when it began to owe (an hour)", got)
	}
	if !tab.Last("a").IsZero() {
		t.Fatalf("never heard, yet last heard at %v", tab.Last("a"))
	}
	tab.Mark("a")
	if got := tab.SilentSince("a", owed); got > time.Minute {
		t.Fatalf("just heard: silent %v", got)
	}
	if got := tab.SilentSince("b", time.Now().Add(time.Second)); got != 0 {
		t.Fatalf("owing from the future: silent %v, want 0", got)
	}
	// Monotonic: the reading survives (time.Time from start.Add keeps it).
	if tab.Last("a").Round(0) == tab.Last("a") {
		t.Fatal("the last-heard time has no monotonic reading: a wall-clock step would move it")
	}
}
