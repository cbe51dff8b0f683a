package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func entry(chain string, epoch uint64, members ...string) ledgerEntry {
	return ledgerEntry{Chain: types.UID(chain), Epoch: epoch, Members: members, Reason: streamsv1alpha1.ReconfigurationMiddleFailed}
}

func TestAdmitIntents(t *testing.T) {
	held := map[uint32]ledgerEntry{0: entry("c0", 5, "a", "b"), 1: entry("old1", 9, "a", "b", "c")}
	for _, tc := range []struct {
		name     string
		intents  []*ledgerIntent
		accepted []int // indexes into intents
		want     map[uint32]uint64
	}{
		{"decided from the entry: accepted", []*ledgerIntent{{Partition: 0, Base: 5, Entry: entry("c0", 6, "b")}}, []int{0}, map[uint32]uint64{0: 6}},
		{"decided from an older record: refused (another operator moved it)", []*ledgerIntent{{Partition: 0, Base: 4, Entry: entry("c0", 5, "b")}}, nil, map[uint32]uint64{0: 5}},
		{"decided from a newer record than the entry (a status ahead of a restored ledger): accepted", []*ledgerIntent{{Partition: 0, Base: 6, Entry: entry("c0", 7, "b")}}, []int{0}, map[uint32]uint64{0: 7}},
		{"no entry: decided from the status, accepted", []*ledgerIntent{{Partition: 2, Base: 3, Entry: entry("c2", 4, "a")}}, []int{0}, map[uint32]uint64{2: 4}},
		{"placement: no entry, base 0", []*ledgerIntent{{Partition: 2, Base: 0, Entry: entry("c2", 1, "a", "b", "c")}}, []int{0}, map[uint32]uint64{2: 1}},
		{"a chain created again by hand decides from the partition's record", []*ledgerIntent{{Partition: 1, Base: 9, Entry: entry("c1", 10, "a")}}, []int{0}, map[uint32]uint64{1: 10}},
		{"a chain created again by hand does not place the partition anew", []*ledgerIntent{{Partition: 1, Base: 0, Entry: entry("c1", 1, "a")}}, nil, map[uint32]uint64{1: 9}},
		{"the epoch must grow", []*ledgerIntent{{Partition: 0, Base: 5, Entry: entry("c0", 5, "b")}}, nil, map[uint32]uint64{0: 5}},
		{"two decisions from one record in a batch: the first wins", []*ledgerIntent{
			{Partition: 0, Base: 5, Entry: entry("c0", 6, "b")},
			{Partition: 0, Base: 5, Entry: entry("c0", 6, "a")},
		}, []int{0}, map[uint32]uint64{0: 6}},
		{"a decision built on the one before it in the batch", []*ledgerIntent{
			{Partition: 0, Base: 5, Entry: entry("c0", 6, "b")},
			{Partition: 0, Base: 6, Entry: entry("c0", 7, "b", "c")},
		}, []int{0, 1}, map[uint32]uint64{0: 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, accepted, refused := admitIntents(held, tc.intents)
			var got []int
			for i, it := range tc.intents {
				if slices.Contains(accepted, it) {
					got = append(got, i)
				} else if !slices.Contains(refused, it) {
					t.Fatalf("intent %d neither accepted nor refused", i)
				}
			}
			if !slices.Equal(got, tc.accepted) {
				t.Errorf("accepted %v, want %v", got, tc.accepted)
			}
			for p, epoch := range tc.want {
				if next[p].Epoch != epoch {
					t.Errorf("partition %d at epoch %d, want %d", p, next[p].Epoch, epoch)
				}
			}
			if held[0].Epoch != 5 || held[1].Chain != "old1" {
				t.Errorf("the entries given were changed: %v", held)
			}
		})
	}
}

func TestLedgerEncodesAndDecodes(t *testing.T) {
	in := map[uint32]ledgerEntry{0: entry("c0", 5, "a", "b"), 1023: entry("c1023", 1, "c")}
	in[0] = ledgerEntry{Chain: "c0", Epoch: 5, Members: []string{"a", "b"}, Reason: streamsv1alpha1.ReconfigurationHeadFailed,
		Message: "why", Time: metav1.NewTime(time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC))}
	data, err := encodeLedger(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := data["partition-1023"]; !ok {
		t.Fatalf("keys %v", data)
	}
	out, err := decodeLedger(&corev1.ConfigMap{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	if !out[0].Time.Time.Equal(in[0].Time.Time) || out[0].Message != "why" || !slices.Equal(out[1023].Members, []string{"c"}) {
		t.Errorf("decoded %+v, want %+v", out, in)
	}
	for _, bad := range []map[string]string{
		{"p0": `{"chain":"c","epoch":1,"members":["a"]}`},
		{"partition-x": `{"chain":"c","epoch":1,"members":["a"]}`},
		{"partition-0": `{"chain":"c","epoch":1,`},
		{"partition-0": `{"chain":"c","epoch":0,"members":["a"]}`},
		{"partition-0": `{"epoch":1,"members":["a"]}`},
		{"partition-0": `{"chain":"c","epoch":1}`},
	} {
		if _, err := decodeLedger(&corev1.ConfigMap{Data: bad}); err == nil {
			t.Errorf("%v decoded", bad)
		}
	}
}

func TestApplyLedgerEntry(t *testing.T) {
	status := streamsv1alpha1.ReplicationChainStatus{TargetEpoch: 4, Members: []streamsv1alpha1.ChainMember{
		{Name: "a", State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: 4},
		{Name: "b", State: streamsv1alpha1.MemberFailed, ConfirmedEpoch: 4},
		{Name: "c", State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: 4},
	}}
	applyLedgerEntry(&status, ledgerEntry{Chain: "x", Epoch: 5, Members: []string{"a", "c", "d"}, Reason: streamsv1alpha1.ReconfigurationMiddleFailed, Message: "m"})
	want := []streamsv1alpha1.ChainMember{
		{Name: "a", State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: 4},
		{Name: "c", State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: 4},
		{Name: "d", State: streamsv1alpha1.MemberCatchingUp},
	}
	if status.TargetEpoch != 5 || !slices.Equal(status.Members, want) || status.LastReconfiguration.Epoch != 5 || status.LastReconfiguration.Message != "m" {
		t.Errorf("status %+v", status)
	}
}

// ledgerTestEnv is a Stream in a fake API server and the ledgers of
// operators reading and writing it.
type ledgerTestEnv struct {
	t      *testing.T
	client client.Client
	stream *streamsv1alpha1.Stream
}

// testScheme knows Kubernetes' kinds and Catena's, for fake clients.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := streamsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

func newLedgerTestEnv(t *testing.T, objs ...client.Object) *ledgerTestEnv {
	scheme := testScheme(t)
	stream := &streamsv1alpha1.Stream{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orders", UID: "stream-uid"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(objs, stream)...).Build()
	return &ledgerTestEnv{t: t, client: c, stream: stream}
}

// operator is one operator's ledgers, writing through c (nil: the API
// server's client).
func (e *ledgerTestEnv) operator(c client.Client) *chainLedgers {
	if c == nil {
		c = e.client
	}
	return &chainLedgers{Client: c, Reader: e.client}
}

func (e *ledgerTestEnv) stored() map[uint32]ledgerEntry {
	e.t.Helper()
	cm := &corev1.ConfigMap{}
	if err := e.client.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "orders-chain-ledger"}, cm); err != nil {
		e.t.Fatal(err)
	}
	entries, err := decodeLedger(cm)
	if err != nil {
		e.t.Fatal(err)
	}
	return entries
}

// An operator paused past its lease resumes and writes a decision it made
// before its successor decided: the ledger's optimistic lock refuses it,
// and what the successor recorded stands.
func TestLedgerFencesAnOperatorThatDecidedFromAnOlderRecord(t *testing.T) {
	ctx := context.Background()
	env := newLedgerTestEnv(t)
	old, next := env.operator(nil), env.operator(nil)
	if err := old.commit(ctx, env.stream, 0, 0, entry("c0", 1, "a", "b", "c")); err != nil {
		t.Fatal(err)
	}
	// Both read the record at epoch 1.
	for _, l := range []*chainLedgers{old, next} {
		if rec, err := l.record(ctx, env.stream, 0); err != nil || rec == nil || rec.Epoch != 1 {
			t.Fatalf("record %+v, %v", rec, err)
		}
	}
	if err := next.commit(ctx, env.stream, 0, 1, entry("c0", 2, "b", "c")); err != nil {
		t.Fatalf("the successor: %v", err)
	}
	err := old.commit(ctx, env.stream, 0, 1, entry("c0", 2, "a", "c"))
	if !errors.Is(err, errStaleRecord) {
		t.Fatalf("the paused operator's decision: %v, want it refused", err)
	}
	if got := env.stored()[0]; got.Epoch != 2 || !slices.Equal(got.Members, []string{"b", "c"}) {
		t.Errorf("ledger holds %+v, want the successor's [b c] at 2", got)
	}
	// The refused operator reads the ledger again: it plans from the
	// successor's record.
	if rec, err := old.record(ctx, env.stream, 0); err != nil || rec.Epoch != 2 {
		t.Errorf("after the refusal, record %+v, %v", rec, err)
	}
	// A decision of another chain, from a record nobody moved, goes
	// through even after a conflict on the ledger.
	if err := old.commit(ctx, env.stream, 1, 0, entry("c1", 1, "a", "b", "c")); err != nil {
		t.Errorf("another chain: %v", err)
	}
}

// blockingClient holds each ledger write until released, and counts them.
type blockingClient struct {
	client.Client
	writes  atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (c *blockingClient) hold() {
	c.writes.Add(1)
	c.entered <- struct{}{}
	<-c.release
}

func (c *blockingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.hold()
	return c.Client.Create(ctx, obj, opts...)
}

func (c *blockingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.hold()
	return c.Client.Update(ctx, obj, opts...)
}

// The decisions that arrive while a write is in flight go together in the
// next one: 64 chains' decisions take two writes, and the caller that made
// the first is not held up by the second.
func TestLedgerGroupCommit(t *testing.T) {
	ctx := context.Background()
	env := newLedgerTestEnv(t)
	bc := &blockingClient{Client: env.client, entered: make(chan struct{}, 100), release: make(chan struct{})}
	l := env.operator(bc)
	const n = 64
	errs := make(chan error, n)
	go func() { errs <- l.commit(ctx, env.stream, 0, 0, entry("c0", 1, "a")) }()
	<-bc.entered // the first write is in flight
	// Every other decision is queued behind the write in flight (queued
	// here, so that the test need not wait for the goroutines to get
	// there), and each of their callers waits for it.
	var wg sync.WaitGroup
	for p := 1; p < n; p++ {
		it := l.submit(env.stream, uint32(p), 0, entry(fmt.Sprintf("c%d", p), 1, "a"))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- l.wait(ctx, env.stream, it)
		}()
	}
	// The first caller returns once its own write lands, while the next
	// write (the other 63, made by one of their callers) is in flight.
	bc.release <- struct{}{}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	<-bc.entered
	select {
	case err := <-errs:
		t.Fatalf("a decision of the second write returned before it: %v", err)
	default:
	}
	bc.release <- struct{}{}
	wg.Wait()
	for range n - 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if w := bc.writes.Load(); w != 2 {
		t.Errorf("%d writes for %d decisions, want 2", w, n)
	}
	if got := len(env.stored()); got != n {
		t.Errorf("%d entries stored, want %d", got, n)
	}
}

// A ConfigMap of the ledger's name that is not a ledger is never
// overwritten; one left by an earlier Stream of the same name is replaced.
func TestLedgerOwnership(t *testing.T) {
	ctx := context.Background()
	theirs := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orders-chain-ledger"}, Data: map[string]string{"k": "v"}}
	env := newLedgerTestEnv(t, theirs)
	err := env.operator(nil).commit(ctx, env.stream, 0, 0, entry("c0", 1, "a"))
	if err == nil || !strings.Contains(err.Error(), "is in the way of Stream orders's chain ledger") {
		t.Fatalf("over a user's ConfigMap: %v", err)
	}
	cm := &corev1.ConfigMap{}
	if err := env.client.Get(ctx, client.ObjectKeyFromObject(theirs), cm); err != nil || cm.Data["k"] != "v" {
		t.Fatalf("the user's ConfigMap: %v, %v", cm.Data, err)
	}

	// The cache still shows an earlier Stream of the name while the API
	// server has the new one, which owns the ledger: nothing is deleted.
	owned := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orders-chain-ledger",
		Labels:          map[string]string{labelComponent: componentChainLedger},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "streams.catena.io/v1alpha1", Kind: "Stream", Name: "orders", UID: "stream-uid", Controller: ptr.To(true)}},
	}, Data: map[string]string{"partition-0": `{"chain":"c0","epoch":3,"members":["x"]}`}}
	env = newLedgerTestEnv(t, owned)
	staleCopy := env.stream.DeepCopy()
	staleCopy.UID = "deleted-stream-uid"
	if _, err := env.operator(nil).record(ctx, staleCopy, 0); err == nil || !strings.Contains(err.Error(), "deleted and created again") {
		t.Fatalf("a stale Stream: %v", err)
	}
	if got := env.stored(); got[0].Epoch != 3 {
		t.Fatalf("the new Stream's ledger after a stale Stream's read: %+v", got)
	}

	earlier := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orders-chain-ledger",
		Labels:          map[string]string{labelComponent: componentChainLedger},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "streams.catena.io/v1alpha1", Kind: "Stream", Name: "orders", UID: "earlier", Controller: ptr.To(true)}},
	}, Data: map[string]string{"partition-0": `{"chain":"old","epoch":9,"members":["x"]}`}}
	env = newLedgerTestEnv(t, earlier)
	l := env.operator(nil)
	if rec, err := l.record(ctx, env.stream, 0); err != nil || rec != nil {
		t.Fatalf("an earlier Stream's record: %+v, %v", rec, err)
	}
	if err := env.client.Get(ctx, client.ObjectKeyFromObject(earlier), cm); !apierrors.IsNotFound(err) {
		t.Fatalf("the earlier Stream's ledger: %v", err)
	}
	if err := l.commit(ctx, env.stream, 0, 0, entry("c0", 1, "a")); err != nil {
		t.Fatal(err)
	}
	if got := env.stored(); len(got) != 1 || got[0].Chain != "c0" {
		t.Errorf("ledger %+v", got)
	}
	if err := env.client.Get(ctx, client.ObjectKeyFromObject(earlier), cm); err != nil || metav1.GetControllerOf(cm).UID != "stream-uid" {
		t.Errorf("owner of the new ledger: %+v, %v", cm.OwnerReferences, err)
	}
}

// A Stream's ledger forgotten (its Stream seen deleted by another chain's
// reconcile) between a decision's submit and its wait: the wait writes it
// all the same, in the ledger it was queued in.
func TestLedgerForgottenBetweenSubmitAndWait(t *testing.T) {
	ctx := context.Background()
	env := newLedgerTestEnv(t)
	l := env.operator(nil)
	it := l.submit(env.stream, 0, 0, entry("c0", 1, "a"))
	l.forget(client.ObjectKeyFromObject(env.stream))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.wait(wctx, env.stream, it); err != nil {
		t.Fatal(err)
	}
	if got := env.stored(); got[0].Epoch != 1 {
		t.Errorf("ledger %+v", got)
	}
}

// Readers of a chain's status that must not act on a membership already
// changed (placements, chains-ready gates) see the ledger's record; a
// chain of an earlier Stream of the name is left as it is.
func TestShowRecords(t *testing.T) {
	ctx := context.Background()
	env := newLedgerTestEnv(t)
	l := env.operator(nil)
	if err := l.commit(ctx, env.stream, 0, 3, entry("c0", 4, "b", "c", "d")); err != nil {
		t.Fatal(err)
	}
	chain := func(owner types.UID) streamsv1alpha1.ReplicationChain {
		return streamsv1alpha1.ReplicationChain{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orders-0", OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "streams.catena.io/v1alpha1", Kind: "Stream", Name: "orders", UID: owner, Controller: ptr.To(true)}}},
			Spec: streamsv1alpha1.ReplicationChainSpec{Partition: ptr.To[int32](0)},
			Status: streamsv1alpha1.ReplicationChainStatus{TargetEpoch: 3, Members: []streamsv1alpha1.ChainMember{
				{Name: "a", State: streamsv1alpha1.MemberInChain}, {Name: "b", State: streamsv1alpha1.MemberInChain}, {Name: "c", State: streamsv1alpha1.MemberInChain}}},
		}
	}
	chains := []streamsv1alpha1.ReplicationChain{chain("stream-uid"), chain("earlier")}
	if err := env.operator(nil).showRecords(ctx, env.client, chains); err != nil {
		t.Fatal(err)
	}
	got := chains[0].Status
	if got.TargetEpoch != 4 || len(got.Members) != 3 || got.Members[0].Name != "b" || got.Members[2].State != streamsv1alpha1.MemberCatchingUp {
		t.Errorf("the Stream's chain shows %+v, want the ledger's [b c d] at 4 with d catching up", got)
	}
	if chains[1].Status.TargetEpoch != 3 {
		t.Errorf("an earlier Stream's chain shows %+v", chains[1].Status)
	}
}
