package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
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
		peers                          []string
		peerServerName, brokerDomain   string
		offsetsStream                  string
		offsetsRetention               time.Duration
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
			membership, err := groupPeers(peers, kafkaAdvertise)
			if err != nil {
				return err
			}
			coord := newGroupCoordinator(srv, offsetsStream, offsetsRetention, membership, logger)
			go coord.Run(ctx, groups.TickInterval)
			svc := &groups.Service{Coordinator: coord, Ingest: srv}
			if membership != nil {
				go groups.Discover(ctx, membership, peers, peerResolveInterval, logger.WithName("groups"))
				_, grpcPort, err := net.SplitHostPort(lis.Addr().String())
				if err != nil {
					return err
				}
				// Peers present this node's certificate: every node of
				// the deployment has the same one, so the name checked is
				// the deployment's, not the peer's address.
				var extra []grpc.DialOption
				if peerServerName != "" {
					extra = append(extra, grpc.WithAuthority(peerServerName))
				}
				pool := transport.NewPool(tlsConfig, extra...)
				defer pool.Close()
				svc.Membership = membership
				svc.Dial = func(host string) (*grpc.ClientConn, error) { return pool.Get(net.JoinHostPort(host, grpcPort)) }
			}
			svc.Register(g)
			if kafkaListen != "" {
				ks, err := serveKafka(kafkaListen, kafkaAdvertise, brokerDomain, offsetsStream, srv, coord, membership, clientTLS, policy, reg, logger)
				if err != nil {
					return err
				}
				defer ks.Close()
			}
			logger.Info("Ingestion serving", "addr", lis.Addr().String(), "replicas", replicas)
			// Stopping, the node ends its producers' streams as they send
			// their next request, so that they move to another node now
			// rather than at the end of the grace period.
			context.AfterFunc(ctx, srv.Drain)
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
	cmd.Flags().StringSliceVar(&peers, "peers", nil, "the ingestion nodes that share consumer groups, this one among them (comma-separated names or IPs; a name, such as a headless Service's, stands for every address it resolves to, resolved again every few seconds); needs --kafka-advertise, whose host is this node's address among them (empty: this node coordinates every group)")
	cmd.Flags().StringVar(&offsetsStream, "groups-stream", groups.DefaultOffsetsStream, "the internal stream consumer groups' committed offsets are kept in (on Kubernetes, the Stream <stream>-groups the operator creates)")
	cmd.Flags().DurationVar(&offsetsRetention, "group-offsets-retention", groups.DefaultOffsetsRetention, "how long a consumer group without members keeps its committed offsets and retention holds after it last had members or committed (Kafka's offsets.retention.minutes; 0: until deleted)")
	cmd.Flags().StringVar(&brokerDomain, "kafka-broker-domain", "", "with --peers: advertise each node to Kafka clients as <its IP, dots and colons as dashes>.<this domain> (a headless Service's domain names each ready pod so), a name its TLS certificate can hold (empty: as its address)")
	cmd.Flags().StringVar(&peerServerName, "peer-server-name", "", "with --peers and TLS: the name the peers' certificate is checked against (the nodes share one certificate; empty: the peer's address)")
	_ = cmd.MarkFlagRequired("replicas")
	return cmd
}

// podDNSLabel is the DNS label Kubernetes names a pod of a headless
// Service by: its IP with dots (and an IPv6 address's colons) as dashes.
func podDNSLabel(ip string) string {
	return strings.NewReplacer(".", "-", ":", "-").Replace(ip)
}

// peerResolveInterval is how often --peers is resolved again: a node that
// came or went is counted within it.
const peerResolveInterval = 2 * time.Second

// groupPeers is the membership --peers describes, with this node at the
// host of advertise (nil without --peers).
func groupPeers(peers []string, advertise string) (*groups.Membership, error) {
	if len(peers) == 0 {
		return nil, nil
	}
	if advertise == "" {
		return nil, errors.New("--peers needs --kafka-advertise with this node's address among the peers")
	}
	host, _, err := kafka.SplitBrokerAddress(advertise)
	if err != nil || host == "" {
		return nil, fmt.Errorf("--peers needs --kafka-advertise with this node's address among the peers (got %q: %v)", advertise, err)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("--kafka-advertise %q: with --peers it names this node's own address, not an unspecified one", advertise)
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		// As the peers' names resolve: this node must find itself
		// among them (fd00:0::5 is fd00::5).
		host = addr.String()
	}
	return groups.NewMembership(host), nil
}

// serveKafka starts ingestion's Kafka listener: the same TLS as the gRPC
// listener's, and the same access policy, judged per operation.
func serveKafka(listen, advertise, brokerDomain, offsetsStream string, srv *ingest.Server, coord *groups.Coordinator, membership *groups.Membership, tlsConfig *tls.Config, policy *transport.Policy, reg prometheus.Registerer, logger logr.Logger) (*kafka.Server, error) {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("failed to listen for Kafka clients on %s: %w", listen, err)
	}
	if advertise == "" {
		advertise = lis.Addr().String()
	}
	opts := kafka.Options{Ingest: srv, Groups: coord, OffsetsStream: offsetsStream, Membership: membership, Advertise: advertise, TLS: tlsConfig, Registerer: reg, Logger: logger.WithValues("listener", "kafka")}
	if membership != nil && brokerDomain != "" {
		opts.BrokerHost = func(peer string) string { return podDNSLabel(peer) + "." + brokerDomain }
		if _, port, err := kafka.SplitBrokerAddress(advertise); err == nil {
			opts.Advertise = net.JoinHostPort(opts.BrokerHost(membership.Self().Host), port)
		}
	}
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
// offsetsStream; with a membership, it coordinates the
// groups it owns among the peers.
func newGroupCoordinator(srv *ingest.Server, offsetsStream string, offsetsRetention time.Duration, membership *groups.Membership, logger logr.Logger) *groups.Coordinator {
	if offsetsRetention == 0 {
		offsetsRetention = -1 // the flag's 0 is never; the option's is the default
	}
	return groups.New(groups.Options{Offsets: &groups.StreamOffsets{Ingest: srv, Stream: offsetsStream, Logger: logger.WithName("groups")},
		Membership: membership, OffsetsRetention: offsetsRetention, Logger: logger.WithName("groups")})
}
