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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
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
}

// LogEntriesDropped counts the log entries the process's logger left out
// (the command line's logger samples each message: a flood of rejected
// records, whose number a producer controls, must not flood the logs).
var LogEntriesDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "meterline_log_entries_dropped_total",
	Help: "Log entries left out by sampling: past the first 100 entries of one message and level in a second, one in 100 is written."})

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
	s := &Server{ln: ln, log: log, Mux: http.NewServeMux(), ready: ready, status: newStatusPage(reg, time.Now)}
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
	// written within seconds, and an idle keep-alive connection is closed
	// (docs/operations.md, HTTP servers).
	s.srv = &http.Server{Handler: s.Mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	return s, nil
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
