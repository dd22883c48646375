package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/producer"
)

// TestProduceStopsWhileInputIsIdle: told to stop (SIGINT, SIGTERM: its
// context ends) while its input is open but idle (a service that pipes
// events in and has none to write now, a terminal waiting for a line),
// Produce returns within its grace period, as docs/producing.md promises,
// counting what it sent, rather than wait for the next line of the input;
// the part of a line read when it stopped is not taken for a bad line.
func TestProduceStopsWhileInputIsIdle(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(4, "usage.events"))
	p, err := producer.New(producer.WithBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pr, pw := io.Pipe()
	defer pw.Close() // the writer is alive for the whole test: the input never ends
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan ProduceSummary, 1)
	go func() { done <- Produce(ctx, pr, p, ProduceOptions{}) }()
	ts := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	line := fmt.Sprintf(`{"event_id":"req-1","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"%s"}`+"\n", ts)
	if _, err := pw.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(testenv.ReadAll(t, brokers, "usage.events")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("line 1, written to the pipe, not sent within 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Half a line, the rest of which the writer has yet to write: it is
	// neither sent nor reported bad.
	if _, err := pw.Write([]byte(`{"event_id":"req-2","customer_id":"acme"`)); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case s := <-done:
		if s.Sent != 1 || s.Lines != 1 || s.Bad != 0 || s.Unacked != 0 || s.Err == nil || !strings.Contains(s.Err.Error(), "interrupted") {
			t.Errorf("summary %+v, want 1 line, 1 sent, none bad, and the interruption reported", s)
		}
	case <-time.After(produceStopGrace + 5*time.Second):
		t.Fatal("Produce did not return after the stop while its input was open and idle")
	}
}
