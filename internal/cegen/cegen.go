// Package cegen writes batches of CloudEvents as a client posts them to
// the HTTP ingest (application/cloudevents-batch+json): the input of
// `meterline bench ingest` and of the ingest's own benchmarks and tests.
package cegen

import "encoding/json"

// Event is one CloudEvent 1.0 in the JSON format, with JSON data.
type Event struct {
	SpecVersion string         `json:"specversion"`
	ID          string         `json:"id"`
	Source      string         `json:"source"`
	Type        string         `json:"type"`
	Subject     string         `json:"subject"`
	Time        string         `json:"time"`
	Data        map[string]any `json:"data"`
}

// Batch returns the JSON array of the n events event(0) ... event(n-1),
// each with specversion 1.0. Data must hold only values encoding/json
// marshals (strings, numbers, booleans, maps and slices of them).
func Batch(n int, event func(i int) Event) []byte {
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = event(i)
		evs[i].SpecVersion = "1.0"
	}
	b, _ := json.Marshal(evs) // plain values always marshal
	return b
}
