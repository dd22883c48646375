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
// server does not run in UTC, and another error when it cannot tell.
func CheckTimeZone(ctx context.Context, conn driver.Conn) error {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var tz string
	if err := conn.QueryRow(qctx, "SELECT timezone()").Scan(&tz); err != nil {
		return fmt.Errorf("sink: read the clickhouse server's time zone: %w", err)
	}
	if !utcZones[tz] {
		return fmt.Errorf("sink: %w: it is %q, and the tables' months, days and the analysts' queries would follow it, not the UTC billing periods; set <timezone>UTC</timezone> in the server's config.xml and restart it",
			ErrServerTimeZone, tz)
	}
	return nil
}
