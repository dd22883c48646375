package ingest

import (
	"fmt"
	"unicode/utf8"

	"github.com/meterline/meterline/schemas"
)

// checkText refuses an event whose raw bytes are not valid UTF-8
// (DESIGN §8): a JSON decoder would turn each bad byte into U+FFFD, so
// that two different customers or IDs could become one.
func checkText(raw []byte) *fieldError {
	if utf8.Valid(raw) {
		return nil
	}
	for i := 0; i < len(raw); {
		r, n := utf8.DecodeRune(raw[i:])
		if r == utf8.RuneError && n == 1 {
			return &fieldError{"event", schemas.ReasonInvalid, fmt.Sprintf("is not valid UTF-8 (byte 0x%02x at offset %d)", raw[i], i)}
		}
		i += n
	}
	return nil
}
