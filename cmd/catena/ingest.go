package main

import (
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/rpc/transport"
)

func newIngestCommand() *cobra.Command {
	var (
		listen, metricsAddr, pprofAddr string
		replicas                       []string
		verbosity                      int
		tlsFiles                       transport.TLSFiles
	)
	cmd := &cobra.Command{
		Use:   "ingest",
		Short: "Run an ingestion node: routes produce and consume requests to partition chains",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := newLogger(verbosity).WithValues("role", "ingest")
			tlsConfig, err := tlsFiles.Config()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			reg := newRegistry()
			srv, err := ingest.New(ingest.Options{Replicas: replicas, TLS: tlsConfig, Logger: logger, Registerer: reg})
			if err != nil {
				return err
			}
			defer srv.Close()
			if err := serveMetrics(ctx, metricsAddr, reg, logger); err != nil {
				return err
			}
			if err := servePprof(ctx, pprofAddr, logger); err != nil {
				return err
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("failed to listen on %s: %w", listen, err)
			}
			g := grpc.NewServer(transport.ServerOptions(tlsConfig)...)
			srv.Register(g)
			logger.Info("Ingestion serving", "addr", lis.Addr().String(), "replicas", replicas)
			return serveGRPC(ctx, lis, g, 5*time.Second)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7070", "gRPC listen address")
	cmd.Flags().StringSliceVar(&replicas, "replicas", nil, "replica addresses to discover chains from (comma-separated, required)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-listen", "", "address to serve Prometheus /metrics on (empty: off)")
	pprofFlag(cmd, &pprofAddr)
	cmd.Flags().IntVarP(&verbosity, "verbosity", "v", 0, "log verbosity")
	tlsFlags(cmd, &tlsFiles)
	_ = cmd.MarkFlagRequired("replicas")
	return cmd
}
