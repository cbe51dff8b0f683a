// Package layering checks the module's import rules (docs/architecture.md,
// "Layering"): what each layer may depend on, so that a shortcut between
// roles fails a test rather than growing quietly.
package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/catena-streams/catena"

type pkg struct {
	ImportPath string
	Imports    []string // direct, of the non-test files
	Deps       []string // transitive
}

// listPackages runs go list over the whole module.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages of %s; is the test run inside the module?", len(pkgs), module)
	}
	return pkgs
}

// rel is a module package's path below the module ("" for others).
func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

// under reports whether the module package r is dir or below it.
func under(r, dir string) bool { return r == dir || strings.HasPrefix(r, dir+"/") }

// purePackages decide without doing: the chain core and the planners.
var purePackages = []string{"replica/chain", "replica/chainplan"}

// impure reports why a pure package may not import path ("" if it may):
// no network, file, clock, process or gRPC package, and of Catena only
// other pure packages.
func impure(path string) string {
	if r, ok := rel(path); ok {
		if slices.Contains(purePackages, r) {
			return ""
		}
		return "a Catena package that is not pure"
	}
	for _, p := range []string{"net", "os", "io/fs", "path/filepath", "time", "syscall", "context", "sync",
		"google.golang.org/grpc", "google.golang.org/protobuf", "golang.org/x/sys", "k8s.io", "sigs.k8s.io"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return "network, file, clock, process or RPC"
		}
	}
	return ""
}

// TestLayering fails on a broken rule, naming the package and the import.
func TestLayering(t *testing.T) {
	for _, p := range listPackages(t) {
		r, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		if under(r, "test") || under(r, "cmd") {
			continue // harnesses and binaries wire every layer together
		}
		// api: the CRD types, imported by everything, import nothing of
		// Catena.
		if under(r, "api") {
			for _, d := range p.Imports {
				if _, ok := rel(d); ok {
					t.Errorf("%s imports %s: the API types import nothing of Catena", r, d)
				}
			}
		}
		// rpc/contract is the leaf the roles share.
		if under(r, "rpc/contract") {
			for _, d := range p.Imports {
				if _, ok := rel(d); ok {
					t.Errorf("%s imports %s: the shared contract is a leaf", r, d)
				}
			}
		}
		if slices.Contains(purePackages, r) {
			for _, d := range p.Imports {
				if why := impure(d); why != "" {
					t.Errorf("%s imports %s (%s): the chain core and the planners are pure", r, d, why)
				}
			}
		}
		// replica: the data plane runs without the operator, ingestion or
		// the dev harness.
		if under(r, "replica") {
			for _, d := range p.Deps {
				if dr, ok := rel(d); ok && (under(dr, "controllers") || under(dr, "ingest") || under(dr, "internal/devcluster") || under(dr, "aggregator")) {
					t.Errorf("%s depends on %s: replica imports nothing of controllers, ingest, aggregator or internal/devcluster", r, dr)
				}
			}
		}
		// ingest and client speak to replicas over the wire only.
		if under(r, "ingest") || under(r, "client") {
			for _, d := range p.Deps {
				if dr, ok := rel(d); ok && (under(dr, "replica/server") || under(dr, "controllers") || under(dr, "internal/devcluster")) {
					t.Errorf("%s depends on %s: ingestion and clients reach replicas over the wire only", r, dr)
				}
			}
		}
	}
}

// TestLayeringCatchesABrokenRule: the rules' checks find what they are
// meant to (a rule that matches nothing would pass forever).
func TestLayeringCatchesABrokenRule(t *testing.T) {
	for path, want := range map[string]bool{
		"time":                        true,
		"net/http":                    true,
		"google.golang.org/grpc":      true,
		module + "/replica/server":    true,
		module + "/replica/chainplan": false,
		"fmt":                         false,
		"slices":                      false,
	} {
		if got := impure(path) != ""; got != want {
			t.Errorf("impure(%q) = %v, want %v", path, got, want)
		}
	}
	if !under("replica/server", "replica") || under("replicas", "replica") {
		t.Error("under matches by path element")
	}
}
