// Checks the Apache Kafka Java client against a cluster (Apache Kafka or TidalMQ) and prints one
// JSON report line on stdout. Run as a single-file source program on the assembled classpath:
//   java -cp "<cache>/kafka/<version>/lib/*" bench/kafka/java/ClientCheck.java produce BOOTSTRAP TOPIC COUNT
//   java -cp ... ClientCheck.java consume BOOTSTRAP TOPIC GROUP COUNT TIMEOUT_MS
// (or bench/kafka/kafka java-client ...). Exit status 0 only if the check held.
//
// produce: a KafkaProducer with nothing but bootstrap.servers and serializers set, i.e. the
//   defaults (enable.idempotence=true, acks=all). Sends COUNT keyed records, waits for every ack,
//   checks that each partition's offsets are contiguous, and asks the cluster (DescribeProducers)
//   which producer ids wrote them: an idempotent producer has a producer id >= 0.
// consume: a KafkaConsumer in consumer group GROUP (auto.offset.reset=earliest, otherwise
//   defaults) polls until it has COUNT records or TIMEOUT_MS pass without progress (no
//   assignment, no new record: as kafka-console-consumer's --timeout-ms), commits synchronously, and
//   reports what it read and what the group committed. Its progress (assignments, records read
//   every 5 s, the commit, the close) goes to stderr, seconds since it started first.
// With the environment variable CLIENT_CHECK_CONFIG naming a properties file (a client.properties
// as Kafka's tools take with --command-config: security.protocol, sasl.*, ssl.*), every client
// starts from those properties.

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.AppInfoParser;

public class ClientCheck {
    public static void main(String[] args) throws Exception {
        if (args.length == 4 && args[0].equals("produce")) {
            System.exit(produce(args[1], args[2], Integer.parseInt(args[3])));
        } else if (args.length == 6 && args[0].equals("consume")) {
            System.exit(consume(args[1], args[2], args[3], Integer.parseInt(args[4]),
                    Long.parseLong(args[5])));
        }
        System.err.println("usage: ClientCheck produce BOOTSTRAP TOPIC COUNT\n"
                + "       ClientCheck consume BOOTSTRAP TOPIC GROUP COUNT TIMEOUT_MS");
        System.exit(2);
    }

    static Properties base(String bootstrap) throws IOException {
        Properties props = new Properties();
        String config = System.getenv("CLIENT_CHECK_CONFIG");
        if (config != null && !config.isEmpty()) {
            try (InputStream in = new FileInputStream(config)) {
                props.load(in);
            }
        }
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return props;
    }

    static int produce(String bootstrap, String topic, int count) throws Exception {
        Properties props = base(bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        // The effective configuration the producer runs with, defaults filled in.
        ProducerConfig effective = new ProducerConfig(props);
        Map<Integer, TreeSet<Long>> offsets = new TreeMap<>();
        long started = System.nanoTime();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> acks = new ArrayList<>(count);
            for (int i = 0; i < count; i++) {
                acks.add(producer.send(new ProducerRecord<>(topic, "key-" + i, "value-" + i)));
            }
            producer.flush();
            for (Future<RecordMetadata> ack : acks) {
                RecordMetadata md = ack.get();
                offsets.computeIfAbsent(md.partition(), p -> new TreeSet<>()).add(md.offset());
            }
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        boolean contiguous = true;
        StringBuilder parts = new StringBuilder();
        List<TopicPartition> partitions = new ArrayList<>();
        for (Map.Entry<Integer, TreeSet<Long>> e : offsets.entrySet()) {
            TreeSet<Long> s = e.getValue();
            contiguous &= s.last() - s.first() + 1 == s.size();
            if (parts.length() > 0) parts.append(',');
            parts.append(String.format("\"%d\":{\"first\":%d,\"last\":%d,\"count\":%d}",
                    e.getKey(), s.first(), s.last(), s.size()));
            partitions.add(new TopicPartition(topic, e.getKey()));
        }
        Set<Long> producerIds = new TreeSet<>();
        String describeError = null;
        Properties adminProps = base(bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            Map<TopicPartition, PartitionProducerState> states =
                    admin.describeProducers(partitions).all().get();
            for (PartitionProducerState state : states.values()) {
                for (ProducerState p : state.activeProducers()) producerIds.add(p.producerId());
            }
        } catch (Exception e) {
            describeError = String.valueOf(e.getCause() != null ? e.getCause() : e);
        }
        int acked = offsets.values().stream().mapToInt(Set::size).sum();
        System.out.println("{\"mode\":\"produce\",\"client_version\":" + q(AppInfoParser.getVersion())
                + ",\"enable_idempotence\":"
                + effective.getBoolean(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG)
                + ",\"acks\":" + q(effective.getString(ProducerConfig.ACKS_CONFIG))
                + ",\"sent\":" + count + ",\"acked\":" + acked
                + ",\"contiguous\":" + contiguous
                + ",\"seconds\":" + String.format("%.3f", seconds)
                + ",\"partitions\":{" + parts + "}"
                + ",\"producer_ids\":" + producerIds
                + ",\"describe_producers_error\":" + q(describeError) + "}");
        return acked == count && contiguous ? 0 : 1;
    }

    static int consume(String bootstrap, String topic, String group, int count, long timeoutMs)
            throws IOException {
        Properties props = base(bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Set<String> keys = new TreeSet<>();
        int received = 0;
        Map<TopicPartition, OffsetAndMetadata> committed;
        Set<TopicPartition> assignment;
        long started = System.currentTimeMillis();
        Progress progress = new Progress(started);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            progress.say("consumer created");
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                    progress.say("revoked " + partitions);
                }
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    progress.moved();
                    progress.say("assigned " + partitions);
                }
            });
            // TIMEOUT_MS counts from the last progress (the consumer created, partitions
            // assigned, a record read), not from the start: on a loaded machine a consumer over
            // mTLS took 37 s to be created and had its 1,000 records 55 s after the start
            // (bench/kafka/README.md, "Java client check")
            progress.moved();
            long nextReport = System.currentTimeMillis() + 5_000;
            while (received < count && !progress.stalled(timeoutMs)) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    received++;
                    keys.add(r.key());
                    progress.moved();
                }
                long now = System.currentTimeMillis();
                if (now >= nextReport) {
                    nextReport = now + 5_000;
                    progress.say("received " + received + " of " + count + ", assignment "
                            + consumer.assignment());
                }
            }
            progress.say("received " + received + " of " + count + "; committing");
            consumer.commitSync();
            assignment = consumer.assignment();
            committed = consumer.committed(assignment);
            progress.say("committed " + committed + "; closing");
        }
        progress.say("closed");
        StringBuilder commits = new StringBuilder();
        Map<Integer, Long> sorted = new TreeMap<>();
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : committed.entrySet()) {
            sorted.put(e.getKey().partition(), e.getValue() == null ? -1 : e.getValue().offset());
        }
        for (Map.Entry<Integer, Long> e : sorted.entrySet()) {
            if (commits.length() > 0) commits.append(',');
            commits.append(String.format("\"%d\":%d", e.getKey(), e.getValue()));
        }
        List<Integer> assigned = new ArrayList<>();
        for (TopicPartition tp : assignment) assigned.add(tp.partition());
        assigned.sort(null);
        System.out.println("{\"mode\":\"consume\",\"group\":" + q(group)
                + ",\"received\":" + received + ",\"distinct_keys\":" + keys.size()
                + ",\"assignment\":" + assigned + ",\"committed\":{" + commits + "}}");
        return received >= count ? 0 : 1;
    }

    /** What the check is doing, on stderr with the seconds since it started (in the failure
     * message of a check that fails or hangs: bench/kafka/harness.py). */
    static final class Progress {
        final long started;

        long lastMoved;

        Progress(long started) {
            this.started = started;
            this.lastMoved = started;
        }

        void moved() {
            lastMoved = System.currentTimeMillis();
        }

        boolean stalled(long timeoutMs) {
            return System.currentTimeMillis() - lastMoved >= timeoutMs;
        }

        void say(String what) {
            System.err.printf("[%.1f s] %s%n", (System.currentTimeMillis() - started) / 1e3, what);
        }
    }

    static String q(String s) {
        if (s == null) return "null";
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n") + "\"";
    }
}
