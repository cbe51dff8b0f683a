package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/catena-streams/catena/client"
)

// app holds the I/O and global flags shared by the commands.
type app struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	server string
	tls    tlsFlags
	// profile names the profile to take unset connection flags from.
	profile string
}

// tlsFlags are the PEM files of a TLS endpoint: the CA bundle that signs
// the server's certificate, and for mutual TLS this client's certificate
// and key.
type tlsFlags struct{ ca, cert, key string }

func (f tlsFlags) enabled() bool { return f.ca != "" || f.cert != "" || f.key != "" }

// config is the client TLS config of the files; a bad set of files is a
// usage error (exit 2).
func (f tlsFlags) config() (*tls.Config, error) {
	if (f.cert == "") != (f.key == "") {
		return nil, usageErrorf("--tls-cert and --tls-key go together (got cert %q, key %q)", f.cert, f.key)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, usageErrorf("--tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usageErrorf("--tls-ca %s holds no PEM certificate", f.ca)
		}
		cfg.RootCAs = pool
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, usageErrorf("--tls-cert/--tls-key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// NewRootCommand builds the catenactl command tree writing to the given
// streams (tests run it in-process).
func NewRootCommand(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "catenactl",
		Short: "Produce to, consume from, inspect and benchmark Catena streams",
		Long: "catenactl talks to a Catena ingestion endpoint (--server, or $CATENA_SERVER), in plaintext or,\n" +
			"with --tls-ca (and --tls-cert/--tls-key for mutual TLS), over TLS. A profile (catenactl profile)\n" +
			"keeps those settings: each comes from its flag, else its environment variable, else the profile.\n\n" +
			"Exit codes: 0 success, 1 server or runtime error, 2 bad command line or input.",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			for c := cmd; c != nil; c = c.Parent() {
				switch c.Name() {
				case "profile":
					return nil // the profile commands read the flags as given
				case "version", "completion", "help":
					return nil // they dial nothing
				}
			}
			return a.resolveConnection(cmd.Flags())
		},
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Defaults, environment variables and profiles are applied after
	// parsing (resolveConnection): a flag given wins over all of them.
	root.PersistentFlags().StringVar(&a.server, "server", "", "ingestion endpoint host:port (env CATENA_SERVER; default "+client.DefaultAddr+")")
	root.PersistentFlags().StringVar(&a.tls.ca, "tls-ca", "", "connect with TLS, trusting this PEM CA bundle (env CATENA_TLS_CA; empty with --tls-cert: the system's roots)")
	root.PersistentFlags().StringVar(&a.tls.cert, "tls-cert", "", "PEM client certificate for mutual TLS, with --tls-key (env CATENA_TLS_CERT)")
	root.PersistentFlags().StringVar(&a.tls.key, "tls-key", "", "PEM key of --tls-cert (env CATENA_TLS_KEY)")
	root.PersistentFlags().StringVar(&a.profile, "profile", "", "take unset connection flags from this profile (env CATENA_PROFILE; default: the current one)")
	_ = root.RegisterFlagCompletionFunc("profile", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return completeProfiles(cmd, nil, toComplete)
	})
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	root.AddCommand(
		newProduceCommand(a),
		newConsumeCommand(a),
		newDescribeCommand(a),
		newStreamCommand(a),
		newConsumersCommand(a),
		newGroupCommand(a),
		newAggCommand(a),
		newBenchCommand(a),
		newCheckCommand(a),
		newVersionCommand(a),
		newProfileCommand(a),
	)
	var withStreams func(*cobra.Command)
	withStreams = func(c *cobra.Command) {
		if c.Flags().Lookup("stream") != nil {
			_ = c.RegisterFlagCompletionFunc("stream", a.completeStreams)
		}
		for _, sub := range c.Commands() {
			withStreams(sub)
		}
	}
	withStreams(root)
	return root
}

// completeStreams completes --stream with the streams the server lists
// (the connection as the command would make it: flags, environment,
// profile).
func (a *app) completeStreams(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if err := a.resolveConnection(cmd.Flags()); err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	// A shell waits for this at every TAB: an endpoint that does not
	// answer within a second completes nothing.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := a.dial(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	defer c.Close()
	names, err := c.ListStreams(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	out := names[:0]
	for _, n := range names {
		if strings.HasPrefix(n, toComplete) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// runE marks errors of a command body as failures (exit 1) unless they
// already carry a code.
func runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error { return failure(f(cmd, args)) }
}

func (a *app) dial(ctx context.Context) (*client.Client, error) {
	if strings.TrimSpace(a.server) == "" {
		return nil, usageErrorf("--server is empty")
	}
	opts := []client.Option{client.WithUserAgent("catenactl/" + version)}
	if a.tls.enabled() {
		cfg, err := a.tls.config()
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	c, err := client.Dial(ctx, a.server, opts...)
	if err != nil {
		return nil, failure(err)
	}
	return c, nil
}

// jsonWriter writes one JSON object per line, buffered.
type jsonWriter struct {
	w   *bufio.Writer
	enc *json.Encoder
}

func newJSONWriter(w io.Writer) *jsonWriter {
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	return &jsonWriter{w: bw, enc: enc}
}

func (j *jsonWriter) write(v any) error { return j.enc.Encode(v) }
func (j *jsonWriter) flush() error      { return j.w.Flush() }

// textField renders bytes as a string; when they are not valid UTF-8 the
// string is lossy and the base64 form is returned too.
func textField(b []byte) (s string, b64 string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), base64.StdEncoding.EncodeToString(b)
}

func requireStream(s string) error {
	if strings.TrimSpace(s) == "" {
		return usageErrorf("missing --stream")
	}
	return nil
}
