package main

import (
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/server"
	"github.com/catena-streams/catena/rpc/transport"
)

// replicaFS, when set, is the file system replicas keep their logs on
// instead of the real one. Only a binary built with the powerloss tag sets
// it (powerloss.go), so a production build cannot lose synced-looking data
// on purpose.
var replicaFS func() partlog.FS

func newReplicaCommand() *cobra.Command {
	var (
		id, listen, dataDir, metricsAddr, pprofAddr string
		verbosity, catchUpRate                      int
		metricsOverTLS, useJournal                  bool
		scrubEvery                                  time.Duration
		tlsFiles                                    transport.TLSFiles
		allow                                       *allowFlags
	)
	cmd := &cobra.Command{
		Use:   "replica",
		Short: "Run a replica process hosting partition replicas of many streams",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := newLogger(verbosity).WithValues("replica", id)
			tlsConfig, err := tlsFiles.Config()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			reg := newRegistry()
			authz, err := allow.serverOptions(tlsConfig != nil, server.MethodClasses(), reg)
			if err != nil {
				return err
			}
			if catchUpRate < 0 {
				return fmt.Errorf("--catch-up-rate must be 0 (no cap) or a positive number of MiB/s, got %d", catchUpRate)
			}
			if scrubEvery < 0 || (scrubEvery > 0 && scrubEvery < time.Minute) {
				return fmt.Errorf("--scrub-interval must be 0 (no scrubs) or at least 1m, got %s", scrubEvery)
			}
			if scrubEvery == 0 {
				scrubEvery = -1 // Options: negative, never
			}
			opts := server.Options{ID: id, DataDir: dataDir, TLS: tlsConfig, Logger: logger, Registerer: reg,
				CatchUpBytesPerSecond: int64(catchUpRate) << 20, Journal: useJournal, ScrubInterval: scrubEvery}
			if replicaFS != nil {
				opts.FS = replicaFS()
				logger.Info("Keeping unsynced writes in memory only: killing this process loses them as a power cut would (a powerloss test build)")
			}
			srv, err := server.New(opts)
			if err != nil {
				return err
			}
			defer srv.Close()
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("failed to listen on %s: %w", listen, err)
			}
			if err := serveMetricsTLS(ctx, metricsAddr, reg, metricsOverTLS, tlsConfig, logger); err != nil {
				return err
			}
			if err := servePprof(ctx, pprofAddr, logger); err != nil {
				return err
			}
			g := grpc.NewServer(append(transport.ServerOptions(tlsConfig), authz...)...)
			srv.Register(g)
			logger.Info("Replica serving", "addr", lis.Addr().String(), "dataDir", dataDir)
			return serveGRPC(ctx, lis, g, time.Second)
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "this replica's id in chain memberships (required)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7071", "gRPC listen address")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for partition logs (required)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-listen", "", "address to serve Prometheus /metrics on (empty: off)")
	pprofFlag(cmd, &pprofAddr)
	cmd.Flags().IntVar(&catchUpRate, "catch-up-rate", server.DefaultCatchUpMiBPerSecond, "MiB/s at most that this replica copies, all the partitions it catches up on outside their chains together, and, separately, at most that it serves to all the replicas copying history from it (0: no cap)")
	cmd.Flags().DurationVar(&scrubEvery, "scrub-interval", server.DefaultScrubInterval, "how often every partition's sealed segments are read back from the disk and checked, to find damage no read met while the chain has good copies (0: never)")
	cmd.Flags().BoolVar(&useJournal, "journal", false, "make appends durable through one journal for the process (<data-dir>/journal) instead of an fsync of each partition's files (docs/journal.md); a data directory that holds a journal needs it")
	cmd.Flags().IntVarP(&verbosity, "verbosity", "v", 0, "log verbosity")
	tlsFlags(cmd, &tlsFiles)
	metricsFlag(cmd, &metricsOverTLS)
	allow = addAllowFlags(cmd, "replica", server.MethodClasses(), false)
	_ = cmd.MarkFlagRequired("id")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}
