package ingest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem is the body of every error response: RFC 9457 problem details,
// served as application/problem+json. Type is "urn:meterline:problem:"
// followed by a stable code (invalid-events, unauthorized, forbidden,
// too-large, unsupported-media-type, rate-limited, unavailable, ...);
// Errors lists each refused event of a 400 or 403.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Errors names each bad event of the request: its index in the
	// request (0-based, in the order the events were sent), the field at
	// fault and a stable reason code.
	Errors []EventError `json:"errors,omitempty"`
	// RetryAfter, in seconds, repeats the Retry-After header of a 429 or
	// 503.
	RetryAfter int `json:"retry_after,omitempty"`
}

// EventError is one refused event.
type EventError struct {
	Index int `json:"index"`
	// Field is the event's field at fault, as the request names it
	// ("subject", "data.tokens", "quantity"); "event" for the whole event.
	Field string `json:"field"`
	// Code is a stable reason code: invalid, oversized, in_future,
	// unknown_event_type, unknown_meter, out_of_scope.
	Code string `json:"code"`
	// Reason says what is wrong, in words.
	Reason string `json:"reason"`
}

// Reason codes of EventError besides those of docs/design.md, Bad input
// (invalid, oversized, in_future, unknown_meter).
const (
	// CodeUnknownEventType: no meter declares the CloudEvent's type, so it
	// would become no usage at all.
	CodeUnknownEventType = "unknown_event_type"
	// CodeOutOfScope: the key may not write this customer (subject) or
	// meter (403).
	CodeOutOfScope = "out_of_scope"
)

// problemTypePrefix starts every Problem.Type.
const problemTypePrefix = "urn:meterline:problem:"

// problemTypes are the codes of every problem the ingest answers with
// (writeProblem's code): the problem label of
// meterline_ingest_refused_requests_total.
var problemTypes = []string{
	"forbidden", "invalid-events", "kafka-refused", "malformed", "method-not-allowed", "not-authorized", "not-found",
	"overloaded", "quota-exhausted", "rate-limited", "too-large", "too-many-in-flight", "unauthorized", "unavailable",
	"unreadable-body", "unsupported-media-type",
}

func writeProblem(w http.ResponseWriter, status int, code, title, detail string, errs []EventError, retryAfter time.Duration) {
	p := Problem{Type: problemTypePrefix + code, Title: title, Status: status, Detail: detail, Errors: errs}
	if sw, ok := w.(*statusWriter); ok {
		sw.problem = code // for meterline_ingest_refused_requests_total
	}
	if retryAfter > 0 {
		secs := int((retryAfter + time.Second - 1) / time.Second)
		p.RetryAfter = secs
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="meterline"`)
	}
	b, _ := json.Marshal(p) // a Problem always marshals
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
