// Package groups is ingestion's consumer-group coordinator: the members of
// a group join it, one of them (the leader) assigns the partitions of the
// group's topics among all, and each commits the offsets it consumed. It
// is Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat,
// LeaveGroup, OffsetCommit, OffsetFetch), so an unchanged Kafka client runs
// its own assignor (range, cooperative-sticky, ...) on top of it; the
// coordinator never reads the assignment it passes on.
//
// Membership lives in memory: a coordinator that restarts answers the
// members' next heartbeat with UnknownMemberID and they join again, as
// after a Kafka coordinator's failover. Committed offsets are durable:
// an Offsets store writes them to an internal Catena stream and holds them
// as retention holds before a commit is answered, and a coordinator loads
// them back before it serves anything.
//
// Every decision is taken under one lock from the request and the clock
// the Coordinator was given; Tick applies the deadlines (session expiry,
// rebalance timeout). Tests drive both.
package groups

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// State is a group's state, named as Kafka's DescribeGroups reports it.
type State string

const (
	// Empty: no members; the group may still have committed offsets.
	Empty State = "Empty"
	// PreparingRebalance: waiting for every member to join again.
	PreparingRebalance State = "PreparingRebalance"
	// CompletingRebalance: joined; waiting for the leader's assignment.
	CompletingRebalance State = "CompletingRebalance"
	// Stable: every member has its assignment.
	Stable State = "Stable"
	// Dead: deleted.
	Dead State = "Dead"
)

// Code is a refusal the group protocol defines; the Kafka listener maps
// each to its Kafka error code.
type Code int

const (
	OK Code = iota
	UnknownMemberID
	IllegalGeneration
	RebalanceInProgress
	MemberIDRequired
	InconsistentGroupProtocol
	InvalidSessionTimeout
	InvalidGroupID
	GroupIDNotFound
	NonEmptyGroup
	CoordinatorLoadInProgress
	CoordinatorNotAvailable
	UnknownTopicOrPartition
	GroupMaxSizeReached
	// NotCoordinator: another node coordinates the group (Membership).
	NotCoordinator
	// HoldsFull: a partition has no room for the group's retention hold
	// (contract.MaxHoldsPerPartition), so its offset is not committed.
	HoldsFull
)

var codeNames = map[Code]string{
	OK: "ok", UnknownMemberID: "unknown member id", IllegalGeneration: "illegal generation",
	RebalanceInProgress: "rebalance in progress", MemberIDRequired: "member id required",
	InconsistentGroupProtocol: "inconsistent group protocol", InvalidSessionTimeout: "invalid session timeout",
	InvalidGroupID: "invalid group id", GroupIDNotFound: "group not found", NonEmptyGroup: "group not empty",
	CoordinatorLoadInProgress: "coordinator loading", CoordinatorNotAvailable: "coordinator not available",
	UnknownTopicOrPartition: "unknown topic or partition", GroupMaxSizeReached: "group full",
	NotCoordinator: "not the coordinator", HoldsFull: "partition's retention holds full",
}

func (c Code) String() string { return codeNames[c] }

// Error is a refusal with its reason.
type Error struct {
	Code   Code
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Reason) }

func refuse(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Reason: fmt.Sprintf(format, args...)}
}

// CodeOf is err's Code: OK for nil, CoordinatorNotAvailable for an error
// that is not an *Error (a store that failed).
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CoordinatorNotAvailable
}

// Protocol is one assignment protocol a member can run, with its metadata
// (for a consumer: the topics it subscribes to, in the assignor's
// encoding).
type Protocol struct {
	Name     string
	Metadata []byte
}

// JoinRequest is a member's JoinGroup.
type JoinRequest struct {
	Group string
	// MemberID is empty on a member's first join.
	MemberID   string
	ClientID   string
	ClientHost string
	// ProtocolType is "consumer" for consumers; every member of a group
	// must agree on it.
	ProtocolType     string
	Protocols        []Protocol
	SessionTimeout   time.Duration
	RebalanceTimeout time.Duration
	// RequireKnownMember: a first join is answered MemberIDRequired with
	// the member's id, which it joins with again (KIP-394; JoinGroup v4+),
	// so a client that times out does not leave a member behind.
	RequireKnownMember bool
}

// JoinMember is one member as the leader sees it in its JoinResult.
type JoinMember struct {
	ID       string
	Metadata []byte
}

// JoinResult answers a JoinRequest.
type JoinResult struct {
	Err          *Error
	Generation   int32
	ProtocolType string
	Protocol     string
	Leader       string
	MemberID     string
	// Members is set for the leader only: every member and its metadata
	// for Protocol, which the leader assigns partitions to.
	Members []JoinMember
}

// SyncRequest is a member's SyncGroup; the leader's carries every
// member's assignment.
type SyncRequest struct {
	Group       string
	Generation  int32
	MemberID    string
	Assignments map[string][]byte
}

// SyncResult answers a SyncRequest with the member's assignment.
type SyncResult struct {
	Err          *Error
	ProtocolType string
	Protocol     string
	Assignment   []byte
}

// TopicPartition names one partition of a topic (a Catena stream).
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Committed is a group's committed position in one partition: the offset
// of the next record it will read.
type Committed struct {
	Offset      int64
	LeaderEpoch int32
	Metadata    string
	// At is when it was committed (Unix milliseconds).
	At int64
}

// Commit is one partition's offset to commit.
type Commit struct {
	TopicPartition
	Committed
}

// Offsets stores committed offsets durably.
type Offsets interface {
	// Load returns every group's committed offsets as stored now,
	// including what other nodes stored since the last Load.
	Load(ctx context.Context) (map[string]map[TopicPartition]Committed, error)
	// Commit stores a group's offsets durably (and holds them from
	// retention). It returns one error per commit (nil: stored and held;
	// one IsStored reports: stored, and not held for good); an error for
	// all of them instead when nothing was stored.
	Commit(ctx context.Context, group string, commits []Commit) ([]error, error)
	// Delete forgets a group's offsets and releases its holds. An error
	// wrapping ErrHoldsRemain means the deletion is stored but holds
	// remain; any other, that nothing changed.
	Delete(ctx context.Context, group string, topics []string) error
	// Holds returns where the groups' retention holds are on the
	// partitions of topics: per group, the offset every member of a
	// partition's chain holds it at. A partition whose members lack the
	// hold or do not agree is absent, as is a topic that does not exist,
	// and one that could not be listed (with an error, beside what was).
	Holds(ctx context.Context, groups, topics []string) (map[string]map[TopicPartition]int64, error)
	// MoveHolds moves the group's hold on each commit's partition to its
	// offset, backward too; one error per commit (nil: moved; one
	// wrapping ErrPartitionGone: the partition no longer exists).
	MoveHolds(ctx context.Context, group string, commits []Commit) []error
}

// Options configure a Coordinator.
type Options struct {
	Offsets Offsets
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// MinSessionTimeout and MaxSessionTimeout bound a member's session
	// timeout (Kafka's group.min/max.session.timeout.ms: 6 s and 30 min).
	MinSessionTimeout, MaxSessionTimeout time.Duration
	// InitialRebalanceDelay is how long a group with no members waits for
	// more to join before its first generation (Kafka's
	// group.initial.rebalance.delay.ms: 3 s, the default; negative: no
	// delay), so that consumers started together get one rebalance rather
	// than one each.
	InitialRebalanceDelay time.Duration
	// MaxSize bounds a group's members (0: no bound).
	MaxSize int
	// OffsetsRetention is how long a group without members keeps its
	// committed offsets, and so its retention holds, after it was last
	// seen with members or last committed, whichever is later (Kafka's
	// offsets.retention.minutes; 0: DefaultOffsetsRetention; negative:
	// until deleted). An ad-hoc group (a console consumer, kcat -G) would
	// otherwise hold its partitions from retention for ever.
	OffsetsRetention time.Duration
	// Logger is told of each generation and of each member whose
	// session expired.
	Logger logr.Logger
	// Membership, when set, is the nodes that share the groups: the
	// coordinator serves the groups it owns and refuses the others with
	// NotCoordinator. When the list changes it loads the offsets again
	// before it serves, so a group it has just been given starts from
	// what its previous coordinator stored, and forgets the members of
	// the groups it lost (they join their new coordinator). Nil: it
	// coordinates every group.
	Membership *Membership
}

// MaxOffsetMetadata bounds a committed offset's metadata (Kafka's
// offset.metadata.max.bytes default).
const MaxOffsetMetadata = 4096

// Defaults for Options.
const (
	DefaultMinSessionTimeout     = 6 * time.Second
	DefaultMaxSessionTimeout     = 30 * time.Minute
	DefaultInitialRebalanceDelay = 3 * time.Second
	DefaultOffsetsRetention      = 7 * 24 * time.Hour
)

type member struct {
	id, clientID, clientHost string
	session, rebalance       time.Duration
	protocols                []Protocol
	assignment               []byte
	// deadline is when the member's session expires unless it heartbeats.
	deadline time.Time
	// join and sync are the member's waiting JoinGroup and SyncGroup.
	join chan JoinResult
	sync chan SyncResult
}

func (m *member) metadataFor(protocol string) []byte {
	for _, p := range m.protocols {
		if p.Name == protocol {
			return p.Metadata
		}
	}
	return nil
}

func (m *member) supports(protocol string) bool {
	for _, p := range m.protocols {
		if p.Name == protocol {
			return true
		}
	}
	return false
}

type group struct {
	name         string
	state        State
	generation   int32
	protocolType string
	protocol     string
	leader       string
	members      map[string]*member
	// order is the members' ids in the order they joined; the first is
	// the leader when the leader left.
	order []string
	// pending are ids handed out with MemberIDRequired, until the member
	// joins with one or its session timeout passes.
	pending map[string]time.Time
	// rebalanceDeadline ends PreparingRebalance: members that have not
	// joined again by then are removed.
	rebalanceDeadline time.Time
	// delayUntil holds an empty group's first rebalance open for more
	// members (InitialRebalanceDelay).
	delayUntil time.Time
	offsets    map[TopicPartition]Committed
	// activeAt is when the group was last seen with members (by
	// ExpireOffsets), or loaded.
	activeAt time.Time
	// commitMu orders a group's commits: one at a time reaches the store,
	// so the store's order is the order they are applied in.
	commitMu sync.Mutex
}

// Coordinator coordinates every group of one ingestion node.
type Coordinator struct {
	opts Options
	now  func() time.Time

	loadMu sync.Mutex
	loaded bool
	// loadedAt is the Membership version the offsets were loaded at.
	loadedAt uint64
	// storeMu keeps loads and writes to the store apart: commits and
	// deletions hold it shared while they write and apply, a load
	// exclusively, so a load's view never replaces a write it did not
	// read.
	storeMu sync.RWMutex

	mu     sync.Mutex
	groups map[string]*group
	// sortedAt is the Membership version whose lost groups Tick dropped.
	sortedAt uint64
	// holdsDue is set by a load: the groups it gave this node may have
	// holds their former coordinator left elsewhere, which Run reasserts.
	holdsDue bool
}

// New returns a Coordinator; nothing is loaded until it is first used.
func New(opts Options) *Coordinator {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MinSessionTimeout == 0 {
		opts.MinSessionTimeout = DefaultMinSessionTimeout
	}
	if opts.MaxSessionTimeout == 0 {
		opts.MaxSessionTimeout = DefaultMaxSessionTimeout
	}
	if opts.OffsetsRetention == 0 {
		opts.OffsetsRetention = DefaultOffsetsRetention
	}
	switch {
	case opts.InitialRebalanceDelay == 0:
		opts.InitialRebalanceDelay = DefaultInitialRebalanceDelay
	case opts.InitialRebalanceDelay < 0:
		opts.InitialRebalanceDelay = 0
	}
	return &Coordinator{opts: opts, now: opts.Now, groups: map[string]*group{}}
}

// TickInterval is how often Run applies the deadlines (session expiry,
// rebalance timeouts, the initial rebalance delay).
const TickInterval = 100 * time.Millisecond

// Run applies the deadlines every interval until ctx ends. Whoever makes
// a Coordinator runs it, whether a Kafka listener, the Groups service or
// both serve it: without it no first generation starts and no session
// expires.
func (c *Coordinator) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	sweep := time.NewTicker(sweepInterval)
	defer sweep.Stop()
	var sweeping sync.WaitGroup
	defer sweeping.Wait()
	busy := false
	done := make(chan struct{}, 1)
	start := func(expire bool) {
		busy = true
		sweeping.Add(1)
		go func() {
			defer sweeping.Done()
			c.sweep(ctx, expire)
			done <- struct{}{}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Tick()
			if !busy && c.takeHoldsDue() {
				start(false)
			}
		case <-done:
			busy = false
		case <-sweep.C:
			if !busy { // else the last sweep is still at work
				start(true)
			}
		}
	}
}

// sweepInterval is how often Run expires offsets and reasserts holds.
const sweepInterval = time.Minute

// sweep is Run's background work: expiring idle groups' offsets (when
// expire is set), then reasserting the holds of the groups left.
func (c *Coordinator) sweep(ctx context.Context, expire bool) {
	if expire {
		if _, err := c.ExpireOffsets(ctx); err != nil && ctx.Err() == nil {
			c.opts.Logger.V(1).Info("Could not expire consumer groups' offsets", "err", err.Error())
		}
	}
	moved, err := c.ReassertHolds(ctx)
	if err != nil && ctx.Err() == nil {
		c.opts.Logger.Info("Could not reassert every consumer group's retention holds; the next sweep tries again", "err", err.Error())
	}
	if moved > 0 {
		c.opts.Logger.Info("Moved consumer groups' retention holds that were not at their committed offsets", "partitions", moved)
	}
	// One node writes the snapshots of the offsets stream: the one that
	// would coordinate a group no client can name.
	if cp, ok := c.opts.Offsets.(compacter); ok && c.owns(snapshotOwnerKey) {
		if _, err := cp.Compact(ctx); err != nil && ctx.Err() == nil {
			c.opts.Logger.Info("Could not write a snapshot of the consumer groups' offsets; the next sweep tries again", "err", err.Error())
		}
	}
}

// compacter is an Offsets that snapshots what it stores (StreamOffsets).
type compacter interface {
	// Compact writes a snapshot when one is due, and reports whether it
	// did.
	Compact(ctx context.Context) (bool, error)
}

func (c *Coordinator) takeHoldsDue() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	due := c.holdsDue
	c.holdsDue = false
	return due
}

// ReassertHolds makes the retention holds of the groups this node
// coordinates equal their committed offsets wherever a chain member's
// differ or are missing, and returns how many partitions' holds it moved.
// A commit moves its holds after its record is stored, so a hold can be
// left behind: its move failed, or a former coordinator's move landed
// after the group had moved on (during a membership change), and a
// consumer that commits nothing new never moves it again. Run calls it
// after every load and every sweepInterval.
func (c *Coordinator) ReassertHolds(ctx context.Context) (int, error) {
	if err := c.Load(ctx); err != nil {
		return 0, err
	}
	c.takeHoldsDue() // this pass is the one a load asks for
	var names []string
	topicSet := map[string]bool{}
	c.mu.Lock()
	for name, g := range c.groups {
		if g.state == Dead || len(g.offsets) == 0 || !c.owns(name) {
			continue
		}
		names = append(names, name)
		for tp := range g.offsets {
			topicSet[tp.Topic] = true
		}
	}
	c.mu.Unlock()
	if len(names) == 0 {
		return 0, nil
	}
	sort.Strings(names)
	topics := slices.Sorted(maps.Keys(topicSet))
	// What could not be listed is absent from held, and moved again.
	held, err := c.opts.Offsets.Holds(ctx, names, topics)
	moved := 0
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("list the groups' holds: %w", err))
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		n, err := c.reassertGroupHolds(ctx, name, held[name])
		moved += n
		errs = append(errs, err)
	}
	return moved, errors.Join(errs...)
}

// reassertGroupHolds moves the holds of one group that are not where held
// says to its committed offsets. held was listed before the group's
// commits were stopped: a commit since moved its holds to where this moves
// them again.
func (c *Coordinator) reassertGroupHolds(ctx context.Context, name string, held map[TopicPartition]int64) (int, error) {
	c.mu.Lock()
	g := c.groups[name]
	c.mu.Unlock()
	if g == nil {
		return 0, nil
	}
	// As a commit does: no other commit of the group, and no load, while
	// its holds move, so a move never takes a hold back past a commit.
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	c.storeMu.RLock()
	defer c.storeMu.RUnlock()
	c.mu.Lock()
	if g.state == Dead || c.groups[name] != g || !c.owns(name) {
		c.mu.Unlock()
		return 0, nil
	}
	var moves []Commit
	for tp, o := range g.offsets {
		if at, ok := held[tp]; o.Offset >= 0 && (!ok || at != o.Offset) {
			moves = append(moves, Commit{TopicPartition: tp, Committed: o})
		}
	}
	c.mu.Unlock()
	if len(moves) == 0 {
		return 0, nil
	}
	sort.Slice(moves, func(i, j int) bool {
		a, b := moves[i].TopicPartition, moves[j].TopicPartition
		return a.Topic < b.Topic || a.Topic == b.Topic && a.Partition < b.Partition
	})
	moved := 0
	var errs []error
	for i, err := range c.opts.Offsets.MoveHolds(ctx, name, moves) {
		if errors.Is(err, ErrPartitionGone) {
			continue // its stream was deleted (or shrunk): nothing to hold
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		moved++
		c.opts.Logger.V(1).Info("Moved a consumer group's retention hold to its committed offset", "group", name, "topic", moves[i].Topic, "partition", moves[i].Partition, "offset", moves[i].Offset)
	}
	return moved, errors.Join(errs...)
}

// ExpireOffsets deletes the groups this node coordinates that have had no
// members, and no commit, for OffsetsRetention: their offsets are
// forgotten and their retention holds released, as a deletion does. A
// group without offsets is only forgotten. It returns the groups whose
// offsets it deleted.
func (c *Coordinator) ExpireOffsets(ctx context.Context) ([]string, error) {
	if c.opts.OffsetsRetention < 0 {
		return nil, nil
	}
	if err := c.Load(ctx); err != nil {
		return nil, err
	}
	now := c.now()
	var due []string
	c.mu.Lock()
	for name, g := range c.groups {
		if len(g.members) > 0 || len(g.pending) > 0 || g.state != Empty {
			g.activeAt = now
			continue
		}
		if !c.owns(name) {
			continue
		}
		last := g.activeAt
		for _, o := range g.offsets {
			last = maxTime(last, time.UnixMilli(o.At))
		}
		if now.Sub(last) < c.opts.OffsetsRetention {
			continue
		}
		if len(g.offsets) == 0 {
			delete(c.groups, name)
			continue
		}
		due = append(due, name)
	}
	c.mu.Unlock()
	sort.Strings(due)
	var expired []string
	for _, name := range due {
		err := c.Delete(ctx, name)
		switch CodeOf(err) {
		case NonEmptyGroup, GroupIDNotFound, NotCoordinator:
			// A member joined, someone deleted it or it moved meanwhile.
			continue
		}
		if err != nil && !errors.Is(err, ErrHoldsRemain) {
			return expired, fmt.Errorf("expire the offsets of group %q: %w", name, err)
		}
		c.opts.Logger.Info("consumer group's offsets expired", "group", name, "retention", c.opts.OffsetsRetention, "holdsRemain", err != nil)
		expired = append(expired, name)
	}
	return expired, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Load loads the committed offsets, once, and again whenever the
// Membership changed since; until it has succeeded every call is refused
// with CoordinatorLoadInProgress (a client retries).
func (c *Coordinator) Load(ctx context.Context) error {
	c.loadMu.Lock()
	defer c.loadMu.Unlock()
	version := c.membershipVersion()
	if c.loaded && c.loadedAt == version {
		return nil
	}
	c.storeMu.Lock()
	defer c.storeMu.Unlock()
	all, err := c.opts.Offsets.Load(ctx)
	if err != nil {
		return refuse(CoordinatorLoadInProgress, "loading committed offsets: %v", err)
	}
	c.mu.Lock()
	for name, g := range c.groups {
		if !c.owns(name) {
			c.dropLocked(g)
			continue
		}
		// The store holds every commit this node made (each was
		// committed before it was applied) and those of the group's
		// previous coordinators.
		g.offsets = map[TopicPartition]Committed{}
		for tp, o := range all[name] {
			g.offsets[tp] = o
		}
	}
	now := c.now()
	for name, offs := range all {
		if c.groups[name] != nil || !c.owns(name) {
			continue
		}
		g := c.groupLocked(name)
		for tp, o := range offs {
			g.offsets[tp] = o
		}
		// Whether it had members before this load is not stored: it is
		// given a full retention from now, so that its members have
		// rejoined before its offsets can expire.
		g.activeAt = now
	}
	// A load is a start or a change of the nodes: groups may have been
	// gained, with holds a former coordinator left behind.
	c.holdsDue = true
	c.mu.Unlock()
	c.loaded, c.loadedAt = true, version
	return nil
}

func (c *Coordinator) membershipVersion() uint64 {
	if c.opts.Membership == nil {
		return 0
	}
	return c.opts.Membership.Version()
}

// owns reports whether this node coordinates group.
func (c *Coordinator) owns(group string) bool {
	if c.opts.Membership == nil {
		return true
	}
	_, self := c.opts.Membership.Owner(group)
	return self
}

// ready is the check every call about one group starts with: the group
// is this node's, and its offsets are loaded.
func (c *Coordinator) ready(ctx context.Context, group string) error {
	if c.opts.Membership != nil {
		if p, self := c.opts.Membership.Owner(group); !self {
			return refuse(NotCoordinator, "group %q is coordinated by %s", group, p.Host)
		}
	}
	return c.Load(ctx)
}

// dropLocked forgets a group another node now coordinates: its waiting
// members are told so, and find and join the new coordinator.
func (c *Coordinator) dropLocked(g *group) {
	e := refuse(NotCoordinator, "group %q moved to another coordinator", g.name)
	for _, m := range g.members {
		answerJoin(m, JoinResult{Err: e})
		answerSync(m, SyncResult{Err: e})
	}
	g.state = Dead
	delete(c.groups, g.name)
	c.opts.Logger.Info("consumer group moved to another coordinator", "group", g.name, "members", len(g.members))
}

func (c *Coordinator) groupLocked(name string) *group {
	g := c.groups[name]
	if g == nil {
		g = &group{name: name, state: Empty, members: map[string]*member{}, pending: map[string]time.Time{}, offsets: map[TopicPartition]Committed{}}
		c.groups[name] = g
	}
	return g
}

func answerJoin(m *member, r JoinResult) {
	if m.join != nil {
		m.join <- r
		m.join = nil
	}
}

func answerSync(m *member, r SyncResult) {
	if m.sync != nil {
		m.sync <- r
		m.sync = nil
	}
}

func joinRefused(e *Error) <-chan JoinResult {
	ch := make(chan JoinResult, 1)
	ch <- JoinResult{Err: e}
	return ch
}

func syncRefused(e *Error) <-chan SyncResult {
	ch := make(chan SyncResult, 1)
	ch <- SyncResult{Err: e}
	return ch
}

func newMemberID(clientID string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return clientID + "-" + hex.EncodeToString(b[:])
}

func sameProtocols(a, b []Protocol) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || string(a[i].Metadata) != string(b[i].Metadata) {
			return false
		}
	}
	return true
}

// Join handles a JoinGroup. The answer comes on the channel once the
// group's rebalance completes (or at once, for a refusal).
func (c *Coordinator) Join(ctx context.Context, req JoinRequest) <-chan JoinResult {
	if err := c.ready(ctx, req.Group); err != nil {
		return joinRefused(err.(*Error))
	}
	if req.Group == "" {
		return joinRefused(refuse(InvalidGroupID, "a group id is required"))
	}
	if req.SessionTimeout < c.opts.MinSessionTimeout || req.SessionTimeout > c.opts.MaxSessionTimeout {
		return joinRefused(refuse(InvalidSessionTimeout, "session timeout %v is outside [%v, %v]", req.SessionTimeout, c.opts.MinSessionTimeout, c.opts.MaxSessionTimeout))
	}
	if len(req.Protocols) == 0 || req.ProtocolType == "" {
		return joinRefused(refuse(InconsistentGroupProtocol, "a join names a protocol type and at least one protocol"))
	}
	if req.RebalanceTimeout <= 0 {
		// JoinGroup v0 has none: Kafka uses the session timeout.
		req.RebalanceTimeout = req.SessionTimeout
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[req.Group]
	if g == nil {
		if req.MemberID != "" {
			return joinRefused(refuse(UnknownMemberID, "group %q has no member %q", req.Group, req.MemberID))
		}
		g = c.groupLocked(req.Group)
	}
	if g.state == Dead {
		return joinRefused(refuse(CoordinatorNotAvailable, "group %q is being deleted", req.Group))
	}
	if len(g.members) > 0 {
		if req.ProtocolType != g.protocolType {
			return joinRefused(refuse(InconsistentGroupProtocol, "group %q runs protocol type %q, not %q", req.Group, g.protocolType, req.ProtocolType))
		}
		if !c.commonProtocolLocked(g, req) {
			return joinRefused(refuse(InconsistentGroupProtocol, "no protocol of the join is supported by every member of group %q", req.Group))
		}
	}
	ch := make(chan JoinResult, 1)
	if req.MemberID == "" {
		if c.opts.MaxSize > 0 && len(g.members)+len(g.pending) >= c.opts.MaxSize {
			return joinRefused(refuse(GroupMaxSizeReached, "group %q has %d members, its bound", req.Group, c.opts.MaxSize))
		}
		id := newMemberID(req.ClientID)
		if req.RequireKnownMember {
			g.pending[id] = now.Add(req.SessionTimeout)
			ch <- JoinResult{Err: refuse(MemberIDRequired, "join again with member id %s", id), MemberID: id, Generation: -1}
			return ch
		}
		c.addMemberLocked(g, id, req, ch, now)
		return ch
	}
	if _, ok := g.pending[req.MemberID]; ok {
		delete(g.pending, req.MemberID)
		c.addMemberLocked(g, req.MemberID, req, ch, now)
		return ch
	}
	m := g.members[req.MemberID]
	if m == nil {
		return joinRefused(refuse(UnknownMemberID, "group %q has no member %q", req.Group, req.MemberID))
	}
	switch g.state {
	case PreparingRebalance:
		c.updateMemberLocked(g, m, req, ch)
		c.maybeCompleteJoinLocked(g, now)
	case CompletingRebalance:
		if sameProtocols(m.protocols, req.Protocols) {
			// A retried join of this generation: the same answer again.
			ch <- c.joinResultLocked(g, m)
			return ch
		}
		c.updateMemberLocked(g, m, req, ch)
		c.prepareRebalanceLocked(g, now)
	case Stable:
		if m.id != g.leader && sameProtocols(m.protocols, req.Protocols) {
			ch <- c.joinResultLocked(g, m)
			return ch
		}
		c.updateMemberLocked(g, m, req, ch)
		c.prepareRebalanceLocked(g, now)
	}
	return ch
}

// commonProtocolLocked reports whether some protocol of req is supported
// by every member of g.
func (c *Coordinator) commonProtocolLocked(g *group, req JoinRequest) bool {
	for _, p := range req.Protocols {
		all := true
		for id, m := range g.members {
			if id == req.MemberID {
				continue
			}
			if !m.supports(p.Name) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

func (c *Coordinator) addMemberLocked(g *group, id string, req JoinRequest, ch chan JoinResult, now time.Time) {
	if len(g.members) == 0 {
		g.protocolType = req.ProtocolType
	}
	m := &member{id: id, clientID: req.ClientID, clientHost: req.ClientHost}
	g.members[id] = m
	g.order = append(g.order, id)
	c.updateMemberLocked(g, m, req, ch)
	if g.state == Empty {
		// The first member of an empty group: hold the generation open for
		// the others started with it, up to the rebalance timeout.
		g.delayUntil = now.Add(min(c.opts.InitialRebalanceDelay, req.RebalanceTimeout))
	} else if g.state == PreparingRebalance && !g.delayUntil.IsZero() {
		g.delayUntil = minTime(now.Add(c.opts.InitialRebalanceDelay), g.rebalanceDeadline)
	}
	if g.state == PreparingRebalance {
		c.maybeCompleteJoinLocked(g, now)
		return
	}
	c.prepareRebalanceLocked(g, now)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (c *Coordinator) updateMemberLocked(g *group, m *member, req JoinRequest, ch chan JoinResult) {
	m.protocols = append([]Protocol(nil), req.Protocols...)
	m.session, m.rebalance = req.SessionTimeout, req.RebalanceTimeout
	if m.join != nil {
		// A join replaced by a newer one of the same member.
		answerJoin(m, JoinResult{Err: refuse(UnknownMemberID, "replaced by a newer join of member %q", m.id)})
	}
	m.join = ch
}

// prepareRebalanceLocked starts a rebalance: every member must join again
// within the longest rebalance timeout of the group.
func (c *Coordinator) prepareRebalanceLocked(g *group, now time.Time) {
	if g.state == CompletingRebalance {
		// The leader's assignment of the abandoned generation never comes:
		// members waiting in SyncGroup join again.
		for _, m := range g.members {
			answerSync(m, SyncResult{Err: refuse(RebalanceInProgress, "group %q is rebalancing", g.name)})
		}
	}
	var longest time.Duration
	for _, m := range g.members {
		longest = max(longest, m.rebalance)
	}
	g.state = PreparingRebalance
	g.rebalanceDeadline = now.Add(longest)
	if !g.delayUntil.IsZero() {
		g.delayUntil = minTime(g.delayUntil, g.rebalanceDeadline)
	}
	c.maybeCompleteJoinLocked(g, now)
}

// maybeCompleteJoinLocked completes the join phase once every member has
// joined and no handed-out id is still expected.
func (c *Coordinator) maybeCompleteJoinLocked(g *group, now time.Time) {
	if g.state != PreparingRebalance || len(g.pending) > 0 {
		return
	}
	if !g.delayUntil.IsZero() && now.Before(g.delayUntil) {
		return
	}
	for _, m := range g.members {
		if m.join == nil {
			return
		}
	}
	c.completeJoinLocked(g, now)
}

// completeJoinLocked starts the next generation with the members that
// joined, and answers their joins: the leader with every member.
func (c *Coordinator) completeJoinLocked(g *group, now time.Time) {
	for id, m := range g.members {
		if m.join == nil {
			c.removeMemberLocked(g, id)
		}
	}
	g.pending = map[string]time.Time{}
	g.delayUntil = time.Time{}
	g.generation++
	if len(g.members) == 0 {
		g.state, g.protocol, g.leader = Empty, "", ""
		return
	}
	g.protocol = selectProtocol(g)
	if _, ok := g.members[g.leader]; !ok {
		g.leader = g.order[0]
	}
	g.state = CompletingRebalance
	c.opts.Logger.Info("consumer group has a new generation", "group", g.name, "generation", g.generation, "members", len(g.members), "leader", g.leader, "protocol", g.protocol)
	for _, m := range g.members {
		m.assignment = nil
		m.deadline = now.Add(m.session)
		answerJoin(m, c.joinResultLocked(g, m))
	}
}

func (c *Coordinator) joinResultLocked(g *group, m *member) JoinResult {
	r := JoinResult{Generation: g.generation, ProtocolType: g.protocolType, Protocol: g.protocol, Leader: g.leader, MemberID: m.id}
	if m.id == g.leader {
		for _, id := range g.order {
			r.Members = append(r.Members, JoinMember{ID: id, Metadata: g.members[id].metadataFor(g.protocol)})
		}
	}
	return r
}

// selectProtocol picks the protocol the members vote for: each votes for
// the first of its own, in its order of preference, that every member
// supports; the most votes win, ties going to the leader's preference.
func selectProtocol(g *group) string {
	var candidates []string
	first := g.members[g.order[0]]
	if l, ok := g.members[g.leader]; ok {
		first = l
	}
	for _, p := range first.protocols {
		all := true
		for _, m := range g.members {
			if !m.supports(p.Name) {
				all = false
				break
			}
		}
		if all {
			candidates = append(candidates, p.Name)
		}
	}
	votes := map[string]int{}
	for _, m := range g.members {
		for _, p := range m.protocols {
			if slices.Contains(candidates, p.Name) {
				votes[p.Name]++
				break
			}
		}
	}
	best := ""
	for _, p := range candidates {
		if best == "" || votes[p] > votes[best] {
			best = p
		}
	}
	return best
}

func (c *Coordinator) removeMemberLocked(g *group, id string) {
	m := g.members[id]
	if m == nil {
		return
	}
	answerJoin(m, JoinResult{Err: refuse(UnknownMemberID, "member %q left group %q", id, g.name)})
	answerSync(m, SyncResult{Err: refuse(UnknownMemberID, "member %q left group %q", id, g.name)})
	delete(g.members, id)
	for i, o := range g.order {
		if o == id {
			g.order = append(g.order[:i], g.order[i+1:]...)
			break
		}
	}
}

// memberLocked checks a request's member and generation against g.
func memberLocked(g *group, id string, generation int32) (*member, *Error) {
	m := g.members[id]
	if m == nil {
		return nil, refuse(UnknownMemberID, "group %q has no member %q", g.name, id)
	}
	if generation != g.generation {
		return nil, refuse(IllegalGeneration, "group %q is at generation %d, not %d", g.name, g.generation, generation)
	}
	return m, nil
}

// Sync handles a SyncGroup: the leader's assignment completes the
// rebalance, and every member gets its part of it.
func (c *Coordinator) Sync(ctx context.Context, req SyncRequest) <-chan SyncResult {
	if err := c.ready(ctx, req.Group); err != nil {
		return syncRefused(err.(*Error))
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[req.Group]
	if g == nil {
		return syncRefused(refuse(UnknownMemberID, "group %q has no members", req.Group))
	}
	m, e := memberLocked(g, req.MemberID, req.Generation)
	if e != nil {
		return syncRefused(e)
	}
	ch := make(chan SyncResult, 1)
	switch g.state {
	case PreparingRebalance:
		return syncRefused(refuse(RebalanceInProgress, "group %q is rebalancing", g.name))
	case Stable:
		ch <- SyncResult{ProtocolType: g.protocolType, Protocol: g.protocol, Assignment: m.assignment}
		return ch
	case CompletingRebalance:
		answerSync(m, SyncResult{Err: refuse(RebalanceInProgress, "replaced by a newer sync of member %q", m.id)})
		m.sync = ch
		m.deadline = now.Add(m.session)
		if m.id != g.leader {
			return ch
		}
		for id, mm := range g.members {
			mm.assignment = req.Assignments[id]
		}
		g.state = Stable
		for _, mm := range g.members {
			mm.deadline = now.Add(mm.session)
			answerSync(mm, SyncResult{ProtocolType: g.protocolType, Protocol: g.protocol, Assignment: mm.assignment})
		}
		return ch
	}
	return syncRefused(refuse(UnknownMemberID, "group %q has no members", req.Group))
}

// Heartbeat keeps a member's session and tells it whether a rebalance
// needs it to join again.
func (c *Coordinator) Heartbeat(ctx context.Context, groupID, memberID string, generation int32) error {
	if err := c.ready(ctx, groupID); err != nil {
		return err
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[groupID]
	if g == nil {
		return refuse(UnknownMemberID, "group %q has no members", groupID)
	}
	m := g.members[memberID]
	if m == nil {
		return refuse(UnknownMemberID, "group %q has no member %q", groupID, memberID)
	}
	m.deadline = now.Add(m.session)
	if g.state == PreparingRebalance {
		return refuse(RebalanceInProgress, "group %q is rebalancing: join again", groupID)
	}
	if generation != g.generation {
		return refuse(IllegalGeneration, "group %q is at generation %d, not %d", groupID, g.generation, generation)
	}
	return nil
}

// Leave removes members from a group; the answer has one error (nil:
// left) per member id.
func (c *Coordinator) Leave(ctx context.Context, groupID string, memberIDs []string) ([]error, error) {
	if err := c.ready(ctx, groupID); err != nil {
		return nil, err
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[groupID]
	out := make([]error, len(memberIDs))
	left := false
	for i, id := range memberIDs {
		switch {
		case g == nil:
			out[i] = refuse(UnknownMemberID, "group %q has no members", groupID)
		case g.members[id] != nil:
			c.removeMemberLocked(g, id)
			left = true
		default:
			if _, ok := g.pending[id]; ok {
				// Never a member: a rebalance waiting for it goes on.
				delete(g.pending, id)
				c.maybeCompleteJoinLocked(g, now)
				continue
			}
			out[i] = refuse(UnknownMemberID, "group %q has no member %q", groupID, id)
		}
	}
	if left {
		c.membersChangedLocked(g, now)
	}
	return out, nil
}

// membersChangedLocked rebalances a group that lost members.
func (c *Coordinator) membersChangedLocked(g *group, now time.Time) {
	switch g.state {
	case Stable, CompletingRebalance:
		if len(g.members) == 0 {
			answerAllSyncs(g)
			g.state, g.protocol, g.leader = Empty, "", ""
			g.generation++
			return
		}
		c.prepareRebalanceLocked(g, now)
	case PreparingRebalance:
		if len(g.members) == 0 {
			c.completeJoinLocked(g, now)
			return
		}
		c.maybeCompleteJoinLocked(g, now)
	}
}

func answerAllSyncs(g *group) {
	for _, m := range g.members {
		answerSync(m, SyncResult{Err: refuse(RebalanceInProgress, "group %q is rebalancing", g.name)})
	}
}

// Tick applies the deadlines that have passed: a member whose session
// expired is removed, handed-out ids not joined with are forgotten, and a
// rebalance whose timeout passed completes with the members that joined.
// After the Membership changed it forgets the groups it lost.
func (c *Coordinator) Tick() {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := c.membershipVersion(); v != c.sortedAt {
		// Groups another node now coordinates: their members are told at
		// once, not when their rebalance or session times out here.
		for name, g := range c.groups {
			if !c.owns(name) {
				c.dropLocked(g)
			}
		}
		c.sortedAt = v
	}
	for _, g := range c.groups {
		changed := false
		for id, deadline := range g.pending {
			// An id handed out and never joined with is forgotten; that
			// changes no generation (a rebalance waiting for it goes on).
			if !now.Before(deadline) {
				delete(g.pending, id)
			}
		}
		for id, m := range g.members {
			// A member waiting in JoinGroup is waited for until the
			// rebalance timeout, and one waiting in SyncGroup until the
			// leader's assignment, not its session: clients do not
			// heartbeat while they wait.
			if m.join == nil && m.sync == nil && !m.deadline.IsZero() && !now.Before(m.deadline) {
				c.opts.Logger.Info("consumer group member's session expired", "group", g.name, "member", id, "session", m.session)
				c.removeMemberLocked(g, id)
				changed = true
			}
		}
		if g.state == PreparingRebalance && !now.Before(g.rebalanceDeadline) {
			for id, m := range g.members {
				if m.join == nil {
					c.opts.Logger.Info("consumer group member did not join within the rebalance timeout", "group", g.name, "member", id)
				}
			}
			c.completeJoinLocked(g, now)
			continue
		}
		if changed {
			c.membersChangedLocked(g, now)
			continue
		}
		c.maybeCompleteJoinLocked(g, now)
	}
}

// GroupSummary is one group as ListGroups reports it.
type GroupSummary struct {
	Name         string
	State        State
	ProtocolType string
	Members      int
}

// MemberDescription is one member as DescribeGroups reports it.
type MemberDescription struct {
	ID, ClientID, ClientHost string
	Metadata, Assignment     []byte
}

// Description is one group as DescribeGroups reports it.
type Description struct {
	Name         string
	State        State
	Generation   int32
	ProtocolType string
	Protocol     string
	Leader       string
	Members      []MemberDescription
	Offsets      map[TopicPartition]Committed
}

// List returns every group this node coordinates, with or without
// members, by name.
func (c *Coordinator) List(ctx context.Context) ([]GroupSummary, error) {
	if err := c.Load(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]GroupSummary, 0, len(c.groups))
	for _, g := range c.groups {
		if g.state == Dead || !c.owns(g.name) {
			continue
		}
		out = append(out, GroupSummary{Name: g.name, State: g.state, ProtocolType: g.protocolType, Members: len(g.members)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Describe returns a group's members and committed offsets; a group the
// coordinator does not know is Dead, as Kafka reports it.
func (c *Coordinator) Describe(ctx context.Context, name string) (Description, error) {
	if err := c.ready(ctx, name); err != nil {
		return Description{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[name]
	if g == nil {
		return Description{Name: name, State: Dead}, nil
	}
	d := Description{Name: g.name, State: g.state, Generation: g.generation, ProtocolType: g.protocolType, Protocol: g.protocol, Leader: g.leader, Offsets: map[TopicPartition]Committed{}}
	for _, id := range g.order {
		m := g.members[id]
		d.Members = append(d.Members, MemberDescription{ID: m.id, ClientID: m.clientID, ClientHost: m.clientHost, Metadata: m.metadataFor(g.protocol), Assignment: m.assignment})
	}
	for tp, o := range g.offsets {
		d.Offsets[tp] = o
	}
	return d, nil
}

// CommitOffsets stores offsets for a group: from a member of the current
// generation, or with generation -1 and no member id from a consumer
// outside any generation (manual assignment) while the group has no
// members. It returns one error (nil: committed) per commit.
func (c *Coordinator) CommitOffsets(ctx context.Context, groupID, memberID string, generation int32, commits []Commit) ([]error, error) {
	if err := c.ready(ctx, groupID); err != nil {
		return nil, err
	}
	if groupID == "" {
		return nil, refuse(InvalidGroupID, "a group id is required")
	}
	c.mu.Lock()
	g := c.groups[groupID]
	var e *Error
	switch {
	case g == nil && generation < 0:
		g = c.groupLocked(groupID)
	case g == nil:
		e = refuse(IllegalGeneration, "group %q has no generation %d", groupID, generation)
	case g.state == Dead:
		e = refuse(CoordinatorNotAvailable, "group %q is being deleted", groupID)
	case generation < 0 && g.state == Empty:
	default:
		if _, e = memberLocked(g, memberID, generation); e == nil && g.state == CompletingRebalance {
			e = refuse(RebalanceInProgress, "group %q is waiting for its leader's assignment", groupID)
		}
	}
	if m := g.members[memberID]; e == nil && m != nil {
		// A commit is a sign of life too, as in Kafka.
		m.deadline = c.now().Add(m.session)
	}
	c.mu.Unlock()
	if e != nil {
		return nil, e
	}
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	// Held from the check to the apply: a load that moved the group
	// elsewhere comes before the check or after the apply.
	c.storeMu.RLock()
	defer c.storeMu.RUnlock()
	c.mu.Lock()
	gone := g.state == Dead || c.groups[groupID] != g
	unchanged := true
	for _, cm := range commits {
		if o, ok := g.offsets[cm.TopicPartition]; !ok || o.Offset != cm.Offset || o.Metadata != cm.Metadata || o.LeaderEpoch != cm.LeaderEpoch {
			unchanged = false
		}
	}
	c.mu.Unlock()
	if gone {
		return nil, refuse(CoordinatorNotAvailable, "group %q was deleted meanwhile", groupID)
	}
	if unchanged {
		// A consumer committing while idle (auto-commit every few
		// seconds): already stored and held, nothing to write.
		return make([]error, len(commits)), nil
	}
	now := c.now().UnixMilli()
	for i := range commits {
		commits[i].At = now
	}
	errs, err := c.opts.Offsets.Commit(ctx, groupID, commits)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, cm := range commits {
		if errs[i] == nil || IsStored(errs[i]) {
			g.offsets[cm.TopicPartition] = cm.Committed
		}
	}
	return errs, nil
}

// FetchOffsets returns a group's committed offsets: of the partitions
// asked for (absent ones are not in the map), or all when tps is nil.
func (c *Coordinator) FetchOffsets(ctx context.Context, groupID string, tps []TopicPartition) (map[TopicPartition]Committed, error) {
	if err := c.ready(ctx, groupID); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[TopicPartition]Committed{}
	g := c.groups[groupID]
	if g == nil {
		return out, nil
	}
	if tps == nil {
		for tp, o := range g.offsets {
			out[tp] = o
		}
		return out, nil
	}
	for _, tp := range tps {
		if o, ok := g.offsets[tp]; ok {
			out[tp] = o
		}
	}
	return out, nil
}

// Delete deletes a group that has no members: its committed offsets and
// its retention holds.
func (c *Coordinator) Delete(ctx context.Context, groupID string) error {
	if err := c.ready(ctx, groupID); err != nil {
		return err
	}
	c.mu.Lock()
	g := c.groups[groupID]
	switch {
	case g == nil || g.state == Dead:
		c.mu.Unlock()
		return refuse(GroupIDNotFound, "no group %q", groupID)
	case g.state != Empty:
		c.mu.Unlock()
		return refuse(NonEmptyGroup, "group %q has %d members", groupID, len(g.members))
	}
	g.state = Dead
	c.mu.Unlock()
	// No commit of the group is on its way to the store once this is held
	// (a commit that passed its check before Dead finds it after).
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	c.storeMu.RLock()
	defer c.storeMu.RUnlock()
	c.mu.Lock()
	if c.groups[groupID] != g {
		c.mu.Unlock()
		return refuse(NotCoordinator, "group %q moved to another coordinator", groupID)
	}
	topics := map[string]bool{}
	for tp := range g.offsets {
		topics[tp.Topic] = true
	}
	c.mu.Unlock()
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	sort.Strings(names)
	err := c.opts.Offsets.Delete(ctx, groupID, names)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil && !errors.Is(err, ErrHoldsRemain) {
		// Nothing was stored: the group is as it was.
		g.state = Empty
		return err
	}
	delete(c.groups, groupID)
	return err
}

// ErrHoldsRemain is the error of an Offsets.Delete that stored the group's
// deletion but did not release all its holds; the group is gone, and its
// holds (consumer HoldName) are released with DeleteConsumer.
var ErrHoldsRemain = errors.New("the group is deleted but some of its retention holds remain")
