// Package tlsconfig turns the TLS settings of a connection — a CA file, a
// client certificate and key, a server name — into a *tls.Config. Kafka
// and ClickHouse connections take the same settings.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"

	"github.com/meterline/meterline/internal/secret"
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
	// The error names the one given by its role, never its value: a key
	// pasted where its file's name belongs would be shown.
	if f.CertFile == "" && f.KeyFile != "" {
		return fmt.Errorf("%s: a client certificate needs both the certificate and the key file (got the key file, no certificate file)", field)
	}
	if f.CertFile != "" && f.KeyFile == "" {
		return fmt.Errorf("%s: a client certificate needs both the certificate and the key file (got the certificate file, no key file)", field)
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
	// secret.ReadFile names a file only when its name is one: a key (or
	// a certificate) set where its file's name belongs is not shown.
	if f.CAFile != "" {
		pem, err := secret.ReadFile(f.CAFile)
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
		cert, err := LoadKeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// LoadKeyPair is tls.LoadX509KeyPair (a client's certificate, or a
// server's: the HTTP ingest's) with errors that never show a key
// (or a certificate) set where the name of its file belongs: a file is
// named only when its name is one (secret.ReadFile).
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := secret.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls: certificate file: %w", err)
	}
	keyPEM, err := secret.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls: key file: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// Both files exist, so their names are names. The standard
		// library's message names neither and never quotes key material.
		return tls.Certificate{}, fmt.Errorf("tls: certificate %s with key %s: %w", certFile, keyFile, err)
	}
	return cert, nil
}
