package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// catenactl stream create/delete/list: where the server lets clients
// manage streams (catena dev, the chain master of its own); on Kubernetes
// a stream is a Stream object, and the server says so.
func newStreamCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stream",
		Short: "Create, delete or list streams (catena dev; on Kubernetes apply a Stream object)",
		Args:  cobra.NoArgs,
	}
	var partitions int
	var output string
	create := &cobra.Command{
		Use:   "create NAME [--partitions N]",
		Short: "Create a stream and show its chains",
		Args:  cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return usageErrorf("bad --output %q: want table or json", output)
			}
			if partitions < 1 {
				return usageErrorf("--partitions must be at least 1, got %d", partitions)
			}
			ctx := cmd.Context()
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.CreateStream(ctx, args[0], partitions)
			if err != nil {
				return err
			}
			s := toStreamJSON(d)
			if output == "json" {
				return writeIndentedJSON(a, s)
			}
			return writeDescribeTable(a, s)
		}),
	}
	create.Flags().IntVar(&partitions, "partitions", 4, "partitions of the stream")
	create.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	var yes bool
	del := &cobra.Command{
		Use:   "delete NAME --yes",
		Short: "Delete a stream and every copy of its records",
		Args:  cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if !yes {
				return usageErrorf("deleting stream %s erases every copy of its records: say --yes", args[0])
			}
			ctx := cmd.Context()
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.DeleteStream(ctx, args[0]); err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "deleted stream %s\n", args[0])
			return err
		}),
	}
	del.Flags().BoolVar(&yes, "yes", false, "confirm that the records go with the stream")
	del.ValidArgsFunction = a.completeStreams
	list := &cobra.Command{
		Use:   "list [-o table|json]",
		Short: "List the streams",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.describe(cmd, &describeFlags{output: output})
		}),
	}
	list.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.AddCommand(create, del, list)
	return cmd
}
