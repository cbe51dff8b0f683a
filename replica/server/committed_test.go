package server

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// forgetCommitted removes k from a stopped replica's committed-offset
// table, as a crash before its first write would have left it.
func forgetCommitted(t *testing.T, dataDir string, k partKey) {
	t.Helper()
	offsets, clean, err := readCommittedTable(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	delete(offsets, k)
	if err := writeCommittedTable(dataDir, offsets, clean); err != nil {
		t.Fatal(err)
	}
}

// committedChain starts a chain [a b] of partition s/0 and commits n
// records on both.
func committedChain(t *testing.T, n int) (a, b *node) {
	t.Helper()
	a, b = startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	if _, err := client(t, a.addr).Append(context.Background(), &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, n)}); err != nil {
		t.Fatal(err)
	}
	converged(t, a, b)
	return a, b
}

func readTable(t *testing.T, dataDir string) (map[partKey]uint64, bool) {
	t.Helper()
	offsets, clean, err := readCommittedTable(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	return offsets, clean
}

// One table holds every partition's committed offset: a clean close marks
// it clean, the next start clears the mark before serving, and the offsets
// come back exact.
func TestCommittedOffsetsLiveInOneTable(t *testing.T) {
	a, b := committedChain(t, 5)
	stopNode(a)
	stopNode(b)
	offsets, clean := readTable(t, b.srv.dataDir)
	if !clean || offsets[partKey{"s", 0}] != 5 || len(offsets) != 1 {
		t.Fatalf("table after a clean close: %v clean=%v, want s/0=5 clean", offsets, clean)
	}
	if _, err := os.Stat(filepath.Join(b.srv.partitionDir("s", 0), legacyCommittedFile)); !os.IsNotExist(err) {
		t.Fatalf("a per-partition record was written: %v", err)
	}
	b = reopen(t, b)
	if _, clean := readTable(t, b.srv.dataDir); clean {
		t.Fatal("the clean mark outlived the start that trusted it")
	}
	if st := status0(t, b); st.GetCommitted() != 5 {
		t.Fatalf("reopened: committed %d, want 5", st.GetCommitted())
	}
}

// A replica written before the table kept a record per partition: it is
// read, moved into the table, and removed.
func TestVersion1CommittedRecordsMoveIntoTheTable(t *testing.T) {
	a, b := committedChain(t, 6)
	stopNode(a)
	stopNode(b)
	if err := os.Remove(filepath.Join(b.srv.dataDir, committedTableFile)); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(b.srv.partitionDir("s", 0), legacyCommittedFile)
	rec, _ := json.Marshal(legacyCommitted{Version: 1, Committed: 4, Clean: true})
	if err := os.WriteFile(legacy, rec, 0o644); err != nil {
		t.Fatal(err)
	}
	b = reopen(t, b)
	if st := status0(t, b); st.GetCommitted() != 4 {
		t.Fatalf("reopened from a version-1 record of 4: committed %d", st.GetCommitted())
	}
	if offsets, clean := readTable(t, b.srv.dataDir); offsets[partKey{"s", 0}] != 4 || clean {
		t.Fatalf("table after start-up: %v clean=%v, want s/0=4, not clean", offsets, clean)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Fatalf("the version-1 record is still there: %v", err)
	}
}

// A dropped copy's offset must not become a floor for a new copy of the
// same partition: creating one first writes the table without it.
func TestANewCopyNeverInheritsADroppedCopysOffset(t *testing.T) {
	a, b := committedChain(t, 5)
	ctx := context.Background()
	if err := b.srv.persistCommitted(whenMoved); err != nil {
		t.Fatal(err)
	}
	if offsets, _ := readTable(t, b.srv.dataDir); offsets[partKey{"s", 0}] != 5 {
		t.Fatalf("table before the drop: %v", offsets)
	}
	// The master moves on without b, which drops its copy; the periodic
	// write has not run yet when a new copy is configured.
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 2, Members: members(a), Config: testConfig}
	if _, err := client(t, a.addr).Configure(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := client(t, b.addr).Drop(ctx, &catenapb.DropRequest{Stream: "s", Partition: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if offsets, _ := readTable(t, b.srv.dataDir); offsets[partKey{"s", 0}] != 5 {
		t.Fatalf("the drop itself rewrote the table: %v", offsets)
	}
	req = &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 3, Members: members(a, b), Config: testConfig, Committed: 5}
	if _, err := client(t, b.addr).Configure(ctx, req); err != nil {
		t.Fatal(err)
	}
	if offsets, _ := readTable(t, b.srv.dataDir); offsets[partKey{"s", 0}] != 0 {
		t.Fatalf("table once a new copy exists: %v, want s/0 absent or 0", offsets)
	}
}

// A partition that cannot serve (here its consumer holds are unreadable)
// keeps the offset the table last held for it, which may lag what it
// knew: a clean close of the replica then marks nothing exact, or a later
// start would answer LATEST from the lagging offset.
func TestAFailedPartitionKeepsTheTableFromBeingClean(t *testing.T) {
	a, b := committedChain(t, 3)
	stopNode(a)
	stopNode(b)
	if err := os.WriteFile(filepath.Join(b.srv.partitionDir("s", 0), holdsFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	b = reopen(t, b)
	stopNode(b)
	offsets, clean := readTable(t, b.srv.dataDir)
	if clean {
		t.Fatalf("a clean close with a failed partition marked the table clean: %v", offsets)
	}
	if offsets[partKey{"s", 0}] != 3 {
		t.Fatalf("the failed partition's offset was not kept: %v", offsets)
	}
}
