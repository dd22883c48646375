package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/tlsconfig"
)

// Environment variables naming the secured real services (`make test`
// starts them beside the plain ones, on other ports).
const (
	// EnvKafkaSASL is the SASL_SSL listener of a broker started with
	// KAFKA_SECURITY=sasl_ssl deploy/local/kafka.sh start: SCRAM-SHA-512
	// and PLAIN, a client certificate required, ACLs on.
	EnvKafkaSASL = "METERLINE_TEST_KAFKA_SASL"
	// EnvKafkaSASLDir is that broker's credentials directory (kafka.sh
	// credentials): ca.pem, client.pem, client-key.pem, passwords/<user>.
	EnvKafkaSASLDir = "METERLINE_TEST_KAFKA_SASL_DIR"
	// EnvClickHouseSecure is the native TLS port (tcp_port_secure) of a
	// ClickHouse started with CLICKHOUSE_TLS_PORT and
	// CLICKHOUSE_PASSWORD_FILE: user default needs the password, and TLS a
	// client certificate.
	EnvClickHouseSecure = "METERLINE_TEST_CLICKHOUSE_SECURE"
	// EnvClickHouseSecureDir holds its ca.pem, client.pem, client-key.pem.
	EnvClickHouseSecureDir = "METERLINE_TEST_CLICKHOUSE_SECURE_DIR"
	// EnvClickHouseSecurePasswordFile is the file holding user default's
	// password.
	EnvClickHouseSecurePasswordFile = "METERLINE_TEST_CLICKHOUSE_SECURE_PASSWORD_FILE"
)

// SecuredKafka is the real SASL_SSL broker.
type SecuredKafka struct {
	Brokers []string
	Dir     string
}

// RealKafkaSASL returns the secured broker, or skips the test, saying so
// plainly, when its variables are not set. With -short it always skips.
func RealKafkaSASL(t testing.TB) SecuredKafka {
	t.Helper()
	addr, dir := os.Getenv(EnvKafkaSASL), os.Getenv(EnvKafkaSASLDir)
	if addr == "" || dir == "" || testing.Short() {
		t.Skipf("SKIP: real secured Kafka integration test; set %s=host:port and %s=<kafka.sh credentials> (make test does) and drop -short",
			EnvKafkaSASL, EnvKafkaSASLDir)
	}
	return SecuredKafka{Brokers: strings.Split(addr, ","), Dir: dir}
}

// PasswordFile is the file holding user's password: kafka.sh makes one
// for admin and each user of KAFKA_SASL_USERS.
func (k SecuredKafka) PasswordFile(user string) string {
	return filepath.Join(k.Dir, "passwords", user)
}

// Password is user's password.
func (k SecuredKafka) Password(t testing.TB, user string) string {
	t.Helper()
	b, err := os.ReadFile(k.PasswordFile(user))
	if err != nil {
		t.Fatalf("password of %s: %v", user, err)
	}
	return strings.TrimSpace(string(b))
}

// TLS is the client side of the broker's TLS: its CA and the client
// certificate it requires.
func (k SecuredKafka) TLS() tlsconfig.Files {
	return tlsconfig.Files{CAFile: filepath.Join(k.Dir, "ca.pem"),
		CertFile: filepath.Join(k.Dir, "client.pem"), KeyFile: filepath.Join(k.Dir, "client-key.pem")}
}

// Config is the connection as user with mechanism (kafka.ScramSHA512 or
// kafka.Plain).
func (k SecuredKafka) Config(t testing.TB, user, mechanism string) kafka.Config {
	return kafka.Config{Brokers: k.Brokers, TLS: k.TLS(),
		SASL: kafka.SASL{Mechanism: mechanism, User: user, Password: secret.New(k.Password(t, user))}}
}

// Admin is an admin client as the super user admin, closed when the test
// ends.
func (k SecuredKafka) Admin(t testing.TB) *kadm.Client {
	t.Helper()
	cl, err := kafka.NewClient(k.Config(t, "admin", kafka.ScramSHA512))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// Flags are the meterline flags that connect as user with mechanism, the
// password named by its file.
func (k SecuredKafka) Flags(user, mechanism string) []string {
	f := k.TLS()
	return []string{"--brokers", strings.Join(k.Brokers, ","),
		"--kafka-sasl-mechanism", mechanism, "--kafka-sasl-user", user, "--kafka-sasl-password-file", k.PasswordFile(user),
		"--kafka-tls-ca-file", f.CAFile, "--kafka-tls-cert-file", f.CertFile, "--kafka-tls-key-file", f.KeyFile}
}

// SecuredClickHouse is the real ClickHouse with a password and native TLS.
type SecuredClickHouse struct {
	Addr         string // the TLS port
	Dir          string
	PasswordFile string
}

// RealClickHouseSecure returns the secured ClickHouse, or skips the test
// when its variables are not set. With -short it always skips.
func RealClickHouseSecure(t testing.TB) SecuredClickHouse {
	t.Helper()
	c := SecuredClickHouse{Addr: os.Getenv(EnvClickHouseSecure), Dir: os.Getenv(EnvClickHouseSecureDir),
		PasswordFile: os.Getenv(EnvClickHouseSecurePasswordFile)}
	if c.Addr == "" || c.Dir == "" || c.PasswordFile == "" || testing.Short() {
		t.Skipf("SKIP: real secured ClickHouse integration test; set %s, %s and %s (make test does) and drop -short",
			EnvClickHouseSecure, EnvClickHouseSecureDir, EnvClickHouseSecurePasswordFile)
	}
	return c
}

// Password is user default's password.
func (c SecuredClickHouse) Password(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(c.PasswordFile)
	if err != nil {
		t.Fatalf("clickhouse password: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// TLS is the client side of its TLS port.
func (c SecuredClickHouse) TLS() tlsconfig.Files {
	return tlsconfig.Files{CAFile: filepath.Join(c.Dir, "ca.pem"),
		CertFile: filepath.Join(c.Dir, "client.pem"), KeyFile: filepath.Join(c.Dir, "client-key.pem")}
}

// Flags are the meterline flags that connect to it.
func (c SecuredClickHouse) Flags() []string {
	f := c.TLS()
	return []string{"--clickhouse", c.Addr, "--clickhouse-password-file", c.PasswordFile,
		"--clickhouse-tls-ca-file", f.CAFile, "--clickhouse-tls-cert-file", f.CertFile, "--clickhouse-tls-key-file", f.KeyFile}
}

// DB creates a throwaway database on it for the test and returns a
// connection whose default database it is; dropped when the test passes.
func (c SecuredClickHouse) DB(t testing.TB) (driver.Conn, string) {
	t.Helper()
	db := fmt.Sprintf("t%d_%d_%d", os.Getpid(), seq.Add(1), time.Now().UnixNano()%1e6)
	admin := c.dial(t, "default")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatalf("clickhouse: create database %s: %v", db, err)
	}
	conn := c.dial(t, db)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("clickhouse: kept database %s for inspection", db)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := admin.Exec(ctx, "DROP DATABASE "+db); err != nil {
			t.Errorf("clickhouse: drop database %s: %v", db, err)
		}
	})
	return conn, db
}

func (c SecuredClickHouse) dial(t testing.TB, db string) driver.Conn {
	t.Helper()
	tc, err := c.TLS().Load()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{c.Addr},
		Auth:        clickhouse.Auth{Database: db, Username: "default", Password: c.Password(t)},
		TLS:         tc,
		DialTimeout: 5 * time.Second,
		ReadTimeout: 60 * time.Second,
	})
	if err != nil {
		t.Fatalf("clickhouse: open %s: %v", c.Addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.Ping(ctx); err != nil {
		t.Fatalf("clickhouse: ping %s: %v", c.Addr, err)
	}
	return conn
}
