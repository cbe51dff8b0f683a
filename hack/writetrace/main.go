// Command writetrace prints where a write's time goes, stage by stage and
// hop by hop, from the marks that catena dev's processes write with
// CATENA_WRITE_TRACE set (internal/writetrace):
//
//	CATENA_WRITE_TRACE=/tmp/trace bin/catena dev --partitions 1 &
//	bin/catenactl bench --stream demo --sync --keys 0 --records 5000
//	go run ./hack/writetrace /tmp/trace
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/catena-streams/catena/internal/writetrace"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: writetrace DIR (the directory CATENA_WRITE_TRACE named)")
		os.Exit(2)
	}
	events, err := writetrace.Read(os.Args[1])
	if err == nil {
		var points, steps []writetrace.Row
		if points, steps, err = writetrace.Breakdown(events); err == nil {
			report(points, steps)
			return
		}
	}
	fmt.Fprintln(os.Stderr, "writetrace:", err)
	os.Exit(1)
}

func report(points, steps []writetrace.Row) {
	us := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }
	n := 0
	for _, r := range points {
		n = max(n, len(r.Since))
	}
	table := func(title string, rows []writetrace.Row) {
		fmt.Printf("%-44s %8s %8s %8s %8s\n", title, "p50", "p90", "p99", "appends")
		for _, r := range rows {
			fmt.Printf("%-44s %8s %8s %8s %8d\n", r.Name, us(r.Quantile(0.5)), us(r.Quantile(0.9)), us(r.Quantile(0.99)), len(r.Since))
		}
	}
	fmt.Printf("%d appends; times in µs\n\n", n)
	table("reached, after ingestion sent the append", points)
	fmt.Println()
	table("each step, append by append", steps)
}
