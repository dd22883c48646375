// Package service runs the HTTP side of a Meterline process: Prometheus
// metrics, liveness and readiness, and a status page, on one port
// (docs/operations.md, Health, metrics and logs).
package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
)

// Check returns nil when a part of the process is ready, or why not.
type Check func() error

// Server serves /metrics, /healthz, /readyz, and the status page at /
// (HTML, refreshing itself) and /status.json.
type Server struct {
	srv    *http.Server
	ln     net.Listener
	log    *zap.Logger
	Mux    *http.ServeMux
	ready  []Check
	status *statusPage
	// Host check (allowedHost): the listener is on loopback; the host
	// names AllowHosts gave, lower case, without a trailing dot.
	loopback bool
	hosts    map[string]bool
	// refusedLog bounds the lines of requests refused for their Host;
	// refusedLeftOut counts those left out since the last line.
	refusedLog     *rate.Limiter
	refusedLeftOut atomic.Int64
}

// A client that reaches the port decides how many of its requests are
// refused for their Host, and how long their Host and path are (up to
// maxHeaderBytes): their lines are bounded, refusedLogBurst at once and
// then one a second, the next line counting those left out, and each
// quotes at most refusedLogQuote bytes of the Host and of the path.
const (
	refusedLogBurst = 10
	refusedLogQuote = 256
)

// maxHeaderBytes bounds a request's headers (net/http's default: 1 MB,
// which a connection that stalls holds until ReadHeaderTimeout). Scrapes
// send a few hundred bytes; a browser's request for the status page
// sends the host's cookies, which common servers refuse past 8 KB a
// line. A larger request is answered 431.
const maxHeaderBytes = 16 << 10

// LogEntriesDropped counts the log entries the process's logger left out
// (the command line's logger samples each message: a flood of rejected
// records, whose number a producer controls, must not flood the logs).
var LogEntriesDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "meterline_log_entries_dropped_total",
	Help: "Log entries left out by sampling: of the entries of one message and level, the first 100 in a second are written."})

// NewRegistry returns a registry with the Go and process collectors,
// LogEntriesDropped and meterline_build_info.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), LogEntriesDropped,
		newBuildInfo(BuildOf()))
	return reg
}

// Listen binds addr ("127.0.0.1:9464"; ":9464" is every interface). Readiness is the conjunction
// of the checks.
func Listen(addr string, reg *prometheus.Registry, log *zap.Logger, ready ...Check) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("service: listen %s: %w", addr, err)
	}
	s := &Server{ln: ln, log: log, Mux: http.NewServeMux(), ready: ready, status: newStatusPage(reg, time.Now),
		refusedLog: rate.NewLimiter(1, refusedLogBurst)}
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		s.loopback = a.IP.IsLoopback()
	}
	s.Mux.HandleFunc("/", s.serveStatusHTML)
	s.Mux.HandleFunc("/status.json", s.serveStatusJSON)
	s.Mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s.Mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	s.Mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.readiness(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	// Slow clients are cut off: no handler reads a body, an answer is
	// written within seconds, an idle keep-alive connection is closed,
	// and headers are bounded (docs/operations.md, HTTP servers).
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: maxHeaderBytes}
	return s, nil
}

// AllowHosts names the hosts (DNS names, without a port) the server
// answers besides IP addresses, localhost and .localhost names, whatever
// address it is bound to. Without them, a server bound to loopback
// answers only those, and one bound to another address any host. Call
// it before Run.
func (s *Server) AllowHosts(names ...string) {
	for _, n := range names {
		if n = normalHost(n); n != "" {
			if s.hosts == nil {
				s.hosts = map[string]bool{}
			}
			s.hosts[n] = true
		}
	}
}

// serveHTTP refuses a request whose Host the server does not answer
// (allowedHost), and serves the others on Mux.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.allowedHost(r.Host) {
		s.logRefusedHost(r)
		http.Error(w, fmt.Sprintf("host %q not allowed: use the server's IP address or localhost, or name the host in --metrics-allowed-hosts", r.Host),
			http.StatusForbidden)
		return
	}
	s.Mux.ServeHTTP(w, r)
}

// logRefusedHost logs a request refused for its Host, bounded (refusedLog,
// refusedLogQuote).
func (s *Server) logRefusedHost(r *http.Request) {
	if !s.refusedLog.Allow() {
		s.refusedLeftOut.Add(1)
		return
	}
	fs := []zap.Field{zap.String("host", quoteBound(r.Host)), zap.String("path", quoteBound(r.URL.Path)), zap.String("remote", r.RemoteAddr)}
	if n := s.refusedLeftOut.Swap(0); n > 0 {
		fs = append(fs, zap.Int64("left_out", n))
	}
	s.log.Warn("request refused: its Host is not one this server answers (--metrics-allowed-hosts)", fs...)
}

// quoteBound is v cut to refusedLogQuote bytes on a character boundary,
// with "…" when cut.
func quoteBound(v string) string {
	if len(v) <= refusedLogQuote {
		return v
	}
	n := refusedLogQuote
	for n > 0 && !utf8.RuneStart(v[n]) {
		n--
	}
	return v[:n] + "…"
}

// allowedHost reports whether the server answers a request with Host
// header host: DNS rebinding (docs/operations.md, HTTP servers) lets a
// page of any domain read a server on the browser's machine through that
// domain's name, so a server bound to loopback, or given host names,
// answers only those names, localhost, .localhost names (which always
// resolve to loopback) and IP addresses (a page is never served from the
// server's own address).
func (s *Server) allowedHost(host string) bool {
	if !s.loopback && s.hosts == nil {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = normalHost(host)
	if host == "" {
		return false
	}
	if net.ParseIP(strings.Trim(host, "[]")) != nil {
		return true
	}
	return host == "localhost" || strings.HasSuffix(host, ".localhost") || s.hosts[host]
}

// normalHost is a host name in lower case, without a trailing dot.
func normalHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx ends, then shuts down within 5 s.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	s.log.Info("serving metrics and health", zap.String("addr", s.Addr()), zap.String("status_page", "http://"+s.Addr()+"/"))
	select {
	case err := <-errc:
		return fmt.Errorf("service: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// StageError names the stage of err once: err as it is when its text
// already starts with "<stage>: " (the sink's errors do), else wrapped
// with that prefix.
func StageError(stage string, err error) error {
	if err == nil || strings.HasPrefix(err.Error(), stage+": ") {
		return err
	}
	return fmt.Errorf("%s: %w", stage, err)
}
