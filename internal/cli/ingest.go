package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/topics"
)

// IngestFlags are the flags of the HTTP ingest, in `meterline ingest` and
// (prefixed --ingest-) in `meterline run`. A help text names another of
// these flags as --${flag_prefix}name: the embedding sets the variable
// flag_prefix to its prefix.
type IngestFlags struct {
	Addr                 string         `help:"Listen address of the HTTP ingest; loopback unless told otherwise (0.0.0.0:8888 for every interface; one that is not loopback without --${flag_prefix}tls-cert-file is logged as a warning: API keys cross the network in the clear)." default:"${ingest_addr}"`
	TLSCertFile          string         `name:"tls-cert-file" help:"PEM certificate (chain) to serve HTTPS; with --${flag_prefix}tls-key-file." placeholder:"FILE" type:"existingfile"`
	TLSKeyFile           string         `name:"tls-key-file" help:"PEM private key of --${flag_prefix}tls-cert-file." placeholder:"FILE" secretfile:""` // not kong's existingfile: its error would quote a key set here by mistake
	RequireTime          bool           `help:"Refuse CloudEvents without a time; by default they get the time the request was received, as in OpenMeter."`
	MaxBodyBytes         int64          `help:"Largest request body (413 beyond)." default:"${ingest_max_body_bytes}"`
	MaxEvents            int            `help:"Most events in one request (413 beyond)." default:"${ingest_max_events}"`
	MaxInFlight          int            `help:"Most requests with a valid key served at once, each holding up to --${flag_prefix}max-body-bytes (503 overloaded beyond); -1: no bound." default:"${ingest_max_in_flight}"`
	MaxInFlightPerTenant int            `name:"max-in-flight-per-client" help:"Most requests of one tenant (all its API keys together) served at once (429 too-many-in-flight beyond); -1: no bound. A tenant is also refused 429 once it holds as many as there are free slots of --${flag_prefix}max-in-flight." default:"${ingest_max_in_flight_per_client}"`
	MaxConnections       int            `help:"Most connections open at once, idle keep-alive ones and those that have sent no request yet included (each holds a file descriptor): past it the one that has waited the longest without a request in flight is closed, or the new one when every open one has a request in flight; -1: no bound. Default: half the open-file limit (ulimit -n), at most 4096, leaving the rest to the Kafka clients and files." default:"${ingest_max_connections}"`
	RefusalRate          float64        `help:"Refusal budget of a key without a rate: events per second it may have refused (400, 403, 413, 415) on this replica; past it, 429 before bodies are read; -1: no budget." default:"${ingest_refusal_rate}"`
	ProduceTimeout       time.Duration  `help:"Longest wait for Kafka to acknowledge a request's events; 503 past it." default:"${ingest_produce_timeout}"`
	ReadHeaderTimeout    time.Duration  `help:"Longest a client may take to send the request headers." default:"${ingest_read_header_timeout}"`
	ReadTimeout          time.Duration  `help:"Longest a client may take to send a whole request." default:"${ingest_read_timeout}"`
	IdleTimeout          time.Duration  `help:"How long an idle keep-alive connection stays open." default:"${ingest_idle_timeout}"`
	MaxSkew              time.Duration  `help:"How far after now an event time may be (the dedup skew S)." default:"${producer_max_skew}"`
	MaxAge               *time.Duration `help:"How far before now an event time may be (400 too_old beyond); -1s: no bound. Default: the dedup window W (in meterline run --dedup-window, else 35 days) plus --${flag_prefix}max-skew, the margin for this clock being ahead of the broker's, so that no event dedup would accept is refused."`
	AuthMaxAge           time.Duration  `help:"How long this replica serves with API keys it has not confirmed current (the keys topic's end listed, then read; checked every 5 s, or a quarter of this when less): past it every request is answered 503 with Retry-After and /readyz fails, so that a key revoked while the keys topic is out of reach stops working here within it. Minutes: beyond a leader election or a broker restart, which take seconds, and the ingest cannot write events while the cluster is down anyway; -1s: no bound." default:"${ingest_auth_max_age}"`
	QuotaGate            bool           `help:"Answer 402 to a request whose every event is for a reject-policy meter exhausted in the event's period, per the balances topic (advisory; fails open); on by default." default:"true" negatable:""`
	GateMaxAge           time.Duration  `help:"Age past which the quota gate no longer trusts a balance: the broker time now (the timestamps of balances that arrived live, plus the time since) minus its updated_at; none is trusted until one has arrived live." default:"${ingest_gate_max_age}"`
}

// window is dedup's window W: the default bound on an event's age is W
// plus the max skew (ingest.Config.MaxAge).
func (f *IngestFlags) config(kc kafka.Config, g *Globals, meters *aggregator.Catalog, strict bool, window time.Duration, log *zap.Logger, reg prometheus.Registerer) ingest.Config {
	cfg := ingest.Config{
		Addr: f.Addr, TLSCertFile: f.TLSCertFile, TLSKeyFile: f.TLSKeyFile,
		Kafka: kc, Topic: g.Topic.EventsTopic(), KeysTopic: g.Topic.KeysTopic(),
		BalancesTopic: g.Topic.BalancesTopic(), NoGate: !f.QuotaGate, GateMaxAge: f.GateMaxAge, AuthMaxAge: f.AuthMaxAge,
		Meters: meters, StrictMeters: strict, RequireTime: f.RequireTime, MaxSkew: f.MaxSkew,
		MaxBodyBytes: f.MaxBodyBytes, MaxEvents: f.MaxEvents, MaxInFlight: f.MaxInFlight, MaxInFlightPerTenant: f.MaxInFlightPerTenant, MaxConnections: f.MaxConnections, RefusalRate: f.RefusalRate, ProduceTimeout: f.ProduceTimeout,
		ReadHeaderTimeout: f.ReadHeaderTimeout, ReadTimeout: f.ReadTimeout, IdleTimeout: f.IdleTimeout,
		Logger: log, Registerer: reg,
	}
	if f.MaxAge != nil {
		cfg.MaxAge = *f.MaxAge
	} else if f.MaxSkew > 0 {
		cfg.MaxAge = ingest.DefaultMaxAge(window, f.MaxSkew)
	}
	cfg.EnsureDefaults()
	return cfg
}

// refuseZeroMaxAge refuses --max-age 0: the flag has no default of its
// own (it is derived from the dedup window), so refuseZeroFlags leaves it,
// and ingest.Config takes 0 as the derived default; -1s says no bound.
// The ingest's other bounds and timeouts set to 0 are refused by
// refuseZeroFlags (ingest.Config takes 0 as their defaults, and net/http
// would read a zero timeout as none).
func (f *IngestFlags) refuseZeroMaxAge() error {
	if f.MaxAge != nil && *f.MaxAge == 0 {
		return errors.New("ingest: max-age must not be 0; leave the flag out for the default (the dedup window plus --max-skew; -1s: no bound)")
	}
	return nil
}

// IngestCmd is `meterline ingest`.
type IngestCmd struct {
	IngestFlags       `embed:""`
	MetersFlags       `embed:""`
	MetricsAddr       string `help:"Address of the metrics, health and status page server." default:"${metrics_addr}"`
	MetricsHostsFlags `embed:""`
	Validate          bool `help:"Check the configuration and exit."`
}

// Run serves the HTTP ingest until ctx ends.
func (c *IngestCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cat, err := c.MetersFlags.load()
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	kc, err := g.kafka()
	if err != nil {
		return err
	}
	reg := service.NewRegistry()
	cfg := c.config(kc, g, cat, c.StrictMeters, dedup.DefaultWindow, log, reg)
	if err := errors.Join(c.refuseZeroMaxAge(), cfg.Validate()); err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if c.Validate {
		fmt.Fprintln(stdio.Stdout, "configuration ok")
		return nil
	}
	if _, err := g.connectKafka(ctx); err != nil {
		return err
	}
	// Without Write on the events topic every request would be answered
	// 503 "retry", for ever: stop here, naming the missing ACL.
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = topics.MayWrite(wctx, kc, cfg.Topic)
	cancel()
	if errors.Is(err, kerr.TopicAuthorizationFailed) {
		return &ExitError{Code: 1, Err: fmt.Errorf("ingest: %w", err)}
	}
	if cat == nil || len(cat.EventTypes()) == 0 {
		log.Warn("no meter declares an event_type: /api/v1/events refuses every CloudEvent (unknown_event_type); give --meters")
	}
	srv, err := ingest.New(cfg)
	if err != nil {
		return err
	}
	return runStageWith(ctx, g, metricsServer{c.MetricsAddr, c.MetricsAllowedHosts}, reg, log, nil, srv.Ready, srv.Run, func(s *service.Server) { s.AddTable(srv.Status) })
}
