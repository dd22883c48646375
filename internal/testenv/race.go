//go:build race

package testenv

// raceEnabled: the test binary runs under the race detector (go test
// -race), and so do the meterline children Meterline builds.
const raceEnabled = true
