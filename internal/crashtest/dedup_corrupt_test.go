package crashtest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRealDedupCorruptState kills an instance (SIGKILL), corrupts the
// first 64 bytes of its state's current MANIFEST and restarts it. Pebble
// reports the state corrupt (malformed manifest file); the instance must
// move it aside to dedup-a.corrupt, say so and count it, restore
// everything from the changelog and stay exactly-once, where it used to
// fail every restart the same way.
func TestRealDedupCorruptState(t *testing.T) {
	s := newSuite(t)
	stateDir := filepath.Join(s.Dir, "state")
	dir := filepath.Join(stateDir, "dedup-a")
	const n = 3000
	a := s.start("a", stateDir, opts{})
	s.send(seq(0, n))
	s.send(seq(0, n/3))
	s.waitCaughtUp(a)
	a.Kill(t)
	manifest := corruptManifest(t, dir)

	a2 := s.start("a", stateDir, opts{})
	s.send(seq(0, n))
	s.send(seq(n, n+300))
	s.waitCaughtUp(a2)
	s.checkExactlyOnce()

	var warned bool
	for _, l := range a2.LogLines() {
		if !strings.HasPrefix(l.Msg, "the stage's state is corrupt") {
			continue
		}
		warned = true
		if l.Fields["state_dir"] != dir || l.Fields["corrupt_copy"] != dir+".corrupt" ||
			!strings.Contains(l.Fields["error"].(string), "malformed manifest file") {
			t.Errorf("the warning does not name %s, %s.corrupt and Pebble's error: %v", dir, dir, l.Fields)
		}
	}
	if !warned {
		t.Errorf("%s logged no warning of the corrupt state", a2.Name())
	}
	if _, err := os.Stat(filepath.Join(dir+".corrupt", manifest)); err != nil {
		t.Errorf("the corrupt state is not kept aside: %v", err)
	}
	m, err := a2.Metrics()
	if err != nil {
		t.Fatalf("scraping %s: %v", a2.Name(), err)
	}
	if got := m.Sum("meterline_stream_state_rebuilt_total"); got != 1 {
		t.Errorf("meterline_stream_state_rebuilt_total = %v, want 1", got)
	}
	rec, _ := a2.Replayed()
	t.Logf("restored %d changelog records (metric %v)", rec, m.Sum("meterline_stream_restore_records_total"))
	// Every identity accepted before the kill is one changelog record.
	if got := m.Sum("meterline_stream_restore_records_total"); got < n {
		t.Errorf("meterline_stream_restore_records_total = %v, want ≥ %d (one per identity stored before the kill)", got, n)
	}
}

// corruptManifest flips the first 64 bytes of the newest MANIFEST of the
// Pebble state in dir and returns its name.
func corruptManifest(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "MANIFEST-") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		t.Fatalf("no MANIFEST in %s", dir)
	}
	slices.Sort(names)
	name := names[len(names)-1]
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range min(64, len(b)) {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return name
}
