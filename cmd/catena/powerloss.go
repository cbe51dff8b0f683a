//go:build powerloss

package main

import (
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/lazyfs"
)

// A binary built with the powerloss tag (for the fault campaign only) keeps
// every replica write since its last fsync in memory, so that killing the
// process loses them as a power cut would (replica/partlog/lazyfs).
func init() {
	replicaFS = func() partlog.FS { return lazyfs.New() }
}
