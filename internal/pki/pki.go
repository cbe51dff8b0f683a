// Package pki is the operator's own certificate authority: the CA it keeps
// in a Secret of its namespace, the certificates it issues to the pods it
// runs and to Stream users, and the decisions of when to issue again. The
// decisions are pure functions of the Secrets' contents and the time, so
// they are table-tested; the controllers only read and write Secrets.
//
// Keys are ECDSA P-256. A certificate is renewed when two thirds of its
// lifetime have passed. The CA is rotated in two steps, so that no peer
// ever meets a certificate its bundle cannot verify: first the next CA
// joins the trust bundle every Secret carries (ca.crt), and only after
// Rotation.Propagation (kubelet's Secret volume refresh, with margin) does
// it start signing. The previous CA stays in the bundle until it expires.
package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"time"
)

// Secret data keys. A leaf Secret has the keys of a kubernetes.io/tls
// Secret plus the bundle, as cert-manager writes them.
const (
	CertKey   = "tls.crt" // the certificate (a leaf's, or the signing CA's)
	KeyKey    = "tls.key"
	BundleKey = "ca.crt" // the CAs to trust, PEM, the signing CA first
	// The CA Secret's next CA, in the bundle but not yet signing, and the
	// time (RFC 3339) from which it signs.
	NextCertKey  = "next.crt"
	NextKeyKey   = "next.key"
	NextSignsKey = "next.signs"
)

// backdate is how far before its issue a certificate starts being valid,
// for peers whose clocks are a little behind.
const backdate = 5 * time.Minute

// Lifetimes are the operator's defaults.
const (
	DefaultCALifetime   = 5 * 365 * 24 * time.Hour
	DefaultLeafLifetime = 90 * 24 * time.Hour
	// DefaultPropagation is how long the next CA is trusted before it
	// signs: kubelet refreshes Secret volumes within about a minute and a
	// half, and clients outside the cluster that copied ca.crt need time
	// to fetch the new bundle (a rotation comes every three years or so).
	DefaultPropagation = 24 * time.Hour
)

// RenewAt is when a certificate valid from notBefore to notAfter is due
// for renewal: two thirds of the way.
func RenewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// CA is a loaded CA Secret: the CA that signs now, and the bundle that
// every certificate it issues is delivered with.
type CA struct {
	Cert   *x509.Certificate
	Key    *ecdsa.PrivateKey
	Bundle []byte
}

// ParseCA loads a CA Secret's data.
func ParseCA(data map[string][]byte) (*CA, error) {
	cert, key, err := parsePair(data[CertKey], data[KeyKey])
	if err != nil {
		return nil, fmt.Errorf("the CA Secret's %s and %s: %w", CertKey, KeyKey, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("the CA Secret's %s is not a CA certificate", CertKey)
	}
	bundle := data[BundleKey]
	if _, err := ParseBundle(bundle); err != nil {
		return nil, fmt.Errorf("the CA Secret's %s: %w", BundleKey, err)
	}
	return &CA{Cert: cert, Key: key, Bundle: bundle}, nil
}

// Rotation sets the CA's lifetime and rotation.
type Rotation struct {
	Lifetime    time.Duration
	Propagation time.Duration
}

// PlanCA returns the CA Secret's data as it should be at now, given what it
// holds (nil or empty: no CA yet), and whether that differs. It creates a
// CA; at two thirds of the signing CA's life it adds the next CA to the
// bundle; the next CA signs once the propagation time has passed both
// since it was added and since trustedSince, when the caller first handed
// the bundle holding it to every certificate it issued (zero: not yet; an
// operator that was down while the clock ran must hand it out again before
// the switch); CAs that expired leave the bundle. wake is when the plan
// should be made again.
func PlanCA(data map[string][]byte, name string, now, trustedSince time.Time, r Rotation) (out map[string][]byte, changed bool, wake time.Time, err error) {
	if len(data) == 0 {
		certPEM, keyPEM, err := newCA(name, now, r.Lifetime)
		if err != nil {
			return nil, false, time.Time{}, err
		}
		out = map[string][]byte{CertKey: certPEM, KeyKey: keyPEM, BundleKey: certPEM}
		cert, _ := parseCert(certPEM)
		return out, true, RenewAt(cert), nil
	}
	ca, err := ParseCA(data)
	if err != nil {
		// Never replace a CA that does not load: every certificate in
		// the cluster chains to it. A person must look.
		return nil, false, time.Time{}, err
	}
	out = map[string][]byte{CertKey: data[CertKey], KeyKey: data[KeyKey]}
	next, nextSigns := data[NextCertKey], data[NextSignsKey]
	switch {
	case len(next) > 0:
		signs, err := time.Parse(time.RFC3339, string(nextSigns))
		if err != nil {
			return nil, false, time.Time{}, fmt.Errorf("the CA Secret's %s: %w", NextSignsKey, err)
		}
		if !trustedSince.IsZero() && trustedSince.Add(r.Propagation).After(signs) {
			signs = trustedSince.Add(r.Propagation)
		}
		if trustedSince.IsZero() {
			signs = later(signs, now.Add(r.Propagation))
		}
		if !now.Before(signs) {
			// The next CA has been trusted everywhere long enough.
			if _, _, err := parsePair(next, data[NextKeyKey]); err != nil {
				return nil, false, time.Time{}, fmt.Errorf("the CA Secret's next CA: %w", err)
			}
			out[CertKey], out[KeyKey] = next, data[NextKeyKey]
			cert, _ := parseCert(next)
			wake = RenewAt(cert)
		} else {
			out[NextCertKey], out[NextKeyKey], out[NextSignsKey] = next, data[NextKeyKey], nextSigns
			wake = signs
		}
	case !now.Before(RenewAt(ca.Cert)):
		certPEM, keyPEM, err := newCA(name, now, r.Lifetime)
		if err != nil {
			return nil, false, time.Time{}, err
		}
		wake = now.Add(r.Propagation)
		out[NextCertKey], out[NextKeyKey], out[NextSignsKey] = certPEM, keyPEM, []byte(wake.UTC().Format(time.RFC3339))
	default:
		wake = RenewAt(ca.Cert)
	}
	// The bundle: the signing CA, the next one, then the earlier ones
	// still valid.
	bundle, err := ParseBundle(data[BundleKey])
	if err != nil {
		return nil, false, time.Time{}, err
	}
	var b bytes.Buffer
	seen := map[string]bool{}
	add := func(pemCert []byte) {
		c, err := parseCert(pemCert)
		if err != nil || seen[string(c.Raw)] || !now.Before(c.NotAfter) {
			return
		}
		seen[string(c.Raw)] = true
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		if c.NotAfter.Before(wake) {
			wake = c.NotAfter // drop it from the bundle then
		}
	}
	add(out[CertKey])
	add(out[NextCertKey])
	for _, c := range bundle {
		add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	out[BundleKey] = b.Bytes()
	return out, !equalData(data, out), wake, nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Leaf is what a certificate the operator issues says.
type Leaf struct {
	// Identity is the URI subject alternative name
	// (spiffe://catena/ns/<namespace>/<role>/<name>); the subject's
	// common name is its last path element.
	Identity string
	// DNSNames and IPs are the names servers are reached at.
	DNSNames []string
	IPs      []net.IP
	Lifetime time.Duration
}

// Issue signs a new key's certificate for l, valid from now.
func (ca *CA) Issue(l Leaf, now time.Time) (certPEM, keyPEM []byte, err error) {
	u, err := url.Parse(l.Identity)
	if err != nil || u.Scheme == "" {
		return nil, nil, fmt.Errorf("identity %q is not a URI", l.Identity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to generate a key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: lastElement(u), Organization: []string{"catena"}},
		URIs:         []*url.URL{u},
		DNSNames:     l.DNSNames,
		IPAddresses:  l.IPs,
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(l.Lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Every Catena process is both a server and a client of its
		// peers.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to sign a certificate for %s: %w", l.Identity, err)
	}
	return encodePair(der, key)
}

// LeafAction is what a leaf Secret needs.
type LeafAction int

const (
	LeafKeep LeafAction = iota
	// LeafBundle: the certificate is good; only the bundle changed.
	LeafBundle
	// LeafIssue: a new key and certificate.
	LeafIssue
)

// PlanLeaf decides what a leaf Secret holding data needs for l, with ca
// signing at now, and why; wake is when to look again when nothing else
// changes.
func PlanLeaf(data map[string][]byte, l Leaf, ca *CA, now time.Time) (action LeafAction, reason string, wake time.Time) {
	cert, _, err := parsePair(data[CertKey], data[KeyKey])
	switch {
	case len(data[CertKey]) == 0:
		return LeafIssue, "no certificate yet", time.Time{}
	case err != nil:
		return LeafIssue, fmt.Sprintf("the certificate does not load: %v", err), time.Time{}
	case len(cert.URIs) != 1 || cert.URIs[0].String() != l.Identity:
		return LeafIssue, "the identity changed", time.Time{}
	case !slices.Equal(sorted(cert.DNSNames), sorted(l.DNSNames)) || !equalIPs(cert.IPAddresses, l.IPs):
		return LeafIssue, "the names it serves changed", time.Time{}
	case cert.CheckSignatureFrom(ca.Cert) != nil:
		return LeafIssue, "it was signed by another CA", time.Time{}
	case !now.Before(RenewAt(cert)):
		return LeafIssue, "two thirds of its lifetime have passed", time.Time{}
	case !bytes.Equal(data[BundleKey], ca.Bundle):
		return LeafBundle, "the CA bundle changed", RenewAt(cert)
	}
	return LeafKeep, "", RenewAt(cert)
}

// LeafData is a leaf Secret's data for a certificate and key from ca.
func LeafData(certPEM, keyPEM []byte, ca *CA) map[string][]byte {
	return map[string][]byte{CertKey: certPEM, KeyKey: keyPEM, BundleKey: ca.Bundle}
}

// ParseBundle parses a PEM bundle of certificates; an empty one is an
// error.
func ParseBundle(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("a certificate in the bundle does not parse: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("the bundle holds no certificate")
	}
	return out, nil
}

func newCA(name string, now time.Time, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to generate the CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s %s", name, now.UTC().Format("2006-01-02T15:04:05Z")), Organization: []string{"catena"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to sign the CA certificate: %w", err)
	}
	return encodePair(der, key)
}

func encodePair(der []byte, key *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	k, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to encode a key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: k}), nil
}

func parseCert(certPEM []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(certPEM)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// parsePair parses a certificate and its EC key, and checks they match.
func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, nil, err
	}
	blk, _ := pem.Decode(keyPEM)
	if blk == nil {
		return nil, nil, errors.New("no PEM key")
	}
	key, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, nil, errors.New("the key does not match the certificate")
	}
	return cert, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func lastElement(u *url.URL) string {
	p := u.Path
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return u.String()
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func equalIPs(a, b []net.IP) bool {
	key := func(ips []net.IP) []string {
		var out []string
		for _, ip := range ips {
			out = append(out, ip.String())
		}
		return sorted(out)
	}
	return slices.Equal(key(a), key(b))
}

func equalData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
