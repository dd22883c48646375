package service

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/prom"
)

// The metric helpers live in internal/prom, which the stage runtimes use
// without importing this package; these forward to them for the callers
// that still reach them here.

// GetOrRegister is prom.GetOrRegister.
func GetOrRegister[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	return prom.GetOrRegister(reg, c)
}

// RejectedCounter is prom.RejectedCounter.
func RejectedCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	return prom.RejectedCounter(reg)
}

// Factory is prom.Factory.
type Factory = prom.Factory

// NewFactory is prom.NewFactory.
func NewFactory(reg prometheus.Registerer) Factory { return prom.NewFactory(reg) }
