package sink

import (
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestMain removes the meterline binary that the crash and outage tests run
// as child processes (testenv.Meterline builds it once, on the first test
// that does not skip).
func TestMain(m *testing.M) { testenv.Main(m) }
