// Command meterline counts every usage event exactly once. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/meterline/meterline/internal/cli"
)

// defaultGCPercent is the GOGC of a meterline process unless the GOGC
// environment variable says otherwise. The live Go heap of a stage is small
// (Pebble's block cache and memtables are allocated outside it) and churns
// fast (one decoded record and a few output records per event), so Go's
// default of 100 spends about a tenth of a stage's CPU in the collector;
// at 400, bench aggregate went from 199k to 231k events/s (1M events, one
// round each). Set GOMEMLIMIT in containers with a hard memory limit.
const defaultGCPercent = 400

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// A second signal exits at once.
		<-ctx.Done()
		stop()
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		<-ch
		os.Exit(130)
	}()
	code := cli.Main(ctx, os.Args[1:], cli.OSIO())
	stop()
	os.Exit(code)
}
