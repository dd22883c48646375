package sink

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
)

// TestVerifyLogsNoLinePerCheck: `meterline verify` prints a line per table
// and month it compares (its report); its log at info says nothing of each
// again (a year of months times the derived tables).
func TestVerifyLogsNoLinePerCheck(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	insertLedgerRows(ctx, t, conn)
	core, logs := observer.New(zapcore.InfoLevel)
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202601, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Months) == 0 {
		t.Fatal("verify compared no month")
	}
	if n := logs.FilterMessage("verify").Len(); n != 0 {
		t.Errorf("%d info lines for %d checks the report prints", n, len(rep.Months))
	}
}
