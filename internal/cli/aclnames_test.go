package cli

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/topics"
)

// TestDocumentedACLTopicsAreDefaultNames: every topic a kafka-acls.sh
// command of docs/operations.md names is one of the default topic names,
// so that an operator who pastes them grants the topics the stages use
// (the names change with a key scheme: usage.deduped.v2).
func TestDocumentedACLTopicsAreDefaultNames(t *testing.T) {
	known := map[string]bool{}
	for _, s := range topics.Specs(topics.DefaultNames(), topics.DefaultLayout()) {
		known[s.Name] = true
	}
	n := 0
	for user, specs := range documentedACLs(t) {
		for _, s := range specs {
			for _, tp := range s.topics {
				n++
				if s.prefixed {
					if !prefixOfSome(tp, known) {
						t.Errorf("User:%s: prefix %q matches no default topic name: %s", user, tp, s.line)
					}
					continue
				}
				if !known[tp] {
					t.Errorf("User:%s: topic %q is not a default topic name: %s", user, tp, s.line)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no topic in the documented ACLs")
	}
}

func prefixOfSome(prefix string, names map[string]bool) bool {
	for n := range names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}
