package main

import (
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/catena-streams/catena/replica/server"
	"github.com/catena-streams/catena/rpc/transport"
)

func newReplicaCommand() *cobra.Command {
	var (
		id, listen, dataDir, metricsAddr string
		verbosity                        int
		tlsFiles                         transport.TLSFiles
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
			srv, err := server.New(server.Options{ID: id, DataDir: dataDir, TLS: tlsConfig, Logger: logger, Registerer: reg})
			if err != nil {
				return err
			}
			defer srv.Close()
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("failed to listen on %s: %w", listen, err)
			}
			if err := serveMetrics(ctx, metricsAddr, reg, logger); err != nil {
				return err
			}
			g := grpc.NewServer(transport.ServerOptions(tlsConfig)...)
			srv.Register(g)
			logger.Info("Replica serving", "addr", lis.Addr().String(), "dataDir", dataDir)
			return serveGRPC(ctx, lis, g, time.Second)
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "this replica's id in chain memberships (required)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7071", "gRPC listen address")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for partition logs (required)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-listen", "", "address to serve Prometheus /metrics on (empty: off)")
	cmd.Flags().IntVarP(&verbosity, "verbosity", "v", 0, "log verbosity")
	tlsFlags(cmd, &tlsFiles)
	_ = cmd.MarkFlagRequired("id")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}
