package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestVerifyRun(t *testing.T) {
	acked := map[int]ackedRecord{0: {0, 0}, 1: {1, 0}, 2: {0, 1}}
	tests := []struct {
		name   string
		acked  map[int]ackedRecord
		stored []storedRecord
		want   checkReport
	}{
		{
			name:   "all there",
			acked:  acked,
			stored: []storedRecord{{0, "k0", 0, 0}, {2, "k0", 0, 1}, {1, "k1", 1, 0}},
			want:   checkReport{Found: 3, OK: true},
		},
		{
			name:   "missing acknowledged record",
			acked:  acked,
			stored: []storedRecord{{0, "k0", 0, 0}, {1, "k1", 1, 0}},
			want:   checkReport{Found: 2, Missing: 1},
		},
		{
			name:   "duplicate",
			acked:  acked,
			stored: []storedRecord{{0, "k0", 0, 0}, {2, "k0", 0, 1}, {2, "k0", 0, 2}, {1, "k1", 1, 0}},
			want:   checkReport{Found: 4, Duplicates: 1},
		},
		{
			name:   "out of order within a key",
			acked:  map[int]ackedRecord{0: {0, 1}, 2: {0, 0}},
			stored: []storedRecord{{2, "k0", 0, 0}, {0, "k0", 0, 1}},
			want:   checkReport{Found: 2, OutOfOrder: 1},
		},
		{
			name:   "stored elsewhere than acknowledged",
			acked:  map[int]ackedRecord{0: {0, 5}},
			stored: []storedRecord{{0, "k0", 0, 0}},
			want:   checkReport{Found: 1, Misplaced: 1},
		},
		{
			name:   "unacknowledged record stored is allowed",
			acked:  map[int]ackedRecord{0: {0, 0}},
			stored: []storedRecord{{0, "k0", 0, 0}, {1, "k1", 0, 1}},
			want:   checkReport{Found: 2, UnackedStored: 1, OK: true},
		},
		{
			name: "nothing acknowledged, nothing stored",
			want: checkReport{OK: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got checkReport
			verifyRun(&got, tt.acked, tt.stored)
			if got.OK != (len(got.Problems) == 0) {
				t.Errorf("OK %v with problems %q", got.OK, got.Problems)
			}
			got.Problems = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestCheckAgainstServer(t *testing.T) {
	srv := newServer(t)
	// Lost responses make the producer retry records that are already
	// stored: the idempotent retry must not store them twice.
	srv.DropResponses(3)
	r := catenactl(t, bg(), srv, "", "check", "--stream", "s", "--run", "r1", "--records", "200", "--rate", "0", "--keys", "4", "--duration", "1m")
	if r.code != 0 {
		t.Fatalf("exit %d: %s\n%s", r.code, r.stderr, r.stdout)
	}
	var rep checkReport
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &rep); err != nil {
		t.Fatalf("report %q: %v", r.stdout, err)
	}
	if !rep.OK || rep.Sent != 200 || rep.Acked != 200 || rep.Found != 200 || rep.Run != "r1" {
		t.Fatalf("report %+v", rep)
	}
}

func TestCheckFindsDuplicate(t *testing.T) {
	srv := newServer(t)
	// A record of the run stored twice (as a broken retry would) before the
	// check's own records: the read-back must report it.
	srv.Append("s", 0, &catenapb.Record{Key: []byte("k0"), Value: []byte("r2:0")})
	r := catenactl(t, bg(), srv, "", "check", "--stream", "s", "--run", "r2", "--records", "10", "--rate", "0", "--keys", "1")
	if r.code != exitFailure {
		t.Fatalf("exit %d, want %d: %s\n%s", r.code, exitFailure, r.stderr, r.stdout)
	}
	var rep checkReport
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &rep); err != nil {
		t.Fatalf("report %q: %v", r.stdout, err)
	}
	if rep.OK || rep.Duplicates != 1 {
		t.Fatalf("report %+v", rep)
	}
}
