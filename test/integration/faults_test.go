package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/internal/devcluster"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// Fault kinds the campaign injects. The replicas run the powerloss build
// (replica/partlog/lazyfs), so every SIGKILL is a power cut of that
// member: what it had not fsynced is gone. Every kind that ends a process
// is followed by catena dev restarting it on its data directory (empty for
// replace-empty); a paused process is resumed and rejoins; a cut link
// heals.
const (
	faultKillHead     = "kill-head"       // power cut of the head of a partition's chain
	faultKillMiddle   = "kill-middle"     // of its middle
	faultKillTail     = "kill-tail"       // of its tail
	faultPowerLossTwo = "power-loss-two"  // of two members of a chain at once
	faultPowerLossAll = "power-loss-all"  // of every member of a chain at once (coordinated)
	faultRestart      = "restart"         // SIGTERM a member: it stops cleanly and restarts on its volume
	faultPause        = "pause"           // SIGSTOP a member past the failure timeout, then SIGCONT
	faultReplaceEmpty = "replace-empty"   // a member's volume is lost: it returns empty
	faultCutLink      = "cut-link"        // a member cannot send to its successor past the failure timeout (one direction), then the link heals
	faultIsolate      = "isolate"         // every link to and from a member is cut (master and ingestion too) past the failure timeout, then heals
	faultSlowLink     = "slow-link"       // what a member sends its successor arrives 100 ms or 1 s late, past the failure timeout, then heals
	faultIsolateMastr = "isolate-master"  // the dev process (chain master and ingestion) cannot reach any replica, past the failure timeout, then heals
	faultCrashPause   = "crash-and-pause" // power cut of one member while another of its chain is paused
	faultCorrupt      = "corrupt"         // a member is stopped, one of its segment files of the partition is damaged (bit flip, zeroed page or truncation, sealed or active segment), and it restarts
)

// faultKinds are the kinds a campaign draws from.
var faultKinds = []string{faultKillHead, faultKillMiddle, faultKillTail, faultPowerLossTwo, faultPowerLossAll,
	faultRestart, faultPause, faultReplaceEmpty, faultCutLink, faultIsolate, faultSlowLink, faultIsolateMastr,
	faultCrashPause, faultCorrupt}

const (
	campaignPartitions  = 4
	campaignReplication = 3
	campaignFailTimeout = time.Second
	// campaignShort is the fault phase of the default run; it always
	// injects at least one fault of every kind.
	campaignShort = 20 * time.Second
	// campaignSegmentBytes is the replicas' segment size: the smallest,
	// so that partitions seal segments every few seconds and the faults
	// meet what a replica does with sealed segments (their summaries,
	// written without an fsync, adopted at the next start and verified
	// in the background; damage in them), not only an active segment.
	campaignSegmentBytes = 1 << 20
)

// TestFaultCampaign runs producers with retries against a real catena dev
// while a seeded fault loop kills (-9) the head, middle or tail of a random
// partition's chain, pauses a member past the failure timeout, restarts
// one on its volume and replaces one with an empty volume, one fault at a
// time (each after every chain has regrown: never two members of a chain
// out at once on purpose). Then a checker verifies DESIGN.md's
// invariants: no acknowledged record lost, none stored twice, each
// producer's records of a key in send order, every chain's members
// identical (log end == committed, equal rolling checksums), and the
// committed offset seen by polling every chain's head never going back.
//
// CATENA_FAULT_DURATION (e.g. 5m) sets the fault phase of a longer
// campaign; CATENA_FAULT_SEED replays a seed's choices (kinds, partitions,
// roles, timings; what the cluster does in between is not deterministic);
// CATENA_FAULT_JOURNAL=1 runs the replicas with --journal.
func TestFaultCampaign(t *testing.T) {
	duration := campaignShort
	if v := os.Getenv("CATENA_FAULT_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("CATENA_FAULT_DURATION %q: want a positive duration like 5m", v)
		}
		duration = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CATENA_FAULT_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CATENA_FAULT_SEED %q: want an unsigned integer", v)
		}
		seed = s
	}
	kinds := faultKinds
	if v := os.Getenv("CATENA_FAULT_KINDS"); v != "" {
		kinds = nil
		for _, k := range strings.Split(v, ",") {
			if !slices.Contains(faultKinds, k) {
				t.Fatalf("CATENA_FAULT_KINDS: unknown kind %q; known: %s", k, strings.Join(faultKinds, ","))
			}
			kinds = append(kinds, k)
		}
	}
	devArgs := []string{"--failure-timeout", campaignFailTimeout.String(),
		"--partitions", strconv.Itoa(campaignPartitions), "--replication", strconv.Itoa(campaignReplication),
		"--segment-bytes", strconv.Itoa(campaignSegmentBytes)}
	if os.Getenv("CATENA_FAULT_JOURNAL") == "1" {
		devArgs = append(devArgs, "--journal")
	}
	t.Logf("fault campaign: seed %d (replay with CATENA_FAULT_SEED=%d), fault phase %s, kinds %s, replicas %v", seed, seed, duration, strings.Join(kinds, ","), devArgs)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))

	cutter := newLinkCutter(t)
	dataDir := t.TempDir()
	d := startDevOf(t, catenaPowerLossBin, dataDir, devArgs...)
	stream := d.state.Stream
	c := &campaign{t: t, d: d, dataDir: dataDir, stream: stream, seeds: d.seeds(), cutter: cutter}

	// ---- producers
	sendCtx, stopSending := context.WithCancel(context.Background())
	defer stopSending()
	var wg sync.WaitGroup
	const producers = 2
	for pi := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.produce(sendCtx, pi)
		}()
	}
	// ---- committed-offset watcher
	watchCtx, stopWatching := context.WithCancel(context.Background())
	defer stopWatching()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		c.watchCommitted(watchCtx)
	}()

	c.waitAcks(1000, 60*time.Second, "before the first fault")

	// ---- faults, one at a time
	order := slices.Clone(kinds)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	end := time.Now().Add(duration)
	for i := 0; time.Now().Before(end) || i < len(kinds); i++ {
		kind := kinds[rng.IntN(len(kinds))]
		if i < len(order) {
			kind = order[i] // every kind at least once
		}
		p := uint32(rng.IntN(campaignPartitions))
		// Short gaps and holds: the checker's windows need writes between
		// faults, and a hold must outlast the failure timeout; beyond that
		// a longer one adds time, not coverage (1,000 faults in 30
		// minutes).
		spacing := time.Duration(50+rng.IntN(200)) * time.Millisecond
		pauseFor := campaignFailTimeout + time.Duration(200+rng.IntN(400))*time.Millisecond
		t0 := time.Now()
		view := c.waitFull(120*time.Second, fmt.Sprintf("before fault #%d", i+1))
		t0 = c.phase("regrow", t0)
		// Writes flow again in every partition (the previous fault's stall,
		// including a rejoining member's catch-up, is over), so that each
		// fault's unavailability is its own.
		c.waitFlowing(time.Now(), 60*time.Second, fmt.Sprintf("before fault #%d", i+1))
		t0 = c.phase("flowing", t0)
		// Space faults so that writes flow between them (a timer, not a
		// condition: the cluster is already known healthy).
		<-time.After(spacing)
		t0 = c.phase("spacing", t0)
		c.inject(i+1, kind, p, rng.IntN(campaignReplication), view[p], pauseFor)
	}
	c.waitSettled(120*time.Second, "after the last fault")
	stopSending()
	wg.Wait()
	stopWatching()
	<-watchDone

	// ---- checker
	verdict := c.check()
	c.summary(verdict)
}

// campaign is the state shared by producers, the fault loop and the checker.
type campaign struct {
	t       *testing.T
	d       *devCluster
	dataDir string
	stream  string
	cutter  *linkCutter

	acks atomic.Int64
	// lastAck is, per partition, the latest completion time (UnixNano) of
	// an acknowledgement.
	lastAck [campaignPartitions]atomic.Int64

	mu     sync.Mutex
	sent   [][]*timedSent // per producer, in send order
	faults []injected
	// seeds are the replicas' addresses (stable across restarts).
	seeds      []string
	ackedCount int
	// committed watcher findings
	watchViolations []string
	watchPolls      int
	// phases is where the fault loop's time went, by phase.
	phases map[string]time.Duration
}

// phase adds the time since from to the named phase and returns now.
func (c *campaign) phase(name string, from time.Time) time.Time {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phases == nil {
		c.phases = map[string]time.Duration{}
	}
	c.phases[name] += now.Sub(from)
	return now
}

type timedSent struct {
	sent
	at time.Time // when the producer learned the outcome
}

type injected struct {
	n         int
	kind      string
	partition uint32
	replica   string
	at        time.Time // the fault (the kill, the SIGSTOP)
	resumed   time.Time // SIGCONT (pause only)
}

// produce writes keyed records at a steady pace (about 1000 a second per
// producer, so the race detector and a shared machine keep up) with
// retries long enough to ride out any repair.
func (c *campaign) produce(ctx context.Context, pi int) {
	const (
		keys   = 20
		window = 400
		burst  = 25
		pace   = 25 * time.Millisecond
	)
	prod := client.NewProducer(c.d.client, c.stream, client.ProducerOptions{
		RetryTimeout: 120 * time.Second, RequestTimeout: 3 * time.Second,
		// Retries every 100 ms at most, so that the unavailability
		// measured is the cluster's, not the producer's back-off.
		MaxRetryBackoff: 100 * time.Millisecond,
	})
	defer prod.Close()
	c.mu.Lock()
	for len(c.sent) <= pi {
		c.sent = append(c.sent, nil)
	}
	c.mu.Unlock()
	type pending struct {
		s *timedSent
		f *client.Future
	}
	var queue []pending
	resolve := func(p pending) {
		p.s.ack, p.s.err = p.f.Wait()
		p.s.seq = p.f.Sequence()
		p.s.at = p.f.CompletedAt()
		if p.s.err == nil {
			c.acks.Add(1)
			if pa := p.s.ack.Partition; int(pa) < campaignPartitions {
				at := p.s.at.UnixNano()
				for {
					cur := c.lastAck[pa].Load()
					if at <= cur || c.lastAck[pa].CompareAndSwap(cur, at) {
						break
					}
				}
			}
		}
	}
	counters := make([]int, keys)
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for i := 0; ; i++ {
		if i%burst == 0 {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		k := i % keys
		counters[k]++
		s := &timedSent{sent: sent{producer: pi, key: k, counter: counters[k], keyB: keyOf(pi, k), val: valueOf(pi, k, counters[k])}}
		c.mu.Lock()
		c.sent[pi] = append(c.sent[pi], s)
		c.mu.Unlock()
		queue = append(queue, pending{s, prod.Send(context.Background(), client.Record{Key: s.keyB, Value: s.val})})
		// Resolve what is done at once: the fault loop waits on the acks
		// (waitFlowing, waitAcks), and resolving only when the window
		// is full counted each ack up to 0.4 s late.
		for len(queue) > 0 && (len(queue) >= window || isDone(queue[0].f)) {
			resolve(queue[0])
			queue = queue[1:]
		}
	}
	for _, p := range queue {
		resolve(p)
	}
}

// isDone reports whether f has its outcome, without waiting.
func isDone(f *client.Future) bool {
	select {
	case <-f.Done():
		return true
	default:
		return false
	}
}

func (c *campaign) waitAcks(n int64, timeout time.Duration, what string) {
	c.t.Helper()
	if err := poll(timeout, func() error {
		if got := c.acks.Load(); got < n {
			return fmt.Errorf("%d acks, want %d", got, n)
		}
		return nil
	}); err != nil {
		c.t.Fatalf("writes did not go on %s: %v", what, err)
	}
}

// waitFlowing waits until every partition has an acknowledgement that
// completed after since.
func (c *campaign) waitFlowing(since time.Time, timeout time.Duration, what string) {
	c.t.Helper()
	if err := poll(timeout, func() error {
		for p := range campaignPartitions {
			if last := c.lastAck[p].Load(); last <= since.UnixNano() {
				return fmt.Errorf("no ack in partition %d since %s", p, since.Format("15:04:05.000"))
			}
		}
		return nil
	}); err != nil {
		c.t.Fatalf("writes did not flow in every partition %s: %v", what, err)
	}
}

// state re-reads dev.json (the master rewrites it when it restarts a
// replica) and keeps it in d.state, so cleanup stops the current processes.
func (c *campaign) state() devcluster.State {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dataDir, devcluster.StateFile))
	if err != nil {
		c.t.Fatalf("read dev.json: %v", err)
	}
	var st devcluster.State
	if err := json.Unmarshal(b, &st); err != nil {
		c.t.Fatalf("decode dev.json: %v", err)
	}
	c.d.state = st
	return st
}

func (c *campaign) replica(id string) devcluster.ReplicaState {
	c.t.Helper()
	for _, r := range c.state().Replicas {
		if r.ID == id {
			return r
		}
	}
	c.t.Fatalf("no replica %q in dev.json", id)
	return devcluster.ReplicaState{}
}

// waitFull waits until every partition's chain is back to full length with
// every member at the chain's epoch, healthy and holding the committed log
// (a joiner has caught up), and returns the views.
func (c *campaign) waitFull(timeout time.Duration, what string) []chainView {
	c.t.Helper()
	cv := newClusterView(c.t)
	views := make([]chainView, campaignPartitions)
	err := poll(timeout, func() error {
		for p := range campaignPartitions {
			v, err := cv.chain(c.seeds, c.stream, uint32(p))
			if err != nil {
				return err
			}
			if len(v.members) != campaignReplication {
				return fmt.Errorf("partition %d has %d members: %v", p, len(v.members), v)
			}
			for _, r := range v.reports {
				if r.GetEpoch() != v.epoch || r.GetError() != "" || r.GetDurable() < v.reports[0].GetCommitted() {
					return fmt.Errorf("partition %d: member %s not settled: %v", p, r.GetReplicaId(), v)
				}
			}
			views[p] = v
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("chains did not regrow to %d members %s within %s: %v", campaignReplication, what, timeout, err)
	}
	return views
}

// waitSettled waits until every chain is full and stays so, at the same
// epochs, for longer than the master needs to act on what it last saw (the
// failure timeout and a few probe rounds): a chain that looks whole the
// moment a fault heals may still be reordered for it, and the checker must
// see the cluster at rest.
func (c *campaign) waitSettled(timeout time.Duration, what string) []chainView {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	epochs := func(vs []chainView) []uint64 {
		out := make([]uint64, len(vs))
		for i, v := range vs {
			out[i] = v.epoch
		}
		return out
	}
	prev := c.waitFull(time.Until(deadline), what)
	for {
		<-time.After(campaignFailTimeout + time.Second) // the master's chance to act
		cur := c.waitFull(time.Until(deadline), what)
		if slices.Equal(epochs(prev), epochs(cur)) {
			return cur
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("chains kept changing epochs %s: %v then %v", what, epochs(prev), epochs(cur))
		}
		prev = cur
	}
}

// inject carries out one fault on the member of partition p's chain that
// the kind names (a random member for the kinds that do not name a role)
// and waits until writes go on and the process is back.
func (c *campaign) inject(n int, kind string, p uint32, pick int, v chainView, pauseFor time.Duration) {
	c.t.Helper()
	ids := make([]string, len(v.members))
	for i, m := range v.members {
		ids[i] = m.GetId()
	}
	var victim string
	switch kind {
	case faultKillHead:
		victim = ids[0]
	case faultKillMiddle:
		victim = ids[len(ids)/2]
	case faultKillTail:
		victim = ids[len(ids)-1]
	case faultCutLink, faultSlowLink:
		victim = ids[pick%(len(ids)-1)] // the sending end: it has a successor
	default:
		victim = ids[pick%len(ids)]
	}
	victims := []string{victim}
	switch kind {
	case faultPowerLossTwo:
		victims = append(victims, ids[(slices.Index(ids, victim)+1)%len(ids)])
	case faultPowerLossAll:
		victims = slices.Clone(ids)
	case faultIsolateMastr:
		victims = nil
	}
	r := c.replica(victim)
	before := map[string]int{}
	for _, id := range victims {
		before[id] = c.replica(id).PID
	}
	f := injected{n: n, kind: kind, partition: p, replica: strings.Join(victims, "+")}
	if kind == faultIsolateMastr {
		f.replica = "master"
	}
	acksBefore := c.acks.Load()
	start := time.Now()
	defer func() { c.phase("after the fault", start) }()
	// hold keeps a pause or a cut on: writes must go on without the
	// victim once it is out of its chains, and the fault lasts past the
	// failure timeout (a timer: its length is the fault itself).
	hold := func(what string) {
		c.t.Helper()
		c.waitAcks(acksBefore+200, 30*time.Second, fmt.Sprintf("%s (fault #%d)", what, n))
		if rest := time.Until(f.at.Add(pauseFor)); rest > 0 {
			<-time.After(rest)
		}
	}
	signal := func(sig syscall.Signal) {
		c.t.Helper()
		if err := syscall.Kill(r.PID, sig); err != nil {
			c.t.Fatalf("fault #%d %s: signal %v to %s (pid %d): %v", n, kind, sig, victim, r.PID, err)
		}
	}
	switch kind {
	case faultKillHead, faultKillMiddle, faultKillTail:
		f.at = time.Now()
		signal(syscall.SIGKILL)
	case faultPowerLossTwo, faultPowerLossAll:
		f.at = time.Now()
		for _, id := range victims {
			if err := syscall.Kill(before[id], syscall.SIGKILL); err != nil {
				c.t.Fatalf("fault #%d %s: SIGKILL %s (pid %d): %v", n, kind, id, before[id], err)
			}
		}
	case faultCutLink:
		succ := ids[slices.Index(ids, victim)+1]
		f.replica = victim + "->" + succ
		f.at = time.Now()
		c.cutter.cut(r.PID, c.replica(succ).Addr)
		defer c.cutter.heal() // a failing test must not leave it cut
		hold(fmt.Sprintf("while %s could not send to %s", victim, succ))
		c.cutter.heal()
		f.resumed = time.Now()
	case faultIsolate:
		f.at = time.Now()
		defer c.cutter.heal()
		c.cutter.cut(c.d.proc.pid(), r.Addr) // the master and ingestion
		for _, o := range c.d.state.Replicas {
			if o.ID == victim {
				continue
			}
			other := c.replica(o.ID)
			c.cutter.cut(other.PID, r.Addr)
			c.cutter.cut(r.PID, other.Addr)
		}
		hold(fmt.Sprintf("while %s was cut off from everyone", victim))
		c.cutter.heal()
		f.resumed = time.Now()
	case faultSlowLink:
		succ := ids[slices.Index(ids, victim)+1]
		delay := 100 * time.Millisecond
		if pick%2 == 1 {
			delay = time.Second
		}
		f.replica = fmt.Sprintf("%s->%s+%s", victim, succ, delay)
		f.at = time.Now()
		defer c.cutter.heal()
		c.cutter.slow(r.PID, c.replica(succ).Addr, delay)
		hold(fmt.Sprintf("while what %s sent %s arrived %s late", victim, succ, delay))
		c.cutter.heal()
		f.resumed = time.Now()
	case faultIsolateMastr:
		// Ingestion lives in the same process in catena dev: writes stop
		// too. The replicas must not be reconfigured into anything unsafe
		// meanwhile, and all must go on once it heals.
		f.at = time.Now()
		defer c.cutter.heal()
		for _, o := range c.d.state.Replicas {
			c.cutter.cut(c.d.proc.pid(), c.replica(o.ID).Addr)
		}
		<-time.After(pauseFor) // the isolation is the fault itself
		c.cutter.heal()
		f.resumed = time.Now()
	case faultCrashPause:
		other := ids[(slices.Index(ids, victim)+1)%len(ids)]
		op := c.replica(other).PID
		f.replica = victim + "+paused:" + other
		f.at = time.Now()
		if err := syscall.Kill(op, syscall.SIGSTOP); err != nil {
			c.t.Fatalf("fault #%d %s: SIGSTOP %s: %v", n, kind, other, err)
		}
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				_ = syscall.Kill(op, syscall.SIGCONT)
			}
		}
		defer resume()
		signal(syscall.SIGKILL)
		// One member of three is left: writes wait for one to return.
		<-time.After(pauseFor) // the pause is the fault itself
		resume()
		f.resumed = time.Now()
	case faultCorrupt:
		// Stopped while its files are damaged, then its power cut: it
		// restarts on the damaged volume.
		signal(syscall.SIGSTOP)
		what := corruptSegment(c.t, filepath.Join(r.DataDir, "streams", c.stream, fmt.Sprintf("%05d", p)), pick+campaignReplication*n)
		f.replica = victim + ": " + what
		f.at = time.Now()
		signal(syscall.SIGKILL)
	case faultRestart:
		f.at = time.Now()
		signal(syscall.SIGTERM)
	case faultReplaceEmpty:
		// Stopped first so that nothing writes while the volume goes; the
		// master restarts the process only after it exits, on an empty
		// directory.
		signal(syscall.SIGSTOP)
		if err := os.RemoveAll(r.DataDir); err != nil {
			_ = syscall.Kill(r.PID, syscall.SIGCONT)
			c.t.Fatalf("fault #%d %s: remove %s: %v", n, kind, r.DataDir, err)
		}
		f.at = time.Now()
		signal(syscall.SIGKILL)
	case faultPause:
		f.at = time.Now()
		signal(syscall.SIGSTOP)
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				_ = syscall.Kill(r.PID, syscall.SIGCONT)
			}
		}
		defer resume() // a failing test must not leave it stopped
		hold(fmt.Sprintf("while %s was paused", victim))
		resume()
		f.resumed = time.Now()
	}
	start = c.phase("the fault", start)
	c.t.Logf("fault #%d %s: partition %d chain %v epoch %d, victim %s (pid %d) at %s",
		n, kind, p, ids, v.epoch, victim, r.PID, f.at.Format("15:04:05.000"))
	c.mu.Lock()
	c.faults = append(c.faults, f)
	c.mu.Unlock()
	if kind != faultPause && kind != faultCutLink && kind != faultIsolate && kind != faultSlowLink && kind != faultIsolateMastr {
		// A new process on the same address.
		for _, id := range victims {
			if err := poll(60*time.Second, func() error {
				if nr := c.replica(id); nr.PID == before[id] || nr.PID == 0 {
					return fmt.Errorf("%s (pid %d) not restarted yet", id, before[id])
				}
				return nil
			}); err != nil {
				c.t.Fatalf("fault #%d %s: %v", n, kind, err)
			}
		}
		start = c.phase("restart", start)
	}
	c.waitAcks(c.acks.Load()+200, 60*time.Second, fmt.Sprintf("after fault #%d %s of %s", n, kind, victim))
}

// watchCommitted polls every replica's Status and checks that the
// committed offset of each partition's head (the member with the newest
// epoch that reports itself head) never goes back: a successor learns of
// commits before its predecessor, so a new head knows at least what the
// old one did.
func (c *campaign) watchCommitted(ctx context.Context) {
	clients := map[string]catenapb.ReplicaClient{}
	last := make([]uint64, campaignPartitions)
	lastFrom := make([]string, campaignPartitions)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		type headReport struct {
			epoch, committed uint64
			id               string
		}
		heads := make([]headReport, campaignPartitions)
		for _, addr := range c.seeds {
			rc := clients[addr]
			if rc == nil {
				rc = replicaClient(c.t, addr)
				clients[addr] = rc
			}
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			resp, err := rc.Status(pctx, &catenapb.StatusRequest{Stream: c.stream})
			cancel()
			if err != nil {
				continue
			}
			for _, ps := range resp.GetPartitions() {
				p := ps.GetPartition()
				if int(p) >= campaignPartitions || ps.GetError() != "" {
					continue
				}
				if role := ps.GetRole(); role != catenapb.Role_ROLE_HEAD && role != catenapb.Role_ROLE_SOLE {
					continue
				}
				if ps.GetRestored() {
					// Reopened from its volume and fenced until a new
					// epoch: it reports the committed offset it recorded
					// (up to a second old after a crash), serves nothing
					// past it and answers no LATEST; it is no head.
					continue
				}
				if ps.GetEpoch() > heads[p].epoch {
					heads[p] = headReport{ps.GetEpoch(), ps.GetCommitted(), ps.GetReplicaId()}
				}
			}
		}
		c.mu.Lock()
		c.watchPolls++
		for p, h := range heads {
			if h.epoch == 0 {
				continue
			}
			if h.committed < last[p] {
				c.watchViolations = append(c.watchViolations, fmt.Sprintf("partition %d: committed went back from %d (%s) to %d (%s, head at epoch %d)",
					p, last[p], lastFrom[p], h.committed, h.id, h.epoch))
			}
			if h.committed >= last[p] {
				last[p], lastFrom[p] = h.committed, fmt.Sprintf("%s at epoch %d", h.id, h.epoch)
			}
		}
		c.mu.Unlock()
	}
}

// check verifies the invariants and returns the verdict ("PASS" or a
// summary of what failed); each violation is also a test error.
func (c *campaign) check() string {
	t := c.t
	t.Helper()
	var problems []string
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if len(problems) < 20 {
			t.Error(msg)
		}
		problems = append(problems, msg)
	}

	// Members agree offset for offset: log end == committed, same checksum.
	views := waitConverged(t, c.seeds, c.stream, campaignPartitions, 120*time.Second)
	for _, v := range views {
		if len(v.members) != campaignReplication {
			fail("partition %d ended with %d members: %v", v.partition, len(v.members), v)
		}
	}
	if t.Failed() {
		problems = append(problems, "members disagree")
	}
	for _, v := range c.watchViolations {
		fail("%s", v)
	}

	var all []*sent
	var firstErr error
	for _, recs := range c.sent {
		for _, s := range recs {
			all = append(all, &s.sent)
			if s.err != nil && firstErr == nil {
				firstErr = s.err
			}
		}
	}
	acked, failed := ackedByOffset(fail, all)
	if failed > 0 {
		t.Logf("%d records failed (not acknowledged); first: %v", failed, firstErr)
	}
	got, ends := readAll(t, c.d.client, c.stream, campaignPartitions)
	// No acknowledged record lost, each at its acked offset; none stored
	// twice, nothing nobody sent, per producer and key in send order
	// along the offsets.
	checkStored(fail, all, acked, got, ends, true)
	// Acknowledgements of a key are in send order too.
	for _, recs := range c.sent {
		type lastAck struct {
			p   uint32
			off uint64
			ok  bool
		}
		byKey := map[int]lastAck{}
		for _, s := range recs {
			if s.err != nil {
				continue
			}
			l := byKey[s.key]
			if l.ok && (s.ack.Partition != l.p || s.ack.Offset <= l.off) {
				fail("key %s: counter %d acked at %d/%d, not after the previous ack of the key at %d/%d", s.keyB, s.counter, s.ack.Partition, s.ack.Offset, l.p, l.off)
			}
			byKey[s.key] = lastAck{s.ack.Partition, s.ack.Offset, true}
		}
	}
	c.ackedCount = len(acked)
	if len(problems) > 0 {
		return fmt.Sprintf("FAIL (%d violations)", len(problems))
	}
	return "PASS"
}

// unavailability is, for a fault, the longest pause in acknowledgements
// of its partition that ends after the fault: from the last ack before the
// stall to the first ack after it, looking from just before the fault
// until the next fault (or the end of producing). Producers write steadily,
// so without a fault the gaps are a pacing tick (25 ms).
func (c *campaign) unavailability(f injected, until time.Time) (gap time.Duration, start time.Time, ok bool) {
	var ats []time.Time
	from := f.at.Add(-2 * time.Second)
	for _, recs := range c.sent {
		for _, s := range recs {
			if s.err == nil && s.ack.Partition == f.partition && !s.at.IsZero() && s.at.After(from) && (until.IsZero() || s.at.Before(until)) {
				ats = append(ats, s.at)
			}
		}
	}
	sort.Slice(ats, func(i, j int) bool { return ats[i].Before(ats[j]) })
	for i := 1; i < len(ats); i++ {
		if ats[i].After(f.at) && ats[i-1].Before(f.at.Add(30*time.Second)) {
			if d := ats[i].Sub(ats[i-1]); !ok || d > gap {
				gap, start, ok = d, ats[i-1], true
			}
		}
	}
	return gap, start, ok
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// faultClass groups kinds for the write-unavailability figures: a member
// crashed (its power cut, a restart, its volume lost), several members'
// power cut at once, a member paused, a link cut.
func faultClass(kind string) string {
	switch kind {
	case faultPowerLossTwo, faultPowerLossAll, faultCrashPause:
		return "several members at once"
	case faultPause:
		return "pauses"
	case faultCutLink, faultIsolate:
		return "cut links"
	case faultSlowLink:
		return "slow links"
	case faultIsolateMastr:
		return "master isolated"
	case faultCorrupt:
		return "corrupt member"
	}
	return "single crashes"
}

// majorityLeft reports whether a fault of kind leaves each chain a healthy,
// connected majority (and its ingestion), so that writes must resume
// within the failure timeout plus 2 s.
func majorityLeft(kind string) bool {
	switch kind {
	case faultPowerLossTwo, faultPowerLossAll, faultCrashPause, faultIsolateMastr:
		return false
	}
	return true
}

// corruptSegment damages one segment file in dir, chosen by pick: a bit
// flip, a zeroed 4 KiB page or a truncation, in the oldest (sealed, when
// there are several) or the newest (active) segment. It returns what it
// did.
func corruptSegment(t testing.TB, dir string, pick int) string {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	sort.Strings(segs)
	if len(segs) == 0 {
		return "no segment to damage"
	}
	path, which := segs[len(segs)-1], "active"
	if pick%2 == 0 && len(segs) > 1 {
		path, which = segs[0], "sealed"
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("corrupt: %v", err)
	}
	size := fi.Size()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("corrupt: %v", err)
	}
	defer f.Close()
	// Damage the frames, not the zeros an active segment may carry past
	// them (docs/storage-format.md §2.2).
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil {
		t.Fatalf("corrupt: %v", err)
	}
	for size > 24 && data[size-1] == 0 {
		size--
	}
	if size <= 24 {
		return "segment " + filepath.Base(path) + " holds no frame"
	}
	at := 24 + (int64(pick)*7919)%(size-24) // past the segment header
	switch (pick / 2) % 3 {
	case 0:
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, at); err != nil {
			t.Fatalf("corrupt: %v", err)
		}
		b[0] ^= 1 << (pick % 8)
		if _, err := f.WriteAt(b, at); err != nil {
			t.Fatalf("corrupt: %v", err)
		}
		return fmt.Sprintf("bit flip at byte %d of the %s segment %s", at, which, filepath.Base(path))
	case 1:
		at &^= 4095
		n := min(int64(4096), size-at)
		if at < 24 {
			at, n = 24, min(4096-24, size-24)
		}
		if _, err := f.WriteAt(make([]byte, n), at); err != nil {
			t.Fatalf("corrupt: %v", err)
		}
		return fmt.Sprintf("zeroed %d bytes at byte %d of the %s segment %s", n, at, which, filepath.Base(path))
	default:
		if err := f.Truncate(at); err != nil {
			t.Fatalf("corrupt: %v", err)
		}
		return fmt.Sprintf("truncated the %s segment %s to %d of %d bytes", which, filepath.Base(path), at, size)
	}
}

func (c *campaign) summary(verdict string) {
	byKind := map[string]int{}
	gaps := map[string][]time.Duration{}
	var overBound []string
	var lines []string
	for i, f := range c.faults {
		byKind[f.kind]++
		var until time.Time
		if i+1 < len(c.faults) {
			until = c.faults[i+1].at
		}
		gap, start, ok := c.unavailability(f, until)
		if !ok {
			continue
		}
		gaps[faultClass(f.kind)] = append(gaps[faultClass(f.kind)], gap)
		if majorityLeft(f.kind) && gap > campaignFailTimeout+2*time.Second {
			overBound = append(overBound, fmt.Sprintf("#%d %s %s", f.n, f.kind, gap.Round(time.Millisecond)))
		}
		lines = append(lines, fmt.Sprintf("#%d %s p%d %s: %s (from %+dms)", f.n, f.kind, f.partition, f.replica, gap.Round(time.Millisecond), start.Sub(f.at).Milliseconds()))
	}
	var kinds []string
	for _, k := range faultKinds {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, byKind[k]))
	}
	c.t.Logf("write unavailability per fault: %s", strings.Join(lines, "; "))
	var classes []string
	for _, class := range []string{"single crashes", "several members at once", "pauses", "cut links", "slow links", "master isolated", "corrupt member"} {
		ds := gaps[class]
		classes = append(classes, fmt.Sprintf("after %s p50 %s p99 %s (n=%d)", class,
			percentile(ds, 0.5).Round(time.Millisecond), percentile(ds, 0.99).Round(time.Millisecond), len(ds)))
	}
	// The bound is a figure, not an assertion: a shared machine can stall
	// a process for longer than any timeout.
	bound := fmt.Sprintf("%d of the faults that leave a connected majority kept a partition from writes longer than the failure timeout + 2 s", len(overBound))
	if len(overBound) > 0 {
		bound += " (" + strings.Join(overBound, ", ") + ")"
	}
	var phases []string
	for _, ph := range []string{"regrow", "flowing", "spacing", "the fault", "restart", "after the fault"} {
		phases = append(phases, fmt.Sprintf("%s %s", ph, c.phases[ph].Round(time.Second)))
	}
	msg := fmt.Sprintf("fault campaign: %d faults (%s), %d records acked, committed polled %d times; write unavailability %s; %s; fault loop time: %s; verdict %s",
		len(c.faults), strings.Join(kinds, " "), c.ackedCount, c.watchPolls, strings.Join(classes, ", "), bound, strings.Join(phases, ", "), verdict)
	if testing.Verbose() {
		// The master's side of the story, to read next to the faults.
		out, _ := os.ReadFile(c.d.outPath)
		for _, line := range bytes.Split(out, []byte("\n")) {
			for _, w := range []string{"Reordering chain", "Truncated", "Restarted replica", "exited", "stopped answering", "answers again"} {
				if bytes.Contains(line, []byte(w)) {
					c.t.Logf("dev: %s", line)
					break
				}
			}
		}
	}
	c.t.Log(msg)
	// Also on stdout, so that `make test-faults` shows it without -v.
	fmt.Println(msg)
}
