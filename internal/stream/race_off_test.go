//go:build !race

package stream

// raceDetector: the tests run under Go's race detector, which slows the
// runtime several times over (docs/testing.md, The race detector).
const raceDetector = false
