// Command catena runs Catena's server roles: replica, ingest, dev (a local
// all-in-one), operator (the Kubernetes operator), and later the aggregator.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/catena-streams/catena/internal/writetrace"
	"github.com/catena-streams/catena/rpc/transport"
)

// version is set at link time.
var version = "dev"

func main() {
	err := newRootCommand().Execute()
	writetrace.Flush() // the marks since the last flush (CATENA_WRITE_TRACE)
	if err != nil {
		fmt.Fprintln(os.Stderr, "catena:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "catena",
		Short:         "Catena: a chain-replicated stream store for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.PersistentFlags().StringVar(&logFormat, "log-format", "text", "log lines as text (key=value) or json, one object per line, for log pipelines")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		switch logFormat {
		case "text", "json":
			return nil
		}
		return fmt.Errorf("--log-format %q must be text or json", logFormat)
	}
	root.AddCommand(newReplicaCommand(), newIngestCommand(), newDevCommand(), newOperatorCommand(), newAggregatorCommand())
	return root
}

// logFormat is --log-format: text or json.
var logFormat = "text"

func newLogger(verbosity int) logr.Logger {
	return logr.FromSlogHandler(logHandler(os.Stderr, logFormat, verbosity))
}

// logHandler writes log records to w as text (key=value) or JSON lines.
func logHandler(w io.Writer, format string, verbosity int) slog.Handler {
	opts := &slog.HandlerOptions{Level: slog.Level(-verbosity)}
	if format == "json" {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// tlsFlags adds --tls-cert, --tls-key and --tls-ca to a command.
func tlsFlags(cmd *cobra.Command, f *transport.TLSFiles) {
	cmd.Flags().StringVar(&f.CertFile, "tls-cert", "", "PEM certificate for mutual TLS (with --tls-key and --tls-ca)")
	cmd.Flags().StringVar(&f.KeyFile, "tls-key", "", "PEM key for mutual TLS")
	cmd.Flags().StringVar(&f.ClientCAFile, "tls-ca", "", "PEM CA that peers' certificates must chain to")
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// serveGRPC serves until ctx ends, then stops gracefully for at most
// grace: long-lived streams (replication links, subscriptions) never end on
// their own, so a bounded grace is the norm, not a failure.
func serveGRPC(ctx context.Context, lis net.Listener, g *grpc.Server, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grace):
		g.Stop()
	}
	return nil
}

// serveMetrics serves /metrics from reg on addr (empty: disabled).
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, tlsConfig *tls.Config, logger logr.Logger) error {
	if addr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return serveHTTP(ctx, addr, mux, transport.HTTPServerConfig(tlsConfig), "metrics", logger)
}

// serveMetricsTLS is serveMetrics over TLS when on (--metrics-tls).
func serveMetricsTLS(ctx context.Context, addr string, reg *prometheus.Registry, on bool, tlsConfig *tls.Config, logger logr.Logger) error {
	cfg, err := metricsTLS(on, tlsConfig)
	if err != nil {
		return err
	}
	return serveMetrics(ctx, addr, reg, cfg, logger)
}

// metricsFlag adds --metrics-tls to a command with --tls-*.
func metricsFlag(cmd *cobra.Command, on *bool) {
	cmd.Flags().BoolVar(on, "metrics-tls", false, "serve metrics over HTTPS with the --tls-* certificate (scrapers verify it against --tls-ca; no client certificate needed)")
}

// metricsTLS is the metrics server's TLS config: tlsConfig with
// --metrics-tls, nil (plain HTTP) without.
func metricsTLS(on bool, tlsConfig *tls.Config) (*tls.Config, error) {
	switch {
	case !on:
		return nil, nil
	case tlsConfig == nil:
		return nil, errors.New("--metrics-tls needs --tls-cert, --tls-key and --tls-ca")
	}
	return tlsConfig, nil
}

// pprofFlag adds --pprof-listen: Go profiles are off unless it is set, and
// then served on their own address, apart from metrics (a profile reads the
// process's memory and costs CPU: not for whoever may scrape metrics).
func pprofFlag(cmd *cobra.Command, addr *string) {
	cmd.Flags().StringVar(addr, "pprof-listen", "", "address to serve Go profiles (/debug/pprof/) on, e.g. 127.0.0.1:6060 (empty: off)")
}

// servePprof serves /debug/pprof/ on addr (empty: disabled).
func servePprof(ctx context.Context, addr string, logger logr.Logger) error {
	if addr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serveHTTP(ctx, addr, mux, nil, "profiles", logger)
}

// serveHTTP serves h on addr (over TLS with tlsConfig, when set) until
// ctx ends; what names it in logs and errors.
func serveHTTP(ctx context.Context, addr string, h http.Handler, tlsConfig *tls.Config, what string, logger logr.Logger) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("failed to listen for %s on %s: %w", what, addr, err)
	}
	if tlsConfig != nil {
		lis = tls.NewListener(lis, tlsConfig)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "HTTP server stopped", "serving", what)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	logger.Info("Serving "+what, "addr", lis.Addr().String())
	return nil
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
