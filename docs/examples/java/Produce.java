// Produce usage events to Meterline's usage.events with kafka-clients and
// Apache Avro: the framed key and Avro single-object encoding
// (docs/producing.md). Run with Java 17: java -cp <jars> Produce.java
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Properties;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Produce {
    // schemas/usage_event.avsc, as Meterline embeds it.
    static final Schema SCHEMA = new Schema.Parser().parse("""
        {"type": "record", "name": "UsageEvent", "namespace": "meterline", "fields": [
          {"name": "event_id", "type": "string"},
          {"name": "customer_id", "type": "string"},
          {"name": "meter", "type": "string"},
          {"name": "quantity", "type": "long"},
          {"name": "event_time", "type": "long"},
          {"name": "source", "type": "string", "default": ""},
          {"name": "properties", "default": [], "type": {"type": "array", "items": {
            "type": "record", "name": "Property", "fields": [
              {"name": "name", "type": "string"},
              {"name": "value", "type": "string"}]}}}]}
        """);

    // Avro's single-object encoding: C3 01, the schema's CRC-64-AVRO
    // fingerprint as 8 bytes little-endian, then the body.
    static final BinaryMessageEncoder<GenericRecord> ENCODER =
        new BinaryMessageEncoder<>(GenericData.get(), SCHEMA);

    // Each part prefixed by its length in bytes (UTF-8) and a colon:
    // 4:acme9:api_calls6:req-42. Never join with a separator.
    static byte[] framed(String... parts) {
        StringBuilder sb = new StringBuilder();
        for (String p : parts) {
            sb.append(p.getBytes(StandardCharsets.UTF_8).length).append(':').append(p);
        }
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    static GenericRecord event(String id, String customer, String meter, long quantity, long timeMs) {
        GenericRecord r = new GenericData.Record(SCHEMA);
        r.put("event_id", id);
        r.put("customer_id", customer);
        r.put("meter", meter);
        r.put("quantity", quantity);
        r.put("event_time", timeMs);
        r.put("source", "java-example");
        r.put("properties", List.of()); // sorted by name, names unique
        return r;
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, System.getenv().getOrDefault("METERLINE_BROKERS", "127.0.0.1:9092"));
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        // The default partitioner is murmur2 of the key: every copy of an
        // event lands in the partition dedup expects.
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        String topic = System.getenv().getOrDefault("METERLINE_TOPIC", "usage.events");
        long now = System.currentTimeMillis();
        List<GenericRecord> events = List.of(
            event("java-req-1", "acme", "api_calls", 3, now),
            event("java-req-2", "acme", "tokens", 1200, now));
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (GenericRecord e : events) {
                byte[] key = framed(e.get("customer_id").toString(), e.get("meter").toString(), e.get("event_id").toString());
                ByteBuffer value = ENCODER.encode(e);
                byte[] bytes = new byte[value.remaining()];
                value.get(bytes);
                producer.send(new ProducerRecord<>(topic, key, bytes)).get();
                producer.send(new ProducerRecord<>(topic, key, bytes)).get(); // a retry: dedup drops the copy
            }
        }
        System.out.println("{\"sent\": " + 2 * events.size() + "}");
    }
}
