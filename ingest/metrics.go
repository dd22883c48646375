package ingest

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/schemas"
)

// metrics are the ingest's Prometheus metrics and the totals its status
// page section shows. Labels are bounded: tenants are made by operators,
// status codes and endpoints are fixed sets; no key, customer or event
// value ever becomes a label.
type metrics struct {
	requests *prometheus.CounterVec   // tenant, code
	problems *prometheus.CounterVec   // tenant, problem
	duration *prometheus.HistogramVec // endpoint
	events   *prometheus.CounterVec   // tenant, outcome
	byReason *prometheus.CounterVec   // tenant, reason (refusedReasons)
	records  *prometheus.CounterVec   // tenant
	gate     *prometheus.CounterVec   // tenant
	inflight *prometheus.CounterVec   // tenant, limit
	shed     *prometheus.CounterVec   // state (shedIdle, shedUnused, shedIncoming)
	// kafkaFailed: reason (reasonNotAcknowledged, reasonNotAuthorized, reasonRefused)
	kafkaFailed *prometheus.CounterVec
	stage       [5]prometheus.Observer // read, parse, enqueue, ack, respond

	mu      sync.Mutex
	tenants map[string]*tenantTotals
}

type tenantTotals struct {
	ok, clientErr, serverErr int64
	events, refused, records int64
}

// noTenant is the tenant label of requests without an accepted key.
const noTenant = "none"

func newMetrics(reg prometheus.Registerer, keys *Keys, balances *Balances, inflight *inflight, conns *conns) *metrics {
	f := prom.NewFactory(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_requests_total",
			Help: "HTTP ingest requests by tenant (\"none\" without a valid key) and status code."}, []string{"tenant", "code"}),
		problems: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_refused_requests_total",
			Help: "Requests the HTTP ingest answered with a problem (RFC 9457), by tenant (\"none\" without a valid key) and problem type (the type's last part: malformed, unreadable-body, invalid-events, forbidden, too-large, unsupported-media-type, unauthorized, not-found, rate-limited, ...), whether or not their events are known; malformed-request (tenant none) counts the requests net/http refused itself before the handler, answered in plain text (400, 431, 501 or 505: a request line or header it cannot parse, headers too large)."},
			[]string{"tenant", "problem"}),
		duration: prom.GetOrRegister(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_ingest_request_duration_seconds",
			Help:    "HTTP ingest request latency, from the request's start to its answer, by endpoint (openmeter: /api/v1/events, meterline: /v1/events).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15}}, []string{"endpoint"})),
		events: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_events_total",
			Help: "Events received over HTTP, by tenant and outcome: accepted (acknowledged by Kafka) or refused (in a request answered with an error)."}, []string{"tenant", "outcome"}),
		byReason: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_refused_events_total",
			Help: "Events the HTTP ingest refused that its answer names, by tenant and reason code: invalid, oversized, in_future, too_old, unknown_meter, unknown_event_type (400), out_of_scope (403), over_limit (402, the quota gate), too_many_events (413, each event of a request of more than --max-events), other (a code not listed here). An event with several errors counts once, under its first; the valid events of a refused request count only in meterline_ingest_events_total{outcome=\"refused\"}."},
			[]string{"tenant", "reason"}),
		records: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_records_total",
			Help: "Usage records written to Kafka by the HTTP ingest, by tenant (a CloudEvent feeds one record per meter of its type)."}, []string{"tenant"}),
		gate: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_gate_refused_events_total",
			Help: "Events answered 402 by the advisory quota gate (nothing sent), by tenant."}, []string{"tenant"}),
		inflight: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_inflight_refused_total",
			Help: "Requests refused before their body was read because too many were in flight, by tenant and limit: tenant (429, the tenant's keys together hold --max-in-flight-per-client), share (429, the tenant holds as many as there are free slots) or global (503, --max-in-flight)."}, []string{"tenant", "limit"}),
		shed: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_connections_shed_total",
			Help: "Connections closed because --max-connections were open, by state: idle (a keep-alive connection between requests, the one idle the longest), unused (one that had not sent a request yet, the one open the longest) or incoming (the new connection, closed at once: every open one had a request in flight)."}, []string{"state"}),
		kafkaFailed: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_ingest_kafka_failed_requests_total",
			Help: "Requests answered 503 because Kafka did not take their records, by reason: not_acknowledged (503 unavailable: no acknowledgement within --produce-timeout, or a Kafka error; some records may have been written), not_authorized (503 not-authorized: Kafka refused every record, the ingest's principal lacking Write on the events topic; none was written) or refused (503 kafka-refused: Kafka refused every record for good, MESSAGE_TOO_LARGE or INVALID_RECORD; none was written)."},
			[]string{"reason"}),
		tenants: map[string]*tenantTotals{},
	}
	for _, st := range []string{shedIdle, shedUnused, shedIncoming} {
		m.shed.WithLabelValues(st)
	}
	conns.shed = func(state string) { m.shed.WithLabelValues(state).Inc() }
	malformed := m.problems.WithLabelValues(noTenant, problemMalformedRequest)
	conns.malformed = malformed.Inc
	prom.GetOrRegister(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meterline_ingest_open_connections",
		Help: "HTTP connections open to this ingest replica, idle keep-alive ones included (bounded by --max-connections)."}, func() float64 {
		return float64(conns.count())
	}))
	prom.GetOrRegister(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meterline_ingest_inflight_requests",
		Help: "Requests with a valid key this ingest replica serves now (bounded by --max-in-flight)."}, func() float64 {
		return float64(inflight.count())
	}))
	stage := prom.GetOrRegister(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meterline_ingest_stage_duration_seconds",
		Help:    "Stages of the successful HTTP ingest requests (ingest.Timings): read (the body), parse (parse, map, validate, encode, scope, rate, quota gate), enqueue (records to the producer), ack (Kafka's acknowledgement of the last record), respond (the answer written).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"stage"}))
	for i, name := range []string{"read", "parse", "enqueue", "ack", "respond"} {
		m.stage[i] = stage.WithLabelValues(name)
	}
	// Each endpoint's latency is exported from the start, with no request
	// yet, as the stages': a series born at its first request hides that
	// request from rate(). Tenants are not known at start (keys arrive on
	// the keys topic): their series appear with their first request.
	for _, e := range []string{endpointOpenMeter, endpointMeterline} {
		m.duration.WithLabelValues(e)
	}
	// So is every problem type for requests without a valid key, whose
	// tenant label is known: rules and panels select them by type.
	for _, p := range problemTypes {
		m.problems.WithLabelValues(noTenant, p)
	}
	for _, r := range []string{reasonNotAcknowledged, reasonNotAuthorized, reasonRefused} {
		m.kafkaFailed.WithLabelValues(r)
	}
	if balances != nil {
		prom.GetOrRegister(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meterline_ingest_balances",
			Help: "Customers with a balance in this ingest replica's view of the balances topic (the quota gate's)."}, func() float64 {
			return float64(balances.Len())
		}))
		prom.GetOrRegister(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meterline_ingest_balances_loaded",
			Help: "Whether this ingest replica has read the balances topic up to its end as of its start (1) or not yet (0: the quota gate lets every event through)."}, func() float64 {
			if balances.isLoaded() {
				return 1
			}
			return 0
		}))
	}
	prom.GetOrRegister(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meterline_ingest_keys",
		Help: "Active (not revoked) API keys known to this ingest replica."}, func() float64 {
		ks, _ := keys.Snapshot()
		n := 0
		for i := range ks {
			if ks[i].Active() {
				n++
			}
		}
		return float64(n)
	}))
	prom.GetOrRegister(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "meterline_ingest_keys_unreadable_total",
		Help: "Records of the keys topic this replica could not read; the key or tenant each names is refused until a readable record replaces it."}, func() float64 {
		keys.mu.RLock()
		defer keys.mu.RUnlock()
		return float64(keys.bad)
	}))
	prom.GetOrRegister(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "meterline_ingest_keys_topic_restarts_total",
		Help: "Times this replica found the keys topic deleted and made again (another topic ID, or its partition ending before the offset read), dropped the keys it held and read the topic again from its start."}, func() float64 {
		keys.mu.RLock()
		defer keys.mu.RUnlock()
		return float64(keys.restarts)
	}))
	prom.GetOrRegister(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meterline_ingest_keys_age_seconds",
		Help: "Seconds since this replica last confirmed it had read the keys topic to its end (its ends listed, then reached); past --auth-max-age it answers every request 503."}, func() float64 {
		age, _ := keys.Staleness()
		return age.Seconds()
	}))
	return m
}

func (m *metrics) totals(tenant string) *tenantTotals {
	t := m.tenants[tenant]
	if t == nil {
		t = &tenantTotals{}
		m.tenants[tenant] = t
	}
	return t
}

// observe counts a request answered with status, and with the problem
// type problem ("" for an answer that is not a problem).
func (m *metrics) observe(endpoint, tenant string, status int, problem string, d time.Duration) {
	if tenant == "" {
		tenant = noTenant
	}
	m.requests.WithLabelValues(tenant, strconv.Itoa(status)).Inc()
	if problem != "" {
		m.problems.WithLabelValues(tenant, problem).Inc()
	}
	if endpoint != "" { // "": a request no endpoint takes (404, 405)
		m.duration.WithLabelValues(endpoint).Observe(d.Seconds())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.totals(tenant)
	switch {
	case status < 400:
		t.ok++
	case status < 500:
		t.clientErr++
	default:
		t.serverErr++
	}
}

// The reasons of meterline_ingest_kafka_failed_requests_total.
const (
	reasonNotAcknowledged = "not_acknowledged"
	reasonNotAuthorized   = "not_authorized"
	reasonRefused         = "refused"
)

func (m *metrics) kafkaFailure(reason string) {
	m.kafkaFailed.WithLabelValues(reason).Inc()
}

func (m *metrics) accepted(tenant string, events, records int) {
	m.events.WithLabelValues(tenant, "accepted").Add(float64(events))
	m.records.WithLabelValues(tenant).Add(float64(records))
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.totals(tenant)
	t.events += int64(events)
	t.records += int64(records)
}

func (m *metrics) refused(tenant string, events int) {
	m.events.WithLabelValues(tenant, "refused").Add(float64(events))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.totals(tenant).refused += int64(events)
}

// Reason labels of meterline_ingest_refused_events_total besides the
// codes of EventError.
const (
	// reasonTooManyEvents: an event of a request of more than MaxEvents
	// (413), which names no event.
	reasonTooManyEvents = "too_many_events"
	// reasonOther: a code not in refusedReasons (none today): the label
	// set stays bounded whatever code an error carries.
	reasonOther = "other"
)

// refusedReasons are the reason labels of refused events, the last
// reasonOther.
var refusedReasons = [...]string{schemas.ReasonInvalid, schemas.ReasonOversized, schemas.ReasonInFuture, schemas.ReasonTooOld,
	schemas.ReasonUnknownMeter, CodeUnknownEventType, CodeOutOfScope, schemas.ReasonOverLimit, reasonTooManyEvents, reasonOther}

// refusedEvents counts the events errs names (sorted by index), each once
// under the code of its first error.
func (m *metrics) refusedEvents(tenant string, errs []EventError) {
	var n [len(refusedReasons)]int
	prev := -1
	for i := range errs {
		if errs[i].Index == prev {
			continue
		}
		prev = errs[i].Index
		r := len(refusedReasons) - 1
		for j, code := range refusedReasons[:r] {
			if errs[i].Code == code {
				r = j
				break
			}
		}
		n[r]++
	}
	for r, k := range n {
		if k > 0 {
			m.byReason.WithLabelValues(tenant, refusedReasons[r]).Add(float64(k))
		}
	}
}

// tooManyEvents counts the events of a request of more than MaxEvents.
func (m *metrics) tooManyEvents(tenant string, events int) {
	m.byReason.WithLabelValues(tenant, reasonTooManyEvents).Add(float64(events))
}

// inflightRefused counts a request refused by an in-flight bound.
func (m *metrics) inflightRefused(tenant, limit string) {
	m.inflight.WithLabelValues(tenant, limit).Inc()
}

// stages observes the stages of a successful request.
func (m *metrics) stages(t Timings) {
	for i, d := range []time.Duration{t.Read, t.Parse, t.Enqueue, t.Ack, t.Total - t.Read - t.Parse - t.Enqueue - t.Ack} {
		m.stage[i].Observe(d.Seconds())
	}
}

// gateRefused counts the events of a request the quota gate answered 402.
func (m *metrics) gateRefused(tenant string, events int) {
	m.gate.WithLabelValues(tenant).Add(float64(events))
	m.refused(tenant, events)
}

// Status is the ingest's section of the status page: per tenant, the
// requests answered by class, the events accepted and refused, and the
// tenant's active keys.
func (s *Server) Status() service.Table {
	keys, tenants := s.keys.Snapshot()
	active := map[string]int{}
	for i := range keys {
		if keys[i].Active() {
			active[keys[i].Tenant]++
		}
	}
	m := s.metrics
	m.mu.Lock()
	names := map[string]bool{}
	for n := range m.tenants {
		names[n] = true
	}
	for _, t := range tenants {
		names[t.Name] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	tab := service.Table{ID: "ingest", Title: "HTTP ingest",
		Note:    "Requests since the start by tenant (\"none\": no valid key). Success is answered only once Kafka acknowledged every event. " + s.URL() + ". " + s.keysNote(),
		Columns: []string{"tenant", "success", "4xx", "5xx", "events accepted", "events refused", "records", "active keys"}}
	for _, n := range sorted {
		t := m.tenants[n]
		if t == nil {
			t = &tenantTotals{}
		}
		tab.Rows = append(tab.Rows, []string{n, itoa(t.ok), itoa(t.clientErr), itoa(t.serverErr), itoa(t.events), itoa(t.refused), itoa(t.records), strconv.Itoa(active[n])})
	}
	m.mu.Unlock()
	return tab
}

// keysNote says how old the keys are, for the status page.
func (s *Server) keysNote() string {
	age, stale := s.keys.Staleness()
	bound := "no bound"
	if s.cfg.AuthMaxAge > 0 {
		bound = "bound " + s.cfg.AuthMaxAge.String()
	}
	note := fmt.Sprintf("Keys topic last confirmed read to its end %s ago (%s)", age.Round(time.Second), bound)
	if stale {
		note += ": STALE, every request is answered 503 until the keys topic is read to its end again"
	}
	return note + "."
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
