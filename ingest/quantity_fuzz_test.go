package ingest

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"
)

// FuzzDecimalQuantity: decimalQuantity, which reads the quantity of every
// CloudEvent (the text of a JSON number, or a numeric string, that the
// client wrote), accepts exactly the JSON numbers whose value × 10^scale
// is an integer in [0, 2^63), and returns that integer (math/big is the
// oracle). Everything else is refused with a reason.
func FuzzDecimalQuantity(f *testing.F) {
	for _, s := range []string{"0", "12", "1e3", "1.5e1", "12.000", "-0", "1.25", "1000e-3", "1.5", "-1",
		"9223372036854775807", "9223372036854775808", "1e19", "1e999999999", "1e-999999999", "1E+02", "10e-01",
		"", "01", "1.", "0x10", "+1", "1e", "0.0e5", "5e-0"} {
		for _, scale := range []uint8{0, 2, 3} {
			f.Add(s, scale)
		}
	}
	f.Fuzz(func(t *testing.T, s string, scaleByte uint8) {
		scale := int(scaleByte % 10)
		got, why := decimalQuantity(s, scale)
		if why != "" && got != 0 {
			t.Fatalf("decimalQuantity(%q, %d) = %d with reason %q", s, scale, got, why)
		}
		// A JSON number, and only one, is a decimal here.
		isNumber := s != "" && (s[0] == '-' || isDigit(s[0])) && isDigit(s[len(s)-1]) && json.Valid([]byte(s))
		if !isNumber {
			if why == "" {
				t.Fatalf("decimalQuantity(%q, %d) = %d, accepting what is not a JSON number", s, scale, got)
			}
			return
		}
		checkOracle(t, "decimalQuantity", s, scale, got, why)
	})
}

// FuzzNumericString: a quantity sent as a string is taken exactly when
// OpenMeter's strconv.ParseFloat takes it as a finite decimal (no
// hexadecimal, no _) whose value × 10^scale is an integer in [0, 2^63),
// and is then that integer (math/big is the oracle).
func FuzzNumericString(f *testing.F) {
	for _, s := range []string{"+5", "0012", ".5", "5.", "+.5e1", "00", "-0", "0x1p4", "1_000", "inf", "NaN", " 5",
		"+", ".", "5.e3", "-.0", "1e400", "+9223372036854775807", "0009223372036854775807", "1.2.3", "+-1"} {
		for _, scale := range []uint8{0, 3} {
			f.Add(s, scale)
		}
	}
	f.Fuzz(func(t *testing.T, s string, scaleByte uint8) {
		scale := int(scaleByte % 10)
		n, why := numericString(s)
		got := int64(0)
		if why == "" {
			got, why = decimalQuantity(n, scale)
		}
		fl, err := strconv.ParseFloat(s, 64)
		isDecimal := (err == nil || errors.Is(err, strconv.ErrRange)) && !strings.ContainsAny(s, "_xXnN") && !math.IsNaN(fl)
		if !isDecimal {
			if why == "" {
				t.Fatalf("%q (scale %d) taken as %d; ParseFloat: %v", s, scale, got, err)
			}
			return
		}
		checkOracle(t, "numericString", s, scale, got, why)
	})
}

// checkOracle fails the test when what the function fn made of s (got,
// or the refusal why) is not its exact value × 10^scale as an integer in
// [0, 2^63), or a refusal of any other value. The oracle is math/big,
// unless the exponent is too large for it to be quick (no 64-bit
// quantity has one). s is a decimal: a JSON number, or one with a sign +,
// leading zeros or no digit on one side of its decimal point.
func checkOracle(t *testing.T, fn, s string, scale int, got int64, why string) {
	t.Helper()
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(s[i+1:])
		if err != nil || e > 1000 || e < -1000 {
			return
		}
		mant, exp = s[:i], e
	}
	r, ok := new(big.Rat).SetString(strings.TrimPrefix(mant, "+"))
	if !ok {
		t.Fatalf("math/big refuses the mantissa %q of %q", mant, s)
	}
	shift := exp + scale
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(shift, -shift))), nil)
	if shift >= 0 {
		r.Mul(r, new(big.Rat).SetInt(p))
	} else {
		r.Quo(r, new(big.Rat).SetInt(p))
	}
	accept := r.Sign() >= 0 && r.IsInt() && r.Num().Cmp(big.NewInt(math.MaxInt64)) <= 0
	switch {
	case accept && (why != "" || got != r.Num().Int64()):
		t.Fatalf("%s(%q, %d) = %d, %q; want %s", fn, s, scale, got, why, r.Num())
	case !accept && why == "":
		t.Fatalf("%s(%q, %d) = %d; want it refused (%s)", fn, s, scale, got, r.RatString())
	}
}
