package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

type consumersFlags struct {
	stream   string
	consumer string
	output   string
}

// JSON shapes of consumers list -o json.
type (
	consumersJSON struct {
		Stream     string                   `json:"stream"`
		Partitions []partitionConsumersJSON `json:"partitions"`
	}
	partitionConsumersJSON struct {
		Partition   uint32           `json:"partition"`
		LogStart    uint64           `json:"log_start"`
		Committed   uint64           `json:"committed"`
		Holds       []holdJSON       `json:"holds"`
		ForcedTrims []forcedTrimJSON `json:"forced_trims"`
		Disagreeing []string         `json:"disagreeing,omitempty"`
	}
	holdJSON struct {
		Consumer string `json:"consumer"`
		Offset   uint64 `json:"offset"`
	}
	forcedTrimJSON struct {
		Consumer   string `json:"consumer"`
		HoldOffset uint64 `json:"hold_offset"`
		LogStart   uint64 `json:"log_start"`
		Time       string `json:"time"`
	}
)

func newConsumersCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "consumers",
		Short: "List or delete the consumers that hold a stream's records from retention",
		Long: "A consumer commits the offset from which it still needs a partition's\n" +
			"records (client CommitConsumerOffset); retention on every member of the\n" +
			"partition's chain keeps them, up to the stream's hard retention limits. A\n" +
			"trim past a hold is listed as a forced trim.",
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newConsumersListCommand(a), newConsumersDeleteCommand(a))
	return cmd
}

func newConsumersListCommand(a *app) *cobra.Command {
	var f consumersFlags
	cmd := &cobra.Command{
		Use:   "list --stream S [-o table|json]",
		Short: "Show each partition's consumer holds and forced trims",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.consumersList(cmd, &f)
		}),
	}
	cmd.Flags().StringVar(&f.stream, "stream", "", "stream whose consumers to list (required)")
	cmd.Flags().StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newConsumersDeleteCommand(a *app) *cobra.Command {
	var f consumersFlags
	cmd := &cobra.Command{
		Use:   "delete --stream S --consumer C",
		Short: "Release a consumer's holds on every partition of a stream",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.consumersDelete(cmd, &f)
		}),
	}
	cmd.Flags().StringVar(&f.stream, "stream", "", "stream (required)")
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "consumer to delete (required)")
	return cmd
}

func (a *app) consumersList(cmd *cobra.Command, f *consumersFlags) error {
	if err := requireStream(f.stream); err != nil {
		return err
	}
	if f.output != "table" && f.output != "json" {
		return usageErrorf("bad --output %q: want table or json", f.output)
	}
	ctx := cmd.Context()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	resp, err := c.ListConsumers(ctx, f.stream)
	if err != nil {
		return err
	}
	out := toConsumersJSON(resp)
	if f.output == "json" {
		return writeIndentedJSON(a, out)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tCONSUMER\tOFFSET\tLOG_START\tCOMMITTED\tFORCED_TRIM")
	for _, p := range out.Partitions {
		trims := map[string][]forcedTrimJSON{}
		for _, t := range p.ForcedTrims {
			trims[t.Consumer] = append(trims[t.Consumer], t)
		}
		if len(p.Holds) == 0 {
			fmt.Fprintf(tw, "%d\t-\t-\t%d\t%d\t-\n", p.Partition, p.LogStart, p.Committed)
		}
		for _, h := range p.Holds {
			trim := "-"
			if ts := trims[h.Consumer]; len(ts) > 0 {
				var parts []string
				for _, t := range ts {
					parts = append(parts, fmt.Sprintf("held %d, trimmed to %d at %s", t.HoldOffset, t.LogStart, t.Time))
				}
				trim = strings.Join(parts, "; ")
				delete(trims, h.Consumer)
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\n", p.Partition, h.Consumer, h.Offset, p.LogStart, p.Committed, trim)
		}
		// Forced trims of consumers without a hold any more.
		for _, t := range p.ForcedTrims {
			if _, left := trims[t.Consumer]; left {
				fmt.Fprintf(tw, "%d\t%s\t-\t%d\t%d\theld %d, trimmed to %d at %s\n", p.Partition, t.Consumer, p.LogStart, p.Committed, t.HoldOffset, t.LogStart, t.Time)
			}
		}
		if len(p.Disagreeing) > 0 {
			fmt.Fprintf(tw, "%d\t(members %s hold other offsets; the consumers' next commits align them)\t\t\t\t\n", p.Partition, strings.Join(p.Disagreeing, ", "))
		}
	}
	return tw.Flush()
}

func toConsumersJSON(resp *catenapb.ListConsumersResponse) consumersJSON {
	out := consumersJSON{Stream: resp.GetStream(), Partitions: []partitionConsumersJSON{}}
	for _, p := range resp.GetPartitions() {
		pj := partitionConsumersJSON{Partition: p.GetPartition(), LogStart: p.GetLogStart(), Committed: p.GetCommitted(),
			Holds: []holdJSON{}, ForcedTrims: []forcedTrimJSON{}, Disagreeing: p.GetDisagreeing()}
		for _, h := range p.GetHolds() {
			pj.Holds = append(pj.Holds, holdJSON{Consumer: h.GetConsumer(), Offset: h.GetOffset()})
		}
		for _, t := range p.GetForcedTrims() {
			pj.ForcedTrims = append(pj.ForcedTrims, forcedTrimJSON{Consumer: t.GetConsumer(), HoldOffset: t.GetHoldOffset(), LogStart: t.GetLogStart(),
				Time: time.UnixMilli(t.GetTimeMs()).UTC().Format(time.RFC3339)})
		}
		out.Partitions = append(out.Partitions, pj)
	}
	return out
}

func (a *app) consumersDelete(cmd *cobra.Command, f *consumersFlags) error {
	if err := requireStream(f.stream); err != nil {
		return err
	}
	if strings.TrimSpace(f.consumer) == "" {
		return usageErrorf("missing --consumer")
	}
	ctx := cmd.Context()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	resp, err := c.Ingest().DeleteConsumer(ctx, &catenapb.DeleteConsumerRequest{Stream: f.stream, Consumer: f.consumer})
	if status.Code(err) == codes.InvalidArgument {
		return usageError(err) // the consumer name is bad input
	}
	if err != nil {
		return err
	}
	if len(resp.GetPartitions()) == 0 {
		_, err = fmt.Fprintf(a.stdout, "consumer %q held no partition of stream %q\n", f.consumer, f.stream)
		return err
	}
	parts := make([]string, len(resp.GetPartitions()))
	for i, p := range resp.GetPartitions() {
		parts[i] = fmt.Sprint(p)
	}
	_, err = fmt.Fprintf(a.stdout, "deleted consumer %q of stream %q: released partitions %s\n", f.consumer, f.stream, strings.Join(parts, ","))
	return err
}
