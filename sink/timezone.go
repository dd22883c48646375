package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The server's time zone (docs/design.md, Time: billing periods are UTC).
//
// The DateTime columns of the tables carry no time zone of their own, so
// ClickHouse computes everything calendar-shaped about them in its server
// time zone: the month partitions (toYYYYMM), the days of the rollups
// (toDate in the views), the months verify compares and rebuilds, and the
// literal times of the analysts' queries ('2024-01-01 00:00:00'). The
// rows hold the right instants in any zone, but on a server in
// Europe/Berlin, say, an invoice period that starts at 2024-02-01 00:00
// UTC lands in January's partition, the documented invoice query for
// period '2024-02-01 00:00:00' finds none of its lines, and a day of
// usage_daily is a Berlin day. So the sink, migrate and verify refuse a
// server whose time zone is not UTC.

// ErrServerTimeZone is returned (wrapped) by CheckTimeZone, and so by
// Migrate, Verify and the sink at start, when the ClickHouse server's time
// zone is not UTC: set <timezone>UTC</timezone> in its configuration.
var ErrServerTimeZone = errors.New("clickhouse server time zone is not UTC")

// utcZones are the IANA names of zones that are UTC at every instant.
var utcZones = map[string]bool{
	"UTC": true, "Etc/UTC": true, "UCT": true, "Etc/UCT": true,
	"Universal": true, "Etc/Universal": true, "Zulu": true, "Etc/Zulu": true,
	"GMT": true, "Etc/GMT": true, "GMT0": true, "Etc/GMT0": true,
	"GMT+0": true, "Etc/GMT+0": true, "GMT-0": true, "Etc/GMT-0": true,
	"Greenwich": true, "Etc/Greenwich": true,
}

// CheckTimeZone returns an error wrapping ErrServerTimeZone when conn's
// server does not run in UTC, or when conn's session does not (the
// session_timezone setting, from 23.x, set in the user's profile), and
// another error when it cannot tell. On a release with session_timezone,
// timezone() is the session's zone, which computes nothing about the
// stored rows: the partitions and the views' days follow the server's
// (serverTimezone()), whatever the session's zone. So the server's zone
// is read with serverTimezone() where the server has it (timezone() on
// 18.16, which has no session zone), and both must be UTC: the session's
// zone is the one the analysts' literal times are read in.
func CheckTimeZone(ctx context.Context, conn driver.Conn) error {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var n uint64
	if err := conn.QueryRow(qctx, serverTimezoneKnownSQL).Scan(&n); err != nil {
		return fmt.Errorf("sink: read the clickhouse server's time zone: %w", err)
	}
	var server, session string
	if err := conn.QueryRow(qctx, timeZonesSQL(n > 0)).Scan(&server, &session); err != nil {
		return fmt.Errorf("sink: read the clickhouse server's time zone: %w", err)
	}
	return checkZones(server, session)
}

// serverTimezoneKnownSQL says whether the server has serverTimezone().
const serverTimezoneKnownSQL = "SELECT count() FROM system.functions WHERE name = 'serverTimezone'"

// timeZonesSQL reads the server's and the session's time zones; without
// serverTimezone() (18.16) timezone() is the server's and no session has
// another.
func timeZonesSQL(serverTimezoneKnown bool) string {
	if serverTimezoneKnown {
		return "SELECT serverTimezone(), timezone()"
	}
	return "SELECT timezone(), timezone()"
}

// checkZones refuses a server or a session time zone that is not UTC.
func checkZones(server, session string) error {
	if !utcZones[server] {
		return fmt.Errorf("sink: %w: it is %q, and the tables' months, days and the analysts' queries would follow it, not the UTC billing periods; set <timezone>UTC</timezone> in the server's config.xml and restart it",
			ErrServerTimeZone, server)
	}
	if !utcZones[session] {
		return sessionZoneError{session}
	}
	return nil
}

// sessionZoneError is a session time zone that is not UTC on a server in
// UTC. It is an ErrServerTimeZone: ClickHouse reads the analysts' literal
// times in it.
type sessionZoneError struct{ zone string }

func (e sessionZoneError) Error() string {
	return fmt.Sprintf("sink: clickhouse session time zone is not UTC: the server's is UTC, this session's is %q (the session_timezone setting, from the user's profile?), and the analysts' literal times would be read in it, not in UTC; set session_timezone to UTC or remove it",
		e.zone)
}

func (e sessionZoneError) Is(target error) bool { return target == ErrServerTimeZone }
