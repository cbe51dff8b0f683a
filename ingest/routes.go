package ingest

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// routeTable is what ingestion knows of every stream's chains. It is
// learned from the replicas themselves: each reports the chain it has
// installed per partition, and the highest epoch reported wins. There is no
// other membership service to ask, and none is needed: a member that is
// behind reports an older epoch and loses to the others.
type routeTable struct {
	streams map[string]*streamRoute
	// replicas: every replica address seen (seeds and members), by id.
	replicas map[string]string
	// features: what each replica that answered reports it can store.
	features map[string][]string
}

// supports reports whether every member reported feature; when not, the
// first that did not, and whether it reported at all (known: it runs a
// version without feature).
func (t *routeTable) supports(members []*catenapb.Member, feature string) (missing string, known, ok bool) {
	for _, m := range members {
		fs, reported := t.features[m.GetId()]
		if !slices.Contains(fs, feature) {
			return m.GetId(), reported, false
		}
	}
	return "", true, true
}

type streamRoute struct {
	name       string
	config     *catenapb.StreamConfig
	partitions []*partitionRoute // index = partition; nil when unknown
}

type partitionRoute struct {
	epoch   uint64
	members []*catenapb.Member
	// reports are the members' own status, by replica id.
	reports map[string]*catenapb.PartitionStatus
}

func (r *partitionRoute) head() *catenapb.Member {
	if r == nil || len(r.members) == 0 {
		return nil
	}
	return r.members[0]
}

// tail is the chain's tail (the head of a chain of one).
func (r *partitionRoute) tail() *catenapb.Member {
	if r == nil || len(r.members) == 0 {
		return nil
	}
	return r.members[len(r.members)-1]
}

// readOrder lists members to read from, tail first: the tail learns of
// commits first, so it serves the freshest committed data.
func (r *partitionRoute) readOrder() []*catenapb.Member {
	out := make([]*catenapb.Member, 0, len(r.members))
	for i := len(r.members) - 1; i >= 0; i-- {
		out = append(out, r.members[i])
	}
	return out
}

// buildRoutes merges status reports into a route table (pure).
func buildRoutes(reports []*catenapb.StatusResponse, seeds []string) *routeTable {
	t := &routeTable{streams: map[string]*streamRoute{}, replicas: map[string]string{}, features: map[string][]string{}}
	for _, rep := range reports {
		t.features[rep.GetReplicaId()] = rep.GetFeatures()
		for _, ps := range rep.GetPartitions() {
			if ps.GetEpoch() == 0 || ps.GetConfig() == nil {
				continue
			}
			for _, m := range ps.GetMembers() {
				t.replicas[m.GetId()] = m.GetAddr()
			}
			sr := t.streams[ps.GetStream()]
			if sr == nil {
				sr = &streamRoute{name: ps.GetStream()}
				t.streams[ps.GetStream()] = sr
			}
			n := int(ps.GetConfig().GetPartitions())
			if sr.config == nil || n > len(sr.partitions) {
				sr.config = ps.GetConfig()
			}
			for len(sr.partitions) < n {
				sr.partitions = append(sr.partitions, nil)
			}
			idx := int(ps.GetPartition())
			if idx >= len(sr.partitions) {
				continue
			}
			pr := sr.partitions[idx]
			if pr == nil {
				pr = &partitionRoute{reports: map[string]*catenapb.PartitionStatus{}}
				sr.partitions[idx] = pr
			}
			pr.reports[ps.GetReplicaId()] = ps
			if ps.GetEpoch() > pr.epoch {
				pr.epoch = ps.GetEpoch()
				pr.members = ps.GetMembers()
			}
		}
	}
	return t
}

func (t *routeTable) streamNames() []string {
	names := make([]string, 0, len(t.streams))
	for n := range t.streams {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// reportMaxAge is how long a replica's last report stands in for it
// while it does not answer.
const reportMaxAge = 30 * time.Second

type lastReport struct {
	resp *catenapb.StatusResponse
	at   time.Time
}

// discovery keeps the route table fresh by asking every known replica.
type discovery struct {
	srv      *Server
	seeds    []string
	interval time.Duration

	mu      sync.Mutex
	table   *routeTable
	last    map[string]lastReport // by replica address
	updated chan struct{}         // closed and replaced after each refresh
	kick    chan struct{}
}

func (d *discovery) current() *routeTable {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.table
}

// refresh asks every seed and every member seen so far for its status.
func (d *discovery) refresh(ctx context.Context) {
	d.mu.Lock()
	addrs := map[string]bool{}
	for _, s := range d.seeds {
		addrs[s] = true
	}
	if d.table != nil {
		for _, a := range d.table.replicas {
			addrs[a] = true
		}
	}
	d.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel() // stragglers' calls end with the round
	// Answers are taken as they come. The round ends when every replica
	// answered, when statusProbeTimeout has passed, or statusStraggleGrace
	// after the first answer: a dead, paused or restarting replica must
	// not hold up re-learning a chain after its head failed (appenders
	// wait for this round), and the replicas that answered report every
	// chain it belongs to.
	type answer struct {
		addr string
		resp *catenapb.StatusResponse
	}
	answers := make(chan answer, len(addrs))
	for addr := range addrs {
		go func() {
			var resp *catenapb.StatusResponse
			defer func() { answers <- answer{addr, resp} }()
			conn, err := d.srv.pool.Get(addr)
			if err != nil {
				return
			}
			pctx, pcancel := context.WithTimeout(ctx, statusProbeTimeout)
			defer pcancel()
			if r, err := catenapb.NewReplicaClient(conn).Status(pctx, &catenapb.StatusRequest{}); err == nil {
				resp = r
			}
		}()
	}
	now := time.Now()
	timeout := time.NewTimer(statusProbeTimeout)
	defer timeout.Stop()
	var grace <-chan time.Time
wait:
	for range len(addrs) {
		select {
		case a := <-answers:
			if a.resp != nil {
				d.mu.Lock()
				d.last[a.addr] = lastReport{a.resp, now}
				d.mu.Unlock()
				if grace == nil {
					grace = time.After(statusStraggleGrace)
				}
			}
		case <-grace:
			break wait
		case <-timeout.C:
			break wait
		}
	}
	// A replica that did not answer in time keeps its last report for a
	// while: it still names the chains it belongs to (a stale epoch loses
	// to the others' newer one in buildRoutes), and a slow round must not
	// make streams vanish from the table.
	d.mu.Lock()
	var reports []*catenapb.StatusResponse
	for addr, r := range d.last {
		if now.Sub(r.at) > reportMaxAge {
			delete(d.last, addr)
			continue
		}
		reports = append(reports, r.resp)
	}
	t := buildRoutes(reports, d.seeds)
	d.table = t
	close(d.updated)
	d.updated = make(chan struct{})
	d.mu.Unlock()
}

// updatedChan returns a channel closed after the next refresh.
func (d *discovery) updatedChan() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.updated
}

// requestRefresh asks the loop for an early refresh and returns a channel
// closed once the next refresh has finished.
func (d *discovery) requestRefresh() <-chan struct{} {
	d.mu.Lock()
	ch := d.updated
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
	return ch
}

func (d *discovery) loop(ctx context.Context) {
	t := time.NewTicker(d.interval)
	defer t.Stop()
	interval := d.srv.metrics.discoveryRounds.WithLabelValues("interval")
	requested := d.srv.metrics.discoveryRounds.WithLabelValues("request")
	for {
		d.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			interval.Inc()
		case <-d.kick:
			requested.Inc()
		}
	}
}
