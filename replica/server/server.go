// Package server is the replica process: it hosts partition replicas of
// many streams, drives each one's chain core (replica/chain) over its
// partition log (replica/partlog), and serves the Replica gRPC service:
// chain configuration, appends at the head, the replication link between
// neighbours, and committed reads.
package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/durable"
	"github.com/catena-streams/catena/internal/heard"
	"github.com/catena-streams/catena/internal/writetrace"
	"github.com/catena-streams/catena/replica/chain"
	"github.com/catena-streams/catena/replica/journal"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
	"github.com/catena-streams/catena/rpc/transport"
)

// Limits on names, validated on every configuration.
const (
	maxNameLen      = 63
	maxMembers      = 16
	maxPartitions   = 4096
	retentionPeriod = 30 * time.Second
	// defaultSegmentBytes rolls segments at 256 MiB.
	defaultSegmentBytes = 256 << 20
	minSegmentBytes     = 1 << 20
	indexIntervalBytes  = 64 << 10
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Options configure a replica server.
type Options struct {
	// ID names this replica in chain memberships. Required.
	ID string
	// DataDir holds one folder per hosted partition. Required.
	DataDir string
	// TLS for links to other replicas (nil: plaintext).
	TLS *tls.Config
	// DialOptions are appended to the defaults of connections to other
	// replicas (tests: a reconnect back-off long enough to matter).
	DialOptions []grpc.DialOption
	// Logger, default discard.
	Logger logr.Logger
	// Registerer for Prometheus metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Fatal is called when an fsync or write fails: the outcome is unknown
	// and the replica must stop rather than acknowledge. Default: exit(70).
	Fatal func(error)
	// FS is the file system under partition logs (nil: the real one). Tests
	// inject faults through it.
	FS partlog.FS
	// CatchUpBytesPerSecond caps how fast this replica copies the
	// partitions it catches up on outside their chains, all of them
	// together, and, on its own, how fast it serves history to the
	// replicas copying from it, all of them together: so that copies
	// leave disk and CPU to the chains at both ends (0: no cap; `catena
	// replica --catch-up-rate` defaults to DefaultCatchUpMiBPerSecond).
	CatchUpBytesPerSecond int64
	// Journal makes every partition's appends durable through one journal
	// for the process (<DataDir>/journal, docs/journal.md) instead of an
	// fsync of each partition's file: one write and one fdatasync per
	// group commit for all partitions. A data directory that holds a
	// journal refuses to open without it.
	Journal bool
	// JournalSegmentBytes is the size of each journal segment file (0:
	// journal.DefaultSegmentBytes).
	JournalSegmentBytes int64
	// ScrubInterval is how often each partition's sealed segments are
	// read back from the disk and checked whole (partlog's Log.Scrub),
	// paced with the verification of segments opened from summaries, so
	// that damage on the medium that no read met yet is found while the
	// chain has good copies to replace this one from (0:
	// DefaultScrubInterval; negative: never).
	ScrubInterval time.Duration
	// JournalDirectFrameBytes: appends of at least this many bytes are
	// fsynced in their partition's file and not copied into the journal
	// (journal.StoreOptions.DirectFrameBytes; 0: its default).
	JournalDirectFrameBytes int
	// RetentionPeriod is how often retention runs on every partition (0:
	// every 30 s).
	RetentionPeriod time.Duration
}

type partKey struct {
	stream string
	index  uint32
}

// Server hosts partition replicas.
type Server struct {
	catenapb.UnimplementedReplicaServer

	id      string
	dataDir string
	logger  logr.Logger
	pool    *transport.Pool
	// copyLimit paces all catch-up copies together, and serveLimit the
	// history this replica serves to every copy from it
	// (Options.CatchUpBytesPerSecond each; nil: no cap).
	copyLimit, serveLimit *rate.Limiter
	// verifyLimit paces the reads of sealed segments that their logs'
	// Open took from summaries (partition.verifySealed), all partitions'
	// together.
	verifyLimit *rate.Limiter
	// scrubInterval is Options.ScrubInterval, defaulted (0: no scrubs).
	scrubInterval time.Duration
	// copyWait: copyWait (tests lengthen it).
	copyWait time.Duration
	metrics  *metrics
	fatalFn  func(error)
	fs       partlog.FS
	// store is the journal and the partitions' logs over it
	// (Options.Journal); nil: each log fsyncs its own files.
	store *journal.Store

	// successors is when each successor process (by address, as its
	// pooled connection is) last acknowledged records on any partition's
	// link: a link's stall counts from there (partition.successorStalled).
	successors *heard.Table

	// committedMu orders writes of committedTableFile; its order is
	// before mu. committedLoaded is the table read at start-up, until
	// the partitions found on disk are open (then nil); committedOnDisk
	// is what the file holds (mu).
	committedMu     sync.Mutex
	committedLoaded map[partKey]uint64
	committedClean  bool
	committedOnDisk map[partKey]uint64

	mu         sync.Mutex
	partitions map[partKey]*partition
	// dropping are partitions a Drop took out of the table and whose
	// directory it has not yet renamed away: no new copy may be created
	// in that directory meanwhile (mu).
	dropping map[partKey]bool
	// beforeDropRename, when set (tests), runs in Drop before it renames
	// the partition's directory away.
	beforeDropRename func()
	closed           bool
	stop             chan struct{}
	wg               sync.WaitGroup
}

// New opens every partition found under opts.DataDir (recovering its log and
// reinstalling its last accepted chain configuration) and returns the server.
func New(opts Options) (*Server, error) {
	writetrace.SetRole(opts.ID)
	if !nameRE.MatchString(opts.ID) || len(opts.ID) > maxNameLen {
		return nil, fmt.Errorf("replica id %q must be 1-%d lowercase letters, digits or '-'", opts.ID, maxNameLen)
	}
	if opts.DataDir == "" {
		return nil, errors.New("replica data directory is required")
	}
	if err := os.MkdirAll(filepath.Join(opts.DataDir, "streams"), 0o755); err != nil {
		return nil, fmt.Errorf("failed to create data directory %s: %w", opts.DataDir, err)
	}
	if journalByDefault {
		opts.Journal = true
		if opts.JournalDirectFrameBytes == 0 {
			// Tests' appends are small: some of them take the path
			// of large ones too.
			opts.JournalDirectFrameBytes = testDirectFrameBytes
		}
		if opts.JournalSegmentBytes == 0 {
			// Tests write megabytes: they roll the journal often, and
			// each segment the tests' file systems hold costs that
			// much memory twice (its contents and its durable copy).
			opts.JournalSegmentBytes = testJournalSegmentBytes
		}
	}
	s := &Server{
		id:            opts.ID,
		dataDir:       opts.DataDir,
		logger:        opts.Logger,
		pool:          transport.NewPool(opts.TLS, opts.DialOptions...),
		copyLimit:     newCopyLimit(opts.CatchUpBytesPerSecond),
		serveLimit:    newCopyLimit(opts.CatchUpBytesPerSecond),
		verifyLimit:   rate.NewLimiter(rate.Limit(verifyBytesPerSecond), 1<<20),
		scrubInterval: scrubIntervalOf(opts.ScrubInterval),
		copyWait:      copyWait,
		metrics:       newMetrics(opts.Registerer),
		fatalFn:       opts.Fatal,
		fs:            opts.FS,
		partitions:    map[partKey]*partition{},
		dropping:      map[partKey]bool{},
		stop:          make(chan struct{}),
		successors:    heard.New(),
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(partitionCollector{s}); err != nil {
			return nil, fmt.Errorf("failed to register the replica's log gauges: %w", err)
		}
		if err := opts.Registerer.Register(journalCollector{s}); err != nil {
			return nil, fmt.Errorf("failed to register the replica's journal counters: %w", err)
		}
	}
	if s.fatalFn == nil {
		s.fatalFn = func(err error) {
			s.logger.Error(err, "Stopping the replica: a write or fsync failed and its outcome is unknown")
			os.Exit(70)
		}
	}
	s.loadCommittedTable()
	if err := s.openExisting(opts); err != nil {
		s.Close()
		return nil, err
	}
	// Before serving: drop what the table names for partitions no longer
	// here, take in version-1 records, and clear a clean close's mark.
	if err := s.persistCommitted(atStart); err != nil {
		s.Close()
		return nil, fmt.Errorf("failed to record committed offsets at start-up: %w", err)
	}
	s.committedLoaded = nil
	s.wg.Add(3)
	go s.every(cmp.Or(opts.RetentionPeriod, retentionPeriod), s.enforceRetention)
	go s.every(committedPersistInterval, s.persistCommittedRound)
	go s.every(dedupSnapshotInterval, s.saveDedups)
	return s, nil
}

// Register adds the Replica service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { catenapb.RegisterReplicaServer(g, s) }

// ID returns the replica's id.
func (s *Server) ID() string { return s.id }

func (s *Server) fatal(err error) { s.fatalFn(err) }

func (s *Server) partitionDir(stream string, index uint32) string {
	return filepath.Join(s.dataDir, "streams", stream, fmt.Sprintf("%05d", index))
}

// openExisting reopens every partition directory on disk, through the
// journal's recovery when the replica keeps one.
func (s *Server) openExisting(opts Options) error {
	ids, err := s.partitionsOnDisk()
	if err != nil {
		return err
	}
	jdir := filepath.Join(s.dataDir, journalDir)
	if !opts.Journal {
		if names, err := os.ReadDir(jdir); err == nil && len(names) > 0 {
			// Frames acknowledged since its last checkpoint may be in the
			// journal only: opened without it, the logs would lose them.
			return fmt.Errorf("the data directory %s holds a journal (%s): run the replica with --journal", s.dataDir, jdir)
		}
		return s.loadPartitions(ids, nil)
	}
	store, opened, err := journal.OpenStore(journal.StoreOptions{
		Journal:          journal.Options{Dir: jdir, FS: s.fs, SegmentBytes: opts.JournalSegmentBytes},
		LogOptions:       s.journaledLogOptions,
		DirectFrameBytes: opts.JournalDirectFrameBytes,
		OnError:          func(err error) { s.fatal(fmt.Errorf("journal checkpoint failed: %w", err)) },
	}, ids)
	if err != nil {
		return fmt.Errorf("failed to open the journal in %s: %w", jdir, err)
	}
	s.store = store
	st := store.Journal().Stats()
	s.logger.Info("Opened the journal", "dir", jdir, "partitions", len(opened), "end", store.Journal().End(), "groups", st.Groups)
	ids = ids[:0]
	for id, o := range opened {
		if o.Removed {
			// Dropped (its drop record durable, its directory not yet
			// renamed), or created and stopped before its create record
			// was durable: it never took a frame.
			if err := s.removePartitionDir(s.partitionDir(id.Stream, id.Partition)); err != nil {
				return err
			}
			s.logger.Info("Removed a partition directory the journal says was dropped or never created", "stream", id.Stream, "partition", id.Partition)
			continue
		}
		ids = append(ids, id)
	}
	return s.loadPartitions(ids, opened)
}

// startConcurrency bounds the partitions a replica opens at once at
// start-up. Opening one reads its last segment (checking every frame's
// CRC) and the records its de-duplication table is rebuilt from: disk
// and CPU work that several partitions overlap. Kafka's equivalent,
// num.recovery.threads.per.data.dir, defaults to 1; a replica here holds
// hundreds of partitions and its chains run a member short until it
// serves them.
var startConcurrency = 4 // a variable for BenchmarkReplicaStart

// loadPartitions opens the partitions ids at start-up, startConcurrency
// at a time, and adds those that opened to the table (a corrupt one
// too: it is kept, refusing to serve). With a journal, opened is what
// its recovery made of each. The first error is returned after every
// partition was tried, so that Close finds every log that opened.
func (s *Server) loadPartitions(ids []journal.PartitionID, opened map[journal.PartitionID]journal.Opened) error {
	parts := make([]*partition, len(ids))
	errs := make([]error, len(ids))
	var g errgroup.Group
	g.SetLimit(startConcurrency)
	for i, id := range ids {
		var o *journal.Opened
		if opened != nil {
			oo := opened[id]
			o = &oo
		}
		g.Go(func() error {
			parts[i], errs[i] = s.loadPartition(id.Stream, id.Partition, nil, o)
			return nil
		})
	}
	_ = g.Wait()
	for i, p := range parts {
		if p != nil {
			s.partitions[partKey{ids[i].Stream, ids[i].Partition}] = p
		}
	}
	return errors.Join(errs...)
}

// journalByDefault turns Options.Journal on for every server: the
// package's tests set it from CATENA_TEST_JOURNAL, to run the whole suite
// over the journal (make test-journal).
var journalByDefault bool

// testDirectFrameBytes is JournalDirectFrameBytes under journalByDefault.
const testDirectFrameBytes = 2 << 10

// testJournalSegmentBytes is JournalSegmentBytes under journalByDefault.
const testJournalSegmentBytes = 4 << 20

// journalDir is the journal's directory under the data directory.
const journalDir = "journal"

// journaledLogOptions are a partition's log options, for the journal's
// recovery: its directory, and the limits its stream configuration gives.
func (s *Server) journaledLogOptions(id journal.PartitionID) partlog.Options {
	dir := s.partitionDir(id.Stream, id.Partition)
	var cfg *catenapb.StreamConfig
	if meta, err := readMeta(dir); err == nil && meta != nil {
		cfg = meta.config
	}
	return logOptions(dir, cfg)
}

// removePartitionDir removes a partition's directory: renamed away first
// (durably), so that a crash leaves no half-removed partition.
func (s *Server) removePartitionDir(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	gone := filepath.Join(filepath.Dir(dir), fmt.Sprintf("%s%s-%d", droppedPrefix, filepath.Base(dir), time.Now().UnixNano()))
	if err := os.Rename(dir, gone); err != nil {
		return fmt.Errorf("failed to remove partition directory %s: %w", dir, err)
	}
	if err := durable.SyncDir(filepath.Dir(dir)); err != nil {
		return fmt.Errorf("failed to remove partition directory %s: %w", dir, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("failed to remove partition directory %s: %w", dir, err)
	}
	return nil
}

// partitionsOnDisk lists the partition directories under the data
// directory, removing what a Drop renamed and did not remove.
func (s *Server) partitionsOnDisk() ([]journal.PartitionID, error) {
	var ids []journal.PartitionID
	streams, err := os.ReadDir(filepath.Join(s.dataDir, "streams"))
	if err != nil {
		return nil, fmt.Errorf("failed to list streams in %s: %w", s.dataDir, err)
	}
	for _, st := range streams {
		if !st.IsDir() || !nameRE.MatchString(st.Name()) {
			continue
		}
		parts, err := os.ReadDir(filepath.Join(s.dataDir, "streams", st.Name()))
		if err != nil {
			return nil, fmt.Errorf("failed to list partitions of stream %s: %w", st.Name(), err)
		}
		for _, pd := range parts {
			if strings.HasPrefix(pd.Name(), droppedPrefix) {
				// A Drop renamed it and stopped before removing it.
				if err := os.RemoveAll(filepath.Join(s.dataDir, "streams", st.Name(), pd.Name())); err != nil {
					return nil, fmt.Errorf("failed to remove dropped partition %s/%s: %w", st.Name(), pd.Name(), err)
				}
				continue
			}
			idx, err := strconv.ParseUint(pd.Name(), 10, 32)
			if !pd.IsDir() || err != nil {
				continue
			}
			ids = append(ids, journal.PartitionID{Stream: st.Name(), Partition: uint32(idx)})
		}
	}
	return ids, nil
}

// openPartition creates a partition (its directory and log) at run time
// and adds it to the table. Callers hold s.mu.
func (s *Server) openPartition(stream string, index uint32, cfg *catenapb.StreamConfig) (*partition, error) {
	p, err := s.loadPartition(stream, index, cfg, nil)
	if err != nil {
		return nil, err
	}
	s.partitions[partKey{stream, index}] = p
	return p, nil
}

// loadPartition opens (creating when absent) a partition's directory and
// log, for the caller to add to the table. A corrupt log does not fail
// the server: the partition is returned refusing to serve and reporting
// why in Status. It touches no other partition's state: start-up loads
// several at once. With a journal, opened is what its recovery made of a
// partition found on disk, and nil creates the partition in the journal.
func (s *Server) loadPartition(stream string, index uint32, cfg *catenapb.StreamConfig, opened *journal.Opened) (*partition, error) {
	dir := s.partitionDir(stream, index)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("failed to create partition directory %s: %w", dir, err)
	}
	meta, metaErr := readMeta(dir)
	if meta != nil {
		cfg = meta.config
	}
	p := &partition{
		srv:       s,
		stream:    stream,
		index:     index,
		dir:       dir,
		logger:    s.logger.WithValues("stream", stream, "partition", index),
		m:         s.metrics.forPartition(stream, index),
		syncReq:   make(chan struct{}, 1),
		syncEvery: make(chan time.Duration, 1),
		stop:      make(chan struct{}),
		changed:   make(chan struct{}),
		dedup:     newDedupTable(),
	}
	if metaErr != nil && !errors.Is(metaErr, os.ErrNotExist) {
		// Like a corrupt log, it costs this partition only: without its
		// membership the copy cannot take part, and the master replaces it.
		if opened != nil && opened.Log != nil {
			s.store.Detach(journal.PartitionID{Stream: stream, Partition: index})
			opened.Log.Close()
		}
		p.failed = fmt.Errorf("%w: %v", partlog.ErrCorrupt, metaErr)
		p.logger.Error(metaErr, "Chain metadata is unreadable; refusing to serve the partition")
		return p, nil
	}
	var (
		l   *partlog.Log
		err error
	)
	switch {
	case opened != nil:
		l, err = opened.Log, opened.Err
	case s.store != nil:
		l, err = s.store.Create(journal.PartitionID{Stream: stream, Partition: index})
	default:
		lopts := logOptions(dir, cfg)
		lopts.FS = s.fs
		l, err = partlog.Open(lopts)
	}
	if err != nil {
		if !errors.Is(err, partlog.ErrCorrupt) {
			return nil, fmt.Errorf("failed to open partition %s/%d: %w", stream, index, err)
		}
		p.failed = err
		p.logger.Error(err, "Partition log is corrupt; refusing to serve it")
		return p, nil
	}
	p.log = l
	if rec := l.Recovery(); rec.TornSegment != "" {
		p.logger.Info("Cut a torn write off the partition log's tail (unsynced when the process stopped); the cut bytes are kept", "segment", rec.TornSegment, "at", rec.TornAt, "bytes", rec.TornBytes, "evidence", rec.Evidence, "reason", rec.Reason)
	} else if rec.ZeroTailBytes > 0 {
		p.logger.V(1).Info("Cut the zeros written ahead of the partition log's last frame", "bytes", rec.ZeroTailBytes)
	}
	p.core = chain.New(s.id, l.NextOffset())
	dedupFrom, err := p.loadDedup()
	if err != nil {
		p.failed = err
	}
	if h, err := readHolds(dir); err != nil {
		// Retention must not guess what consumers hold: refuse to serve
		// until the master replaces this copy (a new copy adopts the
		// chain's holds) or the file is mended.
		p.failed = fmt.Errorf("failed to load consumer holds of %s/%d: %w", stream, index, err)
		p.logger.Error(err, "Consumer holds are unreadable; refusing to serve the partition")
	} else {
		p.holds = h
	}
	// The link goroutine shares p from startLink on.
	p.mu.Lock()
	defer p.mu.Unlock()
	var exact bool
	p.committed, exact = p.loadCommitted(l.NextOffset())
	p.committedExact = exact || meta == nil || len(meta.Members) <= 1
	if meta != nil {
		eff, err := p.core.Configure(chain.Config{Epoch: meta.Epoch, Members: meta.memberIDs(), Committed: p.committed})
		if err != nil {
			// Nothing of the partition runs yet: its log goes with it.
			if opened != nil && s.store != nil {
				s.store.Detach(journal.PartitionID{Stream: stream, Partition: index})
			}
			_ = l.Close()
			return nil, fmt.Errorf("failed to reinstall chain of partition %s/%d at epoch %d: %w", stream, index, meta.Epoch, err)
		}
		p.meta = meta
		p.apply(eff)
		p.m.epoch.Set(float64(meta.Epoch))
		// A sole member has no neighbour to disagree with: what it lost
		// was never acknowledged nor served, so it resumes at once.
		if p.restored = len(meta.Members) > 1; !p.restored {
			p.startLink()
		}
	}
	p.m.logEnd.Set(float64(l.NextOffset()))
	p.wg.Add(1)
	go p.syncLoop(syncInterval(cfg))
	if p.failed == nil {
		p.wg.Add(1)
		go p.verifySealed()
	}
	p.logger.Info("Opened partition", "logStart", l.StartOffset(), "logEnd", l.NextOffset(), "epoch", p.core.Status().Epoch,
		"dedupReadFrom", dedupFrom)
	return p, nil
}

// segmentBytesFor is the segment size of a stream that sets none:
// defaultSegmentBytes, or an eighth of the smaller byte limit of its
// retention (at least minSegmentBytes) when that is less. Retention
// deletes whole sealed segments, so a partition keeps its limit and at
// most a segment more besides its active one; with the default size a
// limit of 10 MiB kept up to 256 MiB.
func segmentBytesFor(limits ...int64) int64 {
	seg := int64(defaultSegmentBytes)
	for _, b := range limits {
		if b > 0 {
			seg = min(seg, max(b/8, minSegmentBytes))
		}
	}
	return seg
}

func syncInterval(cfg *catenapb.StreamConfig) time.Duration {
	if cfg.GetDurability() != catenapb.Durability_DURABILITY_INTERVAL {
		return 0
	}
	return time.Duration(cfg.GetFsyncIntervalMs()) * time.Millisecond
}

func logOptions(dir string, cfg *catenapb.StreamConfig) partlog.Options {
	seg := cfg.GetSegmentBytes()
	if seg <= 0 {
		seg = segmentBytesFor(cfg.GetRetentionBytes(), cfg.GetHardRetentionBytes())
	}
	return partlog.Options{
		Dir:                dir,
		SegmentBytes:       seg,
		IndexIntervalBytes: indexIntervalBytes,
		RetentionBytes:     cfg.GetRetentionBytes(),
		RetentionTime:      time.Duration(cfg.GetRetentionMs()) * time.Millisecond,
	}
}

// startLink (re)starts the replication link for the current epoch. Callers
// hold p.mu or own p exclusively.
func (p *partition) startLink() {
	if p.linkStop != nil {
		p.linkStop()
		p.linkStop = nil
	}
	st := p.core.Status()
	p.hasSuccessor = st.Successor != ""
	p.recent, p.recentBytes = nil, 0
	p.linkDownSince, p.linkErr, p.stalledSince = time.Time{}, nil, time.Time{}
	if st.Successor == "" {
		return
	}
	p.linkDownSince = time.Now() // until the successor answers the hello
	ctx, cancel := context.WithCancel(context.Background())
	p.linkStop = cancel
	p.wg.Add(1)
	go p.runLink(ctx, p.meta.Epoch, st.Successor, p.meta.addrOf(st.Successor))
}

func (s *Server) lookup(stream string, index uint32) (*partition, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.partitions[partKey{stream, index}]
	if p == nil {
		return nil, status.Errorf(codes.NotFound, "partition %s/%d is not hosted on replica %s", stream, index, s.id)
	}
	return p, nil
}

// validateConfigure checks a configuration request before anything is stored.
func validateConfigure(req *catenapb.ConfigureRequest) error {
	if !nameRE.MatchString(req.GetStream()) || len(req.GetStream()) > maxNameLen {
		return fmt.Errorf("stream name %q must be 1-%d lowercase letters, digits or '-'", req.GetStream(), maxNameLen)
	}
	cfg := req.GetConfig()
	if cfg == nil {
		return errors.New("stream config is required")
	}
	if cfg.GetPartitions() == 0 || cfg.GetPartitions() > maxPartitions {
		return fmt.Errorf("stream partitions %d must be between 1 and %d", cfg.GetPartitions(), maxPartitions)
	}
	if req.GetPartition() >= cfg.GetPartitions() {
		return fmt.Errorf("partition %d is out of range for a stream of %d partitions", req.GetPartition(), cfg.GetPartitions())
	}
	if req.GetEpoch() == 0 {
		return errors.New("epoch must be at least 1")
	}
	if n := len(req.GetMembers()); n == 0 || n > maxMembers {
		return fmt.Errorf("a chain needs 1-%d members, got %d", maxMembers, n)
	}
	seen := map[string]bool{}
	for i, m := range req.GetMembers() {
		if !nameRE.MatchString(m.GetId()) || len(m.GetId()) > maxNameLen {
			return fmt.Errorf("member %d: id %q must be 1-%d lowercase letters, digits or '-'", i, m.GetId(), maxNameLen)
		}
		if m.GetAddr() == "" {
			return fmt.Errorf("member %d (%s): address is required", i, m.GetId())
		}
		if seen[m.GetId()] {
			return fmt.Errorf("member %q appears twice in the chain", m.GetId())
		}
		seen[m.GetId()] = true
	}
	switch cfg.GetDurability() {
	case catenapb.Durability_DURABILITY_UNSPECIFIED, catenapb.Durability_DURABILITY_FSYNC:
	case catenapb.Durability_DURABILITY_INTERVAL:
		if cfg.GetFsyncIntervalMs() == 0 || cfg.GetFsyncIntervalMs() > 60000 {
			return fmt.Errorf("fsync interval %dms must be between 1 and 60000 with interval durability", cfg.GetFsyncIntervalMs())
		}
	default:
		return fmt.Errorf("unknown durability %v", cfg.GetDurability())
	}
	if cfg.GetRetentionBytes() < 0 || cfg.GetRetentionMs() < 0 || cfg.GetSegmentBytes() < 0 || cfg.GetHardRetentionBytes() < 0 || cfg.GetHardRetentionMs() < 0 {
		return errors.New("retention and segment sizes must not be negative")
	}
	if h, soft := cfg.GetHardRetentionBytes(), cfg.GetRetentionBytes(); h != 0 && soft != 0 && h < soft {
		return fmt.Errorf("hard retention of %d bytes is below the retention of %d bytes", h, soft)
	}
	if h, soft := cfg.GetHardRetentionMs(), cfg.GetRetentionMs(); h != 0 && soft != 0 && h < soft {
		return fmt.Errorf("hard retention of %dms is below the retention of %dms", h, soft)
	}
	if cfg.GetSegmentBytes() != 0 && cfg.GetSegmentBytes() < minSegmentBytes {
		return fmt.Errorf("segment size %d is below the 1 MiB minimum", cfg.GetSegmentBytes())
	}
	if cfg.GetSegmentBytes() > partlog.MaxSegmentBytes {
		return fmt.Errorf("segment size %d is above the %d-byte (1 GiB) maximum", cfg.GetSegmentBytes(), partlog.MaxSegmentBytes)
	}
	if cfg.GetMaxRecordBytes() > partlog.MaxRecordBytes {
		return fmt.Errorf("max record size %d exceeds the %d-byte limit", cfg.GetMaxRecordBytes(), partlog.MaxRecordBytes)
	}
	return nil
}

// createPartition opens a partition this replica does not hold. It holds
// committedMu throughout, so that no write of the committed-offset table
// runs between its look at the table and the new copy's creation: if the
// table still names the partition (a dropped copy's offset), it is
// rewritten without it first, or a crash would give the new copy the old
// copy's floor.
func (s *Server) createPartition(key partKey, cfg *catenapb.StreamConfig) (*partition, error) {
	s.committedMu.Lock()
	defer s.committedMu.Unlock()
	s.mu.Lock()
	if p := s.partitions[key]; p != nil || s.closed || s.dropping[key] {
		s.mu.Unlock()
		return existingPartition(p, key, s.dropping[key])
	}
	_, stale := s.committedOnDisk[key]
	s.mu.Unlock()
	if stale {
		if err := s.persistCommittedLocked(whenMoved); err != nil {
			return nil, status.Errorf(codes.Internal, "configure %s/%d: %v", key.stream, key.index, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.partitions[key]; p != nil || s.closed || s.dropping[key] {
		return existingPartition(p, key, s.dropping[key])
	}
	p, err := s.openPartition(key.stream, key.index, cfg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	return p, nil
}

// existingPartition is what createPartition answers when it may not
// create: the partition that is there, or why there is none.
func existingPartition(p *partition, key partKey, dropping bool) (*partition, error) {
	switch {
	case p != nil:
		return p, nil
	case dropping:
		// Its directory is still there, about to be renamed away: a copy
		// created in it now would go with it.
		return nil, status.Errorf(codes.Unavailable, "partition %s/%d is being dropped on this replica; retry", key.stream, key.index)
	}
	return nil, status.Error(codes.Unavailable, "replica is shutting down")
}

// Configure installs a partition's chain under an epoch.
func (s *Server) Configure(ctx context.Context, req *catenapb.ConfigureRequest) (*catenapb.PartitionStatus, error) {
	if err := validateConfigure(req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "configure %s/%d: %v", req.GetStream(), req.GetPartition(), err)
	}
	key := partKey{req.GetStream(), req.GetPartition()}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "replica is shutting down")
	}
	p := s.partitions[key]
	s.mu.Unlock()
	if p == nil {
		var err error
		if p, err = s.createPartition(key, req.GetConfig()); err != nil {
			return nil, err
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != nil {
		return nil, p.usable()
	}
	meta, err := metaFromRequest(req)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if cur := p.meta; cur != nil {
		switch {
		case meta.Epoch < cur.Epoch:
			return nil, status.Errorf(codes.FailedPrecondition, "configure %s/%d: epoch %d is older than the installed epoch %d", p.stream, p.index, meta.Epoch, cur.Epoch)
		case meta.Epoch == cur.Epoch && !meta.sameMembers(cur):
			return nil, status.Errorf(codes.FailedPrecondition, "configure %s/%d: epoch %d is already installed with members %v; a different membership needs a new epoch", p.stream, p.index, meta.Epoch, cur.memberIDs())
		case meta.Epoch == cur.Epoch:
			if string(meta.Config) != string(cur.Config) {
				if err := writeMeta(p.dir, meta); err != nil {
					return nil, status.Errorf(codes.Internal, "%v", err)
				}
				p.meta = meta
				if err := p.applyConfig(meta.config); err != nil {
					return nil, status.Errorf(codes.Internal, "configure %s/%d: %v", p.stream, p.index, err)
				}
				p.logger.Info("Applied a changed stream config", "epoch", meta.Epoch)
			}
			return p.statusLocked(), nil
		}
	}
	// Persist before applying: an accepted epoch survives a restart.
	if err := writeMeta(p.dir, meta); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	eff, err := p.core.Configure(chain.Config{Epoch: meta.Epoch, Members: meta.memberIDs(), Committed: req.GetCommitted()})
	if err != nil {
		return nil, coreStatus(err, p)
	}
	p.logger.Info("Installed chain configuration", "epoch", meta.Epoch, "members", meta.memberIDs(), "role", p.core.Status().Role.String())
	p.meta = meta
	if err := p.applyConfig(meta.config); err != nil {
		// Validated before anything was stored; not reached.
		p.logger.Error(err, "Failed to apply the stream config")
	}
	// Forwarding and acknowledgement marks belong to the old neighbours.
	// A new epoch is a decision of the chain's master, which repairs logs
	// before it installs one; a restored partition waits for nothing else.
	p.fwdEnd, p.ackUp, p.restored, p.committedExact = 0, 0, false, true
	p.apply(eff)
	p.broadcast()
	p.m.epoch.Set(float64(meta.Epoch))
	p.startLink()
	return p.statusLocked(), nil
}

// statusLocked reports the partition. Callers hold p.mu.
func (p *partition) statusLocked() *catenapb.PartitionStatus {
	ps := &catenapb.PartitionStatus{Stream: p.stream, Partition: p.index, ReplicaId: p.srv.id}
	if p.failed != nil {
		ps.Error = p.failed.Error()
	}
	if p.meta != nil {
		ps.Members = p.meta.pbMembers()
		ps.Config = p.meta.config
	}
	if p.log != nil {
		ps.LogStart = p.log.StartOffset()
		ps.LogStartChecksum = p.log.StartChecksum()
		ps.LogEnd = p.log.NextOffset()
		ps.Checksum = p.log.RollingChecksum()
		ps.LastLogEpoch = lastLogEpoch(p.log)
	}
	ps.Holds = p.holds.pbHolds()
	ps.ForcedTrims = p.holds.pbForcedTrims()
	if p.core != nil {
		st := p.core.Status()
		ps.Epoch = st.Epoch
		ps.Role = catenapb.Role(st.Role)
		ps.Durable = st.DurableEnd
		ps.Committed = max(st.Committed, p.committed)
		ps.CommittedNotice = st.Noticed
		ps.Restored = p.restored
		ps.SuccessorAck = st.SuccessorAck
		if st.Successor != "" && !p.linkDownSince.IsZero() {
			ps.SuccessorDownMs = uint64(time.Since(p.linkDownSince).Milliseconds())
		}
		if st.Successor != "" && !p.stalledSince.IsZero() {
			// At least 1: something is owed (readers take any value for
			// "the link onwards is waiting"), however recently the
			// successor's process was heard.
			ps.SuccessorStalledMs = uint64(max(p.successorStalled(p.meta.addrOf(st.Successor)).Milliseconds(), 1))
		}
		if p.linkErr != nil {
			ps.SuccessorError = p.linkErr.Error()
		}
		ps.HeadUnreachableMs = p.headUnreachableMs(st.Epoch)
		if c := p.copy; c != nil && c.running() && st.Role == chain.RoleNone {
			ps.Copy = &catenapb.CatchUpCopy{SourceId: c.source, Start: c.start}
		}
	}
	return ps
}

// Status reports hosted partitions.
func (s *Server) Status(ctx context.Context, req *catenapb.StatusRequest) (*catenapb.StatusResponse, error) {
	s.mu.Lock()
	parts := make([]*partition, 0, len(s.partitions))
	for k, p := range s.partitions {
		if req.GetStream() != "" && k.stream != req.GetStream() {
			continue
		}
		if req.Partition != nil && k.index != req.GetPartition() {
			continue
		}
		parts = append(parts, p)
	}
	s.mu.Unlock()
	sort.Slice(parts, func(i, j int) bool {
		if parts[i].stream != parts[j].stream {
			return parts[i].stream < parts[j].stream
		}
		return parts[i].index < parts[j].index
	})
	resp := &catenapb.StatusResponse{ReplicaId: s.id, Features: []string{contract.FeatureRecordHeaders}}
	for _, p := range parts {
		p.mu.Lock()
		resp.Partitions = append(resp.Partitions, p.statusLocked())
		p.mu.Unlock()
	}
	if req.GetStream() != "" && req.Partition != nil && len(resp.Partitions) == 0 {
		return nil, status.Errorf(codes.NotFound, "partition %s/%d is not hosted on replica %s", req.GetStream(), req.GetPartition(), s.id)
	}
	return resp, nil
}

// Append stores a batch at the head of a partition's chain.
func (s *Server) Append(ctx context.Context, req *catenapb.AppendRequest) (*catenapb.AppendResponse, error) {
	p, err := s.lookup(req.GetStream(), req.GetPartition())
	if err != nil {
		return nil, err
	}
	return p.Append(ctx, req)
}

// Read serves committed records.
func (s *Server) Read(ctx context.Context, req *catenapb.FetchRequest) (*catenapb.FetchResponse, error) {
	p, err := s.lookup(req.GetStream(), req.GetPartition())
	if err != nil {
		return nil, err
	}
	return p.read(ctx, req)
}

// ListOffsets resolves an offset spec on this member.
func (s *Server) ListOffsets(ctx context.Context, req *catenapb.ListOffsetsRequest) (*catenapb.ListOffsetsResponse, error) {
	p, err := s.lookup(req.GetStream(), req.GetPartition())
	if err != nil {
		return nil, err
	}
	return p.listOffsets(req)
}

// every runs round every interval until the server stops; the caller
// has added it to s.wg.
func (s *Server) every(interval time.Duration, round func()) {
	defer s.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		round()
	}
}

// enforceRetention runs retention on every hosted partition once.
func (s *Server) enforceRetention() {
	for _, p := range s.openPartitions() {
		p.enforceRetention()
	}
}

// openPartitions is a snapshot of the hosted partitions.
func (s *Server) openPartitions() []*partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := make([]*partition, 0, len(s.partitions))
	for _, p := range s.partitions {
		parts = append(parts, p)
	}
	return parts
}

// Close stops every partition and closes its log.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.stop)
	parts := make([]*partition, 0, len(s.partitions))
	for _, p := range s.partitions {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	s.wg.Wait()
	if s.store != nil {
		// So that the next start replays next to nothing: frames after
		// it are in the files too once the logs close (each fsyncs).
		if err := s.store.Checkpoint(); err != nil {
			s.logger.Error(err, "Failed to checkpoint the journal at close; the next start replays from the last checkpoint")
		}
	}
	for _, p := range parts {
		p.close()
	}
	if s.store != nil {
		if err := s.store.Close(); err != nil {
			s.logger.Error(err, "Failed to close the journal")
		}
	}
	// Only after a complete start: one that failed opened only some of
	// the partitions the table names.
	if s.committedLoaded == nil {
		if err := s.persistCommitted(atCleanClose); err != nil {
			s.logger.Error(err, "Failed to record the committed offsets at close")
		}
	}
	s.pool.Close()
}

func (p *partition) close() {
	p.mu.Lock()
	if p.linkStop != nil {
		p.linkStop()
	}
	if p.copy != nil {
		p.copy.cancel()
	}
	close(p.stop)
	p.mu.Unlock()
	p.wg.Wait()
	// A clean stop leaves the next start nothing to read back.
	if err := p.saveDedup(1); err != nil {
		p.logger.Error(err, "Failed to save the de-duplication snapshot at close")
	}
	if p.log != nil {
		if err := p.log.Close(); err != nil {
			p.logger.Error(err, "Failed to close partition log")
		}
	}
}

// stallGrace bounds how long acknowledgements of other partitions hide a
// partition's own stall (successorStalled): past it, one partition wedged
// at a live successor (its writes hang; the process answers the rest) is
// reported stalled, and the planner cuts the link as it cuts a silent one.
// Far above the seconds an append waits on a machine loaded past capacity.
const stallGrace = 10 * time.Second

// successorStalled is how long the link to the successor at addr has owed
// acknowledgements (p.stalledSince set) while that process acknowledged
// nothing on any partition's link: whether a successor can be reached is
// its process's property, which the master judges per replica, and a
// process that acknowledges the other partitions' records is reachable
// however long this partition waits
// (TestASuccessorThatAcknowledgesOtherPartitionsIsNotStalled), up to
// stallGrace. Callers hold p.mu and have seen p.stalledSince set.
func (p *partition) successorStalled(addr string) time.Duration {
	silent := p.srv.successors.SilentSince(addr, p.stalledSince)
	return max(silent, time.Since(p.stalledSince)-stallGrace)
}

// verifyBytesPerSecond is how fast a replica reads, in the background,
// the sealed segments its logs' Open took from their summaries (all
// partitions together): about a quarter of what a copy may read, so that
// the chains' fsyncs on the same disk do not wait behind it
// (docs/benchmarks.md, "Catch-up of a replacement"). 500 GB take two
// hours and a half.
const verifyBytesPerSecond = 64 << 20

// DefaultScrubInterval is Options.ScrubInterval's default: a week, as
// Ceph's deep scrubs. A replica holding 2 TB of sealed segments reads
// them in 9 hours of the week at verifyBytesPerSecond.
const DefaultScrubInterval = 7 * 24 * time.Hour

func scrubIntervalOf(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultScrubInterval
	case d < 0:
		return 0
	}
	return d
}

// verifySealed reads the sealed segments the log's Open took from their
// summaries, paced, until it has read them or the partition stops, and
// then scrubs the log every scrub interval (Options.ScrubInterval): reads
// every sealed segment back. Damage found stops the partition being
// served, as damage found by Open did, and the chain repairs it. A read
// that fails (EIO) is tried again (readBack); one that keeps failing stops
// the partition being served too: what this replica cannot read back, it
// must not serve, and a copy from the chain replaces it.
func (p *partition) verifySealed() {
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	start := time.Now()
	verified := p.readBack(ctx, "verification", func(ctx context.Context) (bool, error) {
		left := p.log.Unverified()
		err := p.log.VerifySealed(ctx, p.paceReadBack)
		return p.log.Unverified() < left, err
	})
	if !verified {
		return
	}
	p.logger.V(1).Info("Verified the sealed segments opened from their summaries", "took", time.Since(start).String())
	every := p.srv.scrubInterval
	if every <= 0 {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(nextScrub(time.Now(), every, p.srv.id, p.stream, p.index))):
		}
		start, from := time.Now(), uint64(0)
		scrubbed := p.readBack(ctx, "scrub", func(ctx context.Context) (bool, error) {
			next, err := p.log.Scrub(ctx, from, p.paceReadBack)
			advanced := next > from
			from = next
			return advanced, err
		})
		if !scrubbed {
			return
		}
		p.srv.metrics.scrubs.Inc()
		p.logger.Info("Scrubbed the sealed segments: they read back as written", "upTo", from, "took", time.Since(start).String())
	}
}

// paceReadBack is the pace of verification and scrub reads: all of a
// replica's partitions together at verifyBytesPerSecond.
func (p *partition) paceReadBack(ctx context.Context, n int) error {
	p.srv.metrics.readBackBytes.Add(float64(n))
	return pace(ctx, p.srv.verifyLimit, int64(n))
}

// readBack runs read (a verification or a scrub, which says whether it
// got further than the last time) until it completes. A read that fails
// is tried again after a back-off, verifyAttempts times in all without
// getting further; then, or on damage (ErrCorrupt), the partition is
// marked corrupt. It says whether read completed: false when the
// partition is marked, stopping or failed otherwise (a failed fsync
// stops the replica).
func (p *partition) readBack(ctx context.Context, what string, read func(context.Context) (advanced bool, err error)) bool {
	backoff := verifyRetryMin
	for attempt := 1; ; attempt++ {
		advanced, err := read(ctx)
		if err != nil && advanced {
			attempt, backoff = 1, verifyRetryMin // a new stretch
		}
		switch {
		case err == nil:
			return true
		case errors.Is(err, partlog.ErrCorrupt):
			p.markCorrupt(fmt.Errorf("found by the %s: %w", what, err))
			return false
		case ctx.Err() != nil || errors.Is(err, partlog.ErrClosed) || errors.Is(err, partlog.ErrFailed):
			return false
		case attempt == verifyAttempts:
			p.markCorrupt(fmt.Errorf("%w: found by the %s: the sealed segments do not read back (%d attempts): %v", partlog.ErrCorrupt, what, attempt, err))
			return false
		}
		p.logger.Error(err, "Failed to read back a sealed segment; trying again", "during", what, "attempt", attempt, "backoff", backoff.String())
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

// nextScrub is when the next scrub of a partition's copy on replica id
// starts after now: slots every apart, at a phase within every set by a
// hash of the replica, stream and partition. So a replica's partitions,
// and the copies of a partition, spread their scrubs over the interval,
// and a restart neither delays a partition's scrub nor brings it
// forward.
func nextScrub(now time.Time, every time.Duration, id, stream string, index uint32) time.Time {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%d", id, stream, index)
	phase := time.Duration(h.Sum64() % uint64(every))
	since := time.Duration(now.UnixNano()) % every // into the current period
	at := now.Add(phase - since)
	if !at.After(now) {
		at = at.Add(every)
	}
	return at
}

// verifyAttempts and verifyRetryMin bound readBack's retries of a read
// that fails: 1, 2, 4 and 8 s apart (tests shorten them).
const verifyAttempts = 5

var verifyRetryMin = time.Second
