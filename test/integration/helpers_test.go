package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/internal/devcluster"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// ---------------------------------------------------------------- polling

// eventually calls fn until it returns nil, failing the test with fn's last
// error once timeout has passed. It polls; it never sleeps blindly.
func eventually(t testing.TB, timeout time.Duration, fn func() error) {
	t.Helper()
	if err := poll(timeout, fn); err != nil {
		t.Fatalf("condition not met within %s: %v", timeout, err)
	}
}

// poll is eventually without the test: it returns fn's last error on timeout.
func poll(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ---------------------------------------------------------------- processes

// proc is a process this test started (a direct child).
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProc(t testing.TB, name, logPath string, args ...string) *proc {
	t.Helper()
	return startProcOf(t, catenaBin, name, logPath, args...)
}

// startProcOf is startProc with another catena executable.
func startProcOf(t testing.TB, bin, name, logPath string, args ...string) *proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Safety net only: a test binary that dies must not leave servers behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits for the exit, escalating to SIGKILL after
// grace. Safe to call on an exited process.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(p.pid(), syscall.SIGCONT) // a paused process cannot handle SIGTERM
	_ = syscall.Kill(p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(p.pid(), syscall.SIGKILL)
		<-p.done
	}
}

// kill9 sends SIGKILL and waits for the exit.
func (p *proc) kill9() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(p.pid(), syscall.SIGKILL)
	<-p.done
}

// pidGone reports whether a process that is not our child has exited (no
// such process, or a zombie waiting for its reaper).
func pidGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}

// freeAddr returns a loopback address with a port that was free just now.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// tailFile returns the last n bytes of a file, for failure reports.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// ---------------------------------------------------------------- dev cluster

// devCluster is a running `catena dev`.
type devCluster struct {
	t       testing.TB
	dataDir string
	proc    *proc
	outPath string
	state   devcluster.State
	client  *client.Client
}

var devStarts sync.Map // dataDir -> *int (start count, for log names)

// startDev runs `catena dev --data-dir dataDir --listen 127.0.0.1:0 args...`,
// waits until it is ready (dev.json written) and returns it with a client
// connected to its ingestion endpoint. Cleanup stops it (SIGTERM, then
// SIGKILL) and makes sure every replica PID it reported is gone.
func startDev(t testing.TB, dataDir string, args ...string) *devCluster {
	t.Helper()
	return startDevOf(t, catenaBin, dataDir, args...)
}

// startDevOf is startDev with another catena executable (its replicas are
// started from the same one).
func startDevOf(t testing.TB, bin, dataDir string, args ...string) *devCluster {
	t.Helper()
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	v, _ := devStarts.LoadOrStore(dataDir, new(int))
	n := v.(*int)
	*n++
	outPath := filepath.Join(dataDir, fmt.Sprintf("dev-%d.out", *n))
	full := append([]string{"dev", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, args...)
	d := &devCluster{t: t, dataDir: dataDir, outPath: outPath}
	d.proc = startProcOf(t, bin, "catena dev", outPath, full...)
	t.Cleanup(d.stop)
	t.Cleanup(func() {
		if t.Failed() {
			d.dumpLogs()
		}
	})
	// dev writes "... is ready" to stdout after writing dev.json; a stale
	// dev.json from a previous run must not be mistaken for readiness.
	eventually(t, 90*time.Second, func() error {
		if d.proc.exited() {
			t.Fatalf("catena dev exited during start-up: %v\n%s", d.proc.err, tailFile(outPath, 4000))
		}
		out, _ := os.ReadFile(outPath)
		if !bytes.Contains(out, []byte("dev cluster is ready")) {
			return errors.New("catena dev is not ready yet")
		}
		b, err := os.ReadFile(filepath.Join(dataDir, devcluster.StateFile))
		if err != nil {
			return err
		}
		var st devcluster.State
		if err := json.Unmarshal(b, &st); err != nil {
			return err
		}
		d.state = st
		return nil
	})
	c, err := client.Dial(context.Background(), d.state.Ingest)
	if err != nil {
		t.Fatal(err)
	}
	d.client = c
	t.Cleanup(func() { _ = c.Close() })
	return d
}

func (d *devCluster) dumpLogs() {
	d.t.Logf("---- %s (tail)\n%s", d.outPath, tailFile(d.outPath, 3000))
	for _, r := range d.state.Replicas {
		p := filepath.Join(d.dataDir, r.ID+".log")
		d.t.Logf("---- %s (tail)\n%s", p, tailFile(p, 3000))
	}
}

// replicaPIDs are the replica processes dev.json reported.
func (d *devCluster) replica(id string) devcluster.ReplicaState {
	for _, r := range d.state.Replicas {
		if r.ID == id {
			return r
		}
	}
	d.t.Fatalf("no replica %q in dev.json", id)
	return devcluster.ReplicaState{}
}

// stop ends the dev process gracefully (it stops its replicas) and makes
// sure every replica PID from dev.json is gone.
func (d *devCluster) stop() {
	for _, r := range d.state.Replicas {
		if !pidGone(r.PID) {
			_ = syscall.Kill(r.PID, syscall.SIGCONT)
		}
	}
	d.proc.stop(20 * time.Second)
	for _, r := range d.state.Replicas {
		if err := poll(5*time.Second, func() error {
			if pidGone(r.PID) {
				return nil
			}
			return fmt.Errorf("replica %s (pid %d) still running", r.ID, r.PID)
		}); err != nil {
			d.t.Logf("%v after dev stopped; killing it", err)
			_ = syscall.Kill(r.PID, syscall.SIGKILL)
		}
	}
}

// kill9All SIGKILLs every replica PID from dev.json, then the dev process,
// and waits until all are gone.
func (d *devCluster) kill9All() {
	d.t.Helper()
	for _, r := range d.state.Replicas {
		_ = syscall.Kill(r.PID, syscall.SIGKILL)
	}
	d.proc.kill9()
	for _, r := range d.state.Replicas {
		eventually(d.t, 10*time.Second, func() error {
			if pidGone(r.PID) {
				return nil
			}
			return fmt.Errorf("replica %s (pid %d) survived SIGKILL", r.ID, r.PID)
		})
	}
}

func (d *devCluster) seeds() []string {
	out := make([]string, len(d.state.Replicas))
	for i, r := range d.state.Replicas {
		out[i] = r.Addr
	}
	return out
}

// ---------------------------------------------------------------- standalone replicas

// replicaProc is a standalone `catena replica` this test started.
type replicaProc struct {
	id, addr, dataDir, logPath string
	proc                       *proc
}

// startReplica runs `catena replica` and waits until its Status answers.
func startReplica(t testing.TB, id, addr, dataDir string) *replicaProc {
	t.Helper()
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &replicaProc{id: id, addr: addr, dataDir: dataDir, logPath: dataDir + ".log"}
	r.proc = startProc(t, "replica "+id, r.logPath, "replica", "--id", id, "--listen", addr, "--data-dir", dataDir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- %s (tail)\n%s", r.logPath, tailFile(r.logPath, 3000))
		}
	})
	t.Cleanup(func() { r.proc.stop(10 * time.Second) })
	rc := replicaClient(t, addr)
	eventually(t, 30*time.Second, func() error {
		if r.proc.exited() {
			t.Fatalf("replica %s exited during start-up: %v\n%s", id, r.proc.err, tailFile(r.logPath, 3000))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := rc.Status(ctx, &catenapb.StatusRequest{})
		return err
	})
	return r
}

// ---------------------------------------------------------------- gRPC

var (
	connsMu sync.Mutex
)

// replicaClient dials a replica's Replica service; cleanup closes it.
func replicaClient(t testing.TB, addr string) catenapb.ReplicaClient {
	t.Helper()
	connsMu.Lock()
	defer connsMu.Unlock()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return catenapb.NewReplicaClient(conn)
}

// partStatus asks one replica for one partition's status.
func partStatus(ctx context.Context, rc catenapb.ReplicaClient, stream string, p uint32) (*catenapb.PartitionStatus, error) {
	resp, err := rc.Status(ctx, &catenapb.StatusRequest{Stream: stream, Partition: &p})
	if err != nil {
		return nil, err
	}
	if len(resp.GetPartitions()) != 1 {
		return nil, fmt.Errorf("status of %s/%d: %d partitions reported", stream, p, len(resp.GetPartitions()))
	}
	return resp.GetPartitions()[0], nil
}

func wantCode(t testing.TB, err error, code codes.Code, what string) *status.Status {
	t.Helper()
	st, _ := status.FromError(err)
	if err == nil || st.Code() != code {
		t.Fatalf("%s: got %v (code %v), want code %v", what, err, status.Code(err), code)
	}
	return st
}

// ---------------------------------------------------------------- chain checks

// chainView is every member's report of one partition, in chain order.
type chainView struct {
	partition uint32
	epoch     uint64
	members   []*catenapb.Member
	reports   []*catenapb.PartitionStatus
}

func (v chainView) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "p%d epoch %d:", v.partition, v.epoch)
	for _, r := range v.reports {
		fmt.Fprintf(&b, " [%s e%d %s end=%d dur=%d com=%d sum=%08x err=%q]", r.GetReplicaId(), r.GetEpoch(), r.GetRole(), r.GetLogEnd(), r.GetDurable(), r.GetCommitted(), r.GetChecksum(), r.GetError())
	}
	return b.String()
}

// clusterView reads the chain of each partition from the replicas at seeds:
// the members of the highest epoch reported, then each member's own report.
type clusterView struct {
	t       testing.TB
	clients map[string]catenapb.ReplicaClient // by addr
}

func newClusterView(t testing.TB) *clusterView {
	return &clusterView{t: t, clients: map[string]catenapb.ReplicaClient{}}
}

func (cv *clusterView) rc(addr string) catenapb.ReplicaClient {
	c := cv.clients[addr]
	if c == nil {
		c = replicaClient(cv.t, addr)
		cv.clients[addr] = c
	}
	return c
}

func (cv *clusterView) chain(seeds []string, stream string, p uint32) (chainView, error) {
	v := chainView{partition: p}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, a := range seeds {
		ps, err := partStatus(ctx, cv.rc(a), stream, p)
		if err != nil {
			continue
		}
		if ps.GetEpoch() > v.epoch {
			v.epoch, v.members = ps.GetEpoch(), ps.GetMembers()
		}
	}
	if len(v.members) == 0 {
		return v, fmt.Errorf("no replica reports a chain for %s/%d", stream, p)
	}
	for _, m := range v.members {
		ps, err := partStatus(ctx, cv.rc(m.GetAddr()), stream, p)
		if err != nil {
			return v, fmt.Errorf("status of %s/%d on %s: %w", stream, p, m.GetId(), err)
		}
		v.reports = append(v.reports, ps)
	}
	return v, nil
}

// converged: every member is at the chain's epoch, healthy, and holds
// exactly the committed log (log_end == committed, equal on all).
func (v chainView) converged() error {
	if len(v.reports) == 0 {
		return errors.New("no reports")
	}
	end := v.reports[0].GetLogEnd()
	for _, r := range v.reports {
		if r.GetError() != "" || r.GetEpoch() != v.epoch || r.GetLogEnd() != end || r.GetCommitted() != end {
			return fmt.Errorf("not converged: %v", v)
		}
	}
	return nil
}

// waitConverged waits until every partition's chain has converged and
// asserts that the members' rolling checksums agree (they hold the same
// log, offset for offset). It returns the views.
func waitConverged(t testing.TB, seeds []string, stream string, partitions int, timeout time.Duration) []chainView {
	t.Helper()
	return waitWhole(t, seeds, stream, partitions, 0, timeout)
}

// waitWhole is waitConverged for chains of exactly length members (0: any
// length): after a crash of every member, chains are rebuilt one member at
// a time, and a chain of one is converged long before it is whole again.
func waitWhole(t testing.TB, seeds []string, stream string, partitions, length int, timeout time.Duration) []chainView {
	t.Helper()
	cv := newClusterView(t)
	views := make([]chainView, partitions)
	for p := range partitions {
		eventually(t, timeout, func() error {
			v, err := cv.chain(seeds, stream, uint32(p))
			if err != nil {
				return err
			}
			if err := v.converged(); err != nil {
				return err
			}
			if length > 0 && len(v.members) != length {
				return fmt.Errorf("chain of %d members, want %d: %v", len(v.members), length, v)
			}
			views[p] = v
			return nil
		})
		v := views[p]
		for _, r := range v.reports[1:] {
			if r.GetChecksum() != v.reports[0].GetChecksum() {
				t.Errorf("partition %s/%d: members disagree at equal log end: %v", stream, p, v)
				break
			}
		}
	}
	return views
}

// snapshot is what must not change under bad input: per member, epoch,
// members, log end and checksum.
type snapshot map[string]string

func takeSnapshot(t testing.TB, cv *clusterView, seeds []string, stream string, p uint32) snapshot {
	t.Helper()
	var v chainView
	eventually(t, 20*time.Second, func() error {
		var err error
		v, err = cv.chain(seeds, stream, p)
		if err != nil {
			return err
		}
		return v.converged()
	})
	s := snapshot{}
	for _, r := range v.reports {
		ids := make([]string, 0, len(r.GetMembers()))
		for _, m := range r.GetMembers() {
			ids = append(ids, m.GetId()+"@"+m.GetAddr())
		}
		s[r.GetReplicaId()] = fmt.Sprintf("epoch=%d members=%v start=%d end=%d sum=%08x err=%q",
			r.GetEpoch(), ids, r.GetLogStart(), r.GetLogEnd(), r.GetChecksum(), r.GetError())
	}
	return s
}

func (s snapshot) mustEqual(t testing.TB, after snapshot, what string) {
	t.Helper()
	for id, b := range s {
		if a := after[id]; a != b {
			t.Errorf("%s changed stored state of %s:\n before %s\n after  %s", what, id, b, a)
		}
	}
	if len(after) != len(s) {
		t.Errorf("%s changed the membership: before %v after %v", what, s, after)
	}
}

// ---------------------------------------------------------------- reading back

type partOff struct {
	p   uint32
	off uint64
}

// readAll reads every partition of stream from offset 0 to its committed
// end through the Ingest Fetch API. It checks that offsets are dense
// (0..committed-1, each once, in order) and returns the records by
// (partition, offset) and each partition's committed end.
func readAll(t testing.TB, c *client.Client, stream string, partitions int) (map[partOff]client.Message, []uint64) {
	t.Helper()
	out := map[partOff]client.Message{}
	ends := make([]uint64, partitions)
	for p := range partitions {
		msgs, end := readPartition(t, c, stream, uint32(p))
		ends[p] = end
		for i, m := range msgs {
			if m.Offset != uint64(i) {
				t.Fatalf("partition %s/%d: record #%d has offset %d: offsets are not dense", stream, p, i, m.Offset)
			}
			out[partOff{uint32(p), m.Offset}] = m
		}
	}
	return out, ends
}

func readPartition(t testing.TB, c *client.Client, stream string, p uint32) ([]client.Message, uint64) {
	t.Helper()
	var msgs []client.Message
	var off, target uint64
	first := true
	eventually(t, 60*time.Second, func() error {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			res, err := c.Fetch(ctx, stream, p, off, 0, 0)
			cancel()
			if err != nil {
				return fmt.Errorf("fetch %s/%d at %d: %w", stream, p, off, err)
			}
			if first {
				target, first = res.Committed, false
			}
			if res.Committed < target {
				return fmt.Errorf("fetch %s/%d: committed went back from %d to %d", stream, p, target, res.Committed)
			}
			for _, m := range res.Messages {
				if m.Offset < off || m.Offset >= res.Committed {
					t.Fatalf("fetch %s/%d at %d returned offset %d (committed %d)", stream, p, off, m.Offset, res.Committed)
				}
			}
			msgs = append(msgs, res.Messages...)
			if len(res.Messages) > 0 {
				off = res.Messages[len(res.Messages)-1].Offset + 1
			}
			if off >= target {
				return nil
			}
			if len(res.Messages) == 0 {
				return fmt.Errorf("fetch %s/%d at %d: no records below committed %d", stream, p, off, target)
			}
		}
	})
	return msgs, target
}

// ---------------------------------------------------------------- producing

// sent is one record a test produced and its outcome.
type sent struct {
	producer, key, counter int
	seq                    uint64
	keyB, val              []byte
	ack                    client.Ack
	err                    error
}

func keyOf(producer, k int) []byte {
	return []byte("p" + strconv.Itoa(producer) + "-k" + strconv.Itoa(k))
}

func valueOf(producer, k, counter int) []byte {
	return []byte(fmt.Sprintf("p%d|k%d|c%d", producer, k, counter))
}

// keyedLoad is a set of producers sending keyed records (keyOf, valueOf
// with a per-key counter), each keeping up to window sends unresolved,
// until its context ends or it has sent maxPerProducer records (0: no
// limit). Every record sent is kept with its outcome.
type keyedLoad struct {
	mu   sync.Mutex
	all  []*sent
	acks atomic.Int64
	wg   sync.WaitGroup
}

// startKeyedLoad starts the producers; afterAck, when set, is called with
// the running count of acknowledgements.
func startKeyedLoad(ctx context.Context, c *client.Client, stream string, producers, keys, window, maxPerProducer int, opts client.ProducerOptions, afterAck func(acks int64)) *keyedLoad {
	l := &keyedLoad{}
	for pi := range producers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			prod := client.NewProducer(c, stream, opts)
			defer prod.Close()
			counters := make([]int, keys)
			type pending struct {
				s *sent
				f *client.Future
			}
			var queue []pending
			resolve := func(p pending) {
				p.s.ack, p.s.err = p.f.Wait()
				p.s.seq = p.f.Sequence()
				if p.s.err != nil {
					return
				}
				if n := l.acks.Add(1); afterAck != nil {
					afterAck(n)
				}
			}
			for i := 0; ctx.Err() == nil && (maxPerProducer == 0 || i < maxPerProducer); i++ {
				k := i % keys
				counters[k]++
				s := &sent{producer: pi, key: k, counter: counters[k], keyB: keyOf(pi, k), val: valueOf(pi, k, counters[k])}
				l.mu.Lock()
				l.all = append(l.all, s)
				l.mu.Unlock()
				queue = append(queue, pending{s, prod.Send(ctx, client.Record{Key: s.keyB, Value: s.val})})
				if len(queue) >= window {
					resolve(queue[0])
					queue = queue[1:]
				}
			}
			for _, p := range queue {
				resolve(p)
			}
		}()
	}
	return l
}

// wait waits for every producer to finish and returns every record sent.
func (l *keyedLoad) wait() []*sent {
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all
}

// ackedByOffset indexes the acknowledged records by where they were acked,
// reporting two acked at one offset; it also counts the others.
func ackedByOffset(report func(format string, args ...any), all []*sent) (acked map[partOff]*sent, failed int) {
	acked = map[partOff]*sent{}
	for _, s := range all {
		if s.err != nil {
			failed++
			continue
		}
		at := partOff{s.ack.Partition, s.ack.Offset}
		if prev := acked[at]; prev != nil {
			report("two records acked at partition %d offset %d: %s and %s", at.p, at.off, prev.val, s.val)
			continue
		}
		acked[at] = s
	}
	return acked, failed
}

// checkStored verifies what was read back against what was sent: every
// acknowledged record is at its acknowledged offset with its key and
// value; every stored record was sent, and is stored once (records whose
// acknowledgement was lost may be stored); with ordered, each producer's
// records of a key appear along a partition's offsets in counter order.
// Violations go to report (t.Errorf, or a collector).
func checkStored(report func(format string, args ...any), all []*sent, acked map[partOff]*sent, got map[partOff]client.Message, ends []uint64, ordered bool) {
	for at, s := range acked {
		m, ok := got[at]
		switch {
		case !ok:
			report("acked record %s at partition %d offset %d lost (partition end %d)", s.val, at.p, at.off, ends[at.p])
		case !bytes.Equal(m.Key, s.keyB) || !bytes.Equal(m.Value, s.val):
			report("partition %d offset %d holds %q=%q, acked %q=%q", at.p, at.off, m.Key, m.Value, s.keyB, s.val)
		}
	}
	sentVals := map[string]*sent{}
	for _, s := range all {
		sentVals[string(s.val)] = s
	}
	seen := map[string]partOff{}
	type pk struct{ producer, key int }
	for p := range ends {
		last := map[pk]int{}
		for off := uint64(0); off < ends[p]; off++ {
			at := partOff{uint32(p), off}
			m := got[at]
			s := sentVals[string(m.Value)]
			if s == nil {
				report("partition %d offset %d holds %q=%q, which no producer sent", p, off, m.Key, m.Value)
				continue
			}
			if prev, dup := seen[string(m.Value)]; dup {
				report("record %q stored twice: partition %d offset %d and partition %d offset %d", m.Value, prev.p, prev.off, at.p, at.off)
			}
			seen[string(m.Value)] = at
			if k := (pk{s.producer, s.key}); ordered {
				if s.counter <= last[k] {
					report("partition %d offset %d: %q after counter %d of the same producer and key: out of order", p, off, m.Value, last[k])
				}
				last[k] = s.counter
			}
		}
	}
}
