// Package probe asks a set of servers for their status, each on its own
// cadence and deadline, for the masters that decide from what they answer:
// the chain masters (replica/chainmaster.Observer: replicas' Status) and
// the operator's Aggregation controller (workers' Status). A server that
// hangs holds up only its own probes, and a master that decides reads the
// latest outcomes instead of calling anyone.
package probe

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/catena-streams/catena/rpc/transport"
)

// Ask makes one probe of the server id through conn, on ctx's deadline.
type Ask[R any] func(ctx context.Context, conn *grpc.ClientConn, id string) (R, error)

// Options configure a Set.
type Options struct {
	// Interval is the time between the starts of two probes of one server
	// (a probe that takes longer is followed at once by the next).
	Interval time.Duration
	// CallTimeout bounds each probe: an answer that takes long still
	// proves the server alive.
	CallTimeout time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Probed, when set, is called after each probe of id with its outcome
	// (outside the Set's lock): a master that wants waking on a change
	// looks there.
	Probed func(id string)
}

// Result is what the probes of one server have learned.
type Result[R any] struct {
	// Addr is where it is probed; Added when it was added at that address.
	Addr  string
	Added time.Time
	// Resp is its latest answer, if Answered ever.
	Resp     R
	Answered bool
	// AskedOK is when the latest answer was asked for, GotOK when it
	// arrived (zero once a later probe was refused: a refusal ends an
	// answer's freshness at once, a hang only when it runs out).
	AskedOK, GotOK time.Time
	// AskedEnd is when the latest completed probe, answered or not, was
	// asked for.
	AskedEnd time.Time
	// Latency is the smoothed time its answers take.
	Latency time.Duration
}

// Probed reports whether the server has been probed at least once since
// it was added, answered or not: a master decides nothing about a server
// not asked yet.
func (r Result[R]) Probed() bool {
	return !r.AskedEnd.IsZero() && !r.AskedEnd.Before(r.Added)
}

// Fresh reports whether the latest answer is the server's current one at
// now: it arrived at most window ago, plus twice the time its answers
// take, so that a server that answers slowly but steadily stays answered,
// and no probe was refused since.
func (r Result[R]) Fresh(now time.Time, window time.Duration) bool {
	return !r.GotOK.IsZero() && now.Sub(r.GotOK) <= window+2*r.Latency
}

// Set probes a set of servers, each in a goroutine of its own.
type Set[R any] struct {
	conns *transport.Pool
	ask   Ask[R]
	opts  Options
	now   func() time.Time

	mu      sync.Mutex
	probers map[string]*prober[R]
	stopped bool
}

type prober[R any] struct {
	cancel context.CancelFunc
	poke   chan struct{}
	res    Result[R]
}

// NewSet returns a Set without servers; SetTargets gives it some.
func NewSet[R any](conns *transport.Pool, ask Ask[R], opts Options) *Set[R] {
	s := &Set[R]{conns: conns, ask: ask, opts: opts, now: opts.Now, probers: map[string]*prober[R]{}}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// SetTargets makes the Set probe exactly addrs (server id to address):
// probes start for new servers or new addresses, and stop for servers no
// longer listed.
func (s *Set[R]) SetTargets(addrs map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, p := range s.probers {
		if addr, ok := addrs[id]; !ok || addr != p.res.Addr {
			p.cancel()
			delete(s.probers, id)
		}
	}
	for id, addr := range addrs {
		if _, ok := s.probers[id]; !ok {
			s.startLocked(id, addr)
		}
	}
}

// AddTargets makes the Set probe addrs too, keeping the others.
func (s *Set[R]) AddTargets(addrs map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, addr := range addrs {
		if p, ok := s.probers[id]; ok && p.res.Addr == addr {
			continue
		}
		s.startLocked(id, addr)
	}
}

// startLocked (re)starts id's probes at addr; s.mu is held.
func (s *Set[R]) startLocked(id, addr string) {
	if s.stopped {
		return
	}
	if p, ok := s.probers[id]; ok {
		p.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober[R]{cancel: cancel, poke: make(chan struct{}, 1), res: Result[R]{Addr: addr, Added: s.now()}}
	s.probers[id] = p
	go s.run(ctx, id, p)
}

// Targets is the set of servers probed, with their addresses.
func (s *Set[R]) Targets() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.probers))
	for id, p := range s.probers {
		out[id] = p.res.Addr
	}
	return out
}

// Results are the latest outcomes of every server's probes.
func (s *Set[R]) Results() map[string]Result[R] {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Result[R], len(s.probers))
	for id, p := range s.probers {
		out[id] = p.res
	}
	return out
}

// Poke has every server probed now, not at its next interval: a master
// that just acted wants to see the outcome.
func (s *Set[R]) Poke() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.probers {
		select {
		case p.poke <- struct{}{}:
		default:
		}
	}
}

// Interval is the time between the starts of two probes of one server.
func (s *Set[R]) Interval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.Interval
}

// SetInterval changes the time between probes. Each server is probed at
// once, then on the new cadence: a prober waiting out a long old interval
// does not hold a shorter new one back.
func (s *Set[R]) SetInterval(d time.Duration) {
	s.mu.Lock()
	changed := d != s.opts.Interval
	s.opts.Interval = d
	s.mu.Unlock()
	if changed {
		s.Poke()
	}
}

// Stop ends every probe; the Set probes nothing afterwards.
func (s *Set[R]) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for id, p := range s.probers {
		p.cancel()
		delete(s.probers, id)
	}
}

// Stopped reports whether Stop was called.
func (s *Set[R]) Stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

func (s *Set[R]) run(ctx context.Context, id string, p *prober[R]) {
	for {
		start, asked := time.Now(), s.now()
		resp, err := s.probe(ctx, id, p.res.Addr)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		r := &p.res
		if err == nil {
			r.Resp, r.Answered, r.AskedOK, r.GotOK = resp, true, asked, s.now()
			took := r.GotOK.Sub(asked)
			if r.Latency == 0 {
				r.Latency = took
			} else {
				r.Latency += (took - r.Latency) / 4
			}
		} else {
			r.GotOK = time.Time{}
		}
		r.AskedEnd = asked
		s.mu.Unlock()
		if s.opts.Probed != nil {
			s.opts.Probed(id)
		}

		t := time.NewTimer(max(time.Until(start.Add(s.Interval())), 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.poke:
			t.Stop()
		case <-t.C:
		}
	}
}

func (s *Set[R]) probe(ctx context.Context, id, addr string) (R, error) {
	conn, err := s.conns.Get(addr)
	if err != nil {
		var zero R
		return zero, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	return s.ask(cctx, conn, id)
}
