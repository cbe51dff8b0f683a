// Package writetrace records when each append passes each stage of the
// write path, in every process it crosses (ingestion, head, middle, tail),
// so that one run gives a write's time stage by stage and hop by hop
// (hack/writetrace prints it; docs/benchmarks.md, "Where a write's time
// goes"). It is a measuring instrument for catena dev on one machine, off
// unless the environment names a directory in CATENA_WRITE_TRACE; a mark
// then costs a clock read and an append under a mutex, and the process
// writes its marks to DIR/ROLE-PID.trace five times a second. Trace one
// run into an empty directory, and one stream: marks name a partition,
// not its stream.
//
// Every mark names a partition and an offset: an append's end offset for
// the stages an append passes (sent, received, written, forwarded), or the
// value of an offset that only grows (a durable end, a completion), which
// covers every append ending at or below it. Processes of one machine share
// the wall clock the marks carry.
package writetrace

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Env names the directory marks are written to; empty or unset: off.
const Env = "CATENA_WRITE_TRACE"

// Stage is a point on the write path.
type Stage uint8

// The stages, in the order a write passes them. The comment says what the
// offset of the mark is.
const (
	// IngestSent: ingestion sent the append to the head (its end, once
	// the head assigned it; the mark carries the send time).
	IngestSent Stage = iota + 1
	// IngestAssigned: the head's early answer reached ingestion (end).
	IngestAssigned
	// HeadReceived: the head took the append off its stream (end).
	HeadReceived
	// HeadWritten: the head wrote it to its log (end).
	HeadWritten
	// Forwarded: a member sent frames to its successor (their end).
	Forwarded
	// Received: a member took forwarded frames off its link (their end).
	Received
	// Written: a member wrote forwarded frames (the log end after them).
	Written
	// SyncStarted and Synced bracket a member's fsync (what it covers).
	SyncStarted
	Synced
	// DownSent: a member sent its upstream-durable offset down (value).
	DownSent
	// DownReceived: a member heard its predecessor's upstream-durable
	// offset (value).
	DownReceived
	// CompletionSent: the tail sent a completion (committed offset).
	CompletionSent
	// IngestCompleted: a completion reached ingestion (value).
	IngestCompleted
	// IngestDone: ingestion answered the append's records (end).
	IngestDone
	stages
)

var names = [...]string{
	IngestSent: "ingest-sent", IngestAssigned: "ingest-assigned", HeadReceived: "head-received",
	HeadWritten: "head-written", Forwarded: "forwarded", Received: "received", Written: "written",
	SyncStarted: "sync-started", Synced: "synced", DownSent: "down-sent", DownReceived: "down-received",
	CompletionSent: "completion-sent", IngestCompleted: "ingest-completed", IngestDone: "ingest-done",
}

func (s Stage) String() string {
	if s == 0 || s >= stages {
		return fmt.Sprintf("stage-%d", s)
	}
	return names[s]
}

// ParseStage is String's inverse.
func ParseStage(name string) (Stage, bool) {
	for s := IngestSent; s < stages; s++ {
		if names[s] == name {
			return s, true
		}
	}
	return 0, false
}

type mark struct {
	stage     Stage
	partition uint32
	offset    uint64
	at        int64
}

var (
	dir     = os.Getenv(Env)
	on      = dir != ""
	mu      sync.Mutex // guards role and pending
	role    = "process"
	pending []mark
	started sync.Once

	// out is this process's trace file, opened at the first flush and
	// kept; flushMu keeps the ticker's flushes and the one at exit from
	// writing into it at once (their lines would interleave).
	flushMu sync.Mutex
	out     *os.File
)

// On reports whether marks are recorded.
func On() bool { return on }

// SetRole names this process in its trace file (a replica's id, or
// "ingest"); call it before the first mark.
func SetRole(name string) {
	if !on {
		return
	}
	mu.Lock()
	role = strings.ReplaceAll(name, string(filepath.Separator), "_")
	mu.Unlock()
}

// Mark records that an append passed stage now. Off, it is a test of a
// boolean (small enough to be inlined); callers that compute an argument
// test On first.
func Mark(stage Stage, partition uint32, offset uint64) {
	if on {
		recordNow(stage, partition, offset)
	}
}

//go:noinline
func recordNow(stage Stage, partition uint32, offset uint64) {
	record(stage, partition, offset, time.Now())
}

// MarkAt records that an append passed stage at t.
func MarkAt(stage Stage, partition uint32, offset uint64, t time.Time) {
	if on {
		record(stage, partition, offset, t)
	}
}

//go:noinline
func record(stage Stage, partition uint32, offset uint64, t time.Time) {
	started.Do(func() {
		go func() {
			for range time.Tick(flushEvery) {
				flush()
			}
		}()
	})
	mu.Lock()
	pending = append(pending, mark{stage, partition, offset, t.UnixNano()})
	mu.Unlock()
}

// flushEvery is how often a process writes its marks; a process killed
// loses at most the last interval's (one that exits calls Flush).
const flushEvery = 200 * time.Millisecond

// Flush writes the marks recorded so far (nothing when off).
func Flush() {
	if on {
		flush()
	}
}

func flush() {
	flushMu.Lock()
	defer flushMu.Unlock()
	mu.Lock()
	ms, name := pending, role
	pending = nil
	mu.Unlock()
	if len(ms) == 0 {
		return
	}
	if out == nil {
		// An instrument: the write path does not fail for it; a directory
		// it cannot write to leaves no trace file, which Read reports.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return
		}
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%s-%d.trace", name, os.Getpid())), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return
		}
		out = f
	}
	w := bufio.NewWriter(out)
	for _, m := range ms {
		fmt.Fprintf(w, "%s %d %d %d\n", m.stage, m.partition, m.offset, m.at)
	}
	_ = w.Flush()
}
