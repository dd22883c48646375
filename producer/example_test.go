package producer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/meterline/meterline/producer"
)

// A service reports usage and waits until the brokers acknowledged it. The
// event ID comes from the request ID, so a retried request is recognised
// as the same usage and billed once.
func Example() {
	// An in-process broker stands in for Kafka in this example; a service
	// passes its real brokers instead.
	cluster, err := kfake.NewCluster(kfake.SeedTopics(4, "usage.events"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	p, err := producer.New(
		producer.WithBrokers(cluster.ListenAddrs()...),
		producer.WithSource("api-gateway"),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	err = p.Send(context.Background(), producer.Event{
		EventID:    producer.EventID("api-gateway", "req-7f3a"),
		CustomerID: "acme",
		Meter:      "api_calls",
		Quantity:   1,
		EventTime:  time.Now(),
	})
	fmt.Println("sent:", err == nil)
	// Output: sent: true
}

func ExampleEventID() {
	// The same facts give the same ID on every retry.
	fmt.Println(producer.EventID("api-gateway", "req-42"))
	fmt.Println(producer.EventID("api-gateway", "req-42") == producer.EventID("api-gateway", "req-42"))
	// Parts are length-prefixed, so moving a separator changes the ID.
	fmt.Println(producer.EventID("a:b", "c") == producer.EventID("a", "b:c"))
	// Output:
	// cc8ed110d2c9652c6efe00581a9665d9
	// true
	// false
}

func ExampleEvent_Key() {
	e := producer.Event{CustomerID: "acme", Meter: "api_calls", EventID: "req-42"}
	fmt.Printf("%s\n", e.Key())
	// Output: 4:acme9:api_calls6:req-42
}

func ExampleProducer_Record() {
	p, err := producer.New()
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	_, err = p.Record(producer.Event{EventID: "req-1", CustomerID: "acme", Meter: "api_calls",
		Quantity: -5, EventTime: time.Now()})
	var fe *producer.FieldError
	if errors.As(err, &fe) {
		fmt.Println(fe.Field, "→", err)
	}
	// Output: quantity → quantity: must not be negative (got -5)
}

func ExampleParseJSON() {
	e, err := producer.ParseJSON([]byte(`{"event_id":"req-42","customer_id":"acme","meter":"api_calls",` +
		`"quantity":3,"event_time":"2026-11-29T12:00:00.250Z","properties":{"model":"m1"}}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(e.CustomerID, e.Meter, e.Quantity, e.EventTime.UnixMilli(), e.Properties["model"])

	_, err = producer.ParseJSON([]byte(`{"event_id":"req-43","customer_id":"acme","meter":"api_calls","event_time":1795003200250}`))
	fmt.Println(err)
	// Output:
	// acme api_calls 3 1795953600250 m1
	// quantity: is missing
}

// A service authenticates with SASL/SCRAM-SHA-512. Over TLS it also
// passes WithTLS with its CA (RootCAs) and, where the brokers ask for one,
// its client certificate.
func ExampleWithSASL() {
	// In a service the password comes from a file or the environment,
	// never from a command-line argument.
	password := "example-password"
	// An in-process broker that requires SCRAM stands in for Kafka.
	cluster, err := kfake.NewCluster(kfake.SeedTopics(4, "usage.events"), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "api-gateway", password))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	p, err := producer.New(
		producer.WithBrokers(cluster.ListenAddrs()...),
		producer.WithSASL(scram.Auth{User: "api-gateway", Pass: password}.AsSha512Mechanism()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	err = p.Send(context.Background(), producer.Event{EventID: producer.EventID("api-gateway", "req-7f3b"),
		CustomerID: "acme", Meter: "api_calls", Quantity: 1, EventTime: time.Now()})
	fmt.Println("sent:", err == nil)
	// Output: sent: true
}
