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
		var rep *writetrace.Report
		if rep, err = writetrace.Breakdown(events); err == nil {
			report(rep)
			return
		}
	}
	fmt.Fprintln(os.Stderr, "writetrace:", err)
	os.Exit(1)
}

func report(rep *writetrace.Report) {
	us := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }
	table := func(title string, rows []writetrace.Row) {
		fmt.Printf("%-50s %8s %8s %8s %8s\n", title, "p50", "p90", "p99", "appends")
		for _, r := range rows {
			fmt.Printf("%-50s %8s %8s %8s %8d\n", r.Name, us(r.Quantile(0.5)), us(r.Quantile(0.9)), us(r.Quantile(0.99)), len(r.Durations))
		}
	}
	fmt.Printf("%d appends; times in µs\n", rep.Appends)
	if rep.Skipped > 0 {
		fmt.Printf("%d appends of partitions with a shorter chain left out\n", rep.Skipped)
	}
	fmt.Println()
	table("reached, after ingestion sent the append", rep.Reached)
	fmt.Println()
	table("each step, append by append", rep.Steps)
	if rep.Appends > 0 && rep.ChainLength > 1 {
		fmt.Printf("\nthe tail heard an append durable upstream after its own fsync ended for %d of %d appends (%.0f%%)\n",
			rep.UpstreamLast, rep.Appends, 100*float64(rep.UpstreamLast)/float64(rep.Appends))
	}
}
