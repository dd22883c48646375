package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/entitlements"
)

// TestEntitlementsAppliesFromNotAScheduleRefused: applies_from is printed
// by get and not read by set. An operator who writes (or edits) it to a
// future time to schedule a record got a valid document that applied
// from when it was written, not from that time. A future applies_from
// other than the document's effective_from, which get never prints, is
// refused, pointing to effective_from; what get prints is accepted.
func TestEntitlementsAppliesFromNotAScheduleRefused(t *testing.T) {
	now := time.Now().UnixMilli()
	future := entitlements.FormatTime(now + 30*24*time.Hour.Milliseconds())
	past := entitlements.FormatTime(now - time.Hour.Milliseconds())
	for _, cmd := range [][]string{{"set", "acme"}, {"set-default"}} {
		args := append(append([]string{"entitlements"}, cmd...), "--validate")
		for _, doc := range []string{
			"plan: pro\napplies_from: \"" + future + "\"\n",
			"plan: pro\neffective_from: \"" + past + "\"\napplies_from: \"" + future + "\"\n",
		} {
			code, out, errs := run(t, doc, args...)
			if code != 1 || !strings.Contains(errs, "applies_from") || !strings.Contains(errs, "effective_from") {
				t.Errorf("%v of %q: exit %d, stdout %q, stderr %q; want exit 1, applies_from refused, naming effective_from", cmd, doc, code, out, errs)
			}
		}
		// As get prints them: a record in effect (applies_from its
		// broker time, past), a scheduled one (applies_from its
		// effective_from).
		for _, doc := range []string{
			"plan: pro\napplies_from: \"" + past + "\"\nwritten_at: \"" + past + "\"\n",
			"plan: pro\neffective_from: \"" + future + "\"\napplies_from: \"" + future + "\"\nwritten_at: \"" + past + "\"\n",
		} {
			if code, out, errs := run(t, doc, args...); code != 0 {
				t.Errorf("%v of %q: exit %d, stdout %q, stderr %q; want it valid", cmd, doc, code, out, errs)
			}
		}
	}
}
