package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// stopOnLine is a stderr that cancels the process's context, as a
// signal would, when a line containing at appears: from inside the
// logging call, so that the step that logged it runs on stopped.
type stopOnLine struct {
	testenv.SyncBuffer
	at     string
	cancel context.CancelFunc
	once   sync.Once
}

func (s *stopOnLine) Write(p []byte) (int, error) {
	n, err := s.SyncBuffer.Write(p)
	if strings.Contains(string(p), s.at) {
		s.once.Do(s.cancel)
	}
	return n, err
}

// stopOnRequest starts a kfake cluster with the pipeline's topics and
// returns a context that ends, as a signal would, when a broker receives
// its first request of key, which it answers only a second later, and
// the brokers.
func stopOnRequest(t *testing.T, key kmsg.Key) (context.Context, string) {
	c, brokers := testenv.KFake(t)
	b := strings.Join(brokers, ",")
	if code, _, errOut := run(t, "", "topics", "create", "--brokers", b); code != 0 {
		t.Fatalf("topics create: exit %d\n%s", code, errOut)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
		cancel()
		c.SleepControl(func() { time.Sleep(time.Second) })
		return nil, nil, false
	})
	return ctx, b
}

// TestStopDuringStartIsClean: a stop while a stage starts, once a broker
// answered (its checks of the topics' configs), ends `meterline run`,
// `dedup` and `aggregate` as a stop at any other time does: status 0 and
// "stage stopped", not status 1 with "context canceled". The signal comes
// when the broker receives the first DescribeConfigs (a stage's start-up
// check; awaitKafka sends none), which it answers only after the stop.
func TestStopDuringStartIsClean(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	for _, cmd := range [][]string{{"run", "--no-sink"}, {"dedup"}, {"aggregate"}} {
		t.Run(cmd[0], func(t *testing.T) {
			ctx, b := stopOnRequest(t, kmsg.DescribeConfigs)
			args := append(cmd, "--brokers", b, "--instance-id", "i1", "--state-dir", filepath.Join(t.TempDir(), "state"),
				"--metrics-addr", "127.0.0.1:0")
			if cmd[0] != "aggregate" {
				args = append(args, "--dedup-keys-file", keys)
			}
			var out, errb testenv.SyncBuffer
			code := Main(ctx, args, IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
			if ctx.Err() == nil {
				t.Fatalf("exit %d before the stage checked its topics:\n%s", code, errb.String())
			}
			if code != 0 || strings.Contains(errb.String(), "context canceled") || !strings.Contains(errb.String(), `"msg":"stage stopped"`) {
				t.Errorf("stopped while starting: exit %d, want 0 and \"stage stopped\"; stderr:\n%s", code, errb.String())
			}
		})
	}
}

// TestDemoStopDuringStartIsClean: a stop while the demo starts its
// embedded broker and stages exits 0, saying the demo stopped, rather
// than 1 with "context canceled".
func TestDemoStopDuringStartIsClean(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errb := &stopOnLine{at: "embedded broker and state in", cancel: cancel}
	var out testenv.SyncBuffer
	code := Main(ctx, []string{"demo", "--dir", t.TempDir(), "--duration", "1s", "--http", "", "--ingest-addr", ""},
		IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: errb})
	if code != 0 || strings.Contains(errb.String(), "context canceled") || !strings.Contains(errb.String(), "meterline demo: stopped before the demo started") {
		t.Errorf("stopped while starting: exit %d, want 0; stderr:\n%s", code, errb.String())
	}
}

// TestStoppedAtStartKeepsRealErrors: only an error that is the stop and
// nothing else, once the context has ended, is a clean stop.
func TestStoppedAtStartKeepsRealErrors(t *testing.T) {
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	real := errors.New("migration 3 failed")
	for _, c := range []struct {
		ctx  context.Context
		err  error
		want bool
	}{
		{stopped, fmt.Errorf("dedup: %w", context.Canceled), true},
		{stopped, &ExitError{Code: 1, Err: errors.Join(context.Canceled, fmt.Errorf("x: %w", context.Canceled))}, true},
		{stopped, errors.Join(context.Canceled, real), false},
		{stopped, fmt.Errorf("%w: %w", real, context.Canceled), false},
		{stopped, real, false},
		{stopped, nil, false},
		{context.Background(), fmt.Errorf("dedup: %w", context.Canceled), false},
	} {
		if got := stoppedAtStart(c.ctx, c.err); got != c.want {
			t.Errorf("stoppedAtStart(ctx ended %t, %v) = %t, want %t", c.ctx.Err() != nil, c.err, got, c.want)
		}
	}
}

// TestConnectStopDuringStartIsClean: `meterline sink` and `meterline
// ingest`, which check the brokers with connectKafka rather than wait for
// them, end a stop during their start-up (the brokers' first Metadata
// answer, then ClickHouse's login check and migrations for the sink) as
// a stop at any other time: status 0 and "stage stopped", not status 1
// with "context canceled". The ClickHouse server takes connections and
// never answers.
func TestConnectStopDuringStartIsClean(t *testing.T) {
	ch := serveTCP(t, func(net.Conn) {})
	for _, cmd := range [][]string{{"ingest", "--addr", "127.0.0.1:0"}, {"sink"}, {"sink", "--migrate"}} {
		t.Run(strings.Join(cmd, " "), func(t *testing.T) {
			ctx, b := stopOnRequest(t, kmsg.Metadata)
			args := append(cmd, "--brokers", b, "--metrics-addr", "127.0.0.1:0")
			if cmd[0] == "sink" {
				args = append(args, "--instance-id", "i1", "--clickhouse", ch)
			}
			var out, errb testenv.SyncBuffer
			code := Main(ctx, args, IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
			if ctx.Err() == nil {
				t.Fatalf("exit %d before the command asked the brokers:\n%s", code, errb.String())
			}
			// The stages' own log lines may name the cancellation (a
			// retry cut short); the command's error line may not.
			if code != 0 || strings.Contains("\n"+errb.String(), "\nmeterline ") || !strings.Contains(errb.String(), `"msg":"stage stopped"`) {
				t.Errorf("stopped while starting: exit %d, want 0, \"stage stopped\" and no error; stderr:\n%s", code, errb.String())
			}
		})
	}
}

// TestSinkStopDuringMigrationIsClean: a stop while `meterline sink
// --migrate` applies the migrations, on a real ClickHouse, is a clean
// stop too. The signal comes once the sink has sent ClickHouse 20000
// bytes, part of the migrations' statements (about 44000).
func TestSinkStopDuringMigrationIsClean(t *testing.T) {
	_, db := testenv.ClickHouseDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	server := testenv.RealClickHouse(t)
	var sent atomic.Int64
	ch := serveTCP(t, func(in net.Conn) {
		out, err := net.Dial("tcp", server)
		if err != nil {
			return
		}
		defer out.Close()
		go io.Copy(in, out)
		buf := make([]byte, 4096)
		for {
			n, err := in.Read(buf)
			if n > 0 && sent.Add(int64(n)) > 20000 {
				cancel()
			}
			if _, werr := out.Write(buf[:n]); err != nil || werr != nil {
				return
			}
		}
	})
	_, brokers := testenv.KFake(t)
	var out, errb testenv.SyncBuffer
	code := Main(ctx, []string{"sink", "--migrate", "--database", db, "--brokers", strings.Join(brokers, ","), "--instance-id", "i1",
		"--clickhouse", ch, "--metrics-addr", "127.0.0.1:0"}, IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
	if ctx.Err() == nil {
		t.Fatalf("exit %d before the migrations were sent:\n%s\n%s", code, out.String(), errb.String())
	}
	if code != 0 || strings.Contains("\n"+errb.String(), "\nmeterline ") || !strings.Contains(errb.String(), `"msg":"stage stopped"`) {
		t.Errorf("stopped while migrating: exit %d, want 0, \"stage stopped\" and no error; stdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
}

// serveTCP listens on a loopback port and runs handle on each connection
// until the test ends, when it closes the listener and the connections;
// it returns the address.
func serveTCP(t *testing.T, handle func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { <-done; c.Close() }()
			go handle(c)
		}
	}()
	return ln.Addr().String()
}
