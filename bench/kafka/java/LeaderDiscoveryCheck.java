import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Kafka's Java producer (default settings: idempotence on, acks=all) sending one record to
 * partition 0 of a topic for every "send" line on stdin, printing how long its acknowledgement
 * took and at which offset: the client side of KIP-951 leader discovery after a partition moved
 * while the producer was idle (tests/integration/cluster/test_leader_discovery.py). Prints
 * "ready" once its first record is acknowledged; stops at the end of stdin. "flood MS" sends one
 * record at a time for MS milliseconds and prints the slowest acknowledgement (a move's gap).
 */
public class LeaderDiscoveryCheck {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            byte[] value = "kip-951".getBytes(StandardCharsets.UTF_8);
            producer.send(new ProducerRecord<>(topic, 0, null, value)).get();
            System.out.println("ready");
            System.out.flush();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                String[] words = line.trim().split(" ");
                if (words[0].equals("flood")) {
                    // one record at a time for the given milliseconds: the slowest acknowledgement
                    // is the gap a move left in the stream
                    long until = System.nanoTime() + Long.parseLong(words[1]) * 1_000_000L;
                    long slowest = 0;
                    int count = 0;
                    while (System.nanoTime() < until) {
                        long t0 = System.nanoTime();
                        producer.send(new ProducerRecord<>(topic, 0, null, value)).get();
                        slowest = Math.max(slowest, (System.nanoTime() - t0) / 1000);
                        count++;
                    }
                    System.out.println("{\"records\": " + count + ", \"slowest_micros\": " + slowest + "}");
                    System.out.flush();
                    continue;
                }
                if (!words[0].equals("send")) {
                    continue;
                }
                long start = System.nanoTime();
                RecordMetadata sent = producer.send(new ProducerRecord<>(topic, 0, null, value)).get();
                long micros = (System.nanoTime() - start) / 1000;
                System.out.println("{\"offset\": " + sent.offset() + ", \"micros\": " + micros + "}");
                System.out.flush();
            }
        }
    }
}
