package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/tlsconfig"
)

const password = "s3cret-Pa55word"

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// listTopics makes a real request with the config: it must connect,
// authenticate and get an answer.
func listTopics(t *testing.T, cfg kafka.Config) error {
	t.Helper()
	cl, err := kafka.NewClient(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	_, err = kadm.NewClient(cl).ListTopics(ctx(t))
	return err
}

// TestSCRAM: a client with the right SCRAM-SHA-512 password is served;
// with a wrong one CheckCredentials fails with ErrAuthentication, naming
// the user and never the password.
func TestSCRAM(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser(kafka.ScramSHA512, "admin", password))
	good := kafka.Config{Brokers: brokers, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New(password)}}
	if err := kafka.CheckCredentials(ctx(t), good); err != nil {
		t.Fatalf("right password: %v", err)
	}
	if err := listTopics(t, good); err != nil {
		t.Fatalf("right password: list topics: %v", err)
	}

	bad := good
	bad.SASL.Password = secret.New("wrong-" + password)
	err := kafka.CheckCredentials(ctx(t), bad)
	if !errors.Is(err, kafka.ErrAuthentication) {
		t.Fatalf("wrong password: %v, want ErrAuthentication", err)
	}
	if !strings.Contains(err.Error(), `"admin"`) || strings.Contains(err.Error(), password) {
		t.Fatalf("error must name the user and not the password: %v", err)
	}

	none := kafka.Config{Brokers: brokers}
	if err := kafka.CheckCredentials(ctx(t), none); err == nil {
		// kfake closes an unauthenticated connection; a client without
		// SASL must not look healthy.
		if err := listTopics(t, none); err == nil {
			t.Fatal("a client without SASL was served by a SASL-only cluster")
		}
	}
}

// TestPlainOverTLS: PLAIN over TLS with a client certificate, against a
// broker that requires one signed by its CA. Without the client
// certificate, or trusting another CA, CheckCredentials fails with ErrTLS.
func TestPlainOverTLS(t *testing.T) {
	certs := testenv.NewCerts(t)
	_, brokers := testenv.KFake(t, kfake.TLS(certs.ServerTLS(true)), kfake.EnableSASL(),
		kfake.Superuser(kafka.Plain, "meterline", password))
	tlsFiles := tlsconfig.Files{CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}
	good := kafka.Config{Brokers: brokers, SASL: kafka.SASL{Mechanism: kafka.Plain, User: "meterline", Password: secret.New(password)}, TLS: tlsFiles}
	if err := kafka.CheckCredentials(ctx(t), good); err != nil {
		t.Fatalf("PLAIN over TLS: %v", err)
	}
	if err := listTopics(t, good); err != nil {
		t.Fatalf("PLAIN over TLS: list topics: %v", err)
	}

	for name, mutate := range map[string]func(*kafka.Config){
		"no client certificate": func(c *kafka.Config) { c.TLS.CertFile, c.TLS.KeyFile = "", "" },
		"another CA":            func(c *kafka.Config) { c.TLS.CAFile = certs.OtherCAFile },
		"wrong server name":     func(c *kafka.Config) { c.TLS.ServerName = "kafka.example.com" },
		"no TLS at all":         func(c *kafka.Config) { c.TLS = tlsconfig.Files{}; c.SASL.Mechanism = kafka.ScramSHA512 },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := good
			mutate(&cfg)
			err := kafka.CheckCredentials(ctx(t), cfg)
			if !errors.Is(err, kafka.ErrTLS) && !(name == "no TLS at all" && err != nil) {
				t.Fatalf("CheckCredentials = %v, want ErrTLS", err)
			}
		})
	}
	t.Run("wrong password", func(t *testing.T) {
		cfg := good
		cfg.SASL.Password = secret.New("nope")
		if err := kafka.CheckCredentials(ctx(t), cfg); !errors.Is(err, kafka.ErrAuthentication) {
			t.Fatalf("CheckCredentials = %v, want ErrAuthentication", err)
		}
	})
}

// TestCheckCredentialsUnreachable: a cluster that cannot be reached is
// not a credentials problem; the caller's requests handle it.
func TestCheckCredentialsUnreachable(t *testing.T) {
	cfg := kafka.Config{Brokers: []string{testenv.FreeAddr(t)},
		SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "u", Password: secret.New(password)}}
	if err := kafka.CheckCredentials(ctx(t), cfg); err != nil {
		t.Fatalf("unreachable broker: %v, want nil", err)
	}
}

// TestValidate reports every problem at once, each naming its setting.
func TestValidate(t *testing.T) {
	cases := []struct {
		cfg  kafka.Config
		want []string
	}{
		{kafka.Config{}, []string{"brokers"}},
		{kafka.Config{Brokers: []string{"a:1"}, SASL: kafka.SASL{Mechanism: "SCRAM-SHA-1"}}, []string{`"SCRAM-SHA-1" is not one of`}},
		{kafka.Config{Brokers: []string{"a:1"}, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512}}, []string{"sasl-user", "sasl-password"}},
		{kafka.Config{Brokers: []string{"a:1"}, SASL: kafka.SASL{User: "u"}}, []string{"no mechanism"}},
		{kafka.Config{Brokers: []string{"a:1"}, SASL: kafka.SASL{Mechanism: kafka.Plain, User: "u", Password: secret.New("p")}}, []string{"PLAIN", "needs TLS"}},
		{kafka.Config{Brokers: []string{"a:1"}, TLS: tlsconfig.Files{CertFile: "c.pem"}}, []string{"kafka: tls", "key"}},
		{kafka.Config{Brokers: []string{""}, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512}}, []string{"empty address", "sasl-user", "sasl-password"}},
	}
	for i, c := range cases {
		err := c.cfg.Validate()
		if err == nil {
			t.Errorf("case %d: no error, want %q", i, c.want)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("case %d: %v, want it to contain %q", i, err, w)
			}
		}
	}
	ok := kafka.Config{Brokers: []string{"a:1"}, SASL: kafka.SASL{Mechanism: kafka.Plain, User: "u", Password: secret.New("p")},
		TLS: tlsconfig.Files{Enabled: true}}
	if err := ok.Validate(); err != nil {
		t.Errorf("PLAIN over TLS: %v", err)
	}
}

// TestConfigNeverShowsPassword: the config printed by fmt, marshalled to
// JSON or logged by zap carries no password.
func TestConfigNeverShowsPassword(t *testing.T) {
	cfg := kafka.Config{Brokers: []string{"a:1"}, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "u", Password: secret.New(password)},
		TLS: tlsconfig.Files{CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/k.pem"}}
	core, logs := observer.New(zap.DebugLevel)
	zap.New(core).Info("config", zap.Any("kafka", cfg), zap.Stringer("conn", cfg), zap.Any("sasl", cfg.SASL))
	j, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var logged strings.Builder
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			fmt.Fprintf(&logged, "%s=%v\n", k, v)
		}
	}
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), cfg.String(), string(j), logged.String()} {
		if strings.Contains(s, password) {
			t.Errorf("password shown: %s", s)
		}
	}
	if !strings.Contains(cfg.String(), "SASL SCRAM-SHA-512 as u") {
		t.Errorf("String() = %q, want the mechanism and user", cfg.String())
	}
}

// TestRealSecuredBroker: on the real SASL_SSL broker (ACLs on, client
// certificate required), SCRAM-SHA-512 and PLAIN with the right password
// are served; a wrong password, a missing client certificate and an
// untrusted CA are refused with the errors that name them.
func TestRealSecuredBroker(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	for _, mech := range []string{kafka.ScramSHA512, kafka.Plain} {
		good := k.Config(t, "admin", mech)
		if err := kafka.CheckCredentials(ctx(t), good); err != nil {
			t.Fatalf("%s: %v", mech, err)
		}
		if err := listTopics(t, good); err != nil {
			t.Fatalf("%s: list topics: %v", mech, err)
		}
		bad := good
		bad.SASL.Password = secret.New("wrong-password")
		err := kafka.CheckCredentials(ctx(t), bad)
		if !errors.Is(err, kafka.ErrAuthentication) || strings.Contains(err.Error(), "wrong-password") {
			t.Fatalf("%s, wrong password: %v, want ErrAuthentication without the password", mech, err)
		}
		t.Logf("%s, wrong password: %v", mech, err)
	}
	cfg := k.Config(t, "admin", kafka.ScramSHA512)
	cfg.TLS.CertFile, cfg.TLS.KeyFile = "", ""
	if err := kafka.CheckCredentials(ctx(t), cfg); err == nil {
		t.Fatal("no client certificate: served")
	} else {
		t.Logf("no client certificate: %v", err)
	}
	cfg = k.Config(t, "admin", kafka.ScramSHA512)
	cfg.TLS.CAFile = testenv.NewCerts(t).OtherCAFile
	if err := kafka.CheckCredentials(ctx(t), cfg); !errors.Is(err, kafka.ErrTLS) {
		t.Fatalf("untrusted CA: %v, want ErrTLS", err)
	}
}

// TestDialTimeoutSilentTLSBroker: a broker that takes connections and
// never answers (paused, its host hung) fails a request that picked it
// within two dials of kafka.DialTimeout (kgo opens a connection that
// failed so once more), not of kgo's default of 10 s: every request of a
// stage's session that picked it waited 20 s (docs/operations.md, "One
// broker paused or killed").
func TestDialTimeoutSilentTLSBroker(t *testing.T) {
	certs := testenv.NewCerts(t)
	_, brokers := testenv.KFake(t, kfake.TLS(certs.ServerTLS(true)))
	silent := testenv.NewProxy(t, brokers[0])
	silent.Silence()
	cfg := kafka.Config{Brokers: []string{silent.Addr()},
		TLS: tlsconfig.Files{CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}}
	cl, err := kafka.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	_, err = cl.SeedBrokers()[0].Request(ctx(t), kmsg.NewPtrMetadataRequest())
	took := time.Since(start)
	if err == nil {
		t.Fatal("a silent broker answered")
	}
	if bound := 2*kafka.DialTimeout + time.Second; took > bound {
		t.Fatalf("a request to a silent TLS broker failed after %s, want at most %s: %v", took.Round(time.Millisecond), bound, err)
	}
	t.Logf("failed after %s: %v", took.Round(time.Millisecond), err)
}
