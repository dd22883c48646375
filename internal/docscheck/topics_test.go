package docscheck

import (
	"regexp"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/topics"
)

// TestTopicsTableMatchesSpecs: the table of docs/design.md, Topics, which
// says that `meterline topics create` creates "every topic below", lists
// every topic it creates (topics.Specs, by its default name) and no other,
// each with its cleanup policy first in "cleanup, retention" and
// LogAppendTime there exactly when the topic is created with it: a topic
// added to the code, or its timestamps changed, cannot be left out of the
// table an operator creates topics and ACLs from.
func TestTopicsTableMatchesSpecs(t *testing.T) {
	_, files, _ := docs(t)
	rows := map[string]string{}
	for _, l := range section(t, files, "docs/design.md", "Topics") {
		cells := strings.Split(l, " | ")
		if !strings.HasPrefix(l, "| `") || len(cells) < 5 {
			continue
		}
		rows[strings.Trim(strings.TrimPrefix(cells[0], "| "), "`")] = cells[3]
	}
	specs := topics.Specs(topics.DefaultNames(), topics.DefaultLayout())
	names := map[string]bool{}
	for _, s := range specs {
		names[s.Name] = true
		cell, ok := rows[s.Name]
		if !ok {
			t.Errorf("docs/design.md, Topics: no row of %s, which topics create creates", s.Name)
			continue
		}
		if policy := s.Configs["cleanup.policy"]; !strings.HasPrefix(cell, policy) {
			t.Errorf("docs/design.md, Topics, %s: %q does not begin with its cleanup.policy %s", s.Name, cell, policy)
		}
		logAppend := s.Configs["message.timestamp.type"] == "LogAppendTime"
		if strings.Contains(cell, "LogAppendTime") != logAppend {
			t.Errorf("docs/design.md, Topics, %s: %q, but the topic is created with message.timestamp.type %q", s.Name, cell, s.Configs["message.timestamp.type"])
		}
	}
	for name := range rows {
		if !names[name] {
			t.Errorf("docs/design.md, Topics: a row of %s, which topics create does not create", name)
		}
	}
	if len(specs) < 10 {
		t.Fatalf("topics.Specs gave %d topics", len(specs))
	}
}

// docTopicName matches what reads as a topic name in the docs:
// usage.<name> (with a version, .v2), meterline.keys and the changelogs,
// not a path that ends so ($.usage.input).
var docTopicName = regexp.MustCompile(`(?:^|[^.\w$])(usage\.[a-z_]+(?:\.v[0-9]+)?|meterline\.keys|meterline-[a-z]+-changelog(?:-v[0-9]+)?)\b`)

// TestDocTopicNamesExist: every topic name the docs give (but the
// changelog's) is one the commands create and print by default
// (topics.DefaultNames), so that an operator who greps the docs for the
// name a command printed, or runs a command the docs give, finds the
// topic: usage.deduped, for a topic created as usage.deduped.v2, is no
// topic of a cluster set up by `meterline topics create`.
func TestDocTopicNamesExist(t *testing.T) {
	_, files, _ := docs(t)
	n := topics.DefaultNames()
	names := map[string]bool{}
	for _, s := range topics.Specs(n, topics.DefaultLayout()) {
		names[s.Name] = true
	}
	found := 0
	for name, c := range files {
		if name == "CHANGELOG.md" {
			continue
		}
		for i, l := range strings.Split(c, "\n") {
			for _, m := range docTopicName.FindAllStringSubmatch(l, -1) {
				found++
				if !names[m[1]] {
					t.Errorf("%s:%d: %s is no topic meterline creates (topics.DefaultNames): write the name it prints", name, i+1, m[1])
				}
			}
		}
	}
	if found < 100 || !names[n.DedupedTopic()] {
		t.Fatalf("%d topic names in the docs; %v", found, names)
	}
}
