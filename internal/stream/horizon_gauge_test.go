package stream

import (
	"context"
	"testing"
)

// TestHorizonAttemptsGaugeOwnedByCurrentWriter: a restore of partition 0
// abandoned while its changelog fetches stay out of range leaves
// meterline_stream_horizon_attempts to the partition's current writer,
// which began while the abandoned one still fetched: a newer restore
// (the partition assigned here again, another epoch) or a standby tail
// (the partition revoked and made a standby here), each of which
// exported its own count: the abandoned restore's next copy, which ends
// without outlasting the horizon, does not delete it. And the revoke
// that abandons a restore ends the export of the restore's count, which
// no one else would delete.
func TestHorizonAttemptsGaugeOwnedByCurrentWriter(t *testing.T) {
	t.Parallel()
	const name = "meterline_stream_horizon_attempts"
	for _, tc := range []struct {
		name string
		// takeOver runs while the restore of epoch 1 waits to plan again,
		// rt.mu held: the partition's new writer begins and exports its
		// count, or (nil) the partition is only revoked.
		takeOver func(rt *Runtime)
		want     float64 // -1: not exported
	}{
		{"newer restore", func(rt *Runtime) {
			rt.parts[0] = &partState{epoch: 2}
			rt.m.horizonAttempts.WithLabelValues("0").Set(1)
		}, 1},
		{"standby", func(rt *Runtime) {
			delete(rt.parts, 0)
			rt.m.horizonAttempts.WithLabelValues("0").Set(maxHorizonAttempts)
		}, maxHorizonAttempts},
		{"revoked", nil, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, rt, reg, _, _, _ := newOutOfRangeRestore(t)
			abandonRestore(t, w, rt, func(waits int, cancel func()) {
				switch {
				case waits == 1 && tc.takeOver == nil:
					// Its count, as if its copies had outlasted the
					// horizon twice, then the revoke.
					rt.noteRestoreHorizon(0, 1, 2)
					rt.onRevoked(context.Background(), nil, map[string][]int32{w.input: {0}})
					cancel()
				case waits == 1:
					rt.mu.Lock()
					tc.takeOver(rt)
					rt.mu.Unlock()
				case waits == 3:
					cancel()
				}
			})
			v, ok := gaugeValue(t, reg, name)
			switch {
			case tc.want < 0 && ok:
				t.Errorf("%s is %v once the revoked restore ended; want it not exported", name, v)
			case tc.want >= 0 && (!ok || v != tc.want):
				t.Errorf("%s is %v (present %v) once the abandoned restore ended; want the current writer's %v", name, v, ok, tc.want)
			}
		})
	}
}
