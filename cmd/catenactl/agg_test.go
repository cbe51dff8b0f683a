package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
	"github.com/catena-streams/catena/rpc/transport/transporttest"
)

// fakeAggregator answers like a worker whose merged results hold keys a
// and b; the queries' own behaviour (fan-out, merging) is tested in
// aggregator and test/integration.
type fakeAggregator struct {
	catenapb.UnimplementedAggregatorServer
}

func (fakeAggregator) Get(_ context.Context, r *catenapb.AggGetRequest) (*catenapb.AggGetResponse, error) {
	switch r.Key {
	case "a":
		return &catenapb.AggGetResponse{Shards: []uint32{0, 1}, Rows: []*catenapb.AggRow{{Key: "a", Values: []*catenapb.AggValue{
			{Name: "n", Function: "Count", Value: &catenapb.AggValue_IntValue{IntValue: 3}},
			{Name: "total", Function: "Sum", Value: &catenapb.AggValue_FloatValue{FloatValue: 1.5}},
			{Name: "low", Function: "Min"},
		}}}}, nil
	case "down":
		return nil, status.Error(codes.Unavailable, "shard 1 did not answer")
	}
	return &catenapb.AggGetResponse{Shards: []uint32{0, 1}}, nil
}

func (fakeAggregator) List(_ context.Context, r *catenapb.AggListRequest) (*catenapb.AggListResponse, error) {
	keys := []string{"a", "b"}
	var out []string
	for _, k := range keys {
		if k > r.After {
			out = append(out, k)
		}
	}
	more := len(out) > int(r.Limit)
	if more {
		out = out[:r.Limit]
	}
	return &catenapb.AggListResponse{Keys: out, More: more}, nil
}

func startFakeAggregator(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	catenapb.RegisterAggregatorServer(g, fakeAggregator{})
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

func TestAgg(t *testing.T) {
	addr := startFakeAggregator(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // in stdout
		err  string // in stderr
	}{
		{"get table", []string{"get", "a"}, 0, "KEY  N  TOTAL  LOW\na    3  1.5    -", ""},
		{"get json", []string{"get", "a", "-o", "json"}, 0, `{"key":"a","values":{"low":null,"n":3,"total":1.5}}`, ""},
		{"unknown key", []string{"get", "a", "zz"}, 1, "a    3", `no aggregates for "zz"`},
		{"unavailable", []string{"get", "down"}, 1, "", "aggregation unavailable: shard 1 did not answer"},
		{"no key", []string{"get"}, 2, "", "requires at least 1 arg"},
		{"bad output", []string{"get", "a", "-o", "xml"}, 2, "", "must be table or json"},
		{"bad window bound", []string{"get", "a", "--from", "yesterday"}, 2, "", "neither RFC 3339 nor Unix milliseconds"},
		{"list all pages", []string{"list", "--limit", "1", "--all"}, 0, "a\nb\n", ""},
		{"list one page", []string{"list", "--limit", "1"}, 0, "a\n", `continue with --after "a"`},
		{"bad limit", []string{"list", "--limit", "0"}, 2, "", "--limit 0 must be between 1 and 10000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := catenactl(t, bg(), nil, "", append([]string{"agg", "--aggregator", addr}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.out) || !strings.Contains(r.stderr, tc.err) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q", r.code, r.stdout, r.stderr, tc.code, tc.out, tc.err)
			}
		})
	}
}

// TestAggOverTLS: a worker on Kubernetes serves TLS; agg takes the same
// --tls-* as every other command (it dialled in plaintext before).
func TestAggOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := transporttest.NewCA("catena-test")
	if err != nil {
		t.Fatal(err)
	}
	srvFiles, err := ca.WriteFiles(dir, "worker", "spiffe://catena/ns/t/aggregation/a", ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := srvFiles.Config()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(transport.ServerOptions(transport.OptionalClientCerts(cfg))...)
	catenapb.RegisterAggregatorServer(g, fakeAggregator{})
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	args := []string{"agg", "--aggregator", lis.Addr().String(), "get", "a"}
	if r := catenactl(t, bg(), nil, "", append([]string{"--tls-ca", srvFiles.ClientCAFile}, args...)...); r.code != 0 || !strings.Contains(r.stdout, "a    3") {
		t.Fatalf("over TLS: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := catenactl(t, bg(), nil, "", args...); r.code == 0 {
		t.Fatalf("plaintext to a TLS worker succeeded: %q", r.stdout)
	}
}
