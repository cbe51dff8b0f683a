// Command compare measures Catena's produce path side by side with NATS
// JetStream on this machine, in one run: a 3-node JetStream cluster on
// 127.0.0.1 with sync_interval always and an R3 file stream, and `catena
// dev` (3 replica processes, fsync on every member before the ack). Each
// workload runs against both in turn (A B A B ...); the table reports each
// system's median records/s, MiB/s and ack latency p50/p99/p999 over the
// rounds, and the ratio Catena/peer. A third system, in the same rounds, is
// the same `catena dev` through its Kafka listener, produced to by franz-go
// (kafka.go), with its ratio to Catena's own client. Every process it starts
// it stops, by PID. Run it with `make bench-compare`.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	catena "github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func main() {
	var (
		catenaBin = flag.String("catena", "bin/catena", "catena binary")
		natsBin   = flag.String("nats-server", "", "nats-server binary (hack/nats-peer.sh server)")
		natsCLI   = flag.String("nats", "", "NATS's command-line tool, for the peer's own benchmark (hack/nats-peer.sh cli)")
		ctlBin    = flag.String("catenactl", "", "catenactl binary, for Catena's own benchmark (default: next to -catena)")
		records   = flag.Int("records", 200000, "records per full-speed run")
		rounds    = flag.Int("rounds", 2, "runs of each workload on each system, alternating")
		out       = flag.String("out", "", "also write the table (markdown) to this file")
		keep      = flag.Bool("keep", false, "keep the data and logs of both systems (the folder is printed)")
		only      = flag.String("only", "", "run only the workloads whose name matches this regular expression, the failover rows only if it matches \"failover\", the own-tool rows only if it matches \"own tools\" (for profiling one workload)")
		systems   = flag.String("systems", "", "run only the systems whose name matches this regular expression (\"Catena\": Catena's own client and franz-go through the Kafka listener, without starting JetStream); the ratio rows need both of their systems")
	)
	flag.Parse()
	match, err := regexp.Compile(*only)
	if err != nil {
		fail(fmt.Errorf("-only: %w", err))
	}
	pick, err := regexp.Compile(*systems)
	if err != nil {
		fail(fmt.Errorf("-systems: %w", err))
	}
	if pick.MatchString(natsName) && (*natsBin == "" || *natsCLI == "") {
		fail(errors.New("-nats-server and -nats are required (hack/nats-peer.sh server|cli prints them)"))
	}
	if *ctlBin == "" {
		*ctlBin = filepath.Join(filepath.Dir(*catenaBin), "catenactl")
	}
	bins := binaries{catena: *catenaBin, catenactl: *ctlBin, natsServer: *natsBin, nats: *natsCLI}
	if err := run(bins, *records, *rounds, *out, match, pick, *only != "" || *systems != "", *keep); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "compare:", err)
	os.Exit(1)
}

// system is one side of the comparison.
type system interface {
	Name() string
	// Run sends n records of size bytes from producers at once (rate: the
	// total records/s, 0 for full speed; sync: one record at a time, each
	// waited for) and returns every record's ack latency.
	Run(ctx context.Context, w workload) (result, error)
}

type workload struct {
	Name      string
	Size      int
	Producers int
	N         int
	Rate      float64 // records/s in total; 0: as fast as acks allow
	Sync      bool
	// InFlight overrides the records each producer may have awaiting
	// their ack (0: inFlight).
	InFlight int
}

func (w workload) inFlight() int {
	if w.InFlight > 0 {
		return w.InFlight
	}
	return inFlight
}

type result struct {
	Elapsed time.Duration
	Lat     []time.Duration
	Bytes   int64
}

func (r result) recsPerSec() float64 { return float64(len(r.Lat)) / r.Elapsed.Seconds() }
func (r result) mibPerSec() float64  { return float64(r.Bytes) / (1 << 20) / r.Elapsed.Seconds() }
func (r result) pct(q float64) time.Duration {
	if len(r.Lat) == 0 {
		return 0
	}
	s := slices.Clone(r.Lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// binaries are the programs a run starts.
type binaries struct{ catena, catenactl, natsServer, nats string }

func run(bins binaries, records, rounds int, out string, only, pick *regexp.Regexp, partial, keep bool) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "catena-compare-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Fprintf(os.Stderr, "data and logs kept in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			stop(p)
		}
	}()

	// The systems run in this order in every round: Catena and the peer
	// alternate as they always have, and the Kafka protocol row comes
	// after the peer, so that the two rows on catena dev do not run back to
	// back.
	var (
		systems []system
		cat     *catenaSystem
		peer    *natsSystem
		kafka   *kafkaSystem
	)
	if pick.MatchString(catenaName) || pick.MatchString(kafkaName) {
		var p *exec.Cmd
		cat, p, err = startCatena(ctx, bins.catena, filepath.Join(dir, "catena"))
		if p != nil {
			procs = append(procs, p)
		}
		if err != nil {
			return err
		}
		defer cat.Close()
		if pick.MatchString(catenaName) {
			systems = append(systems, cat)
		}
	}
	if pick.MatchString(natsName) {
		var ps []*exec.Cmd
		peer, ps, err = startNATS(ctx, bins.natsServer, filepath.Join(dir, "nats"))
		procs = append(procs, ps...)
		if err != nil {
			return err
		}
		defer peer.Close()
		systems = append(systems, peer)
	}
	if pick.MatchString(kafkaName) {
		kafka = &kafkaSystem{addr: cat.kafka}
		systems = append(systems, kafka)
	}
	if len(systems) == 0 {
		return fmt.Errorf("-systems matches none of %q, %q, %q", catenaName, natsName, kafkaName)
	}

	workloads := []workload{
		{Name: "1 KiB, 1 producer, full speed", Size: 1024, Producers: 1, N: records},
		{Name: "1 KiB, 4 producers, full speed", Size: 1024, Producers: 4, N: records},
		{Name: "100 B, 4 producers, full speed", Size: 100, Producers: 4, N: records},
		{Name: "1 KiB, 4 producers, deep pipelines (4096 in flight each)", Size: 1024, Producers: 4, N: records, InFlight: 4096},
		{Name: "1 KiB, synchronous, one at a time", Size: 1024, Producers: 1, N: 2000, Sync: true},
	}
	results := map[string]map[string][]result{}
	runOne := func(w workload) error {
		results[w.Name] = map[string][]result{}
		if !only.MatchString(w.Name) {
			return nil
		}
		for r := range rounds {
			for _, s := range systems {
				res, err := s.Run(ctx, w)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", s.Name(), w.Name, err)
				}
				results[w.Name][s.Name()] = append(results[w.Name][s.Name()], res)
				fmt.Fprintf(os.Stderr, "round %d %-8s %-40s %9.0f rec/s %7.1f MiB/s p50 %v p99 %v\n", r+1, s.Name(), w.Name,
					res.recsPerSec(), res.mibPerSec(), res.pct(0.5).Round(10*time.Microsecond), res.pct(0.99).Round(10*time.Microsecond))
			}
		}
		return nil
	}
	for _, w := range workloads {
		if err := runOne(w); err != nil {
			return err
		}
	}
	// Latency at load: half the peer's peak with four producers.
	peak := median(results[workloads[1].Name][natsName], result.recsPerSec) // 1 KiB, 4 producers, 256 in flight
	atLoad := workload{Name: fmt.Sprintf("1 KiB, 4 producers at %.0f/s (half the peer's peak)", peak/2), Size: 1024, Producers: 4, N: int(peak / 2 * 10), Rate: peak / 2}
	if peak > 0 {
		workloads = append(workloads, atLoad)
		if err := runOne(atLoad); err != nil {
			return err
		}
	}

	table := render(workloads, systems, results, rounds)
	var tools []ownTool
	if pick.MatchString(catenaName) {
		tools = append(tools, cat.ownTool(bins.catenactl))
	}
	if peer != nil {
		tools = append(tools, peer.ownTool(bins.nats))
	}
	if only.MatchString(ownToolsName) && len(tools) > 0 {
		// Three times the records of the other rows: each tool starts its
		// own connections and ramps up, and short runs measured that.
		n := 3 * records
		rs, err := runOwnTools(ctx, tools, n, rounds)
		if err != nil {
			return err
		}
		table += renderOwnTools(tools, n, rs)
	}
	if partial && !only.MatchString("failover") {
		fmt.Print(table)
		return nil
	}
	var failovers []func(context.Context) (failoverResult, error)
	if pick.MatchString(catenaName) {
		failovers = append(failovers,
			func(ctx context.Context) (failoverResult, error) { return cat.failover(ctx, "head") },
			func(ctx context.Context) (failoverResult, error) { return cat.failover(ctx, "tail") })
	}
	if peer != nil {
		failovers = append(failovers, peer.failover)
	}
	var fo []failoverResult
	for _, f := range failovers {
		r, err := f(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "failover %-26s write gap %v, %d acked, %d lost, %d failed\n", r.What, r.Gap.Round(time.Millisecond), r.Acked, r.Lost, r.Failed)
		fo = append(fo, r)
	}
	table += renderFailover(fo)
	fmt.Print(table)
	if out != "" {
		return os.WriteFile(out, []byte(table), 0o644)
	}
	return nil
}

func median(rs []result, f func(result) float64) float64 {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	return medianOf(vs)
}

func medianOf(vs []float64) float64 {
	vs = slices.Clone(vs)
	slices.Sort(vs)
	if len(vs) == 0 {
		return 0
	}
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

func render(ws []workload, ss []system, res map[string]map[string][]result, rounds int) string {
	var b strings.Builder
	var names []string
	for _, s := range ss {
		names = append(names, s.Name())
	}
	ran := func(w workload, name string) bool { return slices.Contains(names, name) && len(res[w.Name][name]) > 0 }
	if !slices.ContainsFunc(ws, func(w workload) bool { return slices.ContainsFunc(names, func(n string) bool { return ran(w, n) }) }) {
		return "" // none run (-only, -systems)
	}
	host, _ := os.Hostname()
	// The title names the pair of the ratio rows as it always has; the
	// Kafka protocol rows are on the same catena dev.
	title := strings.Join(names, ", ")
	if slices.Contains(names, catenaName) && slices.Contains(names, natsName) {
		title = catenaName + " vs " + natsName
		if slices.Contains(names, kafkaName) {
			title += " (and Catena through its Kafka listener, franz-go)"
		}
	}
	fmt.Fprintf(&b, "\n%s, %s, %d rounds each (medians), %s\n\n", title, time.Now().UTC().Format("2006-01-02"), rounds, host)
	fmt.Fprintf(&b, "| workload | system | records/s | MiB/s | ack p50 | p99 | p999 |\n|---|---|---|---|---|---|---|\n")
	ms := func(f func(result) time.Duration) func(result) float64 {
		return func(r result) float64 { return float64(f(r).Microseconds()) / 1000 }
	}
	p50 := ms(func(r result) time.Duration { return r.pct(0.5) })
	p99 := ms(func(r result) time.Duration { return r.pct(0.99) })
	p999 := ms(func(r result) time.Duration { return r.pct(0.999) })
	row := func(w workload, name string) {
		rs := res[w.Name][name]
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.1f | %.2f ms | %.2f ms | %.2f ms |\n", w.Name, name,
			median(rs, result.recsPerSec), median(rs, result.mibPerSec), median(rs, p50), median(rs, p99), median(rs, p999))
	}
	ratio := func(w workload, label, a, p string) {
		ra, rp := res[w.Name][a], res[w.Name][p]
		fmt.Fprintf(&b, "| %s | **%s** | **%.2fx** | | %.2fx | %.2fx | %.2fx |\n", w.Name, label,
			median(ra, result.recsPerSec)/median(rp, result.recsPerSec),
			median(ra, p50)/median(rp, p50), median(ra, p99)/median(rp, p99), median(ra, p999)/median(rp, p999))
	}
	var peerRatio, kafkaRatio bool
	for _, w := range ws {
		// Catena and the peer, and their ratio, as before; then the Kafka
		// protocol row and its ratio to Catena's own client.
		for _, name := range []string{catenaName, natsName} {
			if ran(w, name) {
				row(w, name)
			}
		}
		if ran(w, catenaName) && ran(w, natsName) {
			ratio(w, "ratio", catenaName, natsName)
			peerRatio = true
		}
		if ran(w, kafkaName) {
			row(w, kafkaName)
			if ran(w, catenaName) {
				ratio(w, kafkaRatioName, kafkaName, catenaName)
				kafkaRatio = true
			}
		}
	}
	if peerRatio {
		b.WriteString("\nRatios: records/s Catena/peer (above 1: Catena faster); latencies Catena/peer (below 1: Catena lower).\n")
	}
	if kafkaRatio {
		b.WriteString("\nKafka/native: the Kafka protocol row over Catena's own client, same catena dev (records/s above 1: franz-go\n" +
			"faster; latencies below 1: franz-go lower).\n")
	}
	return b.String()
}

// ---------------------------------------------------------------- own tools

// ownToolsName names the rows where each system is driven by its own
// benchmark tool (for -only).
const ownToolsName = "own tools"

// ownTool is a system's own benchmark program, run the way its users would
// for a headline figure. The shared driver above is what the ratios are
// about; these rows show that it does not hold the peer below its best.
type ownTool struct {
	System, Cmd string
	run         func(ctx context.Context, n int) (float64, error) // records/s
}

func runOwnTools(ctx context.Context, tools []ownTool, n, rounds int) ([][]float64, error) {
	rs := make([][]float64, len(tools))
	for r := range rounds {
		for i, t := range tools {
			v, err := t.run(ctx, n)
			if err != nil {
				return nil, fmt.Errorf("%s's own benchmark (%s): %w", t.System, t.Cmd, err)
			}
			rs[i] = append(rs[i], v)
			fmt.Fprintf(os.Stderr, "round %d %-8s %-40s %9.0f rec/s\n", r+1, t.System, ownToolsName, v)
		}
	}
	return rs, nil
}

func renderOwnTools(tools []ownTool, n int, rs [][]float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nEach system's own benchmark tool, %d records of 1 KiB, 4 producers, full speed (the peer's command is the one\n"+
		"its recipe measured its best with)\n\n| system | command | records/s (median) | MiB/s | every round |\n|---|---|---|---|---|\n", n)
	for i, t := range tools {
		var each []string
		for _, v := range rs[i] {
			each = append(each, fmt.Sprintf("%.0f", v))
		}
		fmt.Fprintf(&b, "| %s | `%s` | %.0f | %.1f | %s |\n", t.System, t.Cmd, medianOf(rs[i]), medianOf(rs[i])*1024/(1<<20), strings.Join(each, ", "))
	}
	if len(tools) == 2 {
		fmt.Fprintf(&b, "| **ratio** | | **%.2fx** | | |\n", medianOf(rs[0])/medianOf(rs[1]))
	}
	return b.String()
}

// ownTool is `catenactl bench`, keyless like the peer's single subject.
func (s *catenaSystem) ownTool(bin string) ownTool {
	const cmd = "catenactl bench --record-size 1024 --producers 4 --keys 0"
	return ownTool{System: s.Name(), Cmd: cmd, run: func(ctx context.Context, n int) (float64, error) {
		out, err := runTool(ctx, bin, "--server", s.ingest, "bench", "--stream", "bench", "--record-size", "1024",
			"--producers", "4", "--keys", "0", "--records", strconv.Itoa(n))
		if err != nil {
			return 0, err
		}
		var res struct {
			RecordsPerSec float64 `json:"records_per_sec"`
			Errors        int     `json:"errors"`
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
			return 0, fmt.Errorf("reading its result %q: %w", lines[len(lines)-1], err)
		}
		if res.Errors > 0 {
			return 0, fmt.Errorf("%d records failed", res.Errors)
		}
		return res.RecordsPerSec, nil
	}}
}

// natsBenchRate is the total rate in `nats bench` output: "... aggregated
// stats: 23,806 msgs/sec ~ 23 MiB/sec".
var natsBenchRate = regexp.MustCompile(`aggregated stats: ([0-9,]+) msgs/sec`)

// ownTool is `nats bench` as ../shared/recipes/nats-peer ran it for the
// peer's best figure: asynchronous publishes in batches of 2000, 4 clients,
// to the stream leader.
func (s *natsSystem) ownTool(bin string) ownTool {
	const cmd = "nats bench js pub async --clients 4 --size 1KB --batch 2000"
	return ownTool{System: s.Name(), Cmd: cmd, run: func(ctx context.Context, n int) (float64, error) {
		out, err := runTool(ctx, bin, "--server", s.url, "bench", "js", "pub", "async", "bench.own", "--stream", "BENCH",
			"--clients", "4", "--size", "1KB", "--batch", "2000", "--no-progress", "--msgs", strconv.Itoa(n))
		if err != nil {
			return 0, err
		}
		m := natsBenchRate.FindSubmatch(out)
		if m == nil {
			return 0, fmt.Errorf("no aggregated rate in its output:\n%s", out)
		}
		return strconv.ParseFloat(strings.ReplaceAll(string(m[1]), ",", ""), 64)
	}}
}

// runTool runs a benchmark program to its end and returns its standard
// output (its standard error goes into the error when it fails).
func runTool(ctx context.Context, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// ---------------------------------------------------------------- failover

// failoverRate is the write rate while a leader or head is killed.
const failoverRate = 2000

type failoverResult struct {
	What                string
	Gap                 time.Duration // last ack before the kill to the first after
	Acked, Lost, Failed int
}

func renderFailover(rs []failoverResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nFailover: kill -9 under %d records/s of 1 KiB (one producer, 256 in flight)\n\n", failoverRate)
	b.WriteString("| system, killed | write gap (longest pause between acks after the kill) | acked | acked and lost | failed (not acked) |\n|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %v | %d | %d | %d |\n", r.What, r.Gap.Round(time.Millisecond), r.Acked, r.Lost, r.Failed)
	}
	return b.String()
}

// ackLog is the acknowledgements of a failover run, in order.
type ackLog struct {
	mu     sync.Mutex
	at     []time.Time
	ids    []uint64 // record id (its payload's first 8 bytes)
	pos    []uint64 // offset or stream sequence
	failed int
}

func (l *ackLog) add(id, pos uint64) {
	l.mu.Lock()
	l.at, l.ids, l.pos = append(l.at, time.Now()), append(l.ids, id), append(l.pos, pos)
	l.mu.Unlock()
}

// gap is the write unavailability the kill caused: the longest pause
// between consecutive acknowledgements from the last one before the kill
// to ten seconds after it.
func (l *ackLog) gap(kill time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, _ := slices.BinarySearchFunc(l.at, kill, func(a, b time.Time) int { return a.Compare(b) })
	var longest time.Duration
	for j := max(i, 1); j < len(l.at) && l.at[j-1].Before(kill.Add(10*time.Second)); j++ {
		longest = max(longest, l.at[j].Sub(l.at[j-1]))
	}
	return longest
}

// paced sends failoverRate records a second for d, calling send(id) for
// each on its own goroutine (bounded), and kills at kill.
func paced(d time.Duration, killAfter time.Duration, kill func() error, send func(id uint64)) (time.Time, error) {
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	start := time.Now()
	var killedAt time.Time
	var killErr error
	interval := time.Second / failoverRate
	for id := uint64(1); time.Since(start) < d; id++ {
		if killedAt.IsZero() && time.Since(start) >= killAfter {
			killedAt, killErr = time.Now(), kill()
		}
		if wait := time.Until(start.Add(time.Duration(id) * interval)); wait > 0 {
			<-time.After(wait)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			send(id)
		}()
	}
	wg.Wait()
	return killedAt, killErr
}

func payloadFor(id uint64) []byte {
	b := make([]byte, 1024)
	binary.BigEndian.PutUint64(b, id)
	return b
}

// failover kills the head (or tail) of partition 0 of catena dev's stream
// under load, and checks every acknowledged record afterwards.
func (s *catenaSystem) failover(ctx context.Context, role string) (failoverResult, error) {
	res := failoverResult{What: "Catena, " + role}
	// Retries back off to 100 ms at most, as the peer's client reconnects
	// every 100 ms: the gap is then the store's, not the client's back-off.
	p := catena.NewProducer(s.c, "bench", catena.ProducerOptions{RetryTimeout: time.Minute, MaxRetryBackoff: 100 * time.Millisecond})
	defer p.Close()
	var log ackLog
	kill := func() error {
		var st struct {
			Replicas []struct {
				ID   string `json:"id"`
				Addr string `json:"addr"`
				PID  int    `json:"pid"`
			} `json:"replicas"`
		}
		b, err := os.ReadFile(filepath.Join(s.dir, "dev.json"))
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return err
		}
		desc, err := s.c.Ingest().DescribeStream(ctx, &catenapb.DescribeStreamRequest{Stream: "bench"})
		if err != nil {
			return err
		}
		var victim string
		for _, part := range desc.GetPartitions() {
			if part.GetPartition() != 0 {
				continue
			}
			ms := part.GetMembers()
			if len(ms) == 0 {
				return errors.New("partition 0 has no members")
			}
			victim = ms[0].GetId()
			if role == "tail" {
				victim = ms[len(ms)-1].GetId()
			}
		}
		for _, r := range st.Replicas {
			if r.ID == victim {
				return syscall.Kill(r.PID, syscall.SIGKILL)
			}
		}
		return fmt.Errorf("no PID for replica %q in dev.json", victim)
	}
	killedAt, err := paced(15*time.Second, 5*time.Second, kill, func(id uint64) {
		a, err := p.SendSync(ctx, catena.Record{Value: payloadFor(id), Partition: catena.PartitionOf(0)})
		if err != nil {
			log.mu.Lock()
			log.failed++
			log.mu.Unlock()
			return
		}
		log.add(id, a.Offset)
	})
	if err != nil {
		return res, fmt.Errorf("kill the %s: %w", role, err)
	}
	res.Gap, res.Acked, res.Failed = log.gap(killedAt), len(log.ids), log.failed
	// Every acknowledged record at its offset, after the repair.
	byOffset := map[uint64]uint64{}
	last := slices.Max(log.pos)
	for next := slices.Min(log.pos); next <= last; {
		fr, err := s.c.Fetch(ctx, "bench", 0, next, 4<<20, 5*time.Second)
		if err != nil {
			return res, err
		}
		if len(fr.Messages) == 0 {
			break
		}
		for _, m := range fr.Messages {
			byOffset[m.Offset] = binary.BigEndian.Uint64(m.Value)
			next = m.Offset + 1
		}
	}
	for i, id := range log.ids {
		if byOffset[log.pos[i]] != id {
			res.Lost++
		}
	}
	return res, nil
}

// ---------------------------------------------------------------- Catena

type catenaSystem struct {
	c      *catena.Client
	dir    string
	ingest string // the ingestion node's address
	kafka  string // its Kafka listener's address
}

// catenaName is the native client's row (and the ratio rows' Catena).
const catenaName = "Catena"

func (s *catenaSystem) Name() string { return catenaName }
func (s *catenaSystem) Close()       { _ = s.c.Close() }

func startCatena(ctx context.Context, bin, dir string) (*catenaSystem, *exec.Cmd, error) {
	// The Kafka listener serves the Kafka protocol row (kafka.go) on the
	// same cluster; the native rows do not use it.
	cmd := exec.Command(bin, "dev", "--data-dir", dir, "--listen", freeAddr(), "--stream", "bench", "--partitions", "4",
		"--kafka-listen", freeAddr())
	logf, err := os.Create(dir + ".log")
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	var state struct {
		Ingest string `json:"ingest"`
		Kafka  string `json:"kafka"`
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "dev.json")); err == nil && json.Unmarshal(b, &state) == nil && state.Ingest != "" && state.Kafka != "" {
			break
		}
		if time.Now().After(deadline) {
			return nil, cmd, fmt.Errorf("catena dev did not write dev.json within a minute (log: %s.log)", dir)
		}
		<-time.After(50 * time.Millisecond)
	}
	c, err := catena.Dial(ctx, state.Ingest)
	if err != nil {
		return nil, cmd, err
	}
	return &catenaSystem{c: c, dir: dir, ingest: state.Ingest, kafka: state.Kafka}, cmd, nil
}

func (s *catenaSystem) Run(ctx context.Context, w workload) (result, error) {
	opts := catena.ProducerOptions{}
	if w.Sync {
		opts.Linger, opts.MaxInFlight = -1, 1
	}
	return drive(w, func(i int) func(payload []byte) (func() error, error) {
		p := catena.NewProducer(s.c, "bench", opts)
		return func(payload []byte) (func() error, error) {
			f := p.Send(ctx, catena.Record{Value: payload})
			return func() error { _, err := f.Wait(); return err }, nil
		}
	})
}

// ---------------------------------------------------------------- NATS

type natsSystem struct {
	url  string   // the stream leader's
	urls []string // every server's, in order
	cmds []*exec.Cmd
	ncs  []*nats.Conn
}

// natsName is the peer's row.
const natsName = "JetStream"

func (s *natsSystem) Name() string { return natsName }
func (s *natsSystem) Close() {
	for _, nc := range s.ncs {
		nc.Close()
	}
}

func startNATS(ctx context.Context, bin, dir string) (*natsSystem, []*exec.Cmd, error) {
	type node struct{ client, cluster, http string }
	var nodes []node
	for range 3 {
		nodes = append(nodes, node{freeAddr(), freeAddr(), freeAddr()})
	}
	var routes []string
	for _, n := range nodes {
		routes = append(routes, "nats-route://"+n.cluster)
	}
	var cmds []*exec.Cmd
	for i, n := range nodes {
		name := fmt.Sprintf("n%d", i+1)
		conf := fmt.Sprintf(`server_name: %s
listen: %s
http: %s
jetstream {
    store_dir: %q
    max_file_store: 20GB
    max_memory_store: 1GB
    sync_interval: always
}
cluster {
    name: bench
    listen: %s
    routes: [%s]
}
`, name, n.client, n.http, filepath.Join(dir, name), n.cluster, strings.Join(routes, ", "))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, cmds, err
		}
		path := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return nil, cmds, err
		}
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, cmds, err
		}
		cmd := exec.Command(bin, "-c", path)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return nil, cmds, err
		}
		cmds = append(cmds, cmd)
	}
	// Ready once a meta leader is elected and both other servers are current.
	ready := func() bool {
		// The meta leader reports its peers; followers may not.
		for _, n := range nodes {
			if metaLeader(n.http) {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(60 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			return nil, cmds, fmt.Errorf("JetStream elected no meta leader within a minute (logs in %s)", dir)
		}
		<-time.After(100 * time.Millisecond)
	}
	var urls []string
	for _, n := range nodes {
		urls = append(urls, "nats://"+n.client)
	}
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		return nil, cmds, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, cmds, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage,
		Replicas: 3, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld})
	if err != nil {
		return nil, cmds, fmt.Errorf("create stream: %w (server logs in %s)", err, dir)
	}
	// Publish to the stream leader, as its clients would.
	info, err := st.Info(cctx)
	if err != nil {
		return nil, cmds, err
	}
	leader := urls[0]
	for i := range nodes {
		if info.Cluster != nil && info.Cluster.Leader == fmt.Sprintf("n%d", i+1) {
			leader = urls[i]
		}
	}
	return &natsSystem{url: leader, urls: urls, cmds: cmds}, cmds, nil
}

func metaLeader(httpAddr string) bool {
	resp, err := http.Get("http://" + httpAddr + "/jsz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var jsz struct {
		Meta *struct {
			Leader   string `json:"leader"`
			Replicas []struct {
				Current bool `json:"current"`
			} `json:"replicas"`
		} `json:"meta_cluster"`
	}
	if json.Unmarshal(b, &jsz) != nil || jsz.Meta == nil || jsz.Meta.Leader == "" || len(jsz.Meta.Replicas) < 2 {
		return false
	}
	for _, r := range jsz.Meta.Replicas {
		if !r.Current {
			return false
		}
	}
	return true
}

func (s *natsSystem) Run(ctx context.Context, w workload) (result, error) {
	return drive(w, func(i int) func(payload []byte) (func() error, error) {
		nc, err := nats.Connect(s.url)
		if err != nil {
			return func([]byte) (func() error, error) { return nil, err }
		}
		s.ncs = append(s.ncs, nc)
		inflight := w.inFlight()
		if w.Sync {
			inflight = 1
		}
		// The driver bounds what awaits an ack (its queue, plus the one
		// being waited for and the one being sent); the client's own bound
		// is set above it so that it never stalls a publish on its own.
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(inflight+2))
		if err != nil {
			return func([]byte) (func() error, error) { return nil, err }
		}
		subject := fmt.Sprintf("bench.p%d", i)
		return func(payload []byte) (func() error, error) {
			f, err := js.PublishAsync(subject, payload)
			if err != nil {
				return nil, err
			}
			return func() error {
				select {
				case <-f.Ok():
					return nil
				case err := <-f.Err():
					return err
				}
			}, nil
		}
	})
}

// failover kills the stream leader under load, and checks every
// acknowledged message afterwards.
func (s *natsSystem) failover(ctx context.Context) (failoverResult, error) {
	res := failoverResult{What: "JetStream, stream leader"}
	nc, err := nats.Connect(strings.Join(s.urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return res, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	st, err := js.Stream(ctx, "BENCH")
	if err != nil {
		return res, err
	}
	var log ackLog
	kill := func() error {
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		for i, cmd := range s.cmds {
			if info.Cluster != nil && info.Cluster.Leader == fmt.Sprintf("n%d", i+1) {
				return syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		return errors.New("no stream leader")
	}
	killedAt, err := paced(15*time.Second, 5*time.Second, kill, func(id uint64) {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		a, err := js.Publish(pctx, "bench.failover", payloadFor(id))
		if err != nil {
			log.mu.Lock()
			log.failed++
			log.mu.Unlock()
			return
		}
		log.add(id, a.Sequence)
	})
	if err != nil {
		return res, fmt.Errorf("kill the stream leader: %w", err)
	}
	res.Gap, res.Acked, res.Failed = log.gap(killedAt), len(log.ids), log.failed
	for i, id := range log.ids {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := st.GetMsg(gctx, log.pos[i])
		cancel()
		if err != nil || len(m.Data) < 8 || binary.BigEndian.Uint64(m.Data) != id {
			res.Lost++
		}
	}
	return res, nil
}

// ---------------------------------------------------------------- driver

// inFlight is how many records each producer may have sent and not yet
// seen acknowledged, on both systems alike: the latency of a full-speed
// run is then the store's, not a queue's in the driver.
const inFlight = 256

// drive runs w with one sender per producer (newSender(i) makes producer
// i's): each send returns a wait for its ack; acks are awaited in order by
// a collector, which records the latency from send to ack. At most
// inFlight records per producer await their ack. A synchronous workload
// waits for each ack before the next send.
func drive(w workload, newSender func(i int) func(payload []byte) (func() error, error)) (result, error) {
	per := w.N / w.Producers
	var (
		mu   sync.Mutex
		lats = make([]time.Duration, 0, w.N)
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for i := range w.Producers {
		send := newSender(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			type pending struct {
				at   time.Time
				wait func() error
			}
			q := make(chan pending, w.inFlight())
			collected := make(chan []time.Duration)
			go func() {
				var mine []time.Duration
				for p := range q {
					if err := p.wait(); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						continue
					}
					mine = append(mine, time.Since(p.at))
				}
				collected <- mine
			}()
			payload := make([]byte, w.Size)
			next := time.Now()
			var interval time.Duration
			if w.Rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(w.Producers) / w.Rate)
			}
			for range per {
				if interval > 0 {
					next = next.Add(interval)
					if d := time.Until(next); d > 0 {
						<-time.After(d)
					}
				}
				at := time.Now()
				wait, err := send(payload)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					break
				}
				if w.Sync {
					if err := wait(); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						continue
					}
					mine := time.Since(at)
					mu.Lock()
					lats = append(lats, mine)
					mu.Unlock()
					continue
				}
				q <- pending{at: at, wait: wait}
			}
			close(q)
			mine := <-collected
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res := result{Elapsed: time.Since(start), Lat: lats, Bytes: int64(len(lats)) * int64(w.Size)}
	if len(errs) > 0 {
		return res, fmt.Errorf("%d records failed, the first: %w", len(errs), errs[0])
	}
	return res, nil
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// stop ends a process this program started (and its children: catena dev
// runs its replicas in its process group), by PID.
func stop(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}
