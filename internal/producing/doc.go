// Package producing tests the producers of docs/producing.md — Python
// (confluent-kafka and fastavro), Java (kafka-clients and Apache Avro) and
// Go (the producer library) — by running each example file against the
// real broker and counting its events downstream, through dedup.
//
// The package has no code outside its tests.
package producing
