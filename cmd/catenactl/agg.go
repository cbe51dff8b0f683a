package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// defaultAggregatorAddr is where a standalone `catena aggregator` listens.
const defaultAggregatorAddr = "127.0.0.1:7090"

type aggFlags struct {
	addr    string
	output  string
	timeout time.Duration
}

// aggRowJSON is one line of agg get -o json.
type aggRowJSON struct {
	Key         string         `json:"key"`
	WindowStart string         `json:"window_start,omitempty"`
	Values      map[string]any `json:"values"`
}

func newAggCommand(a *app) *cobra.Command {
	f := &aggFlags{}
	cmd := &cobra.Command{
		Use:   "agg",
		Short: "Query an aggregation's results: agg get KEY, agg list, agg status",
		Long: "Talks to any worker of an Aggregation (--aggregator, or $CATENA_AGGREGATOR;\n" +
			"in a cluster the Aggregation's status.endpoint). The worker asks the owners of\n" +
			"the other shards and merges their partial results, so answers cover every\n" +
			"partition of the source or fail naming the shard that did not answer.",
		Args: cobra.NoArgs,
	}
	def := os.Getenv("CATENA_AGGREGATOR")
	if def == "" {
		def = defaultAggregatorAddr
	}
	cmd.PersistentFlags().StringVar(&f.addr, "aggregator", def, "aggregation worker host:port (env CATENA_AGGREGATOR)")
	cmd.PersistentFlags().StringVarP(&f.output, "output", "o", "table", "table or json")
	cmd.PersistentFlags().DurationVar(&f.timeout, "timeout", 10*time.Second, "how long to wait for the answer")
	cmd.AddCommand(newAggGetCommand(a, f), newAggListCommand(a, f), newAggStatusCommand(a, f))
	return cmd
}

// connect dials the aggregation worker, over TLS with a's --tls-* (a
// worker on Kubernetes serves TLS, with results open to the source's
// consumers).
func (f *aggFlags) connect(ctx context.Context, a *app) (catenapb.AggregatorClient, func(), error) {
	if f.output != "table" && f.output != "json" {
		return nil, nil, usageErrorf("--output %q must be table or json", f.output)
	}
	if strings.TrimSpace(f.addr) == "" {
		return nil, nil, usageErrorf("--aggregator is empty")
	}
	var tlsCfg *tls.Config
	if a.tls.enabled() {
		var err error
		if tlsCfg, err = a.tls.config(); err != nil {
			return nil, nil, err
		}
	}
	conn, err := transport.Dial(f.addr, tlsCfg)
	if err != nil {
		return nil, nil, failure(err)
	}
	return catenapb.NewAggregatorClient(conn), func() { conn.Close() }, nil
}

func newAggGetCommand(a *app, f *aggFlags) *cobra.Command {
	var fromFlag, toFlag string
	cmd := &cobra.Command{
		Use:   "get KEY...",
		Short: "Print keys' aggregates (one row per key, or per window with a tumbling window)",
		Args:  cobra.MinimumNArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			var from, to int64
			var err error
			if from, err = parseWindowBound("--from", fromFlag); err != nil {
				return err
			}
			if to, err = parseWindowBound("--to", toFlag); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			c, closeConn, err := f.connect(ctx, a)
			if err != nil {
				return err
			}
			defer closeConn()
			var rows []*catenapb.AggRow
			var unknown []string
			for _, key := range args {
				resp, err := c.Get(ctx, &catenapb.AggGetRequest{Key: key, WindowFromMs: from, WindowToMs: to})
				if err != nil {
					return aggError(err)
				}
				if len(resp.Rows) == 0 {
					unknown = append(unknown, key)
				}
				rows = append(rows, resp.Rows...)
			}
			if len(rows) > 0 {
				if err := printRows(a, f.output, rows); err != nil {
					return err
				}
			}
			if len(unknown) > 0 {
				return failuref("no aggregates for %s on any shard", quoteAll(unknown))
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&fromFlag, "from", "", "windows starting at or after this time (RFC 3339 or Unix ms)")
	cmd.Flags().StringVar(&toFlag, "to", "", "windows starting before this time (RFC 3339 or Unix ms)")
	return cmd
}

func quoteAll(ks []string) string {
	q := make([]string, len(ks))
	for i, k := range ks {
		q[i] = strconv.Quote(k)
	}
	return strings.Join(q, ", ")
}

func parseWindowBound(flag, v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t.UnixMilli(), nil
	}
	var ms int64
	if _, err := fmt.Sscan(v, &ms); err != nil {
		return 0, usageErrorf("%s %q is neither RFC 3339 nor Unix milliseconds", flag, v)
	}
	return ms, nil
}

// aggError turns gRPC errors into messages that say what to do.
func aggError(err error) error {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.InvalidArgument:
		return usageErrorf("%s", st.Message())
	case codes.Unavailable:
		return failuref("aggregation unavailable: %s", st.Message())
	}
	return failure(err)
}

func printRows(a *app, output string, rows []*catenapb.AggRow) error {
	if output == "json" {
		jw := newJSONWriter(a.stdout)
		for _, r := range rows {
			row := aggRowJSON{Key: r.Key, Values: map[string]any{}}
			if r.WindowStartMs != 0 {
				row.WindowStart = time.UnixMilli(r.WindowStartMs).UTC().Format(time.RFC3339)
			}
			for _, v := range r.Values {
				row.Values[v.Name] = valueOf(v)
			}
			if err := jw.write(row); err != nil {
				return err
			}
		}
		return jw.flush()
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	head := []string{"KEY"}
	if rows[0].WindowStartMs != 0 || len(rows) > 1 {
		head = append(head, "WINDOW")
	}
	for _, v := range rows[0].Values {
		head = append(head, strings.ToUpper(v.Name))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range rows {
		cols := []string{r.Key}
		if len(head) > len(r.Values)+1 {
			cols = append(cols, time.UnixMilli(r.WindowStartMs).UTC().Format(time.RFC3339))
		}
		for _, v := range r.Values {
			x := valueOf(v)
			if x == nil {
				cols = append(cols, "-")
			} else {
				cols = append(cols, fmt.Sprint(x))
			}
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

func valueOf(v *catenapb.AggValue) any {
	switch x := v.Value.(type) {
	case *catenapb.AggValue_IntValue:
		return x.IntValue
	case *catenapb.AggValue_FloatValue:
		return x.FloatValue
	}
	return nil
}

func newAggListCommand(a *app, f *aggFlags) *cobra.Command {
	var (
		prefix, after string
		limit         uint32
		all           bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Print keys in order, one per line",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if limit == 0 || limit > 10000 {
				return usageErrorf("--limit %d must be between 1 and 10000", limit)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			c, closeConn, err := f.connect(ctx, a)
			if err != nil {
				return err
			}
			defer closeConn()
			jw := newJSONWriter(a.stdout)
			for {
				resp, err := c.List(ctx, &catenapb.AggListRequest{Prefix: prefix, After: after, Limit: limit})
				if err != nil {
					return aggError(err)
				}
				for _, k := range resp.Keys {
					if f.output == "json" {
						err = jw.write(map[string]string{"key": k})
					} else {
						_, err = fmt.Fprintln(jw.w, k)
					}
					if err != nil {
						return err
					}
				}
				if !resp.More || !all || len(resp.Keys) == 0 {
					if resp.More && !all {
						fmt.Fprintf(a.stderr, "more keys follow; continue with --after %q, or use --all\n", resp.Keys[len(resp.Keys)-1])
					}
					return jw.flush()
				}
				after = resp.Keys[len(resp.Keys)-1]
			}
		}),
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "only keys starting with this")
	cmd.Flags().StringVar(&after, "after", "", "only keys after this one (paging)")
	cmd.Flags().Uint32Var(&limit, "limit", 100, "keys per page")
	cmd.Flags().BoolVar(&all, "all", false, "page through every key")
	return cmd
}

func newAggStatusCommand(a *app, f *aggFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Print the worker's shards: phase, progress, latest checkpoint, restoration",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			c, closeConn, err := f.connect(ctx, a)
			if err != nil {
				return err
			}
			defer closeConn()
			st, err := c.Status(ctx, &catenapb.AggregatorStatusRequest{})
			if err != nil {
				return aggError(err)
			}
			if f.output == "json" {
				b, err := protojson.Marshal(st)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(a.stdout, string(b))
				return err
			}
			fmt.Fprintf(a.stdout, "worker %s  aggregation %s  generation %d\n", st.Worker, st.Aggregation, st.Generation)
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SHARD\tPHASE\tCONSUMED\tLAG\tKEYS\tCHECKPOINT\tEPOCH\tRESTORED FROM\tREPLAYED\tERROR")
			for _, s := range st.Shards {
				ck, ep := "-", "-"
				if c := s.Checkpoint; c != nil {
					kind := "increment"
					if c.Snapshot {
						kind = "snapshot"
					}
					ck, ep = fmt.Sprintf("@%d %s (source %d)", c.ManifestOffset, kind, c.SourceOffset), fmt.Sprint(c.Epoch)
				}
				from, replayed := "-", "-"
				if r := s.Restoration; r != nil {
					from = "empty"
					if r.From != nil {
						from = fmt.Sprintf("@%d (source %d)", r.From.ManifestOffset, r.From.SourceOffset)
					}
					replayed = fmt.Sprintf("%d in %dms", r.RecordsReplayed, r.ReplayMs)
				}
				lag := int64(s.SourceCommitted) - int64(s.Consumed)
				fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Shard,
					strings.TrimPrefix(s.Phase.String(), "SHARD_PHASE_"), s.Consumed, max(lag, 0), s.Keys, ck, ep, from, replayed, s.Error)
			}
			return tw.Flush()
		}),
	}
}
