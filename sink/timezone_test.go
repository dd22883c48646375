package sink

import (
	"errors"
	"testing"
	"time"
	_ "time/tzdata" // the zones of utcZones, whatever the machine has

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// TestServerTimeZone: the tables' months and days, verify's months and the
// analysts' literal times are the server's, so migrate, verify and the
// sink refuse a server that does not compute them in UTC, and take one
// that does. Whether the test server does is read from what it computes
// (the month and day of the last second of January 2024 UTC, and of the
// next second), not from the name of its zone.
func TestServerTimeZone(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, time.Minute)
	var tz, lastDay string
	var lastMonth, nextMonth uint32
	if err := conn.QueryRow(ctx, "SELECT timezone(), toYYYYMM(toDateTime(1706745599)), toString(toDate(toDateTime(1706745599))), toYYYYMM(toDateTime(1706745600))").
		Scan(&tz, &lastMonth, &lastDay, &nextMonth); err != nil {
		t.Fatal(err)
	}
	utc := lastMonth == 202401 && lastDay == "2024-01-31" && nextMonth == 202402
	t.Logf("server time zone %s: 2024-01-31 23:59:59 UTC is in month %d, day %s; a second later, month %d", tz, lastMonth, lastDay, nextMonth)
	check := func(what string, err error) {
		t.Helper()
		switch {
		case utc && err != nil:
			t.Errorf("%s refused a server in %s, which computes UTC months and days: %v", what, tz, err)
		case !utc && !errors.Is(err, ErrServerTimeZone):
			t.Errorf("%s took a server in %s, whose months and days are not UTC's, error %v", what, tz, err)
		}
	}
	_, err := Migrate(ctx, conn)
	check("migrate", err)
	_, err = Verify(ctx, VerifyConfig{Conn: conn, Database: db})
	check("verify", err)
	w, err := New(Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, InstanceID: "tz"},
		Topics: testTopics(), Conn: conn, Database: db})
	if err != nil {
		t.Fatal(err)
	}
	check("the sink", w.connect(ctx))
}

// Every zone name CheckTimeZone takes for UTC is UTC at every instant
// (tzdata, as Go reads it), and a zone that is UTC only in winter is not
// among them.
func TestUTCZoneNames(t *testing.T) {
	for name := range utcZones {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for at := time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC); at.Year() < 2110; at = at.AddDate(0, 1, 0) {
			if _, off := at.In(loc).Zone(); off != 0 {
				t.Errorf("%s is UTC%+d s at %s", name, off, at.Format(time.DateOnly))
				break
			}
		}
	}
	for _, name := range []string{"Europe/London", "Africa/Abidjan", "Europe/Berlin", "America/New_York", ""} {
		if utcZones[name] {
			t.Errorf("%q taken for UTC", name)
		}
	}
}
