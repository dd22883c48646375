package tlsconfig_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/tlsconfig"
)

// handshake dials a TLS server that requires a client certificate signed
// by certs' CA, with the client config f loads, and returns the result.
func handshake(t *testing.T, certs *testenv.Certs, f tlsconfig.Files) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", certs.ServerTLS(true))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			_, _ = c.Write([]byte("x"))
			c.Close()
		}
	}()
	cfg, err := f.Load()
	if err != nil {
		return err
	}
	c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	// TLS 1.3: a refused client certificate shows on the first read.
	_, err = c.Read(make([]byte, 1))
	return err
}

func TestLoad(t *testing.T) {
	certs := testenv.NewCerts(t)
	full := tlsconfig.Files{CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}
	if err := handshake(t, certs, full); err != nil {
		t.Fatalf("CA and client certificate: %v", err)
	}
	for name, f := range map[string]tlsconfig.Files{
		"no client certificate": {CAFile: certs.CAFile},
		"another CA":            {CAFile: certs.OtherCAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile},
		"another server name":   {CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile, ServerName: "example.com"},
		"system CAs only":       {Enabled: true, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile},
	} {
		if err := handshake(t, certs, f); err == nil {
			t.Errorf("%s: the handshake succeeded", name)
		}
	}

	if cfg, err := (tlsconfig.Files{}).Load(); cfg != nil || err != nil {
		t.Errorf("zero Files: %v, %v; want TLS off", cfg, err)
	}
	if !(tlsconfig.Files{ServerName: "x"}).On() || (tlsconfig.Files{}).On() {
		t.Error("On: any field turns TLS on, none leaves it off")
	}
	if err := (tlsconfig.Files{CertFile: "c.pem"}).Validate("kafka tls"); err == nil || !strings.HasPrefix(err.Error(), "kafka tls:") {
		t.Errorf("certificate without key: %v", err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (tlsconfig.Files{CAFile: notPEM}).Load(); err == nil || !strings.Contains(err.Error(), notPEM) {
		t.Errorf("CA file without PEM: %v", err)
	}
	if _, err := (tlsconfig.Files{CertFile: certs.ClientCertFile, KeyFile: certs.ServerKeyFile}).Load(); err == nil ||
		!strings.Contains(err.Error(), certs.ClientCertFile) {
		t.Errorf("mismatched key: %v", err)
	}
}

// TestKeyGivenInPlaceOfItsFile: a PEM key set where its file's name
// belongs (METERLINE_KAFKA_TLS_KEY_FILE="$(cat client-key.pem)") is
// refused by Validate and Load with errors that never show the key.
func TestKeyGivenInPlaceOfItsFile(t *testing.T) {
	certs := testenv.NewCerts(t)
	pem, err := os.ReadFile(certs.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	key := string(pem)
	body := strings.Split(key, "\n")[1] // a line of the key's base64
	for name, f := range map[string]tlsconfig.Files{
		"key without certificate":              {KeyFile: key},
		"key as certificate":                   {CertFile: key},
		"key in place of its file":             {CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: key},
		"key in place of the certificate file": {CAFile: certs.CAFile, CertFile: key, KeyFile: certs.ClientKeyFile},
	} {
		if err := f.Validate("kafka: tls"); err != nil && strings.Contains(err.Error(), body) {
			t.Errorf("%s: Validate shows the key: %v", name, err)
		}
		if _, err := f.Load(); err == nil || strings.Contains(err.Error(), body) {
			t.Errorf("%s: Load: %v; want an error that does not show the key", name, err)
		}
	}
}
