// Package tlsconfig turns the TLS settings of a connection — a CA file, a
// client certificate and key, a server name — into a *tls.Config. Kafka
// and ClickHouse connections take the same settings.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Files are the TLS settings of one connection. The zero value is TLS
// off. Any field set turns TLS on; Enabled turns it on with none set
// (the system's CAs, no client certificate).
type Files struct {
	// Enabled turns TLS on. Default: off, unless another field is set.
	Enabled bool
	// CAFile is a PEM file of the CA certificates that the server's
	// certificate must chain to. Default: the system's CAs.
	CAFile string
	// CertFile and KeyFile are the PEM client certificate (with its
	// chain) and its unencrypted private key, for a server that asks for
	// one. Both or neither. Default: none.
	CertFile, KeyFile string
	// ServerName is the name the server's certificate must carry.
	// Default: the host of the address dialled.
	ServerName string
}

// On reports whether TLS is on.
func (f Files) On() bool {
	return f.Enabled || f.CAFile != "" || f.CertFile != "" || f.KeyFile != "" || f.ServerName != ""
}

// Validate reports every inconsistency, each prefixed with field, the
// settings' name in errors ("kafka TLS").
func (f Files) Validate(field string) error {
	if (f.CertFile == "") != (f.KeyFile == "") {
		return fmt.Errorf("%s: a client certificate needs both the certificate and the key file (got cert %q, key %q)", field, f.CertFile, f.KeyFile)
	}
	return nil
}

// Load reads the files and returns the TLS config, or nil when TLS is
// off. The server's certificate is always verified: there is no setting
// to skip that. Minimum version TLS 1.2.
func (f Files) Load() (*tls.Config, error) {
	if !f.On() {
		return nil, nil
	}
	if err := f.Validate("tls"); err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: CA file %s holds no PEM certificate", f.CAFile)
		}
		c.RootCAs = pool
	}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			// The standard library's message names neither file and
			// never quotes key material.
			return nil, fmt.Errorf("tls: client certificate %s with key %s: %w", f.CertFile, f.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
