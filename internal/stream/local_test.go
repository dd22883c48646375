package stream

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestLocalCommitsToTheStore: a Local's Commit leaves in its store what a
// committed transaction leaves in Pebble (the writes, the deletes, the
// next input offset of each topic), and a Process after it sees them.
func TestLocalCommitsToTheStore(t *testing.T) {
	l, err := NewLocal(kvProc{}, 3, "in")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Process([]*kgo.Record{{Topic: "in", Offset: 7, Key: []byte("a"), Value: []byte("1")},
		{Topic: "in", Offset: 8, Key: []byte("b"), Value: []byte("2")}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Process([]*kgo.Record{{Topic: "side", Offset: 41, Key: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	if v, ok, _ := l.rt.store.Get(3, []byte("a")); ok {
		t.Fatalf("a is %q in the store before Commit", v)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	c := Config{InputTopic: "in"}
	for k, want := range map[string]string{"a": "1", "b": "", c.inputOffsetKey("in"): string(encodeOffset(9)),
		c.inputOffsetKey("side"): string(encodeOffset(42))} {
		v, ok, err := l.rt.store.Get(3, []byte(k))
		if err != nil || ok != (want != "") || string(v) != want {
			t.Errorf("store %q: %q %v %v, want %q", k, v, ok, err, want)
		}
	}
}
