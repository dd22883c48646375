package cli

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/alecthomas/kong"
)

var (
	// helpFlagRef is a flag a help text names: --name, or --no-name.
	helpFlagRef = regexp.MustCompile(`--([a-z][a-z0-9-]*[a-z0-9])`)
	// otherCommandFlags is a command line of another command in a help
	// text ("meterline dedup-key --out FILE"): its flags are that
	// command's.
	otherCommandFlags = regexp.MustCompile(`meterline( [a-z][a-z-]*)+( --[a-z][a-z0-9-]*( [A-Z]+)?)+`)
)

// TestHelpNamesOwnFlags: every flag a command's help text names is a flag
// of that command, as the user types it there. A flag group embedded with
// a prefix (`meterline run`'s --ingest-*, --sink-*) must not send the
// reader to the unprefixed name, which that command refuses. A flag named
// in a command line of another command (`meterline dedup-key --out FILE`)
// is that command's.
func TestHelpNamesOwnFlags(t *testing.T) {
	var c CLI
	k, err := Parser(&c, IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range k.Model.Leaves(true) {
		if node.Type != kong.CommandNode {
			continue
		}
		own := map[string]bool{"help": true}
		for _, group := range node.AllFlags(false) {
			for _, f := range group {
				own[f.Name] = true
				if f.Tag != nil && f.Tag.Negatable != "" {
					own["no-"+f.Name] = true
				}
			}
		}
		for _, group := range node.AllFlags(false) {
			for _, f := range group {
				text := otherCommandFlags.ReplaceAllString(f.Help, "")
				for _, m := range helpFlagRef.FindAllStringSubmatch(text, -1) {
					if !own[m[1]] {
						t.Errorf("meterline %s --help: --%s says %q, but the command has no flag --%s", node.Path(), f.Name, f.Help, m[1])
					}
				}
			}
		}
	}
}

// TestOtherCommandFlagsPattern: the command lines of other commands that
// TestHelpNamesOwnFlags leaves out, and only those.
func TestOtherCommandFlagsPattern(t *testing.T) {
	for in, want := range map[string]string{
		"Make one with: meterline dedup-key --out FILE (x).":                           "Make one with:  (x).",
		"(meterline aggregate --entitlements, meterline run --aggregate-entitlements)": "(, )",
		"PEM certificate; with --tls-key-file.":                                        "PEM certificate; with --tls-key-file.",
	} {
		if got := otherCommandFlags.ReplaceAllString(in, ""); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}
