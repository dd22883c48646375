package topics

import (
	"context"
	"strings"
	"testing"
)

// TestCreateRefusesUnnamedSpec: a spec without a name (a Names literal
// missing a newer topic) is an error at once, not a wait for metadata
// that never shows the topic.
func TestCreateRefusesUnnamedSpec(t *testing.T) {
	n := DefaultNames()
	n.Keys = ""
	_, err := Create(context.Background(), nil, Specs(n, Layout{Partitions: 1}), -1)
	if err == nil || !strings.Contains(err.Error(), "no topic name") {
		t.Fatalf("Create with an unnamed spec: %v, want an error naming it", err)
	}
}
