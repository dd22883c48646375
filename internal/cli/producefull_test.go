package cli

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/producer"
)

// TestProduceStopsWithAFullBuffer: told to stop while the brokers are down
// and the producer's buffer is full (a sender waiting for room), Produce
// still returns within its grace period (produceStopGrace), as
// docs/producing.md promises, rather than wait for the brokers. It only
// waits, on idleLane.
func TestProduceStopsWithAFullBuffer(t *testing.T) {
	parallelWaitingTest(t, &idleLane)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	p, err := producer.New(producer.WithBrokers(down), producer.WithMaxBufferedRecords(1))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ts := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	var in strings.Builder
	for i := range 5 {
		fmt.Fprintf(&in, `{"event_id":"req-%d","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"%s"}`+"\n", i, ts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Second, cancel)
	done := make(chan ProduceSummary, 1)
	go func() { done <- Produce(ctx, strings.NewReader(in.String()), p, ProduceOptions{}) }()
	select {
	case s := <-done:
		if s.Sent != 0 || s.Failed+s.Unacked == 0 {
			t.Errorf("summary %+v, want nothing sent and the events not acknowledged reported", s)
		}
	case <-time.After(produceStopGrace + 10*time.Second):
		t.Fatal("Produce did not return after the stop while its buffer was full")
	}
}
