package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/service"
)

// TestLoggerSamplesFloods: a stage logs every record it rejects, and a
// producer decides how many that is. 10,000 rejections in a burst write
// at most the first logFirst lines and one in logThereafter after them,
// the rest are counted as dropped, and another message still gets
// through.
func TestLoggerSamplesFloods(t *testing.T) {
	var out bytes.Buffer
	log, err := newLogger("info", &out)
	if err != nil {
		t.Fatal(err)
	}
	before := testutil.ToFloat64(service.LogEntriesDropped)
	const n = 10_000
	for i := range n {
		log.Info("record rejected", zap.String("reason", "invalid"), zap.Int("i", i))
	}
	log.Warn("something else")
	lines := strings.Count(out.String(), "\n")
	rejected := strings.Count(out.String(), `"msg":"record rejected"`)
	// The burst may straddle a second's boundary: then up to two firsts.
	if max := 2*logFirst + n/logThereafter; rejected > max || rejected < logFirst {
		t.Errorf("%d of %d rejections logged, want %d to %d", rejected, n, logFirst, max)
	}
	if !strings.Contains(out.String(), `"msg":"something else"`) || lines != rejected+1 {
		t.Errorf("another message was not logged (%d lines, %d of them rejections)", lines, rejected)
	}
	if dropped := testutil.ToFloat64(service.LogEntriesDropped) - before; dropped != float64(n-rejected) {
		t.Errorf("%v entries counted as dropped, want %d", dropped, n-rejected)
	}
}
