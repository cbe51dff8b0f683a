package devcluster

import "time"

// Failure detection is chainmaster.Detector's, the operator's too: the
// dev master probes every replica's Status on a short deadline
// (probeTimeout) every probeInterval and feeds it each round, each start
// and each exit of a process it runs.

const (
	// DefaultFailureTimeout is how long a replica may go without answering
	// Status before the master declares it failed (--failure-timeout).
	DefaultFailureTimeout = time.Second
	// probeInterval is how often the master probes every replica (and
	// re-plans every chain).
	probeInterval = 200 * time.Millisecond
	// probeTimeout is each Status probe's deadline: a paused process must
	// not hold the master up.
	probeTimeout = 300 * time.Millisecond
	// minFailureTimeout keeps detection above a couple of probes, so one
	// slow answer on a loaded machine does not remove a member.
	minFailureTimeout = 2 * probeTimeout
	maxFailureTimeout = 5 * time.Minute
)
