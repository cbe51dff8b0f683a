package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// A GroupConsumer is one member of a consumer group: the group's members
// share the stream's partitions, each reading its own, and commit the
// offsets they processed, from which a partition's next owner resumes
// after a member leaves or dies. It speaks Kafka's classic group protocol
// (through the Groups service) with the range assignor and Kafka's
// consumer encoding, so Kafka clients using "range" can be members of the
// same group.
//
// Rebalancing is eager: when the group changes, the member stops reading
// its partitions, joins again and reads those it is given from their
// committed offsets. Records delivered but not committed before that are
// read again by their next owner: delivery is at least once, and Commit
// after processing is what bounds the re-reading.
type GroupConsumer struct {
	c    *Client
	opts GroupOptions

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// batches carries records from the partition readers to Poll.
	batches chan groupBatch

	mu         sync.Mutex
	memberID   string
	generation int32
	assigned   []uint32
	// serial counts the generations this member served.
	serial uint64
	// positions is, per assigned partition, the offset after the last
	// record Poll delivered: what Commit commits; from is where this
	// generation started reading each (what it may commit from).
	positions, from map[uint32]uint64
	// joined is closed when the first generation's assignment arrived.
	joined chan struct{}
	err    error
}

// GroupOptions configure a GroupConsumer.
type GroupOptions struct {
	Group  string
	Stream string
	// ClientID names the member in DescribeGroup ("catena-go" when empty).
	ClientID string
	// SessionTimeout: a member not heard from for this long is removed
	// and its partitions given to the others (45 s when 0, Kafka's
	// default; at least 6 s).
	SessionTimeout time.Duration
	// RebalanceTimeout bounds how long a rebalance waits for members to
	// join again (60 s when 0).
	RebalanceTimeout time.Duration
	// HeartbeatInterval (3 s when 0; keep it well under SessionTimeout).
	HeartbeatInterval time.Duration
	// Start is where a partition the group never committed is read from
	// (Earliest when zero).
	Start Position
	// MaxBytes per fetch of one partition (the server's choice when 0).
	MaxBytes uint32
}

type groupBatch struct {
	serial    uint64
	partition uint32
	msgs      []Message
}

// consumerProtocol is the protocol type of Kafka consumers, and
// rangeAssignor the assignor this client runs.
const (
	consumerProtocol = "consumer"
	rangeAssignor    = "range"
)

// JoinGroup starts a member of opts.Group reading opts.Stream. It returns
// at once; Poll delivers records once the group assigned partitions. The
// member lives until ctx ends or Close (pass a ctx that outlives it, not
// a call's timeout).
func (c *Client) JoinGroup(ctx context.Context, opts GroupOptions) (*GroupConsumer, error) {
	if opts.Group == "" || opts.Stream == "" {
		return nil, errors.New("catena: a group consumer needs a group and a stream")
	}
	if opts.ClientID == "" {
		opts.ClientID = "catena-go"
	}
	if opts.SessionTimeout == 0 {
		opts.SessionTimeout = 45 * time.Second
	}
	if opts.RebalanceTimeout == 0 {
		opts.RebalanceTimeout = 60 * time.Second
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 3 * time.Second
	}
	if opts.HeartbeatInterval >= opts.SessionTimeout {
		return nil, fmt.Errorf("catena: heartbeat interval %v must be below the session timeout %v", opts.HeartbeatInterval, opts.SessionTimeout)
	}
	gctx, cancel := context.WithCancel(ctx)
	g := &GroupConsumer{c: c, opts: opts, ctx: gctx, cancel: cancel, done: make(chan struct{}), batches: make(chan groupBatch, 16),
		positions: map[uint32]uint64{}, joined: make(chan struct{})}
	go g.run()
	return g, nil
}

// reason is the ErrorInfo reason of a Groups refusal, and its metadata.
func reason(err error) (string, map[string]string) {
	st, ok := status.FromError(err)
	if !ok {
		return "", nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason(), info.GetMetadata()
		}
	}
	return "", nil
}

// fatal reports whether err ends the member rather than being retried:
// bad input, or a refusal of access.
func fatal(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

func (g *GroupConsumer) fail(err error) {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.mu.Unlock()
	g.cancel()
}

func (g *GroupConsumer) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-g.ctx.Done():
		return false
	}
}

// run joins, reads the assigned partitions and heartbeats, and does it
// again at every rebalance, until Close.
func (g *GroupConsumer) run() {
	defer close(g.done)
	backoff := 100 * time.Millisecond
	for g.ctx.Err() == nil {
		assignment, err := g.joinAndSync()
		if err != nil {
			if g.ctx.Err() != nil {
				return
			}
			if fatal(err) {
				g.fail(fmt.Errorf("catena: group %q: %w", g.opts.Group, err))
				return
			}
			g.sleep(backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		if g.serveGeneration(assignment) {
			backoff = 100 * time.Millisecond
			continue
		}
		// The generation could not start (its partitions' offsets were
		// not to be had): wait before joining again, which rebalances
		// the whole group.
		g.sleep(backoff)
		backoff = min(2*backoff, 2*time.Second)
	}
}

// joinAndSync joins the group's next generation and returns this
// member's partitions of the stream.
func (g *GroupConsumer) joinAndSync() ([]uint32, error) {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{g.opts.Stream}
	groups := g.c.Groups()
	for {
		g.mu.Lock()
		memberID := g.memberID
		g.mu.Unlock()
		req := &catenapb.JoinGroupRequest{Group: g.opts.Group, Stream: g.opts.Stream, MemberId: memberID, ClientId: g.opts.ClientID,
			ProtocolType: consumerProtocol, Protocols: []*catenapb.GroupProtocol{{Name: rangeAssignor, Metadata: meta.AppendTo(nil)}},
			SessionTimeoutMs: uint32(g.opts.SessionTimeout / time.Millisecond), RebalanceTimeoutMs: uint32(g.opts.RebalanceTimeout / time.Millisecond)}
		resp, err := groups.JoinGroup(g.ctx, req)
		if err != nil {
			switch r, md := reason(err); r {
			case contract.GroupMemberIDRequired:
				g.setMember(md["member_id"], -1)
				continue
			case contract.GroupUnknownMember:
				g.setMember("", -1)
			}
			return nil, err
		}
		g.setMember(resp.GetMemberId(), resp.GetGeneration())
		sync := &catenapb.SyncGroupRequest{Group: g.opts.Group, Stream: g.opts.Stream, Generation: resp.GetGeneration(), MemberId: resp.GetMemberId()}
		if resp.GetLeader() == resp.GetMemberId() {
			if resp.GetProtocol() != rangeAssignor {
				return nil, status.Errorf(codes.InvalidArgument, "the group chose assignor %q; this client runs only %q", resp.GetProtocol(), rangeAssignor)
			}
			if sync.Assignments, err = g.assign(resp.GetMembers()); err != nil {
				return nil, err
			}
		}
		sresp, err := groups.SyncGroup(g.ctx, sync)
		if err != nil {
			if r, _ := reason(err); r == contract.GroupUnknownMember {
				g.setMember("", -1)
			}
			return nil, err
		}
		var a kmsg.ConsumerMemberAssignment
		if len(sresp.GetAssignment()) > 0 {
			if err := a.ReadFrom(sresp.GetAssignment()); err != nil {
				return nil, fmt.Errorf("the leader's assignment does not decode: %w", err)
			}
		}
		var parts []uint32
		for _, t := range a.Topics {
			if t.Topic != g.opts.Stream {
				continue
			}
			for _, p := range t.Partitions {
				parts = append(parts, uint32(p))
			}
		}
		slices.Sort(parts)
		return parts, nil
	}
}

func (g *GroupConsumer) setMember(id string, generation int32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.memberID, g.generation = id, generation
}

// assign runs the range assignor as the group's leader: each stream's
// partitions in consecutive ranges over the members subscribed to it, in
// member id order, the first members taking one more when they do not
// divide evenly (Kafka's RangeAssignor).
func (g *GroupConsumer) assign(members []*catenapb.JoinGroupMember) ([]*catenapb.MemberAssignment, error) {
	subs := map[string][]string{} // member -> streams
	counts := map[string]int{}
	for _, m := range members {
		var meta kmsg.ConsumerMemberMetadata
		if err := meta.ReadFrom(m.GetMetadata()); err != nil {
			return nil, fmt.Errorf("member %s's subscription does not decode: %w", m.GetMemberId(), err)
		}
		subs[m.GetMemberId()] = meta.Topics
		for _, t := range meta.Topics {
			if _, ok := counts[t]; ok {
				continue
			}
			d, err := g.c.Describe(g.ctx, t)
			if status.Code(err) == codes.NotFound {
				// A stream that does not exist (yet) gets no partitions.
				counts[t] = 0
				continue
			}
			if err != nil {
				// Assigning nothing would leave the stream unread until
				// the group changes: join again instead.
				return nil, fmt.Errorf("describe stream %q to assign it: %w", t, err)
			}
			counts[t] = len(d.GetPartitions())
		}
	}
	plan := rangeAssign(subs, counts)
	var out []*catenapb.MemberAssignment
	for _, m := range members {
		a := kmsg.NewConsumerMemberAssignment()
		for _, t := range sortedKeys(plan[m.GetMemberId()]) {
			at := kmsg.NewConsumerMemberAssignmentTopic()
			at.Topic = t
			for _, p := range plan[m.GetMemberId()][t] {
				at.Partitions = append(at.Partitions, int32(p))
			}
			a.Topics = append(a.Topics, at)
		}
		out = append(out, &catenapb.MemberAssignment{MemberId: m.GetMemberId(), Assignment: a.AppendTo(nil)})
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// rangeAssign is the range assignment of partitions counts[stream] among
// the members subscribed to each stream (subs: member -> streams).
func rangeAssign(subs map[string][]string, counts map[string]int) map[string]map[string][]uint32 {
	out := map[string]map[string][]uint32{}
	for _, t := range sortedKeys(counts) {
		var members []string
		for m, ts := range subs {
			if slices.Contains(ts, t) {
				members = append(members, m)
			}
		}
		if len(members) == 0 {
			continue
		}
		sort.Strings(members)
		n := counts[t]
		each, extra := n/len(members), n%len(members)
		next := 0
		for i, m := range members {
			k := each
			if i < extra {
				k++
			}
			for p := next; p < next+k; p++ {
				if out[m] == nil {
					out[m] = map[string][]uint32{}
				}
				out[m][t] = append(out[m][t], uint32(p))
			}
			next += k
		}
	}
	return out
}

// serveGeneration reads the partitions of one generation and heartbeats
// until the group rebalances (or the member is closed). It reports
// whether the generation started.
func (g *GroupConsumer) serveGeneration(parts []uint32) bool {
	g.mu.Lock()
	gen, memberID := g.generation, g.memberID
	g.mu.Unlock()
	start, err := g.startOffsets(parts)
	if err != nil {
		if fatal(err) {
			g.fail(fmt.Errorf("catena: group %q: committed offsets: %w", g.opts.Group, err))
		}
		return false
	}
	g.mu.Lock()
	// serial tells this generation's batches from any before it, even
	// one of the same number (a restarted coordinator counts again).
	g.serial++
	serial := g.serial
	g.assigned = parts
	// Copies: Poll writes positions under g.mu while the readers below
	// still read start, each as it begins, without it.
	g.positions = maps.Clone(start)
	g.from = maps.Clone(start)
	g.mu.Unlock()
	select {
	case <-g.joined:
	default:
		close(g.joined)
	}

	genCtx, stop := context.WithCancel(g.ctx)
	var readers sync.WaitGroup
	for _, p := range parts {
		readers.Add(1)
		go func() {
			defer readers.Done()
			g.read(genCtx, serial, p, start[p])
		}()
	}
	defer func() {
		// Nothing of this generation is committed or delivered once it
		// ended: its partitions may be another member's.
		g.mu.Lock()
		g.assigned = nil
		g.mu.Unlock()
		stop()
		readers.Wait()
	}()

	lastOK := time.Now()
	t := time.NewTicker(g.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return true
		case <-t.C:
		}
		hctx, cancel := context.WithTimeout(g.ctx, g.opts.SessionTimeout/3)
		_, err := g.c.Groups().Heartbeat(hctx, &catenapb.HeartbeatRequest{Group: g.opts.Group, Stream: g.opts.Stream, Generation: gen, MemberId: memberID})
		cancel()
		if err == nil {
			lastOK = time.Now()
			continue
		}
		switch r, _ := reason(err); r {
		case contract.GroupRebalanceInProgress, contract.GroupIllegalGeneration:
			return true
		case contract.GroupUnknownMember:
			g.setMember("", -1)
			return true
		}
		if fatal(err) {
			g.fail(fmt.Errorf("catena: group %q: heartbeat: %w", g.opts.Group, err))
			return true
		}
		// Unreachable: once the session has surely expired, the
		// partitions are someone else's.
		if time.Since(lastOK) > g.opts.SessionTimeout {
			g.setMember("", -1)
			return true
		}
	}
}

// startOffsets is where each partition is read from: the group's
// committed offset, or Start for one it never committed.
func (g *GroupConsumer) startOffsets(parts []uint32) (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	if len(parts) == 0 {
		return out, nil
	}
	d, err := g.c.DescribeGroup(g.ctx, g.opts.Group, g.opts.Stream)
	if err != nil && status.Code(err) != codes.NotFound {
		return nil, err
	}
	committed := map[uint32]uint64{}
	for _, o := range d.GetOffsets() {
		committed[o.GetPartition()] = o.GetOffset()
	}
	for _, p := range parts {
		if o, ok := committed[p]; ok {
			out[p] = o
			continue
		}
		o, err := g.c.Resolve(g.ctx, g.opts.Stream, p, g.opts.Start)
		if err != nil {
			return nil, err
		}
		out[p] = o
	}
	return out, nil
}

// read long-polls one partition from next and hands each batch to Poll.
func (g *GroupConsumer) read(ctx context.Context, serial uint64, p uint32, next uint64) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		res, err := g.c.Fetch(ctx, g.opts.Stream, p, next, g.opts.MaxBytes, 5*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if fatal(err) {
				g.fail(fmt.Errorf("catena: group %q: read %s/%d: %w", g.opts.Group, g.opts.Stream, p, err))
				return
			}
			if status.Code(err) == codes.OutOfRange {
				// Trimmed past the committed offset (a forced trim):
				// go on from the first record kept.
				if start, lerr := g.c.Resolve(ctx, g.opts.Stream, p, Earliest); lerr == nil && start > next {
					next = start
					continue
				}
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		if len(res.Messages) > 0 {
			select {
			case g.batches <- groupBatch{serial: serial, partition: p, msgs: res.Messages}:
			case <-ctx.Done():
				return
			}
		}
		if res.NextOffset > next {
			next = res.NextOffset
		}
	}
}

// Poll returns the next records of the member's partitions, waiting for
// some; records of a partition come in offset order. It returns the
// member's error once it failed for good (bad input, access refused),
// and ctx's error when ctx ends.
func (g *GroupConsumer) Poll(ctx context.Context) ([]Message, error) {
	for {
		select {
		case b := <-g.batches:
			g.mu.Lock()
			if b.serial != g.serial || !slices.Contains(g.assigned, b.partition) {
				// Read for a generation that ended: its partition may be
				// someone else's now.
				g.mu.Unlock()
				continue
			}
			g.positions[b.partition] = b.msgs[len(b.msgs)-1].Offset + 1
			g.mu.Unlock()
			return b.msgs, nil
		case <-g.done:
			return nil, g.Err()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Err is the error the member failed with (nil while it runs).
func (g *GroupConsumer) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	if g.ctx.Err() != nil {
		return errors.New("catena: group consumer closed")
	}
	return nil
}

// Assigned is the member's partitions in the current generation (none
// while the group rebalances).
func (g *GroupConsumer) Assigned() []uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.assigned)
}

// WaitAssigned waits until the member had its first assignment.
func (g *GroupConsumer) WaitAssigned(ctx context.Context) error {
	select {
	case <-g.joined:
		return nil
	case <-g.done:
		return g.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Commit commits, for each partition of the current generation, the
// offset after the last record Poll delivered: the group resumes there.
// It fails (codes.FailedPrecondition) when the group has rebalanced since
// those records were delivered; they are then another member's to read
// (again).
func (g *GroupConsumer) Commit(ctx context.Context) error {
	g.mu.Lock()
	req := &catenapb.CommitGroupOffsetsRequest{Group: g.opts.Group, Stream: g.opts.Stream, Generation: g.generation, MemberId: g.memberID}
	for _, p := range g.assigned {
		req.Offsets = append(req.Offsets, &catenapb.PartitionOffset{Partition: p, Offset: g.positions[p]})
	}
	g.mu.Unlock()
	if len(req.Offsets) == 0 || req.Generation < 0 || req.MemberId == "" {
		return status.Error(codes.FailedPrecondition, "catena: the group is rebalancing: no partition to commit")
	}
	_, err := g.c.Groups().CommitGroupOffsets(ctx, req)
	return err
}

// CommitMessages commits, for each partition of the current generation
// among msgs, the offset after the last of its msgs: for a consumer that
// processed only part of what Poll delivered. It fails as Commit does.
func (g *GroupConsumer) CommitMessages(ctx context.Context, msgs ...Message) error {
	next := map[uint32]uint64{}
	for _, m := range msgs {
		if m.Stream == g.opts.Stream && m.Offset+1 > next[m.Partition] {
			next[m.Partition] = m.Offset + 1
		}
	}
	g.mu.Lock()
	req := &catenapb.CommitGroupOffsetsRequest{Group: g.opts.Group, Stream: g.opts.Stream, Generation: g.generation, MemberId: g.memberID}
	for _, p := range g.assigned {
		// Only what this generation delivered: a message of an earlier
		// one may be behind what another member committed since.
		if o, ok := next[p]; ok && o > g.from[p] && o <= g.positions[p] {
			req.Offsets = append(req.Offsets, &catenapb.PartitionOffset{Partition: p, Offset: o})
		}
	}
	g.mu.Unlock()
	if len(next) == 0 {
		return nil
	}
	if len(req.Offsets) < len(next) || req.Generation < 0 || req.MemberId == "" {
		return status.Error(codes.FailedPrecondition, "catena: some of the messages were not delivered to this member in the group's current generation: not committed")
	}
	_, err := g.c.Groups().CommitGroupOffsets(ctx, req)
	return err
}

// Close leaves the group, so that the others are given its partitions at
// once rather than after its session timeout. It does not commit.
func (g *GroupConsumer) Close(ctx context.Context) error {
	g.cancel()
	<-g.done
	g.mu.Lock()
	memberID := g.memberID
	g.mu.Unlock()
	if memberID == "" {
		return nil
	}
	_, err := g.c.Groups().LeaveGroup(ctx, &catenapb.LeaveGroupRequest{Group: g.opts.Group, Stream: g.opts.Stream, MemberId: memberID})
	if r, _ := reason(err); r == contract.GroupUnknownMember {
		return nil
	}
	return err
}
