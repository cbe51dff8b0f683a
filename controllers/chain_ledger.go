package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// The chain ledger: where the operator records each chain's membership and
// epoch before any member runs it.
//
// A reorder's new membership must be stored before it is installed: an
// operator that installs first and dies leaves its decision only on members
// that may not answer the next operator, and an operator paused past its
// lease must not install over its successor's decision. The optimistic lock
// of one stored object orders two operators' decisions. The record used to
// be each ReplicationChain's status, one write per chain before its
// install; in a failover of hundreds of chains the API server's time per
// write bounded the repair (docs/benchmarks.md, 2026-12-03). The ledger is
// one ConfigMap per Stream, `<stream>-chain-ledger`, holding every
// partition's record, written by group commit: the decisions that arrive
// while a write is in flight go together in the next one, each checked
// against what the ledger holds for its chain, so a failover costs a few
// writes per Stream instead of one per chain. A ReplicationChain's status
// follows the ledger (its next reconcile copies the record, with what the
// members confirmed); the ledger, not the status, is the record.
//
// The ConfigMap is owned by the Stream (deleted with it) and labelled
// app.kubernetes.io/component=chain-ledger. Each key is
// `partition-<n>`, each value a JSON ledgerEntry; 1,024 partitions (the
// most a Stream has) take about 300 KiB, within a ConfigMap's 1 MiB. It
// is not for editing: an entry that does not decode stops the chain's
// master with an error rather than being overwritten.

// componentChainLedger labels the ledger ConfigMaps.
const componentChainLedger = "chain-ledger"

// errStaleRecord refuses a decision made from a record the ledger has
// since moved past: the caller plans again from the ledger.
var errStaleRecord = errors.New("the chain's record changed since it was read")

// ledgerEntry is one chain's record: the membership it runs under Epoch,
// and why and when it was decided.
type ledgerEntry struct {
	// Chain is the UID of the ReplicationChain that decided it. The
	// record is the partition's, whichever object shows it: a chain
	// deleted by hand and created again by its Stream takes it over (an
	// earlier Stream's ledger is never read, see load).
	Chain   types.UID                             `json:"chain"`
	Epoch   uint64                                `json:"epoch"`
	Members []string                              `json:"members"`
	Reason  streamsv1alpha1.ReconfigurationReason `json:"reason"`
	Message string                                `json:"message,omitempty"`
	Time    metav1.Time                           `json:"time"`
}

// ledgerIntent is a decision waiting for its group commit: Entry for
// Partition, decided from the record at epoch Base (0: none), in the
// ledger sl.
type ledgerIntent struct {
	Partition uint32
	Base      uint64
	Entry     ledgerEntry
	done      chan error
	sl        *streamLedger
}

// ledgerName is the name of a Stream's ledger ConfigMap.
func ledgerName(stream string) string { return stream + "-chain-ledger" }

func ledgerKey(partition uint32) string {
	return "partition-" + strconv.FormatUint(uint64(partition), 10)
}

// admitIntents decides which intents of a batch the ledger entries accept,
// in order: one decided from a record at least as new as its partition's
// entry, moving the epoch up. The base may be newer than the entry: the
// chain's status can be ahead of a ledger restored from a backup or
// written by an operator of an earlier version, and the record is the
// newer of the two; what orders two operators is the write's
// resourceVersion, not this check. It returns the entries with the
// accepted intents applied; entries is not changed.
func admitIntents(entries map[uint32]ledgerEntry, intents []*ledgerIntent) (next map[uint32]ledgerEntry, accepted, refused []*ledgerIntent) {
	next = maps.Clone(entries)
	if next == nil {
		next = map[uint32]ledgerEntry{}
	}
	for _, it := range intents {
		cur, ok := next[it.Partition]
		if ok && cur.Epoch > it.Base || it.Entry.Epoch <= it.Base {
			refused = append(refused, it)
			continue
		}
		next[it.Partition] = it.Entry
		accepted = append(accepted, it)
	}
	return next, accepted, refused
}

// decodeLedger reads a ledger ConfigMap's entries.
func decodeLedger(cm *corev1.ConfigMap) (map[uint32]ledgerEntry, error) {
	entries := map[uint32]ledgerEntry{}
	for k, v := range cm.Data {
		n, ok := strings.CutPrefix(k, "partition-")
		p, err := strconv.ParseUint(n, 10, 32)
		if !ok || err != nil {
			return nil, fmt.Errorf("ledger %s/%s: key %q is not partition-<n>", cm.Namespace, cm.Name, k)
		}
		var e ledgerEntry
		if err := json.Unmarshal([]byte(v), &e); err != nil {
			return nil, fmt.Errorf("ledger %s/%s: %s does not decode: %w", cm.Namespace, cm.Name, k, err)
		}
		if e.Chain == "" || e.Epoch == 0 || len(e.Members) == 0 {
			return nil, fmt.Errorf("ledger %s/%s: %s lacks its chain, epoch or members: %s", cm.Namespace, cm.Name, k, v)
		}
		entries[uint32(p)] = e
	}
	return entries, nil
}

// encodeLedger writes entries into data.
func encodeLedger(entries map[uint32]ledgerEntry) (map[string]string, error) {
	data := make(map[string]string, len(entries))
	for p, e := range entries {
		b, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		data[ledgerKey(p)] = string(b)
	}
	return data, nil
}

// applyLedgerEntry makes status show the record e: its members (a kept
// member keeps its state and confirmation, a new one starts catching up),
// epoch and reconfiguration.
func applyLedgerEntry(status *streamsv1alpha1.ReplicationChainStatus, e ledgerEntry) {
	prev := map[string]streamsv1alpha1.ChainMember{}
	for _, m := range status.Members {
		prev[m.Name] = m
	}
	status.TargetEpoch = int64(e.Epoch)
	status.Members = nil
	for _, name := range e.Members {
		m, ok := prev[name]
		if !ok {
			m = streamsv1alpha1.ChainMember{Name: name, State: streamsv1alpha1.MemberCatchingUp}
			if e.Reason == streamsv1alpha1.ReconfigurationCreated {
				m.State = streamsv1alpha1.MemberInChain
			}
		}
		status.Members = append(status.Members, m)
	}
	status.LastReconfiguration = &streamsv1alpha1.Reconfiguration{
		Time: e.Time, Epoch: int64(e.Epoch), Reason: e.Reason, Message: e.Message,
	}
}

// chainLedgers are the ledgers of every Stream, as this operator last read
// or wrote them.
type chainLedgers struct {
	// Client writes (and its scheme sets owner references); Reader reads
	// the API server directly: a ledger is read once, then on a conflict.
	Client client.Client
	Reader client.Reader

	mu sync.Mutex
	// streams by Stream UID: a Stream deleted and created again under
	// its name has a ledger of its own.
	streams map[types.UID]*streamLedger
}

// streamLedger is one Stream's ledger and its group commit.
type streamLedger struct {
	name types.NamespacedName // the Stream's
	mu   sync.Mutex
	// loaded: cm and entries are what this operator last read or wrote
	// (cm nil: no ConfigMap yet).
	loaded  bool
	cm      *corev1.ConfigMap
	entries map[uint32]ledgerEntry
	// pending wait for the next write; inflight are in the current one.
	pending, inflight []*ledgerIntent
	writing           bool
	// turn is closed when a write ends: a waiter whose decision is still
	// pending makes the next one.
	turn chan struct{}
}

func (l *chainLedgers) of(uid types.UID, name types.NamespacedName) *streamLedger {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streams == nil {
		l.streams = map[types.UID]*streamLedger{}
	}
	sl := l.streams[uid]
	if sl == nil {
		sl = &streamLedger{name: name, turn: make(chan struct{})}
		l.streams[uid] = sl
	}
	return sl
}

// forget drops what is known of the ledgers of Streams of a name (the
// Stream is gone). A caller still waiting on one keeps it.
func (l *chainLedgers) forget(stream types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for uid, sl := range l.streams {
		if sl.name == stream {
			delete(l.streams, uid)
		}
	}
}

// record is partition's entry in the Stream's ledger, nil when it has
// none. The ledger is read from the API server the first time.
func (l *chainLedgers) record(ctx context.Context, stream *streamsv1alpha1.Stream, partition uint32) (*ledgerEntry, error) {
	sl := l.of(stream.UID, client.ObjectKeyFromObject(stream))
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if !sl.loaded {
		if err := l.load(ctx, sl, stream); err != nil {
			return nil, err
		}
	}
	return sl.entryOf(partition), nil
}

// peek is what record returns, or the newest decision waiting to be
// committed, for the partition of the Stream whose UID is stream, without
// reading the API: for placements, which count the chains placed a moment
// ago.
func (l *chainLedgers) peek(stream types.UID, partition uint32) *ledgerEntry {
	l.mu.Lock()
	sl := l.streams[stream]
	l.mu.Unlock()
	if sl == nil {
		return nil
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	for _, it := range slices.Backward(slices.Concat(sl.inflight, sl.pending)) {
		if it.Partition == partition {
			e := it.Entry
			return &e
		}
	}
	return sl.entryOf(partition)
}

// showRecords makes each chain's status show its ledger's record (with
// the decisions waiting to be written) where the status lags it: a
// changed chain's status is written in its next round. For readers that
// must not act on a membership the operator has already changed: a
// placement counting the chains on each pod, a chains-ready gate. Each
// Stream's ledger is read the first time.
func (l *chainLedgers) showRecords(ctx context.Context, c client.Reader, chains []streamsv1alpha1.ReplicationChain) error {
	known := map[types.UID]bool{}
	for i := range chains {
		ch := &chains[i]
		owner := metav1.GetControllerOf(ch)
		if owner == nil || owner.Kind != "Stream" || ch.Spec.Partition == nil {
			continue
		}
		ok, seen := known[owner.UID]
		if !seen {
			var stream streamsv1alpha1.Stream
			err := c.Get(ctx, types.NamespacedName{Namespace: ch.Namespace, Name: owner.Name}, &stream)
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("failed to read Stream %s: %w", owner.Name, err)
			}
			ok = err == nil && stream.UID == owner.UID && stream.DeletionTimestamp.IsZero()
			if ok {
				if _, err := l.record(ctx, &stream, 0); err != nil {
					return err
				}
			}
			known[owner.UID] = ok
		}
		if !ok {
			continue
		}
		if e := l.peek(owner.UID, uint32(*ch.Spec.Partition)); e != nil && int64(e.Epoch) > ch.Status.TargetEpoch {
			applyLedgerEntry(&ch.Status, *e)
		}
	}
	return nil
}

func (sl *streamLedger) entryOf(partition uint32) *ledgerEntry {
	e, ok := sl.entries[partition]
	if !ok {
		return nil
	}
	return &e
}

// submit queues a decision for the Stream's next group commit; wait
// returns once it is written (nil) or refused.
func (l *chainLedgers) submit(stream *streamsv1alpha1.Stream, partition uint32, base uint64, e ledgerEntry) *ledgerIntent {
	sl := l.of(stream.UID, client.ObjectKeyFromObject(stream))
	it := &ledgerIntent{Partition: partition, Base: base, Entry: e, done: make(chan error, 1), sl: sl}
	sl.mu.Lock()
	sl.pending = append(sl.pending, it)
	sl.mu.Unlock()
	return it
}

// wait returns once it is written or refused. If no write of the Stream's
// ledger is in flight, the caller makes one, with every decision queued by
// then (its own among them); decisions arriving meanwhile go in the next
// write, made by one of their own callers: a caller writes once, and is
// not held up writing the decisions of chains that came after it.
func (l *chainLedgers) wait(ctx context.Context, stream *streamsv1alpha1.Stream, it *ledgerIntent) error {
	sl := it.sl
	for {
		select {
		case err := <-it.done:
			return err
		default:
		}
		sl.mu.Lock()
		if sl.writing || len(sl.pending) == 0 {
			turn := sl.turn
			sl.mu.Unlock()
			select {
			case err := <-it.done:
				return err
			case <-turn:
				continue
			case <-ctx.Done():
				// It may still be written: the next round reads the ledger.
				return ctx.Err()
			}
		}
		batch := sl.pending
		sl.pending, sl.inflight, sl.writing = nil, batch, true
		sl.mu.Unlock()
		if err := l.write(ctx, sl, stream, batch); err != nil {
			for _, b := range batch {
				resolve(b, err)
			}
		}
		sl.mu.Lock()
		sl.inflight, sl.writing = nil, false
		close(sl.turn)
		sl.turn = make(chan struct{})
		sl.mu.Unlock()
	}
}

// commit is submit and wait.
func (l *chainLedgers) commit(ctx context.Context, stream *streamsv1alpha1.Stream, partition uint32, base uint64, e ledgerEntry) error {
	return l.wait(ctx, stream, l.submit(stream, partition, base, e))
}

// resolve tells an intent's waiter its outcome, once.
func resolve(it *ledgerIntent, err error) {
	select {
	case it.done <- err:
	default:
	}
}

// ledgerWriteAttempts bounds how often a batch is retried after a conflict
// (another operator wrote the ledger) before its decisions are refused.
const ledgerWriteAttempts = 4

// write stores batch in the ledger; only the Stream's writer (sl.writing)
// calls it, and it holds sl.mu only between its API calls. Each intent is
// resolved, an accepted one once stored; an error is for the intents not
// resolved.
func (l *chainLedgers) write(ctx context.Context, sl *streamLedger, stream *streamsv1alpha1.Stream, batch []*ledgerIntent) error {
	for range ledgerWriteAttempts {
		sl.mu.Lock()
		if !sl.loaded {
			if err := l.load(ctx, sl, stream); err != nil {
				sl.mu.Unlock()
				return err
			}
		}
		next, accepted, refused := admitIntents(sl.entries, batch)
		stored := sl.cm
		if len(refused) > 0 {
			// Decided from a record older than this copy of the ledger
			// (or newer: another operator's copy): read it again before
			// their chains decide again.
			sl.loaded = false
		}
		sl.mu.Unlock()
		for _, it := range refused {
			resolve(it, fmt.Errorf("partition %d at epoch %d: %w", it.Partition, it.Base, errStaleRecord))
		}
		if len(accepted) == 0 {
			return nil
		}
		data, err := encodeLedger(next)
		if err != nil {
			return fmt.Errorf("failed to encode the chain ledger of Stream %s: %w", stream.Name, err)
		}
		var cm *corev1.ConfigMap
		if stored == nil {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Namespace: stream.Namespace, Name: ledgerName(stream.Name),
				Labels: map[string]string{labelName: appName, labelComponent: componentChainLedger, labelInstance: stream.Name,
					labelManagedBy: fieldOwner, labelStream: stream.Name},
			}, Data: data}
			if err := controllerutil.SetControllerReference(stream, cm, l.Client.Scheme()); err != nil {
				return fmt.Errorf("failed to own the chain ledger of Stream %s: %w", stream.Name, err)
			}
			err = l.Client.Create(ctx, cm)
		} else {
			cm = stored.DeepCopy()
			cm.Data = data
			err = l.Client.Update(ctx, cm) // optimistic: stored's resourceVersion
		}
		sl.mu.Lock()
		switch {
		case err == nil:
			sl.cm, sl.entries = cm, next
			sl.mu.Unlock()
			for _, it := range accepted {
				resolve(it, nil)
			}
			return nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err):
			// Another operator wrote it (or it was deleted): read it again
			// and check the batch against what it holds now.
			sl.loaded = false
			sl.mu.Unlock()
			batch = accepted
		default:
			// The write may have landed: read it again before the next.
			sl.loaded = false
			sl.mu.Unlock()
			return fmt.Errorf("failed to write the chain ledger of Stream %s: %w", stream.Name, err)
		}
	}
	return fmt.Errorf("failed to write the chain ledger of Stream %s: %d conflicts in a row", stream.Name, ledgerWriteAttempts)
}

// load reads the Stream's ledger from the API server (sl.mu held: a
// first read, or a read after a conflict, holds up the Stream's others).
// A ConfigMap of that name that is not a ledger is an error, never
// overwritten. One owned by another Stream UID is an earlier Stream's
// (being garbage collected), deleted, when the API server says the
// Stream is the one given; if it says the ConfigMap's owner is the
// Stream, the one given is a stale copy and nothing is read.
func (l *chainLedgers) load(ctx context.Context, sl *streamLedger, stream *streamsv1alpha1.Stream) error {
	cm := &corev1.ConfigMap{}
	err := l.Reader.Get(ctx, types.NamespacedName{Namespace: stream.Namespace, Name: ledgerName(stream.Name)}, cm)
	switch {
	case apierrors.IsNotFound(err):
		sl.loaded, sl.cm, sl.entries = true, nil, map[uint32]ledgerEntry{}
		return nil
	case err != nil:
		return fmt.Errorf("failed to read the chain ledger of Stream %s: %w", stream.Name, err)
	}
	if cm.Labels[labelComponent] != componentChainLedger {
		return fmt.Errorf("ConfigMap %s/%s is in the way of Stream %s's chain ledger: it is not labelled %s=%s; rename it",
			cm.Namespace, cm.Name, stream.Name, labelComponent, componentChainLedger)
	}
	if owner := metav1.GetControllerOf(cm); owner == nil || owner.UID != stream.UID {
		live := &streamsv1alpha1.Stream{}
		if err := l.Reader.Get(ctx, client.ObjectKeyFromObject(stream), live); err != nil {
			return fmt.Errorf("failed to read Stream %s to tell whose chain ledger %s is: %w", stream.Name, cm.Name, err)
		}
		if live.UID != stream.UID {
			return fmt.Errorf("stream %s was deleted and created again: waiting for the cache to show the new one", stream.Name)
		}
		// An earlier Stream's: its records are not this one's.
		if err := l.Client.Delete(ctx, cm, client.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("failed to delete the chain ledger of an earlier Stream %s: %w", stream.Name, err)
		}
		sl.loaded, sl.cm, sl.entries = true, nil, map[uint32]ledgerEntry{}
		return nil
	}
	entries, err := decodeLedger(cm)
	if err != nil {
		return err
	}
	sl.loaded, sl.cm, sl.entries = true, cm, entries
	return nil
}
