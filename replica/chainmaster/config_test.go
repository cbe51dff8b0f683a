package chainmaster

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestStreamConfig(t *testing.T) {
	fsync, interval := catenapb.Durability_DURABILITY_FSYNC, catenapb.Durability_DURABILITY_INTERVAL
	for _, tc := range []struct {
		name string
		in   StreamSettings
		want *catenapb.StreamConfig
	}{
		{"a majority by default", StreamSettings{Partitions: 4, Replication: 3},
			&catenapb.StreamConfig{Partitions: 4, Durability: fsync, MinChainLength: 2}},
		{"a majority of 5 is 3", StreamSettings{Partitions: 1, Replication: 5},
			&catenapb.StreamConfig{Partitions: 1, Durability: fsync, MinChainLength: 3}},
		{"one copy takes writes alone", StreamSettings{Partitions: 1, Replication: 1},
			&catenapb.StreamConfig{Partitions: 1, Durability: fsync, MinChainLength: 1}},
		{"a minimum asked for", StreamSettings{Partitions: 1, Replication: 3, MinChainLength: 1},
			&catenapb.StreamConfig{Partitions: 1, Durability: fsync, MinChainLength: 1}},
		{"a minimum above the factor is capped", StreamSettings{Partitions: 1, Replication: 2, MinChainLength: 3},
			&catenapb.StreamConfig{Partitions: 1, Durability: fsync, MinChainLength: 2}},
		{"interval durability without an interval takes the replica's", StreamSettings{Partitions: 1, Replication: 3, Interval: true},
			&catenapb.StreamConfig{Partitions: 1, Durability: interval, MinChainLength: 2}},
		{"interval durability, under a millisecond rounds up", StreamSettings{Partitions: 1, Replication: 3, Interval: true, FsyncInterval: time.Microsecond},
			&catenapb.StreamConfig{Partitions: 1, Durability: interval, FsyncIntervalMs: 1, MinChainLength: 2}},
		{"an fsync interval without interval durability is ignored", StreamSettings{Partitions: 1, Replication: 3, FsyncInterval: time.Second},
			&catenapb.StreamConfig{Partitions: 1, Durability: fsync, MinChainLength: 2}},
		{"retention", StreamSettings{Partitions: 2, Replication: 3, RetentionTime: time.Hour, RetentionBytes: 1 << 30, HardRetentionTime: 24 * time.Hour, HardRetentionBytes: 4 << 30},
			&catenapb.StreamConfig{Partitions: 2, Durability: fsync, MinChainLength: 2, RetentionMs: 3_600_000, RetentionBytes: 1 << 30, HardRetentionMs: 86_400_000, HardRetentionBytes: 4 << 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StreamConfig(tc.in); !proto.Equal(got, tc.want) {
				t.Fatalf("got %v\nwant %v", got, tc.want)
			}
		})
	}
}
