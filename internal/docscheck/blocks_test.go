package docscheck

import "testing"

// TestParseBlocksInListItems: a fenced block indented in a list item is a
// block like any other, its annotation read the same way and its lines
// without the item's indentation; a reader pastes it as it is, so the
// checks must see it too.
func TestParseBlocksInListItems(t *testing.T) {
	doc := "- **A step.** Run:\n\n" +
		"  <!-- docs-check: tested-by TestX -->\n" +
		"  ```sh\n" +
		"  meterline topics check \\\n" +
		"    --partitions 4\n" +
		"  ```\n\n" +
		"  then go on.\n\n" +
		"```sh\nmeterline version\n```\n"
	bs, err := parseBlocks("doc.md", doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 {
		t.Fatalf("%d blocks, want 2: %+v", len(bs), bs)
	}
	b := bs[0]
	if b.line != 4 || b.lang != "sh" || b.ann == nil || b.ann.kind != kindTestedBy {
		t.Errorf("the indented block: %+v, want line 4, sh, tested-by", b)
	}
	if want := "meterline topics check \\\n  --partitions 4\n"; b.text != want {
		t.Errorf("the indented block's text %q, want %q", b.text, want)
	}
	if bs[1].text != "meterline version\n" || bs[1].ann != nil {
		t.Errorf("the block after it: %+v", bs[1])
	}
	if _, err := parseBlocks("doc.md", "- x\n\n  ```sh\n  meterline version\n```\n"); err == nil {
		t.Error("a block indented in a list item and closed outside it parsed")
	}
}
