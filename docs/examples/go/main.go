// Command go is the Go producer of docs/producing.md: Meterline's producer
// library frames the key, encodes the event (Avro single-object encoding)
// and sends it with acks=all on an idempotent producer.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/meterline/meterline/producer"
)

func main() {
	brokers, topic := os.Getenv("METERLINE_BROKERS"), os.Getenv("METERLINE_TOPIC")
	if brokers == "" {
		brokers = "127.0.0.1:9092"
	}
	if topic == "" {
		topic = "usage.events"
	}
	p, err := producer.New(producer.WithBrokers(brokers), producer.WithTopic(topic), producer.WithSource("go-example"))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now()
	events := []producer.Event{
		{EventID: "go-req-1", CustomerID: "acme", Meter: "api_calls", Quantity: 3, EventTime: now},
		{EventID: "go-req-2", CustomerID: "acme", Meter: "tokens", Quantity: 1200, EventTime: now,
			Properties: map[string]string{"model": "m1"}},
	}
	for _, e := range events {
		for range 2 { // a retry: dedup drops the copy
			if err := p.Send(ctx, e); err != nil { // returns once acknowledged
				log.Fatal(err)
			}
		}
	}
	fmt.Printf("{\"sent\": %d}\n", 2*len(events))
}
