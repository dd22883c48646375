package ingest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// request is one request on its way through the handler.
type request struct {
	kind     string
	binary   string // binaryModeHint of the request: "" but for a CloudEvent in binary content mode
	key      *Key
	tenant   *Tenant
	received time.Time
	// Monotonic instants of the request's stages (Timings): its start,
	// the body read, the records ready, handed to the producer, and
	// acknowledged.
	start, read, ready, enqueued, acked time.Time
	// bufs, slab and recs are reused from request to request (release).
	bufs    *buffers
	slab    []kgo.Record
	recs    []*kgo.Record
	encoded []byte // the records' keys and values
	body    []byte
	attrs   []ceAttrs // the CloudEvents' attributes (fast path)
	inputs  int       // events in the request
	usages  []usage   // usage events, in input order
	props   []schemas.Property
	errs    []EventError
	denied  []EventError
	scratch mapScratch
}

func (s *Server) endpoint(kind string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := &request{kind: kind, start: time.Now(), received: s.cfg.Clock(), binary: binaryModeHint(r, kind)}
		rw := &statusWriter{ResponseWriter: w}
		// A chunked request's connection is closed after its answer. A
		// request with both Transfer-Encoding and Content-Length may be a
		// smuggling attempt, and RFC 9112 (6.1) requires the connection
		// closed after it; net/http keeps it (golang/go#80942) and drops
		// the Content-Length before the handler could tell. Clients send
		// a body they hold whole with a Content-Length.
		if len(r.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
		}
		tenant := s.serve(rw, r, req)
		req.release(req.enqueued.IsZero() || !req.acked.IsZero())
		// The answer goes out now; the bookkeeping below (metrics, Trace)
		// then never delays it. net/http would send it only once the
		// handler returns.
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		end := time.Now()
		s.metrics.observe(kind, tenant, rw.status, rw.problem, end.Sub(req.start))
		if !req.acked.IsZero() && rw.status < 300 {
			t := Timings{Read: req.read.Sub(req.start), Parse: req.ready.Sub(req.read), Enqueue: req.enqueued.Sub(req.ready),
				Ack: req.acked.Sub(req.enqueued), Total: end.Sub(req.start)}
			s.metrics.stages(t)
			if s.cfg.Trace != nil {
				s.cfg.Trace(t)
			}
		}
	})
}

// Timings are the stages of one successful request (Config.Trace and
// meterline_ingest_stage_duration_seconds), to find where its latency
// goes. Each is measured on the monotonic clock.
type Timings struct {
	// Read: from the handler's start to the whole body read.
	Read time.Duration
	// Parse: the parse, mapping, validation and encoding of every event,
	// the key's scope and rate, and the quota gate.
	Parse time.Duration
	// Enqueue: handing every record to the producer (it blocks only when
	// the producer's buffer is full).
	Enqueue time.Duration
	// Ack: from the last record handed over to the last one acknowledged
	// by Kafka (linger, the produce request, replication to the ISR).
	Ack time.Duration
	// Total: from the handler's start to the answer written.
	Total time.Duration
}

// serve handles one request and returns the tenant for the metrics
// ("" when no key was accepted).
func (s *Server) serve(w *statusWriter, r *http.Request, req *request) string {
	kind := req.kind
	// Before the key: keys not loaded, or stale, are not known wrong.
	if detail, retry, err := s.keysUnavailable(); err != nil {
		unread(w)
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "Service unavailable", detail, nil, retry)
		return ""
	}
	// One key: a request of two Authorization lines is not read by one
	// of them, which a proxy in front may not have taken (RFC 9110 makes
	// it a singleton field).
	if len(r.Header.Values("Authorization")) > 1 {
		unread(w)
		writeProblem(w, http.StatusUnauthorized, "unauthorized", "Unauthorized", "more than one Authorization header: send one key", nil, 0)
		return ""
	}
	token := bearer(r)
	if token == "" {
		unread(w)
		writeProblem(w, http.StatusUnauthorized, "unauthorized", "Unauthorized", "no API key: send Authorization: Bearer <key>", nil, 0)
		return ""
	}
	req.key, req.tenant = s.keys.Authenticate(token)
	if req.key == nil {
		unread(w)
		writeProblem(w, http.StatusUnauthorized, "unauthorized", "Unauthorized", "the API key is not known or was revoked", nil, 0)
		return ""
	}
	tenant := req.key.Tenant
	// Before the body is read: the bounds of requests in flight, and the
	// key's bucket (spent by accepted events and by refused requests).
	if !s.enterInflight(w, tenant) {
		return tenant
	}
	defer s.inflight.leave(tenant)
	if wait := s.limits.admit(req.key, req.received); wait > 0 {
		unread(w)
		s.rateLimited(w, req, wait)
		return tenant
	}
	if status := s.readRequest(w, r, req); status != 0 {
		return s.refusedWhole(req, status, tenant)
	}
	if req.inputs > s.cfg.MaxEvents {
		writeProblem(w, http.StatusRequestEntityTooLarge, "too-large", "Too many events",
			fmt.Sprintf("%d events in one request, more than %d: split the batch", req.inputs, s.cfg.MaxEvents), nil, 0)
		s.metrics.refused(tenant, req.inputs)
		s.metrics.tooManyEvents(tenant, req.inputs)
		s.limits.charge(req.key, s.refusalCost(req), req.received)
		return tenant
	}
	// Every event is validated and encoded (producer.Record: the checks
	// and the encoding of every producer) before anything is sent.
	recs, errs := s.records(req)
	req.errs = append(req.errs, errs...)
	slices.SortStableFunc(req.errs, func(a, b EventError) int { return cmp.Compare(a.Index, b.Index) })
	if len(req.denied) > 0 {
		errs := mergeErrors(req.denied, req.errs)
		denied := countIndexes(req.denied)
		detail := fmt.Sprintf("%d of %d events are outside what key %s may write", denied, req.inputs, req.key.ID)
		if invalid := countIndexes(errs) - denied; invalid > 0 {
			detail += fmt.Sprintf(", and %d are invalid", invalid)
		}
		writeProblem(w, http.StatusForbidden, "forbidden", "Outside the key's scope", detail+"; nothing was sent"+firstError(errs), errs, 0)
		s.metrics.refused(tenant, req.inputs)
		s.metrics.refusedEvents(tenant, errs)
		s.limits.charge(req.key, s.refusalCost(req), req.received)
		return tenant
	}
	if len(req.errs) > 0 {
		writeProblem(w, http.StatusBadRequest, "invalid-events", "Invalid events",
			fmt.Sprintf("%d of %d events are invalid; nothing was sent%s%s", countIndexes(req.errs), req.inputs, firstError(req.errs), req.binary), req.errs, 0)
		s.metrics.refused(tenant, req.inputs)
		s.metrics.refusedEvents(tenant, req.errs)
		s.limits.charge(req.key, s.refusalCost(req), req.received)
		return tenant
	}
	if wait := s.limits.take(req.key, req.inputs, req.received); wait > 0 {
		s.rateLimited(w, req, wait)
		s.metrics.refused(tenant, req.inputs)
		return tenant
	}
	if errs, refused := s.gateCheck(req); errs != nil {
		s.answerGate(w, req, errs, refused)
		return tenant
	}
	req.ready = time.Now()
	var err error
	if req.enqueued, err = s.send(recs); err != nil {
		s.notSent(w, req, len(recs), err)
		return tenant
	}
	// Every record of the request is acknowledged (acks=all): only now is
	// success answered.
	req.acked = time.Now()
	fault.Hit(FaultAfterAck)
	s.metrics.accepted(tenant, req.inputs, len(recs))
	if kind == endpointOpenMeter {
		w.WriteHeader(http.StatusNoContent) // OpenMeter's answer; its SDKs expect it
		return tenant
	}
	b, _ := json.Marshal(struct {
		Events  int `json:"events"`
		Records int `json:"records"`
	}{req.inputs, len(recs)})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(append(b, '\n'))
	return tenant
}

// refusedWhole charges the key's bucket for a request readRequest
// refused as a whole (refusalCost; a body over MaxBodyBytes, a full
// request), and returns tenant for the metrics. A request refused
// because its key was revoked, or the keys went stale, as its body
// arrived (recheckKey) costs nothing, and is counted as those answered
// from their headers are: without a valid key.
func (s *Server) refusedWhole(req *request, status int, tenant string) string {
	switch status {
	case http.StatusUnauthorized, http.StatusServiceUnavailable:
		return ""
	case http.StatusRequestEntityTooLarge:
		s.limits.charge(req.key, s.cfg.MaxEvents, req.received)
	default:
		s.limits.charge(req.key, s.refusalCost(req), req.received)
	}
	return tenant
}

// notSent answers a request whose records Kafka did not take (send's
// err) with the first of kafkaFailures whose error it is, else the last:
// 503 not-authorized when Kafka refused every record because the ingest
// may not write the events topic (nothing was written; the ACL is named
// in the log, never to the client, and a grant heals it: the next request
// is produced again); 503 kafka-refused when Kafka refused every record
// for good (kafka.RecordRefused: nothing was written, and only a fix of
// the topic heals it); else 503 unavailable, the outcome unknown.
func (s *Server) notSent(w http.ResponseWriter, req *request, records int, err error) {
	f := &kafkaFailures[len(kafkaFailures)-1]
	for i := range kafkaFailures[:len(kafkaFailures)-1] {
		if errors.Is(err, kafkaFailures[i].err) {
			f = &kafkaFailures[i]
			break
		}
	}
	// One line a request, as fast as they come while Kafka is out of
	// reach: bounded.
	if fs, logIt := s.kafkaLog.allow(); logIt {
		fs = append(fs, zap.String("tenant", req.key.Tenant), zap.String("key_id", req.key.ID), zap.Int("records", records), zap.Error(err))
		msg := f.log
		if f.topic {
			msg = fmt.Sprintf(msg, s.cfg.Topic)
			fs = append(fs, zap.String("topic", s.cfg.Topic))
		}
		s.log.Warn(msg, fs...)
	}
	writeProblem(w, http.StatusServiceUnavailable, f.problem, f.title, f.detail, nil, f.retry)
	s.metrics.kafkaFailure(f.reason)
	s.metrics.refused(req.key.Tenant, req.inputs)
}

// kafkaFailures are notSent's answers: the error send's err wraps (nil
// for the last, the fallback), the log line (a format of the events topic
// when topic), the problem's type, title, detail and Retry-After, and the
// metric's reason.
var kafkaFailures = [...]struct {
	err                    error
	log                    string
	topic                  bool
	problem, title, detail string
	retry                  time.Duration
	reason                 string
}{
	{errNotAuthorized, "ingest: Kafka refused a request: not authorized to write (the principal needs Write on topic %s: docs/operations.md, Security and ACLs); answered 503", true,
		"not-authorized", "Ingest not authorized to write",
		"Kafka refused every event: this ingest is not authorized to write them, and none was written; retry the same request later",
		5 * time.Second, reasonNotAuthorized},
	{errRefused, "ingest: Kafka refused every record of a request for good (check topic %s: its max.message.bytes, the brokers' logs); answered 503", true,
		"kafka-refused", "Kafka refused the events",
		"Kafka refused every event, and none was written; retrying does not help until the ingest's operator fixes its events topic: retry the same request later",
		60 * time.Second, reasonRefused},
	{nil, "ingest: Kafka did not acknowledge a request; answered 503", false,
		"unavailable", "Kafka unavailable",
		"the events were not acknowledged by Kafka in time; some may have been written: retry the same request (copies are dropped)",
		5 * time.Second, reasonNotAcknowledged},
}

// refusalCost is the tokens a refused request takes from its key's
// bucket: as many as its events, or as its body's share of a full request
// (MaxBodyBytes for MaxEvents) when that is more, as for a body that is
// not JSON, whose events are not known; at least 1 (limiters.charge).
func (s *Server) refusalCost(req *request) int {
	return max(req.inputs, int(int64(len(req.body))*int64(s.cfg.MaxEvents)/s.cfg.MaxBodyBytes))
}

// enterInflight takes one of the in-flight slots for a request of tenant
// before its body is read (inflight.enter), or answers the request with
// the bound it would pass (503 overloaded, 429 too-many-in-flight) and
// counts it. When it returns true, inflight.leave must follow.
func (s *Server) enterInflight(w http.ResponseWriter, tenant string) bool {
	limit, held, free := s.inflight.enter(tenant)
	if limit == "" {
		return true
	}
	unread(w)
	switch limit {
	case limitGlobal:
		writeProblem(w, http.StatusServiceUnavailable, "overloaded", "Too many requests in flight",
			fmt.Sprintf("the ingest already serves %d requests; try again later", s.cfg.MaxInFlight), nil, time.Second)
	case limitTenant:
		writeProblem(w, http.StatusTooManyRequests, "too-many-in-flight", "Too many requests in flight",
			fmt.Sprintf("tenant %s already has %d requests in flight (its keys together); wait for their answers", tenant, held), nil, time.Second)
	case limitShare:
		writeProblem(w, http.StatusTooManyRequests, "too-many-in-flight", "Too many requests in flight",
			fmt.Sprintf("tenant %s already has %d requests in flight, and %d of the ingest's %d slots are free: the last ones are kept for tenants with fewer; wait for their answers",
				tenant, held, free, s.cfg.MaxInFlight), nil, time.Second)
	}
	s.metrics.inflightRefused(tenant, limit)
	return false
}

// unreadGrace is how long net/http may still read the body of a request
// answered before its body was read (unread).
const unreadGrace = time.Second

// unread closes the connection after an answer given before the body was
// read: net/http would otherwise read and discard a body of up to 256 KiB
// before it answers (to keep the connection), as slowly as the client
// sends it. With Connection: close it answers first, but still reads
// that much of the body once the handler returns (to close the body): a
// read deadline of unreadGrace ends that read, so that a refused client
// that trickles its body keeps its connection, and a goroutine, for a
// second, not until the read timeout. A body sent at once is still read
// to its end within it, and the connection closed cleanly (a close with
// unread bytes would reset it, and could cost the client the answer).
func unread(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(unreadGrace))
}

// binaryModeHint is what an answer that refuses a request to
// /api/v1/events adds when the request is a CloudEvent in binary content
// mode (the CloudEvents HTTP binding, 3.1: the attributes in ce- headers,
// ce-specversion among them, and the data as the body, in a media type
// other than the CloudEvents ones), which the endpoint does not take, as
// OpenMeter does not: its body alone would be refused for lacking the
// attributes its headers carry. "" for any other request
// (docs/ingest.md, Endpoints).
func binaryModeHint(r *http.Request, kind string) string {
	if kind != endpointOpenMeter || r.Header.Get("Ce-Specversion") == "" {
		return ""
	}
	if mt, _ := mediaType(r); mt == "application/cloudevents+json" || mt == "application/cloudevents-batch+json" {
		return "" // structured mode, which may carry the headers too
	}
	return ". The request is a CloudEvent in binary content mode (a ce-specversion header, the data as the body), which this endpoint does not take: " +
		"send the event in structured mode, as JSON with Content-Type application/cloudevents+json (the CloudEvents Go SDK: cloudevents.WithEncodingStructured)"
}

// rateLimited answers 429 rate-limited: the key's bucket does not hold
// the request's events (or, before the body is read, a token); for a key
// without a rate, its refusal budget is spent.
func (s *Server) rateLimited(w http.ResponseWriter, req *request, wait time.Duration) {
	if req.key.Rate <= 0 {
		writeProblem(w, http.StatusTooManyRequests, "rate-limited", "Too many refused events",
			fmt.Sprintf("key %s has had more than %g events per second refused (400, 403, 413, 415): fix what those answers name; try again later", req.key.ID, s.cfg.RefusalRate), nil, wait)
		return
	}
	writeProblem(w, http.StatusTooManyRequests, "rate-limited", "Too many events",
		fmt.Sprintf("key %s may send %g events per second (a refused request costs its events too); try again later", req.key.ID, req.key.Rate), nil, wait)
}

// bodyShape is what a request's content type asks of its body: NDJSON,
// an array or one object (neither: either).
type bodyShape struct{ ndjson, wantArray, wantObject bool }

// checkContent checks a request's Content-Type for the endpoint kind and
// its Content-Encoding. It answers 415 (and returns it) when either is
// refused.
func checkContent(w http.ResponseWriter, r *http.Request, kind string) (bodyShape, int) {
	mt, isUTF8 := mediaType(r)
	var b bodyShape
	// A singleton field (RFC 9110): of two lines, a proxy in front may
	// have read the body by the other.
	if len(r.Header.Values("Content-Type")) > 1 {
		unread(w)
		writeProblem(w, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
			"more than one Content-Type header: send one", nil, 0)
		return b, http.StatusUnsupportedMediaType
	}
	switch kind {
	case endpointOpenMeter:
		switch mt {
		case "application/cloudevents+json":
			b.wantObject = true
		case "application/cloudevents-batch+json":
			b.wantArray = true
		case "application/json":
		default:
			unread(w)
			writeProblem(w, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				fmt.Sprintf("Content-Type %q: want application/cloudevents+json, application/cloudevents-batch+json or application/json%s", clip(r.Header.Get("Content-Type")), binaryModeHint(r, kind)), nil, 0)
			return b, http.StatusUnsupportedMediaType
		}
	default:
		switch mt {
		case "application/json":
		case "application/x-ndjson", "application/ndjson", "application/jsonl":
			b.ndjson = true
		default:
			unread(w)
			writeProblem(w, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				fmt.Sprintf("Content-Type %q: want application/json (an object or an array), or application/x-ndjson, application/ndjson or application/jsonl (one event a line)", clip(r.Header.Get("Content-Type"))), nil, 0)
			return b, http.StatusUnsupportedMediaType
		}
	}
	// A body declared in another charset is refused, not read as UTF-8:
	// its bytes could be valid UTF-8 and mean other text.
	if !isUTF8 {
		unread(w)
		writeProblem(w, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
			fmt.Sprintf("Content-Type %q: the body must be UTF-8 (charset=utf-8, or none)", clip(r.Header.Get("Content-Type"))), nil, 0)
		return b, http.StatusUnsupportedMediaType
	}
	// A compressed body is refused as such (RFC 9110, 12.5.3), not read as
	// JSON and answered "malformed".
	if enc := encoding(r.Header.Values("Content-Encoding")); enc != "" {
		unread(w)
		writeProblem(w, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
			fmt.Sprintf("Content-Encoding %q is not supported: send the body uncompressed", clip(enc)), nil, 0)
		return b, http.StatusUnsupportedMediaType
	}
	return b, 0
}

// encoding returns the first coding of a request's Content-Encoding
// header lines that is not identity, "" when there is none. Each line is
// a comma-separated list (RFC 9110, 5.3 and 8.4): a coding on any line,
// after any number of identity ones, is the body's.
func encoding(lines []string) string {
	for _, line := range lines {
		for c := range strings.SplitSeq(line, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return c
			}
		}
	}
	return ""
}

// readRequest checks the content type, reads the body and parses its
// events into req. It answers (and returns the status) when the request
// as a whole is refused: 415, 413, a body that is not JSON.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, req *request) int {
	shape, status := checkContent(w, r, req.kind)
	if status != 0 {
		return status
	}
	ndjson, wantArray, wantObject := shape.ndjson, shape.wantArray, shape.wantObject
	req.bufs = getBuffers()
	body, tooLarge, err := readBody(req.bufs.body, w, r, s.cfg.MaxBodyBytes)
	req.body = body
	req.read = time.Now()
	// The write timeout counts from here, the end of the body, not from
	// the request's headers: a body read slowly, within the read timeout,
	// would otherwise leave no time to answer once its events are written.
	if d := s.srv.WriteTimeout; d > 0 {
		_ = http.NewResponseController(w).SetWriteDeadline(req.read.Add(d))
	}
	if tooLarge {
		unread(w) // a Content-Length over the bound: the body is not read
		writeProblem(w, http.StatusRequestEntityTooLarge, "too-large", "Body too large",
			fmt.Sprintf("the body is larger than %d bytes: split the batch", s.cfg.MaxBodyBytes), nil, 0)
		return http.StatusRequestEntityTooLarge
	}
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "unreadable-body", "Unreadable body", s.unreadable(err), nil, 0)
		return http.StatusBadRequest
	}
	if status := s.recheckKey(w, r, req); status != 0 {
		return status
	}
	// The fast path of a valid batch of CloudEvents: its text is valid
	// UTF-8 (without surrogate escapes) and it decodes in one pass. Anything else takes the slow path,
	// which checks each event on its own and names every bad one.
	if req.kind == endpointOpenMeter && !wantObject && utf8.Valid(body) && (!hasEscape(body) || checkEscapes(body) == nil) {
		if b := trimSpace(body); len(b) > 0 && b[0] == '[' {
			// Every string of the request is a substring of its text.
			as, ok := decodeBatch(req.bufs.attrs, b, string(b), s.cfg.MaxEvents)
			req.attrs = as
			if ok && len(as) > 0 {
				req.inputs = len(as)
				s.grow(req)
				for i := range as {
					ce, fe := checkCloudEvent(&as[i])
					s.addCloudEvent(req, i, &ce, fe)
				}
				return 0
			}
		}
	}
	// A request of more events than allowed is answered 413 before its
	// events are split or decoded: a body of tiny elements ("[{},{},...]")
	// would otherwise cost hundreds of bytes of memory for each byte read.
	if n := countEvents(body, ndjson); n > s.cfg.MaxEvents && (ndjson || json.Valid(body)) {
		req.inputs = n
		return 0 // answered by the caller
	}
	var elems []json.RawMessage
	if ndjson {
		elems = splitLines(body)
		if len(elems) == 0 {
			err = fmt.Errorf("%w: the body has no events", errMalformed)
		}
	} else {
		var single bool
		elems, single, err = splitJSON(body)
		switch {
		case err != nil:
		case wantObject && !single:
			err = fmt.Errorf("%w: application/cloudevents+json carries one event (an object); send a batch as application/cloudevents-batch+json", errMalformed)
		case wantArray && single:
			err = fmt.Errorf("%w: application/cloudevents-batch+json carries an array of events", errMalformed)
		case len(elems) == 0 && !(req.kind == endpointOpenMeter && wantArray):
			// An empty application/cloudevents-batch+json is a request of
			// no events, answered 204 as OpenMeter does: its SDKs send one
			// for an empty list. OpenMeter refuses an empty
			// application/json array ("no events found"), and so does
			// this.
			err = fmt.Errorf("%w: the batch is empty", errMalformed)
		}
	}
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "malformed", "Malformed body", err.Error()+"; nothing was sent"+req.binary, nil, 0)
		return http.StatusBadRequest
	}
	req.inputs = len(elems)
	if req.inputs > s.cfg.MaxEvents {
		return 0 // answered by the caller
	}
	s.grow(req)
	for i, raw := range elems {
		if fe := checkText(raw); fe != nil {
			req.errs = append(req.errs, fe.at(i))
			continue
		}
		if req.kind == endpointOpenMeter {
			if fe := checkEscapes(raw); fe != nil {
				req.errs = append(req.errs, fe.at(i))
				continue
			}
			ce, fe := parseCloudEvent(raw)
			s.addCloudEvent(req, i, &ce, fe)
			continue
		}
		s.addMeterlineEvent(req, i, raw)
	}
	return 0
}

// recheckKey takes the request's key and tenant again once its body has
// arrived, which a client may take up to the read timeout to send: a key
// revoked, or a tenant narrowed, while it arrived holds for it too, as
// do keys gone stale meanwhile. It answers (and returns the status) when
// the request is refused so: 401, or 503 unavailable.
func (s *Server) recheckKey(w http.ResponseWriter, r *http.Request, req *request) int {
	if detail, retry, err := s.keysUnavailable(); err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "Service unavailable", detail, nil, retry)
		return http.StatusServiceUnavailable
	}
	key, t := s.keys.Authenticate(bearer(r))
	if key == nil {
		writeProblem(w, http.StatusUnauthorized, "unauthorized", "Unauthorized", "the API key is not known or was revoked", nil, 0)
		return http.StatusUnauthorized
	}
	req.key, req.tenant = key, t
	return 0
}

// unreadable says why reading a request's body failed, for its answer:
// the read timeout passed, or what broke, without the connection's
// addresses (a *net.OpError names the replica's own, "read tcp
// 10.0.3.7:8888->…", which is no client's business).
func (s *Server) unreadable(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("the body did not arrive within the read timeout (%s)", s.cfg.ReadTimeout)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
	}
	return "reading the body: " + err.Error()
}

// grow sizes the request's usage events and their properties for its
// inputs, so that a request of events of one type takes one allocation
// for each (bounded: a larger request grows them as it goes).
func (s *Server) grow(req *request) {
	const most = 4096
	if req.bufs == nil {
		req.bufs = getBuffers()
	}
	nu, np := min(req.inputs*max(s.mapper.maxMeters, 1), most), min(req.inputs*s.mapper.maxProps, most)
	if req.usages = req.bufs.usages[:0]; cap(req.usages) < nu {
		req.usages = make([]usage, 0, nu)
	}
	if req.props = req.bufs.props[:0]; cap(req.props) < np {
		req.props = make([]schemas.Property, 0, np)
	}
}

// buffers are the slices a request is built in, reused from request to
// request (bufPool) so that a request allocates little besides its
// records' bytes, and the garbage collector runs less often.
type buffers struct {
	body    []byte // holds no request's bytes once released: strings are copies
	attrs   []ceAttrs
	usages  []usage
	props   []schemas.Property
	slab    []kgo.Record
	recs    []*kgo.Record
	encoded []byte
	seen    []int32 // conflictingCopies' table: indexes of records, no request's bytes
}

var bufPool = sync.Pool{New: func() any { return new(buffers) }}

// maxPooled bounds the slices kept for reuse: a rare huge request does not
// pin its memory. maxPooledBytes bounds the records' bytes kept.
const (
	maxPooled      = 8192
	maxPooledBytes = 4 << 20
)

func getBuffers() *buffers { return bufPool.Get().(*buffers) }

// release gives the request's buffers back for reuse, cleared (they hold
// no request's data). The records are kept out when Kafka may still hold
// them: handed to the producer and not all acknowledged.
func (req *request) release(recordsFree bool) {
	b := req.bufs
	if b == nil {
		return
	}
	req.bufs = nil
	clear(req.attrs)
	clear(req.usages)
	clear(req.props)
	b.body, b.attrs, b.usages, b.props = req.body[:0], req.attrs[:0], req.usages[:0], req.props[:0]
	if recordsFree {
		clear(req.slab)
		clear(req.recs)
		b.slab, b.recs, b.encoded = req.slab[:0], req.recs[:0], req.encoded[:0]
	} else {
		b.slab, b.recs, b.encoded = nil, nil, nil
	}
	req.body, req.attrs, req.usages, req.props, req.slab, req.recs, req.encoded = nil, nil, nil, nil, nil, nil, nil
	if cap(b.attrs) > maxPooled || cap(b.usages) > maxPooled || cap(b.props) > maxPooled || cap(b.slab) > maxPooled || cap(b.seen) > 4*maxPooled ||
		cap(b.body) > maxPooledBytes || cap(b.encoded) > maxPooledBytes {
		return
	}
	bufPool.Put(b)
}

// addCloudEvent maps CloudEvent i of the request (or its parse error) to
// usage events and adds them.
func (s *Server) addCloudEvent(req *request, i int, ce *CloudEvent, fe *fieldError) {
	if fe == nil && ce.Time.IsZero() && s.cfg.RequireTime {
		fe = &fieldError{"time", schemas.ReasonInvalid, "is missing, and this server requires it (--require-time)"}
	}
	first := len(req.usages)
	if fe == nil {
		fe = s.mapper.events(req, i, ce, req.received)
	}
	if fe != nil && ce.Subject != "" {
		// Mapped or not, the event names its customer: one outside the
		// key's scope is answered 403 for it, not 400 for its fields.
		s.customerOutOfScope(req, i, ce.Subject, "subject")
	}
	s.added(req, i, first, fe)
}

// customerOutOfScope records input i, which failed to map, as outside the
// key's scope when its customer c is (mergeErrors names it by its scope's
// error).
func (s *Server) customerOutOfScope(req *request, i int, c, field string) {
	if why := req.key.allowsCustomer(req.tenant, c); why != "" {
		req.denied = append(req.denied, EventError{Index: i, Field: field, Code: CodeOutOfScope, Reason: why})
	}
}

// added records the error of input i, or checks the usage events it
// added to the request (from first on) against the key's scope.
func (s *Server) added(req *request, i, first int, fe *fieldError) {
	if fe != nil {
		req.errs = append(req.errs, fe.at(i))
		return
	}
	for _, u := range req.usages[first:] {
		if why := req.key.allows(req.tenant, u.ue.CustomerID, u.ue.Meter); why != "" {
			field := "customer_id"
			if strings.HasPrefix(why, "meter") {
				field = "meter"
			}
			req.denied = append(req.denied, EventError{Index: i, Field: u.mm.field(field), Code: CodeOutOfScope, Reason: why})
			break
		}
	}
}

// addMeterlineEvent parses one event of Meterline's JSON format (input i)
// and adds it.
func (s *Server) addMeterlineEvent(req *request, i int, raw []byte) {
	first := len(req.usages)
	e, fe := s.meterlineEvent(raw)
	if fe != nil && e.CustomerID != "" {
		s.customerOutOfScope(req, i, e.CustomerID, "customer_id")
	}
	if fe == nil {
		req.usages = append(req.usages, usage{ue: schemas.UsageEvent{EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter,
			Quantity: e.Quantity, Source: e.Source, Properties: schemas.Properties(e.Properties)}, time: e.EventTime, input: i})
	}
	s.added(req, i, first, fe)
}

// meterlineEvent parses one event of Meterline's JSON format.
func (s *Server) meterlineEvent(raw []byte) (producer.Event, *fieldError) {
	e, err := producer.ParseJSON(raw)
	if err != nil {
		var fe *producer.FieldError
		if errors.As(err, &fe) {
			return e, &fieldError{fe.Field, fe.Code, clipTo(fe.Reason, maxReason)}
		}
		return e, &fieldError{"event", schemas.ReasonInvalid, clipTo(err.Error(), maxReason)}
	}
	if s.cfg.StrictMeters {
		if _, ok := s.cfg.Meters.Lookup(e.Meter); !ok {
			return e, &fieldError{"meter", schemas.ReasonUnknownMeter, fmt.Sprintf("%q is not declared in the meters file (strict meters)", clip(e.Meter))}
		}
	}
	return e, nil
}

// records validates and encodes every usage event (producer.AppendRecord:
// the checks and the encoding of every producer) into the request's
// records, whose bytes are in one buffer reused from request to request
// (release). The errors name each bad event by its input index, in the
// request's field names.
func (s *Server) records(req *request) ([]*kgo.Record, []EventError) {
	n := len(req.usages)
	if req.bufs == nil {
		req.bufs = getBuffers()
	}
	slab, recs := req.bufs.slab, req.bufs.recs
	if cap(slab) < n {
		slab = make([]kgo.Record, n)
	}
	if cap(recs) < n {
		recs = make([]*kgo.Record, n)
	}
	slab, recs = slab[:n], recs[:n]
	req.slab, req.recs = slab, recs
	// The skew of every event is judged against one reading of the clock.
	now := s.cfg.Clock()
	buf := req.bufs.encoded[:0]
	var errs []EventError
	last := -1
	for k := range req.usages {
		u := &req.usages[k]
		var err error
		if buf, err = s.p.AppendRecord(buf, &slab[k], &u.ue, u.time, now); err != nil {
			if u.input == last {
				continue // one error per event
			}
			last = u.input
			var fe *producer.FieldError
			if errors.As(err, &fe) {
				errs = append(errs, EventError{Index: u.input, Field: u.mm.field(fe.Field), Code: fe.Code, Reason: u.mm.reason(fe.Field, fe.Reason)})
			} else {
				errs = append(errs, EventError{Index: u.input, Field: "event", Code: schemas.ReasonInvalid, Reason: err.Error()})
			}
			continue
		}
		recs[k] = &slab[k]
	}
	req.encoded = buf
	return recs, append(errs, conflictingCopies(req, recs, errs)...)
}

// send produces the records and waits until every one is acknowledged
// (acks=all), or returns the first error; enqueued is when the last record
// was handed to the producer. It returns an error, without
// waiting further, once ProduceTimeout has passed: the records still in
// flight may yet be written, which a retry tolerates.
func (s *Server) send(recs []*kgo.Record) (enqueued time.Time, err error) {
	if n := s.p.Client().BufferedProduceRecords(); n+int64(len(recs)) > s.maxBuffered {
		return time.Time{}, fmt.Errorf("ingest: %d records already wait for Kafka", n)
	}
	if len(recs) == 0 {
		return time.Now(), nil
	}
	var (
		left   atomic.Int64
		denied atomic.Int64 // records Kafka refused: not authorized
		bad    atomic.Int64 // records Kafka refused for good (kafka.RecordRefused)
		mu     sync.Mutex
		first  error
		done   = make(chan struct{})
	)
	left.Store(int64(len(recs)))
	// One callback for every record; the last acknowledgement closes done.
	acked := func(err error) {
		if err != nil {
			if refusedAuth(err) {
				denied.Add(1)
			}
			if kafka.RecordRefused(err) {
				bad.Add(1)
			}
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
		if left.Add(-1) == 0 {
			close(done)
		}
	}
	s.p.ProduceRecords(recs, acked)
	enqueued = time.Now()
	t := time.NewTimer(s.cfg.ProduceTimeout + time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return enqueued, fmt.Errorf("ingest: no acknowledgement within %s", s.cfg.ProduceTimeout+time.Second)
	}
	if denied.Load() == int64(len(recs)) {
		return enqueued, errNotAuthorized
	}
	mu.Lock()
	defer mu.Unlock()
	if bad.Load() == int64(len(recs)) {
		return enqueued, fmt.Errorf("%w: %w", errRefused, first)
	}
	return enqueued, first
}

// errRefused marks send's error when Kafka refused every record of a
// request for good (kafka.RecordRefused): none was written, and sending
// them again fails the same way until the topic is fixed.
var errRefused = errors.New("ingest: Kafka refused the records")

// errNotAuthorized is send's error when Kafka refused every record of a
// request because the ingest's principal may not write the events topic:
// none was written (the broker authorizes a produce before it appends).
var errNotAuthorized = fmt.Errorf("ingest: %w", kerr.TopicAuthorizationFailed)

// refusedAuth tells whether a record's error is Kafka's refusal to let
// the ingest write: TOPIC_AUTHORIZATION_FAILED on its produce (or on the
// topic's metadata), or CLUSTER_AUTHORIZATION_FAILED on the idempotent
// producer's InitProducerID, refused to a principal with Write on no
// topic, before any record is sent.
func refusedAuth(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// maxBuffered is the producer's buffer (producer.WithMaxBufferedRecords'
// default): a request that would not fit is answered 503 at once instead
// of waiting for room. Server.maxBuffered is set from it (BenchmarkBatchCPU
// sets -1 to stop every request just before its records are produced).
const maxBuffered = 100_000

// mergeErrors names every bad event of a request answered 403: the
// errors of the events outside the key's scope (denied) and of the
// invalid ones (errs), both in the order of their indexes, one error for
// each event, its scope's when it has both.
func mergeErrors(denied, errs []EventError) []EventError {
	out := make([]EventError, 0, len(denied)+len(errs))
	d := 0
	for _, fe := range errs {
		for d < len(denied) && denied[d].Index < fe.Index {
			out, d = append(out, denied[d]), d+1
		}
		if d < len(denied) && denied[d].Index == fe.Index {
			continue
		}
		out = append(out, fe)
	}
	return append(out, denied[d:]...)
}

// firstError is what the detail of an answer that names events says of
// the first one: ". Event 1, subject: is missing …". A client that shows
// only the detail (OpenMeter's Node SDK puts it in its HTTPError's
// message) then shows what to fix, as OpenMeter's own answers do; the
// others are in errors.
func firstError(errs []EventError) string {
	if len(errs) == 0 {
		return ""
	}
	return fmt.Sprintf(". Event %d, %s: %s", errs[0].Index, errs[0].Field, errs[0].Reason)
}

func countIndexes(errs []EventError) int {
	n, last := 0, -1
	for _, e := range errs {
		if e.Index != last {
			n++
			last = e.Index
		}
	}
	return n
}

// splitLines splits an NDJSON body into its non-blank lines (trimSpace).
func splitLines(body []byte) []json.RawMessage {
	var out []json.RawMessage
	for l := range bytes.SplitSeq(body, []byte("\n")) {
		if l = trimSpace(l); len(l) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// statusWriter records the status of the response, and its problem type
// when writeProblem wrote it.
type statusWriter struct {
	http.ResponseWriter
	status  int
	problem string
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}
