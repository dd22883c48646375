package entitlements

import (
	"strings"
	"testing"
)

// TestRecordVersion: a version reads back as printed; anything but two
// non-negative decimal integers around a slash is refused, and so is a
// version in a document of the default plan (written to every partition,
// unconditionally).
func TestRecordVersion(t *testing.T) {
	v, err := ParseRecordVersion("3/1842")
	if err != nil || v != (RecordVersion{Partition: 3, Offset: 1842}) || v.String() != "3/1842" {
		t.Fatalf("ParseRecordVersion(3/1842) = %v, %v", v, err)
	}
	for _, bad := range []string{"", "3", "3/", "/1842", "-1/5", "3/-5", "+3/5", "3/+5", "3/18/42", "3.0/1842", "2147483648/1", " 3/1842", "0x3/1"} {
		if v, err := ParseRecordVersion(bad); err == nil {
			t.Errorf("ParseRecordVersion(%q) = %v, want an error", bad, v)
		}
	}
	d, err := ParseDocument([]byte("customer: acme\nversion: 3/1842\nplan: pro\n"))
	if err != nil || d.Version != "3/1842" {
		t.Fatalf("ParseDocument: %+v, %v", d, err)
	}
	if _, err := d.Record("acme", nil); err != nil {
		t.Errorf("Record with version 3/1842: %v", err)
	}
	d.Version = "3-1842"
	if _, err := d.Record("acme", nil); err == nil || !strings.Contains(err.Error(), "version: not a version such as 3/1842") {
		t.Errorf("Record with version 3-1842: %v, want a version error", err)
	}
	d.Customer, d.Version = "", "3/1842"
	if _, err := d.Record("", nil); err == nil || !strings.Contains(err.Error(), "version: the default plan is written unconditionally") {
		t.Errorf("default plan with a version: %v, want a version error", err)
	}
}
