package groups

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
)

func testView(groups, partitions int, metadata int) map[string]map[TopicPartition]Committed {
	return testViewOf(groups, partitions, strings.Repeat("m", metadata))
}

func testViewOf(groups, partitions int, metadata string) map[string]map[TopicPartition]Committed {
	view := map[string]map[TopicPartition]Committed{}
	for g := range groups {
		offs := map[TopicPartition]Committed{}
		for p := range partitions {
			offs[TopicPartition{Topic: fmt.Sprintf("t%d", p%3), Partition: int32(p)}] = Committed{Offset: int64(g*1000 + p), LeaderEpoch: -1, Metadata: metadata, At: int64(p)}
		}
		view[fmt.Sprintf("g%03d", g)] = offs
	}
	return view
}

func equalViews(a, b map[string]map[TopicPartition]Committed) bool {
	return maps.EqualFunc(a, b, func(x, y map[TopicPartition]Committed) bool { return maps.Equal(x, y) })
}

// TestSnapshotRecordsRoundTrip: a view written as a snapshot's parts and
// read back part by part, in any order and with parts repeated, is the
// view; parts stay near their size bound, and a group's offsets may be
// spread over several.
func TestSnapshotRecordsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name      string
		view      map[string]map[TopicPartition]Committed
		partBytes int
		minParts  int
	}{
		{"no groups", map[string]map[TopicPartition]Committed{}, 1 << 10, 1},
		{"a group with no offsets", map[string]map[TopicPartition]Committed{"idle": {}}, 1 << 10, 1},
		{"small", testView(3, 4, 0), 256 << 10, 1},
		{"many parts", testView(20, 30, 40), 4 << 10, 15},
		{"one group over many parts", testView(1, 500, 100), 8 << 10, 5},
		{"entries larger than a part", testView(2, 3, 3000), 1 << 10, 6},
		// JSON writes '<' as \u003c: 4 KiB of metadata is 24 KiB
		// encoded, and a part must be sized by that.
		{"metadata JSON escapes", testViewOf(3, 20, strings.Repeat("<", 4096)), 64 << 10, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parts, err := snapshotRecords(tc.view, "id1", 77, tc.partBytes)
			if err != nil {
				t.Fatal(err)
			}
			if len(parts) < tc.minParts {
				t.Fatalf("%d parts, want at least %d", len(parts), tc.minParts)
			}
			var b *snapshotBuild
			order := rand.Perm(len(parts))
			order = append(order, order[0]) // a part stored twice
			for _, i := range order {
				rec, err := decodeOffsetsRecord(parts[i])
				if err != nil {
					t.Fatal(err)
				}
				if rec.Snapshot.AsOf != 77 || rec.Snapshot.ID != "id1" || rec.Snapshot.Parts != len(parts) || rec.Snapshot.Part != i {
					t.Fatalf("part %d has header %+v", i, *rec.Snapshot)
				}
				entries := 0
				for _, g := range rec.Groups {
					entries += len(g.Offsets)
				}
				if entries > 1 && len(parts[i]) > tc.partBytes+256 {
					t.Fatalf("part %d is %d bytes with %d entries, bound %d", i, len(parts[i]), entries, tc.partBytes)
				}
				if b == nil {
					b = newSnapshotBuild(rec.Snapshot)
				}
				if !b.add(rec) {
					t.Fatalf("part %d refused", i)
				}
			}
			if b.left != 0 {
				t.Fatalf("%d parts missing after all were added", b.left)
			}
			if !equalViews(b.state, tc.view) {
				t.Fatalf("read back %v, want %v", b.state, tc.view)
			}
		})
	}
}

// TestSnapshotPartsOfAnotherSnapshotAreRefused: parts that share an id but
// not an asOf or a part count do not make a snapshot.
func TestSnapshotPartsOfAnotherSnapshotAreRefused(t *testing.T) {
	b := newSnapshotBuild(&snapshotHeader{ID: "x", AsOf: 5, Part: 0, Parts: 2})
	for _, h := range []snapshotHeader{{ID: "x", AsOf: 6, Part: 1, Parts: 2}, {ID: "x", AsOf: 5, Part: 1, Parts: 3}} {
		if b.add(&offsetsRecord{V: 2, Snapshot: &h}) {
			t.Fatalf("part %+v taken into a snapshot of asOf 5 in 2 parts", h)
		}
	}
}

// TestDecodeOffsetsRecord: the versions and shapes a load takes, and the
// ones it skips.
func TestDecodeOffsetsRecord(t *testing.T) {
	for _, tc := range []struct {
		value string
		ok    bool
	}{
		{`{"v":1,"group":"g","offsets":[{"topic":"t","partition":0,"offset":4,"leaderEpoch":-1,"at":1}]}`, true},
		{`{"v":1,"group":"g","deleted":true}`, true},
		{`{"v":2,"snapshot":{"id":"a","asOf":3,"part":0,"parts":1},"groups":[{"group":"g"}]}`, true},
		{`{"v":2,"snapshot":{"id":"a","asOf":3,"part":1,"parts":1}}`, false},
		{`{"v":2,"snapshot":{"id":"","asOf":3,"part":0,"parts":1}}`, false},
		{`{"v":2,"snapshot":{"id":"a","asOf":3,"part":0,"parts":0}}`, false},
		{`{"v":2,"group":"g"}`, false},
		{`{"v":1,"snapshot":{"id":"a","asOf":3,"part":0,"parts":1}}`, false},
		{`{"v":1,"groups":[{"group":"g"}]}`, false},
		{`{"v":3,"group":"g"}`, false},
		{`not json`, false},
	} {
		_, err := decodeOffsetsRecord([]byte(tc.value))
		if (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want ok=%v", tc.value, err, tc.ok)
		}
	}
}

// TestASnapshotRecordIsSkippedByAVersionOneReader: a coordinator that
// knows only version 1 (an older node during an upgrade) must pass a
// snapshot part over, not take it for a group named "".
func TestASnapshotRecordIsSkippedByAVersionOneReader(t *testing.T) {
	parts, err := snapshotRecords(testView(1, 1, 0), "a", 1, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		V int `json:"v"`
	}
	if err := json.Unmarshal(parts[0], &v); err != nil || v.V != 2 {
		t.Fatalf("a snapshot part has version %d (%v), want 2", v.V, err)
	}
}

// compactingOffsets is memOffsets that counts Compact calls.
type compactingOffsets struct {
	memOffsets
	compacts int
}

func (c *compactingOffsets) Compact(context.Context) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.compacts++
	return true, nil
}

// TestOnlyTheSnapshotOwnerCompacts: the nodes that share the offsets
// stream each sweep it, and exactly one of them, the one a group named
// snapshotOwnerKey would have, writes snapshots.
func TestOnlyTheSnapshotOwnerCompacts(t *testing.T) {
	hosts := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	owners := 0
	for _, self := range hosts {
		m := NewMembership(self)
		m.Set(hosts)
		st := &compactingOffsets{}
		c := New(Options{Offsets: st, Membership: m})
		c.sweep(context.Background(), false)
		_, own := m.Owner(snapshotOwnerKey)
		if want := map[bool]int{true: 1, false: 0}[own]; st.compacts != want {
			t.Errorf("node %s (owner: %v) compacted %d times in a sweep, want %d", self, own, st.compacts, want)
		}
		if own {
			owners++
		}
	}
	if owners != 1 {
		t.Fatalf("%d nodes own the snapshots, want 1", owners)
	}
	// Alone, a node owns them.
	st := &compactingOffsets{}
	New(Options{Offsets: st}).sweep(context.Background(), false)
	if st.compacts != 1 {
		t.Fatalf("a coordinator without peers compacted %d times in a sweep, want 1", st.compacts)
	}
}
