package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// The consumer groups of Kafka clients (docs/kafka.md): list, describe,
// reset and delete, through the Groups service beside ingestion.

func newGroupCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group",
		Short: "List, describe, reset or delete the consumer groups of Kafka clients",
		Long: "Kafka clients on an ingestion node's Kafka listener join consumer groups;\n" +
			"a group's committed offsets are stored in the internal stream catena-groups\n" +
			"and held from retention (consumer kafka.group/<group> in consumers list).",
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newGroupListCommand(a), newGroupDescribeCommand(a), newGroupResetCommand(a), newGroupDeleteCommand(a))
	return cmd
}

func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return usageErrorf("bad --output %q: want table or json", o)
	}
	return nil
}

// groupCallError makes a refusal for bad input a usage error.
func groupCallError(err error) error {
	if status.Code(err) == codes.InvalidArgument {
		return usageError(err)
	}
	return err
}

func newGroupListCommand(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "list [-o table|json]",
		Short: "List every consumer group, with or without members",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			groups, err := c.ListGroups(ctx)
			if err != nil {
				return err
			}
			if output == "json" {
				type groupJSON struct {
					Group        string `json:"group"`
					State        string `json:"state"`
					ProtocolType string `json:"protocol_type"`
					Members      uint32 `json:"members"`
				}
				out := []groupJSON{}
				for _, g := range groups {
					out = append(out, groupJSON{g.GetGroup(), g.GetState(), g.GetProtocolType(), g.GetMembers()})
				}
				return writeIndentedJSON(a, out)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "GROUP\tSTATE\tPROTOCOL_TYPE\tMEMBERS")
			for _, g := range groups {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", g.GetGroup(), g.GetState(), dash(g.GetProtocolType()), g.GetMembers())
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newGroupDescribeCommand(a *app) *cobra.Command {
	var output, stream string
	cmd := &cobra.Command{
		Use:   "describe GROUP [--stream S] [-o table|json]",
		Short: "Show a group's members, their partitions, and its committed offsets and lag",
		Args:  cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.DescribeGroup(ctx, args[0], stream)
			if err != nil {
				return groupCallError(err)
			}
			if output == "json" {
				b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true, EmitUnpopulated: true}.Marshal(d)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.stdout, "%s\n", b)
				return err
			}
			fmt.Fprintf(a.stdout, "group %s: %s, generation %d", d.GetGroup(), d.GetState(), d.GetGeneration())
			if d.GetProtocol() != "" {
				fmt.Fprintf(a.stdout, ", %s/%s, leader %s", d.GetProtocolType(), d.GetProtocol(), d.GetLeader())
			}
			fmt.Fprintln(a.stdout)
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			if len(d.GetMembers()) > 0 {
				fmt.Fprintln(tw, "MEMBER\tCLIENT_ID\tHOST\tPARTITIONS")
				for _, m := range d.GetMembers() {
					var parts []string
					for _, as := range m.GetAssignment() {
						ps := make([]string, len(as.GetPartitions()))
						for i, p := range as.GetPartitions() {
							ps[i] = strconv.Itoa(int(p))
						}
						parts = append(parts, as.GetStream()+":"+strings.Join(ps, ","))
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.GetId(), m.GetClientId(), m.GetClientHost(), dash(strings.Join(parts, " ")))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				fmt.Fprintln(a.stdout)
				tw = tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			}
			fmt.Fprintln(tw, "STREAM\tPARTITION\tOFFSET\tEND\tLAG\tCOMMITTED_AT")
			for _, o := range d.GetOffsets() {
				end, lag := "-", "-"
				if o.GetEnd() > 0 || o.GetOffset() == 0 {
					end = strconv.FormatUint(o.GetEnd(), 10)
					lag = strconv.FormatInt(int64(o.GetEnd())-int64(o.GetOffset()), 10)
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", o.GetStream(), o.GetPartition(), o.GetOffset(), end, lag,
					time.UnixMilli(o.GetCommittedAtMs()).UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().StringVar(&stream, "stream", "", "show only the offsets and partitions of this stream")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newGroupResetCommand(a *app) *cobra.Command {
	var (
		stream, to, partitions string
		dryRun                 bool
	)
	cmd := &cobra.Command{
		Use:   "reset GROUP --stream S --to earliest|latest|OFFSET|@UNIX_MS [--partitions 0,2] [--dry-run]",
		Short: "Move a group's committed offsets on a stream (its consumers stopped)",
		Long: "The group must have no members: stop its consumers first. An offset outside\n" +
			"a partition's records is moved to its start or end, as Kafka's\n" +
			"kafka-consumer-groups --reset-offsets does. The new offsets are stored and\n" +
			"held from retention before the command returns.",
		Args: cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := requireStream(stream); err != nil {
				return err
			}
			if to == "" {
				return usageErrorf("missing --to: earliest, latest, an offset or @UNIX_MS")
			}
			pos, err := client.ParsePosition(to)
			if err != nil {
				return usageError(err)
			}
			req := &catenapb.ResetGroupOffsetsRequest{Group: args[0], Stream: stream, DryRun: dryRun}
			req.Spec, req.Offset, req.TimestampMs = pos.Request()
			if partitions != "" {
				for _, f := range strings.Split(partitions, ",") {
					p, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
					if err != nil {
						return usageErrorf("bad --partitions %q: want partition numbers separated by commas", partitions)
					}
					req.Partitions = append(req.Partitions, uint32(p))
				}
			}
			ctx := cmd.Context()
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			changes, err := c.ResetGroupOffsets(ctx, req)
			if err != nil {
				return groupCallError(err)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PARTITION\tPREVIOUS\tNEW\t")
			for _, ch := range changes {
				prev, note := "-", ""
				if ch.GetPrevious() >= 0 {
					prev = strconv.FormatInt(ch.GetPrevious(), 10)
				}
				if ch.GetClamped() {
					note = "(moved into the partition's records)"
				}
				fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", ch.GetPartition(), prev, ch.GetOffset(), note)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if dryRun {
				_, err = fmt.Fprintln(a.stdout, "dry run: nothing was changed")
			}
			return err
		}),
	}
	cmd.Flags().StringVar(&stream, "stream", "", "stream whose offsets to reset (required)")
	cmd.Flags().StringVar(&to, "to", "", "new position: earliest, latest, an offset or @UNIX_MS (required)")
	cmd.Flags().StringVar(&partitions, "partitions", "", "partitions to reset, comma-separated (default: all)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show the new offsets without storing them")
	return cmd
}

func newGroupDeleteCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "delete GROUP",
		Short: "Delete a group with no members: its committed offsets and retention holds",
		Args:  cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.DeleteGroup(ctx, args[0]); err != nil {
				return groupCallError(err)
			}
			_, err = fmt.Fprintf(a.stdout, "deleted group %q\n", args[0])
			return err
		}),
	}
}
