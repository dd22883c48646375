package sink

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// connectWith runs a sink's connect to server until it returns or 10 s
// pass (then it reports a sink that would retry for ever).
func connectWith(t *testing.T, server Server) error {
	t.Helper()
	w, err := New(Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, InstanceID: "refused"},
		Topics: testTopics(), ClickHouseServer: server, Database: "default"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = w.connect(ctx)
	if ctx.Err() != nil {
		t.Fatalf("connect to %s still retrying after 10 s (last: %v); want it to stop", server.Addr, err)
	}
	return err
}

// TestConnectStopsOnRefusal: a sink (the library's, without the
// command's CheckLogin first) whose user or password ClickHouse refuses,
// or that dials a port speaking only TLS without it, stops with that
// error, instead of retrying for ever as for an unreachable server: no
// retry makes either right.
func TestConnectStopsOnRefusal(t *testing.T) {
	if err := connectWith(t, Server{Addr: tlsOnlyServer(t)}); !errors.Is(err, errSpeaksTLS) {
		t.Errorf("plain client at a TLS port: %v, want the error saying it speaks TLS", err)
	}

	ch := testenv.RealClickHouseSecure(t)
	wrong := Server{Addr: ch.Addr, Password: secret.New("not-" + ch.Password(t)), TLS: ch.TLS()}
	if err := connectWith(t, wrong); !errors.Is(err, ErrAuthentication) {
		t.Errorf("wrong password: %v, want ErrAuthentication", err)
	}
}
