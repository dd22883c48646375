package stream

import "testing"

// TestKeptWarmRules: warm state kept at a revoke is handed to the
// partition's next restore only when nothing else wrote the state since
// the revoke and the last assignment gives the partition to this
// instance; a new assignment drops the others' at once, and refuses
// theirs when their close comes after it.
func TestKeptWarmRules(t *testing.T) {
	t.Parallel()
	var k keptWarm
	w := &warmKeys{m: map[string]string{}}

	if k.put(0, k.generation(0), w) {
		t.Fatal("kept before any assignment")
	}
	k.retain([]int32{0, 1})

	// Revoked and given back: kept, taken once.
	if !k.put(0, k.generation(0), w) || k.take(0) != w || k.take(0) != nil {
		t.Fatal("the state of a partition given back is not handed over once")
	}

	// Another writer (a standby tail, the cleanup) between the revoke
	// and the close: refused; after the close: dropped.
	gen := k.generation(0)
	k.invalidate(0)
	if k.put(0, gen, w) {
		t.Fatal("kept although the state was written since the revoke")
	}
	if !k.put(0, k.generation(0), w) {
		t.Fatal("not kept")
	}
	k.invalidate(0)
	if k.take(0) != nil {
		t.Fatal("handed over although the state was written since it was kept")
	}

	// An assignment without the partition drops it, and refuses it when
	// the revoked instance closes after the assignment.
	gen1 := k.generation(1)
	if !k.put(0, k.generation(0), w) {
		t.Fatal("not kept")
	}
	k.retain([]int32{2})
	if k.count() != 0 || k.put(1, gen1, w) {
		t.Fatalf("%d kept, or kept for a partition the assignment moved", k.count())
	}

	// The session ends: nothing kept, nothing until an assignment.
	k.retain([]int32{2})
	if !k.put(2, k.generation(2), w) {
		t.Fatal("not kept")
	}
	k.clear()
	if k.count() != 0 || k.put(2, k.generation(2), w) {
		t.Fatal("kept past the session's end")
	}
}
