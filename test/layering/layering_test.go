// Package layering checks the module's import rules (docs/architecture.md,
// "Layering"): what each layer may depend on, so that a shortcut between
// roles fails a test rather than growing quietly.
package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
	Error      *struct{ Err string }
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
	for _, p := range []string{"net", "os", "io/fs", "io/ioutil", "path/filepath", "time", "syscall", "context", "sync",
		"math/rand", "crypto/rand", "log", "runtime"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return "network, file, clock, randomness, process or logging"
		}
	}
	if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
		return "a package outside the standard library"
	}
	return ""
}

// violations lists every broken rule among pkgs.
func violations(pkgs []pkg) []string {
	var out []string
	for _, p := range pkgs {
		r, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		if p.Error != nil {
			out = append(out, fmt.Sprintf("%s does not load: %s", r, p.Error.Err))
		}
		if under(r, "test") || under(r, "cmd") {
			continue // harnesses and binaries wire every layer together
		}
		// api: the CRD types, imported by everything, import nothing of
		// Catena. rpc/contract is the leaf the roles share.
		if under(r, "api") || under(r, "rpc/contract") {
			for _, d := range p.Deps {
				if _, ok := rel(d); ok {
					out = append(out, fmt.Sprintf("%s depends on %s: the API types and the shared contract import nothing of Catena", r, d))
				}
			}
		}
		if slices.Contains(purePackages, r) {
			for _, d := range p.Imports {
				if why := impure(d); why != "" {
					out = append(out, fmt.Sprintf("%s imports %s (%s): the chain core and the planners are pure", r, d, why))
				}
			}
			// Transitively too: nothing outside the standard library and
			// the other pure packages.
			for _, d := range p.Deps {
				if why := impure(d); why == "a package outside the standard library" || why == "a Catena package that is not pure" {
					out = append(out, fmt.Sprintf("%s depends on %s (%s): the chain core and the planners are pure", r, d, why))
				}
			}
		}
		// replica: the data plane runs without the operator, ingestion or
		// the dev harness.
		if under(r, "replica") {
			for _, d := range p.Deps {
				if dr, ok := rel(d); ok && (under(dr, "controllers") || under(dr, "ingest") || under(dr, "internal/devcluster") || under(dr, "aggregator")) {
					out = append(out, fmt.Sprintf("%s depends on %s: replica imports nothing of controllers, ingest, aggregator or internal/devcluster", r, dr))
				}
			}
		}
		// ingest and client speak to replicas over the wire only: of the
		// data plane they may share the log's frame format (partlog), the
		// chain core's pure rules and the planner's, nothing that serves.
		if under(r, "ingest") || under(r, "client") {
			for _, d := range p.Deps {
				dr, ok := rel(d)
				if !ok {
					continue
				}
				if under(dr, "controllers") || under(dr, "internal/devcluster") ||
					(under(dr, "replica") && !under(dr, "replica/partlog") && !slices.Contains(purePackages, dr)) {
					out = append(out, fmt.Sprintf("%s depends on %s: ingestion and clients reach replicas over the wire only", r, dr))
				}
			}
		}
	}
	return out
}

// TestLayering fails on a broken rule, naming the package and the import.
func TestLayering(t *testing.T) {
	for _, v := range violations(listPackages(t)) {
		t.Error(v)
	}
}

// TestLayeringCatchesABrokenRule: each rule finds what it is meant to, on
// made-up packages (a rule that matches nothing would pass for ever).
func TestLayeringCatchesABrokenRule(t *testing.T) {
	m := func(r string) string { return module + "/" + r }
	for _, tc := range []struct {
		name string
		p    pkg
		want bool
	}{
		{"api importing Catena", pkg{ImportPath: m("api/v1alpha1"), Deps: []string{m("rpc/catenapb")}}, true},
		{"api importing Kubernetes", pkg{ImportPath: m("api/v1alpha1"), Deps: []string{"k8s.io/apimachinery/pkg/runtime"}}, false},
		{"the contract importing Catena", pkg{ImportPath: m("rpc/contract"), Deps: []string{m("replica/chainplan")}}, true},
		{"the planner reading the clock", pkg{ImportPath: m("replica/chainplan"), Imports: []string{"time"}}, true},
		{"the chain core drawing random numbers", pkg{ImportPath: m("replica/chain"), Imports: []string{"math/rand/v2"}}, true},
		{"the planner on gRPC, transitively", pkg{ImportPath: m("replica/chainplan"), Deps: []string{"google.golang.org/grpc"}}, true},
		{"the planner on the chain core", pkg{ImportPath: m("replica/chainplan"), Imports: []string{m("replica/chain"), "fmt"}, Deps: []string{m("replica/chain"), "fmt", "os"}}, false},
		{"the chain core on the server", pkg{ImportPath: m("replica/chain"), Imports: []string{m("replica/server")}}, true},
		{"a replica on ingestion", pkg{ImportPath: m("replica/server"), Deps: []string{m("ingest")}}, true},
		{"a replica on the dev harness", pkg{ImportPath: m("replica/chainmaster"), Deps: []string{m("internal/devcluster")}}, true},
		{"ingestion on the replica server", pkg{ImportPath: m("ingest"), Deps: []string{m("replica/server")}}, true},
		{"a client on the chain master", pkg{ImportPath: m("client/clienttest"), Deps: []string{m("replica/chainmaster")}}, true},
		{"ingestion on the log format and the contract", pkg{ImportPath: m("ingest"), Deps: []string{m("replica/partlog"), m("rpc/contract"), m("replica/chainplan")}}, false},
		{"a package that does not load", pkg{ImportPath: m("ingest"), Error: &struct{ Err string }{"syntax error"}}, true},
		{"the e2e harness may use anything", pkg{ImportPath: m("test/e2e"), Deps: []string{m("controllers"), m("replica/server")}}, false},
	} {
		if got := len(violations([]pkg{tc.p})) > 0; got != tc.want {
			t.Errorf("%s: violation %v, want %v (%v)", tc.name, got, tc.want, violations([]pkg{tc.p}))
		}
	}
	if !under("replica/server", "replica") || under("replicas", "replica") {
		t.Error("under matches by path element")
	}
}
