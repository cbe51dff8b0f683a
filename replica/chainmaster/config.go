package chainmaster

import (
	"time"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// StreamSettings are a stream's settings as its master installs them on
// every member: the operator reads them from the Stream, catena dev from
// its flags, and StreamConfig turns both into the one config replicas
// enforce.
type StreamSettings struct {
	Partitions  int
	Replication int
	// MinChainLength is the fewest members that take writes (0: a
	// majority of Replication; see chainplan.MinChainLength).
	MinChainLength int
	// Interval durability fsyncs every FsyncInterval (0: the replica's
	// default) instead of before every acknowledgement.
	Interval      bool
	FsyncInterval time.Duration
	// Retention: records older than RetentionTime, or beyond RetentionBytes
	// per partition, go once no consumer hold needs them; the Hard limits
	// apply whatever the holds (0: none).
	RetentionTime, HardRetentionTime   time.Duration
	RetentionBytes, HardRetentionBytes int64
	// SegmentBytes is where a partition's segment files roll (0: the
	// replica's default, sized from the byte limits of retention).
	SegmentBytes int64
}

// StreamConfig is the config members of the stream's chains run.
func StreamConfig(s StreamSettings) *catenapb.StreamConfig {
	cfg := &catenapb.StreamConfig{
		Partitions:         uint32(s.Partitions),
		Durability:         catenapb.Durability_DURABILITY_FSYNC,
		MinChainLength:     uint32(chainplan.MinChainLength(s.Replication, s.MinChainLength)),
		RetentionMs:        s.RetentionTime.Milliseconds(),
		RetentionBytes:     s.RetentionBytes,
		HardRetentionMs:    s.HardRetentionTime.Milliseconds(),
		HardRetentionBytes: s.HardRetentionBytes,
		SegmentBytes:       s.SegmentBytes,
	}
	if s.Interval {
		cfg.Durability = catenapb.Durability_DURABILITY_INTERVAL
		if s.FsyncInterval > 0 {
			cfg.FsyncIntervalMs = uint32(max(s.FsyncInterval.Milliseconds(), 1))
		}
	}
	return cfg
}
