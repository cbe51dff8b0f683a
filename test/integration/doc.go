// Package integration holds Catena's integration tests: they build the
// catena binary once, run real replica and dev-cluster processes on
// loopback, kill, pause and restart them, corrupt their files, and check
// the invariants of /work/shared/DESIGN.md and the scenarios of
// SCENARIOS.md through the public Ingest and Replica gRPC APIs.
//
// Run with: go test -race -count=1 ./test/integration/...
package integration
