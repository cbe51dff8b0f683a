// Package aggregator is the aggregation role: it folds the records of a
// source stream's partitions into per-key aggregates, checkpoints them
// incrementally into an internal Catena stream, and restores a shard
// from its latest good checkpoint so that the restored state equals the
// state folded from the whole log. docs/aggregations.md describes the
// design and the checkpoint format.
package aggregator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// fn is one aggregate function.
type fn uint8

const (
	fnCount fn = iota + 1
	fnSum
	fnMin
	fnMax
	fnDistinct
)

var fnNames = map[streamsv1alpha1.AggregateFunction]fn{
	streamsv1alpha1.AggregateCount:         fnCount,
	streamsv1alpha1.AggregateSum:           fnSum,
	streamsv1alpha1.AggregateMin:           fnMin,
	streamsv1alpha1.AggregateMax:           fnMax,
	streamsv1alpha1.AggregateDistinctCount: fnDistinct,
}

func (f fn) String() string {
	for name, v := range fnNames {
		if v == f {
			return string(name)
		}
	}
	return "fn(" + strconv.Itoa(int(f)) + ")"
}

// aggregate is one compiled aggregate: its function and the field path it
// reads.
type aggregate struct {
	name  string
	fn    fn
	field []string
}

// Plan is a compiled AggregationSpec: how to find a record's key, window
// and values.
type Plan struct {
	// Source is the stream aggregated.
	Source     string
	keyField   []string // nil: the record key
	aggregates []aggregate
	windowMs   int64 // 0: no window
	// needsJSON: some aggregate or the key reads the record's value.
	needsJSON bool
	// fields are the paths read from values: the key field's at index 0
	// (when the key is a field), then each aggregate's at 1+i.
	fields *fieldTrie

	Interval      time.Duration
	SnapshotEvery int
	// Fingerprint identifies the key, aggregates and window: checkpoints
	// written under another fingerprint describe other state and are not
	// loaded.
	Fingerprint string
}

// Compile checks spec and compiles it. The API server validates the same
// rules for Aggregations applied to a cluster; Compile also guards specs
// read from files by a standalone aggregator.
func Compile(spec streamsv1alpha1.AggregationSpec) (*Plan, error) {
	p := &Plan{Source: spec.Source, Interval: spec.CheckpointInterval.Duration, SnapshotEvery: int(spec.SnapshotEvery)}
	if spec.Source == "" {
		return nil, fmt.Errorf("spec.source must name the stream to aggregate")
	}
	if p.Interval <= 0 {
		p.Interval = 10 * time.Second
	}
	if p.Interval < time.Second {
		return nil, fmt.Errorf("spec.checkpointInterval %s is below the 1s minimum", p.Interval)
	}
	if p.SnapshotEvery <= 0 {
		p.SnapshotEvery = 10
	}
	if f := spec.Key.Field; f != "" {
		path, err := fieldPath(f)
		if err != nil {
			return nil, fmt.Errorf("spec.key.field: %w", err)
		}
		p.keyField, p.needsJSON = path, true
	}
	if len(spec.Aggregates) == 0 {
		return nil, fmt.Errorf("spec.aggregates must name at least one aggregate")
	}
	seen := map[string]bool{}
	for i, a := range spec.Aggregates {
		f, ok := fnNames[a.Function]
		if !ok {
			return nil, fmt.Errorf("spec.aggregates[%d].function %q is not one of Count, Sum, Min, Max, DistinctCount", i, a.Function)
		}
		if a.Name == "" {
			return nil, fmt.Errorf("spec.aggregates[%d].name must not be empty", i)
		}
		if seen[a.Name] {
			return nil, fmt.Errorf("spec.aggregates[%d].name %q is used twice", i, a.Name)
		}
		seen[a.Name] = true
		agg := aggregate{name: a.Name, fn: f}
		if f != fnCount {
			if a.Field == "" {
				return nil, fmt.Errorf("spec.aggregates[%d] (%s) needs a field", i, a.Function)
			}
			path, err := fieldPath(a.Field)
			if err != nil {
				return nil, fmt.Errorf("spec.aggregates[%d].field: %w", i, err)
			}
			agg.field, p.needsJSON = path, true
		}
		p.aggregates = append(p.aggregates, agg)
	}
	if w := spec.Window; w != nil {
		if w.Tumbling.Duration < time.Second {
			return nil, fmt.Errorf("spec.window.tumbling %s is below the 1s minimum", w.Tumbling.Duration)
		}
		p.windowMs = w.Tumbling.Duration.Milliseconds()
	}
	p.fields = &fieldTrie{}
	if p.keyField != nil {
		p.fields.add(p.keyField, 0)
	}
	for i, a := range p.aggregates {
		if a.field != nil {
			p.fields.add(a.field, 1+i)
		}
	}
	p.Fingerprint = fingerprint(spec.Key, spec.Aggregates, p.windowMs)
	return p, nil
}

func fieldPath(f string) ([]string, error) {
	parts := strings.Split(f, ".")
	for _, s := range parts {
		if s == "" {
			return nil, fmt.Errorf("%q has an empty path element", f)
		}
	}
	return parts, nil
}

// fingerprint hashes what decides the meaning of the state: the key, the
// aggregates in order and the window. Interval, snapshot cadence, workers
// and resources may change without invalidating checkpoints.
func fingerprint(key streamsv1alpha1.AggregationKey, aggs []streamsv1alpha1.AggregateSpec, windowMs int64) string {
	b, _ := json.Marshal(struct {
		Key      streamsv1alpha1.AggregationKey
		Aggs     []streamsv1alpha1.AggregateSpec
		WindowMs int64
	}{key, aggs, windowMs})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Names are the aggregates' names, in spec order.
func (p *Plan) Names() []string {
	out := make([]string, len(p.aggregates))
	for i, a := range p.aggregates {
		out[i] = a.name
	}
	return out
}

// Windowed reports whether results are per tumbling window.
func (p *Plan) Windowed() bool { return p.windowMs > 0 }
