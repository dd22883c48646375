package sink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"syscall"
	"time"

	chproto "github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/tlsconfig"
)

// databaseName is what Dial accepts as a database name: it is spliced into
// CREATE DATABASE and into qualified table names.
var databaseName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Server is how to reach ClickHouse over the native protocol: address,
// user, password and TLS.
type Server struct {
	// Addr is host:port of the native protocol: the server's tcp_port, or
	// its tcp_port_secure with TLS. Required.
	Addr string
	// User is the ClickHouse user. Default: "default".
	User string
	// Password is the user's password. Default: none. The native protocol
	// sends it in the clear: Validate refuses one without TLS unless Addr
	// is a loopback address (localhost, 127.0.0.0/8, ::1), as kafka.Config
	// refuses SASL/PLAIN without TLS.
	Password secret.Secret
	// TLS encrypts the connection and verifies the server's certificate
	// (ClickHouse's tcp_port_secure). Default: off.
	TLS tlsconfig.Files
}

// Validate reports every problem, joined.
func (s Server) Validate() error {
	var errs []error
	if s.Addr == "" {
		errs = append(errs, errors.New("sink: clickhouse: an address is required"))
	}
	if err := s.TLS.Validate("sink: clickhouse-tls"); err != nil {
		errs = append(errs, err)
	}
	if !s.Password.IsZero() && !s.TLS.On() && s.Addr != "" && !loopback(s.Addr) {
		errs = append(errs, fmt.Errorf("sink: clickhouse-password: the native protocol sends the password in the clear; to %s it needs TLS (--clickhouse-tls, and the server's tcp_port_secure)", s.Addr))
	}
	return errors.Join(errs...)
}

// loopback reports whether addr's host is this machine: localhost or a
// loopback IP. A password sent there in the clear never leaves it.
// Another name is not resolved: what it resolves to may change.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s Server) user() string {
	if s.User == "" {
		return "default"
	}
	return s.User
}

// ErrAuthentication is returned (wrapped) by Dial when ClickHouse refuses
// the user or the password: a configuration error that waiting does not
// cure.
var ErrAuthentication = errors.New("sink: clickhouse authentication failed")

// Dial is Server{Addr: addr}.Dial: user "default", no password, no TLS.
func Dial(ctx context.Context, addr, database string, create bool) (driver.Conn, error) {
	return Server{Addr: addr}.Dial(ctx, database, create)
}

// Dial opens a native-protocol connection pool to the server whose
// default database is database, and pings it. With create, the database
// is created first when it does not exist. Every call on the returned
// connection must carry a deadline (a context with a timeout). A refused
// user or password is an error wrapping ErrAuthentication.
func (s Server) Dial(ctx context.Context, database string, create bool) (driver.Conn, error) {
	if !databaseName.MatchString(database) {
		return nil, fmt.Errorf("sink: database name %q: want letters, digits and underscores", database)
	}
	if create {
		admin, err := s.open(ctx, "default")
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		// Only a missing database is created: a user without DDL rights
		// is refused even CREATE DATABASE IF NOT EXISTS.
		var n uint64
		if err = admin.QueryRow(cctx, "SELECT count() FROM system.databases WHERE name = '"+database+"'").Scan(&n); err == nil && n == 0 {
			err = admin.Exec(cctx, "CREATE DATABASE IF NOT EXISTS "+database)
		}
		cancel()
		_ = admin.Close()
		if err != nil {
			return nil, fmt.Errorf("sink: create database %s on %s: %w", database, s.Addr, err)
		}
	}
	return s.open(ctx, database)
}

func (s Server) open(ctx context.Context, database string) (driver.Conn, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	tc, err := s.TLS.Load()
	if err != nil {
		return nil, fmt.Errorf("sink: clickhouse %s: %w", s.Addr, err)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:             []string{s.Addr},
		Auth:             clickhouse.Auth{Database: database, Username: s.user(), Password: s.Password.Reveal()},
		TLS:              tc,
		DialTimeout:      5 * time.Second,
		ReadTimeout:      2 * time.Minute,
		MaxOpenConns:     8,
		MaxIdleConns:     4,
		ConnMaxLifetime:  time.Hour,
		ConnOpenStrategy: clickhouse.ConnOpenInOrder,
	})
	if err != nil {
		return nil, fmt.Errorf("sink: clickhouse %s: %w", s.Addr, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := conn.Ping(pctx); err != nil {
		_ = conn.Close()
		if isAuthErr(err) {
			return nil, fmt.Errorf("%w: %s refused user %q (wrong user or password?): %v", ErrAuthentication, s.Addr, s.user(), err)
		}
		if notTLS(err) {
			return nil, fmt.Errorf("sink: clickhouse %s does not speak TLS (its tcp_port? TLS is on the server's tcp_port_secure): %w", s.Addr, err)
		}
		if isTLSErr(err) {
			return nil, fmt.Errorf("sink: clickhouse %s: TLS handshake failed (CA, client certificate or server name?): %w", s.Addr, err)
		}
		if tc != nil && droppedConn(err) && reachable(ctx, s.Addr) {
			// A server that refuses the client's certificate may close
			// the connection once the client's side of the handshake is
			// done (TLS 1.3): the client reads EOF or a reset at its
			// hello, not a TLS alert.
			return nil, fmt.Errorf("sink: clickhouse %s: TLS handshake failed (CA, client certificate or server name?): %w: %w", s.Addr, errTLSDropped, err)
		}
		if tc == nil && speaksTLS(ctx, s.Addr) {
			return nil, fmt.Errorf("sink: clickhouse %s %w (its tcp_port_secure?) and drops a connection without it: connect with --clickhouse-tls (and --clickhouse-tls-ca-file), or to its tcp_port: %v",
				s.Addr, errSpeaksTLS, err)
		}
		return nil, fmt.Errorf("sink: clickhouse %s (database %s) does not answer: %w", s.Addr, database, err)
	}
	return conn, nil
}

// authCodes are the server exception codes of a refused login
// (ClickHouse ErrorCodes.cpp): UNKNOWN_USER, WRONG_PASSWORD,
// REQUIRED_PASSWORD, AUTHENTICATION_FAILED.
var authCodes = map[int32]bool{192: true, 193: true, 194: true, 516: true}

func isAuthErr(err error) bool {
	var ex *proto.Exception
	return errors.As(err, &ex) && authCodes[ex.Code]
}

// CheckLogin connects once, as the sink will, and returns an error when
// the server refused the user or password (wrapping ErrAuthentication) or
// the TLS handshake failed, or the settings are invalid: a process should
// stop there, before it writes anything. A server that cannot be reached
// is not its business (nil): the sink waits for it.
func (s Server) CheckLogin(ctx context.Context) error {
	if err := s.Validate(); err != nil {
		return err
	}
	conn, err := s.open(ctx, "default")
	if err == nil {
		_ = conn.Close()
		return nil
	}
	if errors.Is(err, ErrAuthentication) || isTLSErr(err) || errors.Is(err, errSpeaksTLS) || errors.Is(err, errTLSDropped) {
		return err
	}
	tc, terr := s.TLS.Load()
	if terr != nil {
		return err
	}
	if tc != nil && reachable(ctx, s.Addr) {
		// The server took the connection and the TLS session failed
		// without a TLS error: a server that refuses the client
		// certificate may just close the connection (EOF, reset).
		return fmt.Errorf("sink: clickhouse %s: TLS session failed (CA, client certificate or server name?): %w", s.Addr, err)
	}
	return nil
}

// errSpeaksTLS is wrapped by open's error when the server, dialled
// without TLS, dropped the connection and answers a TLS hello.
var errSpeaksTLS = errors.New("speaks TLS")

// speaksTLS reports whether the server at addr answers a TLS hello with a
// certificate or a TLS alert: a port that serves only TLS
// (tcp_port_secure), which drops a plain client's connection without a
// ClickHouse answer. No certificate is trusted: the probe only asks
// whether the server speaks TLS, and sends nothing else.
func speaksTLS(ctx context.Context, addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second},
		Config: &tls.Config{ServerName: host, RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		_ = c.Close()
		return true
	}
	var (
		verr *tls.CertificateVerificationError
		aerr tls.AlertError
	)
	return errors.As(err, &verr) || errors.As(err, &aerr)
}

// reachable reports whether addr accepts a TCP connection.
func reachable(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// notTLS reports whether err is a TLS client's at a port that answered
// its hello with something else than TLS: a tcp_port (or an HTTP port)
// dialled with TLS.
func notTLS(err error) bool {
	var rerr tls.RecordHeaderError
	return errors.As(err, &rerr) || strings.Contains(err.Error(), "tls: first record does not look like a TLS handshake")
}

// errTLSDropped is wrapped by open's error when the server, dialled with
// TLS, closed the connection at the client's hello.
var errTLSDropped = errors.New("the server closed the connection")

// droppedConn reports whether err is the peer closing the connection: EOF
// or a reset.
func droppedConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func isTLSErr(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		rerr tls.RecordHeaderError
		aerr tls.AlertError
	)
	return errors.As(err, &verr) || errors.As(err, &rerr) || errors.As(err, &aerr) || strings.Contains(err.Error(), "tls: ")
}

// errClass says what a failed ClickHouse call means for the rows it carried.
type errClass int

const (
	// classUnavailable: the server is unreachable, overloaded, or the table
	// cannot take any block right now (missing, read-only, too many parts,
	// columns drifted away from the sink's column list). Nothing about the
	// rows is wrong: back off and retry them; never park.
	classUnavailable errClass = iota
	// classRefused: the server (or the driver) refused this block because
	// of the data in it. Split the block to find the refused rows.
	classRefused
	// classUnknown: a server exception whose code is in neither list below.
	// It may as well be a state of the server the sink does not know (a
	// missing dictionary, a new kind of overload) as a refusal of the rows,
	// so the rows are never parked on it: the sink backs off as when
	// unavailable, for at most Config.UnknownErrorLimit, and then stops
	// with ErrUnknownServerError.
	classUnknown
)

// transientCodes are server exception codes that do not depend on the rows
// of a block (ClickHouse ErrorCodes.cpp, stable since 18.x).
var transientCodes = map[int32]string{
	3:    "UNEXPECTED_END_OF_FILE",
	8:    "THERE_IS_NO_COLUMN",
	16:   "NO_SUCH_COLUMN_IN_TABLE",
	60:   "UNKNOWN_TABLE",
	81:   "UNKNOWN_DATABASE",
	159:  "TIMEOUT_EXCEEDED",
	164:  "READONLY",
	192:  "UNKNOWN_USER",
	193:  "WRONG_PASSWORD",
	194:  "REQUIRED_PASSWORD",
	201:  "QUOTA_EXPIRED",
	202:  "TOO_MANY_SIMULTANEOUS_QUERIES",
	209:  "SOCKET_TIMEOUT",
	210:  "NETWORK_ERROR",
	225:  "NO_ZOOKEEPER",
	236:  "ABORTED",
	241:  "MEMORY_LIMIT_EXCEEDED",
	242:  "TABLE_IS_READ_ONLY",
	243:  "NOT_ENOUGH_SPACE",
	252:  "TOO_MANY_PARTS",
	285:  "TOO_FEW_LIVE_REPLICAS",
	319:  "UNKNOWN_STATUS_OF_INSERT",
	394:  "QUERY_WAS_CANCELLED",
	425:  "SYSTEM_ERROR",
	473:  "DEADLOCK_AVOIDED",
	497:  "ACCESS_DENIED",
	516:  "AUTHENTICATION_FAILED",
	999:  "KEEPER_EXCEPTION",
	1000: "POCO_EXCEPTION",
}

// refusalCodes are server exception codes raised by the values of a block:
// a DEFAULT or MATERIALIZED expression, a constraint or a partition key
// failing on a row (ClickHouse ErrorCodes.cpp). Codes that can also mean
// a state of the server (BAD_ARGUMENTS for a missing dictionary,
// ILLEGAL_TYPE_OF_ARGUMENT after a schema change, LOGICAL_ERROR) are
// deliberately not here: they are unknown.
var refusalCodes = map[int32]string{
	6:   "CANNOT_PARSE_TEXT",
	19:  "SIZE_OF_FIXED_STRING_DOESNT_MATCH",
	27:  "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
	38:  "CANNOT_PARSE_DATE",
	41:  "CANNOT_PARSE_DATETIME",
	69:  "ARGUMENT_OUT_OF_BOUND",
	70:  "CANNOT_CONVERT_TYPE",
	72:  "CANNOT_PARSE_NUMBER",
	117: "INCORRECT_DATA",
	128: "TOO_LARGE_ARRAY_SIZE",
	131: "TOO_LARGE_STRING_SIZE",
	153: "ILLEGAL_DIVISION",
	190: "SIZES_OF_ARRAYS_DONT_MATCH",
	248: "INVALID_PARTITION_VALUE",
	321: "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
	349: "CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN",
	376: "CANNOT_PARSE_UUID",
	395: "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO",
	407: "DECIMAL_OVERFLOW",
	441: "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
	469: "VIOLATED_CONSTRAINT",
}

// classify sorts an error from an INSERT. The driver refusing values, or a
// server exception with a known data-dependent code while the block was
// sent, is a refusal; a server exception with a code the sink does not
// know is unknown; everything else (a failure to start the INSERT, network
// errors, timeouts, a closed connection, transient server codes) means
// "unavailable".
func classify(err error) errClass {
	var de *driverError
	if errors.As(err, &de) {
		return classRefused
	}
	var ex *proto.Exception
	if errors.As(err, &ex) {
		if _, ok := transientCodes[ex.Code]; ok {
			return classUnavailable
		}
		if _, ok := refusalCodes[ex.Code]; ok {
			// Nothing was sent when the INSERT failed to start: never a
			// refusal of these rows.
			if errors.As(err, new(*prepareError)) {
				return classUnavailable
			}
			return classRefused
		}
		// Also when the INSERT failed to start, or a resume lookup
		// failed: a code the sink does not know is never taken for an
		// unavailable server that will come back by itself.
		return classUnknown
	}
	return classUnavailable
}

// operatorAction says what the operator should do about a ClickHouse
// error that keeps the sink backing off (docs/operations.md, Outages).
func operatorAction(err error) string {
	var ex *proto.Exception
	if !errors.As(err, &ex) {
		return "none if ClickHouse is restarting or the network recovers: the sink resumes by itself; otherwise check that the server runs and answers on its native port (docs/operations.md, Outages)"
	}
	switch ex.Code {
	case 8, 16, 60, 81: // THERE_IS_NO_COLUMN, NO_SUCH_COLUMN_IN_TABLE, UNKNOWN_TABLE, UNKNOWN_DATABASE
		return "the sink's tables differ from what it writes: run `meterline migrate` against this database; the sink resumes by itself"
	case 164, 242: // READONLY, TABLE_IS_READ_ONLY
		return "make the server or table writable again (readonly setting, replica or disk state); the sink resumes by itself"
	case 192, 193, 194, 497, 516: // UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD, ACCESS_DENIED, AUTHENTICATION_FAILED
		return "grant the sink's ClickHouse user what it needs, or fix its password (docs/operations.md, Security and ACLs); the sink resumes by itself"
	case 243: // NOT_ENOUGH_SPACE
		return "free disk space on the server; the sink resumes by itself"
	case 252: // TOO_MANY_PARTS
		return "let merges catch up (check system.merges, parts_to_throw_insert); the sink resumes by itself"
	}
	return "none if the server's load or restart passes: the sink resumes by itself (docs/operations.md, Outages)"
}

// ErrUnknownServerError is returned (wrapped) by Writer.Run when ClickHouse
// failed a table's INSERTs with an error code the sink knows neither as a
// refusal of rows nor as transient, for longer than
// Config.UnknownErrorLimit. Nothing was committed past those rows.
var ErrUnknownServerError = errors.New("clickhouse keeps failing with an error code the sink does not know")

// codeName names a server exception code, as ClickHouse's ErrorCodes.cpp
// does ("BAD_ARGUMENTS"), when the driver knows it.
func codeName(code int32) string {
	if e := chproto.Error(code); e.IsAError() {
		return e.String()
	}
	return "unnamed"
}

// isNetErr reports whether err looks like the server is not reachable at
// all (for the log line and the ready check).
func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, clickhouse.ErrAcquireConnTimeout)
}
