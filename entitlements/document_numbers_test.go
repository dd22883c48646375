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

// A rate whose number does not fit 64 bits is refused as out of range,
// not as having too many digits (2^63 has as many as the largest rate).
func TestRateOutOfRangeSaysSo(t *testing.T) {
	for s, want := range map[string]string{
		"9223372036854775808":   `"9223372036854775808" is out of range: a rate's numbers are 64-bit integers`,
		"9223372036854775807.5": `"9223372036854775807.5" is out of range: a rate's numbers are 64-bit integers`,
		"0.0000000000000000001": `"0.0000000000000000001" has too many digits`,
	} {
		if _, _, err := ParseRate(s); err == nil || err.Error() != want {
			t.Errorf("ParseRate(%s) = %v, want %s", s, err, want)
		}
	}
	if m, p, err := ParseRate("9223372036854775807"); err != nil || m != 9223372036854775807 || p != 1 {
		t.Errorf("ParseRate(MaxInt64) = %d/%d, %v", m, p, err)
	}
}
