package server

import (
	"context"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// CATENA_TEST_JOURNAL=1 runs every test of the package with the replicas
// keeping a journal (Options.Journal).
func init() { journalByDefault = os.Getenv("CATENA_TEST_JOURNAL") == "1" }

// A journaled replica reports its journal's work; a plain one reports no
// journal.
func TestJournalMetrics(t *testing.T) {
	for _, journaled := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		srv, err := New(Options{ID: "m", DataDir: t.TempDir(), Logger: logr.Discard(), Registerer: reg, Journal: journaled})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := srv.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Epoch: 1, Members: []*catenapb.Member{{Id: "m", Addr: "127.0.0.1:1"}}, Config: &catenapb.StreamConfig{Partitions: 1}}); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 3)}); err != nil {
			t.Fatal(err)
		}
		got := metricTotals(t, reg)
		srv.Close()
		if !journaled && !journalByDefault {
			if _, ok := got["catena_replica_journal_groups_total"]; ok {
				t.Errorf("a replica without a journal reports journal metrics: %v", got)
			}
			continue
		}
		if got["catena_replica_journal_groups_total"] < 1 || got["catena_replica_journal_bytes_total"] < 3*10 || got["catena_replica_journal_busy_seconds_total"] <= 0 ||
			got["catena_replica_journal_checkpoints_total"] < 1 || got["catena_replica_journal_end_bytes"] <= 0 {
			t.Errorf("journal metrics after an append: groups %v, bytes %v, checkpoints %v, end %v", got["catena_replica_journal_groups_total"],
				got["catena_replica_journal_bytes_total"], got["catena_replica_journal_checkpoints_total"], got["catena_replica_journal_end_bytes"])
		}
	}
}
