// Package transporttest issues certificates for tests of Catena's mutual
// TLS: a CA, and leaf certificates naming an identity (a URI) that are
// valid for loopback as a server and as a client.
package transporttest

import (
	"github.com/catena-streams/catena/rpc/transport"
	"github.com/catena-streams/catena/rpc/transport/internal/certgen"
)

// CA is a certificate authority for one test.
type CA struct {
	*certgen.CA
}

// NewCA makes a self-signed CA named name.
func NewCA(name string) (*CA, error) {
	ca, err := certgen.NewCA(name)
	if err != nil {
		return nil, err
	}
	return &CA{CA: ca}, nil
}

// WriteFiles issues a certificate for identity and writes it, its key and
// bundle (the CA bundle peers must chain to) under dir, named after name.
func (ca *CA) WriteFiles(dir, name, identity string, bundle []byte) (transport.TLSFiles, error) {
	cert, key, caFile, err := ca.CA.WriteFiles(dir, name, identity, bundle)
	if err != nil {
		return transport.TLSFiles{}, err
	}
	return transport.TLSFiles{CertFile: cert, KeyFile: key, ClientCAFile: caFile}, nil
}
