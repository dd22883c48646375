# Produce usage events to Meterline's usage.events with confluent-kafka and
# fastavro: the framed key and Avro single-object encoding (docs/producing.md).
import io
import json
import os
import time

import fastavro
from confluent_kafka import Producer

# schemas/usage_event.avsc, as Meterline embeds it.
SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "UsageEvent", "namespace": "meterline",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "customer_id", "type": "string"},
        {"name": "meter", "type": "string"},
        {"name": "quantity", "type": "long"},
        {"name": "event_time", "type": "long"},
        {"name": "source", "type": "string", "default": ""},
        {"name": "properties", "default": [], "type": {"type": "array", "items": {
            "type": "record", "name": "Property", "fields": [
                {"name": "name", "type": "string"},
                {"name": "value", "type": "string"}]}}},
    ],
})

# The single-object header: C3 01, then the schema's CRC-64-AVRO fingerprint
# as 8 bytes, little-endian (Avro spec). fastavro returns the fingerprint as
# hex of those 8 bytes, little-endian already.
FINGERPRINT = bytes.fromhex(fastavro.schema.fingerprint(
    fastavro.schema.to_parsing_canonical_form(SCHEMA), "CRC-64-AVRO"))
HEADER = b"\xc3\x01" + FINGERPRINT


def encode(event):
    body = io.BytesIO()
    fastavro.schemaless_writer(body, SCHEMA, event)
    return HEADER + body.getvalue()


def framed(*parts):
    # Each part prefixed by its length in bytes (UTF-8) and a colon:
    # 4:acme9:api_calls6:req-42. Never join with a separator.
    out = b""
    for p in parts:
        b = p.encode("utf-8")
        out += str(len(b)).encode() + b":" + b
    return out


producer = Producer({
    "bootstrap.servers": os.environ.get("METERLINE_BROKERS", "127.0.0.1:9092"),
    "acks": "all",
    "enable.idempotence": True,
    # Kafka's Java partitioner (murmur2): every copy of an event lands in
    # the partition dedup expects. librdkafka's default (consistent_random)
    # works too: dedup re-routes each such record once, at a cost.
    "partitioner": "murmur2_random",
})
topic = os.environ.get("METERLINE_TOPIC", "usage.events")

now_ms = int(time.time() * 1000)
events = [
    {"event_id": "py-req-1", "customer_id": "acme", "meter": "api_calls", "quantity": 3,
     "event_time": now_ms, "source": "python-example", "properties": []},
    {"event_id": "py-req-2", "customer_id": "acme", "meter": "tokens", "quantity": 1200,
     "event_time": now_ms, "source": "python-example",
     "properties": [{"name": "model", "value": "m1"}]},  # sorted by name
]
for e in events:
    key = framed(e["customer_id"], e["meter"], e["event_id"])
    producer.produce(topic, key=key, value=encode(e))
    producer.produce(topic, key=key, value=encode(e))  # a retry: dedup drops the copy
if producer.flush(30) != 0:
    raise SystemExit("not every event was acknowledged")
print(json.dumps({"sent": 2 * len(events)}))
