package stream

import (
	"strings"
	"testing"
)

// TestMismatchHintNamesRecreatedInput: a state that consumed an input
// partition up to some offset, and a group with no committed offset on
// it, is also what an input topic deleted and created again leaves (the
// group's offsets go with the topic). The hint must say so and warn
// against setting the offset back to the state's: on the new log that
// offset skips its first records uncounted.
func TestMismatchHintNamesRecreatedInput(t *testing.T) {
	rt := &Runtime{cfg: Config{InputTopic: "usage.events", ChangelogTopic: "dedup-changelog"}}
	rt.cfg.Group = "meterline-dedup"
	hint := rt.mismatchHint("usage.events", 500, -1)
	for _, want := range []string{"usage.events", "deleted and created again", "do not set"} {
		if !strings.Contains(hint, want) {
			t.Errorf("hint %q does not say %q", hint, want)
		}
	}
}
