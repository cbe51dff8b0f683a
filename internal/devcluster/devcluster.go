// Package devcluster is Catena's local all-in-one (`catena dev`): replica
// child processes on loopback, each with its own data directory, an
// ingestion endpoint in this process, and its streams (by default one,
// "demo"). It plays the chain master for every local chain, as the
// operator does on Kubernetes.
package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/ingest/kafka"
	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// StateFile is written into the data directory once everything is ready.
const StateFile = "dev.json"

const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
)

// Spec describes the local cluster.
type Spec struct {
	DataDir string
	Listen  string // ingestion address; replicas take the ports after it
	// KafkaListen, when set, is the address of a Kafka listener beside
	// the ingestion endpoint (docs/kafka.md); its topics are the dev
	// cluster's streams, and CreateTopics creates streams.
	KafkaListen string
	Replicas    int
	// Streams to create and master; the first is State.Stream.
	Streams []StreamSpec
	// Partitions of each stream that does not give its own count.
	Partitions  int
	Replication int
	Durability  catenapb.Durability
	FsyncMs     uint32
	// MinChainLength is the fewest members a chain must have for its head
	// to take writes (0: a majority of Replication, as the operator's
	// default); shorter chains refuse appends.
	MinChainLength int
	// Retention of every stream (0: none), as a Stream's spec.retention:
	// records older than RetentionTime or beyond RetentionBytes per
	// partition go once no consumer hold needs them; the Hard limits apply
	// whatever the holds.
	RetentionTime, HardRetentionTime   time.Duration
	RetentionBytes, HardRetentionBytes int64
	// SegmentBytes is the size at which every partition's segment files
	// roll (0: the replica's default, from the retention's byte limits).
	SegmentBytes int64
	// FailureTimeout is how long a replica may not answer Status before the
	// master removes it from its chains (0: DefaultFailureTimeout).
	FailureTimeout time.Duration
	// Binary is the catena executable to run replicas with (default: this one).
	Binary string
	Logger logr.Logger
	// ServeMetrics, when set, is called with the address chosen for this
	// process's own metrics and profiles (ingestion).
	ServeMetrics func(addr string) error
	// Registerer receives this process's ingestion metrics (nil: none).
	Registerer prometheus.Registerer
	// ReplicaProfiles: each replica serves Go profiles (/debug/pprof/) on
	// an address of its own on ProfilesHost (the host of catena dev's
	// --pprof-listen), given in dev.json.
	ReplicaProfiles bool
	ProfilesHost    string
	// Journal runs every replica with --journal (docs/journal.md).
	Journal bool

	procs int // GOMAXPROCS of each process, see cpuShare
}

// cpuShare is each process's share of this machine's CPUs: dev packs the
// replicas and itself onto one machine, and a Go process that assumes it
// has every CPU wakes threads that then compete with the other processes.
// Measured on 2 cores with 3 replicas: one P per process gave 20% more
// throughput and a third of the p99 latency at 50k records/s. An explicit
// GOMAXPROCS in the environment wins.
func cpuShare(replicas int) int {
	return max(1, runtime.NumCPU()/(replicas+1))
}

// State is what dev.json holds.
type State struct {
	Ingest string `json:"ingest"`
	// Kafka is the Kafka listener's address (empty: none).
	Kafka   string `json:"kafka,omitempty"`
	Metrics string `json:"metrics,omitempty"`
	// Stream is the first of Streams, for readers written when dev hosted
	// one stream.
	Stream  string   `json:"stream"`
	Streams []string `json:"streams"`
	// Created are the streams clients created (catenactl stream
	// create), mastered again at the next start.
	Created  []CreatedStream `json:"created,omitempty"`
	Replicas []ReplicaState  `json:"replicas"`
}

// ReplicaState describes one replica child process.
type ReplicaState struct {
	ID      string `json:"id"`
	Addr    string `json:"addr"`
	Metrics string `json:"metrics"`
	// Pprof is where it serves Go profiles (empty: it does not).
	Pprof   string `json:"pprof,omitempty"`
	DataDir string `json:"data_dir"`
	PID     int    `json:"pid"`
}

type child struct {
	ReplicaState
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Validate checks a spec before anything starts.
func (s *Spec) Validate() error {
	switch {
	case s.DataDir == "":
		return errors.New("--data-dir is required")
	case s.Replicas < 1 || s.Replicas > 9:
		return fmt.Errorf("--replicas %d must be between 1 and 9", s.Replicas)
	case s.Partitions < 1 || s.Partitions > maxPartitions:
		return fmt.Errorf("--partitions %d must be between 1 and %d", s.Partitions, maxPartitions)
	case s.Replication < 1 || s.Replication > s.Replicas:
		return fmt.Errorf("--replication %d must be between 1 and --replicas (%d)", s.Replication, s.Replicas)
	case s.MinChainLength < 0 || s.MinChainLength > s.Replication:
		return fmt.Errorf("--min-chain-length %d must be between 1 and --replication (%d), or 0 for a majority", s.MinChainLength, s.Replication)
	case s.RetentionTime < 0 || s.HardRetentionTime < 0 || s.RetentionBytes < 0 || s.HardRetentionBytes < 0:
		return errors.New("--retention, --retention-bytes, --hard-retention and --hard-retention-bytes must not be negative (0: no limit)")
	case s.SegmentBytes != 0 && (s.SegmentBytes < minSegmentBytes || s.SegmentBytes > maxSegmentBytes):
		return fmt.Errorf("--segment-bytes %d must be between %d (1 MiB) and %d (1 GiB), or 0 for the default", s.SegmentBytes, minSegmentBytes, maxSegmentBytes)
	case s.FailureTimeout != 0 && (s.FailureTimeout < minFailureTimeout || s.FailureTimeout > maxFailureTimeout):
		return fmt.Errorf("--failure-timeout %s must be between %s and %s", s.FailureTimeout, minFailureTimeout, maxFailureTimeout)
	}
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", s.Listen, err)
	}
	return validateStreams(s.Streams)
}

// Run starts everything, writes dev.json and serves until ctx ends.
func Run(ctx context.Context, spec Spec, ready func(State)) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	spec.Streams = resolveStreams(spec.Streams, spec.Partitions)
	if spec.FailureTimeout == 0 {
		spec.FailureTimeout = DefaultFailureTimeout
	}
	log := spec.Logger
	if spec.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("failed to find the catena executable: %w", err)
		}
		spec.Binary = exe
	}
	if err := os.MkdirAll(spec.DataDir, 0o755); err != nil {
		return fmt.Errorf("failed to create %s: %w", spec.DataDir, err)
	}
	spec.procs = cpuShare(spec.Replicas)
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(spec.procs)
	}
	// dev.json appears only once everything is ready; the previous one
	// tells which addresses the chains were configured with.
	prev, _ := readState(spec.DataDir)
	_ = os.Remove(filepath.Join(spec.DataDir, StateFile))
	spec.Streams = withCreated(spec.Streams, prev)

	ingestLis, err := net.Listen("tcp", spec.Listen)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", spec.Listen, err)
	}
	defer ingestLis.Close()
	host, _, _ := net.SplitHostPort(ingestLis.Addr().String())
	basePort := ingestLis.Addr().(*net.TCPAddr).Port

	children := make([]*child, spec.Replicas)
	defer func() { stopChildren(children, log) }()
	for i := range spec.Replicas {
		id := "r" + strconv.Itoa(i)
		var want ReplicaState
		if prev != nil && i < len(prev.Replicas) {
			want = prev.Replicas[i]
		}
		addr := pickAddr(host, want.Addr, basePort+1+i)
		metrics := pickAddr(host, want.Metrics, basePort+11+i)
		var profiles string
		if spec.ReplicaProfiles {
			prev := want.Pprof
			if h, _, err := net.SplitHostPort(prev); err != nil || h != spec.ProfilesHost {
				prev = "" // asked for on another host now
			}
			profiles = pickAddr(spec.ProfilesHost, prev, basePort+21+i)
		}
		c, err := startReplica(spec, id, addr, metrics, profiles)
		if err != nil {
			return err
		}
		children[i] = c
		log.Info("Started replica", "id", id, "addr", addr, "pid", c.PID, "dataDir", c.DataDir)
	}

	pool := transport.NewPool(nil)
	defer pool.Close()
	if err := waitReady(ctx, pool, children); err != nil {
		return err
	}
	// Placements count every chain placed before them, of any stream, as
	// the operator's count every chain of the pool.
	load := chainplan.Load{}
	for _, s := range spec.Streams {
		if err := ensureStream(ctx, pool, spec, s, children, load, log); err != nil {
			return err
		}
	}

	admin := &streamAdmin{ops: make(chan adminOp)}
	ing, err := ingest.New(ingest.Options{Replicas: addrs(children), Logger: log.WithValues("role", "ingest"), Registerer: spec.Registerer, Streams: admin})
	if err != nil {
		return err
	}
	defer ing.Close()
	g := grpc.NewServer(transport.ServerOptions(nil)...)
	ing.Register(g)
	// The consumer groups of the Kafka listener, also served over gRPC
	// (catenactl group); their offsets go to groups.DefaultOffsetsStream,
	// which the first commit creates.
	coord := groups.New(groups.Options{Offsets: &groups.StreamOffsets{Ingest: ing, Logger: log.WithValues("role", "groups")}, Logger: log.WithValues("role", "groups")})
	go coord.Run(ctx, groups.TickInterval)
	(&groups.Service{Coordinator: coord, Ingest: ing}).Register(g)
	serveErr := make(chan error, 1)
	go func() { serveErr <- g.Serve(ingestLis) }()
	defer g.Stop()

	st := State{Ingest: ingestLis.Addr().String(), Stream: spec.Streams[0].Name, Streams: streamNames(spec.Streams)}
	if spec.KafkaListen != "" {
		klis, err := net.Listen("tcp", spec.KafkaListen)
		if err != nil {
			return fmt.Errorf("failed to listen for Kafka clients on %s: %w", spec.KafkaListen, err)
		}
		ks, err := kafka.New(kafka.Options{Ingest: ing, Groups: coord, Registerer: spec.Registerer, Logger: log.WithValues("role", "kafka")})
		if err != nil {
			klis.Close()
			return err
		}
		go func() {
			if err := ks.Serve(klis); err != nil {
				serveErr <- fmt.Errorf("kafka listener: %w", err)
			}
		}()
		defer ks.Close()
		st.Kafka = klis.Addr().String()
	}
	if prev != nil {
		st.Created = prev.Created
	}
	if spec.ServeMetrics != nil {
		var prevMetrics string
		if prev != nil {
			prevMetrics = prev.Metrics
		}
		st.Metrics = pickAddr(host, prevMetrics, basePort+10)
		if err := spec.ServeMetrics(st.Metrics); err != nil {
			return err
		}
	}
	for _, c := range children {
		st.Replicas = append(st.Replicas, c.ReplicaState)
	}
	if err := writeState(spec.DataDir, st); err != nil {
		return err
	}
	if ready != nil {
		ready(st)
	}

	addrs := map[string]string{}
	for _, c := range children {
		addrs[c.ID] = c.Addr
	}
	var streams []*masterStream
	for _, s := range spec.Streams {
		streams = append(streams, newMasterStream(s.Name, s.Partitions, spec.streamConfig(s.Name, s.Partitions)))
	}
	m := newMaster(pool, log.WithValues("component", "master"), addrs, spec.Replication, spec.FailureTimeout, streams...)
	defer m.stop()
	run := &runState{spec: spec, pool: pool, children: children, load: load, log: log, state: &st, master: m}
	for _, c := range children {
		m.obs.Started(c.ID)
	}
	exited := make(chan *child, len(children))
	watch := func(c *child) { go func() { <-c.done; exited <- c }() }
	for _, c := range children {
		watch(c)
	}
	// The observer probes every replica (its Status of every stream at
	// once) on its own cadence and deadline; every tick re-plans every
	// chain of every stream from its latest snapshot.
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	// A restarted replica is waited for off the loop, so probing (and
	// failure detection of the others) goes on meanwhile.
	type readyResult struct {
		c   *child
		err error
	}
	readyCh := make(chan readyResult)
	restartAt := map[string]time.Time{}
	restart := make(chan *child)
	scheduleRestart := func(c *child, delay time.Duration) {
		time.AfterFunc(delay, func() {
			select {
			case restart <- c:
			case <-ctx.Done():
			}
		})
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-serveErr:
			return fmt.Errorf("ingestion server stopped: %w", err)
		case c := <-exited:
			log.Error(c.err, "Replica process exited", "id", c.ID, "pid", c.PID)
			// First chains without it, so every chain keeps serving; then
			// the same replica again on its volume, re-added by repair.
			m.failed[c.ID] = true
			m.obs.Exited(c.ID)
			m.repair(ctx)
			// Restart it, later if it keeps dying at start; the loop goes
			// on meanwhile (another replica may die too).
			delay := time.Duration(0)
			if last, ok := restartAt[c.ID]; ok && time.Since(last) < restartBackoff {
				delay = restartBackoff - time.Since(last)
			}
			scheduleRestart(c, delay)
		case c := <-restart:
			i := slices.IndexFunc(children, func(x *child) bool { return x == c })
			if i < 0 {
				continue
			}
			restartAt[c.ID] = time.Now()
			nc, err := startReplica(spec, c.ID, c.Addr, c.Metrics, c.Pprof)
			if err != nil {
				log.Error(err, "Failed to restart replica; trying again", "id", c.ID, "backoff", restartBackoff)
				scheduleRestart(c, restartBackoff)
				continue
			}
			children[i] = nc
			watch(nc)
			log.Info("Restarted replica", "id", nc.ID, "addr", nc.Addr, "pid", nc.PID)
			st.Replicas = st.Replicas[:0]
			for _, c := range children {
				st.Replicas = append(st.Replicas, c.ReplicaState)
			}
			if err := writeState(spec.DataDir, st); err != nil {
				log.Error(err, "Failed to update the state file")
			}
			go func() {
				err := waitReady(ctx, pool, []*child{nc})
				select {
				case readyCh <- readyResult{nc, err}:
				case <-ctx.Done():
				}
			}()
		case r := <-readyCh:
			nc := r.c
			if !slices.Contains(children, nc) {
				continue // replaced since
			}
			select {
			case <-nc.done:
				continue // exited again; the exit restarts it
			default:
			}
			if r.err != nil {
				// Still running but not answering: the failure detector
				// decides from here, as for any silent replica.
				log.Error(r.err, "Restarted replica did not become ready", "id", nc.ID)
			}
			delete(m.failed, nc.ID)
			m.obs.Started(nc.ID)
			m.repair(ctx)
		case op := <-admin.ops:
			run.handle(ctx, op)
		case <-tick.C:
			m.repair(ctx)
		}
	}
}

const (
	// restartBackoff spaces restarts of a replica that keeps exiting.
	restartBackoff = time.Second
)

// pickAddr prefers the address used last time (so chains keep their
// members' addresses across restarts), then the conventional port, then a
// free port outside the kernel's ephemeral range. A replica restarts on
// its address, so the address must not be one an outgoing connection can
// take meanwhile as its local port: then the restart fails to bind, again
// and again (seen in the fault campaign, whose dev listens on port 0 and
// so had every replica port among the ephemeral ones).
func pickAddr(host, previous string, port int) string {
	lo, hi := ephemeralPorts()
	ephemeral := func(addr string) bool {
		_, ps, err := net.SplitHostPort(addr)
		p, perr := strconv.Atoi(ps)
		return err != nil || perr != nil || (p >= lo && p <= hi)
	}
	// take claims a free address not handed out before by this process
	// (the replica's own previous one aside): the processes bind them
	// later, so two draws must not coincide.
	take := func(cand string) bool {
		pickedMu.Lock()
		defer pickedMu.Unlock()
		if picked[cand] && cand != previous {
			return false
		}
		l, err := net.Listen("tcp", cand)
		if err != nil {
			return false
		}
		l.Close()
		picked[cand] = true
		return true
	}
	// A previous address among the ephemeral ones (an older dev chose it)
	// is given up: chains are re-installed on the new one.
	if previous != "" && !ephemeral(previous) && take(previous) {
		return previous
	}
	if cand := net.JoinHostPort(host, strconv.Itoa(port)); !ephemeral(cand) && take(cand) {
		return cand
	}
	// Below the ephemeral range and above the ports services usually take.
	if lo > stablePortsFrom+1 {
		for range 200 {
			if cand := net.JoinHostPort(host, strconv.Itoa(stablePortsFrom+rand.IntN(lo-stablePortsFrom))); take(cand) {
				return cand
			}
		}
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return net.JoinHostPort(host, strconv.Itoa(port))
	}
	defer l.Close()
	return l.Addr().String()
}

// stablePortsFrom is the lowest port pickAddr draws from.
const stablePortsFrom = 20000

// picked are the addresses pickAddr handed out in this process.
var (
	pickedMu sync.Mutex
	picked   = map[string]bool{}
)

// ephemeralPorts is the kernel's range of local ports for outgoing
// connections (Linux's default when it cannot be read).
func ephemeralPorts() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l > h {
		return lo, hi
	}
	return l, h
}

// startReplica starts replica id; profiles, when set, is where it serves
// Go profiles.
func startReplica(spec Spec, id, addr, metrics, profiles string) (*child, error) {
	dir := filepath.Join(spec.DataDir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", dir, err)
	}
	logf, err := os.OpenFile(filepath.Join(spec.DataDir, id+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("failed to open replica log: %w", err)
	}
	args := []string{"replica", "--id", id, "--listen", addr, "--data-dir", dir, "--metrics-listen", metrics}
	if profiles != "" {
		args = append(args, "--pprof-listen", profiles)
	}
	if spec.Journal {
		args = append(args, "--journal")
	}
	cmd := exec.Command(spec.Binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if os.Getenv("GOMAXPROCS") == "" {
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(spec.procs))
	}
	// A replica must not outlive the dev process that is its chain master.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("failed to start replica %s: %w", id, err)
	}
	c := &child{ReplicaState: ReplicaState{ID: id, Addr: addr, Metrics: metrics, Pprof: profiles, DataDir: dir, PID: cmd.Process.Pid}, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	return c, nil
}

func stopChildren(children []*child, log logr.Logger) {
	for _, c := range children {
		if c != nil {
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.After(stopTimeout)
	for _, c := range children {
		if c == nil {
			continue
		}
		select {
		case <-c.done:
		case <-deadline:
			log.Info("Replica did not stop in time; killing it", "id", c.ID, "pid", c.PID)
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
}

func addrs(children []*child) []string {
	out := make([]string, len(children))
	for i, c := range children {
		out[i] = c.Addr
	}
	return out
}

// waitReady polls each replica's Status until it answers.
func waitReady(ctx context.Context, pool *transport.Pool, children []*child) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for _, c := range children {
		// Wait for the port before the first gRPC dial, so that gRPC's
		// reconnect back-off (a second or more) never delays start-up.
		for {
			conn, err := net.DialTimeout("tcp", c.Addr, time.Second)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-c.done:
				return fmt.Errorf("replica %s exited during start-up (see %s.log): %v", c.ID, filepath.Join(filepath.Dir(c.DataDir), c.ID), c.err)
			case <-ctx.Done():
				return fmt.Errorf("replica %s at %s did not start listening: %w", c.ID, c.Addr, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		conn, err := pool.Get(c.Addr)
		if err != nil {
			return err
		}
		for {
			_, err := catenapb.NewReplicaClient(conn).Status(ctx, &catenapb.StatusRequest{}, grpc.WaitForReady(true))
			if err == nil {
				break
			}
			select {
			case <-c.done:
				return fmt.Errorf("replica %s exited during start-up (see %s.log): %v", c.ID, filepath.Join(filepath.Dir(c.DataDir), c.ID), c.err)
			case <-ctx.Done():
				return fmt.Errorf("replica %s at %s did not become ready: %w", c.ID, c.Addr, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// streamConfig is the config every chain of stream name, of partitions,
// runs: chainmaster.StreamConfig, as the operator's from a Stream. The
// consumer groups' offsets stream keeps everything: a group that has not
// committed for longer than the retention must not lose its offsets.
func (s Spec) streamConfig(name string, partitions int) *catenapb.StreamConfig {
	settings := chainmaster.StreamSettings{
		Partitions: partitions, Replication: s.Replication, MinChainLength: s.MinChainLength,
		Interval: s.Durability == catenapb.Durability_DURABILITY_INTERVAL, FsyncInterval: time.Duration(s.FsyncMs) * time.Millisecond,
		RetentionTime: s.RetentionTime, RetentionBytes: s.RetentionBytes,
		HardRetentionTime: s.HardRetentionTime, HardRetentionBytes: s.HardRetentionBytes,
		SegmentBytes: s.SegmentBytes,
	}
	if name == groups.DefaultOffsetsStream {
		settings.RetentionTime, settings.RetentionBytes, settings.HardRetentionTime, settings.HardRetentionBytes = 0, 0, 0, 0
	}
	return chainmaster.StreamConfig(settings)
}

// ensureStream creates the stream, placing each new chain with
// chainplan.Place over load (the chains already placed, which it counts
// its own in), or re-installs its chains: under a new epoch when members'
// addresses changed since they were last configured, under the same one
// when only the config did.
func ensureStream(ctx context.Context, pool *transport.Pool, spec Spec, stream StreamSpec, children []*child, load chainplan.Load, log logr.Logger) error {
	byID := map[string]*child{}
	ids := make([]string, len(children))
	for i, c := range children {
		byID[c.ID] = c
		ids[i] = c.ID
	}
	// What each replica has installed, per partition.
	installed := map[uint32][]*catenapb.PartitionStatus{}
	for _, c := range children {
		conn, err := pool.Get(c.Addr)
		if err != nil {
			return err
		}
		resp, err := catenapb.NewReplicaClient(conn).Status(ctx, &catenapb.StatusRequest{Stream: stream.Name})
		if err != nil {
			return fmt.Errorf("failed to read status of replica %s: %w", c.ID, err)
		}
		for _, ps := range resp.GetPartitions() {
			installed[ps.GetPartition()] = append(installed[ps.GetPartition()], ps)
		}
	}
	cfg := spec.streamConfig(stream.Name, stream.Partitions)
	for p := range stream.Partitions {
		var latest *catenapb.PartitionStatus
		for _, ps := range installed[uint32(p)] {
			if latest == nil || ps.GetEpoch() > latest.GetEpoch() {
				latest = ps
			}
		}
		var memberIDs []string
		epoch := uint64(1)
		if latest != nil && latest.GetEpoch() > 0 {
			for _, m := range latest.GetMembers() {
				memberIDs = append(memberIDs, m.GetId())
			}
			load.Add(memberIDs)
			epoch = latest.GetEpoch()
			// The config is this master's: re-sent under the same epoch
			// when it changed (members accept a new config with an
			// installed membership).
			if !upToDate(latest, installed[uint32(p)], byID) {
				epoch++
			} else if proto.Equal(latest.GetConfig(), cfg) {
				continue
			}
		} else {
			memberIDs = chainplan.Place(ids, load, spec.Replication)
			load.Add(memberIDs)
		}
		members := make([]*catenapb.Member, 0, len(memberIDs))
		for _, id := range memberIDs {
			c := byID[id]
			if c == nil {
				return fmt.Errorf("partition %s/%d names member %q that this dev cluster does not run; use a fresh --data-dir", stream.Name, p, id)
			}
			members = append(members, &catenapb.Member{Id: id, Addr: c.Addr})
		}
		req := &catenapb.ConfigureRequest{Stream: stream.Name, Partition: uint32(p), Epoch: epoch, Members: members, Config: cfg}
		// Tail first: by the time a predecessor links, its successor
		// already knows the epoch.
		for i := len(members) - 1; i >= 0; i-- {
			conn, err := pool.Get(members[i].GetAddr())
			if err != nil {
				return err
			}
			if _, err := catenapb.NewReplicaClient(conn).Configure(ctx, req); err != nil && status.Code(err) != codes.FailedPrecondition {
				return fmt.Errorf("failed to configure partition %s/%d on %s: %w", stream.Name, p, members[i].GetId(), err)
			}
		}
		log.Info("Configured chain", "stream", stream.Name, "partition", p, "epoch", epoch, "members", memberIDs)
	}
	return nil
}

// upToDate reports whether every member has installed the latest epoch with
// the addresses the members have now.
func upToDate(latest *catenapb.PartitionStatus, reports []*catenapb.PartitionStatus, byID map[string]*child) bool {
	for _, m := range latest.GetMembers() {
		c := byID[m.GetId()]
		if c == nil || c.Addr != m.GetAddr() {
			return false
		}
		found := false
		for _, r := range reports {
			if r.GetReplicaId() == m.GetId() && r.GetEpoch() == latest.GetEpoch() {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func writeState(dir string, st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, StateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("failed to write %s: %w", tmp, err)
	}
	return os.Rename(tmp, filepath.Join(dir, StateFile))
}

func readState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, err
	}
	st := &State{}
	return st, json.Unmarshal(b, st)
}
