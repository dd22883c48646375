package demo

import (
	"math/rand"
	"testing"
	"time"
)

// TestArmCrashLeavesRngToGenerator: once armCrash returns, the generator
// draws from the same rng while the crash's timer fires; the timer must not
// draw from it then (a rand.Rand is not safe for concurrent use; the race
// detector reports it under `go test -race`).
func TestArmCrashLeavesRngToGenerator(t *testing.T) {
	d := &demoRun{cfg: Config{Duration: 10 * time.Millisecond}, rec: &recovery{}}
	rng := rand.New(rand.NewSource(1))
	crashed := make(chan string, 1)
	timer := d.armCrash(rng, func(point string) { crashed <- point })
	defer timer.Stop()
	var point string
	for drawn := false; !drawn; {
		rng.Float64() // the generator, as it runs
		select {
		case point = <-crashed:
			drawn = true
		default:
		}
	}
	d.rec.mu.Lock()
	defer d.rec.mu.Unlock()
	if point == "" || d.rec.point != point {
		t.Fatalf("crashed at %q, recovery armed at %q", point, d.rec.point)
	}
}
