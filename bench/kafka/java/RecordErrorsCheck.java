// What the Apache Kafka Java producer tells each record of a batch the cluster refused for some of
// its records (KIP-467: the Produce response's record_errors), on Apache Kafka or TidalMQ. Prints
// one JSON report line on stdout. Run as a single-file source program on the assembled classpath:
//   java -cp "<cache>/kafka/<version>/lib/*" bench/kafka/java/RecordErrorsCheck.java BOOTSTRAP SUFFIX
//
// It creates two topics of one partition: "keys-SUFFIX" (cleanup.policy=compact) and
// "times-SUFFIX" (message.timestamp.before.max.ms=3600000). To the compacted topic it sends one
// batch of three records (keyed, keyless, keyed; linger.ms keeps them in one batch), then one
// keyless record alone; to the other, one record two hours old. For every record it reports the
// class and message of the exception its send completed with ("ok" when appended). With record
// errors, only the keyless record gets the compacted topic's message and the others a generic
// "part of a batch" exception; without them every record gets the partition's error message.

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public class RecordErrorsCheck {
    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: RecordErrorsCheck BOOTSTRAP SUFFIX");
            System.exit(2);
        }
        String bootstrap = args[0];
        String keys = "keys-" + args[1];
        String times = "times-" + args[1];
        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            admin.createTopics(List.of(
                    new NewTopic(keys, 1, (short) 1).configs(Map.of("cleanup.policy", "compact")),
                    new NewTopic(times, 1, (short) 1).configs(
                            Map.of("message.timestamp.before.max.ms", "3600000"))))
                    .all().get(30, TimeUnit.SECONDS);
        }
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.LINGER_MS_CONFIG, "1000"); // the batch's three sends stay together
        StringBuilder out = new StringBuilder("{\"batch\":[");
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            // metadata first, so the three sends are not held apart waiting for it
            producer.partitionsFor(keys);
            producer.partitionsFor(times);
            List<Future<RecordMetadata>> batch = new ArrayList<>();
            batch.add(producer.send(new ProducerRecord<>(keys, "a", "1")));
            batch.add(producer.send(new ProducerRecord<>(keys, null, "2")));
            batch.add(producer.send(new ProducerRecord<>(keys, "c", "3")));
            producer.flush();
            for (int i = 0; i < batch.size(); i++) {
                out.append(i == 0 ? "" : ",").append(outcome(batch.get(i)));
            }
            out.append("],\"alone\":");
            Future<RecordMetadata> alone = producer.send(new ProducerRecord<>(keys, null, "4"));
            producer.flush();
            out.append(outcome(alone));
            long old = System.currentTimeMillis() - 2 * 3600 * 1000L;
            Future<RecordMetadata> late = producer.send(
                    new ProducerRecord<>(times, null, old, "k", "5"));
            producer.flush();
            out.append(",\"late\":").append(outcome(late)).append("}");
        }
        System.out.println(out);
    }

    private static String outcome(Future<RecordMetadata> sent) throws InterruptedException {
        try {
            sent.get();
            return "{\"error\":null,\"message\":null}";
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            return "{\"error\":" + q(cause.getClass().getSimpleName())
                    + ",\"message\":" + q(cause.getMessage()) + "}";
        }
    }

    private static String q(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
