package cli

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/meterline/meterline/internal/testenv"
)

// zeroMeaning is a help text that says what 0 of its flag means: "0: one
// per transaction", "0 skips it".
var zeroMeaning = regexp.MustCompile(`(^|[^0-9.-])0(s|ms)?(:| [a-z])`)

// TestNumericFlagsRefuseZero: a stage's Config reads a zero field as
// "the default" (EnsureDefaults), so a numeric flag set to 0 would run
// silently with its default (--standby-max-warmups 0 with 2, --commit-
// interval 0 with 100ms). Every numeric flag with a non-zero default of a
// command that has --validate is refused at 0 with exit status 2, naming
// the flag, unless it is tagged zero; a flag tagged zero says in its help
// what 0 means.
func TestNumericFlagsRefuseZero(t *testing.T) {
	var c CLI
	k, err := Parser(&c, IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	keys := testenv.DedupKeysFile(t)
	checked := 0
	for _, node := range k.Model.Leaves(true) {
		if node.Type != kong.CommandNode {
			continue
		}
		var flags []*kong.Flag
		validate, instance := false, false
		for _, group := range node.AllFlags(true) {
			for _, f := range group {
				validate = validate || f.Name == "validate"
				instance = instance || f.Name == "instance-id"
				flags = append(flags, f)
			}
		}
		for _, f := range flags {
			if f.Tag.Has("zero") {
				if !zeroMeaning.MatchString(f.Help) {
					t.Errorf("meterline %s --%s is tagged zero, but its help does not say what 0 means: %s", node.Path(), f.Name, f.Help)
				}
				continue
			}
			if !validate || strings.HasPrefix(node.Path(), "entitlements ") || !numericNonZero(f.Target.Type(), f.Default) {
				continue
			}
			checked++
			args := append(strings.Fields(node.Path()), "--"+f.Name, "0", "--validate")
			if instance {
				args = append(args, "--instance-id", "a")
			}
			if node.Path() == "dedup" || node.Path() == "run" {
				args = append(args, "--dedup-keys-file", keys)
			}
			want := "--" + f.Name + " must not be 0"
			if code, out, errOut := run(t, "", args...); code != 2 || !strings.Contains(errOut, want) {
				t.Errorf("meterline %s --%s 0 (default %s): exit %d, want 2 saying %q\n%s%s", node.Path(), f.Name, f.Default, code, want, out, errOut)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("%d flags checked: the walk misses numeric flags", checked)
	}
	// 0 where the help says what it means is honoured, and the flag's
	// default still runs.
	for _, args := range [][]string{{"aggregate", "--balance-interval", "0"}, {"aggregate"}, {"dedup", "--dedup-keys-file", keys}} {
		if code, out, errOut := run(t, "", append(args, "--validate", "--instance-id", "a")...); code != 0 {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
}
