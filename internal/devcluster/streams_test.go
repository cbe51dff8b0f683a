package devcluster

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/server"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestParseStreams(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    string // fmt of the specs
		wantErr string
	}{
		{in: []string{"demo"}, want: "[{demo 0}]"},
		{in: []string{"demo", "demo-checkpoints"}, want: "[{demo 0} {demo-checkpoints 0}]"},
		{in: []string{"demo:4", "agg-ckpt:1"}, want: "[{demo 4} {agg-ckpt 1}]"},
		{in: []string{" demo:2 "}, want: "[{demo 2}]"},
		{in: []string{"demo:0"}, wantErr: `partitions "0" must be a whole number of at least 1`},
		{in: []string{"demo:-3"}, wantErr: `partitions "-3"`},
		{in: []string{"demo:four"}, wantErr: `partitions "four"`},
		{in: []string{"demo:"}, wantErr: `partitions ""`},
		{in: []string{"demo:2:3"}, wantErr: `partitions "2:3"`},
	} {
		got, err := ParseStreams(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseStreams(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("ParseStreams(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestValidateStreams(t *testing.T) {
	many := make([]StreamSpec, maxStreams+1)
	for i := range many {
		many[i] = StreamSpec{Name: fmt.Sprintf("s%d", i)}
	}
	for _, tc := range []struct {
		name    string
		streams []StreamSpec
		wantErr string // "" for valid
	}{
		{"one", []StreamSpec{{Name: "demo"}}, ""},
		{"two with counts", []StreamSpec{{Name: "demo", Partitions: 4}, {Name: "agg-ckpt", Partitions: 1}}, ""},
		{"as many as allowed", many[:maxStreams], ""},
		{"longest name", []StreamSpec{{Name: strings.Repeat("a", maxStreamNameLen)}}, ""},
		{"none", nil, "at least one stream"},
		{"too many", many, "at most 32"},
		{"duplicate", []StreamSpec{{Name: "demo"}, {Name: "demo", Partitions: 2}}, `"demo" is given twice`},
		{"empty name", []StreamSpec{{Name: "demo"}, {Name: ""}}, `stream name ""`},
		{"upper case", []StreamSpec{{Name: "Demo"}}, `stream name "Demo"`},
		{"underscore", []StreamSpec{{Name: "agg_ckpt"}}, `stream name "agg_ckpt"`},
		{"leading dash", []StreamSpec{{Name: "-demo"}}, `stream name "-demo"`},
		{"trailing dash", []StreamSpec{{Name: "demo-"}}, `stream name "demo-"`},
		{"too long", []StreamSpec{{Name: strings.Repeat("a", maxStreamNameLen+1)}}, "must be 1-63"},
		{"too many partitions", []StreamSpec{{Name: "demo", Partitions: maxPartitions + 1}}, "--stream demo:1025: partitions must be between 1 and 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := Spec{DataDir: "d", Listen: "127.0.0.1:0", Replicas: 3, Replication: 3, Partitions: 4, Streams: tc.streams}
			err := spec.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestResolveStreams(t *testing.T) {
	got := resolveStreams([]StreamSpec{{Name: "demo"}, {Name: "agg-ckpt", Partitions: 1}}, 4)
	if fmt.Sprint(got) != "[{demo 4} {agg-ckpt 1}]" {
		t.Fatalf("resolveStreams = %v", got)
	}
}

// TestStreamNamesAgreeWithTheReplica: dev refuses exactly the stream names
// a replica refuses, so a name dev accepts never fails at ensureStream.
func TestStreamNamesAgreeWithTheReplica(t *testing.T) {
	srv, err := server.New(server.Options{ID: "r0", DataDir: t.TempDir(), Logger: logr.Discard(), Fatal: func(err error) { t.Errorf("replica stopped: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, MinChainLength: 1}
	for _, name := range []string{
		"demo", "demo-checkpoints", "a", "0", "9lives", "a-b-c", "a--b", strings.Repeat("x", maxStreamNameLen),
		"", "-", "Demo", "demo_ckpt", "demo.ckpt", "-demo", "demo-", "dé", "demo ckpt", "demo/1", strings.Repeat("x", maxStreamNameLen+1),
	} {
		devErr := validateStreamName(name)
		_, err := srv.Configure(context.Background(), &catenapb.ConfigureRequest{
			Stream: name, Epoch: 1, Config: cfg, Members: []*catenapb.Member{{Id: "r0", Addr: "127.0.0.1:1"}},
		})
		replicaRefuses := status.Code(err) == codes.InvalidArgument
		if err != nil && !replicaRefuses {
			t.Fatalf("Configure %q: %v", name, err)
		}
		if (devErr != nil) != replicaRefuses {
			t.Errorf("stream name %q: dev says %v, the replica says %v", name, devErr, err)
		}
	}
}

// TestSegmentSizesAgreeWithTheReplica: dev refuses exactly the segment
// sizes a replica refuses, so a --segment-bytes dev accepts never fails
// at ensureStream.
func TestSegmentSizesAgreeWithTheReplica(t *testing.T) {
	srv, err := server.New(server.Options{ID: "r0", DataDir: t.TempDir(), Logger: logr.Discard(), Fatal: func(err error) { t.Errorf("replica stopped: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for i, size := range []int64{0, 1, 1<<20 - 1, 1 << 20, 64 << 20, 1 << 30, 1<<30 + 1, -1} {
		spec := Spec{DataDir: "d", Listen: "127.0.0.1:0", Replicas: 3, Replication: 3, Partitions: 4, Streams: []StreamSpec{{Name: "demo"}}, SegmentBytes: size}
		devErr := spec.Validate()
		cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, MinChainLength: 1, SegmentBytes: size}
		_, err := srv.Configure(context.Background(), &catenapb.ConfigureRequest{
			Stream: fmt.Sprintf("s%d", i), Epoch: 1, Config: cfg, Members: []*catenapb.Member{{Id: "r0", Addr: "127.0.0.1:1"}},
		})
		replicaRefuses := status.Code(err) == codes.InvalidArgument
		if err != nil && !replicaRefuses {
			t.Fatalf("Configure with segment size %d: %v", size, err)
		}
		if (devErr != nil) != replicaRefuses {
			t.Errorf("segment size %d: dev says %v, the replica says %v", size, devErr, err)
		}
	}
}
