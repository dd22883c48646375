// Package kafka is the connection to a Kafka cluster that every Meterline
// client uses: the seed brokers, SASL (SCRAM-SHA-512 or PLAIN) and TLS
// (docs/operations.md, Kafka: SASL and TLS). One Config is built per
// process, from the command line or a service's config, and every client
// made from it — a stage's transactional session, a restore reader, an
// admin client, the lag collector, a producer — connects and authenticates
// the same way.
//
// Secrets are never part of a Config's printed form: the password is a
// secret.Secret, and the TLS key is only ever named by its file.
package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/tlsconfig"
)

// SASL mechanisms Meterline speaks.
const (
	// ScramSHA512 is SASL/SCRAM-SHA-512: the password never crosses the
	// wire. The one to use.
	ScramSHA512 = "SCRAM-SHA-512"
	// Plain is SASL/PLAIN: the password crosses the wire, so only over TLS
	// (Validate refuses it without).
	Plain = "PLAIN"
)

// SASL is how a client authenticates. The zero value is no SASL.
type SASL struct {
	// Mechanism is ScramSHA512, Plain, or empty for no SASL. Default:
	// empty.
	Mechanism string
	// User is the SASL user name (the principal User:<name> in ACLs).
	// Required with a mechanism.
	User string
	// Password is the user's password. Required with a mechanism.
	Password secret.Secret
}

// strayBytes is a remark for a refused login whose password begins or
// ends with bytes a password is seldom meant to have: whitespace, a line
// break (a secret made from a file `echo` wrote, in an environment
// variable, which keeps it; or a second one in a file, which drops only
// one) or a byte order mark (an editor's). It says which, never the
// password; "" for none. The password is sent as given: such bytes may be
// meant.
func (s SASL) strayBytes() string {
	pw := s.Password.Reveal()
	trimmed := strings.TrimRightFunc(pw, unicode.IsSpace)
	switch {
	case strings.HasPrefix(pw, "\ufeff"):
		return "; the password begins with a byte order mark"
	case strings.HasSuffix(pw, "\n") || strings.HasSuffix(pw, "\r"):
		return "; the password ends with a line break"
	case trimmed != pw:
		return "; the password ends with whitespace"
	case strings.TrimLeftFunc(pw, unicode.IsSpace) != pw:
		return "; the password begins with whitespace"
	}
	return ""
}

// Config is the connection to a Kafka cluster. Validate reports every
// problem at once; Opts turns it into franz-go client options.
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// SASL authenticates the client. Default: none.
	SASL SASL
	// TLS encrypts the connection and verifies the brokers' certificates.
	// Default: off (plaintext).
	TLS tlsconfig.Files
	// Watch, when set, learns of each login the brokers refuse a client
	// made with Opts (or NewClient) from this Config or a copy of it, on
	// whichever of its connections: a process that reads its password at
	// start only stops on it (LoginWatch). Default: none.
	Watch *LoginWatch
}

// LoginWatch learns of the first SASL login the brokers refused a client
// of a Config that carries it (Config.Watch): the password changed on the
// cluster while the process runs. A client sees such a refusal only in
// the request that needed the connection: a fetch that cannot connect is
// retried for ever without an error in any poll, and a group session whose
// own connection stays up goes on, so a stage would run on reading
// nothing (docs/operations.md, Kafka: SASL and TLS). Safe for concurrent
// use.
type LoginWatch struct {
	once    sync.Once
	refused chan struct{}
	err     error
}

// NewLoginWatch returns a watch that has seen no refusal.
func NewLoginWatch() *LoginWatch { return &LoginWatch{refused: make(chan struct{})} }

// Refused is closed once a login was refused.
func (w *LoginWatch) Refused() <-chan struct{} { return w.refused }

// Err is the first refusal (Config.Refused's error, wrapping
// ErrAuthentication), or nil while there is none.
func (w *LoginWatch) Err() error {
	select {
	case <-w.refused:
		return w.err
	default:
		return nil
	}
}

func (w *LoginWatch) report(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.refused)
	})
}

// loginHook reports each connection of a client of c that the brokers
// refused its login to c.Watch.
type loginHook struct{ c Config }

func (h loginHook) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		return
	}
	if rerr := h.c.Refused(err); rerr != nil {
		h.c.Watch.report(rerr)
	}
}

// Principal names the principal c authenticates as, for an error: the
// SASL user, as ACLs name it (User:<name>).
func (c Config) Principal() string {
	if c.SASL.User != "" {
		return "User:" + c.SASL.User
	}
	return "this client's principal"
}

// Validate returns every problem with the config, joined, each naming its
// field as the command-line flag does.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("kafka: brokers: at least one seed broker is required"))
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			errs = append(errs, fmt.Errorf("kafka: brokers: empty address in %q", strings.Join(c.Brokers, ",")))
			break
		}
	}
	switch c.SASL.Mechanism {
	case "":
		if c.SASL.User != "" || !c.SASL.Password.IsZero() {
			errs = append(errs, errors.New("kafka: sasl-mechanism: a SASL user or password is set but no mechanism (SCRAM-SHA-512 or PLAIN)"))
		}
	case ScramSHA512, Plain:
		if c.SASL.User == "" {
			errs = append(errs, fmt.Errorf("kafka: sasl-user: required with SASL %s", c.SASL.Mechanism))
		}
		if c.SASL.Password.IsZero() {
			errs = append(errs, fmt.Errorf("kafka: sasl-password: required with SASL %s (a file or an environment variable, never a flag value)", c.SASL.Mechanism))
		}
		if c.SASL.Mechanism == Plain && !c.TLS.On() {
			errs = append(errs, errors.New("kafka: sasl-mechanism: PLAIN sends the password in the clear; it needs TLS"))
		}
	default:
		errs = append(errs, fmt.Errorf("kafka: sasl-mechanism: %q is not one of %s, %s", c.SASL.Mechanism, ScramSHA512, Plain))
	}
	if err := c.TLS.Validate("kafka: tls"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// DialTimeout bounds the opening of a connection to a broker: TCP and,
// with TLS, the handshake. A broker that is paused or whose host hangs
// still takes connections (the kernel answers) and never the handshake;
// kgo opens a connection that failed so once more before it fails the
// request, and keeps choosing such a broker as a group's coordinator or
// for requests that may go to any broker until a dial to it fails, so
// that each choice cost twice kgo's default of 10 s (docs/operations.md,
// "One broker paused or killed"). A broker that answers at all completes
// a handshake in milliseconds.
const DialTimeout = 3 * time.Second

// Opts returns the client options that connect as c says: the seed
// brokers, the dial timeout (DialTimeout), the TLS dialer and the SASL
// mechanism. It reads the TLS files.
// Callers append their own options (group, transactions, ...).
//
// With c.Watch, each login the brokers refuse a connection of the client
// is reported to it.
//
// The options retry a connection that closes on its first request
// (kgo.AlwaysRetryEOF), as kgo retries one that closes later: a broker
// restarting, or one dropping connections, closes new connections too,
// and kgo's default takes that for a SASL or TLS mismatch and fails the
// request at once, which stopped stages on a transient error. Such a
// mismatch is found at start by CheckCredentials, which keeps kgo's
// default.
func (c Config) Opts() ([]kgo.Opt, error) {
	opts, err := c.opts()
	if err != nil {
		return nil, err
	}
	if c.Watch != nil {
		opts = append(opts, kgo.WithHooks(loginHook{c}))
	}
	return append(opts, kgo.AlwaysRetryEOF()), nil
}

// opts are Opts without kgo.AlwaysRetryEOF.
func (c Config) opts() ([]kgo.Opt, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.DialTimeout(DialTimeout)}
	tc, err := c.TLS.Load()
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	if tc != nil {
		opts = append(opts, kgo.Dialer(tlsDialer(tc)))
	}
	if m := c.Mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// tlsDialer dials as kgo.DialTLSConfig(tc) does (tc cloned per dial, its
// ServerName the broker's host when empty, the TCP dial and the handshake
// within DialTimeout together) and marks an error of the handshake
// (handshakeError): a broker that closes the connection during the
// handshake does not speak TLS on that listener, or refused the client's
// certificate, where one that closes it later may be shutting down
// (AwaitCluster).
func tlsDialer(tc *tls.Config) func(ctx context.Context, network, host string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		c := tc.Clone()
		if c.ServerName == "" {
			server, _, err := net.SplitHostPort(host)
			if err != nil {
				return nil, fmt.Errorf("unable to split host:port for dialing: %w", err)
			}
			c.ServerName = server
		}
		ctx, cancel := context.WithTimeout(ctx, DialTimeout)
		defer cancel()
		conn, err := d.DialContext(ctx, network, host)
		if err != nil {
			return nil, err
		}
		tconn := tls.Client(conn, c)
		if err := tconn.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, &handshakeError{err}
		}
		return tconn, nil
	}
}

// handshakeError is an error of a TLS handshake (tlsDialer).
type handshakeError struct{ err error }

func (e *handshakeError) Error() string { return "tls handshake: " + e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

// Mechanism returns the SASL mechanism of c, or nil without SASL.
func (c Config) Mechanism() sasl.Mechanism {
	switch c.SASL.Mechanism {
	case ScramSHA512:
		return scram.Auth{User: c.SASL.User, Pass: c.SASL.Password.Reveal()}.AsSha512Mechanism()
	case Plain:
		return plain.Auth{User: c.SASL.User, Pass: c.SASL.Password.Reveal()}.AsMechanism()
	}
	return nil
}

// NewClient returns a client connected as c says, with opts appended.
func NewClient(c Config, opts ...kgo.Opt) (*kgo.Client, error) {
	base, err := c.Opts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka: client: %w", err)
	}
	return cl, nil
}

// String describes the connection for a log line: brokers, mechanism,
// user and TLS files, never the password.
func (c Config) String() string {
	var b strings.Builder
	b.WriteString(strings.Join(c.Brokers, ","))
	if c.SASL.Mechanism != "" {
		fmt.Fprintf(&b, " SASL %s as %s", c.SASL.Mechanism, c.SASL.User)
	}
	if c.TLS.On() {
		b.WriteString(" TLS")
		if c.TLS.CAFile != "" {
			fmt.Fprintf(&b, " (CA %s)", c.TLS.CAFile)
		}
		if c.TLS.CertFile != "" {
			fmt.Fprintf(&b, " (client certificate %s)", c.TLS.CertFile)
		}
	}
	return b.String()
}

// ErrAuthentication is returned (wrapped) by CheckCredentials when a
// broker refused the SASL user or password, or its mechanism.
var ErrAuthentication = errors.New("kafka: authentication failed")

// ErrTLS is returned (wrapped) by CheckCredentials when the TLS handshake
// with a broker failed: its certificate is not trusted or not for its
// name, it asked for a client certificate that was not given, or it does
// not speak TLS.
var ErrTLS = errors.New("kafka: TLS handshake failed")

// pingClient returns a client with c's connection options only, for
// CheckCredentials and AwaitCluster; the caller closes it.
func (c Config) pingClient() (*kgo.Client, error) {
	base, err := c.opts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(base...)
	if err != nil {
		return nil, fmt.Errorf("kafka: client: %w", err)
	}
	return cl, nil
}

// CheckCredentials connects to the seed brokers, authenticating as c
// says, and asks for cluster metadata. It returns an error wrapping
// ErrAuthentication or ErrTLS, or another error, when a broker answered
// and refused the connection or closed it: a process should stop there,
// before it reads or writes anything. Brokers it cannot reach at all (no
// listener, no route before ctx ends) are not its business: it returns
// nil, and the caller's own requests wait or fail as they would; so are
// brokers that, without SASL, close the connection outside a TLS
// handshake (dropped), as a broker shutting down or restarting does.
func CheckCredentials(ctx context.Context, c Config) error {
	// Without kgo.AlwaysRetryEOF: a connection closed at its first
	// request is reported here at once, and with SASL or during the TLS
	// handshake taken for the mismatch it usually is (pingVerdict).
	cl, err := c.pingClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	return c.pingVerdict(ctx, c.ping(ctx, cl))
}

// ping asks every seed broker of cl, a client connected as c says, at
// once for the cluster's metadata (ListedBrokers): nil once one answered,
// else their errors, at once for one pingVerdict takes for the brokers'
// refusal of c's login or TLS settings (within refusalGrace, unless
// another seed serves it). A seed that accepts connections and never
// answers does not hold up the others, as it would in kgo's Ping, which
// asks them one after the other.
func (c Config) ping(ctx context.Context, cl *kgo.Client) error {
	_, err := askBrokers(ctx, cl.SeedBrokers(), 0, func(err error) bool {
		return c.Refused(err) != nil || isTLSError(err) || c.SASL.Mechanism != "" && closed(err)
	})
	return err
}

// pingVerdict is CheckCredentials' verdict on err, a ping's error under
// ctx: nil when the ping was served, found no broker to connect to (or
// ctx ended first), or only brokers that closed the connection where
// that is no refusal (dropped); else the brokers' refusal of the login,
// the TLS handshake that failed, or the connection they closed or
// refused.
func (c Config) pingVerdict(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if rerr := c.Refused(err); rerr != nil {
		return rerr
	}
	brokers := strings.Join(c.Brokers, ",")
	switch {
	case isTLSError(err):
		return fmt.Errorf("%w: brokers %s: %v", ErrTLS, brokers, err)
	case notAnswered(err) || ctx.Err() != nil:
		return nil
	case (closed(err) || reset(err)) && errors.As(err, new(*handshakeError)):
		// Or resets it: a listener that closes the connection with part
		// of the ClientHello unread sends a reset.
		return fmt.Errorf("%w: brokers %s closed the connection during the TLS handshake (a listener without TLS?): %v", ErrTLS, brokers, err)
	case c.SASL.Mechanism != "" && closed(err):
		// Some servers close the connection instead of answering a
		// failed authentication.
		return fmt.Errorf("%w: brokers %s closed the connection while authenticating user %q with %s (wrong user or password, or a listener without SASL?%s): %v",
			ErrAuthentication, brokers, c.SASL.User, c.SASL.Mechanism, c.SASL.strayBytes(), err)
	case c.dropped(err):
		// As a broker shutting down or restarting does: no refusal.
		return nil
	}
	return fmt.Errorf("kafka: brokers %s refused the connection (SASL or TLS settings that do not match the listener?): %w", brokers, err)
}

// dropped reports whether err, a ping's error, is only the seeds closing
// or resetting the connection (each seed that answered at all) where
// that cannot be a refusal of c's login or TLS settings: without SASL,
// and outside a TLS handshake. A broker shutting down or restarting does
// that, as does a proxy before a broker that is down, and AwaitCluster
// waits for the cluster through it. With SASL a close may be a wrong
// password (pingVerdict); during the handshake, a listener without TLS.
func (c Config) dropped(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !c.dropped(e) {
				return false
			}
		}
		return len(j.Unwrap()) > 0
	}
	return c.SASL.Mechanism == "" && (closed(err) || reset(err)) && !errors.As(err, new(*handshakeError))
}

// reset reports a connection the broker reset (a proxy may, instead of
// closing it; so does a close with a request unread).
func reset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// AwaitCluster waits, for as long as ctx lasts, until a seed broker
// answers, then checks the credentials as CheckCredentials does, on the
// same connection: a stage started while no broker serves (every broker
// restarted or down) waits for the cluster, as its clients do once it
// runs, rather than fail the first request it makes and exit; and a wrong
// password, certificate or listener stops it once a broker answers,
// whether or not one did at first. waiting is called with the error of
// each attempt that found no broker to connect to, none answering within
// 10 s, or, without SASL, only brokers that closed or reset the
// connection outside a TLS handshake (a broker shutting down or
// restarting, a proxy before a broker that is down: without SASL such a
// close is no refusal of the client's settings, see dropped). It returns
// nil once a broker served the ping, ctx's error if ctx ends first, else
// the brokers' refusal (CheckCredentials' error).
func AwaitCluster(ctx context.Context, c Config, waiting func(error)) error {
	cl, err := c.pingClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	for backoff := 500 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.ping(pctx, cl)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !notAnswered(err) && !c.dropped(err):
			return c.pingVerdict(ctx, err)
		}
		waiting(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
	}
}

// Refused returns the error CheckCredentials reports when err, of a
// client connected as c, is the brokers' refusal of its SASL user or
// password, or of its mechanism, wrapping ErrAuthentication; nil for any
// other err. No retry helps there: the password is read at start.
func (c Config) Refused(err error) error {
	brokers := strings.Join(c.Brokers, ",")
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return fmt.Errorf("%w: brokers %s refused user %q with %s (wrong user or password?%s): %v",
			ErrAuthentication, brokers, c.SASL.User, c.SASL.Mechanism, c.SASL.strayBytes(), err)
	case errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return fmt.Errorf("%w: brokers %s do not accept SASL %s on this listener: %v",
			ErrAuthentication, brokers, c.SASL.Mechanism, err)
	}
	return nil
}

// SASLRefused reports whether err is the brokers' refusal of a client's
// SASL user, password or mechanism.
func SASLRefused(err error) bool {
	return errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) ||
		errors.Is(err, kerr.IllegalSaslState)
}

// unreachable reports a failure to open a TCP connection at all.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && !isTLSError(err)
}

func closed(err error) bool {
	var first *kgo.ErrFirstReadEOF
	return errors.Is(err, io.EOF) || errors.As(err, &first)
}

func isTLSError(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		rerr tls.RecordHeaderError
		aerr tls.AlertError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
		cerr x509.CertificateInvalidError
	)
	if errors.As(err, &verr) || errors.As(err, &rerr) || errors.As(err, &aerr) ||
		errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &cerr) {
		return true
	}
	// A server that wants a client certificate and gets none closes with
	// an alert that crypto/tls reports as a plain error.
	return strings.Contains(err.Error(), "tls: ")
}

// GroupRejoins reports whether err, the cause carried by a
// kgo.ErrGroupSession that a poll returns, is one that kgo repairs by
// itself. kgo injects that notification after it has already called the
// member's onLost (every partition the member owned is revoked, so an open
// transaction or window can only abort) and keeps rejoining the group with
// backoff. It is true when the member lost its membership (dropped, fenced,
// a stale generation or epoch, a rebalance) and when the group coordinator
// was unreachable, moving or still loading: a retriable Kafka error, or a
// connection that could not be dialled or broke (a broker that died, was
// paused past its session or restarted). A stage must keep running through
// these; on a cluster each of them happens when one broker goes away. Any
// other cause, an authorization failure for instance, is false: kgo would
// retry it forever, and the stage stops on it.
func GroupRejoins(err error) bool {
	return errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.IllegalGeneration) ||
		errors.Is(err, kerr.RebalanceInProgress) || errors.Is(err, kerr.FencedMemberEpoch) ||
		errors.Is(err, kerr.StaleMemberEpoch) || kerr.IsRetriable(err) || kgo.IsRetryableBrokerErr(err) ||
		errors.As(err, new(*net.OpError)) || // a coordinator that cannot be dialled is looked up again
		// A connection closed at its first request: kgo retries it only
		// with kgo.AlwaysRetryEOF (Opts), and the group session of a
		// client without it ends on it; kgo rejoins all the same.
		errors.As(err, new(*kgo.ErrFirstReadEOF))
}

// RecordRefused reports whether a produced record's error is the broker's
// (or the client's) refusal of the record itself, which no retry changes:
// a record larger than the topic's max.message.bytes or the client's batch
// bound (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE), or one the broker
// cannot take (INVALID_RECORD, CORRUPT_MESSAGE). A refused dial, a missing
// leader or a timeout is not: kgo fails a record it never sent with such
// an error when its delivery timeout passes or its transaction aborts.
func RecordRefused(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage)
}
