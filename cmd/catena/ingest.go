package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/ingest/kafka"
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
		kafkaListen, kafkaAdvertise    string
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
			clientTLS := transport.OptionalClientCerts(tlsConfig)
			g := grpc.NewServer(append(transport.ServerOptions(clientTLS), serverOpts...)...)
			srv.Register(g)
			coord := newGroupCoordinator(srv, logger)
			(&groups.Service{Coordinator: coord, Ingest: srv}).Register(g)
			if kafkaListen != "" {
				ks, err := serveKafka(kafkaListen, kafkaAdvertise, srv, coord, clientTLS, policy, logger)
				if err != nil {
					return err
				}
				defer ks.Close()
			}
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
	cmd.Flags().StringVar(&kafkaListen, "kafka-listen", "", "address of a Kafka listener for unchanged Kafka clients (empty: none; docs/kafka.md); it serves TLS and applies the --allow-* flags as the gRPC listener does")
	cmd.Flags().StringVar(&kafkaAdvertise, "kafka-advertise", "", "host:port Kafka clients are told to connect to (empty: the --kafka-listen address, with this host's name for an unspecified host)")
	_ = cmd.MarkFlagRequired("replicas")
	return cmd
}

// serveKafka starts ingestion's Kafka listener: the same TLS as the gRPC
// listener's, and the same access policy, judged per operation.
func serveKafka(listen, advertise string, srv *ingest.Server, coord *groups.Coordinator, tlsConfig *tls.Config, policy *transport.Policy, logger logr.Logger) (*kafka.Server, error) {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("failed to listen for Kafka clients on %s: %w", listen, err)
	}
	if advertise == "" {
		advertise = lis.Addr().String()
	}
	opts := kafka.Options{Ingest: srv, Groups: coord, Advertise: advertise, TLS: tlsConfig, Logger: logger.WithValues("listener", "kafka")}
	if policy != nil {
		opts.Authorize = policy.Check
	}
	ks, err := kafka.New(opts)
	if err != nil {
		lis.Close()
		return nil, err
	}
	go func() {
		if err := ks.Serve(lis); err != nil {
			logger.Error(err, "Kafka listener stopped")
		}
	}()
	logger.Info("Kafka listener serving", "addr", lis.Addr().String(), "advertised", ks.Advertised())
	return ks, nil
}

// newGroupCoordinator is the consumer-group coordinator an ingestion node
// serves through its Kafka listener and the Groups gRPC API, with the
// groups' committed offsets in the internal stream
// groups.DefaultOffsetsStream.
func newGroupCoordinator(srv *ingest.Server, logger logr.Logger) *groups.Coordinator {
	return groups.New(groups.Options{Offsets: &groups.StreamOffsets{Ingest: srv, Logger: logger.WithName("groups")}, Logger: logger.WithName("groups")})
}
