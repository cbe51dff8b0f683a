package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/client/clienttest"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// syncBuffer is a goroutine-safe bytes.Buffer for stdout/stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type result struct {
	stdout, stderr string
	code           int
}

// catenactl runs one command line in-process against srv.
func catenactl(t *testing.T, ctx context.Context, srv *clienttest.Server, stdin string, args ...string) result {
	t.Helper()
	var out, errb syncBuffer
	if srv != nil {
		args = append([]string{"--server", srv.Addr}, args...)
	}
	code := run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return result{out.String(), errb.String(), code}
}

func lines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func decodeLines[T any](t *testing.T, s string) []T {
	t.Helper()
	var out []T
	for _, l := range lines(s) {
		var v T
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("bad JSON line %q: %v", l, err)
		}
		out = append(out, v)
	}
	return out
}

type ackOut struct {
	Stream    string  `json:"stream"`
	Partition *uint32 `json:"partition"`
	Offset    *uint64 `json:"offset"`
	Key       *string `json:"key"`
	Duplicate bool    `json:"duplicate"`
}

func newServer(t *testing.T) *clienttest.Server {
	srv := clienttest.Start(t)
	srv.AddStream("s", 2)
	return srv
}

func bg() context.Context { return context.Background() }

func TestProduceValues(t *testing.T) {
	srv := newServer(t)
	r := catenactl(t, bg(), srv, "", "produce", "--stream", "s", "--key", "k", "--partition", "1", "--value", "a,b", "--value", "c")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	acks := decodeLines[ackOut](t, r.stdout)
	if len(acks) != 2 {
		t.Fatalf("want 2 lines, got %q", r.stdout)
	}
	for i, a := range acks {
		if a.Stream != "s" || a.Partition == nil || *a.Partition != 1 || a.Offset == nil || *a.Offset != uint64(i) || a.Key == nil || *a.Key != "k" || a.Duplicate {
			t.Fatalf("line %d = %+v", i, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "duplicate") {
		t.Fatalf("duplicate printed when false: %s", r.stdout)
	}
	recs := srv.Records("s", 1)
	if len(recs) != 2 || string(recs[0].Value) != "a,b" || string(recs[1].Value) != "c" {
		t.Fatalf("stored %v", recs)
	}
}

func TestProduceStdinInOrderAndPipelined(t *testing.T) {
	srv := newServer(t)
	var in strings.Builder
	for i := range 300 {
		fmt.Fprintf(&in, "value-%d\n", i)
	}
	r := catenactl(t, bg(), srv, in.String(), "produce", "--stream", "s", "--partition", "0", "--linger", "5ms")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	acks := decodeLines[ackOut](t, r.stdout)
	if len(acks) != 300 {
		t.Fatalf("%d lines", len(acks))
	}
	recs := srv.Records("s", 0)
	for i, a := range acks {
		if got := string(recs[*a.Offset].Value); got != fmt.Sprint("value-", i) {
			t.Fatalf("line %d acknowledges offset %d holding %q", i, *a.Offset, got)
		}
	}
	if n := len(srv.Requests()); n >= 300 {
		t.Fatalf("one request per record (%d requests)", n)
	}
}

func TestProduceKeyed(t *testing.T) {
	srv := newServer(t)
	r := catenactl(t, bg(), srv, "k1\tv1\nk2\tv\t2\n\tnokey\n", "produce", "--stream", "s", "--keyed")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	acks := decodeLines[ackOut](t, r.stdout)
	if len(acks) != 3 || *acks[0].Key != "k1" || *acks[1].Key != "k2" || *acks[2].Key != "" {
		t.Fatalf("acks %s", r.stdout)
	}
	var vals []string
	for p := range 2 {
		for _, rec := range srv.Records("s", p) {
			vals = append(vals, string(rec.Key)+"="+string(rec.Value))
		}
	}
	slices.Sort(vals)
	if !slices.Equal(vals, []string{"=nokey", "k1=v1", "k2=v\t2"}) {
		t.Fatalf("stored %q", vals)
	}

	// A line without a TAB: exit 2 naming the line; earlier lines still acknowledged.
	r = catenactl(t, bg(), srv, "a\t1\nb\t2\nno tab here\nc\t3\n", "produce", "--stream", "s", "--keyed")
	if r.code != 2 || !strings.Contains(r.stderr, "line 3") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if n := len(lines(r.stdout)); n != 2 {
		t.Fatalf("%d ack lines before the bad line, want 2: %q", n, r.stdout)
	}
	for _, args := range [][]string{
		{"produce", "--stream", "s", "--keyed", "--key", "x"},
		{"produce", "--stream", "s", "--keyed", "--value", "x"},
	} {
		if r := catenactl(t, bg(), srv, "", args...); r.code != 2 {
			t.Fatalf("%v: exit %d", args, r.code)
		}
	}
}

func TestProduceDuplicateAndErrors(t *testing.T) {
	srv := newServer(t)
	srv.DropResponses(1)
	r := catenactl(t, bg(), srv, "x\ny\n", "produce", "--stream", "s", "--partition", "0")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, a := range decodeLines[ackOut](t, r.stdout) {
		if !a.Duplicate {
			t.Fatalf("retry after lost response not reported as duplicate: %s", r.stdout)
		}
	}
	if n := len(srv.Records("s", 0)); n != 2 {
		t.Fatalf("%d records stored", n)
	}

	r = catenactl(t, bg(), srv, "x\n", "produce", "--stream", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, `stream "nope" not found`) || !strings.Contains(r.stderr, "line 1") {
		t.Fatalf("unknown stream: exit %d, stderr %q", r.code, r.stderr)
	}

	srv.SetRecordHook(func(req *catenapb.ProduceRequest, i, _ int) (codes.Code, string) {
		if string(req.Records[i].Value) == "bad" {
			return codes.InvalidArgument, "value rejected"
		}
		return codes.OK, ""
	})
	r = catenactl(t, bg(), srv, "ok\nbad\n", "produce", "--stream", "s")
	if r.code != 1 || !strings.Contains(r.stderr, "line 2") || !strings.Contains(r.stderr, "value rejected") {
		t.Fatalf("rejected record: exit %d, stderr %q", r.code, r.stderr)
	}
	if n := len(lines(r.stdout)); n != 1 {
		t.Fatalf("want the one acknowledged line, got %q", r.stdout)
	}
	if r := catenactl(t, bg(), srv, "", "produce", "--value", "x"); r.code != 2 || !strings.Contains(r.stderr, "--stream") {
		t.Fatalf("missing --stream: exit %d %q", r.code, r.stderr)
	}
}

type msgOut struct {
	Stream      string `json:"stream"`
	Partition   uint32 `json:"partition"`
	Offset      uint64 `json:"offset"`
	Key         string `json:"key"`
	Value       string `json:"value"`
	ValueB64    string `json:"value_b64"`
	TimestampMs *int64 `json:"timestamp_ms"`
}

func seed(srv *clienttest.Server) {
	for p := range 2 {
		for i := range 5 {
			srv.Append("s", p, &catenapb.Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte(fmt.Sprintf("p%d-%d", p, i)), TimestampMs: int64(1000 * (i + 1))})
		}
	}
}

func TestConsumeNoFollow(t *testing.T) {
	srv := newServer(t)
	seed(srv)
	srv.Append("s", 1, &catenapb.Record{Value: []byte{0xff, 0xfe}})
	r := catenactl(t, bg(), srv, "", "consume", "--stream", "s", "--from", "earliest", "--no-follow")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	msgs := decodeLines[msgOut](t, r.stdout)
	if len(msgs) != 11 {
		t.Fatalf("%d records: %s", len(msgs), r.stdout)
	}
	next := map[uint32]uint64{}
	for _, m := range msgs {
		if m.Offset != next[m.Partition] || m.TimestampMs == nil {
			t.Fatalf("partition %d out of order at %+v", m.Partition, m)
		}
		next[m.Partition]++
		if m.Offset < 5 && m.Value != fmt.Sprintf("p%d-%d", m.Partition, m.Offset) {
			t.Fatalf("value %+v", m)
		}
	}
	if last := msgs[len(msgs)-1]; !strings.Contains(r.stdout, `"value_b64":"//4="`) {
		t.Fatalf("binary value not base64-encoded: %+v", last)
	}

	// One partition, from an offset, with a count.
	r = catenactl(t, bg(), srv, "", "consume", "--stream", "s", "--partition", "1", "--from", "2", "--count", "2")
	msgs = decodeLines[msgOut](t, r.stdout)
	if r.code != 0 || len(msgs) != 2 || msgs[0].Offset != 2 || msgs[1].Offset != 3 || msgs[0].Partition != 1 {
		t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	// --from OFFSET applies to each partition; @timestamp.
	r = catenactl(t, bg(), srv, "", "consume", "--stream", "s", "--from", "4", "--no-follow")
	if got := len(lines(r.stdout)); r.code != 0 || got != 3 {
		t.Fatalf("--from 4 over both partitions: %d lines, exit %d", got, r.code)
	}
	r = catenactl(t, bg(), srv, "", "consume", "--stream", "s", "--partition", "0", "--from", "@3500", "--no-follow")
	msgs = decodeLines[msgOut](t, r.stdout)
	if r.code != 0 || len(msgs) != 2 || msgs[0].Offset != 3 {
		t.Fatalf("--from @3500: %s", r.stdout)
	}
	// latest with --no-follow prints nothing and exits.
	r = catenactl(t, bg(), srv, "", "consume", "--stream", "s", "--from", "latest", "--no-follow")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("latest: exit %d %q", r.code, r.stdout)
	}
	for _, bad := range []string{"soon", "@x", "-3"} {
		if r := catenactl(t, bg(), srv, "", "consume", "--stream", "s", "--from", bad); r.code != 2 || !strings.Contains(r.stderr, "--from") {
			t.Fatalf("--from %s: exit %d %q", bad, r.code, r.stderr)
		}
	}
	if r := catenactl(t, bg(), srv, "", "consume", "--stream", "x", "--no-follow"); r.code != 1 || !strings.Contains(r.stderr, `stream "x" not found`) {
		t.Fatalf("missing stream: exit %d %q", r.code, r.stderr)
	}
}

func TestConsumeFollowEndsOnCancel(t *testing.T) {
	srv := newServer(t)
	seed(srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--server", srv.Addr, "consume", "--stream", "s", "--from", "latest"}, strings.NewReader(""), &out, &errb)
	}()
	// Keep appending until the follower prints one of the new records (the
	// subscription may start after the first appends).
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for !strings.Contains(out.String(), "followed") {
		select {
		case <-tick.C:
			srv.Append("s", 1, &catenapb.Record{Value: []byte("followed")})
		case <-deadline:
			t.Fatalf("follower printed nothing; stderr %q", errb.String())
		case code := <-done:
			t.Fatalf("consume exited early with %d: %s", code, errb.String())
		}
	}
	cancel() // what SIGINT does
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after interrupt: %s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("consume did not stop")
	}
	for _, m := range decodeLines[msgOut](t, out.String()) {
		if m.Partition != 1 || m.Offset < 5 || m.Value != "followed" {
			t.Fatalf("follow printed an old record: %+v", m)
		}
	}
}

func TestDescribe(t *testing.T) {
	srv := newServer(t)
	srv.AddStream("other", 1)
	seed(srv)
	r := catenactl(t, bg(), srv, "", "describe", "--stream", "s")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"PARTITION", "EPOCH", "ROLE", "LOG_START", "LOG_END", "DURABLE", "COMMITTED", "CHECKSUM", "ERROR", "r1..r3", "head", "middle", "unreported", "injected: disk slow", "c0ffee01"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("table lacks %q:\n%s", want, r.stdout)
		}
	}
	r = catenactl(t, bg(), srv, "", "describe", "--stream", "s", "-o", "json")
	var d streamJSON
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || r.code != 0 {
		t.Fatalf("json: %v %s", err, r.stdout)
	}
	if len(d.Partitions) != 2 || len(d.Partitions[0].Chain) != 3 || d.Partitions[0].Chain[0].Role != "head" || d.Partitions[1].Chain[0].Committed != 5 || d.Partitions[0].Chain[2].Reported {
		t.Fatalf("json: %+v", d)
	}
	r = catenactl(t, bg(), srv, "", "describe")
	if r.code != 0 || r.stdout != "other\ns\n" {
		t.Fatalf("list: %d %q", r.code, r.stdout)
	}
	r = catenactl(t, bg(), srv, "", "describe", "-o", "json")
	if r.code != 0 || !strings.Contains(r.stdout, `"other"`) {
		t.Fatalf("list json: %q", r.stdout)
	}
	r = catenactl(t, bg(), srv, "", "describe", "--stream", "x")
	if r.code != 1 || !strings.Contains(r.stderr, `stream "x" not found`) {
		t.Fatalf("missing: exit %d %q", r.code, r.stderr)
	}
	if r := catenactl(t, bg(), srv, "", "describe", "-o", "yaml"); r.code != 2 {
		t.Fatalf("-o yaml: exit %d", r.code)
	}
}

func TestBench(t *testing.T) {
	srv := newServer(t)
	check := func(r result, records int) {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		ls := lines(r.stdout)
		if len(ls) != 1 {
			t.Fatalf("want one final line, got %q", r.stdout)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ls[0]), &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"records", "records_per_sec", "mib_per_sec", "p50_ms", "p99_ms", "p999_ms", "errors"} {
			if _, ok := m[k].(float64); !ok {
				t.Fatalf("final line lacks %s: %s", k, ls[0])
			}
		}
		if m["records"].(float64) != float64(records) || m["errors"].(float64) != 0 || m["records_per_sec"].(float64) <= 0 {
			t.Fatalf("final line %s", ls[0])
		}
		if m["p50_ms"].(float64) > m["p99_ms"].(float64) || m["p99_ms"].(float64) > m["p999_ms"].(float64) {
			t.Fatalf("quantiles not monotonic: %s", ls[0])
		}
	}
	check(catenactl(t, bg(), srv, "", "bench", "--stream", "s", "--record-size", "100", "--records", "2000", "--producers", "2"), 2000)
	// Paced (open loop) with progress on.
	r := catenactl(t, bg(), srv, "", "bench", "--stream", "s", "--record-size", "10", "--records", "300", "--rate", "20000", "--progress")
	check(r, 300)
	// Synchronous: one record at a time per producer.
	r = catenactl(t, bg(), srv, "", "bench", "--stream", "s", "--record-size", "10", "--records", "50", "--sync")
	check(r, 50)
	if !strings.Contains(r.stdout, `"sync":true`) {
		t.Fatalf("a synchronous run does not say so: %s", r.stdout)
	}
	total := 0
	for p := range 2 {
		total += len(srv.Records("s", p))
	}
	if total != 2350 {
		t.Fatalf("%d records stored", total)
	}
	if r := catenactl(t, bg(), srv, "", "bench", "--stream", "s", "--sync", "--rate", "10"); r.code != 2 || !strings.Contains(r.stderr, "--sync and --rate are exclusive") {
		t.Fatalf("--sync with --rate: exit %d %q", r.code, r.stderr)
	}
	if r := catenactl(t, bg(), srv, "", "bench", "--stream", "s", "--record-size", "0"); r.code != 2 || !strings.Contains(r.stderr, "record-size") {
		t.Fatalf("record-size 0: exit %d %q", r.code, r.stderr)
	}
	r = catenactl(t, bg(), srv, "", "bench", "--stream", "nope", "--records", "10")
	if r.code != 1 || !strings.Contains(r.stderr, `stream "nope" not found`) || !strings.Contains(r.stdout, `"errors":10`) {
		t.Fatalf("bench to missing stream: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestHistogram(t *testing.T) {
	var h histogram
	for i := 1; i <= 100000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, q := range []float64{0.5, 0.99, 0.999} {
		want := q * 100000 * float64(time.Microsecond)
		got := float64(h.quantile(q))
		if got < want*0.96 || got > want*1.04 {
			t.Fatalf("q%.3f = %v, want about %v", q, time.Duration(got), time.Duration(want))
		}
	}
	for v := uint64(0); v < 1<<20; v += 7 {
		lo, hi := histRange(histIndex(v))
		if v < lo || v > hi {
			t.Fatalf("value %d outside its bucket [%d,%d]", v, lo, hi)
		}
	}
	if i := histIndex(^uint64(0) >> 1); i >= histBuckets {
		t.Fatalf("index %d out of range", i)
	}
}

func TestUsageAndMisc(t *testing.T) {
	srv := newServer(t)
	for _, args := range [][]string{
		{"produce", "--stream", "s", "--bogus"},
		{"frobnicate"},
		{"consume"},
		{"describe", "extra-arg"},
		{"produce", "--stream", "s", "--partition", "-1"},
	} {
		r := catenactl(t, bg(), srv, "", args...)
		if r.code != 2 || r.stderr == "" {
			t.Fatalf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := catenactl(t, bg(), nil, "", "completion", sh)
		if r.code != 0 || !strings.Contains(r.stdout, "catenactl") {
			t.Fatalf("completion %s: exit %d", sh, r.code)
		}
	}
	r := catenactl(t, bg(), nil, "", "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "catenactl ") {
		t.Fatalf("version: %q", r.stdout)
	}
	// The command tree is usable directly.
	root := NewRootCommand(strings.NewReader(""), io.Discard, io.Discard)
	if c, _, err := root.Find([]string{"bench"}); err != nil || c.Name() != "bench" {
		t.Fatalf("bench command: %v", err)
	}
	// Unreachable server: a server error (exit 1).
	r = catenactl(t, bg(), nil, "", "--server", "127.0.0.1:1", "describe")
	if r.code != 1 || !strings.Contains(r.stderr, "unavailable") {
		t.Fatalf("unreachable: exit %d %q", r.code, r.stderr)
	}
}

func TestConsumers(t *testing.T) {
	srv := newServer(t)
	seed(srv)
	ctx := bg()
	r := catenactl(t, ctx, srv, "", "consumers", "list", "--stream", "s")
	if r.code != 0 || !strings.Contains(r.stdout, "PARTITION") || !strings.Contains(r.stdout, "FORCED_TRIM") {
		t.Fatalf("empty list: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	cl, err := clientFor(srv)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.CommitConsumerOffset(ctx, "s", 1, "ns/agg", 3); err != nil {
		t.Fatal(err)
	}
	if err := cl.CommitConsumerOffset(ctx, "s", 0, "ns/agg", 1); err != nil {
		t.Fatal(err)
	}
	srv.ForceTrim("s", 0, "ns/agg", 4)
	r = catenactl(t, ctx, srv, "", "consumers", "list", "--stream", "s")
	if r.code != 0 {
		t.Fatalf("list: exit %d %s", r.code, r.stderr)
	}
	for _, want := range []string{"ns/agg", "held 1, trimmed to 4 at "} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("table lacks %q:\n%s", want, r.stdout)
		}
	}
	r = catenactl(t, ctx, srv, "", "consumers", "list", "--stream", "s", "-o", "json")
	var out consumersJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 0 {
		t.Fatalf("json: %v %q", err, r.stdout)
	}
	if len(out.Partitions) != 2 || out.Partitions[1].Holds[0] != (holdJSON{"ns/agg", 3}) || len(out.Partitions[0].ForcedTrims) != 1 ||
		out.Partitions[0].ForcedTrims[0].LogStart != 4 || out.Partitions[0].Committed != 5 {
		t.Fatalf("json: %+v", out)
	}

	r = catenactl(t, ctx, srv, "", "consumers", "delete", "--stream", "s", "--consumer", "ns/agg")
	if r.code != 0 || !strings.Contains(r.stdout, `deleted consumer "ns/agg" of stream "s": released partitions 0,1`) {
		t.Fatalf("delete: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if h := srv.Holds("s", 1); len(h) != 0 {
		t.Fatalf("holds %v after delete", h)
	}
	r = catenactl(t, ctx, srv, "", "consumers", "delete", "--stream", "s", "--consumer", "ns/agg")
	if r.code != 0 || !strings.Contains(r.stdout, "held no partition") {
		t.Fatalf("delete again: exit %d %q", r.code, r.stdout)
	}
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"consumers", "list"}, 2, "missing --stream"},
		{[]string{"consumers", "list", "--stream", "s", "-o", "yaml"}, 2, "bad --output"},
		{[]string{"consumers", "delete", "--stream", "s"}, 2, "missing --consumer"},
		{[]string{"consumers", "delete", "--stream", "s", "--consumer", "Bad Name"}, 2, "consumer name"},
		{[]string{"consumers", "list", "--stream", "x"}, 1, `stream "x" not found`},
		{[]string{"consumers", "delete", "--stream", "x", "--consumer", "c"}, 1, `stream "x" not found`},
	} {
		r := catenactl(t, ctx, srv, "", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("%v: exit %d %q, want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.msg)
		}
	}
}

func clientFor(srv *clienttest.Server) (*client.Client, error) {
	return client.Dial(bg(), srv.Addr)
}

// TestMain keeps the tests off the user's profiles: no config file, no
// profile from the environment.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "catenactl-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv("CATENA_CONFIG", filepath.Join(dir, "none.yaml"))
	os.Unsetenv("CATENA_PROFILE")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestStreamCommandsRefuseBadInput: usage errors exit 2 before anything is
// dialled; a server that cannot create streams says why (exit 1).
func TestStreamCommandsRefuseBadInput(t *testing.T) {
	srv := clienttest.Start(t)
	srv.AddStream("s", 1)
	for _, tc := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"delete without --yes", []string{"stream", "delete", "s"}, 2, "erases every copy of its records: say --yes"},
		{"create without partitions", []string{"stream", "create", "x", "--partitions", "0"}, 2, "--partitions must be at least 1"},
		{"create without a name", []string{"stream", "create"}, 2, "accepts 1 arg"},
		{"a server that cannot create streams", []string{"stream", "create", "x"}, 1, "CreateStream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := catenactl(t, bg(), srv, "", tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.err) {
				t.Fatalf("exit %d, stderr %q; want exit %d with %q", r.code, r.stderr, tc.code, tc.err)
			}
		})
	}
	if r := catenactl(t, bg(), srv, "", "stream", "list"); r.code != 0 || r.stdout != "s\n" {
		t.Fatalf("list: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestProduceAndConsumeHeaders(t *testing.T) {
	srv := newServer(t)
	r := catenactl(t, bg(), srv, "", "produce", "--stream", "s", "--partition", "0", "--value", "x", "--header", "trace=t1", "--header", "trace=t2", "--header", "empty=")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	r = catenactl(t, bg(), srv, "", "consume", "--stream", "s", "--partition", "0", "--no-follow")
	if r.code != 0 || !strings.Contains(r.stdout, `"headers":[{"key":"trace","value":"t1"},{"key":"trace","value":"t2"},{"key":"empty","value":""}]`) {
		t.Fatalf("consume: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = catenactl(t, bg(), srv, "", "produce", "--stream", "s", "--value", "x", "--header", "novalue")
	if r.code != 2 || !strings.Contains(r.stderr, "KEY=VALUE") {
		t.Fatalf("bad --header: exit %d %s", r.code, r.stderr)
	}
	if n := len(srv.Records("s", 0)) + len(srv.Records("s", 1)); n != 1 {
		t.Fatalf("a refused produce stored records: %d", n)
	}
}
