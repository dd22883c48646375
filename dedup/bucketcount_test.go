package dedup

import (
	"strings"
	"testing"
	"time"
)

// TestValidateBucketCount: every live arrival bucket holds a Bloom filter
// of at least bloomFirstCap keys (80 KB), and every lookup tests each one,
// so the buckets a key's lifetime W + S spans bound a partition's memory
// and the cost of each event. With W = 35 days and a bucket of a minute
// (50,400 buckets), one partition fed an event every 2 minutes held 4 GB
// and took 1.9 ms an event (5 µs with the default bucket): Validate
// refuses a bucket that short, naming the shortest it takes.
func TestValidateBucketCount(t *testing.T) {
	for _, tc := range []struct {
		w, s, b time.Duration
		ok      bool
	}{
		{DefaultWindow, DefaultSkew, DefaultBucket, true},
		{DefaultWindow, DefaultSkew, time.Hour, true},
		{DefaultWindow, DefaultSkew, 50*time.Minute + 31*time.Second, true}, // the shortest the error names
		{2 * time.Hour, time.Minute, time.Minute, true},
		{DefaultWindow, DefaultSkew, time.Minute, false},
		{DefaultWindow, DefaultSkew, 50 * time.Minute, false},
	} {
		cfg := Config{Window: tc.w, Skew: tc.s, Bucket: tc.b, Keys: []Key{fuzzKey}}
		cfg.Stream.InstanceID = "a"
		cfg.EnsureDefaults()
		// The stream settings (brokers, state dir) are not the test's.
		err := cfg.Validate()
		refused := err != nil && strings.Contains(err.Error(), "dedup: bucket")
		if refused == tc.ok {
			t.Errorf("W %s, S %s, B %s: Validate = %v, want the bucket refused: %v", tc.w, tc.s, tc.b, err, !tc.ok)
		}
		if refused {
			t.Log(err)
		}
	}
}
