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
		metricsOverTLS                 bool
		tlsFiles                       transport.TLSFiles
		allow                          *allowFlags
		stream, allowOthers            string
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
			policy, err := allow.policy(tlsConfig != nil, ingest.MethodClasses(), reg)
			if err != nil {
				return err
			}
			if stream != "" && policy != nil {
				policy.ForRequest = ingest.ForStream(stream, transport.ParseAllow(allowOthers))
			}
			var serverOpts []grpc.ServerOption
			if policy != nil {
				serverOpts = policy.ServerOptions()
			}
			srv, err := ingest.New(ingest.Options{Replicas: replicas, TLS: tlsConfig, Logger: logger, Registerer: reg})
			if err != nil {
				return err
			}
			defer srv.Close()
			if err := serveMetricsTLS(ctx, metricsAddr, reg, metricsOverTLS, tlsConfig, logger); err != nil {
				return err
			}
			if err := servePprof(ctx, pprofAddr, logger); err != nil {
				return err
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("failed to listen on %s: %w", listen, err)
			}
			// Clients may come without a certificate (the --allow-*
			// flags say whether that is enough); links to replicas
			// present this node's.
			g := grpc.NewServer(append(transport.ServerOptions(transport.OptionalClientCerts(tlsConfig)), serverOpts...)...)
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
	metricsFlag(cmd, &metricsOverTLS)
	allow = addAllowFlags(cmd, "ingestion node", ingest.MethodClasses(), true)
	cmd.Flags().StringVar(&stream, "stream", "", "the Stream whose access the --allow-* flags give; requests about other Streams are allowed to --allow-other-streams only (empty: the flags cover every Stream)")
	cmd.Flags().StringVar(&allowOthers, "allow-other-streams", transport.AnyIdentity, "with --stream: identities that may make any call about another Stream (comma-separated, as --allow-*)")
	_ = cmd.MarkFlagRequired("replicas")
	return cmd
}
