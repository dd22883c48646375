package sink

import (
	"errors"
	"strings"
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

// TestTimeZoneCheckOnChdb: on current ClickHouse (chdb, 26.x) a session
// may set session_timezone (a user's profile does), and timezone() then
// answers the session's zone, while the partitions and the views' days
// still follow the server's. The check refuses a server in Europe/Berlin
// whose sessions say UTC, refuses a session in Europe/Berlin on a server
// in UTC, naming the setting, and takes UTC on both.
func TestTimeZoneCheckOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	for _, c := range []struct {
		server, session string
		refused         string // in the error; "" for none
	}{
		{"Europe/Berlin", "UTC", `server time zone is not UTC: it is "Europe/Berlin"`},
		{"UTC", "Europe/Berlin", `session_timezone`},
		{"UTC", "UTC", ""},
		{"Europe/Berlin", "", `server time zone is not UTC: it is "Europe/Berlin"`},
	} {
		t.Setenv("METERLINE_CHDB_SERVER_TZ", c.server)
		settings := ""
		if c.session != "" {
			settings = " SETTINGS session_timezone = '" + c.session + "'"
		}
		// A row at 2024-01-31 23:59:59 UTC, inserted in the session.
		stmts := []string{"CREATE TABLE t (ts DateTime) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY ts",
			"INSERT INTO t SELECT toDateTime(1706745599)" + settings}
		run := func(q string) string {
			resp, err := runChdb(ctxT(t, time.Minute), python, chdbRequest{Path: t.TempDir(), Database: "tz", Statements: stmts, Queries: []string{q + settings}})
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSuffix(resp.Results[0], "\n")
		}
		month := run("SELECT partition FROM system.parts WHERE database = 'tz' AND table = 't'")
		zones := strings.Split(run(timeZonesSQL(run(serverTimezoneKnownSQL) != "0")), "\t")
		if len(zones) != 2 {
			t.Fatalf("server %s, session %q: time zones %q", c.server, c.session, zones)
		}
		err := checkZones(zones[0], zones[1])
		t.Logf("server %s, session %q: zones %q, the last second of January (UTC) stored in partition %s: %v", c.server, c.session, zones, month, err)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("server %s, session %q: refused: %v", c.server, c.session, err)
		case c.refused != "" && (!errors.Is(err, ErrServerTimeZone) || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("server %s, session %q: error %v, want one wrapping %v that says %s", c.server, c.session, err, ErrServerTimeZone, c.refused)
		}
	}
}
