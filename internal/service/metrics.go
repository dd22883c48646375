package service

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// RejectedCounter returns meterline_rejected_total{stage,reason}, shared by
// every stage of a process: registered on first use, the same collector
// after that (stages running together in `meterline run` share one
// registry).
func RejectedCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meterline_rejected_total",
		Help: "Records parked in usage.rejected, by stage and reason."}, []string{"stage", "reason"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
		panic(err) // a programming error: another metric took the name
	}
	return c
}
