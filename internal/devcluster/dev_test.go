package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// eventually calls fn until it returns nil, failing the test with fn's last
// error once timeout has passed.
func eventually(t *testing.T, timeout time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(25 * time.Millisecond) // poll interval
	defer tick.Stop()
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %v", timeout, err)
		}
		<-tick.C
	}
}

// buildCatena builds the catena executable for tests that run dev as a
// real process (its replicas are children running the same binary).
func buildCatena(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "catena")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/catena-streams/catena/cmd/catena").CombinedOutput()
	if err != nil {
		t.Fatalf("building catena: %v\n%s", err, out)
	}
	return bin
}

// devProc is a `catena dev` process.
type devProc struct {
	t       *testing.T
	dataDir string
	outPath string
	cmd     *exec.Cmd
	done    chan struct{}
	state   State
}

// startDevProc runs `catena dev` on dataDir with args and waits until it is
// ready. Cleanup stops it and makes sure its replicas are gone.
func startDevProc(t *testing.T, bin, dataDir string, args ...string) *devProc {
	t.Helper()
	d := &devProc{t: t, dataDir: dataDir, outPath: filepath.Join(dataDir, "dev.out"), done: make(chan struct{})}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(d.outPath)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin, append([]string{"dev", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, args...)...)
	d.cmd.Stdout, d.cmd.Stderr = out, out
	if err := d.cmd.Start(); err != nil {
		out.Close()
		t.Fatal(err)
	}
	go func() {
		_ = d.cmd.Wait()
		out.Close()
		close(d.done)
	}()
	t.Cleanup(d.stop)
	t.Cleanup(func() {
		if t.Failed() {
			d.dumpLogs()
		}
	})
	eventually(t, 90*time.Second, func() error {
		select {
		case <-d.done:
			t.Fatalf("catena dev exited during start-up: %v\n%s", d.cmd.ProcessState, d.output())
		default:
		}
		// dev.json is written before the banner; a stale one is removed at
		// start, so the banner is what says ready.
		if !strings.Contains(d.output(), "dev cluster is ready") {
			return errors.New("catena dev is not ready yet")
		}
		return d.readState()
	})
	return d
}

func (d *devProc) output() string {
	b, _ := os.ReadFile(d.outPath)
	return string(b)
}

func (d *devProc) readState() error {
	st, err := readState(d.dataDir)
	if err != nil {
		return err
	}
	d.state = *st
	return nil
}

func (d *devProc) replica(id string) ReplicaState {
	d.t.Helper()
	for _, r := range d.state.Replicas {
		if r.ID == id {
			return r
		}
	}
	d.t.Fatalf("no replica %q in %s", id, StateFile)
	return ReplicaState{}
}

func (d *devProc) dumpLogs() {
	tail := func(s string) string { return s[max(0, len(s)-3000):] }
	d.t.Logf("---- catena dev (tail)\n%s", tail(d.output()))
	for _, r := range d.state.Replicas {
		b, _ := os.ReadFile(filepath.Join(d.dataDir, r.ID+".log"))
		d.t.Logf("---- replica %s (tail)\n%s", r.ID, tail(string(b)))
	}
}

// stop ends dev (SIGTERM, SIGKILL after a while); its replicas die with it
// (SIGTERM from dev, or their parent-death signal), and any still running
// after that are killed.
func (d *devProc) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		d.t.Logf("catena dev did not stop in time; killing it")
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	for _, r := range d.state.Replicas {
		deadline := time.Now().Add(5 * time.Second)
		for syscall.Kill(r.PID, 0) == nil && time.Now().Before(deadline) {
			<-time.After(20 * time.Millisecond) // poll interval
		}
		if syscall.Kill(r.PID, 0) == nil {
			d.t.Logf("replica %s (pid %d) outlived catena dev; killing it", r.ID, r.PID)
			_ = syscall.Kill(r.PID, syscall.SIGKILL)
		}
	}
}

type ackedRecord struct {
	partition uint32
	offset    uint64
	value     string
}

// produce sends n records to stream and returns them as acked; every one
// must be acked (the producer retries through a chain repair).
func produce(t *testing.T, p *client.Producer, prefix string, n int) []ackedRecord {
	t.Helper()
	ctx := context.Background()
	futures := make([]*client.Future, n)
	values := make([]string, n)
	for i := range n {
		values[i] = fmt.Sprintf("%s-%s-%d", p.Stream(), prefix, i)
		futures[i] = p.Send(ctx, client.Record{Key: []byte(fmt.Sprintf("k%d", i%16)), Value: []byte(values[i])})
	}
	out := make([]ackedRecord, n)
	for i, f := range futures {
		ack, err := f.Wait()
		if err != nil {
			t.Fatalf("record %q to %s: %v", values[i], p.Stream(), err)
		}
		out[i] = ackedRecord{ack.Partition, ack.Offset, values[i]}
	}
	return out
}

// expectOneConfigAndPlacement checks what dev installed, as the operator
// would from a Stream: the default minimum chain length is a majority (2
// of 3), the retention given is carried, and the heads and tails of every
// stream's chains are spread over the replicas together.
func expectOneConfigAndPlacement(t *testing.T, ctx context.Context, pool *transport.Pool, replicas []ReplicaState, streams map[string]int) {
	t.Helper()
	heads, tails := map[string]int{}, map[string]int{}
	chains := 0
	for _, r := range replicas {
		conn, err := pool.Get(r.Addr)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := catenapb.NewReplicaClient(conn).Status(ctx, &catenapb.StatusRequest{})
		if err != nil {
			t.Fatalf("status of %s: %v", r.ID, err)
		}
		for _, ps := range resp.GetPartitions() {
			if _, ok := streams[ps.GetStream()]; !ok {
				continue
			}
			cfg := ps.GetConfig()
			if cfg.GetMinChainLength() != 2 || cfg.GetRetentionMs() != time.Hour.Milliseconds() {
				t.Errorf("%s/%d on %s runs min_chain_length %d and retention_ms %d, want 2 (a majority) and 3600000",
					ps.GetStream(), ps.GetPartition(), r.ID, cfg.GetMinChainLength(), cfg.GetRetentionMs())
			}
			switch ps.GetRole() {
			case catenapb.Role_ROLE_HEAD:
				heads[r.ID]++
				chains++
			case catenapb.Role_ROLE_TAIL:
				tails[r.ID]++
			}
		}
	}
	want := 0
	for _, n := range streams {
		want += n
	}
	if chains != want {
		t.Fatalf("%d chains have a head, want %d", chains, want)
	}
	for _, counts := range []map[string]int{heads, tails} {
		lo, hi := want, 0
		for _, r := range replicas {
			lo, hi = min(lo, counts[r.ID]), max(hi, counts[r.ID])
		}
		if hi-lo > 1 {
			t.Errorf("roles not spread over the replicas: heads %v, tails %v", heads, tails)
		}
	}
}

// TestDevRepairsEveryStream runs catena dev with two streams of different
// partition counts, produces to both through the ingestion endpoint,
// SIGKILLs a replica (a member of every chain) and checks that the master
// repairs the chains of both streams: every chain back to full length under
// a new epoch with the restarted replica in it and every member agreeing
// (log end, commit, checksum), and every acked record readable at its
// acked offset.
func TestDevRepairsEveryStream(t *testing.T) {
	const (
		replicas   = 3
		records    = 200 // per stream, before and again after the kill
		repairTime = 60 * time.Second
	)
	streams := map[string]int{"demo": 3, "demo-checkpoints": 2}
	bin := buildCatena(t)
	dataDir := t.TempDir()
	d := startDevProc(t, bin, dataDir, "--stream", "demo", "--stream", "demo-checkpoints:2", "--partitions", "3", "--retention", "1h", "--pprof-listen", "127.0.0.1:0")
	// With --pprof-listen every replica serves Go profiles too, where
	// dev.json says.
	for _, r := range d.state.Replicas {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + r.Pprof + "/debug/pprof/goroutine?debug=1")
		if err != nil || r.Pprof == "" {
			t.Fatalf("replica %s's profiles at %q: %v", r.ID, r.Pprof, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "replica/server") {
			t.Fatalf("replica %s's goroutine profile: %s\n%.300s", r.ID, resp.Status, body)
		}
	}

	if d.state.Stream != "demo" || !slices.Equal(d.state.Streams, []string{"demo", "demo-checkpoints"}) {
		t.Fatalf("%s: stream %q streams %q, want demo and [demo demo-checkpoints]", StateFile, d.state.Stream, d.state.Streams)
	}
	if !strings.Contains(d.output(), "streams: demo, demo-checkpoints") {
		t.Errorf("the ready banner does not list both streams:\n%s", d.output())
	}

	ctx := context.Background()
	pool := transport.NewPool(nil)
	defer pool.Close()
	expectOneConfigAndPlacement(t, ctx, pool, d.state.Replicas, streams)

	c, err := client.Dial(ctx, d.state.Ingest)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	acked := map[string][]ackedRecord{}
	producers := map[string]*client.Producer{}
	for name := range streams {
		p := client.NewProducer(c, name, client.ProducerOptions{RetryTimeout: repairTime, RequestTimeout: 5 * time.Second})
		defer p.Close()
		producers[name] = p
		acked[name] = produce(t, p, "before", records)
	}

	victim := d.replica("r0")
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill r0 (pid %d): %v", victim.PID, err)
	}
	// Writes go on in both streams while r0 is gone or rejoining.
	for name, p := range producers {
		acked[name] = append(acked[name], produce(t, p, "after", records)...)
	}
	eventually(t, repairTime, func() error {
		if err := d.readState(); err != nil {
			return err
		}
		if pid := d.replica("r0").PID; pid == victim.PID {
			return fmt.Errorf("r0 not restarted yet (pid %d)", pid)
		}
		return nil
	})

	eventually(t, repairTime, func() error {
		return chainsRepaired(ctx, pool, d.state.Replicas, streams, replicas)
	})

	for name, recs := range acked {
		for _, r := range recs {
			res, err := c.Fetch(ctx, name, r.partition, r.offset, 0, 0)
			if err != nil {
				t.Fatalf("fetch %s/%d@%d: %v", name, r.partition, r.offset, err)
			}
			if len(res.Messages) == 0 || res.Messages[0].Offset != r.offset || string(res.Messages[0].Value) != r.value {
				t.Fatalf("%s/%d@%d: got %v, want %q", name, r.partition, r.offset, res.Messages[:min(1, len(res.Messages))], r.value)
			}
		}
	}
}

// chainsRepaired checks every partition of every stream: the highest epoch
// any replica reports is past the first, its chain holds every replica, and
// every member is at that epoch with the same log end, commit and checksum
// as the head.
func chainsRepaired(ctx context.Context, pool *transport.Pool, rs []ReplicaState, streams map[string]int, replicas int) error {
	reports := map[string]*catenapb.StatusResponse{}
	for _, r := range rs {
		conn, err := pool.Get(r.Addr)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := catenapb.NewReplicaClient(conn).Status(cctx, &catenapb.StatusRequest{})
		cancel()
		if err != nil {
			return fmt.Errorf("status of %s: %w", r.ID, err)
		}
		reports[r.ID] = resp
	}
	for name, partitions := range streams {
		for p := range uint32(partitions) {
			var latest *catenapb.PartitionStatus
			byID := map[string]*catenapb.PartitionStatus{}
			for id, resp := range reports {
				for _, ps := range resp.GetPartitions() {
					if ps.GetStream() == name && ps.GetPartition() == p {
						byID[id] = ps
						if latest == nil || ps.GetEpoch() > latest.GetEpoch() {
							latest = ps
						}
					}
				}
			}
			if latest == nil || latest.GetEpoch() < 2 {
				return fmt.Errorf("%s/%d: not reconfigured after the kill (%v)", name, p, latest)
			}
			if len(latest.GetMembers()) != replicas {
				return fmt.Errorf("%s/%d: chain %v at epoch %d is not back to %d members", name, p, latest.GetMembers(), latest.GetEpoch(), replicas)
			}
			head := byID[latest.GetMembers()[0].GetId()]
			for _, m := range latest.GetMembers() {
				ps := byID[m.GetId()]
				switch {
				case ps == nil || ps.GetEpoch() != latest.GetEpoch():
					return fmt.Errorf("%s/%d: member %s not at epoch %d", name, p, m.GetId(), latest.GetEpoch())
				case ps.GetError() != "":
					return fmt.Errorf("%s/%d: member %s: %s", name, p, m.GetId(), ps.GetError())
				case head == nil || ps.GetLogEnd() != head.GetLogEnd() || ps.GetCommitted() != ps.GetLogEnd() || ps.GetChecksum() != head.GetChecksum():
					return fmt.Errorf("%s/%d: member %s end %d committed %d sum %08x; head end %d sum %08x",
						name, p, m.GetId(), ps.GetLogEnd(), ps.GetCommitted(), ps.GetChecksum(), head.GetLogEnd(), head.GetChecksum())
				}
			}
		}
	}
	return nil
}

// TestPickAddrAvoidsEphemeralPorts: a replica's address is not one the
// kernel may hand an outgoing connection while the replica is down, or its
// restart cannot bind it.
func TestPickAddrAvoidsEphemeralPorts(t *testing.T) {
	lo, hi := ephemeralPorts()
	for range 20 {
		addr := pickAddr("127.0.0.1", "", lo+5) // the conventional port is ephemeral
		_, ps, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(ps)
		if port >= lo && port <= hi {
			t.Fatalf("picked %s, in the ephemeral range %d-%d", addr, lo, hi)
		}
	}
	// The previous address is kept while it is free, unless it is an
	// ephemeral one; no two draws give the same address.
	prev := pickAddr("127.0.0.1", "", lo+5)
	if got := pickAddr("127.0.0.1", prev, lo+5); got != prev {
		t.Fatalf("picked %s, want the previous %s", got, prev)
	}
	seen := map[string]bool{prev: true}
	for range 50 {
		a := pickAddr("127.0.0.1", "", lo+5)
		if seen[a] {
			t.Fatalf("picked %s twice", a)
		}
		seen[a] = true
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	old := l.Addr().String() // an ephemeral port, as an older dev chose
	l.Close()
	if got := pickAddr("127.0.0.1", old, lo+5); got == old {
		t.Fatalf("kept the previous ephemeral address %s", old)
	}
}
