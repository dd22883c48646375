package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs is a throwaway certificate authority with a server certificate
// for 127.0.0.1 and localhost and a client certificate, as PEM files in a
// test's temporary directory.
type Certs struct {
	Dir string
	// CAFile is the CA certificate.
	CAFile string
	// ServerCertFile and ServerKeyFile are the server's certificate and
	// key; Server is a TLS config that serves them and, when the client
	// presents one, requires a client certificate signed by the CA.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate signed by
	// the CA and its key.
	ClientCertFile, ClientKeyFile string
	// OtherCAFile is a second CA that signed nothing here: a client
	// trusting only it must refuse the server.
	OtherCAFile string

	caPool *x509.CertPool
	server tls.Certificate
}

// NewCerts makes a CA, a server and a client certificate in a temporary
// directory of the test.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	dir := t.TempDir()
	c := &Certs{Dir: dir}
	caCert, caKey := newCA(t, "meterline test CA")
	c.CAFile = writePEM(t, dir, "ca.pem", "CERTIFICATE", caCert.Raw)
	other, _ := newCA(t, "another CA")
	c.OtherCAFile = writePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)
	c.caPool = x509.NewCertPool()
	c.caPool.AddCert(caCert)

	srvDER, srvKey := newLeaf(t, caCert, caKey, "localhost", x509.ExtKeyUsageServerAuth)
	c.ServerCertFile = writePEM(t, dir, "server.pem", "CERTIFICATE", srvDER)
	c.ServerKeyFile = writeKey(t, dir, "server-key.pem", srvKey)
	cliDER, cliKey := newLeaf(t, caCert, caKey, "meterline-client", x509.ExtKeyUsageClientAuth)
	c.ClientCertFile = writePEM(t, dir, "client.pem", "CERTIFICATE", cliDER)
	c.ClientKeyFile = writeKey(t, dir, "client-key.pem", cliKey)
	var err error
	c.server, err = tls.LoadX509KeyPair(c.ServerCertFile, c.ServerKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ServerTLS returns a server TLS config with the server certificate. With
// requireClient, a client must present a certificate signed by the CA.
func (c *Certs) ServerTLS(requireClient bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{c.server}, MinVersion: tls.VersionTLS12}
	if requireClient {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = c.caPool
	}
	return cfg
}

func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func newLeaf(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func writeKey(t testing.TB, dir, name string, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name, "PRIVATE KEY", der)
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
