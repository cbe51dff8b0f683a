package aggregator

import "syscall"

// faults counts the process's page faults (getrusage): a restore's state
// is fresh memory, and on virtual machines a first touch of a page can
// cost more than the decoding that fills it. Process-wide: shards that
// restore at the same time count each other's.
type faults struct{ minor, major int64 }

func pageFaults() faults {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return faults{}
	}
	return faults{minor: ru.Minflt, major: ru.Majflt}
}

func (f faults) since(then faults) faults {
	return faults{minor: f.minor - then.minor, major: f.major - then.major}
}
