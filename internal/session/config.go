package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
)

// Config is a stage instance's membership of its consumer group and its
// transactional producer. Zero fields take the defaults documented on them
// (EnsureDefaults); Validate reports every problem at once. A stage's own
// config embeds it, so its fields read as the stage's (stream.Config.Group,
// sink.Config.InstanceID).
type Config struct {
	// Kafka is the connection to the cluster: seed brokers, SASL and TLS.
	// The session's client and every other client of the stage (restore
	// readers, admin) connect with it. Kafka.Brokers is required.
	Kafka kafka.Config
	// Group is the consumer group. Required (the sink defaults it to
	// "meterline-sink").
	Group string
	// InstanceID names this instance; the transactional ID is
	// "<Group>-<InstanceID>". It must be stable across restarts of the same
	// instance, so that a restart fences its own zombie at once, and unique
	// in the group. Required.
	InstanceID string

	// SessionTimeout is the group session timeout. Default: 10s.
	SessionTimeout time.Duration
	// RebalanceTimeout bounds a rebalance: a revoke waits for the stage's
	// work in flight no longer than this. Default: 30s (the sink's: 60s).
	RebalanceTimeout time.Duration
	// TransactionTimeout is the broker-side timeout after which an open
	// transaction of a dead instance is aborted. Default: 10s.
	TransactionTimeout time.Duration
	// RestartBackoff is the pause before a session is rebuilt after a
	// commit with an unknown outcome (ErrRestart). Default: 1s.
	RestartBackoff time.Duration

	// ClientOptions are appended to the options of the session's client,
	// last, so they win (tests: hooks, shorter timeouts). Default: none.
	ClientOptions []kgo.Opt
}

// Defaults of Config.
const (
	DefaultSessionTimeout     = 10 * time.Second
	DefaultRebalanceTimeout   = 30 * time.Second
	DefaultTransactionTimeout = 10 * time.Second
	DefaultRestartBackoff     = time.Second
)

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = DefaultRestartBackoff
	}
}

// Validate returns every problem with the config, joined, each naming its
// field as the command-line flag does (the connection's as kafka.Config
// does).
func (c *Config) Validate() error {
	var errs []error
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Group == "" {
		errs = append(errs, errors.New("session: group: required"))
	}
	if c.InstanceID == "" {
		errs = append(errs, errors.New("session: instance-id: required (stable across restarts, unique in the group)"))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"session-timeout", c.SessionTimeout},
		{"rebalance-timeout", c.RebalanceTimeout},
		{"transaction-timeout", c.TransactionTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("session: %s: must be positive (got %s)", d.flag, d.v))
		}
	}
	return errors.Join(errs...)
}

// TransactionalID is "<Group>-<InstanceID>" (docs/design.md, Exactly-once,
// "One Kafka session").
func (c *Config) TransactionalID() string { return c.Group + "-" + c.InstanceID }

// EndContext returns the context of a GroupTransactSession.End under ctx: it is not cancelled with ctx, because
// kgo leaves a client whose End was cancelled half-way in an invalid
// state, and it is bounded by TransactionTimeout + SessionTimeout, which a
// broker answering at all needs no more than.
func (c *Config) EndContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.TransactionTimeout+c.SessionTimeout)
}

// TransactionalIDError returns err, naming the ACL the principal lacks
// when err is a refusal of the transactional ID (a missing ACL, which no
// retry grants).
func (c *Config) TransactionalIDError(err error) error {
	if !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
		return err
	}
	id := c.TransactionalID()
	return fmt.Errorf("transactional ID %s: %w (%s needs Write on transactional ID %s, as the prefix %s-: docs/operations.md, Security and ACLs)",
		id, err, c.Kafka.Principal(), id, c.Group)
}
