package transport

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// TLSFiles names PEM files for mutual TLS. All empty means plaintext, which
// is meant for development on loopback only.
type TLSFiles struct {
	CertFile     string // this process's certificate (and its chain)
	KeyFile      string
	ClientCAFile string // CA bundle that peers' certificates must chain to
}

// Enabled reports whether any TLS file is set.
func (f TLSFiles) Enabled() bool {
	return f.CertFile != "" || f.KeyFile != "" || f.ClientCAFile != ""
}

// reloadCheckInterval is how often, at most, the files are looked at for a
// change: handshakes in between use what was read last.
const reloadCheckInterval = time.Second

// Config builds a tls.Config usable on both sides of a link: it presents the
// certificate, and requires and verifies the peer's against the CA bundle.
// The files are read again when they change (cert-manager and the
// operator's own CA rotate them in place, through a Secret volume), so a
// rotation needs no restart: connections made after it use the new
// certificate and trust the new bundle; those already up are kept. A
// change that does not load (a key that does not match, a half-written
// file) keeps the last good files, and is tried again at the next check.
func (f TLSFiles) Config() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if f.CertFile == "" || f.KeyFile == "" || f.ClientCAFile == "" {
		return nil, fmt.Errorf("tls needs a certificate, a key and a CA file together (got cert=%q key=%q ca=%q)", f.CertFile, f.KeyFile, f.ClientCAFile)
	}
	r := &reloader{files: f, now: time.Now}
	if err := r.load(); err != nil {
		return nil, err
	}
	return DynamicConfig(func() (*tls.Certificate, *x509.CertPool) {
		m := r.current()
		return m.cert, m.pool
	}), nil
}

// DynamicConfig builds the config Config does from a source asked at every
// handshake for this process's certificate and the CA pool to verify peers
// against (the operator's certificate lives in memory, issued from its own
// CA, not in files).
func DynamicConfig(current func() (*tls.Certificate, *x509.CertPool)) *tls.Config {
	// Server side: every handshake gets a config of the material as it
	// is now, and crypto/tls verifies the client against that pool.
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequireAndVerifyClientCert}
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cert, pool := current()
		return &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{*cert},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			NextProtos:   []string{"h2"},
		}, nil
	}
	// Client side (the same config dials: replicas and ingestion are
	// both): the certificate is asked for at each handshake, and the
	// server's chain is verified here against the pool as it is now
	// (crypto/tls would verify against RootCAs fixed at start), with the
	// usual host name check.
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		cert, _ := current()
		return cert, nil
	}
	cfg.InsecureSkipVerify = true // verified by VerifyConnection, below
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		_, pool := current()
		return verifyServer(cs, pool)
	}
	return cfg
}

// OptionalClientCerts returns cfg (from Config or DynamicConfig) for a
// server whose clients may come without a certificate: one presented is
// still verified against the pool, and names the caller's identity; the
// authorization policy decides what a caller without one may do. Client
// facing listeners (ingestion) use it.
func OptionalClientCerts(cfg *tls.Config) *tls.Config {
	return serverVariant(cfg, func(c *tls.Config) { c.ClientAuth = tls.VerifyClientCertIfGiven })
}

// serverVariant returns a copy of cfg whose per-handshake server config
// (GetConfigForClient) is changed by set too.
func serverVariant(cfg *tls.Config, set func(*tls.Config)) *tls.Config {
	if cfg == nil {
		return nil
	}
	out := cfg.Clone()
	set(out)
	inner := cfg.GetConfigForClient
	out.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := inner(hello)
		if err != nil || c == nil {
			return c, err
		}
		set(c)
		return c, nil
	}
	return out
}

// verifyServer verifies a server's certificate chain and name against
// roots, as crypto/tls would with RootCAs.
func verifyServer(cs tls.ConnectionState, roots *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the server presented no certificate")
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), DNSName: cs.ServerName}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return fmt.Errorf("tls: the server's certificate does not verify: %w", err)
	}
	return nil
}

// material is one consistent load of the files.
type material struct {
	cert *tls.Certificate
	pool *x509.CertPool
	// raw file contents, to tell a change from a touch.
	certPEM, keyPEM, caPEM []byte
}

// reloader keeps the files' latest good load.
type reloader struct {
	files TLSFiles
	now   func() time.Time

	mu      sync.Mutex
	m       *material
	checked time.Time
}

// current returns the material to use now, reloading first when the last
// check is older than reloadCheckInterval and the files changed.
func (r *reloader) current() *material {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.now(); now.Sub(r.checked) >= reloadCheckInterval {
		r.checked = now
		// A change that does not load is not used: the last good
		// files stay until the next check finds good ones.
		if m, err := r.read(); err == nil && m != nil {
			r.m = m
		}
	}
	return r.m
}

// load reads the files for the first time.
func (r *reloader) load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, err := r.read()
	if err != nil {
		return err
	}
	r.m, r.checked = m, r.now()
	return nil
}

// read loads the files; nil, nil when they are what is loaded already.
func (r *reloader) read() (*material, error) {
	f := r.files
	certPEM, err := os.ReadFile(f.CertFile)
	if err != nil {
		return nil, fmt.Errorf("failed to read tls certificate %s: %w", f.CertFile, err)
	}
	keyPEM, err := os.ReadFile(f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("failed to read tls key %s: %w", f.KeyFile, err)
	}
	caPEM, err := os.ReadFile(f.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("failed to read tls CA %s: %w", f.ClientCAFile, err)
	}
	if r.m != nil && bytes.Equal(certPEM, r.m.certPEM) && bytes.Equal(keyPEM, r.m.keyPEM) && bytes.Equal(caPEM, r.m.caPEM) {
		return nil, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("failed to load tls key pair %s, %s: %w", f.CertFile, f.KeyFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("tls CA file %s holds no PEM certificate", f.ClientCAFile)
	}
	return &material{cert: &cert, pool: pool, certPEM: certPEM, keyPEM: keyPEM, caPEM: caPEM}, nil
}

// MetricsServerName is a name every certificate the operator issues to a
// server carries, so that a scraper reaching pods by address (Prometheus)
// can verify them with one server name. .invalid never resolves (RFC
// 2606): no client dials it by accident.
const MetricsServerName = "metrics.catena.invalid"

// HTTPServerConfig returns cfg (from Config or DynamicConfig) for an HTTPS
// server: client certificates optional, HTTP/2 or HTTP/1.1.
func HTTPServerConfig(cfg *tls.Config) *tls.Config {
	return serverVariant(cfg, func(c *tls.Config) {
		c.ClientAuth = tls.VerifyClientCertIfGiven
		c.NextProtos = []string{"h2", "http/1.1"}
	})
}
