// Package clip cuts the values a producer sent that an error repeats, so
// that an error never grows with its input. It is shared by the producer
// package (ParseJSON) and the HTTP ingest, which imports producer.
package clip

import "unicode/utf8"

// Echo is the bytes of a value that an error's reason repeats.
const Echo = 64

// To is s cut to at most n bytes at the start of a character, then "…".
// A string of at most n bytes is returned as it is.
func To(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}
