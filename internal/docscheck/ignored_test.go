package docscheck

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// writtenPath matches what a documented command writes below its working
// directory: dedup's key ring (a secret: dedup-key --out) and a stage's
// Pebble state (--state-dir).
var writtenPath = regexp.MustCompile(`(?:dedup-key --out|--state-dir) ([^\s&;|]+)`)

// TestDocsOutputsIgnoredByGit: a file or directory that a documented
// command block writes at a relative path (a newcomer runs it in a clone)
// is ignored by git, so that `git add -A` afterwards commits neither the
// dedup key ring's secret nor a stage's state.
func TestDocsOutputsIgnoredByGit(t *testing.T) {
	root, _, blocks := docs(t)
	n := 0
	for _, b := range blocks {
		if !b.shell() {
			continue
		}
		for _, m := range writtenPath.FindAllStringSubmatch(b.text, -1) {
			p := m[1]
			if filepath.IsAbs(p) || p[0] == '$' || p[0] == '<' {
				continue
			}
			n++
			cmd := exec.Command("git", "check-ignore", "-q", "--no-index", p)
			cmd.Dir = root
			if err := cmd.Run(); err != nil {
				t.Errorf("%s: %s writes %s, which .gitignore does not ignore (git check-ignore: %v)", b.where(), m[0], p, err)
			}
		}
	}
	if n < 3 {
		t.Fatalf("found %d relative paths written by documented commands", n)
	}
}
