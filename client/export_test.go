package client

import "time"

// SetUnaryRecheck sets how long a producer keeps to unary calls before it
// tries ProduceStream again, and returns a func that restores it.
func SetUnaryRecheck(d time.Duration) (restore func()) {
	old := unaryRecheck
	unaryRecheck = d
	return func() { unaryRecheck = old }
}
