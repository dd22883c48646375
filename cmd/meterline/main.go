// Command meterline counts every usage event exactly once. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/meterline/meterline/internal/cli"
)

func main() {
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
