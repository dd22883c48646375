package cli

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/tlsconfig"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/sink"
)

// Environment variables that hold secrets. They have no flag: a value on
// the command line is visible to every user of the machine (ps,
// /proc/<pid>/cmdline) and lands in shell histories, so a secret comes
// from a file (the *-password-file flags) or from one of these
// (docs/operations.md, Secrets).
const (
	EnvKafkaSASLPassword  = "METERLINE_KAFKA_SASL_PASSWORD"
	EnvClickHousePassword = "METERLINE_CLICKHOUSE_PASSWORD"
)

// TLSFlags are the TLS flags of one connection (--kafka-tls-*,
// --clickhouse-tls-*).
type TLSFlags struct {
	Enabled    bool   `name:"tls" help:"Connect over TLS (implied by any other TLS flag of this connection)."`
	CAFile     string `name:"tls-ca-file" help:"PEM file of the CA certificates the server's certificate must chain to (default: the system's)." placeholder:"FILE"`
	CertFile   string `name:"tls-cert-file" help:"PEM client certificate, for a server that asks for one." placeholder:"FILE"`
	KeyFile    string `name:"tls-key-file" help:"PEM private key of the client certificate (unencrypted; keep the file private)." placeholder:"FILE" secretfile:""`
	ServerName string `name:"tls-server-name" help:"Name the server's certificate must carry (default: the host dialled)." placeholder:"NAME"`
}

func (f TLSFlags) files() tlsconfig.Files {
	return tlsconfig.Files{Enabled: f.Enabled, CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile, ServerName: f.ServerName}
}

// KafkaFlags secure the Kafka connection of the commands that read the
// Kafka flags (kafkaFlags): --kafka-*.
type KafkaFlags struct {
	SASLMechanism    string   `name:"sasl-mechanism" help:"SASL mechanism: SCRAM-SHA-512 or PLAIN (PLAIN only with TLS); empty: no SASL." enum:",SCRAM-SHA-512,PLAIN" default:""`
	SASLUser         string   `name:"sasl-user" help:"SASL user name (the principal User:<name> in ACLs)." placeholder:"NAME"`
	SASLPasswordFile string   `name:"sasl-password-file" help:"File holding the SASL password; or set METERLINE_KAFKA_SASL_PASSWORD. There is no flag for the password itself." placeholder:"FILE" secretfile:""`
	TLS              TLSFlags `embed:""`
}

// ClickHouseFlags secure the ClickHouse connection: --clickhouse-*.
type ClickHouseFlags struct {
	User         string   `help:"ClickHouse user." default:"default"`
	PasswordFile string   `help:"File holding the ClickHouse password; or set METERLINE_CLICKHOUSE_PASSWORD. There is no flag for the password itself." placeholder:"FILE" secretfile:""`
	TLS          TLSFlags `embed:""`
}

// kafka returns the Kafka connection the flags describe, its password
// read from --kafka-sasl-password-file or METERLINE_KAFKA_SASL_PASSWORD
// (once: later calls return the same), its TLS files read and checked.
// Errors are configuration errors (exit status 2).
func (g *Globals) kafka() (kafka.Config, error) {
	if err := g.checkReadsKafka(); err != nil {
		return kafka.Config{}, err
	}
	if g.kafkaConn != nil {
		return *g.kafkaConn, nil
	}
	pw, err := secret.Load(g.Kafka.SASLPasswordFile, "--kafka-sasl-password-file", EnvKafkaSASLPassword, nil)
	if err != nil {
		return kafka.Config{}, &ExitError{Code: 2, Err: err}
	}
	c := kafka.Config{
		Brokers: g.Brokers,
		SASL:    kafka.SASL{Mechanism: g.Kafka.SASLMechanism, User: g.Kafka.SASLUser, Password: pw},
		TLS:     g.Kafka.TLS.files(),
	}
	if c.SASL.Mechanism != "" {
		// Every client of the command learns of a login refused while
		// it runs; a stage stops on it (runStageWith).
		c.Watch = kafka.NewLoginWatch()
	}
	if err := c.Validate(); err != nil {
		return kafka.Config{}, &ExitError{Code: 2, Err: err}
	}
	// The TLS files are read here, as every connection will read them:
	// --validate then finds a missing CA file or a key that is not its
	// certificate's.
	if _, err := c.TLS.Load(); err != nil {
		return kafka.Config{}, &ExitError{Code: 2, Err: fmt.Errorf("kafka: %w", err)}
	}
	g.kafkaConn = &c
	return c, nil
}

// principal names the principal the Kafka flags authenticate as, for an
// error naming an ACL it lacks (kafka.Config.Principal).
func (g *Globals) principal() string {
	return kafka.Config{SASL: kafka.SASL{User: g.Kafka.SASLUser}}.Principal()
}

// connectKafka is kafka followed by a check that the cluster accepts the
// credentials: a wrong password, an untrusted certificate or a listener
// that does not match ends the command before it reads or writes
// anything (exit status 1), instead of a client retrying for ever.
// Brokers it cannot reach, or that close the connection of a client
// without SASL outside a TLS handshake (as a broker restarting does),
// pass: the command's own requests wait for them or fail, and a sink or
// an ingest started then waits in its clients (kafka.CheckCredentials).
func (g *Globals) connectKafka(ctx context.Context) (kafka.Config, error) {
	c, err := g.kafka()
	if err != nil {
		return c, err
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := kafka.CheckCredentials(cctx, c); err != nil {
		return c, &ExitError{Code: 1, Err: err}
	}
	return c, nil
}

// awaitKafka waits until a broker answers, logging while none does, and
// checks the credentials on the same connection (kafka.AwaitCluster): a
// stage started during an outage of the whole cluster, or while its
// seeds close every connection without SASL (brokers restarting, a proxy
// before brokers that are down), waits for it (docs/operations.md,
// Outages), and one whose password, certificate or
// listener the brokers refuse ends before it reads or writes anything,
// as connectKafka ends a command (exit status 1). It reports false, with
// no error, when ctx ends first (the process was stopped: a clean exit).
func (g *Globals) awaitKafka(ctx context.Context, log *zap.Logger) (bool, error) {
	c, err := g.kafka()
	if err != nil {
		return false, err
	}
	err = kafka.AwaitCluster(ctx, c, func(err error) {
		log.Warn("no broker answers; waiting for the cluster", zap.Strings("brokers", c.Brokers), zap.Error(err))
	})
	switch {
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, nil
	}
	return false, &ExitError{Code: 1, Err: err}
}

// clickHouse returns the ClickHouse server the flags describe, its
// password read from --clickhouse-password-file or
// METERLINE_CLICKHOUSE_PASSWORD (once: later calls return the same), its
// TLS files read and checked. Errors are configuration errors (exit
// status 2).
func (g *Globals) clickHouse() (sink.Server, error) {
	if err := g.checkReadsClickHouse(); err != nil {
		return sink.Server{}, err
	}
	if g.chServer != nil {
		return *g.chServer, nil
	}
	pw, err := secret.Load(g.ClickHouseAuth.PasswordFile, "--clickhouse-password-file", EnvClickHousePassword, nil)
	if err != nil {
		return sink.Server{}, &ExitError{Code: 2, Err: err}
	}
	s := sink.Server{Addr: g.ClickHouse, User: g.ClickHouseAuth.User, Password: pw, TLS: g.ClickHouseAuth.TLS.files()}
	if err := s.Validate(); err != nil {
		return sink.Server{}, &ExitError{Code: 2, Err: err}
	}
	if _, err := s.TLS.Load(); err != nil { // as for Kafka
		return sink.Server{}, &ExitError{Code: 2, Err: fmt.Errorf("clickhouse: %w", err)}
	}
	g.chServer = &s
	return s, nil
}

// checkClickHouse stops the command (exit status 1) when ClickHouse
// refuses the user or password or the TLS handshake fails. An unreachable
// server passes: the sink waits for it.
func checkClickHouse(ctx context.Context, s sink.Server) error {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := s.CheckLogin(cctx); err != nil {
		return &ExitError{Code: 1, Err: err}
	}
	return nil
}

// producerConn returns the producer options that connect as kc says.
func producerConn(kc kafka.Config) ([]producer.Option, error) {
	tc, err := kc.TLS.Load()
	if err != nil {
		return nil, &ExitError{Code: 2, Err: fmt.Errorf("kafka: %w", err)}
	}
	return []producer.Option{producer.WithBrokers(kc.Brokers...), producer.WithTLS(tc), producer.WithSASL(kc.Mechanism())}, nil
}

// newProducer is producer.New connected as kc says, with opts.
func newProducer(kc kafka.Config, opts ...producer.Option) (*producer.Producer, error) {
	conn, err := producerConn(kc)
	if err != nil {
		return nil, err
	}
	return producer.New(append(conn, opts...)...)
}
