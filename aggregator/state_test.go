package aggregator

import (
	"reflect"
	"testing"
)

// TestStateDecoding: an aggregate state and a period marker decode to what
// was encoded, and every truncation of either inside its varints is an
// error, never a panic or a value read past the end.
func TestStateDecoding(t *testing.T) {
	s := &aggState{Revision: 3, Value: -7, Count: 1 << 40, FirstET: 1, LastET: 2, LatestET: 1 << 50, LatestID: "e-9"}
	b := s.encode()
	if got, err := decodeState(b); err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("decodeState(encode(%+v)) = %+v, %v", s, got, err)
	}
	// The LatestID is the tail: a cut inside it decodes (to a shorter ID);
	// a cut inside the varints must not.
	head := len(b) - len(s.LatestID)
	for n := 0; n < head; n++ {
		if got, err := decodeState(b[:n]); err == nil {
			t.Errorf("decodeState of %d of %d bytes = %+v, want an error", n, len(b), got)
		}
	}

	ps := &periodState{phase: phaseBook, decidedAt: 1 << 45, emitted: 300, chunks: 2, cursor: []byte("k")}
	v := ps.encode()
	if got, err := decodePeriodState(v); err != nil || !reflect.DeepEqual(got, ps) {
		t.Fatalf("decodePeriodState(encode(%+v)) = %+v, %v", ps, got, err)
	}
	// An empty marker is phase done (what earlier versions wrote).
	for n := 1; n < len(v)-len(ps.cursor); n++ {
		if got, err := decodePeriodState(v[:n]); err == nil {
			t.Errorf("decodePeriodState of %d of %d bytes = %+v, want an error", n, len(v), got)
		}
	}
}
