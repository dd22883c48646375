package entitlements

import (
	"strings"
	"testing"
)

// A number that is not a 64-bit integer is reported once, as what it is:
// not also as a 0 the document never holds ("must be positive (got 0)").
func TestUnreadableNumberReportedOnce(t *testing.T) {
	d, err := ParseDocument([]byte(`
caps:
  api_calls: {limit: 18446744073709551615}
grants:
  half: {amount: 1.5}
  big: {amount: 9223372036854775808}
  fine: {amount: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Record("acme", nil)
	if err == nil {
		t.Fatal("Record accepted the document")
	}
	got := err.Error()
	for _, want := range []string{
		`caps.api_calls.limit: not a 64-bit integer ("18446744073709551615")`,
		`grants.half.amount: not a 64-bit integer ("1.5")`,
		`grants.big.amount: not a 64-bit integer ("9223372036854775808")`,
		"grants.fine.amount: must be positive (got 0)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the errors do not say %q:\n%s", want, got)
		}
	}
	for _, wrong := range []string{
		"caps.api_calls.limit: must be positive",
		"grants.half.amount: must be positive",
		"grants.big.amount: must be positive",
	} {
		if strings.Contains(got, wrong) {
			t.Errorf("the errors say %q of a number the document does not hold:\n%s", wrong, got)
		}
	}
}
