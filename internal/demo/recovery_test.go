package demo

import (
	"strings"
	"testing"
)

// TestRecoveryEnded: the report of a run stopped before dedup's crash
// point says that this run had no crash, not that one is still to come.
func TestRecoveryEnded(t *testing.T) {
	replayed := func() float64 { return 12 }
	r := &recovery{replayed: replayed}
	if got := r.ended(); strings.Contains(got, "will be killed") || !strings.Contains(got, "no crash in this run") {
		t.Errorf("stopped before arming: %q", got)
	}
	r.armed("stream.during-apply")
	if got := r.ended(); !strings.Contains(got, "no crash in this run") || !strings.Contains(got, "stream.during-apply") {
		t.Errorf("stopped while armed: %q", got)
	}
	r.crashed(nil)
	if got := r.ended(); got != r.String() {
		t.Errorf("after the crash: %q, want the live line %q", got, r.String())
	}
}
