package producer

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// unreachable returns the address of a port nothing listens on: a broker
// that is down.
func unreachable(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestCloseWhileSendsWait: with the brokers down, a Send without a
// deadline and a SendAsync waiting for room in a full buffer both wait;
// Close must still return, and fail both with an error, rather than wait
// for them forever.
func TestCloseWhileSendsWait(t *testing.T) {
	p, err := New(WithBrokers(unreachable(t)), WithClock(fixedClock), WithMaxBufferedRecords(1))
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	p.SendAsync(goodEvent(), func(err error) { first <- err }) // fills the buffer
	queued := make(chan error, 1)
	go func() {
		e := goodEvent()
		e.EventID = "req-43"
		p.SendAsync(e, func(err error) { queued <- err }) // waits for room
	}()
	sent := make(chan error, 1)
	go func() {
		e := goodEvent()
		e.EventID = "req-44"
		sent <- p.Send(context.Background(), e)
	}()
	// Both are waiting once the client counts three records: the first
	// buffered, the other two blocked for room (BufferedProduceRecords
	// counts both). Closing before would test sends that start after
	// Close, which fail with ErrClosed without waiting.
	deadline := time.Now().Add(10 * time.Second)
	for p.Client().BufferedProduceRecords() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the client holds %d records, want 3: the sends are not waiting", p.Client().BufferedProduceRecords())
		}
		time.Sleep(5 * time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while sends waited for the brokers")
	}
	for name, ch := range map[string]chan error{"first SendAsync": first, "waiting SendAsync": queued, "Send": sent} {
		select {
		case err := <-ch:
			if !errors.Is(err, ErrClosed) && !errors.Is(err, kgo.ErrClientClosed) {
				t.Errorf("%s after Close: %v, want ErrClosed or the client's", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s not failed after Close", name)
		}
	}
}
