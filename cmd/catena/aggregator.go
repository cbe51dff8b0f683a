package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"sigs.k8s.io/yaml"

	"github.com/catena-streams/catena/aggregator"
	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

func newAggregatorCommand() *cobra.Command {
	var (
		id, listen, ingestAddr, specFile, ckptStream, shardList, metricsAddr, pprofAddr string
		verbosity                                                                       int
		metricsOverTLS                                                                  bool
		tlsFiles                                                                        transport.TLSFiles
		allow                                                                           *allowFlags
	)
	cmd := &cobra.Command{
		Use:   "aggregator",
		Short: "Run an aggregation worker: per-key aggregates of a stream, checkpointed and restorable",
		Long: `Serves the Aggregator API on --listen. In a cluster the operator assigns the worker its
shards (source partitions) and the Aggregation's spec. Standalone, --spec names an Aggregation
manifest (YAML or JSON) and the worker takes every partition of its source itself, reading and
checkpointing through --ingest (for example against catena dev):

  catena dev --stream demo:4,clicks-checkpoints:4 &
  catena aggregator --spec clicks.yaml --checkpoint-stream clicks-checkpoints --ingest 127.0.0.1:7070

Killed and started again, it restores every shard from its latest checkpoint and re-reads the
source from the offsets recorded there.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if id == "" {
				host, _ := os.Hostname()
				id = host
			}
			logger := newLogger(verbosity).WithValues("role", "aggregator", "worker", id)
			tlsConfig, err := tlsFiles.Config()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("failed to listen on %s: %w", listen, err)
			}
			reg := newRegistry()
			authz, err := allow.serverOptions(tlsConfig != nil, aggregator.MethodClasses(), reg)
			if err != nil {
				return err
			}
			if err := serveMetricsTLS(ctx, metricsAddr, reg, metricsOverTLS, tlsConfig, logger); err != nil {
				return err
			}
			if err := servePprof(ctx, pprofAddr, logger); err != nil {
				return err
			}
			w := aggregator.NewWorker(aggregator.Options{ID: id, Ingest: ingestAddr, TLS: tlsConfig, Logger: logger, Registerer: reg})
			defer w.Close()
			if specFile != "" {
				req, err := standaloneAssignment(ctx, specFile, id, lis.Addr().String(), ingestAddr, ckptStream, shardList)
				if err != nil {
					return err
				}
				if _, err := w.Assign(ctx, req); err != nil {
					return fmt.Errorf("failed to start: %w", err)
				}
				logger.Info("Aggregating standalone", "aggregation", req.Aggregation, "shards", req.Shards, "checkpointStream", req.CheckpointStream)
			}
			// Clients querying results may come without a certificate
			// (the --allow-* flags say whether that is enough).
			g := grpc.NewServer(append(transport.ServerOptions(transport.OptionalClientCerts(tlsConfig)), authz...)...)
			catenapb.RegisterAggregatorServer(g, w)
			logger.Info("Aggregator serving", "addr", lis.Addr().String())
			return serveGRPC(ctx, lis, g, time.Second)
		},
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "", "this worker's id (default: the host name, the pod name in a cluster)")
	f.StringVar(&listen, "listen", "127.0.0.1:7090", "gRPC listen address")
	f.StringVar(&ingestAddr, "ingest", "", "ingestion endpoint for the source and checkpoint streams, when the operator names none")
	f.StringVar(&specFile, "spec", "", "standalone: an Aggregation manifest to run without an operator")
	f.StringVar(&ckptStream, "checkpoint-stream", "", "standalone: the stream to checkpoint into (default <name>-checkpoints)")
	f.StringVar(&metricsAddr, "metrics-listen", "", "address to serve Prometheus /metrics on (empty: off)")
	pprofFlag(cmd, &pprofAddr)
	f.StringVar(&shardList, "shards", "", "standalone: the source partitions to run, comma-separated (default all)")
	f.IntVarP(&verbosity, "verbosity", "v", 0, "log verbosity")
	tlsFlags(cmd, &tlsFiles)
	metricsFlag(cmd, &metricsOverTLS)
	allow = addAllowFlags(cmd, "aggregation worker", aggregator.MethodClasses(), true)
	return cmd
}

// standaloneAssignment turns an Aggregation manifest into the assignment
// an operator would push: every shard (or --shards) to this worker.
func standaloneAssignment(ctx context.Context, file, id, addr, ingestAddr, ckptStream, shardList string) (*catenapb.AssignRequest, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var agg streamsv1alpha1.Aggregation
	if err := yaml.UnmarshalStrict(raw, &agg); err != nil {
		return nil, fmt.Errorf("%s is not an Aggregation manifest: %w", file, err)
	}
	if agg.Kind != "" && agg.Kind != "Aggregation" {
		return nil, fmt.Errorf("%s holds a %s, not an Aggregation", file, agg.Kind)
	}
	if agg.Name == "" {
		return nil, fmt.Errorf("%s: metadata.name must be set", file)
	}
	if _, err := aggregator.Compile(agg.Spec); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if ingestAddr == "" {
		ingestAddr = client.DefaultAddr
	}
	if agg.Namespace == "" {
		agg.Namespace = "local"
	}
	if ckptStream == "" {
		ckptStream = agg.CheckpointStreamName()
	}
	c, err := client.Dial(ctx, ingestAddr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := c.Describe(dctx, agg.Spec.Source)
	if err != nil {
		return nil, fmt.Errorf("failed to describe source stream %s at %s: %w", agg.Spec.Source, ingestAddr, err)
	}
	if _, err := c.Describe(dctx, ckptStream); err != nil {
		return nil, fmt.Errorf("failed to describe checkpoint stream %s at %s (create it next to the source, e.g. catena dev --stream %s,%s): %w", ckptStream, ingestAddr, agg.Spec.Source, ckptStream, err)
	}
	parts := uint32(len(d.GetPartitions()))
	specJSON, _ := json.Marshal(agg.Spec)
	req := &catenapb.AssignRequest{
		Aggregation: agg.Namespace + "/" + agg.Name, Generation: time.Now().UnixNano(), SpecJson: specJSON,
		SourcePartitions: parts, Ingest: ingestAddr, CheckpointStream: ckptStream, Consumer: agg.ConsumerName(),
		Peers: map[string]string{id: addr}, Owners: map[uint32]string{},
	}
	if shardList == "" {
		for p := range parts {
			req.Shards = append(req.Shards, p)
		}
	} else {
		for _, s := range strings.Split(shardList, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("--shards %q: %q is not a partition number", shardList, s)
			}
			req.Shards = append(req.Shards, uint32(n))
		}
	}
	for _, s := range req.Shards {
		req.Owners[s] = id
	}
	return req, nil
}
