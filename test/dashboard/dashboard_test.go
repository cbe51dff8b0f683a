// Package dashboard checks the chart's Grafana dashboard against the code:
// every series it queries is one a Catena process exports.
package dashboard

import (
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var root = filepath.Join("..", "..")

// exported is every metric name the module's non-test code declares: full
// names in strings ("catena_operator_partitions"), and names built from
// Namespace, Subsystem and Name in prometheus options.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	full := regexp.MustCompile(`"(catena_[a-z_]+)"`)
	parts := regexp.MustCompile(`Namespace:\s*"catena",\s*(?:Subsystem:\s*"([a-z_]+)",\s*)?Name:\s*"([a-z_]+)"`)
	names := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "test" || strings.HasPrefix(d.Name(), ".") || d.Name() == "bin") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range full.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		for _, m := range parts.FindAllStringSubmatch(string(b), -1) {
			if m[1] == "" {
				names["catena_"+m[2]] = true
			} else {
				names["catena_"+m[1]+"_"+m[2]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestDashboardQueriesExportedSeries(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "charts", "catena", "dashboards", "catena.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if dash.UID == "" {
		t.Error("the dashboard has no uid: Grafana would make a new one on every load")
	}
	names := exported(t)
	if !names["catena_replica_log_bytes"] || !names["catena_ingest_produce_seconds"] {
		t.Fatalf("the scan of the code missed known metrics: %v", slices.Sorted(maps.Keys(names)))
	}
	series := regexp.MustCompile(`catena_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, s := range series.FindAllString(tg.Expr, -1) {
				base := s
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if trimmed, ok := strings.CutSuffix(s, suffix); ok && names[trimmed] {
						base = trimmed
					}
				}
				if !names[base] {
					t.Errorf("panel %q queries %s, which no Catena process exports", p.Title, s)
				}
				queried++
			}
		}
	}
	if queried == 0 {
		t.Error("the dashboard queries no Catena series")
	}
}
