package main

import (
	"fmt"
	"net"
	"strings"

	"github.com/spf13/cobra"

	"github.com/catena-streams/catena/internal/devcluster"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func newDevCommand() *cobra.Command {
	spec := devcluster.Spec{}
	var (
		verbosity  int
		durability string
		streams    []string
		pprofAddr  string
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local all-in-one: replica processes, an ingestion endpoint and its streams",
		Long: `Starts, on loopback, replica child processes (each with its own data directory under
--data-dir) and an ingestion endpoint on --listen, creates each --stream that does not exist
(by default one, "demo", of --partitions partitions, replication 3), writes DATA_DIR/dev.json
once ready, and serves until interrupted. Data is kept across restarts on the same --data-dir.
--stream is repeatable or comma-separated, each NAME or NAME:PARTITIONS, e.g.
--stream demo,demo-checkpoints or --stream demo:4 --stream agg-ckpt:1.
It is the master of every stream's chains: when a replica process exits, every chain goes on
without it under a new epoch at once, and the replica is restarted on its data directory, cut
back to where it agrees with its chains and re-added at their tails. A replica that does not
answer for --failure-timeout (paused, hung) is removed the same way and re-added when it
answers again.
Chains shorter than --min-chain-length refuse writes until they regrow.
With --pprof-listen, each replica serves Go profiles too, on an address of its own
(printed once ready, and in dev.json).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if spec.Streams, err = devcluster.ParseStreams(streams); err != nil {
				return err
			}
			switch durability {
			case "fsync":
				spec.Durability = catenapb.Durability_DURABILITY_FSYNC
			case "interval":
				spec.Durability = catenapb.Durability_DURABILITY_INTERVAL
				if spec.FsyncMs == 0 {
					spec.FsyncMs = 100
				}
			default:
				return fmt.Errorf("--durability %q must be fsync or interval", durability)
			}
			spec.Logger = newLogger(verbosity).WithValues("role", "dev")
			ctx, cancel := signalContext()
			defer cancel()
			reg := newRegistry()
			spec.ServeMetrics = func(addr string) error { return serveMetrics(ctx, addr, reg, nil, spec.Logger) }
			if err := servePprof(ctx, pprofAddr, spec.Logger); err != nil {
				return err
			}
			if pprofAddr != "" {
				// The replicas' profiles go where dev's were asked for
				// (a host that is not the ingestion's --listen).
				host, _, err := net.SplitHostPort(pprofAddr)
				if err != nil {
					return fmt.Errorf("--pprof-listen %q: %w", pprofAddr, err)
				}
				spec.ReplicaProfiles, spec.ProfilesHost = true, host
			}
			spec.Registerer = reg
			out := cmd.OutOrStdout()
			return devcluster.Run(ctx, spec, func(st devcluster.State) {
				fmt.Fprintf(out, "Catena dev cluster is ready (state in %s/%s)\n", spec.DataDir, devcluster.StateFile)
				label := "stream"
				if len(st.Streams) > 1 {
					label = "streams"
				}
				fmt.Fprintf(out, "  ingestion: %s  %s: %s  metrics http://%s/metrics\n", st.Ingest, label, strings.Join(st.Streams, ", "), st.Metrics)
				if st.Kafka != "" {
					fmt.Fprintf(out, "  kafka: %s (bootstrap server for Kafka clients)\n", st.Kafka)
				}
				for _, r := range st.Replicas {
					fmt.Fprintf(out, "  replica %s: %s  pid %d  metrics http://%s/metrics  data %s\n", r.ID, r.Addr, r.PID, r.Metrics, r.DataDir)
					if r.Pprof != "" {
						fmt.Fprintf(out, "    profiles http://%s/debug/pprof/\n", r.Pprof)
					}
				}
				fmt.Fprintf(out, "Try: bin/catenactl --server %s produce --stream %s --key k1 <<< hello\n", st.Ingest, st.Stream)
			})
		},
	}
	f := cmd.Flags()
	pprofFlag(cmd, &pprofAddr)
	f.StringVar(&spec.DataDir, "data-dir", ".catena-dev", "directory for every replica's data and dev.json")
	f.StringVar(&spec.Listen, "listen", "127.0.0.1:7070", "ingestion address; replicas use the following ports")
	f.StringVar(&spec.KafkaListen, "kafka-listen", "", "address of a Kafka listener for unchanged Kafka clients, e.g. 127.0.0.1:9092 (empty: none; docs/kafka.md)")
	f.IntVar(&spec.Replicas, "replicas", 3, "replica processes to run")
	f.StringSliceVar(&streams, "stream", []string{"demo"}, "streams to create and master, repeatable or comma-separated, each NAME or NAME:PARTITIONS")
	f.IntVar(&spec.Partitions, "partitions", 4, "partitions of each stream that gives no NAME:PARTITIONS")
	f.IntVar(&spec.Replication, "replication", 3, "chain length of each partition")
	f.BoolVar(&spec.Journal, "journal", false, "run each replica with --journal: one journal per replica makes appends durable, instead of an fsync per partition (docs/journal.md)")
	f.StringVar(&durability, "durability", "fsync", "fsync (fsync on every member before the ack) or interval")
	f.Uint32Var(&spec.FsyncMs, "fsync-interval-ms", 0, "fsync interval with --durability interval (default 100)")
	f.IntVar(&spec.MinChainLength, "min-chain-length", 0, "fewest chain members a partition needs to take writes (0: a majority of --replication); shorter chains refuse appends")
	f.DurationVar(&spec.RetentionTime, "retention", 0, "delete records older than this once no consumer holds them (0: keep)")
	f.Int64Var(&spec.RetentionBytes, "retention-bytes", 0, "keep at most this many bytes per partition once no consumer holds the rest (0: no limit)")
	f.DurationVar(&spec.HardRetentionTime, "hard-retention", 0, "delete records older than this whatever the consumer holds (0: keep)")
	f.Int64Var(&spec.HardRetentionBytes, "hard-retention-bytes", 0, "keep at most this many bytes per partition whatever the consumer holds (0: no limit)")
	f.Int64Var(&spec.SegmentBytes, "segment-bytes", 0, "size at which each partition's segment files roll, 1 MiB to 1 GiB (0: 256 MiB, or an eighth of the smallest byte limit of retention)")
	f.DurationVar(&spec.FailureTimeout, "failure-timeout", devcluster.DefaultFailureTimeout, "how long a replica may not answer before the master removes it from its chains")
	f.IntVarP(&verbosity, "verbosity", "v", 0, "log verbosity")
	return cmd
}
